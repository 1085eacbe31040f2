package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// MemState is a node memory state, from the least to the most severe.
type MemState uint32

// The node memory states. The order matters: a higher value is more severe.
const (
	Normal   MemState = iota // sufficient free memory
	Low                      // no new background work is started
	Lower                    // new work is refused; affinity passes
	Critical                 // as Lower, and in-flight new work is terminated
	numStates
)

var memStateNames = [numStates]string{"normal", "low", "lower", "critical"}

// String returns the state's lowercase name.
func (s MemState) String() string {
	if s < numStates {
		return memStateNames[s]
	}
	return fmt.Sprintf("memstate(%d)", uint32(s))
}

// HealthCode is the HTTP status a health endpoint answers in this state:
// 200 in Normal, 429 ("send no new requests") otherwise.
func (s MemState) HealthCode() int {
	if s == Normal {
		return 200
	}
	return 429
}

// RefusesNewWork reports whether new work is refused in this state.
func (s MemState) RefusesNewWork() bool { return s >= Lower }

// MemoryReader reports the process's used memory and its limit in bytes.
// A limit of 0 means "unknown": the configured limit is used instead.
type MemoryReader interface {
	ReadMemory() (used, limit int64)
}

// RuntimeReader reads memory from runtime/metrics: used is what the Go runtime
// compares against its memory limit (total mapped minus released heap), limit
// is GOMEMLIMIT when one is set. It never stops the world. It is not safe for
// concurrent use; Memory calls it from one goroutine.
type RuntimeReader struct {
	samples []metrics.Sample
}

// NewRuntimeReader returns a reader over runtime/metrics.
func NewRuntimeReader() *RuntimeReader {
	return &RuntimeReader{samples: []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/gc/gomemlimit:bytes"},
	}}
}

// ReadMemory implements MemoryReader.
func (r *RuntimeReader) ReadMemory() (used, limit int64) {
	metrics.Read(r.samples)
	total := int64(r.samples[0].Value.Uint64())
	released := int64(r.samples[1].Value.Uint64())
	lim := r.samples[2].Value.Uint64()
	if lim >= math.MaxInt64 {
		lim = 0
	}
	return total - released, int64(lim)
}

// MemoryConfig configures the node memory states.
type MemoryConfig struct {
	// Limit is the memory limit in bytes used when the reader reports none
	// (GOMEMLIMIT unset). Flag -mem-limit. Required unless GOMEMLIMIT is set.
	Limit int64
	// Low, Lower and Critical are the thresholds as fractions of the limit,
	// 0 < Low < Lower < Critical <= 1. Flags -mem-low, -mem-lower,
	// -mem-critical; defaults 0.70, 0.80, 0.90.
	Low, Lower, Critical float64
	// Hysteresis is how far below a threshold (as a fraction of the limit)
	// used memory must fall before the state drops back. Default 0.05.
	Hysteresis float64
	// Interval is how often Run samples. Default 100ms.
	Interval time.Duration
}

func (c *MemoryConfig) setDefaults() {
	if c.Low == 0 && c.Lower == 0 && c.Critical == 0 {
		c.Low, c.Lower, c.Critical = 0.70, 0.80, 0.90
	}
	if c.Hysteresis == 0 {
		c.Hysteresis = 0.05
	}
	if c.Interval == 0 {
		c.Interval = 100 * time.Millisecond
	}
}

// Validate reports the first invalid field, naming its flag.
func (c MemoryConfig) Validate() error {
	switch {
	case c.Limit < 0:
		return errors.New("-mem-limit must not be negative")
	case !(c.Low > 0 && c.Low < c.Lower && c.Lower < c.Critical && c.Critical <= 1):
		return fmt.Errorf("-mem-low, -mem-lower, -mem-critical must satisfy 0 < low < lower < critical <= 1 (got %g, %g, %g)", c.Low, c.Lower, c.Critical)
	case c.Hysteresis < 0 || c.Hysteresis >= c.Low:
		return fmt.Errorf("memory hysteresis must be in [0, low) (got %g)", c.Hysteresis)
	case c.Interval < 0:
		return errors.New("memory sample interval must not be negative")
	}
	return nil
}

// Memory tracks the node memory state. State is one atomic load; Sample (or
// Run, which calls it on a ticker) moves the state. Safe for concurrent use.
type Memory struct {
	cfg    MemoryConfig
	reader MemoryReader
	events EventSink

	state    atomic.Uint32
	used     atomic.Int64
	limit    atomic.Int64
	sampleMu sync.Mutex // serialises Sample: the reader is single-goroutine

	critMu sync.Mutex
	crit   chan struct{} // closed while in Critical; replaced on leaving it
}

// NewMemory validates cfg and returns a Memory in state Normal. A nil reader
// reads runtime/metrics.
func NewMemory(cfg MemoryConfig, reader MemoryReader, events EventSink) (*Memory, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if reader == nil {
		reader = NewRuntimeReader()
	}
	return &Memory{cfg: cfg, reader: reader, events: events, crit: make(chan struct{})}, nil
}

// State returns the current state: one atomic load.
func (m *Memory) State() MemState {
	if m == nil {
		return Normal
	}
	return MemState(m.state.Load())
}

// Usage returns the last sampled used bytes and the limit in effect.
func (m *Memory) Usage() (used, limit int64) { return m.used.Load(), m.limit.Load() }

// CriticalC returns a channel that is closed while the state is Critical.
// Front ends select on it to terminate in-flight new work. Call it again after
// the state left Critical to get the next one.
func (m *Memory) CriticalC() <-chan struct{} {
	m.critMu.Lock()
	defer m.critMu.Unlock()
	return m.crit
}

// Sample reads memory once and moves the state. It returns the new state.
// A rising state is entered as soon as used memory reaches its threshold; a
// falling state needs used memory below the threshold minus the hysteresis.
func (m *Memory) Sample() MemState {
	m.sampleMu.Lock()
	defer m.sampleMu.Unlock()
	used, limit := m.reader.ReadMemory()
	if limit <= 0 {
		limit = m.cfg.Limit
	}
	m.used.Store(used)
	m.limit.Store(limit)
	old := MemState(m.state.Load())
	if limit <= 0 {
		return old // no limit known: states are off
	}
	frac := float64(used) / float64(limit)
	thresholds := [numStates]float64{0, m.cfg.Low, m.cfg.Lower, m.cfg.Critical}
	next := old
	for s := Critical; s > old; s-- { // rise to the highest threshold reached
		if frac >= thresholds[s] {
			next = s
			break
		}
	}
	if next == old { // no rise: fall while below threshold minus hysteresis
		for next > Normal && frac < thresholds[next]-m.cfg.Hysteresis {
			next--
		}
	}
	if next != old {
		m.state.Store(uint32(next))
		m.critMu.Lock()
		if next == Critical {
			close(m.crit)
		} else if old == Critical {
			m.crit = make(chan struct{})
		}
		m.critMu.Unlock()
		m.events.emit(EventMemoryState, "node",
			fmt.Sprintf("memory state %s -> %s: used %d of %d bytes (%.1f%%)", old, next, used, limit, 100*frac))
	}
	return next
}

// Run samples every Interval until ctx is done.
func (m *Memory) Run(ctx context.Context) {
	m.Sample()
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Sample()
		}
	}
}
