package admission

import (
	"sync/atomic"
	"time"
)

// Lease modes: how a Meter with a Lease decides.
const (
	// LeaseShared spends tokens granted from a budget shared with other
	// nodes; without a token the rule's action applies.
	LeaseShared int32 = iota
	// LeaseLocal applies the rule's limit divided by Divisor on this node
	// alone (the shared budget is unreachable).
	LeaseLocal
	// LeaseOpen applies the rule's full limit on this node alone, as a
	// standalone node would.
	LeaseOpen
	// LeaseClosed admits nothing the rule matches: no tokens are granted
	// and decisions do not wait for any.
	LeaseClosed
)

// Lease is the hook through which a Meter spends a budget leased from
// elsewhere (a cluster of nodes sharing one limit). The admission package
// does not know where the tokens come from: a leaser outside it grants
// tokens with Grant, takes unused ones back with Drain at the end of the
// shared sub-interval they were counted in, and learns through Need when
// decisions run short.
//
// Decisions spend tokens with one CAS and never wait on the leaser, except
// that a decision finding no token waits at most the lease's wait budget for
// a refill it has asked for (see NewLease). All methods are safe for
// concurrent use; a Lease must not be copied.
type Lease struct {
	// word holds the tokens (low 32 bits) and a generation (high 32 bits)
	// that Drain moves on: a token taken before a Drain and not spent is
	// dropped rather than put back into the next sub-interval's tokens.
	word     atomic.Uint64
	from     atomic.Int64 // monotonic ns: tokens may be spent from this
	expires  atomic.Int64 // monotonic ns: tokens may be spent before this
	mode     atomic.Int32
	divisor  atomic.Int64
	arrivals atomic.Int64 // decisions that consulted this lease
	state    atomic.Uint32
	lowWater atomic.Int64
	dryUntil atomic.Int64                  // monotonic ns: the budget is spent until then
	refill   atomic.Pointer[chan struct{}] // closed by Grant
	need     chan struct{}                 // capacity 1
	wait     time.Duration
	clock    Clock // re-read after a wait for a refill; may be nil
}

// NewLease returns a lease in mode LeaseShared holding no token. wait bounds
// how long a decision that finds no token waits for the leaser to grant
// more (0: refuse or queue at once); it is a latency budget, a few
// milliseconds at most. clock is the decisions' clock: a decision that
// waited reads it again, so it spends a new token at its real time, not at
// a time before the token's sub-interval began. It may be nil when wait is 0.
func NewLease(wait time.Duration, clock Clock) *Lease {
	l := &Lease{need: make(chan struct{}, 1), wait: wait, clock: clock}
	l.divisor.Store(1)
	ch := make(chan struct{})
	l.refill.Store(&ch)
	return l
}

// Need is signalled (without blocking the decision) when tokens run low or
// out. The leaser selects on it.
func (l *Lease) Need() <-chan struct{} { return l.need }

// Grant adds n tokens that may be spent by decisions made at from or later
// and before expires (monotonic ns, the decisions' clock), and wakes
// decisions waiting for a refill. The bounds are those of the shared
// sub-interval the tokens were counted in.
func (l *Lease) Grant(n, from, expires int64) {
	l.expires.Store(0) // no spending while the bounds change
	l.from.Store(from)
	l.expires.Store(expires)
	if n > 0 {
		n = min(n, maxLeaseTokens)
		l.dryUntil.Store(0)
		for {
			w := l.word.Load()
			t := min(int64(w&leaseTokenMask)+n, maxLeaseTokens)
			if l.word.CompareAndSwap(w, w&^leaseTokenMask|uint64(t)) {
				break
			}
		}
		l.lowWater.Store(n / 4)
	}
	ch := make(chan struct{})
	old := l.refill.Swap(&ch)
	close(*old)
}

// Drain takes back every unspent token and returns how many there were.
func (l *Lease) Drain() int64 {
	l.expires.Store(0)
	for {
		w := l.word.Load()
		if l.word.CompareAndSwap(w, (w>>32+1)<<32) {
			return int64(w & leaseTokenMask)
		}
	}
}

// Token word layout.
const (
	leaseTokenMask = 1<<32 - 1
	maxLeaseTokens = 1<<31 - 1
)

// SetDryUntil tells decisions that the shared budget is spent until the
// monotonic time until: they then do not wait for a refill (the rule's action
// applies at once). A grant of tokens ends it early.
func (l *Lease) SetDryUntil(until int64) { l.dryUntil.Store(until) }

// Tokens returns the unspent tokens.
func (l *Lease) Tokens() int64 { return int64(l.word.Load() & leaseTokenMask) }

// SetMode switches how the meter decides (LeaseShared, LeaseLocal,
// LeaseOpen or LeaseClosed). divisor is the share in LeaseLocal mode
// (limit ÷ divisor, at least 1 admission); it is ignored otherwise.
func (l *Lease) SetMode(mode int32, divisor int64) {
	if divisor < 1 {
		divisor = 1
	}
	l.divisor.Store(divisor)
	l.mode.Store(mode)
	if mode != LeaseShared {
		l.Grant(0, l.from.Load(), l.expires.Load()) // release decisions waiting for a refill
	}
}

// Mode returns the current mode.
func (l *Lease) Mode() int32 { return l.mode.Load() }

// Arrivals returns how many decisions consulted the lease since it was
// made: the leaser sizes its requests from the rate of change.
func (l *Lease) Arrivals() int64 { return l.arrivals.Load() }

// State is the memory state seen by the latest decision: the leaser asks for
// budget under that state's limit, so per-state limits hold cluster-wide.
func (l *Lease) State() MemState { return MemState(l.state.Load()) }

func (l *Lease) note(st MemState) {
	l.arrivals.Add(1)
	if MemState(l.state.Load()) != st {
		l.state.Store(uint32(st))
	}
}

// take spends one token valid at now. It returns the generation to give
// the token back under (putBack) if it ends up not spent.
//
// The bounds are read after the word: Grant stores them before it adds the
// tokens, and Drain moves the generation on, so the CAS below fails if the
// tokens were drained and granted anew for another sub-interval after the
// bounds were checked.
func (l *Lease) take(now int64) (gen uint64, ok bool) {
	for {
		w := l.word.Load()
		n := int64(w & leaseTokenMask)
		if n <= 0 || now >= l.expires.Load() || now < l.from.Load() {
			return 0, false
		}
		if l.word.CompareAndSwap(w, w-1) {
			if n-1 <= l.lowWater.Load() {
				l.signal()
			}
			return w >> 32, true
		}
	}
}

// putBack returns a token taken under generation gen and not spent, unless
// a Drain came between: then its sub-interval is over and it is dropped (it
// stays counted where it was granted, a cautious error).
func (l *Lease) putBack(gen uint64) {
	for {
		w := l.word.Load()
		if w>>32 != gen || l.word.CompareAndSwap(w, w+1) {
			return
		}
	}
}

func (l *Lease) signal() {
	select {
	case l.need <- struct{}{}:
	default:
	}
}

// refreshed returns the time to decide at after a wait: the clock's reading
// now, or now when the lease has no clock.
func (l *Lease) refreshed(now int64) int64 {
	if l.clock != nil {
		return l.clock.Now()
	}
	return now
}

// awaitRefill asks the leaser for tokens and waits up to the wait budget for
// its next grant. It reports whether a grant came.
func (l *Lease) awaitRefill(now int64) bool {
	if l.wait <= 0 || l.mode.Load() != LeaseShared || now < l.dryUntil.Load() {
		l.signal()
		return false
	}
	ch := *l.refill.Load()
	l.signal()
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
