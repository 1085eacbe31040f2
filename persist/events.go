package persist

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sluicelb/sluice/admission"
)

// The event log is a series of segment files, events-<first sequence>.log,
// each a JSON object per line (an event and its sequence number), appended
// to with write(2): no memory mapping, so a full or vanished filesystem
// gives an error, never a SIGBUS. A segment is closed at segmentMax bytes
// and after a failed write (whose partial last line, having no newline,
// is ignored when read).

// segmentMax is the size at which a new segment is started.
const segmentMax = 1 << 20

// maxBatch is the most events written in one write.
const maxBatch = 256

// eventKeyLen is the length of a format 1 event key: len("ev/") + 8 bytes
// of time + 8 bytes of sequence.
const eventKeyLen = 3 + 8 + 8

// record is one line of a segment: an event and its sequence number,
// which orders events of the same instant and is never reused.
type record struct {
	Seq uint64 `json:"seq"`
	admission.Event
}

// segment is the index entry of one segment file.
type segment struct {
	name        string
	first, last uint64 // sequence numbers
	count       int
	min, max    int64 // event times, Unix nanoseconds
	size        int64
}

func segmentName(first uint64) string { return fmt.Sprintf("events-%020d.log", first) }

func isSegmentName(n string) bool {
	_, ok := parseSegmentName(n)
	return ok
}

func parseSegmentName(n string) (uint64, bool) {
	num, ok := strings.CutPrefix(n, "events-")
	if num, ok2 := strings.CutSuffix(num, ".log"); ok && ok2 && len(num) == 20 {
		v, err := strconv.ParseUint(num, 10, 64)
		return v, err == nil
	}
	return 0, false
}

