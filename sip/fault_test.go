package sip

import (
	"net"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/lb"
)

// finalCode returns the status of the next final response the client
// gets, or 0 if none comes within the wait bound (silence).
func (c *uac) finalCode() int {
	for {
		m := c.recv()
		if m == nil {
			return 0
		}
		if res, ok := m.(*gosip.Response); ok && res.StatusCode >= 200 {
			return res.StatusCode
		}
	}
}

// establish sets up calls until n of them are on backend on, returning
// those calls (answered and ACKed, not yet ended).
func establish(t *testing.T, c *uac, on *uas, n int) []*call {
	t.Helper()
	var out []*call
	for i := 0; len(out) < n && i < 20*n; i++ {
		k := c.newCall()
		k.invite("")
		k.c.recvResponse(180)
		k.learn(k.c.recvResponse(200))
		k.inDialog("ACK", 1, k.branch+"-ack")
		if on.count(gosip.INVITE, k.callID) > 0 {
			out = append(out, k)
		}
	}
	if len(out) < n {
		t.Fatalf("only %d of %d calls landed on %s", len(out), n, on.name)
	}
	return out
}

// kill closes a fake backend's socket: it is gone, as after kill -9.
func (u *uas) kill() {
	u.conn.Close()
	<-u.done
}

// TestFaultSIPBackendKilledMidCall: calls are up on b1 when it dies.
// Their in-dialog requests get a final answer from the balancer, never
// silence: 408 while traffic has not shown b1 dead (each is watched for
// -sip-in-dialog-timeout), 480 at once after three in a row went
// unanswered. The OPTIONS check taking b1 down changes nothing for them:
// probes alone never refuse a dialog's requests (a backend may ignore
// OPTIONS and serve its calls). New work goes to b2, and nothing is left
// behind: no watched request, no transaction, no extra goroutine.
func TestFaultSIPBackendKilledMidCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		health bool
		want   int
	}{
		{"undetected", false, 408},
		{"detected", true, 408},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
			s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) {
				c.InDialogTimeout = 200 * time.Millisecond
				if tc.health {
					c.HealthInterval = 50 * time.Millisecond
					c.HealthTimeout = 40 * time.Millisecond
					c.HealthRise, c.HealthFall = 1, 2
				}
			})
			c := newUAC(t, s.udpAddr())
			calls := establish(t, c, b1, 3)
			g0 := runtime.NumGoroutine()
			b1.kill()
			if tc.health {
				eventually(t, "b1 down", func() bool {
					return s.pool.Load().list[0].lb.State(s.clock.Now()) == lb.Down
				})
			}
			for i, k := range calls {
				method := "BYE"
				if i == 1 {
					method = "INFO"
				}
				k.inDialog(method, 2, k.branch+"-2")
				if got := c.finalCode(); got != tc.want {
					t.Fatalf("%s on a dead backend: final answer %d, want %d (0 is silence)", method, got, tc.want)
				}
			}
			// Three unanswered in a row: traffic shows b1 dead.
			calls[0].inDialog("INFO", 3, calls[0].branch+"-3")
			if got := c.finalCode(); got != 480 {
				t.Fatalf("INFO after three unanswered: final answer %d, want 480 at once", got)
			}
			// New work lands on b2 (after a failover while b1 is not
			// known dead, directly once it is).
			for range 4 {
				k := c.newCall()
				k.complete()
				if b2.count(gosip.INVITE, k.callID) != 1 {
					t.Fatalf("new call %s not on b2", k.callID)
				}
			}
			eventually(t, "nothing left", func() bool {
				return s.watchedLen() == 0 && s.txns.Len() == 0 && runtime.NumGoroutine() <= g0+2 // slack: the health checker's own
			})
			m := &s.metrics
			if m.InDialogBackendDown.Load() != 1 || m.InDialogUnanswered.Load() != 3 {
				t.Errorf("counters: unanswered %d, backend down %d; want 3 and 1",
					m.InDialogUnanswered.Load(), m.InDialogBackendDown.Load())
			}
		})
	}
}

// TestFaultSIPInDialogAnsweredNotWatched: an in-dialog request its backend
// answers leaves no watch behind and never gets our 408.
func TestFaultSIPInDialogAnsweredNotWatched(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.InDialogTimeout = 50 * time.Millisecond })
	c := newUAC(t, s.udpAddr())
	for range 20 {
		c.newCall().complete()
	}
	if n := s.watchedLen(); n != 0 {
		t.Errorf("%d in-dialog requests still watched after their answers", n)
	}
	s.expireWatched(s.clock.Now() + int64(time.Second)) // past the in-dialog timeout
	if n := s.metrics.InDialogUnanswered.Load(); n != 0 {
		t.Errorf("%d answered in-dialog requests got our 408", n)
	}
}

