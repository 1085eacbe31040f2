//go:build linux

package uring

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newRing sets up a ring or skips where the kernel refuses io_uring (the
// package's callers fall back then; there is nothing to test).
func newRing(t testing.TB, entries uint32) *Ring {
	t.Helper()
	r, err := New(entries)
	if err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// tcpPair returns the two ends of a loopback TCP connection as raw
// non-blocking descriptors the caller owns.
func tcpPair(t testing.TB) (a, b int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	a, b = rawFD(t, c.(*net.TCPConn)), rawFD(t, s.(*net.TCPConn))
	c.Close()
	s.Close()
	t.Cleanup(func() { unix.Close(a); unix.Close(b) })
	return a, b
}

func rawFD(t testing.TB, c *net.TCPConn) int {
	t.Helper()
	f, err := c.File()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	return fd
}

// submitAll submits what is queued, waits for all of it and returns the
// completions.
func submitAll(t *testing.T, r *Ring) []Completion {
	t.Helper()
	n := r.Queued()
	got, err := r.Submit(n)
	if err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("Submit took %d of %d", got, n)
	}
	cs := make([]Completion, n+1)
	m := r.Reap(cs)
	if m != n {
		t.Fatalf("Reap: %d completions, want %d", m, n)
	}
	if r.InFlight() != 0 {
		t.Fatalf("InFlight %d after reaping everything", r.InFlight())
	}
	return cs[:m]
}

func TestNewRefusesBadSize(t *testing.T) {
	for _, n := range []uint32{0, MaxEntries + 1} {
		if r, err := New(n); err == nil {
			r.Close()
			t.Errorf("New(%d) = nil error, want one naming the bound", n)
		}
	}
}

// TestSendRecv: a batch of sends and receives on several sockets, each
// completion carrying its own user value and the byte count write(2) and
// read(2) would have returned, or -EAGAIN where they would have.
func TestSendRecv(t *testing.T) {
	r := newRing(t, 8)
	a1, b1 := tcpPair(t)
	a2, b2 := tcpPair(t)
	msg1, msg2 := []byte("hello"), []byte("a longer message")
	if err := r.Send(a1, msg1, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Send(a2, msg2, 2); err != nil {
		t.Fatal(err)
	}
	cs := submitAll(t, r)
	want := map[uint64]int32{1: int32(len(msg1)), 2: int32(len(msg2))}
	for _, c := range cs {
		if c.Res != want[c.User] || c.Err() != nil {
			t.Errorf("send user %d: res %d (%v), want %d", c.User, c.Res, c.Err(), want[c.User])
		}
	}

	buf1, buf2, buf3 := make([]byte, 64), make([]byte, 64), make([]byte, 64)
	r.Recv(b1, buf1, 10)
	r.Recv(b2, buf2, 20)
	r.Recv(a1, buf3, 30) // nothing was sent that way
	cs = submitAll(t, r)
	for _, c := range cs {
		switch c.User {
		case 10:
			if c.Res != int32(len(msg1)) || !bytes.Equal(buf1[:c.Res], msg1) {
				t.Errorf("recv 10: res %d %q", c.Res, buf1[:max(c.Res, 0)])
			}
		case 20:
			if c.Res != int32(len(msg2)) || !bytes.Equal(buf2[:c.Res], msg2) {
				t.Errorf("recv 20: res %d %q", c.Res, buf2[:max(c.Res, 0)])
			}
		case 30:
			if !errors.Is(c.Err(), unix.EAGAIN) {
				t.Errorf("recv on an empty socket: res %d (%v), want -EAGAIN", c.Res, c.Err())
			}
		default:
			t.Errorf("completion with unknown user %d", c.User)
		}
	}
}

// TestSendFullSocket: a send to a socket whose buffers are full completes
// with -EAGAIN, and one larger than the room left completes short with
// exactly the bytes the peer then reads: the partial write of write(2).
func TestSendFullSocket(t *testing.T) {
	r := newRing(t, 4)
	a, b := tcpPair(t)
	big := bytes.Repeat([]byte("x"), 8<<20)
	r.Send(a, big, 1)
	cs := submitAll(t, r)
	sent := int(cs[0].Res)
	if sent <= 0 || sent >= len(big) {
		t.Fatalf("8 MiB send on a fresh socket: res %d, want a short positive count", sent)
	}
	r.Send(a, big[:1], 2)
	if cs = submitAll(t, r); !errors.Is(cs[0].Err(), unix.EAGAIN) {
		t.Fatalf("send on a full socket: res %d (%v), want -EAGAIN", cs[0].Res, cs[0].Err())
	}
	got := 0
	buf := make([]byte, 1<<16)
	for got < sent {
		n, err := unix.Read(b, buf)
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil || n == 0 {
			t.Fatalf("read after %d bytes: %d, %v", got, n, err)
		}
		got += n
	}
	if n, err := unix.Read(b, buf); n > 0 || !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("peer got more than the %d bytes the send reported: %d, %v", sent, n, err)
	}
}

// TestRecvEOFAndReset: a receive after the peer closed completes with 0,
// a send to it then with an error (never a SIGPIPE).
func TestRecvEOFAndReset(t *testing.T) {
	r := newRing(t, 4)
	a, b := tcpPair(t)
	unix.Close(b)
	buf := make([]byte, 16)
	r.Recv(a, buf, 1)
	if cs := submitAll(t, r); cs[0].Res != 0 {
		t.Fatalf("recv after peer close: res %d, want 0 (end of stream)", cs[0].Res)
	}
	var res []int32
	for range 2 { // the first send may still be taken; the one after the RST fails
		r.Send(a, buf, 2)
		res = append(res, submitAll(t, r)[0].Res)
	}
	if res[1] >= 0 {
		t.Fatalf("sends to a closed peer: %v, want an error by the second", res)
	}
}

// TestFull: the ring takes no more operations than it has entries until
// the queued ones are submitted and reaped.
func TestFull(t *testing.T) {
	r := newRing(t, 2)
	a, _ := tcpPair(t)
	p := []byte("x")
	for i := range r.Entries() {
		if err := r.Send(a, p, uint64(i)); err != nil {
			t.Fatalf("send %d of %d: %v", i, r.Entries(), err)
		}
	}
	if err := r.Send(a, p, 99); !errors.Is(err, ErrFull) {
		t.Fatalf("one past the ring's %d entries: %v, want ErrFull", r.Entries(), err)
	}
	if _, err := r.Submit(0); err != nil {
		t.Fatal(err)
	}
	if err := r.Send(a, p, 99); !errors.Is(err, ErrFull) {
		t.Fatalf("submitted but not reaped: %v, want ErrFull", err)
	}
	cs := make([]Completion, r.Entries())
	for n := 0; n < r.Entries(); {
		n += r.Reap(cs[n:])
	}
	if err := r.Send(a, p, 99); err != nil {
		t.Fatalf("after reaping: %v", err)
	}
}

// TestSubmitTakenElsewhere: when the kernel takes none of what the ring
// counts as queued (here an io_uring_enter from outside took it first),
// Submit says so instead of asking again forever on a core.
func TestSubmitTakenElsewhere(t *testing.T) {
	r := newRing(t, 4)
	a, b := tcpPair(t)
	if err := r.Send(a, []byte("x"), 1); err != nil {
		t.Fatal(err)
	}
	atomic.StoreUint32(r.sqTail, r.tail)
	if got, _, e := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 1, 0, 0, 0, 0); e != 0 || got != 1 {
		t.Fatalf("submitting from outside the ring: %d, %v", got, e)
	}
	done := make(chan error, 1)
	go func() { _, err := r.Submit(0); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "took none of 1 queued") {
			t.Fatalf("Submit with the entry taken elsewhere: %v, want the kernel's refusal named", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Submit still asking the kernel after 30s (spinning)")
	}
	// The send itself happened once: its byte is on the other end.
	buf := make([]byte, 4)
	for {
		n, err := unix.Read(b, buf)
		if err == unix.EAGAIN {
			continue
		}
		if err != nil || n != 1 || buf[0] != 'x' {
			t.Fatalf("peer read %q, %v; want the one byte", buf[:max(n, 0)], err)
		}
		break
	}
}
