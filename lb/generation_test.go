package lb

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicelb/sluice/admission"
)

// genFixture builds generations over a manual clock with scripted probers
// by backend id (a backend without one probes up).
type genFixture struct {
	clock   *admission.ManualClock
	probers map[string]*scripted
	events  []admission.Event
	mops    map[string]*admission.MOP // by id: one per backend built
}

func newGenFixture() *genFixture {
	return &genFixture{clock: &admission.ManualClock{}, probers: map[string]*scripted{}, mops: map[string]*admission.MOP{}}
}

// config returns a GenConfig of specs with checks on (Fall 1, Rise 1)
// when checks is set.
func (f *genFixture) config(proto string, checks bool, specs ...BackendSpec) GenConfig {
	cfg := GenConfig{
		Proto:    proto,
		Backends: specs,
		Policy:   "round-robin",
		Clock:    f.clock,
		Events:   func(ev admission.Event) { f.events = append(f.events, ev) },
		MOP: func(spec BackendSpec) (*admission.MOP, error) {
			m, err := admission.NewMOP(admission.MOPConfig{Name: proto + " " + spec.ID, InitialRate: 1e9})
			f.mops[spec.ID] = m
			return m, err
		},
	}
	if checks {
		cfg.Health = HealthConfig{Interval: time.Hour, Rise: 1, Fall: 1}
		cfg.Prober = func(b *Backend, spec BackendSpec, _ *PoolSpec) Prober {
			if p := f.probers[spec.ID]; p != nil {
				return p
			}
			return up()
		}
	}
	return cfg
}

