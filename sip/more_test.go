package sip

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// TestCallIDFallback: a client that ignores Record-Route (sipp -sn uac)
// sends ACK and BYE to the balancer with no Route; the dialog table takes
// them to the INVITE's backend. A BYE of a dialog the table never saw
// goes by the Call-ID hash and counts as a miss.
func TestCallIDFallback(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	c := newUAC(t, s.udpAddr())
	for i := 0; i < 20; i++ {
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		k.route = nil
		k.target = "sip:service@" + s.udpAddr().String() // like sipp's built-in uac
		k.inDialog("ACK", 1, k.branch+"-ack")
		k.inDialog("BYE", 2, k.branch+"-bye")
		c.recvResponse(200)
		home := b1
		if b1.count(gosip.INVITE, k.callID) == 0 {
			home = b2
		}
		if home.count(gosip.BYE, k.callID) != 1 {
			t.Fatalf("call %d: BYE not at the INVITE's backend", i)
		}
	}
	if got, fb := s.metrics.DialogRouted.Load(), s.metrics.CallIDFallback.Load(); got != 40 || fb != 0 {
		t.Errorf("routed by the dialog table %d, by Call-ID hash %d; want 40 and 0", got, fb)
	}
	k := c.newCall()
	k.toTag = "never-seen"
	k.target = "sip:service@" + s.udpAddr().String()
	k.inDialog("BYE", 2, k.branch+"-bye")
	c.recvResponse(200)
	if got, miss := s.metrics.CallIDFallback.Load(), s.metrics.DialogMisses.Load(); got != 1 || miss != 1 {
		t.Errorf("unknown dialog: by Call-ID hash %d, misses %d; want 1 and 1", got, miss)
	}
	home := s.pool.Load().home(lb.Hash(k.callID), s.clock.Now())
	if n := map[string]*uas{"b1": b1, "b2": b2}[home.id].count(gosip.BYE, k.callID); n != 1 {
		t.Errorf("unknown dialog's BYE at the hash's backend %s: %d, want 1", home.id, n)
	}
}

// TestDelayedNewWork: an ARM rule with action=delay holds INVITEs over its
// limit (answering 100 Trying) and releases them when the window moves
// on; the calls then complete.
func TestDelayedNewWork(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, []string{"name=inv,proto=sip,method=INVITE,limit=2/s,action=delay,queue=10,wait=5s"}, nil)
	c := newUAC(t, s.udpAddr())
	var ks []*call
	for i := 0; i < 4; i++ {
		k := c.newCall()
		k.invite("")
		ks = append(ks, k)
	}
	got := map[string]int{}
	for len(got) < 4 {
		m := c.recv()
		if m == nil {
			t.Fatalf("only %d of 4 calls answered", len(got))
		}
		if res, ok := m.(*gosip.Response); ok && res.StatusCode == 200 {
			got[res.CallID().Value()]++
		}
	}
	if s.metrics.Delayed.Load() != 2 || s.metrics.Refused.Load() != 0 {
		t.Errorf("delayed %d refused %d, want 2 and 0", s.metrics.Delayed.Load(), s.metrics.Refused.Load())
	}
}

// TestHealthOptions: OPTIONS pings take a silent backend down and bring it
// back; a backend answering pings with 503 drains for its Retry-After.
func TestHealthOptions(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(modeSilent)
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) {
		c.HealthInterval = 50 * time.Millisecond
		c.HealthTimeout = 40 * time.Millisecond
		c.HealthRise, c.HealthFall = 1, 2
	})
	state := func(b *backend) lb.State { return b.lb.State(s.clock.Now()) }
	eventually(t, "silent backend down", func() bool { return state(s.pool.Load().list[0]) == lb.Down })
	if state(s.pool.Load().list[1]) != lb.Up {
		t.Errorf("answering backend is %s", state(s.pool.Load().list[1]))
	}
	b1.mode.Store(modeAnswer)
	eventually(t, "backend up again", func() bool { return state(s.pool.Load().list[0]) == lb.Up })

	// A ping answered 503 drains b2.
	b2.mode.Store(mode503)
	b2.pingCode.Store(503)
	eventually(t, "503 backend draining", func() bool { return state(s.pool.Load().list[1]) == lb.Draining })
	c := newUAC(t, s.udpAddr())
	for i := 0; i < 5; i++ {
		k := c.newCall()
		k.complete()
		if b1.count(gosip.BYE, k.callID) != 1 {
			t.Fatalf("call %d not on the backend that is up", i)
		}
	}
}

// fakeMemory reports a settable used memory against a limit of 100.
type fakeMemory struct{ used atomic.Int64 }

func (f *fakeMemory) ReadMemory() (used, limit int64) { return f.used.Load(), 100 }

