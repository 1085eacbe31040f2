package lb

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// scripted is a prober whose verdict the test sets; a down verdict says
// what a probe to a slow or dead backend says.
type scripted struct{ v atomic.Uint32 }

func (p *scripted) Probe(context.Context, *Backend) (ProbeResult, error) {
	r := ProbeResult(p.v.Load())
	if r == ProbeDown {
		return r, context.DeadlineExceeded
	}
	return r, nil
}

func down() *scripted { p := &scripted{}; p.v.Store(uint32(ProbeDown)); return p }
func up() *scripted   { return &scripted{} }

// checked builds a pool of n backends (round-robin, passive ejection at
// 3) with a health checker of the default settings on clock, each backend
// probed by probers[i].
func checked(t *testing.T, clock admission.Clock, cfg HealthConfig, probers ...Prober) (*Pool, *HealthChecker, *[]string) {
	t.Helper()
	p, err := NewPool(PoolConfig{Passive: PassiveConfig{MaxFails: 3, Cooldown: 10 * time.Second}}, newBackends(t, make([]int, len(probers))...))
	if err != nil {
		t.Fatal(err)
	}
	events := &[]string{}
	cfg.Clock = clock
	cfg.Events = func(ev admission.Event) { *events = append(*events, ev.Message) }
	h, err := NewPoolHealthChecker(cfg, p, func(b *Backend) Prober { return probers[b.Index()] }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, h, events
}

// A backend that answers every request in 2 s fails the default probe
// (GET /, 1 s timeout). It was taken down after three probes and the pool
// answered 503 to everything, sticky sessions included. Real answers
// since the probes began to fail now overrule them.
func TestSlowBackendNotDownByProbes(t *testing.T) {
	for _, panic := range []float64{0, 1} { // default; never panic (the rule alone)
		clock := &admission.ManualClock{}
		p, h, _ := checked(t, clock, HealthConfig{Panic: panic}, down())
		b := p.Backends()[0]
		ctx := context.Background()
		refused := 0
		// Requests arrive every 500 ms, each answered 2 s later; probes
		// every 2 s (the default interval), for 20 s.
		var inflight []int64
		for step := int64(0); step < 40; step++ {
			now := step * int64(500*time.Millisecond)
			clock.Set(now)
			for len(inflight) > 0 && inflight[0] <= now {
				b.Release(inflight[0], OK)
				inflight = inflight[1:]
			}
			if step%4 == 0 {
				h.ProbeAll(ctx)
			}
			if step%2 == 0 { // a sticky request
				if p.Pinned(b.ID(), now) == nil {
					refused++
					continue
				}
			} else if _, out, _ := p.Pick(now, 0, nil); out != Picked {
				refused++
				continue
			}
			b.Acquire()
			inflight = append(inflight, now+int64(2*time.Second))
		}
		if refused != 0 {
			t.Errorf("panic %g: %d of 40 requests refused to a backend answering every one (state %v)", panic, refused, b.State(clock.Now()))
		}
		if !b.probeDown.Load() {
			t.Errorf("panic %g: the probes never failed: the test proves nothing", panic)
		}
	}
}

// Probes alone never empty a pool: with 3 of 4 backends failing their
// probes (over the default 50 %), new work is spread over all four, with
// an event; when they pass again, the panic ends.
func TestPoolPanicSpreadsNewWork(t *testing.T) {
	clock := &admission.ManualClock{}
	probers := []*scripted{down(), down(), down(), up()}
	p, h, events := checked(t, clock, HealthConfig{}, probers[0], probers[1], probers[2], probers[3])
	for range 3 { // Fall
		h.ProbeAll(context.Background())
	}
	if !p.Panicking() || p.Panics() != 1 {
		t.Fatalf("3 of 4 down by probes: panicking %v (%d times), want true", p.Panicking(), p.Panics())
	}
	// /status says why a backend "down" still gets new work.
	if r := p.Backends()[0].Reason(clock.Now()); !strings.Contains(r, "in panic") {
		t.Errorf("reason of a backend down by probes in panic: %q", r)
	}
	seen := map[int]int{}
	for range 400 {
		b, out, _ := p.Pick(clock.Now(), 0, nil)
		if out != Picked {
			t.Fatalf("Pick in panic: %v", out)
		}
		seen[b.Index()]++
	}
	if len(seen) != 4 {
		t.Errorf("new work in panic went to %v, want all 4 backends", seen)
	}
	if len(*events) == 0 {
		t.Error("no event for the panic")
	}
	// A backend ejected by traffic stays out even in panic.
	p.Backends()[0].Eject(clock.Now(), time.Minute)
	for range 40 {
		if b, _, _ := p.Pick(clock.Now(), 0, nil); b == p.Backends()[0] {
			t.Fatal("a backend shown dead by traffic got new work in panic")
		}
	}
	p.Backends()[0].Eject(clock.Now(), 0)
	for _, pr := range probers {
		pr.v.Store(uint32(ProbeUp))
	}
	for range 2 { // Rise
		h.ProbeAll(context.Background())
	}
	if p.Panicking() {
		t.Error("all probes pass again, still in panic")
	}
}

// A really dead backend (its probes fail, its connections are refused) is
// out of new work after Fall probes, as before, without a panic in a pool
// of three; its sticky clients are moved after one refused connection.
func TestDeadBackendOutAsBefore(t *testing.T) {
	clock := &admission.ManualClock{}
	p, h, _ := checked(t, clock, HealthConfig{}, up(), up(), down())
	dead := p.Backends()[2]
	probes := 0
	for dead.State(clock.Now()) != Down {
		if probes++; probes > 10 {
			t.Fatal("never down")
		}
		h.ProbeAll(context.Background())
		clock.Advance(2 * time.Second)
	}
	if probes != 3 {
		t.Errorf("down after %d failed probes, want 3 (-health-fall)", probes)
	}
	if p.Panicking() {
		t.Error("1 of 3 down: panic")
	}
	for range 30 {
		if b, _, _ := p.Pick(clock.Now(), 0, nil); b == dead {
			t.Fatal("new work to the dead backend")
		}
	}
	if p.Pinned(dead.ID(), clock.Now()) == nil {
		t.Fatal("a sticky request refused on the probes' word alone")
	}
	dead.Acquire()
	dead.Release(clock.Now(), ConnectError)
	if p.Pinned(dead.ID(), clock.Now()) != nil {
		t.Errorf("sticky clients still pinned to a backend that refused a connection (failures %d)", dead.ctr.failures.Load())
	}
}

// A backend added at run time is Unknown until its first probe: no new
// work; the first probe (not Rise or Fall of them) decides, and a real
// answer brings it in too. Unknown backends count neither way for the
// panic threshold and get no new work in panic.
func TestNewBackendUnknown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		probe *scripted
		serve bool
		want  State
	}{
		{"first probe passes", up(), false, Up},
		{"first probe fails", down(), false, Down},
		{"real traffic answered", nil, true, Up},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &admission.ManualClock{}
			newcomer := tc.probe
			if newcomer == nil {
				newcomer = down()
			}
			p, h, _ := checked(t, clock, HealthConfig{}, up(), newcomer)
			nb := p.Backends()[1]
			nb.SetUnknown(true)
			if s := nb.State(clock.Now()); s != Unknown {
				t.Fatalf("state %v, want unknown", s)
			}
			for range 20 {
				if b, _, _ := p.Pick(clock.Now(), 0, nil); b == nb {
					t.Fatal("new work to an unknown backend")
				}
			}
			if tc.serve {
				nb.Acquire()
				nb.Release(clock.Advance(time.Second), OK)
			} else {
				h.ProbeAll(context.Background())
			}
			if s := nb.State(clock.Now()); s != tc.want {
				t.Errorf("state %v, want %v", s, tc.want)
			}
		})
	}
	// Panic: one known backend down by probes, one unknown.
	clock := &admission.ManualClock{}
	p, h, _ := checked(t, clock, HealthConfig{}, down(), down())
	p.Backends()[1].SetUnknown(true)
	h.checks[1].prober = ProberFunc(func(ctx context.Context, _ *Backend) (ProbeResult, error) {
		return ProbeDown, errors.New("first probe not yet answered")
	})
	h.check(p.Backends()[0]) // exists
	for range 3 {
		h.probe(context.Background(), h.checks[0])
	}
	if !p.Panicking() {
		t.Fatal("the only known backend down by probes: no panic")
	}
	for range 20 {
		if b, _, _ := p.Pick(clock.Now(), 0, nil); b == p.Backends()[1] {
			t.Fatal("new work to an unknown backend in panic")
		}
	}
}

