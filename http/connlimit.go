package http

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Client connections are bounded so that the process never runs out of
// descriptors: a listener that cannot accept for lack of descriptors stays
// ready, and everything else that needs one (backend connections, health
// probes, the store, the admin listener) fails with it.
//
//   - At most Config.MaxClientConns client connections are open at once
//     (default: derived from RLIMIT_NOFILE, see defaultMaxClientConns),
//     at most Config.MaxConnsPerSource from one address (trusted proxies
//     excepted). A connection over a limit is closed at once, unanswered.
//   - When accept fails for lack of descriptors or memory (EMFILE,
//     ENFILE, ENOBUFS, ENOMEM), accepting pauses 5 ms, doubling to 1 s
//     while it keeps failing (as net/http does), and the failure is logged
//     at most once a second with the count since the last line.

// fdReserve is the descriptors kept out of the client limit's reach for
// listeners, health probes, the store, the admin listener, logs and the
// runtime.
const fdReserve = 64

// defaultMaxClientConns derives the client connection limit from the
// descriptor limit n: after fdReserve, half of the rest, since each client
// connection may hold one backend connection.
func defaultMaxClientConns(n uint64) int {
	if n <= fdReserve+2 {
		return 1
	}
	return int(min((n-fdReserve)/2, 1<<30))
}

// defaultMaxConnsPerSource is one eighth of the client limit, at least 64.
func defaultMaxConnsPerSource(total int) int {
	return max(64, total/8)
}

// clientLimit counts open client connections, in total and per source
// address, across engines and loops.
type clientLimit struct {
	max, perSource int
	trusted        []netip.Prefix // not counted per source
	open           atomic.Int64
	mu             sync.Mutex
	by             map[netip.Addr]int32
}

// source is the key a per-source limit counts ip under: the address, or
// for IPv6 its /64 (one subscriber's network holds a whole /64).
func source(ip netip.Addr) netip.Addr {
	if ip.Is6() && !ip.Is4In6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip.Unmap()
}

// limitHit says which client limit refused a connection.
type limitHit uint8

const (
	notLimited    limitHit = iota
	totalLimited           // -http-max-conns
	sourceLimited          // -http-max-conns-per-source
)

// take counts a new connection from ip, or reports false when a limit is
// reached (the caller closes it).
func (l *clientLimit) take(ip netip.Addr) bool { return l.admit(ip) == notLimited }

// admit is take saying which limit, if any, refused.
func (l *clientLimit) admit(ip netip.Addr) limitHit {
	if l.open.Add(1) > int64(l.max) {
		l.open.Add(-1)
		return totalLimited
	}
	if !l.perIP(ip) {
		return notLimited
	}
	ip = source(ip)
	l.mu.Lock()
	defer l.mu.Unlock()
	if int(l.by[ip]) >= l.perSource {
		l.open.Add(-1)
		return sourceLimited
	}
	if l.by == nil {
		l.by = map[netip.Addr]int32{}
	}
	l.by[ip]++
	return notLimited
}

// limitLogEvery is the least time between two lines of limitLog.
const limitLogEvery = 10 * time.Second

// limitLog logs client connections closed over a limit at most once every
// limitLogEvery: without a line, clients behind one NAT that pass
// -http-max-conns-per-source see their connections closed unanswered and
// the operator sees nothing but a counter.
type limitLog struct {
	mu     sync.Mutex
	last   time.Time
	total  int // closed over -http-max-conns since the last line
	source int // closed over -http-max-conns-per-source since the last line
	addr   netip.Addr
}

// refused counts a connection from ip closed over the limit hit and logs
// unless a line went out less than limitLogEvery ago; the line carries the
// connections closed since the last one and the latest source refused.
func (a *limitLog) refused(logger *slog.Logger, hit limitHit, ip netip.Addr, l *clientLimit) {
	a.mu.Lock()
	if hit == sourceLimited {
		a.source++
		a.addr = ip
	} else {
		a.total++
	}
	now := time.Now()
	if !a.last.IsZero() && now.Sub(a.last) < limitLogEvery {
		a.mu.Unlock()
		return
	}
	total, src, addr := a.total, a.source, a.addr
	a.total, a.source, a.last = 0, 0, now
	a.mu.Unlock()
	if src > 0 {
		logger.Warn("http client connections closed unanswered: their source holds -http-max-conns-per-source connections (clients behind one NAT: raise it; a reverse proxy: -http-trusted-proxy)",
			"closed", src, "source", addr.String(), "max_per_source", l.perSource)
	}
	if total > 0 {
		logger.Warn("http client connections closed unanswered: -http-max-conns connections are open",
			"closed", total, "max", l.max)
	}
}

