package sip

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// namedCall is newCall with a fixed Call-ID, so the hash policy places it
// the same way on every run.
func (c *uac) namedCall(callID string) *call {
	n := c.seq.Add(1)
	return &call{c: c, callID: callID, branch: fmt.Sprintf("z9hG4bK-%d-%d", c.addr.Port(), n), cseq: 1}
}

// establish runs INVITE/180/200/ACK and leaves the call up.
func (k *call) establish() {
	k.c.t.Helper()
	k.invite("")
	k.c.recvResponse(180)
	k.learn(k.c.recvResponse(200))
	k.inDialog("ACK", 1, k.branch+"-ack")
}

// recvRequest returns the next request the client gets, skipping
// responses.
func (c *uac) recvRequest() *gosip.Request {
	c.t.Helper()
	for {
		m := c.recv()
		if m == nil {
			c.t.Fatal("no request")
			return nil
		}
		if req, ok := m.(*gosip.Request); ok {
			return req
		}
	}
}

// mopRecorder is a SetBackends limiter hook that records the ids it was
// called for and hands out a fresh MOP for each.
type mopRecorder struct {
	mu  sync.Mutex
	ids []string
	m   map[string]*admission.MOP
}

func (r *mopRecorder) hook(t testing.TB) func(BackendConfig) *admission.MOP {
	return func(bc BackendConfig) *admission.MOP {
		m, err := admission.NewMOP(admission.MOPConfig{Name: bc.ID, InitialRate: 1000})
		if err != nil {
			t.Error(err)
			return nil
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.ids = append(r.ids, bc.ID)
		if r.m == nil {
			r.m = map[string]*admission.MOP{}
		}
		r.m[bc.ID] = m
		return m
	}
}

func (r *mopRecorder) called() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids)
}

