//go:build linux

package http

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// uringPayload is the bytes a test writes to the client at port: its port
// then n bytes made from it, so that a byte of another client's shows.
func uringPayload(port uint16, n int) []byte {
	b := fmt.Appendf(nil, "P%d:%d\n", port, n)
	pat := []byte(strconv.Itoa(int(port)) + ",")
	for len(b) < n+len(pat) {
		b = append(b, pat...)
	}
	return b[:len(fmt.Sprintf("P%d:%d\n", port, n))+n]
}

// TestLoopIOURingRoundOverRing: one round with more client writes than
// the ring holds (300 for 256 entries), some of them larger than a socket
// takes at once (short sends, then EAGAIN): each client gets its own
// bytes, each once, in order, and its connection goes on serving. The
// ring's excess is written the plain way, a short send's rest waits for
// its EPOLLOUT.
func TestLoopIOURingRoundOverRing(t *testing.T) {
	requireRing(t)
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{IOURing: true, Loops: 1}})
	const clients = 300
	rcs := make([]*rawConn, clients)
	for i := range rcs {
		rcs[i] = dialRaw(t, r.addr)
		rcs[i].send("GET /warm HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, _ := rcs[i].read("GET"); resp.StatusCode != 200 {
			t.Fatalf("client %d warm-up: %d", i, resp.StatusCode)
		}
	}
	size := func(port uint16) int {
		if port%50 == 0 {
			return 4 << 20 // more than a loopback socket takes at once
		}
		return 100
	}
	e := r.srv.loops.Load()
	l := e.loops[0]
	before := e.uringSends.Load()
	done := make(chan int)
	l.post(func() {
		for _, o := range l.fds {
			if c := o.c; c != nil && c.fd >= 0 && !c.busy {
				l.writeRaw(c, uringPayload(c.port, size(c.port)))
			}
		}
		done <- len(l.toFlush)
	})
	if q := <-done; q != clients {
		t.Fatalf("%d writes queued for the round, want %d", q, clients)
	}
	for i, rc := range rcs {
		port := uint16(rc.c.LocalAddr().(*net.TCPAddr).Port)
		want := uringPayload(port, size(port))
		got := make([]byte, len(want))
		// Each read has its own deadline: dialRaw's counts from the dial,
		// and 300 warm-ups under -race on a busy machine take most of it.
		rc.c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(rc.br, got); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			n := min(len(got), 64)
			t.Fatalf("client %d (port %d): got %q..., want %q...", i, port, got[:n], want[:n])
		}
	}
	if sent := e.uringSends.Load() - before; sent < ringEntries {
		t.Errorf("%d sends through the ring for the round, want at least %d (a full ring)", sent, ringEntries)
	}
	for i, rc := range rcs {
		rc.c.SetDeadline(time.Now().Add(20 * time.Second))
		rc.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, _ := rc.read("GET"); resp.StatusCode != 200 {
			t.Fatalf("client %d after: %d", i, resp.StatusCode)
		}
	}
}

// TestLoopIOURingSendFails: in one round's batch a send fails (the socket
// is shut for writing: EPIPE in the completion) next to one that
// succeeds. The failed client's connection is closed without a byte, the
// other gets exactly its bytes, and a client that connects next (it may
// get the closed descriptor's number) gets only its own answer.
func TestLoopIOURingSendFails(t *testing.T) {
	requireRing(t)
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{IOURing: true, Loops: 1}})
	// A client's EPOLLOUT edge in the same round may write its bytes the
	// plain way before the batch (correct, but then no batch was tested):
	// try with new clients until the ring took the round's two sends.
	for attempt := 1; ; attempt++ {
		if sendFailsRound(t, r) {
			return
		}
		if attempt == 5 {
			t.Fatal("in 5 rounds the ring never took both sends (each client's own EPOLLOUT wrote first)")
		}
	}
}

// sendFailsRound is one try of TestLoopIOURingSendFails; it reports
// whether the round's two sends went through the ring.
func sendFailsRound(t *testing.T, r *rig) bool {
	a, b := dialRaw(t, r.addr), dialRaw(t, r.addr)
	for _, rc := range []*rawConn{a, b} {
		rc.send("GET /warm HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, _ := rc.read("GET"); resp.StatusCode != 200 {
			t.Fatalf("warm-up: %d", resp.StatusCode)
		}
	}
	aPort := uint16(a.c.LocalAddr().(*net.TCPAddr).Port)
	bPort := uint16(b.c.LocalAddr().(*net.TCPAddr).Port)
	e := r.srv.loops.Load()
	l := e.loops[0]
	before := e.uringSends.Load()
	done := make(chan int)
	l.post(func() {
		q := 0
		for _, o := range l.fds {
			if c := o.c; c != nil && c.fd >= 0 && !c.busy && (c.port == aPort || c.port == bPort) {
				if c.port == aPort {
					unix.Shutdown(c.fd, unix.SHUT_WR)
				}
				l.writeRaw(c, uringPayload(c.port, 100))
				q++
			}
		}
		done <- q
	})
	if q := <-done; q != 2 {
		t.Fatalf("%d writes queued, want 2", q)
	}
	want := uringPayload(bPort, 100)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(b.br, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("other client: %q (%v), want %q", got, err, want)
	}
	if n, err := a.br.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("shut client read %d bytes (%v), want none and the end", n, err)
	}
	batched := e.uringSends.Load()-before >= 2
	c := dialRaw(t, r.addr)
	c.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body := c.read("GET"); resp.StatusCode != 200 || strings.Contains(body, "P") {
		t.Fatalf("next client: %d %q", resp.StatusCode, body)
	}
	b.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, _ := b.read("GET"); resp.StatusCode != 200 {
		t.Fatalf("other client after: %d", resp.StatusCode)
	}
	return batched
}
