package admin

import (
	"net"
	"sync"
)

// MaxConns bounds the connections the admin listener holds open at once.
// Each is a descriptor of the process: without a bound, anyone who can
// reach the port (no token is needed to connect, nor for GET /healthz)
// could hold thousands of keep-alive connections and run the process out
// of descriptors, so that the HTTP front end stops accepting, health
// probes fail (every backend marked down) and the store cannot write. The
// front end's own limits keep 64 descriptors for listeners, probes, the
// store and this listener; the dashboard, a scraper and `sluice ctl`
// need a few.
//
// At the limit the listener stops accepting until a connection closes:
// the kernel's backlog holds the connections that wait, which costs the
// process no descriptor.
const MaxConns = 32

// limitListener accepts at most n connections open at once.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its slot back when closed.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