// TestSetBackendsKeepsDialogs: calls established on A and B; a reload to
// {A reweighted, C} removes B. The BYE of the call on A still reaches A,
// the BYE of a call on B still reaches B (its last address), and a request
// B sends for one of its calls still reaches the client. New INVITEs go to
// A or C, never B, and C gets OPTIONS pings. A second reload adds B back
// and B takes new work again.
func TestSetBackendsKeepsDialogs(t *testing.T) {
	a, b, c3 := newUAS(t, "a"), newUAS(t, "b"), newUAS(t, "c")
	s := testServer(t, []*uas{a, b}, nil, func(c *Config) {
		// Pings on, but never enough missed ones to take a backend down
		// on a slow machine: placement below must not depend on health.
		c.HealthInterval = 100 * time.Millisecond
		c.HealthTimeout = 90 * time.Millisecond
		c.HealthRise, c.HealthFall = 1, 1000
	})
	c := newUAC(t, s.udpAddr())
	on := func(u *uas, k *call) bool { return u.count(gosip.INVITE, k.callID) > 0 }

	var onA, onB, onB2, last *call
	for i := 0; i < 100 && (onA == nil || onB == nil || onB2 == nil); i++ {
		k := c.namedCall(fmt.Sprintf("before-%d@reload", i))
		k.establish()
		last = k
		switch {
		case on(a, k) && onA == nil:
			onA = k
		case on(b, k) && onB == nil:
			onB = k
		case on(b, k) && onB2 == nil:
			onB2 = k
		}
	}
	if onA == nil || onB == nil || onB2 == nil {
		t.Fatal("no calls on both backends")
	}
	// The client's messages are handled in order: once the last ACK is at
	// its backend, every message sent so far went through the old set.
	eventually(t, "the last ACK", func() bool { return a.count(gosip.ACK, last.callID)+b.count(gosip.ACK, last.callID) == 1 })
	var hook mopRecorder
	err := s.SetBackends([]BackendConfig{
		{ID: "b1", Addr: a.addr.String(), Weight: 3},
		{ID: "b3", Addr: c3.addr.String()},
	}, hook.hook(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := hook.called(); !slices.Equal(got, []string{"b3"}) {
		t.Errorf("limiter hook called for %v, want only the new b3", got)
	}
	st := s.Backends()
	if len(st) != 2 || st[0].ID != "b1" || st[0].Weight != 3 || st[1].ID != "b3" {
		t.Fatalf("backends after reload: %+v", st)
	}

	// The call on A ends on A.
	onA.inDialog("BYE", 2, onA.branch+"-bye")
	c.recvResponse(200)
	if a.count(gosip.BYE, onA.callID) != 1 || b.count(gosip.BYE, onA.callID)+c3.count(gosip.BYE, onA.callID) != 0 {
		t.Errorf("BYE of the call on A: A %d, B %d, C %d; want only A", a.count(gosip.BYE, onA.callID),
			b.count(gosip.BYE, onA.callID), c3.count(gosip.BYE, onA.callID))
	}
	// The call on the removed B ends on B.
	onB.inDialog("BYE", 2, onB.branch+"-bye")
	c.recvResponse(200)
	if b.count(gosip.BYE, onB.callID) != 1 || c3.count(gosip.BYE, onB.callID) != 0 {
		t.Errorf("BYE of the call on removed B: B %d, C %d; want B", b.count(gosip.BYE, onB.callID), c3.count(gosip.BYE, onB.callID))
	}
	if n := s.metrics.AffinityGone.Load(); n != 1 {
		t.Errorf("affinity to removed backends %d, want 1", n)
	}
	// B hangs up its other call: the BYE reaches the client.
	inv := b.find(gosip.INVITE, onB2.callID)[0].Req
	rr := inv.GetHeader("Record-Route")
	if rr == nil {
		t.Fatal("INVITE at B has no Record-Route")
	}
	bye := fmt.Sprintf("BYE sip:alice@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-b-bye;rport\r\nMax-Forwards: 70\r\nRoute: %s\r\nFrom: <sip:service@test>;tag=uas-b\r\nTo: <sip:alice@test>;tag=a%s\r\nCall-ID: %s\r\nCSeq: 7 BYE\r\nContent-Length: 0\r\n\r\n",
		c.addr, b.addr, rr.Value(), onB2.callID, onB2.callID)
	if _, err := b.conn.WriteToUDPAddrPort([]byte(bye), s.udpAddr()); err != nil {
		t.Fatal(err)
	}
	if req := c.recvRequest(); req.Method != gosip.BYE || req.CallID().Value() != onB2.callID {
		t.Errorf("client got %s for %s, want B's BYE for %s", req.Method, req.CallID().Value(), onB2.callID)
	}

	// New work: A or C, never B.
	var newCalls []*call
	for i := 0; i < 40; i++ {
		k := c.namedCall(fmt.Sprintf("after-%d@reload", i))
		k.complete()
		newCalls = append(newCalls, k)
	}
	var nA, nC int
	for _, k := range newCalls {
		if on(b, k) {
			t.Errorf("new call %s went to removed B", k.callID)
		}
		if on(a, k) {
			nA++
		}
		if on(c3, k) {
			nC++
		}
	}
	if nA == 0 || nC == 0 || nA+nC != len(newCalls) {
		t.Errorf("new calls: A %d, C %d of %d; want both used", nA, nC, len(newCalls))
	}
	eventually(t, "pings to the new backend", func() bool { return c3.count(gosip.OPTIONS, "") > 0 })

	// B comes back.
	err = s.SetBackends([]BackendConfig{
		{ID: "b1", Addr: a.addr.String(), Weight: 3},
		{ID: "b2", Addr: b.addr.String()},
		{ID: "b3", Addr: c3.addr.String()},
	}, hook.hook(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := hook.called(); !slices.Equal(got, []string{"b3", "b2"}) {
		t.Errorf("limiter hook called for %v, want b3 then b2", got)
	}
	if p := s.pool.Load(); p.goneByID["b2"] != nil || p.goneByAddr[b.addr] != nil {
		t.Error("b2 is back but still counted as removed")
	}
	nB := 0
	for i := 0; i < 60 && nB == 0; i++ {
		k := c.namedCall(fmt.Sprintf("back-%d@reload", i))
		k.complete()
		if on(b, k) {
			nB++
		}
	}
	if nB == 0 {
		t.Error("B takes no new work after it was added back")
	}
	eventually(t, "transactions to end", func() bool { return s.txns.Len() == 0 })
}

// TestSetBackendsInvalid: a list that fails any check returns an error,
// calls no limiter hook and leaves the running set as it was; the same
// list again changes nothing.
func TestSetBackendsInvalid(t *testing.T) {
	a, b := newUAS(t, "a"), newUAS(t, "b")
	s := testServer(t, []*uas{a, b}, nil, nil)
	before := s.pool.Load()
	A, B := a.addr.String(), b.addr.String()
	bad := map[string][]BackendConfig{
		"empty":               nil,
		"duplicate id":        {{ID: "x", Addr: A}, {ID: "x", Addr: B}},
		"duplicate address":   {{Addr: A}, {Addr: A}}, // the id defaults to the address
		"no port":             {{ID: "b1", Addr: A}, {ID: "c", Addr: "127.0.0.1"}},
		"port out of range":   {{ID: "b1", Addr: A}, {ID: "c", Addr: "127.0.0.1:99999"}},
		"no address":          {{ID: "b1", Addr: A}, {ID: "c"}},
		"bad transport":       {{ID: "b1", Addr: A, Transport: "sctp"}},
		"weight out of range": {{ID: "b1", Addr: A, Weight: lb.MaxWeight + 1}},
		"negative weight":     {{ID: "b1", Addr: A, Weight: -1}},
		"space in id":         {{ID: "b 1", Addr: A}},
		"id too long":         {{ID: strings.Repeat("x", 300), Addr: A}},
	}
	var hook mopRecorder
	for name, list := range bad {
		if err := s.SetBackends(list, hook.hook(t)); err == nil {
			t.Errorf("%s: no error", name)
		}
		if s.pool.Load() != before {
			t.Errorf("%s: the backend set changed", name)
		}
	}
	if got := hook.called(); len(got) != 0 {
		t.Errorf("limiter hook called for %v by rejected lists", got)
	}
	if err := s.SetBackends(nil, nil); !errors.Is(err, ErrNoBackends) {
		t.Errorf("empty list: %v, want ErrNoBackends", err)
	}
	// The same list is no change at all.
	if err := s.SetBackends(s.cfg.Backends, hook.hook(t)); err != nil || s.pool.Load() != before || len(hook.called()) != 0 {
		t.Errorf("same list: err %v, replaced %v, hook %v", err, s.pool.Load() != before, hook.called())
	}
	c := newUAC(t, s.udpAddr())
	for i := 0; i < 4; i++ {
		c.newCall().complete()
	}
	if a.count(gosip.INVITE, "")+b.count(gosip.INVITE, "") != 4 {
		t.Errorf("calls after rejected reloads: A %d, B %d", a.count(gosip.INVITE, ""), b.count(gosip.INVITE, ""))
	}
	s.Close()
	if err := s.SetBackends([]BackendConfig{{Addr: A}}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// TestSetBackendsCarriesState: a backend that stays keeps its MOP limiter,
// its health verdict and a 503's no-new-work period, also when
// reweighted; an id at a new address and a new id get a limiter from the
// hook and start up; the old address of a moved id is still known as a
// backend's.
func TestSetBackendsCarriesState(t *testing.T) {
	signer, _ := lb.NewSigner(testKey)
	adm, _ := admission.NewController(admission.ControllerConfig{}, nil, admission.MonoClock{}.Now())
	var first mopRecorder
	cfg := Config{Listen: "127.0.0.1:0", Backends: []BackendConfig{
		{ID: "b1", Addr: "127.0.0.1:5091"},
		{ID: "b2", Addr: "127.0.0.1:5092", MetricsURL: "http://127.0.0.1:9092/metrics"},
		{ID: "b4", Addr: "127.0.0.1:5094"},
		{ID: "b5", Addr: "127.0.0.1:5095"},
	}}
	s, err := New(cfg, Deps{Admission: adm, Signer: signer, MOP: first.hook(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := s.clock.Now()
	old := s.pool.Load()
	old.byID["b1"].lb.BackOff(now, time.Hour)
	// With pings off, a probe verdict has nobody to revise it: it is not
	// carried over (it would hold for good).
	old.byID["b2"].lb.SetProbeDown(true)

	var hook mopRecorder
	err = s.SetBackends([]BackendConfig{
		{ID: "b1", Addr: "127.0.0.1:5091", Weight: 5}, // reweighted
		{ID: "b2", Addr: "127.0.0.1:5092", MetricsURL: "http://127.0.0.1:9092/metrics"},
		{ID: "b4", Addr: "127.0.0.1:5084"}, // moved
		{ID: "b3", Addr: "127.0.0.1:5093"}, // new; b5 removed
	}, hook.hook(t))
	if err != nil {
		t.Fatal(err)
	}
	p := s.pool.Load()
	if got := hook.called(); !slices.Equal(got, []string{"b4", "b3"}) {
		t.Errorf("limiter hook called for %v, want b4 and b3", got)
	}
	for _, id := range []string{"b1", "b2"} {
		if p.byID[id].lb.MOP() != first.m[id] {
			t.Errorf("%s lost its MOP limiter", id)
		}
	}
	for _, id := range []string{"b4", "b3"} {
		if p.byID[id].lb.MOP() != hook.m[id] {
			t.Errorf("%s: not the hook's MOP limiter", id)
		}
	}
	state := func(id string) lb.State { return p.byID[id].lb.State(now) }
	if state("b1") != lb.Draining || p.byID["b1"].lb.Weight() != 5 {
		t.Errorf("b1: %s weight %d, want draining (503 period kept) with weight 5", state("b1"), p.byID["b1"].lb.Weight())
	}
	if state("b2") != lb.Up {
		t.Errorf("b2: %s, want up (a probe verdict is not kept with pings off)", state("b2"))
	}
	if state("b4") != lb.Up || state("b3") != lb.Up {
		t.Errorf("b4 %s, b3 %s: want up", state("b4"), state("b3"))
	}
	if s.Pool() != p.homePool || s.Generation() != p.gen || s.Pool().Lookup("b5") != nil || s.Pool().Lookup("b3") == nil {
		t.Error("Pool() is not the new set")
	}
	if b, removed := p.dialogBackend("b5"); b == nil || !removed || b.addr.String() != "127.0.0.1:5095" {
		t.Errorf("removed b5: %v %v, want its last address", b, removed)
	}
	if b, removed := p.dialogBackend("b4"); b == nil || removed || b.addr.String() != "127.0.0.1:5084" {
		t.Errorf("moved b4: %v %v, want its new address", b, removed)
	}
	if b := p.backendAt(old.byID["b4"].addr); b == nil {
		t.Error("the old address of b4 is no longer known as a backend's")
	}
	// A 503 to new work sent to the old b1 before the reload drains the
	// current b1 too.
	p.byID["b1"].lb.ClearBusy()
	s.drainBackend(old.byID["b1"].lb, now, time.Hour, "answered 503")
	if state("b1") != lb.Draining {
		t.Errorf("b1 after a 503 on its old instance: %s, want draining", state("b1"))
	}
	// Removed backends are forgotten after a token lifetime.
	later := &backendSet{list: p.list, byID: p.byID, byAddr: p.byAddr}
	later.retire(p, time.Now().Add(s.cfg.TokenTTL+time.Minute), s.cfg.TokenTTL)
	if later.goneByID["b5"] != nil || len(later.gone) != 0 {
		t.Error("b5 still known after a token lifetime")
	}
}

// TestSetBackendsInFlight: new work already sent keeps working across a
// reload. An INVITE waiting on a silent A fails over after the reload to
// C, never back to A, though A's place in the list changed; a ringing
// INVITE on B, which the reload removes, is CANCELed at B and its 487
// ACKed there.
func TestSetBackendsInFlight(t *testing.T) {
	a, b, c3 := newUAS(t, "a"), newUAS(t, "b"), newUAS(t, "c")
	a.mode.Store(modeSilent)
	b.mode.Store(modeRing)
	s := testServer(t, []*uas{a}, nil, func(c *Config) {
		c.FailoverTimeout = time.Hour // the test moves time itself
	})
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")
	eventually(t, "INVITE at A", func() bool { return a.count(gosip.INVITE, k.callID) > 0 })
	err := s.SetBackends([]BackendConfig{{ID: "b3", Addr: c3.addr.String()}, {ID: "b1", Addr: a.addr.String()}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.txnTimers(s.clock.Now() + int64(2*time.Hour)) // A's silence runs out
	c.recvResponse(180)
	c.recvResponse(200)
	if c3.count(gosip.INVITE, k.callID) != 1 {
		t.Errorf("C got %d INVITEs, want the failover", c3.count(gosip.INVITE, k.callID))
	}
	for _, r := range a.find(gosip.INVITE, k.callID) {
		if r.Branch != a.find(gosip.INVITE, k.callID)[0].Branch {
			t.Error("the failover went back to A")
		}
	}
	if s.metrics.Failovers.Load() != 1 {
		t.Errorf("failovers %d, want 1", s.metrics.Failovers.Load())
	}

	// A ringing INVITE on B; B is removed; the CANCEL still reaches B.
	if err := s.SetBackends([]BackendConfig{{ID: "b2", Addr: b.addr.String()}}, nil); err != nil {
		t.Fatal(err)
	}
	r := c.newCall()
	r.invite("")
	c.recvResponse(180)
	if err := s.SetBackends([]BackendConfig{{ID: "b3", Addr: c3.addr.String()}}, nil); err != nil {
		t.Fatal(err)
	}
	c.send(fmt.Sprintf("CANCEL sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n",
		c.lb, c.addr, r.branch, r.callID, r.callID))
	codes := map[int]bool{}
	var r487 *gosip.Response
	for len(codes) < 2 {
		m := c.recv()
		if m == nil {
			t.Fatalf("missing answers to the CANCEL, got %v", codes)
		}
		if res, ok := m.(*gosip.Response); ok && res.StatusCode >= 200 && res.CallID().Value() == r.callID {
			codes[res.StatusCode] = true
			if res.StatusCode == 487 {
				r487 = res
			}
		}
	}
	if !codes[200] || !codes[487] {
		t.Errorf("got %v, want 200 and 487", codes)
	}
	if b.count(gosip.CANCEL, r.callID) != 1 || c3.count(gosip.CANCEL, r.callID) != 0 {
		t.Errorf("CANCEL at B %d, at C %d; want B", b.count(gosip.CANCEL, r.callID), c3.count(gosip.CANCEL, r.callID))
	}
	tag, _ := r487.To().Params.Get("tag")
	c.send(fmt.Sprintf("ACK sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>;tag=%s\r\nCall-ID: %s\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n",
		c.lb, c.addr, r.branch, r.callID, tag, r.callID))
	eventually(t, "the 487's ACK at B", func() bool { return b.count(gosip.ACK, r.callID) == 1 })
	eventually(t, "transactions to end", func() bool { return s.txns.Len() == 0 })
}

// TestSetBackendsUnderLoad: calls run while the set flips between {A, B}
// and {A, C} with changing weights, and pings run; every call completes,
// its BYE reaching its INVITE's backend, removed or not, and no
// transaction is left. Run with -race, it checks that swapping the set
// under traffic is free of data races.
func TestSetBackendsUnderLoad(t *testing.T) {
	a, b, c3 := newUAS(t, "a"), newUAS(t, "b"), newUAS(t, "c")
	s := testServer(t, []*uas{a, b}, nil, func(c *Config) {
		c.HealthInterval = 20 * time.Millisecond
		c.HealthTimeout = 15 * time.Millisecond
		c.HealthRise, c.HealthFall = 1, 1000
	})
	const workers, calls = 2, 40
	var wg sync.WaitGroup
	done := make(chan struct{})
	var ids sync.Map // Call-ID -> true
	for w := 0; w < workers; w++ {
		c := newUAC(t, s.udpAddr())
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < calls; i++ {
				k := c.newCall()
				k.complete()
				ids.Store(k.callID, true)
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	sets := [][]BackendConfig{
		{{ID: "b1", Addr: a.addr.String()}, {ID: "b3", Addr: c3.addr.String(), Weight: 2}},
		{{ID: "b1", Addr: a.addr.String(), Weight: 2}, {ID: "b2", Addr: b.addr.String()}},
	}
	reloads := 0
	for i := 0; ; i++ {
		select {
		case <-done:
		default:
			if err := s.SetBackends(sets[i%2], nil); err != nil {
				t.Fatal(err)
			}
			reloads++
			time.Sleep(time.Millisecond)
			continue
		}
		break
	}
	n := 0
	ids.Range(func(k, _ any) bool {
		id := k.(string)
		n++
		inv := a.count(gosip.INVITE, id) + b.count(gosip.INVITE, id) + c3.count(gosip.INVITE, id)
		bye := a.count(gosip.BYE, id) + b.count(gosip.BYE, id) + c3.count(gosip.BYE, id)
		if inv != 1 || bye != 1 {
			t.Errorf("call %s: %d INVITEs and %d BYEs at the backends, want one each", id, inv, bye)
		}
		for _, u := range []*uas{a, b, c3} {
			if u.count(gosip.INVITE, id) == 1 && u.count(gosip.BYE, id) != 1 {
				t.Errorf("call %s: BYE not at its INVITE's backend %s", id, u.name)
			}
		}
		return true
	})
	if n != workers*calls {
		t.Errorf("%d calls completed, want %d", n, workers*calls)
	}
	t.Logf("%d reloads during %d calls", reloads, n)
	eventually(t, "transactions to end", func() bool { return s.txns.Len() == 0 })
}