// release ends the count of a connection take accepted.
func (l *clientLimit) release(ip netip.Addr) {
	l.open.Add(-1)
	if !l.perIP(ip) {
		return
	}
	ip = source(ip)
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.by[ip] - 1; n > 0 {
		l.by[ip] = n
	} else {
		delete(l.by, ip)
	}
}

// perIP reports whether connections from ip count toward the per-source limit.
func (l *clientLimit) perIP(ip netip.Addr) bool {
	for _, p := range l.trusted {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

// resourceErr reports whether an accept error is a lack of descriptors or
// memory, which does not go away by retrying at once.
func resourceErr(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// Accept back-off bounds (net/http's).
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// nextBackoff doubles d from acceptBackoffMin up to acceptBackoffMax.
func nextBackoff(d time.Duration) time.Duration {
	if d == 0 {
		return acceptBackoffMin
	}
	return min(2*d, acceptBackoffMax)
}

// acceptLog logs accept failures at most once a second.
type acceptLog struct {
	mu   sync.Mutex
	last time.Time
	n    int
}

// failed counts a failure and logs it unless a line went out less than a
// second ago; the line carries the failures since the last one.
func (a *acceptLog) failed(logger *slog.Logger, err error, retry time.Duration) {
	a.mu.Lock()
	a.n++
	now := time.Now()
	if !a.last.IsZero() && now.Sub(a.last) < time.Second {
		a.mu.Unlock()
		return
	}
	n := a.n
	a.n, a.last = 0, now
	a.mu.Unlock()
	logger.Warn("http accept failed", "err", err, "failures", n, "retry_in", retry.String())
}

// limitedListener is the fasthttp engine's listener: it backs off when
// accept fails for lack of resources, closes connections over the client
// limits, and wraps the others in a gate.
type limitedListener struct {
	net.Listener
	s *Server
}

func (l limitedListener) Accept() (net.Conn, error) {
	var backoff time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if !resourceErr(err) {
				return nil, err
			}
			backoff = nextBackoff(backoff)
			l.s.acceptLog.failed(l.s.logger, err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		var ip netip.Addr
		var peer netip.AddrPort
		if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			peer = ta.AddrPort()
			ip = peer.Addr().Unmap()
		}
		if hit := l.s.conns.admit(ip); hit != notLimited {
			l.s.connLimited(hit, ip)
			c.Close()
			continue
		}
		g := l.s.gate(c, nil)
		g.release = func() { l.s.conns.release(ip) }
		g.peer, g.proxy = netip.AddrPortFrom(ip, peer.Port()), l.s.proxyState(ip)
		return g, nil
	}
}

// connLimited counts and logs a client connection from ip closed over a
// limit.
func (s *Server) connLimited(hit limitHit, ip netip.Addr) {
	s.stats.ConnLimited.Add(1)
	s.limitLog.refused(s.logger, hit, ip, &s.conns)
}

// backendSlots counts the connections open to one backend address, of
// both engines: -http-backend-max-conns is one limit per backend, whichever
// pool (a loop's, or the fasthttp engine's) holds the connection.
type backendSlots struct {
	n     atomic.Int64
	mu    sync.Mutex
	freed chan struct{} // closed when a slot frees; nil when nobody waits
	// refs counts those that may take a slot (a loop's pool of the
	// address, a dial waiting for one); guarded by Server.slotsMu. Every
	// take is made under a reference, so an entry with no reference and
	// no slot taken can be forgotten: nobody can count against it.
	refs int
}

// take counts a connection unless max are open.
func (b *backendSlots) take(max int) bool {
	if b.n.Add(1) > int64(max) {
		b.n.Add(-1)
		return false
	}
	return true
}

// release frees a slot take counted, waking those who wait for one.
func (b *backendSlots) release() {
	b.n.Add(-1)
	b.mu.Lock()
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}

// wait takes a slot, waiting up to d for one to free.
func (b *backendSlots) wait(max int, d time.Duration) bool {
	var t *time.Timer
	for {
		if b.take(max) {
			return true
		}
		b.mu.Lock()
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		ch := b.freed
		b.mu.Unlock()
		if b.take(max) { // a slot freed before the channel was there
			return true
		}
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		}
	}
}

// backendSlots returns the slots of addr, made on first use, with a
// reference the caller gives back (dropSlots) once it will take no more
// of them. An address nobody refers to and with no connection open is
// forgotten: the addresses of a backend name whose answers keep changing
// (-dns-drain lets each go) would otherwise stay in the map for good.
func (s *Server) backendSlots(addr string) *backendSlots {
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	if s.slots == nil {
		s.slots = map[string]*backendSlots{}
	}
	b := s.slots[addr]
	if b == nil {
		b = new(backendSlots)
		s.slots[addr] = b
	}
	b.refs++
	return b
}

// dropSlots gives back a reference backendSlots gave.
func (s *Server) dropSlots(addr string, b *backendSlots) {
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	b.refs--
	s.forgetSlotsLocked(addr, b)
}

// releaseSlot frees a slot of addr taken without a reference kept (the
// fasthttp engine's connections) and forgets the address if that was its
// last.
func (s *Server) releaseSlot(addr string, b *backendSlots) {
	b.release()
	s.slotsMu.Lock()
	defer s.slotsMu.Unlock()
	s.forgetSlotsLocked(addr, b)
}

// forgetSlotsLocked drops addr's entry when it is b, nobody refers to it
// and no slot of it is taken; the caller holds slotsMu.
func (s *Server) forgetSlotsLocked(addr string, b *backendSlots) {
	if b.refs == 0 && b.n.Load() == 0 && s.slots[addr] == b {
		delete(s.slots, addr)
	}
}

// dialBackend is the fasthttp engine's dial: it takes a slot of addr
// first (waiting up to -http-backend-conn-wait), which the connection
// frees when it closes.
func (s *Server) dialBackend(addr string) (net.Conn, error) {
	slots := s.backendSlots(addr)
	ok := slots.wait(s.cfg.MaxConns, s.cfg.ConnWait)
	s.dropSlots(addr, slots) // a slot taken keeps the entry from here
	if !ok {
		return nil, fasthttp.ErrNoFreeConns
	}
	c, err := fasthttp.DialTimeout(addr, s.cfg.ConnectTimeout)
	if err != nil {
		s.releaseSlot(addr, slots)
		return nil, err
	}
	return &slotConn{Conn: c, free: func() { s.freedOutside(addr, slots) }}, nil
}

// freedOutside frees a slot of addr whose connection closed outside the
// loops (the fasthttp engine's, a TLS bridge's) and tells the loops: a
// request of any of them may wait for it.
func (s *Server) freedOutside(addr string, slots *backendSlots) {
	s.releaseSlot(addr, slots)
	if e := s.loops.Load(); e != nil {
		e.slotFreed(addr)
	}
}

// slotConn is a fasthttp engine backend connection that frees its slot
// when closed.
type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}

// sourceCount counts what each source address holds (requests in ARM
// delay queues), trusted proxies not counted.
type sourceCount struct {
	trusted []netip.Prefix
	mu      sync.Mutex
	by      map[netip.Addr]int
}

// take counts one more for ip unless it holds most already.
func (c *sourceCount) take(ip netip.Addr, most int) bool {
	for _, p := range c.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	ip = source(ip)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by[ip] >= most {
		return false
	}
	if c.by == nil {
		c.by = map[netip.Addr]int{}
	}
	c.by[ip]++
	return true
}

// release ends a count take made.
func (c *sourceCount) release(ip netip.Addr) {
	ip = source(ip)
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.by[ip]; ok {
		if n > 1 {
			c.by[ip] = n - 1
		} else {
			delete(c.by, ip)
		}
	}
}