// A backend that answered its traffic and then died (the answers stop
// while a probe is in flight) is down after Fall failed probes, as before:
// answers overrule probes only while they keep coming.
func TestServingBackendThatDiesGoesDown(t *testing.T) {
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	pr := up()
	p, h, _ := checked(t, clock, HealthConfig{}, pr, up(), up())
	b := p.Backends()[0]
	ctx := context.Background()
	const step = 500 * time.Millisecond
	dead := false
	failed := 0
	for i := range 40 {
		if i%4 == 0 { // a probe every 2 s, started now
			if i == 8 {
				pr.v.Store(uint32(ProbeDown)) // it dies while this probe is in flight
			}
			h.ProbeAll(ctx)
			if pr.v.Load() == uint32(ProbeDown) {
				failed++
			}
			if b.State(clock.Now()) == Down {
				break
			}
		}
		if i == 8 {
			b.Acquire()
			b.Release(clock.Now()+int64(200*time.Millisecond), OK) // the last answer, after the probe started
			dead = true
		}
		if !dead {
			b.Acquire()
			b.Release(clock.Now(), OK)
		}
		clock.Advance(step)
	}
	if b.State(clock.Now()) != Down || failed != 3 {
		t.Errorf("state %v after %d failed probes, want down after 3", b.State(clock.Now()), failed)
	}
}

