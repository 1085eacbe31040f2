package sip

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// sipGen builds a SIP generation for s: backends and routes as an
// operator writes them (lb.ParseBackendSpec, lb.ParseRouteSpec), the
// generation in force as Prev, s's policy and, when s pings, its OPTIONS
// prober. It is stopped when the test ends.
func sipGen(t testing.TB, s *Server, backends, routes []string) *lb.Generation {
	t.Helper()
	gc := lb.GenConfig{Proto: "sip", Policy: s.cfg.Policy, Prev: s.Generation(), Clock: s.clock}
	for _, b := range backends {
		spec, err := lb.ParseBackendSpec("sip", b)
		if err != nil {
			t.Fatal(err)
		}
		gc.Backends = append(gc.Backends, spec)
	}
	for _, r := range routes {
		spec, err := lb.ParseRouteSpec("sip", r)
		if err != nil {
			t.Fatal(err)
		}
		gc.Routes = append(gc.Routes, spec)
	}
	if s.cfg.HealthInterval > 0 {
		gc.Health = lb.HealthConfig{Interval: s.cfg.HealthInterval, Timeout: s.cfg.HealthTimeout, Rise: s.cfg.HealthRise, Fall: s.cfg.HealthFall}
		gc.Prober = s.Prober
	}
	g, err := lb.NewGeneration(gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	return g
}

// setGen builds a generation of backends and routes (sipGen) and puts
// it in force, as a node's reload does: started, then handed in, then
// the one before stopped.
func setGen(t testing.TB, s *Server, backends, routes []string) *lb.Generation {
	t.Helper()
	old := s.Generation()
	g := sipGen(t, s, backends, routes)
	if s.listening.Load() {
		g.Start(context.Background())
	}
	if err := s.SetGeneration(g); err != nil {
		t.Fatal(err)
	}
	if old != nil {
		old.Stop()
	}
	return g
}

// poolServer starts a server the way a node does: New without backends,
// a generation of backends and routes handed in, Start, then the
// generation's checks. rules are ARM rules.
func poolServer(t testing.TB, backends, routes, rules []string, mut func(*Config)) *Server {
	t.Helper()
	signer, err := lb.NewSigner(testKey)
	if err != nil {
		t.Fatal(err)
	}
	var rcs []admission.RuleConfig
	for _, r := range rules {
		rc, err := admission.ParseRule(r)
		if err != nil {
			t.Fatal(err)
		}
		rcs = append(rcs, rc)
	}
	adm, err := admission.NewController(admission.ControllerConfig{Rules: rcs}, nil, admission.MonoClock{}.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", FailoverTimeout: 300 * time.Millisecond}
	if mut != nil {
		mut(&cfg)
	}
	s, err := New(cfg, Deps{Admission: adm, Signer: signer}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	g := setGen(t, s, backends, routes)
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	g.Start(ctx)
	adc, adcCancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { adm.Run(adc, admission.MonoClock{}, 10*time.Millisecond); close(done) }()
	t.Cleanup(func() {
		adcCancel()
		<-done
		cancel()
		s.Close()
	})
	return s
}

// inviteTo sends the INVITE of k to the Request-URI ruri (a user and
// host of the test's choosing) with From host from.
func (k *call) inviteTo(ruri, from string) {
	body := "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"
	k.c.send(fmt.Sprintf("INVITE %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nRoute: <sip:%s;lr>\r\nFrom: <sip:alice@%s>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: %d INVITE\r\nContact: <sip:alice@%s>\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
		ruri, k.c.addr, k.branch, k.c.lb, from, k.callID, k.callID, k.cseq, k.c.addr, len(body), body))
}

// request sends an out-of-dialog request of method to ruri on k's
// Call-ID (REGISTER, MESSAGE, OPTIONS).
func (k *call) request(method, ruri string) {
	k.c.send(fmt.Sprintf("%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nRoute: <sip:%s;lr>\r\nFrom: <sip:alice@a.example>;tag=a%s\r\nTo: <sip:alice@a.example>\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContact: <sip:alice@%s>\r\nContent-Length: 0\r\n\r\n",
		method, ruri, k.c.addr, k.branch, k.c.lb, k.callID, k.callID, k.cseq, method, k.c.addr))
}

// warning returns the text of a response's Warning, "" without one.
func warning(res *gosip.Response) string {
	if h := res.GetHeader("warning"); h != nil {
		return h.Value()
	}
	return ""
}

// TestNoRouteNoDefaultPool: new work no route matches, in a generation
// without the pool default, is answered 404 (or -sip-no-route-code),
// counted, and never reaches a backend; a route that matches still works.
func TestNoRouteNoDefaultPool(t *testing.T) {
	for _, code := range []int{0, 480} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			ldn := newUAS(t, "ldn")
			s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london"},
				[]string{"pool=london,user=+4420"}, nil, func(c *Config) { c.NoRouteCode = code })
			c := newUAC(t, s.udpAddr())
			k := c.newCall()
			k.inviteTo("sip:+331234@voice.example", "a.example")
			want, phrase := 404, "Not Found"
			if code != 0 {
				want, phrase = code, "Temporarily Unavailable"
			}
			res := c.recvResponse(want)
			if res.Reason != phrase || !strings.Contains(warning(res), `"no route"`) {
				t.Errorf("%d %s, Warning %q; want %d %s and a Warning saying no route", res.StatusCode, res.Reason, warning(res), want, phrase)
			}
			k = c.newCall()
			k.request("MESSAGE", "sip:bob@voice.example")
			c.recvResponse(want)
			if n := s.metrics.NoRoute.Load(); n != 2 {
				t.Errorf("no_route = %d, want 2", n)
			}
			if n := ldn.count(gosip.INVITE, "") + ldn.count(gosip.MESSAGE, ""); n != 0 {
				t.Errorf("the backend got %d requests no route matched", n)
			}
			k = c.newCall()
			k.inviteTo("sip:+442079460000@voice.example", "a.example")
			c.awaitResponse(gosip.INVITE, 200, 200)
			if n := ldn.count(gosip.INVITE, k.callID); n != 1 {
				t.Errorf("the routed INVITE reached london %d times, want 1", n)
			}
		})
	}
}

