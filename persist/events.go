package persist

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/dgraph-io/badger/v4"

	"github.com/sluicelb/sluice/admission"
)

// maxBatch is the most events written in one transaction.
const maxBatch = 256

// eventKeyLen is len("ev/") + 8 bytes of time + 8 bytes of sequence.
const eventKeyLen = 3 + 8 + 8

// eventReq is one item for the writer goroutine: an event, or a Flush
// marker (flush non-nil) closed once everything queued before it is written.
type eventReq struct {
	ev    admission.Event
	flush chan struct{}
}

// Append queues an event for the event log and returns at once; it never
// waits for the disk. A writer goroutine stores queued events in batches.
// When Config.EventsBuffer events are already waiting, or the store is
// read-only or closed, the event is dropped and counted (EventsDropped);
// drops are logged by the sweep. An event with a zero Time gets Config.Now().
// Events appended while Close runs may be lost without being counted.
func (s *Store) Append(ev admission.Event) {
	if s.events == nil || s.isClosed() {
		s.dropped.Add(1)
		return
	}
	if ev.Time.IsZero() {
		ev.Time = s.cfg.Now()
	}
	select {
	case s.events <- eventReq{ev: ev}:
	default:
		s.dropped.Add(1)
	}
}

// EventSink returns Append as an admission.EventSink, for the admission
// core and lb/ to report events with.
func (s *Store) EventSink() admission.EventSink { return s.Append }

// EventsDropped returns how many events were not stored since Open: the
// buffer was full, the store was read-only or closed, or a write failed.
func (s *Store) EventsDropped() uint64 { return s.dropped.Load() }

// Flush waits until every event appended before it is written (or
// dropped). It returns ErrClosed when the store is closed or read-only.
func (s *Store) Flush() error {
	if s.events == nil || s.isClosed() {
		return fmt.Errorf("flush events to %s: %w", s.cfg.Dir, ErrClosed)
	}
	done := make(chan struct{})
	select {
	case s.events <- eventReq{flush: done}:
	case <-s.quit:
		return fmt.Errorf("flush events to %s: %w", s.cfg.Dir, ErrClosed)
	}
	select {
	case <-done:
		return nil
	case <-s.writerDone:
		// The writer drained the queue before it exited; the marker was
		// either in it or came too late.
		select {
		case <-done:
			return nil
		default:
			return fmt.Errorf("flush events to %s: %w", s.cfg.Dir, ErrClosed)
		}
	}
}

// writeEvents is the writer goroutine: it takes what is queued, up to
// maxBatch events at a time, and stores it. On Close it drains the queue.
func (s *Store) writeEvents() {
	defer s.wg.Done()
	defer close(s.writerDone)
	batch := make([]eventReq, 0, maxBatch)
	failing := false
	commit := func() {
		err := s.writeBatch(batch)
		switch {
		case err != nil && !failing:
			s.log.Warn("writing events failed", "dir", s.cfg.Dir, "err", err)
		case err == nil && failing:
			s.log.Info("writing events works again", "dir", s.cfg.Dir)
		}
		failing = err != nil
		for _, r := range batch {
			if r.flush != nil {
				close(r.flush)
			}
		}
	}
	for {
		select {
		case r := <-s.events:
			batch = s.fill(append(batch[:0], r))
			commit()
		case <-s.quit:
			for {
				if batch = s.fill(batch[:0]); len(batch) == 0 {
					return
				}
				commit()
			}
		}
	}
}

