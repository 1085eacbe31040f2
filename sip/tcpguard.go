package sip

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Accepted TCP connections are accounted so that no one peer can take what
// every client shares (SLUICE-2026-003):
//
//   - per source: at most TCPMaxConnsPerSource accepted connections per
//     IPv4 address or IPv6 /64 (one host, or one customer's prefix);
//   - the table: at TCPMaxConns, a new connection takes the slot of the
//     connection idle the longest (no complete message for the longest time,
//     none half received, nothing queued for it) instead of being refused;
//   - partial messages: the bytes buffered for messages not yet complete,
//     over every connection, stay within TCPPartialBudget; past it the
//     connection holding the most (the oldest among equals) is closed.
//
// Connections this process dialled are in none of these but the budget, and
// those to backends not even in that.

// sourceKey is what the per-source cap counts by: an IPv4 address, or the
// /64 of an IPv6 address (a host usually has a whole /64 to pick from).
func sourceKey(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// evictScan bounds the connections looked at, from the least recently
// active, for one that can be closed to make room.
const evictScan = 64

// lruTouchEvery is how stale a connection's place in the activity order
// may get: a message moves its connection to the back of the order at most
// this often, so the table lock is not taken for every message.
const lruTouchEvery = time.Second

// lruLink is a connection's place in its table's activity order, guarded
// by tcpTable.mu.
type lruLink struct {
	prev, next *tcpConn
	listed     bool // in the order: an accepted connection still counted
}

// lruPush appends c to the back (most recently active). t.mu held.
func (t *tcpTable) lruPush(c *tcpConn) {
	c.lru = lruLink{prev: t.back, listed: true}
	if t.back != nil {
		t.back.lru.next = c
	} else {
		t.front = c
	}
	t.back = c
}

// lruUnlink takes c out of the order. t.mu held.
func (t *tcpTable) lruUnlink(c *tcpConn) {
	if c.lru.prev != nil {
		c.lru.prev.lru.next = c.lru.next
	} else {
		t.front = c.lru.next
	}
	if c.lru.next != nil {
		c.lru.next.lru.prev = c.lru.prev
	} else {
		t.back = c.lru.prev
	}
	c.lru = lruLink{}
}

// touch records a complete message on accepted connection c: it moves to
// the back of the activity order (at most once per touchEvery).
func (t *tcpTable) touch(c *tcpConn) {
	if !c.accepted {
		return
	}
	now := t.now()
	if last := c.touched.Load(); last != 0 && now-last < int64(t.touchEvery) {
		return
	}
	c.touched.Store(now)
	t.mu.Lock()
	if c.lru.listed && t.back != c {
		t.lruUnlink(c)
		t.lruPush(c)
	}
	t.mu.Unlock()
}

// wallNanos is the default clock of touch.
func wallNanos() int64 { return time.Now().UnixNano() }

// uncount takes accepted connection c out of the accounting (order and
// per-source count), once. t.mu held.
func (t *tcpTable) uncount(c *tcpConn) {
	if !c.lru.listed {
		return
	}
	t.lruUnlink(c)
	t.accepted--
	if n := t.sources[c.source] - 1; n > 0 {
		t.sources[c.source] = n
	} else {
		delete(t.sources, c.source)
	}
}

// idle reports whether c can be closed to make room: no message half
// received and nothing queued for it. t.mu held (c.mu is only tried: the
// lock order is c.mu before t.mu).
func (c *tcpConn) idle() bool {
	if c.partial.Load() {
		return false
	}
	if !c.mu.TryLock() {
		return false
	}
	busy := c.flushing || c.dead
	c.mu.Unlock()
	return !busy
}

// admitVerdict is what accept decided for a new connection.
type admitVerdict int

const (
	admitted admitVerdict = iota
	refusedSource
	refusedFull
)

// admit decides whether a connection from src may be accepted, and takes
// its slot: the per-source cap first, then, when the table is full, the
// slot of the least recently active idle connection, which is returned to
// be closed. t.mu held.
func (t *tcpTable) admit(c *tcpConn, maxConns, perSource int) (admitVerdict, *tcpConn) {
	if t.sources[c.source] >= perSource {
		return refusedSource, nil
	}
	var victim *tcpConn
	if t.accepted >= maxConns {
		for v, i := t.front, 0; v != nil && i < evictScan; v, i = v.lru.next, i+1 {
			if v.idle() {
				victim = v
				break
			}
		}
		if victim == nil {
			return refusedFull, nil
		}
		t.uncount(victim)
		if t.conns[victim.remote] == victim {
			delete(t.conns, victim.remote)
		}
	}
	c.accepted = true
	t.accepted++
	t.sources[c.source]++
	t.lruPush(c)
	return admitted, victim
}

// sourceCount is the accepted connections from a's source.
func (t *tcpTable) sourceCount(a netip.Addr) int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.sources[sourceKey(a)]
}

