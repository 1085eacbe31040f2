package sip

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/sluicelb/sluice/proxyproto"
)

// The PROXY protocol on the way out (-sip-backend ADDR,transport=tcp|tls,
// proxy=v1|v2), for backends that read one per connection (Kamailio's
// tcp_accept_haproxy, OpenSIPS' proxy protocol listeners). Such a backend
// takes every message of a connection as from the client its header names,
// so a connection is never shared between clients: sluice opens one per
// (backend, client address and port), started by a header naming that
// client, and sends that client's requests to that backend over it (new
// work, in-dialog requests, ACK and CANCEL). Whatever the backend sends on
// it (responses, requests towards the client) is the backend's, as on any
// connection to a backend. The backend's other connection, the one every
// backend has, carries what no client sent (OPTIONS pings, ACKs and
// CANCELs of our own making, responses to the backend's requests) and
// starts with a LOCAL header (v2) or "PROXY UNKNOWN" (v1).
//
// Such a connection is closed when the backend sends nothing on it for
// -sip-tcp-idle-timeout (the next message from the client opens another).
// At most proxyConnsPerBackend are open or being opened per backend, at
// most proxyConnsPerSource of them for one client IP address or IPv6 /64
// (clients behind one NAT): a request that would need one more gets 503 with a
// Warning and is counted (backend_proxy_conns_refused).

// Bounds of the per-client connections to one PROXY-protocol backend.
const (
	proxyConnsPerBackend = 4096
	proxyConnsPerSource  = 64
)

// errProxyConnsFull is a send refused: the backend, or the client's
// address, has all the per-client connections it may have.
var errProxyConnsFull = errors.New("per-client connections to the PROXY protocol backend exhausted")

// proxyKey names one per-client connection: its backend and its client.
type proxyKey struct {
	backend, client netip.AddrPort
}

// proxySource is what the per-source share counts by: the backend and
// the client's address (its /64 for IPv6, as sourceKey).
type proxySource struct {
	backend netip.AddrPort
	client  netip.Prefix
}

// proxyTable holds the per-client connections to PROXY-protocol backends,
// live (conns) or being dialled (dialing: the messages waiting for it).
type proxyTable struct {
	mu         sync.Mutex
	conns      map[proxyKey]*tcpConn
	dialing    map[proxyKey][][]byte
	perBackend map[netip.AddrPort]int
	perSource  map[proxySource]int
	// maxBackend and maxSource are the bounds (proxyConnsPerBackend,
	// proxyConnsPerSource; tests lower them).
	maxBackend, maxSource int
}

func (pt *proxyTable) init() {
	pt.conns = map[proxyKey]*tcpConn{}
	pt.dialing = map[proxyKey][][]byte{}
	pt.perBackend = map[netip.AddrPort]int{}
	pt.perSource = map[proxySource]int{}
	pt.maxBackend, pt.maxSource = proxyConnsPerBackend, proxyConnsPerSource
}

// uncountLocked gives back k's place in the bounds. pt.mu held.
func (pt *proxyTable) uncountLocked(k proxyKey) {
	if n := pt.perBackend[k.backend] - 1; n > 0 {
		pt.perBackend[k.backend] = n
	} else {
		delete(pt.perBackend, k.backend)
	}
	ps := proxySource{k.backend, sourceKey(k.client.Addr())}
	if n := pt.perSource[ps] - 1; n > 0 {
		pt.perSource[ps] = n
	} else {
		delete(pt.perSource, ps)
	}
}

// remove forgets tc when it is the connection of its key.
func (pt *proxyTable) remove(tc *tcpConn) {
	pt.mu.Lock()
	if pt.conns[tc.proxyKey] == tc {
		delete(pt.conns, tc.proxyKey)
		pt.uncountLocked(tc.proxyKey)
	}
	pt.mu.Unlock()
}

// len returns the per-client connections open or being opened.
func (pt *proxyTable) len() int {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	return len(pt.conns) + len(pt.dialing)
}

func (pt *proxyTable) closeAll() {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	for _, c := range pt.conns {
		c.c.Close()
	}
}