// A pool of 4 where 3 fail every probe but answer every request: no
// request refused, and all four keep their share of new work, with the
// default threshold and with panic off (the answers alone keep them up).
func TestPoolOfFourFailingProbesButServing(t *testing.T) {
	for _, panic := range []float64{0, 1} {
		clock := &admission.ManualClock{}
		clock.Set(int64(time.Hour))
		p, h, _ := checked(t, clock, HealthConfig{Panic: panic}, down(), down(), down(), up())
		ctx := context.Background()
		type answer struct {
			b  *Backend
			at int64
		}
		var inflight []answer
		refused, got := 0, map[int]int{}
		for step := range 80 { // 40 s, a request every 500 ms answered 1.5 s later
			now := clock.Now()
			for len(inflight) > 0 && inflight[0].at <= now {
				inflight[0].b.Release(inflight[0].at, OK)
				inflight = inflight[1:]
			}
			if step%4 == 0 {
				h.ProbeAll(ctx)
			}
			b, out, _ := p.Pick(now, 0, nil)
			if out != Picked {
				refused++
			} else {
				b.Acquire()
				got[b.Index()]++
				inflight = append(inflight, answer{b, now + int64(1500*time.Millisecond)})
			}
			clock.Advance(500 * time.Millisecond)
		}
		if refused != 0 || len(got) != 4 || got[0] < 15 {
			t.Errorf("panic %g: %d refused, new work by backend %v; want 0 refused and about 20 each", panic, refused, got)
		}
		if _, down := p.Backends()[0].ProbeDownSince(); !down {
			t.Errorf("panic %g: probes never failed: the test proves nothing", panic)
		}
	}
}

// Drained backends do not dilute the share: two drained by the operator
// and two down by probes alone is a pool emptied by probes, so it panics.
func TestPanicIgnoresDrained(t *testing.T) {
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	p, h, _ := checked(t, clock, HealthConfig{}, up(), up(), down(), down())
	p.Backends()[0].Drain(true)
	p.Backends()[1].Drain(true)
	for range 3 {
		h.ProbeAll(context.Background())
	}
	if !p.Panicking() {
		t.Fatal("2 drained, 2 down by probes: no panic, no backend for new work")
	}
	for range 20 {
		b, out, _ := p.Pick(clock.Now(), 0, nil)
		if out != Picked || b.Drained() {
			t.Fatalf("pick in panic: %v %v, want one of the two probed down", b, out)
		}
	}
}
