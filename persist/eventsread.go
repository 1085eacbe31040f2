package persist

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// Events returns up to limit events at or after since, oldest first
// (by time, then by the order they were appended); limit <= 0 means all
// of them. Events still queued by Append are not included (Flush first to
// see them); events waiting in memory for the disk are.
func (s *Store) Events(since time.Time, limit int) ([]admission.Event, error) {
	return s.readEvents(false, since, limit)
}

// Tail returns the newest n events (n > 0), oldest first.
func (s *Store) Tail(n int) ([]admission.Event, error) {
	if n <= 0 {
		return nil, nil
	}
	return s.readEvents(true, time.Time{}, n)
}

// Newest returns the newest limit events (limit > 0) at or after since,
// oldest first, and how many events at or after since it left out (the
// older ones): the dashboard shows what just happened, and says how much
// of its window it could not show.
func (s *Store) Newest(since time.Time, limit int) ([]admission.Event, int, error) {
	if limit <= 0 {
		return nil, 0, nil
	}
	if s.rc != nil || s.ro != nil {
		evs, _, omitted, err := s.Query(EventQuery{Since: since, Limit: limit, Newest: true})
		return evs, omitted, err
	}
	evs, err := s.readEvents(true, since, limit)
	if err != nil {
		return nil, 0, err
	}
	if len(evs) < limit {
		return evs, 0, nil
	}
	total, err := s.countSince(since)
	if err != nil {
		return nil, 0, err
	}
	return evs, max(0, total-len(evs)), nil
}

// countSince counts the events at or after since: a segment wholly after
// since counts by its index entry, only a segment that straddles since is
// read.
func (s *Store) countSince(since time.Time) (int, error) {
	from := unixNanos(since)
	s.segMu.RLock()
	segs := make([]segment, len(s.segs))
	for i, g := range s.segs {
		segs[i] = *g
	}
	n := 0
	for _, r := range s.pending {
		if unixNanos(r.Time) >= from {
			n++
		}
	}
	s.segMu.RUnlock()
	for _, g := range segs {
		switch {
		case g.count == 0 || g.max < from:
		case g.min >= from:
			n += g.count
		default:
			lines, _, err := readSegment(s.fs, s.dir, g.name, s.cfg.ReadOnly)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return 0, fmt.Errorf("read events from %s: %w", s.cfg.Dir, err)
			}
			for _, l := range lines {
				if unixNanos(l.rec.Time) >= from {
					n++
				}
			}
		}
	}
	return n, nil
}

func cmpRecord(a, b record) int {
	if c := a.Time.Compare(b.Time); c != 0 {
		return c
	}
	switch {
	case a.Seq < b.Seq:
		return -1
	case a.Seq > b.Seq:
		return 1
	}
	return 0
}

// readEvents reads the segments that can hold the answer (events at or
// after since): with newest, from the newest segment back until the
// limit-th newest event found is newer than anything in the segments left;
// else from the oldest segment that reaches since, until the limit-th
// event is older than anything left.
func (s *Store) readEvents(newest bool, since time.Time, limit int) ([]admission.Event, error) {
	if err := s.checkOpen(); err != nil {
		return nil, fmt.Errorf("read events from %s: %w", s.cfg.Dir, err)
	}
	if s.rc != nil || s.ro != nil {
		evs, _, _, err := s.Query(EventQuery{Since: since, Limit: limit, Newest: newest})
		return evs, err
	}
	s.segMu.RLock()
	segs := make([]segment, len(s.segs))
	for i, g := range s.segs {
		segs[i] = *g
	}
	out := slices.Clone(s.pending)
	s.segMu.RUnlock()
	from := unixNanos(since)
	keep := func(rs []record) []record {
		rs = slices.DeleteFunc(rs, func(r record) bool { return unixNanos(r.Time) < from })
		slices.SortFunc(rs, cmpRecord)
		rs = slices.CompactFunc(rs, func(a, b record) bool { return a.Seq == b.Seq })
		if limit > 0 && len(rs) > limit {
			if newest {
				rs = rs[len(rs)-limit:]
			} else {
				rs = rs[:limit]
			}
		}
		return rs
	}
	out = keep(out)
	if newest {
		slices.Reverse(segs)
	}
	for _, g := range segs {
		if g.count == 0 || g.max < from {
			continue
		}
		if limit > 0 && len(out) >= limit {
			if newest && g.max < unixNanos(out[0].Time) {
				continue
			}
			if !newest && g.min > unixNanos(out[len(out)-1].Time) {
				continue
			}
		}
		lines, _, err := readSegment(s.fs, s.dir, g.name, s.cfg.ReadOnly) // skipped lines were counted at Open
		if errors.Is(err, fs.ErrNotExist) {
			continue // swept meanwhile, or the directory was removed
		}
		if err != nil && s.cfg.ReadOnly {
			continue // replaced since Open by what cannot be read: left out, as at Open
		}
		if err != nil {
			return nil, fmt.Errorf("read events from %s: %w", s.cfg.Dir, err)
		}
		for _, l := range lines {
			out = append(out, l.rec)
		}
		out = keep(out)
	}
	evs := make([]admission.Event, len(out))
	for i, r := range out {
		evs[i] = r.Event
	}
	return evs, nil
}