// sendProxied sends p to b over the connection of b and client, opening
// it (p then waits for it) when there is none and the bounds allow.
func (s *Server) sendProxied(p []byte, b *backend, client netip.AddrPort) error {
	k := proxyKey{b.addr, client}
	pt := &s.proxied
	pt.mu.Lock()
	if c := pt.conns[k]; c != nil {
		pt.mu.Unlock()
		return c.send(p)
	}
	if q, ok := pt.dialing[k]; ok {
		if len(q) >= maxPending {
			pt.mu.Unlock()
			return errConnDead
		}
		pt.dialing[k] = append(q, append([]byte(nil), p...))
		pt.mu.Unlock()
		return nil
	}
	ps := proxySource{b.addr, sourceKey(client.Addr())}
	if s.closed.Load() || pt.perBackend[b.addr] >= pt.maxBackend || pt.perSource[ps] >= pt.maxSource {
		closed := s.closed.Load()
		pt.mu.Unlock()
		if closed {
			return errConnDead
		}
		s.metrics.BackendProxyConnsRefused.Add(1)
		return errProxyConnsFull
	}
	pt.perBackend[b.addr]++
	pt.perSource[ps]++
	pt.dialing[k] = [][]byte{append([]byte(nil), p...)}
	pt.mu.Unlock()
	s.wg.Add(1)
	go s.dialProxied(k, b)
	return nil
}

// dialProxied opens the connection of k: its PROXY header naming the
// client (destination: the backend's address), then TLS for a tls
// backend, then the messages that waited for it.
func (s *Server) dialProxied(k proxyKey, b *backend) {
	defer s.wg.Done()
	pt := &s.proxied
	fail := func(err error) {
		pt.mu.Lock()
		q := pt.dialing[k]
		delete(pt.dialing, k)
		pt.uncountLocked(k)
		pt.mu.Unlock()
		s.metrics.SendErrors.Add(uint64(len(q)))
		s.log.Debug("sip tcp dial (PROXY protocol backend)", "backend", b.id, "client", k.client.String(), "err", err)
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(s.ctx, "tcp", k.backend.String())
	if err != nil {
		fail(err)
		s.dialRefused(k.backend, err)
		return
	}
	hdr := proxyproto.Append(nil, b.spec.Proxy, k.client, k.backend)
	_ = c.SetWriteDeadline(time.Now().Add(tcpWriteTimeout))
	if _, err := c.Write(hdr); err != nil {
		c.Close()
		fail(err)
		return
	}
	_ = c.SetWriteDeadline(time.Time{})
	tc := s.newDialled(c.(*net.TCPConn))
	tc.proxyKey = k
	if b.tls != nil {
		if err := s.clientHandshake(tc, b.tls); err != nil {
			fail(err)
			s.metrics.BackendTLSFailures.Add(1)
			s.log.Warn("sip tls backend: handshake failed", "backend", b.id, "addr", k.backend.String(), "err", err)
			return
		}
	}
	// Registered and its waiting messages queued in one step, so none
	// sent meanwhile overtakes them.
	tc.mu.Lock()
	pt.mu.Lock()
	q := pt.dialing[k]
	delete(pt.dialing, k)
	pt.conns[k] = tc
	if tc.sess != nil {
		tc.mu.Unlock()
		for _, m := range q {
			_ = tc.send(m)
		}
		pt.mu.Unlock()
		q = nil
		tc.mu.Lock()
	} else {
		pt.mu.Unlock()
	}
	if s.closed.Load() {
		tc.c.Close()
	}
	s.wg.Add(1)
	go s.readConn(tc)
	for _, m := range q {
		tc.out = append(tc.out, m)
		tc.outBytes += len(m)
	}
	if len(tc.out) > 0 && !tc.flushing {
		tc.flushing = true
		tc.mu.Unlock()
		tc.startFlush()
		return
	}
	tc.mu.Unlock()
}

// proxyFullHeaders are the Warning and Retry-After of the 503 a request
// gets when its PROXY-protocol backend has no connection left for its
// client.
func proxyFullHeaders(s *Server) []string {
	return []string{"Warning: 399 " + s.adv.String() + ` "backend connections exhausted"`,
		"Retry-After: " + strconv.Itoa(s.jitter(s.cfg.BusyDefault))}
}

// closeBackendConns closes every connection to the backend at a: the
// shared one and the per-client ones.
func (s *Server) closeBackendConns(a netip.AddrPort) {
	if c := s.tcp.get(a); c != nil {
		s.tcp.remove(c) // now, so that a connection is dialled again at once
		c.c.Close()
	}
	s.proxied.mu.Lock()
	for k, c := range s.proxied.conns {
		if k.backend == a {
			c.c.Close()
		}
	}
	s.proxied.mu.Unlock()
}

// proxyBackend reports whether a is a backend with proxy=.
func (s *Server) proxyBackend(a netip.AddrPort) bool {
	b := s.pool.Load().backendAt(a)
	return b != nil && b.spec.Proxy != 0
}

// proxyLocalHeader is the header that starts the shared connection to a
// PROXY-protocol backend: v2 LOCAL or v1 UNKNOWN (no client).
func proxyLocalHeader(v uint8) []byte {
	return proxyproto.Append(nil, v, netip.AddrPort{}, netip.AddrPort{})
}