func TestNoRouteCodeValidated(t *testing.T) {
	for _, code := range []int{399, 700, -1} {
		c := DefaultConfig()
		c.NoRouteCode = code
		err := c.Validate()
		var fe *FieldError
		if err == nil || !errors.As(err, &fe) || fe.Field != "NoRouteCode" || !strings.Contains(err.Error(), fmt.Sprint(code)) {
			t.Errorf("NoRouteCode %d: %v, want a NoRouteCode error naming the value", code, err)
		}
	}
	c := DefaultConfig()
	c.NoRouteCode = 604
	if err := c.Validate(); err != nil {
		t.Errorf("NoRouteCode 604: %v", err)
	}
}

// TestARMPoolBudget: an ARM rule with pool= is one pool's budget: past it
// the pool's INVITEs are refused with a Warning naming the rule and the
// pool, while the same method routed to another pool is untouched.
func TestARMPoolBudget(t *testing.T) {
	ldn, def := newUAS(t, "ldn"), newUAS(t, "def")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london", def.addr.String() + ",id=def"},
		[]string{"pool=london,user=+4420"},
		[]string{"name=ldn-invites,proto=sip,method=INVITE,pool=london,limit=3/min,action=reject"}, nil)
	c := newUAC(t, s.udpAddr())
	var refused []string
	admitted := 0
	for range 5 {
		k := c.newCall()
		k.inviteTo("sip:+442079460000@voice.example", "a.example")
		for {
			res := c.recv().(*gosip.Response)
			if res.StatusCode == 200 {
				admitted++
				break
			}
			if res.StatusCode == 503 {
				refused = append(refused, warning(res))
				break
			}
		}
	}
	if admitted != 3 || len(refused) != 2 {
		t.Fatalf("london: %d admitted, %d refused; want 3 and 2", admitted, len(refused))
	}
	for _, w := range refused {
		if !strings.Contains(w, `"overload: arm rule ldn-invites pool london"`) {
			t.Errorf("refusal Warning %q, want it to name the rule and the pool", w)
		}
	}
	for range 5 {
		k := c.newCall()
		k.inviteTo("sip:+331234@voice.example", "a.example")
		c.awaitResponse(gosip.INVITE, 200, 200)
	}
	if n := def.count(gosip.INVITE, ""); n != 5 {
		t.Errorf("default pool got %d INVITEs, want 5 (the london budget is not its)", n)
	}
	if n := ldn.count(gosip.INVITE, ""); n != 3 {
		t.Errorf("london got %d INVITEs, want 3", n)
	}
	st := s.pool.Load().stats
	if n := st["london"].refused[admission.ReasonARM].Load(); n != 2 {
		t.Errorf("london refused by arm: %d, want 2", n)
	}
	if n := st["default"].refused[admission.ReasonARM].Load(); n != 0 {
		t.Errorf("default refused by arm: %d, want 0", n)
	}
}