// TestFaultSIPBlackHoleNoPileUp: a backend that takes every datagram and
// answers nothing (not even OPTIONS). Calls fail over to the other backend
// until the OPTIONS check takes it down, then go there directly; every
// call completes, and afterwards no transaction, watched request or
// goroutine is left over from the silent backend.
func TestFaultSIPBlackHoleNoPileUp(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(modeSilent)
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) {
		c.Policy = "round-robin"
		// Long enough for b2 to answer on a loaded machine (50 ms made
		// the balancer answer 500, every backend failed, under the race
		// detector beside other packages); short enough that the calls
		// before OPTIONS takes the garbage backend down fail over fast.
		c.FailoverTimeout = 300 * time.Millisecond
		c.HealthInterval = 200 * time.Millisecond
		c.HealthTimeout = 150 * time.Millisecond
		c.HealthRise, c.HealthFall = 1, 3
	})
	c := newUAC(t, s.udpAddr())
	g0 := runtime.NumGoroutine()
	const calls = 40
	for range calls {
		k := c.newCall()
		k.complete()
		if b2.count(gosip.BYE, k.callID) != 1 {
			t.Fatalf("call %s did not end on b2", k.callID)
		}
	}
	if s.pool.Load().list[0].lb.State(s.clock.Now()) != lb.Down {
		t.Error("silent backend not down after the calls")
	}
	deadline := time.Now().Add(wait)
	// Goroutine slack 2: the health checker's own may come and go; a leak
	// per failover would show as one per swallowed INVITE (6 or more).
	for s.txns.Len() != 0 || s.watchedLen() != 0 || runtime.NumGoroutine() > g0+2 {
		if time.Now().After(deadline) {
			t.Fatalf("left over: %d transactions, %d watched, goroutines %d -> %d", s.txns.Len(), s.watchedLen(), g0, runtime.NumGoroutine())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Every INVITE the silent backend swallowed was failed over, once: no
	// call was lost to it and none was tried there twice.
	swallowed, failovers := uint64(b1.count(gosip.INVITE, "")), s.metrics.Failovers.Load()
	if swallowed == 0 || failovers != swallowed {
		t.Errorf("the silent backend swallowed %d INVITEs and %d were failed over, want the same, at least one", swallowed, failovers)
	}
	t.Logf("%d calls completed; INVITEs the silent backend swallowed: %d; failovers: %d", calls, swallowed, failovers)
}

// TestFaultSIPGarbageBackend: a backend that answers every request with
// bytes that are not SIP. Its answers are dropped as malformed (nothing
// reaches the client), calls fail over to the other backend on silence
// until OPTIONS takes it down, and every call completes.
func TestFaultSIPGarbageBackend(t *testing.T) {
	garbage, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var got atomic.Int64
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			_, from, err := garbage.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			got.Add(1)
			garbage.WriteToUDPAddrPort([]byte("SIP/2.0 2OO OK\r\n\x00\xff garbage\r\n\r\n"), from)
		}
	}()
	t.Cleanup(func() { garbage.Close(); <-done })
	b2 := newUAS(t, "b2")
	s := testServer(t, []*uas{b2}, nil, func(c *Config) {
		c.Policy = "round-robin"
		// Long enough for b2 to answer on a loaded machine (50 ms made
		// the balancer answer 500, every backend failed, under the race
		// detector beside other packages); short enough that the calls
		// before OPTIONS takes the garbage backend down fail over fast.
		c.FailoverTimeout = 300 * time.Millisecond
		c.HealthInterval = 200 * time.Millisecond
		c.HealthTimeout = 150 * time.Millisecond
		c.HealthRise, c.HealthFall = 1, 3
		c.Backends = append([]BackendConfig{{ID: "garbage", Addr: garbage.LocalAddr().String(), Transport: "udp", Weight: 1}}, c.Backends...)
	})
	c := newUAC(t, s.udpAddr())
	for range 30 {
		k := c.newCall()
		k.complete()
		if b2.count(gosip.BYE, k.callID) != 1 {
			t.Fatalf("call %s did not end on b2", k.callID)
		}
	}
	if st := s.pool.Load().list[0].lb.State(s.clock.Now()); st != lb.Down {
		t.Errorf("garbage backend is %v, want down", st)
	}
	eventually(t, "no transaction left", func() bool { return s.txns.Len() == 0 && s.watchedLen() == 0 })
	// Every garbage answer was dropped as malformed (none reached the
	// client: each call ended with b2's answers), and the calls the garbage
	// backend took were failed over.
	eventually(t, "every garbage answer counted as malformed", func() bool { return s.metrics.Malformed.Load() == uint64(got.Load()) })
	if f := s.metrics.Failovers.Load(); f == 0 || f > uint64(got.Load()) {
		t.Errorf("%d failovers for %d requests to the garbage backend, want between 1 and %d", f, got.Load(), got.Load())
	}
	t.Logf("30 calls completed; datagrams to the garbage backend: %d; malformed answers dropped: %d; failovers: %d",
		got.Load(), s.metrics.Malformed.Load(), s.metrics.Failovers.Load())
}

// BenchmarkInDialogWatch is what watching costs an in-dialog request that
// its backend answers: the 408 built ahead, the entry recorded, then
// dropped by the answer.
func BenchmarkInDialogWatch(b *testing.B) {
	be := newUAS(b, "b1")
	s := testServer(b, []*uas{be}, nil, nil)
	msg, err := gosip.ParseMessage([]byte("BYE sip:bob@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-bench\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:b@test>;tag=b\r\nCall-ID: bench@test\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n"))
	if err != nil {
		b.Fatal(err)
	}
	req := msg.(*gosip.Request)
	src := source{addr: be.addr}
	branches := make([]string, 1024)
	for i := range branches {
		branches[i] = s.branchOf(req, source{addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(1000+i))}, target{addr: be.addr})
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		br := branches[i&1023]
		s.watch(req, src, br, "b1", "", 0)
		s.answered(br, src, 200, gosip.BYE)
	}
}
