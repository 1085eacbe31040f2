package persist

import (
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// Event kinds of the store itself, written to the event log (in memory
// first when the disk cannot take them).
const (
	// EventFailing: writing to the data directory failed; learned rates
	// and events are kept in memory and saving is retried.
	EventFailing admission.EventKind = "persist.failing"
	// EventRecovered: writing works again; what waited in memory is saved.
	EventRecovered admission.EventKind = "persist.recovered"
)

// DefaultFaultLogInterval is how often a store that keeps failing logs
// a summary (Config.FaultLogInterval).
const DefaultFaultLogInterval = 5 * time.Minute

// Health is the state of the data directory as the store sees it, for
// /status and /metrics.
type Health struct {
	// Healthy is false while the last write of learned rates, events or
	// the retention sweep failed.
	Healthy bool `json:"healthy"`
	// Dir is the data directory as an absolute path, so that a tool on
	// the host (`sluice events`) can tell which directory a node runs on.
	Dir string `json:"dir"`
	// SaveErrors counts failed writes since Open (each retry counts).
	SaveErrors uint64 `json:"save_errors"`
	// LastError is the last write error, empty if there was none.
	LastError     string    `json:"last_error,omitempty"`
	LastErrorTime time.Time `json:"last_error_time,omitzero"`
	// FailingSince is when the current failure began (zero when healthy).
	FailingSince time.Time `json:"failing_since,omitzero"`
	// EventsPending is how many events wait in memory for the disk.
	EventsPending int `json:"events_pending"`
	// EventsDropped counts events that were not stored: the queue or the
	// in-memory backlog was full, or the store was closed or read-only.
	EventsDropped uint64 `json:"events_dropped"`
	// Child is the store process of a format 3 store: "starting",
	// "running" or "down"; empty for format 2.
	Child string `json:"child,omitempty"`
	// ChildRestarts counts the store process's deaths since Open.
	ChildRestarts uint64 `json:"child_restarts"`
	// ChildLastExit says how the store process last ended.
	ChildLastExit string `json:"child_last_exit,omitempty"`
	// QueuePending and QueueDropped count history samples and dialog
	// records waiting for, or dropped before reaching, the store process.
	QueuePending int    `json:"queue_pending"`
	QueueDropped uint64 `json:"queue_dropped"`
	// MOPSavedAt is when the store process last acknowledged a write of
	// learned states (format 3).
	MOPSavedAt time.Time `json:"mop_saved_at,omitzero"`
}

// health tracks write failures by operation ("mop", "events", "sweep").
// The store is failing while any operation's last attempt failed. The
// first failure is logged at once with its error; later ones only as a
// count every Config.FaultLogInterval; the recovery once.
type health struct {
	mu       sync.Mutex
	failing  map[string]error
	since    time.Time
	errors   uint64
	lastErr  error
	lastAt   time.Time
	lastLog  time.Time
	unlogged uint64 // failures since the last log line
	streak   uint64 // failures in the current failure
}

// fault records a failed write of op and logs it, rate-limited.
func (s *Store) fault(op string, err error) {
	h := &s.health
	now := s.cfg.Now()
	h.mu.Lock()
	h.errors++
	h.lastErr, h.lastAt = err, now
	h.streak++
	first := len(h.failing) == 0
	if h.failing == nil {
		h.failing = map[string]error{}
	}
	h.failing[op] = err
	var summary bool
	var count uint64
	if first {
		h.since, h.lastLog, h.unlogged, h.streak = now, now, 0, 1
	} else if h.unlogged++; now.Sub(h.lastLog) >= s.cfg.FaultLogInterval {
		summary, count = true, h.unlogged
		h.lastLog, h.unlogged = now, 0
	}
	since := h.since
	h.mu.Unlock()

	switch {
	case first && op == "child":
		// The store process ended (its own log line says how): the disk
		// may be fine, so do not send the operator to it first.
		s.log.Warn("store process down: learned rates and events are kept in memory and saved once it is back; see err, and check the disk if it keeps ending",
			"dir", s.cfg.Dir, "what", op, "err", err, "retry_every", s.cfg.Interval)
		s.Append(admission.Event{Kind: EventFailing, Subject: s.cfg.Dir,
			Message: fmt.Sprintf("writing %s failed: %v; kept in memory, retried every %v", op, err, s.cfg.Interval)})
	case first:
		s.log.Warn("data directory cannot be written: learned rates and events are kept in memory and saving is retried; check the disk",
			"dir", s.cfg.Dir, "what", op, "err", err, "retry_every", s.cfg.Interval)
		s.Append(admission.Event{Kind: EventFailing, Subject: s.cfg.Dir,
			Message: fmt.Sprintf("writing %s failed: %v; kept in memory, retried every %v", op, err, s.cfg.Interval)})
	case summary:
		s.log.Warn("data directory still cannot be written", "dir", s.cfg.Dir, "failures", count,
			"failing_for", now.Sub(since).Round(time.Second), "err", err)
	}
}

// ok records a successful write of op; it logs and reports the recovery
// when it was the last failing operation.
func (s *Store) ok(op string) {
	h := &s.health
	h.mu.Lock()
	if _, was := h.failing[op]; !was {
		h.mu.Unlock()
		return
	}
	delete(h.failing, op)
	recovered := len(h.failing) == 0
	since, streak := h.since, h.streak
	if recovered {
		h.since, h.streak = time.Time{}, 0
	}
	h.mu.Unlock()
	if recovered {
		took := s.cfg.Now().Sub(since).Round(time.Second)
		s.log.Info("data directory writable again: saving resumed", "dir", s.cfg.Dir, "failures", streak, "after", took)
		s.Append(admission.Event{Kind: EventRecovered, Subject: s.cfg.Dir,
			Message: fmt.Sprintf("writing works again after %v and %d failed writes", took, streak)})
	}
}

// Health reports the state of the data directory.
func (s *Store) Health() Health {
	h := &s.health
	h.mu.Lock()
	out := Health{
		Healthy:       len(h.failing) == 0,
		Dir:           absDir(s.cfg.Dir),
		SaveErrors:    h.errors,
		LastErrorTime: h.lastAt,
		FailingSince:  h.since,
	}
	if h.lastErr != nil {
		out.LastError = h.lastErr.Error()
	}
	h.mu.Unlock()
	s.segMu.RLock()
	out.EventsPending = len(s.pending)
	s.segMu.RUnlock()
	out.EventsDropped = s.dropped.Load()
	if s.rc != nil {
		s.rc.health(&out)
	}
	return out
}

// Healthy reports whether the last write of every kind succeeded.
func (s *Store) Healthy() bool {
	if s.rc != nil {
		return s.Health().Healthy
	}
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	return len(s.health.failing) == 0
}

// SaveErrors counts failed writes to the data directory since Open.
func (s *Store) SaveErrors() uint64 {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	return s.health.errors
}

// LastError is the last write error since Open, nil if none.
func (s *Store) LastError() error {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	return s.health.lastErr
}

// absDir is dir made absolute against the working directory, or dir as
// it is when that cannot be known.
func absDir(dir string) string {
	if a, err := filepath.Abs(dir); err == nil {
		return a
	}
	return dir
}