// TestOperatorDisableKeptWithoutPings: the carry-over of a reload with
// SIP pings off. A backend the operator disabled stays disabled across a
// reload (SetBackends and SetGeneration alike), and once the operator
// enables it again it takes new work: a probe verdict from before, which
// no checker would ever revise, does not hold it down. (The SIP front
// end's own carry-over lost the disable and kept the verdict for good.)
func TestOperatorDisableKeptWithoutPings(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	now := s.clock.Now()
	old := s.pool.Load().byID["b1"].lb
	old.Disable(true)
	old.SetProbeDown(true)
	reloads := []func(){
		func() {
			if err := s.SetBackends([]BackendConfig{{ID: "b1", Addr: b1.addr.String()}, {ID: "b2", Addr: b2.addr.String(), Weight: 2}}, nil); err != nil {
				t.Fatal(err)
			}
		},
		func() {
			setGen(t, s, []string{b1.addr.String() + ",id=b1", b2.addr.String() + ",id=b2"}, nil)
		},
	}
	for i, reload := range reloads {
		reload()
		b := s.pool.Load().byID["b1"].lb
		if b == old {
			t.Fatalf("reload %d kept the lb.Backend", i)
		}
		if !b.Disabled() || b.State(now) != lb.Down {
			t.Errorf("reload %d: b1 disabled %v, %s; want still disabled by the operator", i, b.Disabled(), b.State(now))
		}
		old = b
	}
	old.Disable(false)
	if st := old.State(now); st != lb.Up {
		t.Errorf("b1 enabled again: %s (%s), want up: no probe verdict may hold it with pings off", st, old.Reason(now))
	}
	// And it takes new work again: calls go by a hash of their Call-ID,
	// b1 has a third of the weight, so 6 calls all missed it one time in
	// eleven; 40 miss it one time in 10^7.
	c := newUAC(t, s.udpAddr())
	for range 40 {
		c.newCall().complete()
	}
	if b1.count(gosip.INVITE, "") == 0 {
		t.Error("b1 got no new work once enabled")
	}
}

// TestDialogKeepsPoolAcrossRoutes: a dialog stays on its backend, and in
// its pool, when the routes change under it; new work follows the new
// routes. Requests with our Route go by their token, token-less ones by
// the dialog table; a token issued before pools (version 2) still routes.
func TestDialogKeepsPoolAcrossRoutes(t *testing.T) {
	ldn, def := newUAS(t, "ldn"), newUAS(t, "def")
	backends := []string{ldn.addr.String() + ",id=ldn,pool=london", def.addr.String() + ",id=def"}
	s := poolServer(t, backends, []string{"pool=london,user=+4420"}, nil, nil)
	c := newUAC(t, s.udpAddr())
	withToken, tokenless := c.newCall(), c.newCall()
	for _, k := range []*call{withToken, tokenless} {
		k.inviteTo("sip:+442079460000@voice.example", "a.example")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		k.inDialog("ACK", 1, k.branch+"-ack")
	}
	tokenless.route = nil
	if n := ldn.count(gosip.INVITE, ""); n != 2 {
		t.Fatalf("london got %d INVITEs, want 2", n)
	}
	if pool, id, ok := s.dialogs.lookupIn(tokenless.callID, "a"+tokenless.callID, "", s.clock.Now(), dialogPeek); !ok || pool != "london" || id != "ldn" {
		t.Errorf("dialog table: %q %q %v, want london ldn", pool, id, ok)
	}
	// The routes change: +4420 now goes to the pool default.
	setGen(t, s, backends, []string{"pool=london,user=+4499"})
	for i, k := range []*call{withToken, tokenless} {
		k.inDialog("BYE", 2, k.branch+"-bye")
		c.recvResponseTo(gosip.BYE, 200)
		if n := ldn.count(gosip.BYE, k.callID); n != 1 {
			t.Errorf("call %d: BYE reached london %d times, want 1 (a dialog never moves pool)", i, n)
		}
	}
	k := c.newCall()
	k.inviteTo("sip:+442079460000@voice.example", "a.example")
	c.awaitResponse(gosip.INVITE, 200, 200)
	if def.count(gosip.INVITE, k.callID) != 1 {
		t.Error("new work did not follow the new routes")
	}
	// A version 2 token (no pool), issued before pools, still names its
	// backend.
	old := c.newCall()
	old.inviteTo("sip:+449912@voice.example", "a.example")
	c.recvResponse(180)
	old.learn(c.recvResponse(200))
	signer, _ := lb.NewSigner(testKey)
	v2 := signer.Token(tokenSubject("ldn", old.callID), time.Now().Add(time.Hour))
	old.route = []string{fmt.Sprintf("<sip:%s;lr;sl=%s>", s.udpAddr(), v2)}
	old.inDialog("BYE", 2, old.branch+"-bye")
	c.recvResponseTo(gosip.BYE, 200)
	if n := ldn.count(gosip.BYE, old.callID); n != 1 {
		t.Errorf("BYE with a version 2 token reached ldn %d times, want 1", n)
	}
}

