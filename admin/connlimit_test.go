package admin

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingListener counts the connections its listener handed out that
// are still open, and the most at once.
type countingListener struct {
	net.Listener
	open, most atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	n := l.open.Add(1)
	for m := l.most.Load(); n > m && !l.most.CompareAndSwap(m, n); m = l.most.Load() {
	}
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l      *countingListener
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if !c.closed.Swap(true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// TestAdminConnLimit: idle keep-alive connections from clients that need
// no token (GET /healthz) hold at most MaxConns descriptors; the others
// wait in the kernel's backlog and are served once connections close.
// Without the limit, 3×MaxConns clients held 3×MaxConns descriptors (and
// 600 ran a process limited to 512 descriptors out of them: backends
// marked down, the front end unable to accept).
func TestAdminConnLimit(t *testing.T) {
	inner, err := newLocalListener()
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	s := New(nil)
	s.Handle("GET /healthz", Healthz(nil))
	go s.Serve(ln)
	defer func() {
		ctx, cancel := contextWithTimeout(5 * time.Second)
		defer cancel()
		s.Shutdown(ctx)
	}()
	addr := inner.Addr().String()
	req := fmt.Sprintf("GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	answered := func(c net.Conn, wait time.Duration) bool {
		c.SetReadDeadline(time.Now().Add(wait))
		st, err := bufio.NewReader(c).ReadString('\n')
		return err == nil && strings.HasPrefix(st, "HTTP/1.1 200")
	}

	conns := make([]net.Conn, 0, 3*MaxConns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range cap(conns) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
	}
	var served atomic.Int64
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			if answered(c, time.Second) {
				served.Add(1)
			}
		})
	}
	wg.Wait()
	if most, n := ln.most.Load(), served.Load(); most > MaxConns || n > MaxConns || n == 0 {
		t.Fatalf("%d connections open at once, %d of %d answered; want at most %d, and some", most, n, len(conns), MaxConns)
	}

	// The clients leave: a new one is served.
	for _, c := range conns {
		c.Close()
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	if !answered(c, 10*time.Second) {
		t.Fatal("a new client was not served after the others left")
	}
}
