package tlsedge

import (
	"net/netip"
	"sync"
)

// Each source's share of the handshakes in flight. The bound on
// handshakes (maxInFlight) is the node's, over every TLS and WebSocket
// listener; without a share, one address that opens that many
// connections and says nothing (no cryptography asked of it) holds every
// place until the handshake timeout, and no other client of the node
// gets a handshake for as long as it repeats. A source (an IPv4 address,
// an IPv6 /64, as the front ends' connection limits count) may hold at
// most an eighth of the places, at least one; the rest stay for others.
// The table holds only sources with a handshake under way, so it never
// has more than maxInFlight entries.

// sourceShare returns how many handshakes one source may have in flight.
func (l *HandshakeLimiter) sourceShare() int32 {
	return int32(max(1, l.max/8))
}

// sourceKey is the key ip counts under: the address, or for IPv6 its /64.
func sourceKey(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}

// sources is the per-source count of handshakes in flight.
type sources struct {
	mu sync.Mutex
	by map[netip.Addr]int32
}

// AcquireFrom is Acquire for a handshake from src: refused too when src
// has its share (an eighth of maxInFlight, at least one) under way, and
// counted as RefusedSource. An invalid src (a connection not counted per
// source, such as a trusted proxy's) is Acquire. A true must be followed
// by one ReleaseFrom(src).
func (l *HandshakeLimiter) AcquireFrom(src netip.Addr, now int64) bool {
	return l.TryFrom(src, now) == NotRefused
}

// TryFrom is AcquireFrom that says why it refused (for the front ends'
// logs); NotRefused must be followed by one ReleaseFrom(src).
func (l *HandshakeLimiter) TryFrom(src netip.Addr, now int64) Refusal {
	if l.max <= 0 || !src.IsValid() {
		return l.try(now)
	}
	k := sourceKey(src)
	l.src.mu.Lock()
	if l.src.by[k] >= l.sourceShare() {
		l.src.mu.Unlock()
		l.refusedSource.Add(1)
		return RefusedSource
	}
	if l.src.by == nil {
		l.src.by = map[netip.Addr]int32{}
	}
	l.src.by[k]++
	l.src.mu.Unlock()
	if why := l.try(now); why != NotRefused {
		l.releaseSource(k)
		return why
	}
	return NotRefused
}

// ReleaseFrom ends a handshake AcquireFrom(src) let start.
func (l *HandshakeLimiter) ReleaseFrom(src netip.Addr) {
	l.Release()
	if l.max > 0 && src.IsValid() {
		l.releaseSource(sourceKey(src))
	}
}

// releaseSource takes one handshake off k's count.
func (l *HandshakeLimiter) releaseSource(k netip.Addr) {
	l.src.mu.Lock()
	switch n := l.src.by[k]; {
	case n > 1:
		l.src.by[k] = n - 1
	case n == 1:
		delete(l.src.by, k)
	}
	l.src.mu.Unlock()
}
