package sip

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// TestOwnDropsNotChargedToBackend: an INVITE a silent backend leaves
// unanswered fails over and counts a failure against that backend; the
// same timeout while sluice's own UDP socket was seen dropping datagrams
// (its receive queue full: the backend's answer may be among them) fails
// over just the same but is not charged to the backend, and is counted.
func TestOwnDropsNotChargedToBackend(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(modeSilent)
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) { c.FailoverTimeout = time.Second })
	var drops atomic.Uint32
	read := func() (uint32, bool) { return drops.Load(), true }
	s.ownDrops.read.Store(&read)
	c := newUAC(t, s.udpAddr())
	failures := func() uint64 { return s.pool.Load().list[0].lb.Status(s.clock.Now()).Failures }
	// call sends calls until one is tried on the silent b1 first, and
	// runs dropped once b1 has that INVITE (before its timeout).
	call := func(dropped func()) {
		t.Helper()
		for i := 0; ; i++ {
			if i == 64 {
				t.Fatal("the silent backend was never tried")
			}
			k := c.newCall()
			k.invite("")
			// The first backend to get the INVITE is the one tried
			// first (the failover comes a second later).
			tried := false
			for end := time.Now().Add(wait); ; time.Sleep(time.Millisecond) {
				if b1.count(gosip.INVITE, k.callID) > 0 {
					tried = true
					break
				}
				if b2.count(gosip.INVITE, k.callID) > 0 || time.Now().After(end) {
					break
				}
			}
			if tried && dropped != nil {
				dropped()
			}
			c.recvResponse(180)
			k.learn(c.recvResponse(200))
			if b2.count(gosip.INVITE, k.callID) != 1 {
				t.Fatalf("call %d not on b2", i)
			}
			k.inDialog("ACK", 1, k.branch+"-ack")
			k.inDialog("BYE", 2, k.branch+"-bye")
			c.recvResponse(200)
			if tried {
				return
			}
		}
	}
	call(nil)
	if f := failures(); f != 1 {
		t.Fatalf("b1 failures after a timeout: %d, want 1", f)
	}
	call(func() { drops.Add(7) })
	if f := failures(); f != 1 {
		t.Errorf("b1 failures after a timeout while sluice's socket dropped datagrams: %d, want still 1", f)
	}
	if n, d := s.metrics.TimeoutsOwnDrops.Load(), s.metrics.OwnDrops.Load(); n != 1 || d != 7 {
		t.Errorf("timeouts not charged %d, own drops %d; want 1 and 7", n, d)
	}
	if s.metrics.Timeouts.Load() != 2 {
		t.Errorf("timeouts %d, want 2 (both failed over)", s.metrics.Timeouts.Load())
	}
}

// TestUDPDropsRead: the drop count of a real socket is read, and grows
// when its receive queue overflows.
func TestUDPDropsRead(t *testing.T) {
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_ = ln.SetReadBuffer(1) // the kernel's minimum: a few datagrams
	n0, ok := udpDrops(ln)
	if !ok {
		t.Skip("SO_MEMINFO not readable here")
	}
	out, err := net.DialUDP("udp", nil, ln.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	msg := make([]byte, 1000)
	for range 200 {
		out.Write(msg) // nobody reads ln
	}
	if n, _ := udpDrops(ln); n <= n0 {
		t.Errorf("drops %d after 200 datagrams into a full queue, was %d", n, n0)
	}
}