func (f *genFixture) gen(t *testing.T, cfg GenConfig) *Generation {
	t.Helper()
	g, err := NewGeneration(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	return g
}

func spec(id string, pools ...string) BackendSpec {
	return BackendSpec{ID: id, Addr: "10.0.0." + id[1:] + ":80", Weight: 1, Pools: pools}
}

// picks returns the ids Pick in p gives over n calls.
func picks(t *testing.T, p *Pool, now int64, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for i := range n {
		b, out, _ := p.Pick(now, uint64(i), nil)
		if out != Picked {
			t.Fatalf("pool %s: Pick %v", p.Name(), out)
		}
		seen[b.ID()]++
	}
	return seen
}

// A backend in two pools is one Backend: one MOP, one health state that
// both pools see; each pool picks among its own members only.
func TestGenerationBackendInTwoPools(t *testing.T) {
	f := newGenFixture()
	cfg := f.config("http", true, spec("b1", "api", "web"), spec("b2", "api"), spec("b3", "web"), spec("b4"))
	g := f.gen(t, cfg)
	ctx := context.Background()
	g.health.ProbeAll(ctx)

	var names []string
	for _, p := range g.Pools() {
		names = append(names, p.Name())
	}
	if want := []string{"default", "api", "web"}; !slices.Equal(names, want) {
		t.Errorf("pools %v, want %v (default first, then by first mention)", names, want)
	}
	b1 := g.Lookup("b1")
	if b1 == nil || g.Pool("api").Lookup("b1") != b1 || g.Pool("web").Lookup("b1") != b1 {
		t.Fatal("b1 is not one Backend in both pools")
	}
	if b1.MOP() == nil || b1.MOP() != f.mops["b1"] || len(f.mops) != 4 {
		t.Errorf("MOP built %d times for 4 backends, b1's %p want %p", len(f.mops), b1.MOP(), f.mops["b1"])
	}
	if got := g.PoolsOf(b1); !slices.Equal(got, []string{"api", "web"}) {
		t.Errorf("PoolsOf(b1) = %v", got)
	}
	if got := g.PoolsOf(g.Lookup("b4")); !slices.Equal(got, []string{"default"}) {
		t.Errorf("PoolsOf(b4) = %v, want [default]", got)
	}
	if s := g.Spec(g.Lookup("b3")); s.Addr != "10.0.0.3:80" || s.ID != "b3" {
		t.Errorf("Spec(b3) = %+v", s)
	}
	if len(g.Backends()) != 4 || g.Pool("nope") != nil {
		t.Errorf("%d backends, Pool(nope) %v", len(g.Backends()), g.Pool("nope"))
	}
	for i, b := range g.Backends() {
		if b.Index() != i {
			t.Errorf("%s: Index %d, want its position %d in Backends", b.ID(), b.Index(), i)
		}
	}

	// Each pool only picks its members.
	members := map[string][]string{"default": {"b4"}, "api": {"b1", "b2"}, "web": {"b1", "b3"}}
	for name, want := range members {
		got := picks(t, g.Pool(name), 0, 40)
		var ids []string
		for id := range got {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		if !slices.Equal(ids, want) {
			t.Errorf("pool %s picked %v, want only %v", name, got, want)
		}
	}

	// One health state: probed down once, out of both pools.
	f.probers["b1"] = down()
	g.health.checks[0].prober = f.probers["b1"]
	g.health.ProbeAll(ctx)
	if n := len(g.health.checks); n != 4 {
		t.Errorf("%d health checks for 4 backends", n)
	}
	for _, name := range []string{"api", "web"} {
		if got := picks(t, g.Pool(name), 0, 20); got["b1"] != 0 {
			t.Errorf("pool %s still picks b1 probed down: %v", name, got)
		}
	}
	// One set of counters: a request through each pool counts twice on b1.
	f.probers["b1"].v.Store(uint32(ProbeUp))
	g.health.ProbeAll(ctx)
	before := b1.Status(0).Requests
	for _, name := range []string{"api", "web"} {
		b := g.Pool(name).Lookup("b1")
		b.Acquire()
		b.Release(0, OK)
	}
	if got := b1.Status(0).Requests - before; got != 2 {
		t.Errorf("b1 counted %d requests, want 2", got)
	}
}

// Panic is per pool, over that pool's members: a backend down by its
// probes gets new work in the pool that panics and not in the other.
func TestGenerationPanicPerPool(t *testing.T) {
	f := newGenFixture()
	f.probers["b1"], f.probers["b2"] = down(), down()
	// x: b1 b2 b5, 2 of 3 down (over 50 %); y: b1 b3 b4, 1 of 3.
	cfg := f.config("sip", true, spec("b1", "x", "y"), spec("b2", "x"), spec("b3", "y"), spec("b4", "y"), spec("b5", "x"))
	g := f.gen(t, cfg)
	g.health.ProbeAll(context.Background())
	x, y := g.Pool("x"), g.Pool("y")
	if !x.Panicking() || y.Panicking() || x.Panics() != 1 {
		t.Fatalf("panicking x %v (%d), y %v; want x only", x.Panicking(), x.Panics(), y.Panicking())
	}
	if got := picks(t, x, 0, 60); got["b1"] == 0 || got["b2"] == 0 {
		t.Errorf("pool x in panic picked %v, want b1 and b2 too", got)
	}
	if got := picks(t, y, 0, 60); got["b1"] != 0 {
		t.Errorf("pool y (no panic) picked b1, down by its probes: %v", got)
	}
	if r := g.Lookup("b1").Reason(0); !strings.Contains(r, "in panic") {
		t.Errorf("reason of b1: %q", r)
	}
	var subjects []string
	for _, ev := range f.events {
		if strings.Contains(ev.Message, "panic") {
			subjects = append(subjects, ev.Subject)
		}
	}
	if !slices.Equal(subjects, []string{"sip pool x"}) {
		t.Errorf("panic events with subjects %v, want [sip pool x]", subjects)
	}
	// Out of panic: b1 counted once per pool it was in panic in.
	f.probers["b1"].v.Store(uint32(ProbeUp))
	f.probers["b2"].v.Store(uint32(ProbeUp))
	g.health.ProbeAll(context.Background())
	if x.Panicking() || g.Lookup("b1").panicPools.Load() != 0 {
		t.Errorf("all up: x panicking %v, b1 in %d pools in panic", x.Panicking(), g.Lookup("b1").panicPools.Load())
	}
}

// prevState is what the operator, the traffic and the probes did to a
// backend of the generation in force before a reload.
type prevState struct {
	drained, disabled, probeDown bool
	backOff                      time.Duration
}

// The carry-over of a reload, once for both protocols. The SIP front end's
// own carry-over (before generations) copied every health word whatever
// its checks and left the operator's disable to the data directory: with SIP health
// checks off, a backend kept across a SIGHUP lost its disable and kept a
// probe verdict of down that no checker would ever revise. Now the
// operator's switches always stay, and a probe verdict only where probes
// go on.
func TestGenerationCarryOver(t *testing.T) {
	const now = int64(100 * time.Second)
	tests := []struct {
		name                string
		prevChecks, checks  bool
		prev                prevState
		newAddr, added      bool
		want                State
		wantDrained, wantDi bool
		wantBusy            bool
	}{
		{name: "drained kept", prev: prevState{drained: true}, want: Draining, wantDrained: true},
		{name: "disabled kept", prev: prevState{disabled: true}, want: Down, wantDi: true},
		{name: "disabled, probe-down, checks off in both", prev: prevState{disabled: true, probeDown: true}, want: Down, wantDi: true},
		{name: "probe-down, checks on in both", prevChecks: true, checks: true, prev: prevState{probeDown: true}, want: Down},
		{name: "probe-down, checks on then off", prevChecks: true, prev: prevState{probeDown: true}, want: Up},
		{name: "probe-down, checks off then on", checks: true, prev: prevState{probeDown: true}, want: Up},
		{name: "probe-down, checks off in both", prev: prevState{probeDown: true}, want: Up},
		{name: "back-off kept", prev: prevState{backOff: time.Minute}, want: Draining, wantBusy: true},
		{name: "back-off kept, checks on", prevChecks: true, checks: true, prev: prevState{backOff: time.Minute}, want: Draining, wantBusy: true},
		{name: "new backend, checks on", checks: true, added: true, want: Unknown},
		{name: "new backend, checks off", added: true, want: Up},
		{name: "address changed: new, checks on", checks: true, prev: prevState{drained: true}, newAddr: true, want: Unknown},
		{name: "address changed: new, checks off", prev: prevState{disabled: true}, newAddr: true, want: Up},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newGenFixture()
			prev := f.gen(t, f.config("sip", tc.prevChecks, spec("b1"), spec("b2")))
			ob := prev.Lookup("b1")
			ob.Drain(tc.prev.drained)
			ob.Disable(tc.prev.disabled)
			if tc.prev.probeDown {
				ob.SetProbeDown(true)
			}
			ob.BackOff(now, tc.prev.backOff)
			next := spec("b1")
			switch {
			case tc.added:
				next = spec("b3")
			case tc.newAddr:
				next.Addr = "10.0.9.1:80"
			}
			cfg := f.config("sip", tc.checks, next, spec("b2"))
			cfg.Prev = prev
			g := f.gen(t, cfg)
			b := g.Lookup(next.ID)
			if got := b.State(now); got != tc.want {
				t.Errorf("state %v (%s), want %v", got, b.Reason(now), tc.want)
			}
			if b.Drained() != tc.wantDrained || b.Disabled() != tc.wantDi {
				t.Errorf("drained %v disabled %v, want %v %v", b.Drained(), b.Disabled(), tc.wantDrained, tc.wantDi)
			}
			if busy := b.BusyUntil() == now+int64(time.Minute); busy != tc.wantBusy {
				t.Errorf("busy until %d, want kept: %v", b.BusyUntil(), tc.wantBusy)
			}
			// The operator's enable brings it back (checks off: nothing
			// else would).
			b.Disable(false)
			b.Drain(false)
			b.ClearBusy()
			if !tc.checks && b.State(now) != Up {
				t.Errorf("checks off, enabled again: %v (%s), want up", b.State(now), b.Reason(now))
			}
			if other := g.Lookup("b2"); other.State(now) != Up {
				t.Errorf("b2 untouched: %v", other.State(now))
			}
		})
	}
}

