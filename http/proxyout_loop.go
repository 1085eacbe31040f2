//go:build linux

package http

import (
	"crypto/tls"
	"net/netip"
)

// proxyPool returns the loop's pool of connections to a PROXY backend
// (version v): apart from the plain pool of the address, so that no
// connection with a client's header is ever given to another client, and
// none without one to a PROXY backend. It has no idle connections: each
// is its client's (bconn.owner, cconn.own).
func (l *evloop) proxyPool(addr string, cfg *tls.Config, v uint8) *connPool {
	key := proxyPoolKey(addr, v)
	if cfg != nil {
		key = tlsPoolKey(key)
	}
	p := l.connPools[key]
	if p == nil {
		p = &connPool{addr: addr, key: key, open: l.s.backendSlots(addr), proxy: v}
		l.connPools[key] = p
	}
	p.tls = cfg
	p.used = l.now
	return p
}

// proxyPoolKey is the loop's connPools key of addr's plain PROXY pool of
// version v (tlsPoolKey of it for a TLS backend).
func proxyPoolKey(addr string, v uint8) string {
	if v == 2 {
		return "proxy-v2 " + addr
	}
	return "proxy-v1 " + addr
}

// takeOwn returns c's own idle connection when it goes to p, for c's next
// request; one to another backend is closed (the client moved on).
func (l *evloop) takeOwn(c *cconn, p *connPool) *bconn {
	own := c.own
	if own == nil {
		return nil
	}
	c.own = nil
	if own.cp == p && own.fd >= 0 && own.c == nil {
		return own
	}
	l.closeBackend(own)
	return nil
}

// keepOwn keeps bc, idle after c's request, as c's own for its next; the
// one c kept before (to another backend) is closed.
func (l *evloop) keepOwn(c *cconn, bc *bconn) {
	if c.fd < 0 {
		l.closeBackend(bc)
		return
	}
	if old := c.own; old != nil && old != bc {
		l.closeBackend(old)
	}
	c.own = bc
}

// proxyHeaderFor returns the PROXY header (version v) of a connection
// opened for c: its client's address and port, and the address c
// connected to.
func (l *evloop) proxyHeaderFor(c *cconn, v uint8) []byte {
	var local netip.AddrPort
	if sa, err := getsockname(c.fd); err == nil {
		local = sa
	}
	return proxyHeader(nil, v, c.ip, c.port, local)
}