// TestTokenCarriesPool: the Record-Route token names the dialog's pool.
func TestTokenCarriesPool(t *testing.T) {
	ldn := newUAS(t, "ldn")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london,pool=backup"}, []string{"pool=london,user=+4420", "pool=backup"}, nil, nil)
	c := newUAC(t, s.udpAddr())
	for _, tc := range []struct{ ruri, pool string }{
		{"sip:+442079460000@voice.example", "london"},
		{"sip:+331234@voice.example", "backup"},
	} {
		k := c.newCall()
		k.inviteTo(tc.ruri, "a.example")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		if len(k.route) == 0 {
			t.Fatal("no Record-Route")
		}
		u := strings.Trim(k.route[0], "<>")
		_, tok, _ := strings.Cut(u, ";sl=")
		tok, _, _ = strings.Cut(tok, ";")
		signer, _ := lb.NewSigner(testKey)
		pool, subj, _, ok := signer.VerifyPool(tok, time.Now())
		if !ok || pool != tc.pool || !strings.HasPrefix(subj, "ldn|") {
			t.Errorf("%s: token pool %q subject %q ok %v, want pool %s, backend ldn", tc.ruri, pool, subj, ok, tc.pool)
		}
	}
}

// series gathers the collector's counters and gauges as
// "name{label=value,...}" -> value, labels in the registry's order.
func series(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[f.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

// TestPoolMetrics: route hits per route and pool, refusals and new work
// per pool, and no-route counts.
func TestPoolMetrics(t *testing.T) {
	ldn, def := newUAS(t, "ldn"), newUAS(t, "def")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london", def.addr.String() + ",id=def"},
		[]string{"pool=london,user=+4420"},
		[]string{"name=ldn,proto=sip,method=INVITE,pool=london,limit=1/min,action=reject"}, nil)
	c := newUAC(t, s.udpAddr())
	c.newCall().inviteTo("sip:+442079460000@voice.example", "a.example")
	c.awaitResponse(gosip.INVITE, 200, 200)
	c.newCall().inviteTo("sip:+442079460001@voice.example", "a.example")
	c.awaitResponse(gosip.INVITE, 503, 200)
	c.newCall().inviteTo("sip:+331234@voice.example", "a.example")
	c.awaitResponse(gosip.INVITE, 200, 200)
	got := series(t, s)
	for name, want := range map[string]float64{
		// A route is labelled by its spec.
		`sluice_sip_route_hits_total{pool=london,route=pool=london,user=+4420}`: 2,

		`sluice_sip_route_hits_total{pool=default,route=default}`:      1,
		`sluice_sip_pool_refused_total{pool=london,reason=arm}`:        1,
		`sluice_sip_pool_refused_total{pool=default,reason=arm}`:       0,
		`sluice_sip_pool_new_work_total{backend=ldn,pool=london}`:      1,
		`sluice_sip_pool_new_work_total{backend=def,pool=default}`:     1,
		`sluice_sip_no_route_total{}`:                                  0,
		`sluice_frontend_events_total{event=no_route,protocol=sip}`:    0,
		`sluice_frontend_events_total{event=refused_arm,protocol=sip}`: 1,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (exported %v), want %v", name, v, ok, want)
		}
	}
	// The pools' counters survive a reload that keeps them.
	setGen(t, s, []string{ldn.addr.String() + ",id=ldn,pool=london", def.addr.String() + ",id=def"}, []string{"pool=london,user=+4420"})
	got = series(t, s)
	if v := got[`sluice_sip_pool_refused_total{pool=london,reason=arm}`]; v != 1 {
		t.Errorf("after a reload, london refused by arm = %v, want 1", v)
	}
	if v := got[`sluice_sip_pool_new_work_total{backend=ldn,pool=london}`]; v != 1 {
		t.Errorf("after a reload, ldn new work = %v, want 1", v)
	}
}

