package sip

import (
	"fmt"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/lb"
)

// Answerers that ignore OPTIONS (SIPp scenarios do) were taken down by
// the pings while they answered every INVITE and BYE, and the BYEs of
// calls under way got our 480 "backend down". In-dialog requests now go
// to their backend whatever the pings say; new calls keep going too (the
// backends answer them, and with every backend down by pings alone the
// pool panics). Calls cross the moment the pings mark the backends down.
func TestInDialogNotRefusedByProbes(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.noPings.Store(true)
	b2.noPings.Store(true)
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) {
		c.HealthInterval = 50 * time.Millisecond
		c.HealthTimeout = 20 * time.Millisecond // rise and fall: the defaults
	})
	c := newUAC(t, s.udpAddr())
	up := func(n int, tokenless bool) []*call {
		var out []*call
		for range n {
			k := c.newCall()
			k.invite("")
			c.recvResponse(180)
			k.learn(c.recvResponse(200))
			if tokenless {
				k.route = nil // a UA that ignores Record-Route: the dialog table routes it
			}
			k.inDialog("ACK", 1, k.branch+"-ack")
			out = append(out, k)
		}
		return out
	}
	calls := append(up(10, false), up(10, true)...)
	probedDown := func() bool {
		for _, b := range s.pool.Load().list {
			if _, down := b.lb.ProbeDownSince(); !down {
				return false
			}
		}
		return true
	}
	eventually(t, "both backends down by their OPTIONS pings", probedDown)
	calls = append(calls, up(5, false)...)
	calls = append(calls, up(5, true)...)
	failed := 0
	for _, k := range calls {
		k.inDialog("BYE", 2, k.branch+"-bye")
		if got := c.finalCode(); got != 200 {
			failed++
			t.Errorf("BYE of %s: %d, want the backend's 200", k.callID, got)
		}
	}
	if failed != 0 || s.metrics.InDialogBackendDown.Load() != 0 {
		t.Errorf("%d of %d calls failed, %d BYEs answered 480 by us", failed, len(calls), s.metrics.InDialogBackendDown.Load())
	}
	if b1.count(gosip.BYE, "")+b2.count(gosip.BYE, "") != len(calls) {
		t.Errorf("backends got %d BYEs, want %d", b1.count(gosip.BYE, "")+b2.count(gosip.BYE, ""), len(calls))
	}
	if !probedDown() {
		t.Error("the pings no longer say down: the test proves nothing")
	}
}

// A backend added by SetBackends (the SIGHUP reload) was Up at once and
// took new work before anything had shown it serving. It is now Unknown
// until its first OPTIONS is answered: no new work before, and none while
// it ignores them; once it answers, it takes its share.
func TestReloadedBackendUnknownUntilProbed(t *testing.T) {
	for _, answers := range []bool{false, true} {
		t.Run(map[bool]string{false: "ignores OPTIONS", true: "answers OPTIONS"}[answers], func(t *testing.T) {
			b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
			b2.noPings.Store(!answers)
			s := testServer(t, []*uas{b1}, nil, func(c *Config) {
				c.Policy = "round-robin"
				c.HealthInterval = time.Hour // one ping at the reload, then none in the test's time
				c.HealthTimeout = 200 * time.Millisecond
			})
			if err := s.SetBackends([]BackendConfig{
				{ID: "b1", Addr: b1.addr.String()},
				{ID: "b2", Addr: b2.addr.String()},
			}, nil); err != nil {
				t.Fatal(err)
			}
			nb := s.pool.Load().byID["b2"].lb
			if answers {
				eventually(t, "b2 up after its first answered OPTIONS", func() bool { return nb.State(s.clock.Now()) == lb.Up })
			}
			c := newUAC(t, s.udpAddr())
			for range 10 {
				c.newCall().complete()
			}
			got := b2.count(gosip.INVITE, "")
			if answers && got != 5 || !answers && got != 0 {
				t.Errorf("new backend got %d of 10 new calls (state %v), want %d", got, nb.State(s.clock.Now()), map[bool]int{false: 0, true: 5}[answers])
			}
		})
	}
}

// A client cannot have a live backend taken out by sending it in-dialog
// requests it does not answer: the backend answered other traffic since,
// so they are not evidence of death.
func TestIgnoredRequestsDoNotTakeOutLiveBackend(t *testing.T) {
	b1 := newUAS(t, "b1")
	b1.noINFO.Store(true)
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.InDialogTimeout = 200 * time.Millisecond })
	c := newUAC(t, s.udpAddr())
	victim := establish(t, c, b1, 1)[0]
	junk := newUAC(t, s.udpAddr())
	attacker := establish(t, junk, b1, 1)[0]
	for i := range 5 {
		attacker.inDialog("INFO", 2+i, fmt.Sprintf("%s-junk-%d", attacker.branch, i))
	}
	c.newCall().complete() // the backend answers other traffic meanwhile
	for range 5 {
		if got := junk.finalCode(); got != 408 {
			t.Fatalf("ignored INFO: %d, want our 408", got)
		}
	}
	victim.inDialog("BYE", 2, victim.branch+"-bye")
	if got := c.finalCode(); got != 200 {
		t.Errorf("BYE of another call after the junk: %d, want the backend's 200 (backend down %d)", got, s.metrics.InDialogBackendDown.Load())
	}
	if st := s.pool.Load().list[0].lb.State(s.clock.Now()); st != lb.Up {
		t.Errorf("backend %v after a client's ignored requests, want up", st)
	}
}

// A TCP backend that is gone (its connection refused) is proof from the
// traffic itself: after the refused dial, the calls' in-dialog requests get
// 480 at once instead of our 408 after -sip-in-dialog-timeout each.
func TestTCPBackendRefusedIsOut(t *testing.T) {
	be := newTCPUAS(t)
	s := testServer(t, nil, nil, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "tcp1", Addr: be.addr, Transport: "tcp", Weight: 1}}
		c.InDialogTimeout = 300 * time.Millisecond
	})
	eventually(t, "connection to the backend", func() bool { return s.tcp.len() == 1 })
	c := newUAC(t, s.udpAddr())
	calls := make([]*call, 2)
	for i := range calls {
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		k.inDialog("ACK", 1, k.branch+"-ack")
		calls[i] = k
	}
	be.ln.Close() // the backend is gone: nothing listens any more
	<-be.done
	eventually(t, "our side to notice", func() bool { return s.tcp.len() == 0 })
	// Queued for a dial that is refused: our 408 later, or 480 at once if
	// a dial was refused already.
	calls[0].inDialog("BYE", 2, calls[0].branch+"-bye")
	if got := c.finalCode(); got != 408 && got != 480 {
		t.Fatalf("first BYE to the gone backend: %d, want our 408 or 480", got)
	}
	calls[1].inDialog("BYE", 2, calls[1].branch+"-bye")
	if got := c.finalCode(); got != 480 {
		t.Errorf("BYE after the refused connection: %d, want 480 at once", got)
	}
}