func TestGenerationNewBackendUnknownUntilProbed(t *testing.T) {
	f := newGenFixture()
	prev := f.gen(t, f.config("http", true, spec("b1")))
	cfg := f.config("http", true, spec("b1"), spec("b2"))
	cfg.Prev = prev
	g := f.gen(t, cfg)
	b2 := g.Lookup("b2")
	if b2.State(0) != Unknown || g.Lookup("b1").State(0) != Up {
		t.Fatalf("b2 %v, b1 %v; want unknown, up", b2.State(0), g.Lookup("b1").State(0))
	}
	g.Start(context.Background()) // the first round is synchronous
	if b2.State(0) != Up {
		t.Errorf("after its first probe passed: %v", b2.State(0))
	}
	g.Stop()
	g.Stop() // twice is fine
}

func TestGenerationErrors(t *testing.T) {
	f := newGenFixture()
	base := func(mod func(*GenConfig)) GenConfig {
		c := f.config("http", false, spec("b1"), spec("b2", "api"))
		mod(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  GenConfig
		want string
	}{
		{"pool without backends", base(func(c *GenConfig) { c.Pools = []PoolSpec{{Name: "static"}} }), "http backends: pool static has no backends"},
		{"duplicate id", base(func(c *GenConfig) { c.Backends = append(c.Backends, BackendSpec{ID: "b1", Addr: "10.1.1.1:80"}) }), `backend id "b1" given twice (10.0.0.1:80 and 10.1.1.1:80`},
		{"duplicate id by address", f.config("sip", false, BackendSpec{Addr: "h:1"}, BackendSpec{Addr: "h:1"}), `sip backends: backend id "h:1" given twice`},
		{"unknown front end policy", base(func(c *GenConfig) { c.Policy = "fastest" }), `policy "fastest": unknown (want one of round-robin,`},
		{"unknown pool policy", base(func(c *GenConfig) { c.Pools = []PoolSpec{{Name: "api", Policy: "fastest"}} }), `pool api: policy "fastest": unknown`},
		{"pool settings twice", base(func(c *GenConfig) { c.Pools = []PoolSpec{{Name: "api"}, {Name: "api"}} }), "pool api: settings given twice"},
		{"empty pool name", base(func(c *GenConfig) { c.Backends[1].Pools = []string{""} }), `backend b2: pool "": want a pool name`},
		{"bad pool name", base(func(c *GenConfig) { c.Backends[1].Pools = []string{"a b"} }), `backend b2: pool "a b": want a pool name`},
		{"pool named twice", base(func(c *GenConfig) { c.Backends[1].Pools = []string{"api", "api"} }), "backend b2: pool api named twice"},
		{"bad weight", base(func(c *GenConfig) { c.Backends[0].Weight = MaxWeight + 1 }), "backend b1: new backend b1: weight 1001"},
		{"no backends", base(func(c *GenConfig) { c.Backends = nil }), "pool has no backends"},
		{"protocol", base(func(c *GenConfig) { c.Proto = "ftp" }), `protocol "ftp": want http or sip`},
		{"negative interval", base(func(c *GenConfig) { c.Health.Interval = -time.Second }), "health check interval -1s: must not be negative"},
		{"passive", base(func(c *GenConfig) { c.Passive.MaxFails = -1 }), "PassiveConfig.MaxFails"},
		{"health", base(func(c *GenConfig) {
			c.Health = HealthConfig{Interval: time.Second, Timeout: time.Minute}
			c.Prober = func(*Backend, BackendSpec, *PoolSpec) Prober { return up() }
		}), "health checks: lb: HealthConfig.Timeout: must be in (0, Interval]"},
		{"memory probe", base(func(c *GenConfig) { c.Backends[1].MetricsURL = "ftp://x/m" }), "backend b2: memory probe: memory probe b2: metrics url"},
		{"mop", base(func(c *GenConfig) {
			c.MOP = func(BackendSpec) (*admission.MOP, error) { return nil, errors.New("bad rate") }
		}), "backend b1: memory overload protection: bad rate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			called := 0
			if tc.name != "mop" {
				tc.cfg.MOP = func(BackendSpec) (*admission.MOP, error) { called++; return nil, nil }
			}
			_, err := NewGeneration(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrBadGeneration) {
				t.Fatalf("error = %v, want one with %q", err, tc.want)
			}
			if called != 0 {
				t.Errorf("MOP called %d times for a configuration refused", called)
			}
		})
	}
}

