package tlsedge

import (
	"math"
	"sync/atomic"
)

// HandshakeLimiter bounds the TLS and WebSocket handshakes of a node: at
// most maxInFlight at once and at most perSecond started a second (a
// token bucket holding one second's worth), so that a flood of new
// connections, each costing a signature, cannot take the CPU from the
// connections already established. It implements the front ends'
// HandshakeGate. Acquire is lock-free and allocates nothing: a
// compare-and-swap for the in-flight count (which never reads above the
// bound) and one for the rate (GCRA: the theoretical arrival time of the
// next handshake). No goroutine. AcquireFrom also holds each source to
// its share of the places (limiter_source.go), under a lock.
type HandshakeLimiter struct {
	max       int64 // 0: no bound
	interval  int64 // nanoseconds per handshake at the rate; 0: no cap
	tolerance int64 // how far ahead of now the next arrival may be: the burst

	inFlight atomic.Int64
	tat      atomic.Int64 // theoretical arrival time of the next handshake
	src      sources      // per-source counts of AcquireFrom (limiter_source.go)

	started, refusedBusy, refusedSource, refusedRate atomic.Uint64
}

// NewHandshakeLimiter returns a limiter of maxInFlight handshakes at once
// (0 or less: no bound) and perSecond started a second (0 or less, or not
// a number: no cap), with a burst of one second's worth (at least one).
func NewHandshakeLimiter(maxInFlight int, perSecond float64) *HandshakeLimiter {
	l := &HandshakeLimiter{}
	if maxInFlight > 0 {
		l.max = int64(maxInFlight)
	}
	if perSecond > 0 && !math.IsInf(perSecond, 0) {
		l.interval = max(1, int64(1e9/perSecond))
		burst := max(1, math.Ceil(perSecond))
		l.tolerance = int64(math.Min(burst-1, math.MaxInt64/float64(l.interval)/2)) * l.interval
	}
	return l
}

// Acquire reports whether one more handshake may start at now (monotonic
// nanoseconds, e.g. admission.MonoClock); false: the caller closes the
// connection without a handshake. A true must be followed by one Release.
func (l *HandshakeLimiter) Acquire(now int64) bool { return l.try(now) == NotRefused }

// try is Acquire that says why it refused.
func (l *HandshakeLimiter) try(now int64) Refusal {
	for {
		n := l.inFlight.Load()
		if l.max > 0 && n >= l.max {
			l.refusedBusy.Add(1)
			return RefusedInFlight
		}
		if l.inFlight.CompareAndSwap(n, n+1) {
			break
		}
	}
	if l.interval > 0 && !l.take(now) {
		l.inFlight.Add(-1)
		l.refusedRate.Add(1)
		return RefusedRate
	}
	l.started.Add(1)
	return NotRefused
}

// take spends one token of the rate at now.
func (l *HandshakeLimiter) take(now int64) bool {
	for {
		tat := l.tat.Load()
		t := max(tat, now)
		if t-now > l.tolerance {
			return false
		}
		if l.tat.CompareAndSwap(tat, t+l.interval) {
			return true
		}
	}
}

// Release ends a handshake Acquire let start, done or failed. A Release
// without its Acquire never takes the count below zero (which would
// loosen the bound for good).
func (l *HandshakeLimiter) Release() {
	for {
		n := l.inFlight.Load()
		if n <= 0 || l.inFlight.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// HandshakeStats are a limiter's counts.
type HandshakeStats struct {
	InFlight      int64  // handshakes under way now
	Started       uint64 // handshakes Acquire let start
	RefusedBusy   uint64 // refused: maxInFlight under way
	RefusedSource uint64 // refused: the source has its share of maxInFlight under way (AcquireFrom)
	RefusedRate   uint64 // refused: over perSecond
}

// Stats returns the counts so far.
func (l *HandshakeLimiter) Stats() HandshakeStats {
	return HandshakeStats{
		InFlight: l.inFlight.Load(), Started: l.started.Load(),
		RefusedBusy: l.refusedBusy.Load(), RefusedSource: l.refusedSource.Load(), RefusedRate: l.refusedRate.Load(),
	}
}
