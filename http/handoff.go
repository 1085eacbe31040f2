//go:build linux

package http

import (
	"net"
	"net/netip"
	"os"
	"sync"
)

// handover gives the connection, with the bytes read so far, to the
// fasthttp server for the rest of its life.
func (l *evloop) handover(c *cconn) {
	l.s.stats.HandedOver.Add(1)
	prefix := append([]byte(nil), c.in[c.r:c.w]...)
	l.unwatch(c.fd)
	ip, port := c.ip, c.port
	f := os.NewFile(uintptr(l.detach(c)), "http-client")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		l.s.conns.release(ip)
		l.s.logger.Warn("http: handing a connection to fasthttp failed", "err", err)
		return
	}
	if c.tls != nil {
		nc = c.tls.handedOver(nc) // the rest of the records over the socket, by fasthttp's goroutine
	}
	g := l.s.gate(nc, prefix)
	g.release = func() { l.s.conns.release(ip) } // counted until fasthttp closes it
	if len(l.s.cfg.ProxyFrom) > 0 {
		g.remote = net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, port)) // the client a PROXY header may have named
	}
	l.e.handoff.push(g)
}

// handoffListener is the net.Listener the fasthttp server accepts handed
// over connections from.
type handoffListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

// newHandoffListener returns a listener that reports addr as its address.
func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, ch: make(chan net.Conn, 256), done: make(chan struct{})}
}

// push gives c to the fasthttp server, or closes it once the listener is closed.
func (h *handoffListener) push(c net.Conn) {
	select {
	case h.ch <- c:
	case <-h.done:
		c.Close()
	}
}

// Accept returns the next handed-over connection, net.ErrClosed after Close.
func (h *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.ch:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

// Close ends Accept; connections pushed afterwards are closed.
func (h *handoffListener) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

// Addr returns the address of the listener the loops accept on.
func (h *handoffListener) Addr() net.Addr { return h.addr }