// partialBudget bounds the bytes held in read buffers of messages not yet
// complete, over every TCP connection. A connection reserves its buffer's
// capacity before it grows it and while it holds part of a message; a
// connection between messages reserves nothing.
type partialBudget struct {
	total atomic.Int64 // the gauge; changed only with mu held
	peak  atomic.Int64 // the most total has been

	mu      sync.Mutex
	holders map[*tcpConn]struct{}
}

// reserve sets c's reservation to n bytes (0 releases it). When that takes
// the total over the limit, connections are shed, the one holding the most
// first (the oldest reservation among equals), c included with n: shed
// ones lose their reservation at once and are returned to be closed.
// reserve reports false when c itself was shed (now, and then it is in
// shed, or earlier): it must close without buffering more.
func (b *partialBudget) reserve(c *tcpConn, n, limit int64, now time.Time) (ok bool, shed []*tcpConn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.shed {
		return false, nil
	}
	if n == 0 {
		b.release(c)
		return true, nil
	}
	if c.held == 0 {
		c.heldSince = now
	}
	total := b.total.Load() - c.held + n
	for total > limit {
		v, vn := c, n
		for h := range b.holders {
			if h != c && (h.held > vn || h.held == vn && h.heldSince.Before(v.heldSince)) {
				v, vn = h, h.held
			}
		}
		if v == c {
			b.release(c)
			c.shed = true
			return false, append(shed, c)
		}
		total -= v.held
		b.release(v)
		v.shed = true
		shed = append(shed, v)
	}
	if t := b.total.Add(n - c.held); t > b.peak.Load() {
		b.peak.Store(t)
	}
	c.held = n
	if b.holders == nil {
		b.holders = map[*tcpConn]struct{}{}
	}
	b.holders[c] = struct{}{}
	return true, shed
}

// release drops c's reservation. b.mu held.
func (b *partialBudget) release(c *tcpConn) {
	if c.held != 0 {
		b.total.Add(-c.held)
		c.held = 0
		delete(b.holders, c)
	}
}

// held is the bytes reserved now, over every connection.
func (b *partialBudget) held() int64 { return b.total.Load() }

// reservePartial sets tc's reservation in the partial-message budget to n
// bytes (*reserved mirrors it) and closes the connections shed to make
// room. It reports false when tc itself is shed: its reader must stop.
// Connections to backends are not in the budget.
func (s *Server) reservePartial(tc *tcpConn, n int64, reserved *int64) bool {
	if !tc.budgeted {
		return true
	}
	ok, shed := s.tcp.budget.reserve(tc, n, int64(s.cfg.TCPPartialBudget), time.Now())
	if ok {
		*reserved = n
	} else {
		*reserved = 0
	}
	for _, v := range shed {
		s.metrics.TCPPartialShed.Add(1)
		s.log.Debug("sip tcp partial-message budget exceeded: the connection holding the most closed", "remote", v.remote.String(), "budget", s.cfg.TCPPartialBudget)
		v.mu.Lock()
		if !v.dead {
			v.kill()
		}
		v.mu.Unlock()
	}
	return ok
}
