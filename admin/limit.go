package admin

import (
	"net"
	"sync"
	"sync/atomic"
)

// maxConns bounds the admin listener's open connections. Past it, new
// connections wait in the kernel's accept queue, where they hold no
// descriptor of the process: a client that opens thousands of idle
// connections to the admin port cannot take the descriptors the front
// ends, health probes and the store need (SLUICE-2026-005). 256 is far
// above what operators, dashboards and scrapers open at once.
const maxConns = 256

// limitListener lets at most max connections be open at once: Accept
// waits for one to close.
type limitListener struct {
	net.Listener
	sem  chan struct{}
	open atomic.Int64
	peak atomic.Int64 // most connections open at once (tests)
}

func newLimitListener(ln net.Listener, max int) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, max)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.sem <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	if n := l.open.Add(1); n > l.peak.Load() {
		l.peak.Store(n)
	}
	return &limitConn{Conn: c, l: l}, nil
}

// limitConn gives its slot back once, when it is closed.
type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		<-c.l.sem
	})
	return err
}