// TestGenerationPings: a generation handed in with the server's Prober
// pings each backend once, whatever the number of its pools: a silent
// one goes down in every pool, one answering 503 backs off, and new work
// of both pools goes to the backend that is up.
func TestGenerationPings(t *testing.T) {
	b1, b2, b3 := newUAS(t, "b1"), newUAS(t, "b2"), newUAS(t, "b3")
	b1.mode.Store(modeSilent)
	s := poolServer(t, []string{
		b1.addr.String() + ",id=b1,pool=london,pool=paris",
		b2.addr.String() + ",id=b2,pool=london,pool=paris",
		b3.addr.String() + ",id=b3,pool=paris",
	}, []string{"pool=london,user=+44", "pool=paris"}, nil, func(c *Config) {
		c.HealthInterval = 50 * time.Millisecond
		c.HealthTimeout = 40 * time.Millisecond
		c.HealthRise, c.HealthFall = 1, 2
	})
	if !s.Generation().HealthChecks() {
		t.Fatal("the generation runs no checks")
	}
	state := func(id string) lb.State { return s.Generation().Lookup(id).State(s.clock.Now()) }
	eventually(t, "silent b1 down", func() bool { return state("b1") == lb.Down })
	b3.pingCode.Store(503)
	eventually(t, "b3 backing off after a ping answered 503", func() bool { return state("b3") == lb.Draining })
	if st := state("b2"); st != lb.Up {
		t.Fatalf("b2 is %s, want up", st)
	}
	if n := b2.count(gosip.OPTIONS, ""); n == 0 {
		t.Fatal("b2 was never pinged")
	}
	// One check per backend: b2, in two pools, is pinged about as often
	// as b3, in one.
	if n2, n3 := b2.count(gosip.OPTIONS, ""), b3.count(gosip.OPTIONS, ""); n2 > 2*n3+2 {
		t.Errorf("b2 (two pools) pinged %d times, b3 (one) %d: want one check per backend", n2, n3)
	}
	c := newUAC(t, s.udpAddr())
	for _, ruri := range []string{"sip:+4420@voice.example", "sip:+33@voice.example", "sip:+4421@voice.example"} {
		k := c.newCall()
		k.inviteTo(ruri, "a.example")
		c.awaitResponse(gosip.INVITE, 200, 200)
		if b2.count(gosip.INVITE, k.callID) != 1 {
			t.Errorf("%s: not on b2, the one backend up and not backing off", ruri)
		}
	}
}

// TestProberBeforeStart: a ping before the server listens is down, saying
// why; a backend address that does not resolve gives a prober that is
// always down, naming the backend.
func TestProberBeforeStart(t *testing.T) {
	signer, _ := lb.NewSigner(testKey)
	adm, _ := admission.NewController(admission.ControllerConfig{}, nil, admission.MonoClock{}.Now())
	s, err := New(Config{Listen: "127.0.0.1:0"}, Deps{Admission: adm, Signer: signer}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "Backends") {
		t.Errorf("Start without a generation: %v, want an error naming Backends", err)
	}
	b, _ := lb.NewBackend(lb.BackendConfig{ID: "b1", Addr: "127.0.0.1:5999", Proto: "sip"})
	r, err := s.Prober(b, lb.BackendSpec{ID: "b1", Addr: "127.0.0.1:5999"}, nil).Probe(context.Background(), b)
	if r != lb.ProbeDown || err == nil || !strings.Contains(err.Error(), "not listening") {
		t.Errorf("ping before Start: %v %v, want down, not listening", r, err)
	}
	r, err = s.Prober(b, lb.BackendSpec{ID: "b1", Addr: "no-such-host.invalid:5060"}, nil).Probe(context.Background(), b)
	if r != lb.ProbeDown || err == nil || !strings.Contains(err.Error(), "b1") {
		t.Errorf("ping of an unresolvable backend: %v %v, want down naming b1", r, err)
	}
}

