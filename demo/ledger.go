package demo

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Ledger defaults.
const (
	// DefaultMaxMemory is the maximum memory of a demo backend: 64 MiB.
	DefaultMaxMemory = 64 << 20
	// DefaultSweepInterval is how often expired holds are released.
	DefaultSweepInterval = 250 * time.Millisecond
)

// ErrExhausted is returned by Hold when holding the allocation would take
// used memory past the ledger's Limit: the backend is out of memory and
// refuses the session.
var ErrExhausted = errors.New("backend memory exhausted")

// ErrClosed is returned by Hold after Close.
var ErrClosed = errors.New("ledger closed")

// LedgerConfig configures a Ledger. Zero fields take their defaults.
type LedgerConfig struct {
	// Max is the backend's maximum memory in bytes, reported as
	// jvm_memory_max_bytes. Default DefaultMaxMemory (64 MiB).
	Max int64
	// Base is memory in bytes the backend uses with no session at all (a
	// JVM's heap after start-up). It is counted in Used but not allocated.
	// Default 0.
	Base int64
	// Limit is the hard ceiling on Used in bytes: a Hold that would pass it
	// fails with ErrExhausted. Between Max and Limit a hold still succeeds
	// and is counted as over the maximum. Default 2 × Max; must not be
	// below Max.
	Limit int64
	// SweepInterval is how often the background sweeper releases expired
	// holds. Default DefaultSweepInterval (250ms). A negative value starts
	// no sweeper: expiry then happens only when Sweep is called, which is
	// what tests with a fake clock want.
	SweepInterval time.Duration
	// GoHeap allocates held memory on the Go heap instead of in anonymous
	// memory mappings. Default false: see Ledger for why.
	GoHeap bool
	// Now is the clock used for expiry. Default time.Now.
	Now func() time.Time
}