func sortSegments(segs []*segment) {
	slices.SortFunc(segs, func(a, b *segment) int {
		if a.first != b.first {
			if a.first < b.first {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
}

// add puts r (written at the end of the segment) into the index entry.
func (g *segment) add(r record, size int) {
	t := unixNanos(r.Time)
	if g.count == 0 {
		g.min, g.max, g.first = t, t, r.Seq
	}
	g.min, g.max = min(g.min, t), max(g.max, t)
	g.last = max(g.last, r.Seq)
	g.count++
	g.size += int64(size)
}

// eventReq is one item for the writer goroutine: an event, or a Flush
// marker (flush non-nil) answered once everything queued before it was
// written or failed to be.
type eventReq struct {
	ev    admission.Event
	flush chan error
}

// eventWriter is the state of the writer goroutine.
type eventWriter struct {
	// mu is held while segments are written or swept: by the writer
	// goroutine, and by SweepEvents called directly.
	mu       sync.Mutex
	seq      uint64   // next sequence number
	reported uint64   // dropped events already logged
	cur      *segment // segment being appended to
	rotate   bool     // start a new segment at the next write
}

// Append queues an event for the event log and returns at once; it never
// waits for the disk. A writer goroutine stores queued events in batches.
// When Config.EventsBuffer events are already waiting, or the store is
// read-only or closed, the event is dropped and counted (EventsDropped);
// drops are logged by the sweep. An event with a zero Time gets Config.Now().
// While the disk cannot take events they wait in memory, where Events and
// Tail see them too. Events appended while Close runs may be lost without
// being counted.
func (s *Store) Append(ev admission.Event) {
	if s.rc != nil && !s.isClosed() {
		if ev.Time.IsZero() {
			ev.Time = s.cfg.Now()
		}
		s.rc.queueEvent(ev)
		return
	}
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
// buffer or the in-memory backlog was full, the store was read-only or
// closed, or an event could not be encoded.
func (s *Store) EventsDropped() uint64 { return s.dropped.Load() }

// Flush waits until every event appended before it was written, and
// returns the write error when some could not be (they wait in memory).
// It returns ErrClosed when the store is closed or read-only.
func (s *Store) Flush() error {
	if s.rc != nil && !s.isClosed() {
		return s.flush3()
	}
	if s.events == nil || s.isClosed() {
		return fmt.Errorf("flush events to %s: %w", s.cfg.Dir, ErrClosed)
	}
	done := make(chan error, 1)
	select {
	case s.events <- eventReq{flush: done}:
	case <-s.quit:
		return fmt.Errorf("flush events to %s: %w", s.cfg.Dir, ErrClosed)
	}
	select {
	case err := <-done:
		return err
	case <-s.writerDone:
		// The writer drained the queue before it exited; the marker was
		// either in it or came too late.
		select {
		case err := <-done:
			return err
		default:
			return fmt.Errorf("flush events to %s: %w", s.cfg.Dir, ErrClosed)
		}
	}
}

// writeEvents is the writer goroutine: it takes what is queued, up to
// maxBatch events at a time, and appends it to the current segment;
// retries what the disk refused every Config.Interval; runs the
// retention sweep. On Close it drains the queue and tries once more.
func (s *Store) writeEvents() {
	defer s.wg.Done()
	defer close(s.writerDone)
	retry := time.NewTicker(s.cfg.Interval)
	defer retry.Stop()
	var sweep <-chan time.Time
	if s.cfg.SweepInterval > 0 {
		t := time.NewTicker(s.cfg.SweepInterval)
		defer t.Stop()
		sweep = t.C
		s.sweepAndReport()
	}
	batch := make([]eventReq, 0, maxBatch)
	for {
		select {
		case r := <-s.events:
			batch = s.fill(append(batch[:0], r))
			s.commit(batch)
		case <-retry.C:
			// A vanished directory is reported even when there is
			// nothing to write.
			if fi, err := s.fs.Stat(s.dir); err != nil {
				s.fault("data directory", err)
			} else if !fi.IsDir() {
				s.fault("data directory", fmt.Errorf("%s is not a directory", s.dir))
			} else {
				s.ok("data directory")
			}
			if s.pendingCount() > 0 {
				s.ew.mu.Lock()
				s.writePending()
				s.ew.mu.Unlock()
			}
		case <-sweep:
			s.sweepAndReport()
		case <-s.quit:
			for {
				if batch = s.fill(batch[:0]); len(batch) == 0 {
					if s.pendingCount() > 0 {
						s.ew.mu.Lock()
						s.writePending()
						s.ew.mu.Unlock()
					}
					return
				}
				s.commit(batch)
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

// commit numbers the events of batch, adds them to what waits in
// memory, writes that, and answers the Flush markers.
func (s *Store) commit(batch []eventReq) {
	s.ew.mu.Lock()
	defer s.ew.mu.Unlock()
	var add []record
	for _, r := range batch {
		if r.flush != nil {
			continue
		}
		ev := r.ev
		if ev.Kind == "" {
			s.dropped.Add(1)
			s.log.Debug("event without a kind not stored", "subject", ev.Subject)
			continue
		}
		ev.Kind = admission.EventKind(cut(string(ev.Kind), maxText))
		ev.Subject, ev.Message = cut(ev.Subject, maxText), cut(ev.Message, maxText)
		add = append(add, record{Seq: s.ew.seq, Event: ev})
		s.ew.seq++
	}
	if len(add) > 0 {
		limit := 4 * max(s.cfg.EventsBuffer, 1)
		s.segMu.Lock()
		s.pending = append(s.pending, add...)
		if over := len(s.pending) - limit; over > 0 {
			s.pending = slices.Delete(s.pending, 0, over)
			s.dropped.Add(uint64(over))
		}
		s.segMu.Unlock()
	}
	err := s.writePending()
	for _, r := range batch {
		if r.flush != nil {
			r.flush <- err
		}
	}
}

func (s *Store) pendingCount() int {
	s.segMu.RLock()
	defer s.segMu.RUnlock()
	return len(s.pending)
}

// writePending appends the events waiting in memory to the current
// segment, in batches. Events whose line was written whole leave memory;
// on a failed write the rest stay and the next write starts a new segment.
func (s *Store) writePending() error {
	for {
		s.segMu.RLock()
		todo := s.pending[:min(len(s.pending), maxBatch)]
		s.segMu.RUnlock()
		if len(todo) == 0 {
			return nil
		}
		if err := s.writeRecords(todo); err != nil {
			s.fault("events", err)
			return fmt.Errorf("write events to %s: %w: %w", s.cfg.Dir, ErrUnwritable, err)
		}
		s.ok("events")
	}
}

// writeRecords appends recs (the head of pending) to the current segment
// and takes those written whole off pending.
func (s *Store) writeRecords(recs []record) error {
	var buf []byte
	ends := make([]int, 0, len(recs))
	for _, r := range recs {
		line, err := encodeRecord(r)
		if err != nil { // kinds and texts were checked; cannot happen
			return err
		}
		buf = append(buf, line...)
		ends = append(ends, len(buf))
	}
	seg := s.ew.cur
	if seg == nil || s.ew.rotate || seg.size >= segmentMax {
		if err := s.ensureFormat(); err != nil {
			return err
		}
		seg = &segment{name: segmentName(recs[0].Seq)}
	}
	flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND
	if seg != s.ew.cur {
		// A file of this name can only hold the cut-short line of a
		// write that failed before any of its events were written.
		flags |= os.O_TRUNC
	}
	f, err := s.fs.OpenFile(filepath.Join(s.dir, seg.name), flags, 0o600)
	if err != nil {
		s.ew.rotate = true
		return err
	}
	n, err := f.Write(buf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	whole := 0
	for whole < len(ends) && ends[whole] <= n {
		whole++
	}
	s.segMu.Lock()
	if whole > 0 {
		if seg != s.ew.cur {
			s.segs = append(s.segs, seg)
			s.ew.cur, s.ew.rotate = seg, false
		}
		prev := 0
		for i, r := range recs[:whole] {
			seg.add(r, ends[i]-prev)
			prev = ends[i]
		}
		s.pending = s.pending[whole:]
	}
	s.segMu.Unlock()
	if err != nil {
		s.ew.rotate = true
	}
	return err
}

// encodeRecord is the line of a record in a segment.
func encodeRecord(r record) ([]byte, error) {
	v, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", r.Kind, err)
	}
	return append(v, '\n'), nil
}

// decodeRecord parses one line of a segment.
func decodeRecord(line []byte) (record, error) {
	var r record
	ev, err := decodeEvent(line)
	if err != nil {
		return r, err
	}
	var seq struct {
		Seq *uint64 `json:"seq"`
	}
	if err := json.Unmarshal(line, &seq); err != nil || seq.Seq == nil || *seq.Seq == 0 {
		return r, errors.New("event: missing sequence number")
	}
	return record{Seq: *seq.Seq, Event: ev}, nil
}

// segmentLine is one record of a segment and its line as stored.
type segmentLine struct {
	rec  record
	line []byte
}

// readSegment reads and decodes a segment file. The bytes after its last
// newline are a write cut short (the disk filled or failed) and ignored;
// a whole line that does not decode gives an error wrapping ErrCorrupt,
// or, lenient (a read-only store), is skipped and counted.
func readSegment(fsys fileSystem, dir, name string, lenient bool) (lines []segmentLine, skipped int, err error) {
	data, err := fsys.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, 0, err
	}
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	var out []segmentLine
	for n := 1; len(data) > 0; n++ {
		i := bytes.IndexByte(data, '\n')
		line := data[:i+1]
		data = data[i+1:]
		r, err := decodeRecord(line[:len(line)-1])
		if err != nil && lenient {
			skipped++
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %s line %d: %w", ErrCorrupt, name, n, err)
		}
		out = append(out, segmentLine{r, line})
	}
	return out, skipped, nil
}

// scanSegment reads a segment at Open and returns its index entry.
func (s *Store) scanSegment(name string) (*segment, error) {
	lines, skipped, err := readSegment(s.fs, s.dir, name, s.cfg.ReadOnly)
	if err != nil {
		return nil, err
	}
	if skipped > 0 {
		s.skipped.Lines += skipped
		s.log.Warn("event lines that do not decode left out", "dir", s.cfg.Dir, "file", name, "lines", skipped)
	}
	first, _ := parseSegmentName(name)
	seg := &segment{name: name, first: first, last: first}
	for _, l := range lines {
		seg.add(l.rec, len(l.line))
	}
	seg.first = first
	return seg, nil
}

func (s *Store) eventCount() int {
	s.segMu.RLock()
	defer s.segMu.RUnlock()
	n := len(s.pending)
	for _, g := range s.segs {
		n += g.count
	}
	return n
}

// unixNanos is t in Unix nanoseconds, clamped to [0, MaxInt64] so that
// times outside what int64 nanoseconds can hold still sort.
func unixNanos(t time.Time) int64 {
	switch {
	case t.Before(time.Unix(0, 0)):
		return 0
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// eventKey is a format 1 event key: "ev/" + big-endian Unix nanoseconds +
// big-endian sequence.
func eventKey(t time.Time, seq uint64) []byte {
	k := make([]byte, 0, eventKeyLen)
	k = append(k, evPrefix...)
	k = binary.BigEndian.AppendUint64(k, uint64(unixNanos(t)))
	return binary.BigEndian.AppendUint64(k, seq)
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