// The prober of a backend gets the first of its pools that sets a health
// path.
func TestGenerationProberPool(t *testing.T) {
	f := newGenFixture()
	cfg := f.config("http", true, spec("b1", "a", "b", "c"), spec("b2", "a"))
	cfg.Pools = []PoolSpec{{Name: "b", HealthPath: "/b"}, {Name: "c", HealthPath: "/c"}, {Name: "a", Policy: "consistent-hash"}}
	got := map[string]string{}
	cfg.Prober = func(b *Backend, spec BackendSpec, ps *PoolSpec) Prober {
		got[spec.ID] = "<nil>"
		if ps != nil {
			got[spec.ID] = ps.HealthPath
		}
		return up()
	}
	g := f.gen(t, cfg)
	if want := map[string]string{"b1": "/b", "b2": "<nil>"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("probers got pools %v, want %v", got, want)
	}
	if _, ok := g.Pool("a").Policy().(*ConsistentHash); !ok {
		t.Errorf("pool a's policy %T, want its own consistent-hash", g.Pool("a").Policy())
	}
	if _, ok := g.Pool("b").Policy().(*RoundRobin); !ok {
		t.Errorf("pool b's policy %T, want the front end's", g.Pool("b").Policy())
	}
	if s, ok := g.PoolSpec("c"); !ok || s.HealthPath != "/c" || s.Policy != "round-robin" {
		t.Errorf("PoolSpec(c) = %+v %v", s, ok)
	}
}

// A weight set at run time counts in every pool of the backend.
func TestGenerationSetWeight(t *testing.T) {
	f := newGenFixture()
	cfg := f.config("http", false, spec("b1", "x", "y"), spec("b2", "x", "y"))
	cfg.Policy = "weighted-round-robin"
	g := f.gen(t, cfg)
	if err := g.SetWeight("b1", 3); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"x", "y"} {
		if got := picks(t, g.Pool(name), 0, 40); got["b1"] != 30 || got["b2"] != 10 {
			t.Errorf("pool %s after weight 3: %v, want b1 30 b2 10", name, got)
		}
	}
	for _, tc := range []struct {
		id   string
		w    int
		want string
	}{{"nope", 2, `set weight of http backend "nope": no such backend`}, {"b1", 0, "0 not in [1,1000]"}} {
		if err := g.SetWeight(tc.id, tc.w); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetWeight(%s, %d) = %v, want %q", tc.id, tc.w, err, tc.want)
		}
	}
}