// fill adds to batch what is queued, without waiting, up to maxBatch.
func (s *Store) fill(batch []eventReq) []eventReq {
	for len(batch) < maxBatch {
		select {
		case r := <-s.events:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// writeBatch stores the events of batch in one transaction, counting
// those it could not store as dropped. A batch too big for one transaction
// (the small memtable caps one at about 150 KiB) goes through a
// WriteBatch, which splits it.
func (s *Store) writeBatch(batch []eventReq) error {
	type rec struct{ k, v []byte }
	recs := make([]rec, 0, len(batch))
	var errs []error
	for _, r := range batch {
		if r.flush != nil {
			continue
		}
		v, err := encodeEvent(r.ev)
		if err != nil {
			s.dropped.Add(1)
			errs = append(errs, err)
			continue
		}
		recs = append(recs, rec{eventKey(r.ev.Time, s.seq), v})
		s.seq++
	}
	if len(recs) == 0 {
		return errors.Join(errs...)
	}
	err := s.db.Update(func(txn *badger.Txn) error {
		for _, r := range recs {
			if err := txn.Set(r.k, r.v); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, badger.ErrTxnTooBig) {
		wb := s.db.NewWriteBatch()
		defer wb.Cancel()
		for _, r := range recs {
			if err = wb.Set(r.k, r.v); err != nil {
				break
			}
		}
		if err == nil {
			err = wb.Flush()
		}
	}
	if err != nil {
		s.dropped.Add(uint64(len(recs)))
		errs = append(errs, fmt.Errorf("write %d events to %s: %w", len(recs), s.cfg.Dir, err))
	}
	return errors.Join(errs...)
}

// unixNanos is t in Unix nanoseconds, clamped to [0, MaxInt64] so that
// keys of times outside what int64 nanoseconds can hold still sort.
func unixNanos(t time.Time) uint64 {
	switch {
	case t.Before(time.Unix(0, 0)):
		return 0
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return uint64(t.UnixNano())
}

// eventKey is "ev/" + big-endian Unix nanoseconds + big-endian sequence:
// keys sort by time, and events at the same instant by arrival, without
// ever colliding.
func eventKey(t time.Time, seq uint64) []byte {
	k := make([]byte, 0, eventKeyLen)
	k = append(k, evPrefix...)
	k = binary.BigEndian.AppendUint64(k, unixNanos(t))
	return binary.BigEndian.AppendUint64(k, seq)
}

// eventSeek is the first key at or after t.
func eventSeek(t time.Time) []byte {
	return binary.BigEndian.AppendUint64(bytes.Clone(evPrefix), unixNanos(t))
}

// decodeEventKey returns the time (Unix nanoseconds) and sequence of an
// event key.
func decodeEventKey(k []byte) (nanos, seq uint64, err error) {
	rest, ok := bytes.CutPrefix(k, evPrefix)
	if !ok || len(k) != eventKeyLen {
		return 0, 0, fmt.Errorf("event key: want %d bytes with prefix %q", eventKeyLen, evPrefix)
	}
	nanos = binary.BigEndian.Uint64(rest)
	if nanos > math.MaxInt64 {
		return 0, 0, errors.New("event key: time out of range")
	}
	return nanos, binary.BigEndian.Uint64(rest[8:]), nil
}

// maxText is the longest subject or message stored, in bytes; longer ones
// are cut, so that one event can never outgrow a transaction.
const maxText = 4096

// encodeEvent is the stored value of an event: its JSON form.
func encodeEvent(ev admission.Event) ([]byte, error) {
	if ev.Kind == "" {
		return nil, errors.New("encode event: empty kind")
	}
	ev.Kind = admission.EventKind(cut(string(ev.Kind), maxText))
	ev.Subject = cut(ev.Subject, maxText)
	ev.Message = cut(ev.Message, maxText)
	v, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", ev.Kind, err)
	}
	return v, nil
}

// cut shortens s to at most n bytes without splitting a UTF-8 sequence.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// decodeEvent parses a stored event.
func decodeEvent(v []byte) (admission.Event, error) {
	var ev admission.Event
	if len(v) == 0 || v[0] != '{' {
		return ev, errors.New("event: not a JSON object")
	}
	if err := json.Unmarshal(v, &ev); err != nil {
		return ev, fmt.Errorf("event: %w", err)
	}
	if ev.Kind == "" || ev.Time.IsZero() {
		return ev, errors.New("event: missing time or kind")
	}
	return ev, nil
}

// Events returns up to limit events at or after since, oldest first;
// limit <= 0 means all of them. Events still queued by Append are not
// included (Flush first to see them).
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

func (s *Store) readEvents(newest bool, since time.Time, limit int) ([]admission.Event, error) {
	release, err := s.acquire()
	if err != nil {
		return nil, fmt.Errorf("read events from %s: %w", s.cfg.Dir, err)
	}
	defer release()
	out, err := s.scanEvents(newest, since, limit)
	if err != nil {
		return nil, fmt.Errorf("read events from %s: %w", s.cfg.Dir, err)
	}
	return out, nil
}

// scanEvents reads events for readEvents; db must be open.
func (s *Store) scanEvents(newest bool, since time.Time, limit int) ([]admission.Event, error) {
	var out []admission.Event
	err := s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = evPrefix
		opts.Reverse = newest
		if limit > 0 && limit < opts.PrefetchSize {
			opts.PrefetchSize = limit
		}
		it := txn.NewIterator(opts)
		defer it.Close()
		seek := eventSeek(since)
		if newest {
			seek = append(bytes.Clone(evPrefix), bytes.Repeat([]byte{0xff}, 16)...)
		}
		for it.Seek(seek); it.Valid() && (limit <= 0 || len(out) < limit); it.Next() {
			item := it.Item()
			var ev admission.Event
			var derr error
			if _, _, derr = decodeEventKey(item.Key()); derr == nil {
				if err := item.Value(func(v []byte) error {
					ev, derr = decodeEvent(v)
					return nil
				}); err != nil {
					return err
				}
			}
			if derr != nil {
				return fmt.Errorf("%w: key %q: %w", ErrCorrupt, item.Key(), derr)
			}
			out = append(out, ev)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if newest {
		slices.Reverse(out)
	}
	return out, nil
}

// SweepEvents enforces retention once: it deletes events older than
// Config.EventsRetention (by Config.Now) and then the oldest beyond
// Config.EventsMax, and returns how many it deleted. The background sweep
// calls it every Config.SweepInterval.
func (s *Store) SweepEvents() (int, error) {
	if s.cfg.ReadOnly {
		return 0, fmt.Errorf("sweep events in %s: store is read-only", s.cfg.Dir)
	}
	release, err := s.acquire()
	if err != nil {
		return 0, fmt.Errorf("sweep events in %s: %w", s.cfg.Dir, err)
	}
	defer release()
	var cutoff []byte // keys below it are too old; nil: no age limit
	if s.cfg.EventsRetention > 0 {
		cutoff = eventSeek(s.cfg.Now().Add(-s.cfg.EventsRetention))
	}
	keysOnly := badger.DefaultIteratorOptions
	keysOnly.Prefix = evPrefix
	keysOnly.PrefetchValues = false

	// Count all events and those too old, then delete the oldest
	// max(old, total-EventsMax) of them.
	var total, old int
	err = s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(keysOnly)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			total++
			if cutoff != nil && bytes.Compare(it.Item().Key(), cutoff) < 0 {
				old++
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("sweep events in %s: %w", s.cfg.Dir, err)
	}
	n := old
	if s.cfg.EventsMax > 0 && total-s.cfg.EventsMax > n {
		n = total - s.cfg.EventsMax
	}
	if n == 0 {
		return 0, nil
	}
	wb := s.db.NewWriteBatch()
	defer wb.Cancel()
	deleted := 0
	err = s.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(keysOnly)
		defer it.Close()
		for it.Rewind(); it.Valid() && deleted < n; it.Next() {
			if err := wb.Delete(it.Item().KeyCopy(nil)); err != nil {
				return err
			}
			deleted++
		}
		return nil
	})
	if err == nil {
		err = wb.Flush()
	}
	if err != nil {
		return 0, fmt.Errorf("sweep events in %s: %w", s.cfg.Dir, err)
	}
	// Reclaim value-log space of large deleted events; ErrNoRewrite just
	// means there was nothing worth rewriting.
	for s.db.RunValueLogGC(0.5) == nil {
	}
	return deleted, nil
}

// sweepLoop runs SweepEvents every Config.SweepInterval, starting at once,
// and logs events dropped since the previous sweep.
func (s *Store) sweepLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	var reported uint64
	for {
		if n, err := s.SweepEvents(); err != nil {
			if !errors.Is(err, ErrClosed) {
				s.log.Warn("event retention sweep failed", "dir", s.cfg.Dir, "err", err)
			}
		} else if n > 0 {
			s.log.Debug("old events deleted", "count", n)
		}
		if d := s.dropped.Load(); d != reported {
			s.log.Warn("events dropped", "count", d-reported, "total", d)
			reported = d
		}
		select {
		case <-t.C:
		case <-s.quit:
			return
		}
	}
}
