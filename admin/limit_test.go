package admin

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestAdminConnectionsBounded: idle connections past the cap hold no slot
// (and no descriptor) of the admin listener; the request behind them is
// served as soon as one of them closes.
func TestAdminConnectionsBounded(t *testing.T) {
	srv := New(nil)
	srv.maxConns = 2
	srv.Handle("GET /healthz", Healthz(nil))
	ln, err := newLocalListener()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := contextWithTimeout(5 * time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	})
	addr := ln.Addr().String()
	var idle []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for srv.limit.Load() == nil || srv.limit.Load().open.Load() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the two idle connections were not accepted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A third client asks; it waits in the accept queue until one of the
	// idle connections closes, then gets its answer.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr)
	idle[0].Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(line, " 200 ") {
		t.Fatalf("the request behind the cap: %q %v", line, err)
	}
	if p := srv.limit.Load().peak.Load(); p > 2 {
		t.Errorf("%d connections open at once, cap 2", p)
	}
}