// Passive ejection is one per generation: failures through either pool
// add up on the backend.
func TestGenerationPassiveAcrossPools(t *testing.T) {
	f := newGenFixture()
	cfg := f.config("http", false, spec("b1", "x", "y"), spec("b2", "x", "y"))
	cfg.Passive = PassiveConfig{MaxFails: 2, Cooldown: time.Second}
	g := f.gen(t, cfg)
	for _, name := range []string{"x", "y"} {
		b := g.Pool(name).Lookup("b1")
		b.Acquire()
		b.Release(0, ServerError)
	}
	if st := g.Lookup("b1").State(0); st != Down {
		t.Errorf("two failures, one through each pool, MaxFails 2: %v, want down", st)
	}
}

// BackOff is the one Retry-After back-off: capped at MaxAvoid, never
// shortened, started reported once.
func TestBackOff(t *testing.T) {
	const now = int64(time.Hour)
	tests := []struct {
		name      string
		busyUntil int64
		d         time.Duration
		started   bool
		until     int64
	}{
		{"new", 0, 10 * time.Second, true, now + int64(10*time.Second)},
		{"capped", 0, 24 * time.Hour, true, now + int64(MaxAvoid)},
		{"past deadline is a new one", now - 1, time.Second, true, now + int64(time.Second)},
		{"extended, not new", now + int64(time.Second), 10 * time.Second, false, now + int64(10*time.Second)},
		{"never shortened", now + int64(time.Minute), time.Second, false, now + int64(time.Minute)},
		{"until cleared stays", -1, time.Second, false, -1},
		{"zero is nothing", 0, 0, false, 0},
		{"negative is nothing", 0, -time.Second, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := NewBackend(BackendConfig{Addr: "a:1"})
			b.SetBusy(tc.busyUntil)
			if got := b.BackOff(now, tc.d); got != tc.started {
				t.Errorf("started %v, want %v", got, tc.started)
			}
			if b.BusyUntil() != tc.until {
				t.Errorf("until %d, want %d", b.BusyUntil(), tc.until)
			}
		})
	}
}

// Pick in a generation's pool allocates nothing, with skip and with a
// tried set.
func TestGenerationPickAllocatesNothing(t *testing.T) {
	f := newGenFixture()
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			cfg := f.config("sip", false, spec("b1", "x", "y"), spec("b2", "y"), spec("b3", "x", "y"))
			cfg.Policy = pol
			g := f.gen(t, cfg)
			y := g.Pool("y")
			skip := g.Lookup("b3")
			key := uint64(0)
			n := testing.AllocsPerRun(500, func() {
				key++
				y.Pick(0, key, skip)
				var tried Set
				y.PickTried(0, key, &tried)
				y.Pinned("b2", 0)
				g.Lookup("b1")
			})
			if n != 0 {
				t.Errorf("%v allocations per pick, want 0", n)
			}
			if n := testing.AllocsPerRun(100, func() { key++; y.Home(0, key) }); n != 0 {
				t.Errorf("Home: %v allocations, want 0", n)
			}
			// Home: a member of this pool, stable under a hash policy,
			// and one all the same when none takes new work.
			for i := range 20 {
				h := y.Home(0, uint64(i))
				if !y.Has(h) {
					t.Fatalf("Home gave %s, not of pool y", h.ID())
				}
				if pol == "consistent-hash" && y.Home(0, uint64(i)) != h {
					t.Fatal("Home under consistent-hash not stable")
				}
			}
			for _, b := range y.Backends() {
				b.Drain(true)
			}
			if h := y.Home(0, 7); h == nil || !y.Has(h) || h != y.Home(0, 7) {
				t.Errorf("Home with every member drained: %v", h)
			}
			for _, b := range y.Backends() {
				b.Drain(false)
			}
			// skip is honoured by its position in this pool.
			for i := range 20 {
				if b, _, _ := y.Pick(0, uint64(i), skip); b == skip {
					t.Fatal("Pick returned skip")
				}
			}
		})
	}
}

