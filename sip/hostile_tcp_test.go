package sip

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/metrics"
	"strings"
	"syscall"
	"testing"
	"time"
)

func optionsTo(s *Server, from net.Addr, branch string) string {
	return fmt.Sprintf("OPTIONS sip:%s SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-%s\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:%s>\r\nCall-ID: %s@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n",
		s.udpAddr(), from, branch, s.udpAddr(), branch)
}

// Regression: a peer that sent one byte every 2 s kept its connection
// forever, because the idle timeout restarted on every byte. The message
// deadline is set at the first byte and a trickle cannot extend it.
func TestTCPTrickleClosed(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) {
		c.TCPIdleTimeout = time.Minute
		c.TCPMessageTimeout = 300 * time.Millisecond
	})
	c := dialTCP(t, s)
	msg := optionsTo(s, c.conn.LocalAddr(), "trickle")
	sent := 0
	closedAt := -1
	for i := 0; i < len(msg) && i < 40; i++ { // 40 bytes at 50 ms: 2 s, far past 300 ms
		if _, err := c.conn.Write([]byte{msg[i]}); err != nil {
			closedAt = i
			break
		}
		sent++
		if s.metrics.TCPSlow.Load() > 0 {
			closedAt = i
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if closedAt < 0 {
		t.Fatalf("connection still open after %d bytes trickled over %v (message timeout 300ms)", sent, time.Duration(sent)*50*time.Millisecond)
	}
	if _, err := c.next(); err == nil {
		t.Errorf("read after the message deadline: got a message, want the connection closed")
	}
	eventually(t, "connection table empty", func() bool { return s.tcp.len() == 0 })
	if got := s.metrics.TCPSlow.Load(); got != 1 {
		t.Errorf("tcp slow closed = %d, want 1", got)
	}
	// A complete message sent at once on a fresh connection is served.
	c2 := dialTCP(t, s)
	c2.write(optionsTo(s, c2.conn.LocalAddr(), "whole"))
	c2.response(200)
}

// TestTCPHugeContentLength: a Content-Length over -sip-max-message (or with
// too many digits) is a framing error: 400 and close, nothing buffered for
// it. A Content-Length within the limit whose body never comes is closed by
// the message deadline.
func TestTCPHugeContentLength(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.TCPMessageTimeout = 300 * time.Millisecond })
	for _, cl := range []string{"65536", "999999999", "18446744073709551617", "-1", "1e6"} {
		t.Run(cl, func(t *testing.T) {
			c := dialTCP(t, s)
			m := strings.Replace(optionsTo(s, c.conn.LocalAddr(), "huge"), "Content-Length: 0", "Content-Length: "+cl, 1)
			c.write(m)
			c.response(400)
			if _, err := c.next(); !errors.Is(err, io.EOF) {
				t.Errorf("connection not closed: %v", err)
			}
		})
	}
	t.Run("body never sent", func(t *testing.T) {
		slow := s.metrics.TCPSlow.Load()
		c := dialTCP(t, s)
		c.write(strings.Replace(optionsTo(s, c.conn.LocalAddr(), "nobody"), "Content-Length: 0", "Content-Length: 60000", 1))
		if _, err := c.next(); err == nil {
			t.Fatal("got a message, want the connection closed")
		}
		if got := s.metrics.TCPSlow.Load() - slow; got != 1 {
			t.Errorf("tcp slow closed +%d, want 1", got)
		}
	})
	eventually(t, "connection table empty", func() bool { return s.tcp.len() == 0 })
}

// TestTCPPeerStopsReading: a client that sends requests and never reads
// its answers. Writes to it never block a reader; once its queue passes
// maxWriteQueue the connection is closed and counted, and the balancer keeps
// answering others throughout.
func TestTCPPeerStopsReading(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", s.udpAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Max-Forwards 0: answered by the balancer itself, about 300 bytes each.
	req := []byte(strings.Replace(optionsTo(s, conn.LocalAddr(), "noread"), "Max-Forwards: 70", "Max-Forwards: 0", 1))
	batch := []byte(strings.Repeat(string(req), 64))
	other := dialTCP(t, s)
	deadline := time.Now().Add(20 * time.Second)
	sent := 0
	for s.metrics.TCPStalled.Load() == 0 && time.Now().Before(deadline) && sent < 200_000 {
		_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write(batch); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			break // closed by the balancer
		}
		sent += 64
		if sent%6400 == 0 { // another client is answered meanwhile
			other.write(optionsTo(s, other.conn.LocalAddr(), fmt.Sprintf("alive-%d", sent)))
			other.response(200)
		}
	}
	t.Logf("%d requests sent before the balancer gave up on the peer", sent)
	eventually(t, "the stalled connection closed and counted", func() bool { return s.metrics.TCPStalled.Load() == 1 })
	other.write(optionsTo(s, other.conn.LocalAddr(), "after"))
	other.response(200)
	eventually(t, "only the other connection left", func() bool { return s.tcp.len() == 1 })
}

// liveBytes is the heap in use plus goroutine stacks, after a collection.
func liveBytes() int64 {
	runtime.GC()
	runtime.GC()
	ss := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	metrics.Read(ss)
	return int64(ss[0].Value.Uint64() + ss[1].Value.Uint64())
}

// TestTCPIdleConnectionsMemory: 2,000 idle connections (each has sent one
// keep-alive, so its reader ran) cost little each, and the memory comes back
// when they close (all but the runtime's caches: at most 1,500 bytes per
// closed connection stay, mostly freed goroutine stacks the runtime keeps;
// that was a fifth of the 7.5 kB an idle connection cost while it held a
// read buffer). The figure includes the client side of each connection,
// which lives in the same process.
func TestTCPIdleConnectionsMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("2,000 connections")
	}
	const n = 2000
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) {
		c.TCPMaxConnsPerSource = n                  // all from 127.0.0.1
		c.TCPFirstMessageTimeout = 10 * time.Minute // they only send keep-alives
	})
	base := liveBytes()
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	pong := make([]byte, 2)
	for range n {
		c, err := net.Dial("tcp", s.udpAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_ = c.SetDeadline(time.Now().Add(wait))
		if _, err := c.Write([]byte("\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, pong); err != nil || string(pong) != "\r\n" {
			t.Fatalf("keep-alive answer %q, %v", pong, err)
		}
	}
	eventually(t, "all connections registered", func() bool { return s.tcp.len() == n })
	open := liveBytes()
	per := (open - base) / n
	t.Logf("idle TCP connection: %d bytes each (heap + stacks, both ends), %d connections", per, n)
	limit := int64(16 << 10)
	if raceEnabled {
		limit *= 2 // the race detector enlarges goroutine stacks
	}
	if per > limit {
		t.Errorf("idle connection costs %d bytes, want at most %d", per, limit)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	eventually(t, "connection table empty", func() bool { return s.tcp.len() == 0 })
	const residue = 1500 // bytes per closed connection the runtime may keep cached
	var after int64
	for range 20 { // closed connections' buffers and stacks go at the next collections
		if after = liveBytes(); after-base <= n*residue {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("after close: %d bytes over the start (%d while open)", after-base, open-base)
	if after-base > n*residue {
		t.Errorf("after closing, %d bytes still held over the start, want at most %d (%d per connection; %d held while open)", after-base, n*residue, residue, open-base)
	}
}