// SweepEvents enforces retention once: it deletes events older than
// Config.EventsRetention (by Config.Now) and then the oldest beyond
// Config.EventsMax, and returns how many it deleted. Whole segments are
// removed, one partly kept is rewritten. The writer goroutine calls it
// every Config.SweepInterval; with the background sweep off
// (SweepInterval < 0) it may be called directly.
func (s *Store) SweepEvents() (int, error) {
	if s.cfg.ReadOnly {
		return 0, fmt.Errorf("sweep events in %s: store is read-only", s.cfg.Dir)
	}
	if err := s.checkOpen(); err != nil {
		return 0, fmt.Errorf("sweep events in %s: %w", s.cfg.Dir, err)
	}
	if s.rc != nil {
		q := EventQuery{Limit: s.cfg.EventsMax}
		if s.cfg.EventsRetention > 0 {
			q.Until = s.cfg.Now().Add(-s.cfg.EventsRetention)
		}
		resp, err := s.rc.call(&request{Op: opSweep, Query: &q})
		if err != nil {
			return 0, fmt.Errorf("sweep events in %s: %w", s.cfg.Dir, err)
		}
		return resp.Deleted, nil
	}
	s.ew.mu.Lock()
	defer s.ew.mu.Unlock()
	return s.sweep()
}

// sweepAndReport runs the sweep for the writer goroutine and logs events
// dropped since the previous one.
func (s *Store) sweepAndReport() {
	s.ew.mu.Lock()
	defer s.ew.mu.Unlock()
	if n, err := s.sweep(); err != nil {
		s.fault("event retention sweep", err)
	} else {
		s.ok("event retention sweep")
		if n > 0 {
			s.log.Debug("old events deleted", "count", n)
		}
	}
	if d := s.dropped.Load(); d != s.ew.reported {
		s.log.Warn("events dropped", "count", d-s.ew.reported, "total", d)
		s.ew.reported = d
	}
}

// sweep deletes what retention asks for; it runs on the writer goroutine
// or in SweepEvents, under ew.mu.
func (s *Store) sweep() (int, error) {
	var cutoff int64 = -1 // events before it are too old; -1: no age limit
	if s.cfg.EventsRetention > 0 {
		cutoff = unixNanos(s.cfg.Now().Add(-s.cfg.EventsRetention))
	}
	s.segMu.RLock()
	segs := slices.Clone(s.segs)
	s.segMu.RUnlock()
	total := 0
	for _, g := range segs {
		total += g.count
	}
	excess := 0
	if s.cfg.EventsMax > 0 {
		excess = total - s.cfg.EventsMax
	}
	deleted := 0
	var errs []error
	for _, g := range segs {
		if g.count == 0 && g != s.ew.cur {
			// Only the cut-short line of a failed write.
			if err := s.fs.Remove(filepath.Join(s.dir, g.name)); err == nil || errors.Is(err, fs.ErrNotExist) {
				s.dropSegment(g)
			}
			continue
		}
		if (cutoff < 0 || g.min >= cutoff) && excess <= 0 {
			continue
		}
		if (cutoff >= 0 && g.max < cutoff) || excess >= g.count {
			err := s.fs.Remove(filepath.Join(s.dir, g.name))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
				continue
			}
			deleted += g.count
			excess -= g.count
			s.dropSegment(g)
			continue
		}
		// Partly kept: drop the old lines, then the oldest of the rest
		// while over the count.
		lines, _, err := readSegment(s.fs, s.dir, g.name, false)
		if errors.Is(err, fs.ErrNotExist) {
			s.dropSegment(g)
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		slices.SortStableFunc(lines, func(a, b segmentLine) int { return cmpRecord(a.rec, b.rec) })
		keepFrom := 0
		for keepFrom < len(lines) && cutoff >= 0 && unixNanos(lines[keepFrom].rec.Time) < cutoff {
			keepFrom++
		}
		if over := excess - keepFrom; over > 0 {
			keepFrom = min(len(lines), keepFrom+over)
		}
		if keepFrom == 0 {
			continue
		}
		ng := &segment{name: g.name, first: g.first, last: g.first}
		var buf []byte
		slices.SortFunc(lines[keepFrom:], func(a, b segmentLine) int { return cmp.Compare(a.rec.Seq, b.rec.Seq) })
		for _, l := range lines[keepFrom:] {
			buf = append(buf, l.line...)
			ng.add(l.rec, len(l.line))
		}
		ng.first = g.first
		if err := writeAtomic(s.fs, s.dir, g.name, buf); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted += keepFrom
		excess -= keepFrom
		s.segMu.Lock()
		if i := slices.Index(s.segs, g); i >= 0 {
			s.segs[i] = ng
		}
		s.segMu.Unlock()
		if g == s.ew.cur {
			s.ew.cur, s.ew.rotate = nil, true
		}
	}
	if len(errs) > 0 {
		return deleted, fmt.Errorf("sweep events in %s: %w", s.cfg.Dir, errors.Join(errs...))
	}
	return deleted, nil
}

// dropSegment removes g from the index.
func (s *Store) dropSegment(g *segment) {
	s.segMu.Lock()
	s.segs = slices.DeleteFunc(s.segs, func(x *segment) bool { return x == g })
	s.segMu.Unlock()
	if g == s.ew.cur {
		s.ew.cur, s.ew.rotate = nil, true
	}
}
