package admission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
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

// Collector is implemented by a MemoryReader that can free garbage and hand
// idle memory back to the operating system. Memory calls Collect before it
// lets a reading above the Low threshold move or hold the state, at most once
// per MemoryConfig.CollectEvery, so that the state follows memory that is
// live, not garbage that the next collection would free: without it a burst
// leaves the state raised until the runtime's periodic forced collection
// (every two minutes), refusing new work with no load at all.
type Collector interface {
	Collect()
}

// RuntimeReader reads memory from runtime/metrics. used is the memory the Go
// runtime holds in use: everything it has mapped (heap, stacks, metadata)
// minus heap memory that is free, whether or not it was returned to the
// operating system. Free spans are excluded because the runtime reuses or
// returns them without any work being refused. Dead objects not yet collected
// are still counted; Collect removes them. limit is GOMEMLIMIT when one is
// set. Reading never stops the world. It is not safe for concurrent use;
// Memory calls it under a mutex.
type RuntimeReader struct {
	samples []metrics.Sample
}

// NewRuntimeReader returns a reader over runtime/metrics.
func NewRuntimeReader() *RuntimeReader {
	return &RuntimeReader{samples: []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
		{Name: "/memory/classes/heap/free:bytes"},
		{Name: "/gc/gomemlimit:bytes"},
	}}
}

// ReadMemory implements MemoryReader.
func (r *RuntimeReader) ReadMemory() (used, limit int64) {
	metrics.Read(r.samples)
	total := int64(r.samples[0].Value.Uint64())
	released := int64(r.samples[1].Value.Uint64())
	free := int64(r.samples[2].Value.Uint64())
	lim := r.samples[3].Value.Uint64()
	if lim >= math.MaxInt64 {
		lim = 0
	}
	return total - released - free, int64(lim)
}

// Collect implements Collector: a full collection, then as much free memory
// as possible returned to the operating system (debug.FreeOSMemory). It
// blocks for about one mark of the live heap.
func (r *RuntimeReader) Collect() { debug.FreeOSMemory() }

// MemoryConfig configures the node memory states.
type MemoryConfig struct {
	// Limit is the memory limit in bytes. Flag -mem-limit, else the
	// container's (DetectLimit). When 0 the reader's limit (GOMEMLIMIT) is
	// used; without either the states are off.
	Limit int64
	// LimitSource says where Limit came from (the flag, LimitFromCgroupV2,
	// LimitFromCgroupV2, ...), for /status.
	LimitSource string
	// Low, Lower and Critical are the thresholds as fractions of the limit,
	// 0 < Low < Lower < Critical <= 1. Flags -mem-low, -mem-lower,
	// -mem-critical.
	Low, Lower, Critical float64
	// Hysteresis is how far below a threshold (as a fraction of the limit)
	// used memory must fall before the state drops back.
	Hysteresis float64
	// Interval is how often Run samples.
	Interval time.Duration
	// CollectEvery is the least time between two collections asked of a
	// Collector reader while used memory is at or above Low. Default 1s:
	// under pressure the state is re-judged on live memory at least once a
	// second, so it falls back within a second or two of the pressure ending.
	CollectEvery time.Duration
	// Clock times CollectEvery. Default MonoClock.
	Clock Clock
}

// DefaultMemoryConfig returns the defaults of every field but Limit: the
// one place they are written (flags take their defaults from here; zero
// fields are filled from here, the three thresholds together).
func DefaultMemoryConfig() MemoryConfig {
	return MemoryConfig{Low: 0.70, Lower: 0.80, Critical: 0.90, Hysteresis: 0.05, Interval: 100 * time.Millisecond}
}

func (c *MemoryConfig) setDefaults() {
	d := DefaultMemoryConfig()
	if c.Low == 0 && c.Lower == 0 && c.Critical == 0 {
		c.Low, c.Lower, c.Critical = d.Low, d.Lower, d.Critical
	}
	if c.Hysteresis == 0 {
		c.Hysteresis = d.Hysteresis
	}
	if c.Interval == 0 {
		c.Interval = d.Interval
	}
	if c.CollectEvery == 0 {
		c.CollectEvery = time.Second
	}
	if c.Clock == nil {
		c.Clock = MonoClock{}
	}
}

// Validate reports the first invalid field as a *FieldError.
func (c MemoryConfig) Validate() error {
	switch {
	case c.Limit < 0:
		return fieldError("MemoryConfig.Limit", "must not be negative")
	case !(c.Low > 0 && c.Low < c.Lower && c.Lower < c.Critical && c.Critical <= 1):
		return fieldError("MemoryConfig.Low", "Low, Lower and Critical must satisfy 0 < Low < Lower < Critical <= 1 (got %g, %g, %g)", c.Low, c.Lower, c.Critical)
	case c.Hysteresis < 0 || c.Hysteresis >= c.Low:
		return fmt.Errorf("memory hysteresis must be in [0, low) (got %g)", c.Hysteresis)
	case c.Interval < 0:
		return errors.New("memory sample interval must not be negative")
	case c.CollectEvery < 0:
		return errors.New("memory collect interval must not be negative")
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
	collects atomic.Uint64
	lastColl int64 // clock time of the last Collect; under sampleMu
	collOnce bool  // a Collect has happened; under sampleMu

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

// Collections returns how many times Sample asked the reader to collect.
func (m *Memory) Collections() uint64 { return m.collects.Load() }

// RuntimeLimit returns the limit to give the Go runtime
// (debug.SetMemoryLimit) for a configured Limit: the Low threshold. The
// runtime then collects and returns memory to stay under Low, so garbage
// alone never raises the state and only live memory does. 0 when no Limit
// is configured (GOMEMLIMIT, if set, is left as it is).
func (c MemoryConfig) RuntimeLimit() int64 {
	c.setDefaults()
	if c.Limit <= 0 {
		return 0
	}
	return int64(float64(c.Limit) * c.Low)
}

// LimitSource says where the limit in effect comes from: the Config's
// LimitSource (LimitFromConfig if empty) when it is the Config's Limit,
// LimitFromGOMEMLIMIT when the reader's, LimitFromNone without a limit.
func (m *Memory) LimitSource() string {
	if m == nil {
		return LimitFromNone
	}
	switch l := m.limit.Load(); {
	case l <= 0:
		return LimitFromNone
	case l == m.cfg.Limit && m.cfg.LimitSource != "":
		return m.cfg.LimitSource
	case l == m.cfg.Limit:
		return LimitFromConfig
	}
	return LimitFromGOMEMLIMIT
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
	used, limit := m.read()
	old := MemState(m.state.Load())
	if limit <= 0 {
		return old // no limit known: states are off
	}
	frac := float64(used) / float64(limit)
	if c, ok := m.reader.(Collector); ok && frac >= m.cfg.Low {
		now := m.cfg.Clock.Now()
		if !m.collOnce || now-m.lastColl >= int64(m.cfg.CollectEvery) {
			c.Collect()
			m.collects.Add(1)
			m.collOnce, m.lastColl = true, now
			used, limit = m.read()
			if limit <= 0 {
				return old
			}
			frac = float64(used) / float64(limit)
		}
	}
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

// read reads the reader and stores the figures; the configured limit wins
// over the reader's, because the runtime's own limit is set below it (see
// RuntimeLimit).
func (m *Memory) read() (used, limit int64) {
	used, limit = m.reader.ReadMemory()
	if m.cfg.Limit > 0 {
		limit = m.cfg.Limit
	}
	m.used.Store(used)
	m.limit.Store(limit)
	return used, limit
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
