//go:build linux

package http

import (
	"github.com/sluicelb/sluice/proxyproto"
)

// clientProxy handles the PROXY protocol at the start of c's bytes
// (c.pp): from a balancer it parses the header from the read buffer as
// bytes arrive, never waiting on the loop, and takes the client it names
// as c's; from another source it refuses a header. It returns true when
// the buffered bytes are the connection's own (parse them), false when
// it needs more bytes or closed c.
func (l *evloop) clientProxy(c *cconn) bool {
	buf := c.in[c.r:c.w]
	if c.pp == proxySniff {
		if proxyproto.Sniff(buf) {
			l.s.proxyRejected(proxyproto.ReasonUntrusted, c.ip, nil)
			l.closeClient(c)
			return false
		}
		if !mayBeProxy(buf) {
			c.pp = proxyDone
		}
		return true
	}
	h, n, err := proxyproto.Parse(buf)
	if err == proxyproto.ErrIncomplete {
		if c.w == len(c.in) {
			// Cannot happen: a client buffer (4 KiB) holds the longest
			// header (proxyproto.MaxLen).
			l.s.proxyRejected(proxyproto.ReasonMalformed, c.ip, err)
			l.closeClient(c)
		}
		return false
	}
	if err != nil {
		l.s.proxyRejected(proxyproto.Reason(err), c.ip, err)
		l.closeClient(c)
		return false
	}
	c.r += n
	c.pp = proxyDone
	c.deadline = l.now + int64(l.s.cfg.ClientIdle)
	if h.Command == proxyproto.Proxy && h.Source.IsValid() {
		cl := h.Source.Addr().Unmap()
		if cl != c.ip {
			if hit := l.s.conns.rekey(c.ip, cl); hit != notLimited {
				l.s.connLimited(hit, cl)
				l.closeClient(c)
				return false
			}
			c.ip = cl
		}
		c.port = h.Source.Port()
	}
	return c.w > c.r
}