// TestUnknownDialogRouted: a request with a made-up To-tag (a dialog the
// table does not know, no token) proves nothing; under -sip-unknown-dialog
// new-work it is routed and metered as new work, so it reaches no pool the
// routes would not give it: no route and no pool default is 404, a route
// sends it to its pool under that pool's budget.
func TestUnknownDialogRouted(t *testing.T) {
	ldn := newUAS(t, "ldn")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london"}, []string{"pool=london,user=+4420"},
		[]string{"name=ldn,proto=sip,method=INVITE,pool=london,limit=1/min,action=reject"}, nil)
	c := newUAC(t, s.udpAddr())
	send := func(user string) {
		k := c.newCall()
		k.c.send(fmt.Sprintf("INVITE sip:%s@voice.example SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@a.example>;tag=a%s\r\nTo: <sip:x@voice.example>;tag=made-up\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n",
			user, k.c.addr, k.branch, k.callID, k.callID))
	}
	send("+331234")
	if res := c.awaitResponse(gosip.INVITE, 404, 200); !strings.Contains(warning(res), "no route") {
		t.Errorf("Warning %q, want no route", warning(res))
	}
	send("+442079460000")
	c.awaitResponse(gosip.INVITE, 200, 200)
	send("+442079460001")
	if res := c.awaitResponse(gosip.INVITE, 503, 200); !strings.Contains(warning(res), "pool london") {
		t.Errorf("Warning %q, want the london budget named", warning(res))
	}
	if n := ldn.count(gosip.INVITE, ""); n != 1 {
		t.Errorf("london got %d INVITEs with made-up To-tags, want 1", n)
	}
}

// TestSetGenerationRefuses: nil, a generation of another protocol and one
// with a backend address that does not resolve are refused with an error
// naming what is wrong, and the generation in force stays.
func TestSetGenerationRefuses(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	before := s.Generation()
	httpGen, err := lb.NewGeneration(lb.GenConfig{Proto: "http", Backends: []lb.BackendSpec{{Addr: "127.0.0.1:80"}}})
	if err != nil {
		t.Fatal(err)
	}
	unresolvable, err := lb.NewGeneration(lb.GenConfig{Proto: "sip", Policy: "hash", Backends: []lb.BackendSpec{{Addr: "no-such-host.invalid:5060", ID: "ghost"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		g    *lb.Generation
		want string
	}{
		{"nil", nil, "at least one backend"},
		{"http", httpGen, `"http", want sip`},
		{"unresolvable", unresolvable, "backend ghost"},
	} {
		err := s.SetGeneration(tc.g)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
		if s.Generation() != before {
			t.Errorf("%s: the generation in force changed", tc.name)
		}
	}
	c := newUAC(t, s.udpAddr())
	c.newCall().complete()
}

// TestSetBackendsPools: the wrapper keeps the pools of -sip-backend
// (pool=), so a backend only in another pool gets no new work without a
// route; the same list again changes nothing.
func TestSetBackendsPools(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	var bcs []BackendConfig
	for _, spec := range []string{b1.addr.String() + ",id=b1", b2.addr.String() + ",id=b2,pool=london"} {
		bc, err := ParseBackend(spec)
		if err != nil {
			t.Fatal(err)
		}
		bcs = append(bcs, bc)
	}
	if bcs[0].Pools != nil || !slices.Equal(bcs[1].Pools, []string{"london"}) {
		t.Fatalf("parsed pools %v %v, want none and london", bcs[0].Pools, bcs[1].Pools)
	}
	if err := s.SetBackends(bcs, nil); err != nil {
		t.Fatal(err)
	}
	g := s.Generation()
	if p := g.Pool("london"); p == nil || p.Len() != 1 || p.Lookup("b2") == nil || g.Pool("default").Lookup("b2") != nil {
		t.Fatalf("pools after SetBackends: %v", g.Pools())
	}
	if err := s.SetBackends(bcs, nil); err != nil || s.Generation() != g {
		t.Errorf("the same list again: %v, generation replaced %v", err, s.Generation() != g)
	}
	c := newUAC(t, s.udpAddr())
	for range 4 {
		c.newCall().complete()
	}
	if n := b2.count(gosip.INVITE, ""); n != 0 {
		t.Errorf("b2, only in london, got %d INVITEs without a route to london", n)
	}
}