func (c *LedgerConfig) setDefaults() {
	if c.Max == 0 {
		c.Max = DefaultMaxMemory
	}
	if c.Limit == 0 {
		c.Limit = 2 * c.Max
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports the first invalid field.
func (c LedgerConfig) Validate() error {
	switch {
	case c.Max <= 0:
		return fmt.Errorf("ledger max memory must be positive (got %d)", c.Max)
	case c.Base < 0:
		return fmt.Errorf("ledger base memory must not be negative (got %d)", c.Base)
	case c.Limit < c.Max:
		return fmt.Errorf("ledger limit %d is below max memory %d", c.Limit, c.Max)
	}
	return nil
}

// LedgerStats is a point-in-time view of a Ledger.
type LedgerStats struct {
	Used    int64  // Base plus held bytes
	Max     int64  // configured maximum
	Live    int    // holds not yet released or expired
	Holds   uint64 // holds granted since start
	OverMax uint64 // holds granted that left Used above Max
	Refused uint64 // holds refused with ErrExhausted
	Expired uint64 // holds released by expiry rather than Release
}

// Ledger is the memory of one demo backend: one real allocation per live
// session or dialog, kept until Release or until its time to live passes.
//
// Every held byte is resident: the allocation is written once per page, so
// the process's RSS really grows by what Used reports. By default the
// memory comes from anonymous mappings outside the Go heap (on Linux and
// the BSDs; elsewhere, or when a mapping fails, from the Go heap). In
// `sluice demo` the backends share a process with the balancer, whose own
// node memory state is computed from Go runtime metrics; memory held
// outside the Go heap shows in RSS without counting as the balancer's own
// heap, and it goes back to the operating system as soon as a session ends.
//
// Memory is bounded in two steps, which is what makes MOP learning
// visible. Up to Max a backend is healthy. Past Max a hold still succeeds,
// as a real server keeps accepting work until it runs out, and is counted
// in OverMax: the backend's memory report then shows the overshoot MOP has
// to correct, and memory stays a straight line in the session rate, which
// is the model MOP fits. Only past Limit (default twice Max) does Hold
// refuse with ErrExhausted, so that a flood with no protection in front
// cannot take the machine's memory.
//
// A Ledger is safe for concurrent use. Used, Max and Live never block.
type Ledger struct {
	cfg LedgerConfig

	used    atomic.Int64 // Base plus held bytes
	live    atomic.Int64
	holds   atomic.Uint64
	overMax atomic.Uint64
	refused atomic.Uint64
	expired atomic.Uint64

	mu     sync.Mutex // guards held and closed
	held   map[string]*hold
	closed bool

	stop chan struct{}
	done chan struct{}
}

// hold is one live allocation.
type hold struct {
	blk     block
	size    int64
	expires time.Time // zero: never
}

// NewLedger validates cfg and returns a Ledger with its background sweeper
// running (unless cfg.SweepInterval is negative). Call Close to stop it.
func NewLedger(cfg LedgerConfig) (*Ledger, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Ledger{
		cfg:  cfg,
		held: make(map[string]*hold),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	l.used.Store(cfg.Base)
	if cfg.SweepInterval > 0 {
		go l.sweeper(cfg.SweepInterval)
	} else {
		close(l.done)
	}
	return l, nil
}

func (l *Ledger) sweeper(every time.Duration) {
	defer close(l.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.Sweep()
		}
	}
}

// Hold allocates size bytes of resident memory for id and keeps them until
// Release(id) or until ttl has passed (ttl <= 0: until Release). Holding an
// id that is already held replaces the old allocation. Hold fails with
// ErrExhausted when Used would pass the Limit, and with ErrClosed after
// Close.
func (l *Ledger) Hold(id string, size int, ttl time.Duration) error {
	if size < 0 {
		return fmt.Errorf("hold %q: negative size %d", id, size)
	}
	n := int64(size)
	// Refuse before allocating: under a flood most holds past the Limit
	// should cost nothing. The check is repeated exactly under the lock.
	if l.used.Load()+n > l.cfg.Limit {
		if _, ok := l.lookup(id); !ok {
			l.refused.Add(1)
			return fmt.Errorf("hold %q of %d bytes: %w", id, size, ErrExhausted)
		}
	}
	// Allocate and touch outside the lock: page faults take microseconds.
	blk := allocBlock(size, l.cfg.GoHeap)
	var expires time.Time
	if ttl > 0 {
		expires = l.cfg.Now().Add(ttl)
	}

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		blk.free()
		return fmt.Errorf("hold %q: %w", id, ErrClosed)
	}
	old := l.held[id]
	var oldSize int64
	if old != nil {
		oldSize = old.size
	}
	used := l.used.Load()
	if used-oldSize+n > l.cfg.Limit {
		l.mu.Unlock()
		blk.free()
		l.refused.Add(1)
		return fmt.Errorf("hold %q of %d bytes: %w", id, size, ErrExhausted)
	}
	l.held[id] = &hold{blk: blk, size: n, expires: expires}
	used = l.used.Add(n - oldSize)
	if old == nil {
		l.live.Add(1)
	}
	l.mu.Unlock()

	if old != nil {
		old.blk.free()
	}
	l.holds.Add(1)
	if used > l.cfg.Max {
		l.overMax.Add(1)
	}
	return nil
}

func (l *Ledger) lookup(id string) (*hold, bool) {
	l.mu.Lock()
	h, ok := l.held[id]
	l.mu.Unlock()
	return h, ok
}

// Holds reports whether id is held and has not expired.
func (l *Ledger) Holds(id string) bool {
	now := l.cfg.Now()
	h, ok := l.lookup(id)
	return ok && (h.expires.IsZero() || now.Before(h.expires))
}

// Release frees the memory held for id and reports whether there was any.
func (l *Ledger) Release(id string) bool {
	l.mu.Lock()
	h, ok := l.held[id]
	if ok {
		l.remove(id, h)
	}
	l.mu.Unlock()
	if ok {
		h.blk.free()
	}
	return ok
}

// remove drops h from the books. It requires l.mu held.
func (l *Ledger) remove(id string, h *hold) {
	delete(l.held, id)
	l.used.Add(-h.size)
	l.live.Add(-1)
}

// Sweep releases every hold whose time to live has passed and returns how
// many it released. The background sweeper calls it; tests with a fake
// clock call it directly. It scans every hold: a demo backend holds a few
// thousand at most.
func (l *Ledger) Sweep() int {
	now := l.cfg.Now()
	var gone []*hold
	l.mu.Lock()
	for id, h := range l.held {
		if !h.expires.IsZero() && !now.Before(h.expires) {
			l.remove(id, h)
			gone = append(gone, h)
		}
	}
	l.mu.Unlock()
	for _, h := range gone {
		h.blk.free()
	}
	l.expired.Add(uint64(len(gone)))
	return len(gone)
}

// Used returns the memory in use in bytes: Base plus every held allocation.
// Expired holds count until the next sweep.
func (l *Ledger) Used() int64 { return l.used.Load() }

// Max returns the configured maximum memory in bytes.
func (l *Ledger) Max() int64 { return l.cfg.Max }

// Live returns the number of holds not yet released or swept.
func (l *Ledger) Live() int { return int(l.live.Load()) }

// Stats returns a snapshot of the ledger's figures. The fields are read one
// by one, not as one atomic view.
func (l *Ledger) Stats() LedgerStats {
	return LedgerStats{
		Used:    l.Used(),
		Max:     l.Max(),
		Live:    l.Live(),
		Holds:   l.holds.Load(),
		OverMax: l.overMax.Load(),
		Refused: l.refused.Load(),
		Expired: l.expired.Load(),
	}
}

// Close stops the sweeper, frees every held allocation and makes later
// holds fail with ErrClosed. It is safe to call more than once.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.done
		return nil
	}
	l.closed = true
	held := l.held
	l.held = make(map[string]*hold)
	for _, h := range held {
		l.used.Add(-h.size)
		l.live.Add(-1)
	}
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	for _, h := range held {
		h.blk.free()
	}
	return nil
}
