package sip

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// policies are every -sip-lb-policy value.
var policies = []string{"hash", "round-robin", "weighted-round-robin", "least-outstanding", "p2c"}

// tinyMOP gives the backend with id "b1" a MOP limiter that admits one
// INVITE and then one per 10 s, so the policy's choice of b1 is refused
// and new work moves to b2; other backends get none.
func tinyMOP(t testing.TB) func(BackendConfig) *admission.MOP {
	return func(bc BackendConfig) *admission.MOP {
		if bc.ID != "b1" {
			return nil
		}
		m, err := admission.NewMOP(admission.MOPConfig{Name: bc.ID, InitialRate: 0.1, MinRate: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}

// mopServer is testServer with MOP limiters from mops.
func mopServer(t testing.TB, backends []*uas, mut func(*Config), mops func(BackendConfig) *admission.MOP) *Server {
	t.Helper()
	signer, err := lb.NewSigner(testKey)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admission.NewController(admission.ControllerConfig{}, nil, admission.MonoClock{}.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", FailoverTimeout: 300 * time.Millisecond}
	for i, b := range backends {
		cfg.Backends = append(cfg.Backends, BackendConfig{ID: fmt.Sprintf("b%d", i+1), Addr: b.addr.String()})
	}
	if mut != nil {
		mut(&cfg)
	}
	s, err := New(cfg, Deps{Admission: adm, Signer: signer, MOP: mops}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// tokenless turns k into a call from a UA that ignores Record-Route, as
// SIPp's built-in uac scenario: no Route, Request-URI the balancer.
func (k *call) tokenless(lbAddr string) {
	k.route = nil
	k.target = "sip:service@" + lbAddr
}

// whereInvite returns the backend that answered k's INVITE and the other.
func whereInvite(t *testing.T, k *call, b1, b2 *uas) (home, other *uas) {
	t.Helper()
	n1, n2 := b1.count(gosip.INVITE, k.callID), b2.count(gosip.INVITE, k.callID)
	switch {
	case n1 == 1 && n2 == 0:
		return b1, b2
	case n2 == 1 && n1 == 0:
		return b2, b1
	}
	t.Fatalf("call %s: INVITEs at b1 %d, b2 %d; want one in all", k.callID, n1, n2)
	return nil, nil
}

// TestTokenlessInDialogEveryPolicy: under every policy, with MOP refusing
// b1 so INVITEs move off the policy's choice, ACK and BYE without our
// Route reach the backend that took the INVITE, and never the other.
// Without the dialog table, the Call-ID hash would send some elsewhere;
// the test checks that such calls occur.
func TestTokenlessInDialogEveryPolicy(t *testing.T) {
	for _, policy := range policies {
		t.Run(policy, func(t *testing.T) {
			b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
			s := mopServer(t, []*uas{b1, b2}, func(c *Config) { c.Policy = policy }, tinyMOP(t))
			c := newUAC(t, s.udpAddr())
			if policy == "least-outstanding" || policy == "p2c" {
				// These prefer the backend with fewer requests in flight
				// (MOP headroom breaks ties), so MOP alone never makes them
				// choose b1. A call left ringing at b2 makes them choose b1,
				// which MOP then refuses, and sends the hash fallback to b1.
				b2.mode.Store(modeRing)
				blocker := c.newCall()
				blocker.invite("")
				c.recvResponse(180)
				b2.mode.Store(modeAnswer)
				if b2.count(gosip.INVITE, blocker.callID) != 1 {
					t.Fatal("the ringing call is not at b2")
				}
			}
			const calls = 16
			hashWouldMiss := 0
			for i := range calls {
				k := c.newCall()
				k.invite("")
				c.recvResponse(180)
				k.learn(c.recvResponse(200))
				k.tokenless(s.udpAddr().String())
				home, other := whereInvite(t, k, b1, b2)
				if fb := s.pool.Load().home(lb.Hash(k.callID), s.clock.Now()); fb.addr != home.addr {
					hashWouldMiss++
				}
				k.inDialog("ACK", 1, k.branch+"-ack")
				k.inDialog("BYE", 2, k.branch+"-bye")
				c.recvResponse(200)
				eventually(t, "ACK at the INVITE's backend", func() bool { return home.count(gosip.ACK, k.callID) == 1 })
				if n := home.count(gosip.BYE, k.callID); n != 1 {
					t.Errorf("call %d: %d BYEs at the INVITE's backend %s, want 1", i, n, home.name)
				}
				if n := other.count(gosip.ACK, k.callID) + other.count(gosip.BYE, k.callID); n != 0 {
					t.Errorf("call %d: %d ACK/BYE at %s, which never saw the INVITE", i, n, other.name)
				}
			}
			if hashWouldMiss == 0 {
				t.Errorf("no INVITE was moved off the Call-ID hash's choice: the test proves nothing")
			}
			if r, fb, miss := s.metrics.DialogRouted.Load(), s.metrics.CallIDFallback.Load(), s.metrics.DialogMisses.Load(); r != 2*calls || fb != 0 || miss != 0 {
				t.Errorf("routed by the table %d, by hash %d, misses %d; want %d, 0, 0", r, fb, miss, 2*calls)
			}
			t.Logf("%s: %d of %d calls off the hash's choice", policy, hashWouldMiss, calls)
		})
	}
}

// TestTokenlessByeAfterFailover: an INVITE whose hash choice answers 503
// moves to the other backend; once the first takes new work again (the
// hash points back at it), the token-less ACK and BYE still go where the
// call is.
func TestTokenlessByeAfterFailover(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(mode503)
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	first := s.pool.Load().list[0]
	c := newUAC(t, s.udpAddr())
	for i := 0; i < 4; {
		k := c.newCall()
		if s.pool.Load().home(lb.Hash(k.callID), s.clock.Now()) != first {
			continue // wants a call whose hash choice is b1
		}
		i++
		k.invite("")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		k.tokenless(s.udpAddr().String())
		first.lb.ClearBusy() // the 503's Retry-After is over
		if got := s.pool.Load().home(lb.Hash(k.callID), s.clock.Now()); got != first {
			t.Fatalf("hash choice %s, want b1 again", got.id)
		}
		k.inDialog("ACK", 1, k.branch+"-ack")
		k.inDialog("BYE", 2, k.branch+"-bye")
		c.recvResponse(200)
		eventually(t, "ACK at b2", func() bool { return b2.count(gosip.ACK, k.callID) == 1 })
		if n := b2.count(gosip.BYE, k.callID); n != 1 {
			t.Errorf("call %s: %d BYEs at b2, want 1", k.callID, n)
		}
		// b1 gets one ACK: ours, for its 503 (RFC 3261 §17.1.1.3). It was
		// sent before the failover, but b1 reads it on its own goroutine.
		eventually(t, "our ACK of the 503 at b1", func() bool { return b1.count(gosip.ACK, k.callID) >= 1 })
		if a, b := b1.count(gosip.ACK, k.callID), b1.count(gosip.BYE, k.callID); a != 1 || b != 0 {
			t.Errorf("call %s: %d ACKs and %d BYEs at b1, which answered 503; want 1 and 0", k.callID, a, b)
		}
	}
	if s.metrics.Failovers.Load() != 4 {
		t.Errorf("failovers %d, want 4", s.metrics.Failovers.Load())
	}
}

// TestDialogEntryLifecycle: an INVITE answered non-2xx, or ended by the
// balancer itself, leaves no entry; an answered BYE ends the linger of
// its entry; calls that follow Record-Route never consult the table.
func TestDialogEntryLifecycle(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())

	b1.mode.Store(modeBusy)
	k := c.newCall()
	k.invite("")
	c.recvResponse(486)
	if n := s.dialogs.Len(); n != 0 {
		t.Errorf("486: %d entries left, want 0", n)
	}

	b1.mode.Store(modeSilent) // every backend silent: our own 500
	k = c.newCall()
	k.invite("")
	c.recvResponse(500)
	if n := s.dialogs.Len(); n != 0 {
		t.Errorf("500 from the balancer: %d entries left, want 0", n)
	}

	b1.mode.Store(modeAnswer)
	k = c.newCall()
	k.complete() // follows Record-Route: token-routed ACK and BYE
	from := "a" + k.callID
	eventually(t, "the BYE's answer to end the dialog", func() bool {
		_, ok := s.dialogs.peek(k.callID, from, k.toTag, s.clock.Now()+int64(dialogLinger))
		return !ok
	})
	if _, ok := s.dialogs.peek(k.callID, from, k.toTag, s.clock.Now()); !ok {
		t.Error("entry gone at once; want it to linger for BYE retransmissions")
	}
	// Both directions name the dialog: the 2xx's To-tag was recorded.
	if _, ok := s.dialogs.peek(k.callID, k.toTag, from, s.clock.Now()); !ok {
		t.Error("callee-side tags do not find the entry")
	}
	if r, miss := s.metrics.DialogRouted.Load(), s.metrics.DialogMisses.Load(); r != 0 || miss != 0 {
		t.Errorf("token-routed call consulted the table: routed %d, misses %d", r, miss)
	}
	if n := s.dialogs.sweepAll(s.clock.Now() + int64(dialogLinger)); n != 1 || s.dialogs.Len() != 0 {
		t.Errorf("sweep after the linger removed %d, left %d; want 1 and 0", n, s.dialogs.Len())
	}
}

// TestDialogTableFull: past -sip-dialog-max new dialogs are not recorded
// (counted), and their token-less BYEs fall back to the Call-ID hash.
func TestDialogTableFull(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) { c.DialogMax = 2 })
	c := newUAC(t, s.udpAddr())
	for range 3 {
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		k.tokenless(s.udpAddr().String())
		k.inDialog("ACK", 1, k.branch+"-ack")
	}
	if f, n := s.metrics.DialogsFull.Load(), s.dialogs.Len(); f != 1 || n != 2 {
		t.Errorf("full %d, entries %d; want 1 and 2", f, n)
	}
	eventually(t, "three ACKs routed", func() bool {
		return s.metrics.DialogRouted.Load()+s.metrics.CallIDFallback.Load() == 3
	})
	if r, fb, miss := s.metrics.DialogRouted.Load(), s.metrics.CallIDFallback.Load(), s.metrics.DialogMisses.Load(); r != 2 || fb != 1 || miss != 1 {
		t.Errorf("ACKs routed by the table %d, by hash %d, misses %d; want 2, 1, 1", r, fb, miss)
	}
}