// TestMemoryStates: in memory state Lower new work is refused with 503
// while BYEs pass; in Critical a ringing INVITE is ended with 503 and
// CANCELed at its backend.
func TestMemoryStates(t *testing.T) {
	b1 := newUAS(t, "b1")
	fm := &fakeMemory{}
	mem, err := admission.NewMemory(admission.MemoryConfig{Limit: 100}, fm, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := testServer(t, []*uas{b1}, nil, nil, mem)
	c := newUAC(t, s.udpAddr())
	est := c.newCall()
	est.invite("")
	c.recvResponse(180)
	est.learn(c.recvResponse(200))
	est.inDialog("ACK", 1, est.branch+"-ack")

	fm.used.Store(85) // Lower
	mem.Sample()
	k := c.newCall()
	k.invite("")
	if w := c.recvResponse(503).GetHeader("warning"); w == nil || !strings.Contains(w.Value(), "memory") {
		t.Errorf("503 Warning %v, want the memory state named", w)
	}
	est.inDialog("BYE", 2, est.branch+"-bye")
	c.recvResponse(200)

	fm.used.Store(10) // Normal
	mem.Sample()
	b1.mode.Store(modeRing)
	ring := c.newCall()
	ring.invite("")
	c.recvResponse(180)
	fm.used.Store(95) // Critical: in-flight new work is terminated
	mem.Sample()
	res := c.recvResponse(503)
	if tag, _ := res.To().Params.Get("tag"); !strings.HasPrefix(tag, localTagPrefix) {
		t.Errorf("503 To-tag %q, want ours", tag)
	}
	eventually(t, "CANCEL at the backend", func() bool { return b1.count(gosip.CANCEL, ring.callID) == 1 })
	eventually(t, "the backend's 487 ACKed", func() bool { return b1.count(gosip.ACK, ring.callID) == 1 })
	if s.metrics.Aborted.Load() != 1 {
		t.Errorf("aborted %d, want 1", s.metrics.Aborted.Load())
	}
}

// TestMOPRefusal: new work goes only to a backend whose MOP admits it;
// when none does, the balancer answers 503 naming MOP.
func TestMOPRefusal(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	mops := map[string]*admission.MOP{}
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	// A second server whose backends each admit one INVITE per 10 s.
	signer, _ := lb.NewSigner(testKey)
	adm, _ := admission.NewController(admission.ControllerConfig{}, nil, admission.MonoClock{}.Now())
	cfg := s.cfg
	cfg.Listen = "127.0.0.1:0"
	s2, err := New(cfg, Deps{Admission: adm, Signer: signer, MOP: func(bc BackendConfig) *admission.MOP {
		m, err := admission.NewMOP(admission.MOPConfig{Name: bc.ID, InitialRate: 0.1, MinRate: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		mops[bc.ID] = m
		return m
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	c := newUAC(t, s2.udpAddr())
	for i := 0; i < 2; i++ {
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		c.recvResponse(200)
	}
	if b1.count(gosip.INVITE, "") != 1 || b2.count(gosip.INVITE, "") != 1 {
		t.Errorf("INVITEs per backend %d/%d, want one each (MOP moves the second)", b1.count(gosip.INVITE, ""), b2.count(gosip.INVITE, ""))
	}
	k := c.newCall()
	k.invite("")
	res := c.recvResponse(503)
	if w := res.GetHeader("warning"); w == nil || !strings.Contains(w.Value(), "mop") {
		t.Errorf("Warning %v, want mop named", w)
	}
	if res.GetHeader("retry-after") == nil {
		t.Error("no Retry-After")
	}
	if s2.metrics.RefusedBy[admission.ReasonMOP].Load() != 1 {
		t.Errorf("MOP refusals %d, want 1", s2.metrics.RefusedBy[admission.ReasonMOP].Load())
	}
}

// TestDrain: after Drain, new INVITEs get 503 while the BYE of an
// established call still passes.
func TestDrain(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	est := c.newCall()
	est.invite("")
	c.recvResponse(180)
	est.learn(c.recvResponse(200))
	est.inDialog("ACK", 1, est.branch+"-ack")
	s.Drain()
	k := c.newCall()
	k.invite("")
	if w := c.recvResponse(503).GetHeader("warning"); w == nil || !strings.Contains(w.Value(), "draining") {
		t.Errorf("Warning %v", w)
	}
	est.inDialog("BYE", 2, est.branch+"-bye")
	c.recvResponse(200)
}

// TestCancelDuringFailover: a CANCEL for an INVITE stuck at a silent
// backend ends it with 487 when the failover comes, and the INVITE never
// reaches the next backend.
func TestCancelDuringFailover(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(modeSilent)
	b2.mode.Store(modeSilent)
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")
	first := b1
	eventually(t, "the INVITE at a backend", func() bool {
		if b2.count(gosip.INVITE, k.callID) > 0 {
			first = b2
		}
		return b1.count(gosip.INVITE, k.callID)+b2.count(gosip.INVITE, k.callID) > 0
	})
	other := b1
	if first == b1 {
		other = b2
	}
	cancel := fmt.Sprintf("CANCEL sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n",
		c.lb, c.addr, k.branch, k.callID, k.callID)
	c.send(cancel)
	c.recvResponse(487)
	c.send(cancel) // the first went to the silent backend
	c.recvResponse(200)
	if n := other.count(gosip.INVITE, k.callID); n != 0 {
		t.Errorf("the canceled INVITE reached the next backend (%d)", n)
	}
}