// BenchmarkGenerationPick picks in one of two overlapping pools of a
// generation (16 backends, 8 in both): the cost of a pick by pool.
func BenchmarkGenerationPick(b *testing.B) {
	f := newGenFixture()
	var specs []BackendSpec
	for i := range 16 {
		pools := []string{"x"}
		if i >= 8 {
			pools = []string{"x", "y"}
		}
		specs = append(specs, BackendSpec{ID: fmt.Sprintf("b%d", i), Addr: fmt.Sprintf("10.0.0.%d:80", i), Pools: pools})
	}
	for _, pol := range PolicyNames {
		b.Run(pol, func(b *testing.B) {
			cfg := f.config("http", false, specs...)
			cfg.Policy = pol
			g, err := NewGeneration(cfg)
			if err != nil {
				b.Fatal(err)
			}
			y := g.Pool("y")
			b.ReportAllocs()
			key := uint64(0)
			for b.Loop() {
				key++
				if _, out, _ := y.Pick(0, key, nil); out != Picked {
					b.Fatal(out)
				}
			}
		})
	}
}

// TestGenerationRoute: the first matching route names the pool; no match
// falls back to the default pool, or to none when there is no default.
func TestGenerationRoute(t *testing.T) {
	f := newGenFixture()
	route := func(s string) RouteSpec {
		t.Helper()
		r, err := ParseRouteSpec("http", s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	withDefault := f.config("http", false, spec("a1", "api"), spec("s1", "static"), spec("d1"))
	withDefault.Routes = []RouteSpec{route("pool=api,host=api.example.com"), route("pool=static,path=/static/")}
	noDefault := f.config("http", false, spec("a1", "api"), spec("s1", "static"))
	noDefault.Routes = withDefault.Routes
	for _, tc := range []struct {
		name       string
		cfg        GenConfig
		host, path string
		pool       string // "" = nil
		route      int
	}{
		{"host route", withDefault, "API.example.com:8080", "/static/x", "api", 0},
		{"path route", withDefault, "www.example.com", "/static/x", "static", 1},
		{"default", withDefault, "www.example.com", "/", "default", -1},
		{"no default", noDefault, "www.example.com", "/", "", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := f.gen(t, tc.cfg)
			p, i := g.Route(&RouteInput{Host: []byte(tc.host), Path: []byte(tc.path), Method: []byte("GET")})
			got := ""
			if p != nil {
				got = p.Name()
			}
			if got != tc.pool || i != tc.route {
				t.Errorf("Route = %q, %d; want %q, %d", got, i, tc.pool, tc.route)
			}
		})
	}

	bad := f.config("http", false, spec("a1", "api"))
	bad.Routes = []RouteSpec{route("pool=static,path=/static/")}
	if _, err := NewGeneration(bad); err == nil || !strings.Contains(err.Error(), `pool "static" has no backends`) {
		t.Errorf("route to a pool without backends: err = %v", err)
	}
	sipRoute, err := ParseRouteSpec("sip", "pool=api,domain=voice.example")
	if err != nil {
		t.Fatal(err)
	}
	bad.Routes = []RouteSpec{sipRoute}
	if _, err := NewGeneration(bad); err == nil || !strings.Contains(err.Error(), "a sip route") {
		t.Errorf("sip route in an http generation: err = %v", err)
	}
}

// Start's synchronous first round probes every backend at start, and
// after that only the backends new to the generation (a new id, or an
// id whose address changed): a route change or a reload that keeps its
// backends does not wait for their probes.
func TestGenerationFirstRoundNewBackendsOnly(t *testing.T) {
	moved := spec("b2")
	moved.Addr = "10.0.9.2:80"
	tests := []struct {
		name       string
		prev       []BackendSpec // nil: no Prev
		prevChecks bool
		next       []BackendSpec
		want       []string
	}{
		{name: "start: all", next: []BackendSpec{spec("b1"), spec("b2")}, want: []string{"b1", "b2"}},
		{name: "same backends: none", prev: []BackendSpec{spec("b1"), spec("b2")}, prevChecks: true, next: []BackendSpec{spec("b1"), spec("b2")}},
		{name: "one added", prev: []BackendSpec{spec("b1")}, prevChecks: true, next: []BackendSpec{spec("b1"), spec("b3")}, want: []string{"b3"}},
		{name: "address changed", prev: []BackendSpec{spec("b1"), spec("b2")}, prevChecks: true, next: []BackendSpec{spec("b1"), moved}, want: []string{"b2"}},
		{name: "checks turned on: only new", prev: []BackendSpec{spec("b1")}, next: []BackendSpec{spec("b1"), spec("b4")}, want: []string{"b4"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newGenFixture()
			cfg := f.config("http", true, tc.next...)
			if tc.prev != nil {
				cfg.Prev = f.gen(t, f.config("http", tc.prevChecks, tc.prev...))
			}
			g := f.gen(t, cfg)
			var got []string
			for _, c := range g.first {
				got = append(got, c.b.ID())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("first round probes %v, want %v", got, tc.want)
			}
		})
	}
}

// barrierProber answers up once n probes are under way at the same
// time, down if its context ends first: a round that probes one backend
// after another never gets there.
type barrierProber struct {
	all   chan struct{}
	n     int
	count *int
	mu    *sync.Mutex
}

func (p barrierProber) Probe(ctx context.Context, b *Backend) (ProbeResult, error) {
	p.mu.Lock()
	*p.count++
	if *p.count == p.n {
		close(p.all)
	}
	p.mu.Unlock()
	select {
	case <-p.all:
		return ProbeUp, nil
	case <-ctx.Done():
		return ProbeDown, ctx.Err()
	}
}

// The probes of a generation's first round run at the same time: with
// backends that answer only when all are probed at once, every one comes
// up.
func TestFirstRoundParallel(t *testing.T) {
	const n = 5
	var mu sync.Mutex
	count := 0
	bp := barrierProber{all: make(chan struct{}), n: n, count: &count, mu: &mu}
	h, err := NewHealthChecker(HealthConfig{Interval: time.Hour, Timeout: time.Minute, Rise: 1, Fall: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var bs []*Backend
	for i := range n {
		b, _ := NewBackend(BackendConfig{Addr: fmt.Sprintf("10.0.0.%d:80", i+1)})
		b.SetUnknown(true)
		h.Add(b, bp)
		bs = append(bs, b)
	}
	h.probeSome(context.Background(), h.checks)
	for _, b := range bs {
		if st := b.State(0); st != Up {
			t.Errorf("%s: %v (%s), want up: probes not run together", b.ID(), st, b.Reason(0))
		}
	}
}

// A backend's counters carry over to the next generation when its id and
// address stay, and go on counting what the old generation still
// releases: they never go back (Prometheus counters reset only with the
// process). A backend whose address changed starts at 0.
func TestGenerationCountersCarryOver(t *testing.T) {
	f := newGenFixture()
	prev := f.gen(t, f.config("http", false, spec("b1"), spec("b2")))
	ob1 := prev.Lookup("b1")
	for range 3 {
		ob1.Acquire()
		ob1.Release(0, ServerError)
	}
	ob1.Acquire() // in flight across the reload
	prev.Lookup("b2").Acquire()
	prev.Lookup("b2").Release(0, OK)

	moved := spec("b2")
	moved.Addr = "10.0.9.2:80"
	cfg := f.config("http", false, spec("b1"), moved, spec("b3"))
	cfg.Prev = prev
	g := f.gen(t, cfg)
	ob1.Release(0, Timeout) // the old generation's request ends after the reload
	b1 := g.Lookup("b1")
	b1.Acquire()
	b1.Release(0, OK)
	for _, tc := range []struct {
		id                 string
		requests, failures uint64
	}{
		{"b1", 5, 4},
		{"b2", 0, 0}, // another server: its own counts
		{"b3", 0, 0},
	} {
		st := g.Lookup(tc.id).Status(0)
		if st.Requests != tc.requests || st.Failures != tc.failures {
			t.Errorf("%s: requests %d failures %d, want %d %d", tc.id, st.Requests, st.Failures, tc.requests, tc.failures)
		}
	}
	if st := b1.Status(0); st.Outstanding != 0 {
		t.Errorf("b1 outstanding %d: the old generation's request is its own", st.Outstanding)
	}
}

// Route hits are labelled by spec in /metrics: a route inserted before
// another leaves the other's count where it was (the new generation
// takes the hits of the route of the same spec), a new route starts at
// 0, and a route given twice is one series.
func TestGenerationRouteHitsBySpec(t *testing.T) {
	f := newGenFixture()
	route := func(s string) RouteSpec {
		t.Helper()
		r, err := ParseRouteSpec("http", s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	api, static, admin := route("pool=api,host=api.example.com"), route("pool=static,path=/static/"), route("pool=api,path=/admin/")
	cfg := f.config("http", false, spec("a1", "api"), spec("s1", "static"))
	cfg.Routes = []RouteSpec{api, static}
	prev := f.gen(t, cfg)
	prev.Start(context.Background())
	hit := func(g *Generation, host, path string, n int) {
		for range n {
			g.Route(&RouteInput{Host: []byte(host), Path: []byte(path), Method: []byte("GET")})
		}
	}
	hit(prev, "api.example.com", "/", 3)
	hit(prev, "www.example.com", "/static/a", 2)

	cfg.Routes = []RouteSpec{admin, static, api, api}
	cfg.Prev = prev
	g := f.gen(t, cfg)
	g.Start(context.Background())
	hit(g, "api.example.com", "/", 1)
	want := []RouteHits{
		{Spec: "pool=api,path=/admin/", Pool: "api", Hits: 0},
		{Spec: "pool=static,path=/static/", Pool: "static", Hits: 2},
		{Spec: "pool=api,host=api.example.com", Pool: "api", Hits: 4},
	}
	if got := g.Routes().HitsBySpec(); !slices.Equal(got, want) {
		t.Errorf("HitsBySpec\n got %+v\nwant %+v", got, want)
	}
	if g.Routes().Hits(3) != 0 {
		t.Errorf("the second copy of a route took the first's hits too: %d", g.Routes().Hits(3))
	}
	var none *RouteTable
	if got := none.HitsBySpec(); got != nil {
		t.Errorf("no table: %v", got)
	}
}

// A route label is valid UTF-8 whatever bytes its header value holds:
// Prometheus refuses a label that is not (the scrape would fail).
func TestRouteHitsLabelValidUTF8(t *testing.T) {
	r, err := ParseRouteSpec("http", "pool=api,header=X-Tenant:a\xffb")
	if err != nil {
		t.Skipf("the grammar refuses invalid UTF-8 already: %v", err)
	}
	tab, err := NewRouteTable("http", []RouteSpec{r})
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.HitsBySpec()[0].Spec; !utf8.ValidString(got) || got != "pool=api,header=x-tenant:a\uFFFDb" && got != "pool=api,header=X-Tenant:a\uFFFDb" {
		t.Errorf("label %q", got)
	}
}

// DrainedByOperator: no backend takes new work and every one that would
// but for the operator's drain is drained.
func TestPoolDrainedByOperator(t *testing.T) {
	const now = int64(time.Hour)
	for _, tc := range []struct {
		name string
		set  func(b1, b2 *Backend)
		want bool
	}{
		{"all drained", func(b1, b2 *Backend) { b1.Drain(true); b2.Drain(true) }, true},
		{"one drained, the other disabled", func(b1, b2 *Backend) { b1.Drain(true); b2.Disable(true) }, true},
		{"one drained, the other up", func(b1, b2 *Backend) { b1.Drain(true) }, false},
		{"none drained, all down", func(b1, b2 *Backend) { b1.Disable(true); b2.SetProbeDown(true) }, false},
		{"drained and disabled", func(b1, b2 *Backend) { b1.Drain(true); b1.Disable(true); b2.Disable(true) }, false},
		{"drained and backed off", func(b1, b2 *Backend) { b1.Drain(true); b1.BackOff(now, time.Minute); b2.Disable(true) }, false},
		{"none drained, all up", func(b1, b2 *Backend) {}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newGenFixture()
			g := f.gen(t, f.config("http", false, spec("b1"), spec("b2")))
			tc.set(g.Lookup("b1"), g.Lookup("b2"))
			if got := g.Pool(DefaultPool).DrainedByOperator(now); got != tc.want {
				t.Errorf("DrainedByOperator = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestGenerationCatchUp: what changes on the generation in force between
// the next one's build and its swap (a drain, a 503 back-off, an
// ejection) reaches the next one; a longer back-off already there stays.
func TestGenerationCatchUp(t *testing.T) {
	f := newGenFixture()
	cfg := f.config("http", false, spec("b1"), spec("b2"))
	old := f.gen(t, cfg)
	cfg.Prev = old
	next := f.gen(t, cfg)
	const now = int64(1000)
	o1, o2 := old.Lookup("b1"), old.Lookup("b2")
	n1, n2 := next.Lookup("b1"), next.Lookup("b2")
	o1.Drain(true)
	o1.BackOff(now, 30*time.Second)
	o2.Disable(true)
	n2.BackOff(now, 4*time.Minute)
	o2.BackOff(now, time.Minute)
	next.CatchUp(old, now)
	if !n1.Drained() || n1.BusyUntil() != now+int64(30*time.Second) {
		t.Errorf("b1: drained %v busy until %d, want true and %d", n1.Drained(), n1.BusyUntil(), now+int64(30*time.Second))
	}
	if !n2.Disabled() || n2.BusyUntil() != now+int64(4*time.Minute) {
		t.Errorf("b2: disabled %v busy until %d, want true and the longer %d", n2.Disabled(), n2.BusyUntil(), now+int64(4*time.Minute))
	}
	next.CatchUp(nil, now) // nothing to catch up with: no panic
}
