package admission

import (
	"math"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// simBackend is a backend whose memory is base + live sessions × bytes per
// session, where a session lives for lifetime after its admission, plus
// uniform noise. Time moves in fixed steps.
type simBackend struct {
	max      float64 // bytes
	base     float64 // bytes
	perSess  float64 // bytes per live session
	lifetime time.Duration
	noise    float64 // ± fraction of max
	rng      *rand.Rand

	step    time.Duration
	ring    []int // admissions per step, newest at head
	head    int
	live    int
	maxSeen float64 // highest memory fraction seen
}

func newSimBackend(safeRate float64, lifetime time.Duration, ceiling float64) *simBackend {
	const maxBytes = 1 << 30
	b := &simBackend{max: maxBytes, base: 0.2 * maxBytes, lifetime: lifetime, noise: 0.01,
		rng: rand.New(rand.NewSource(1)), step: 10 * time.Millisecond}
	// Chosen so that safeRate holds memory exactly at the ceiling.
	b.perSess = (ceiling - 0.2) * maxBytes / (safeRate * lifetime.Seconds())
	b.ring = make([]int, int(4*time.Minute/b.step))
	return b
}

// tick records n admissions in the step just ended and expires sessions
// older than the lifetime.
func (b *simBackend) tick(n int) {
	b.head = (b.head + 1) % len(b.ring)
	b.ring[b.head] = n
	steps := int(b.lifetime / b.step)
	b.live += n - b.ring[(b.head-steps+len(b.ring))%len(b.ring)]
}

// setLifetime changes how long sessions live, from now on and for those
// already live.
func (b *simBackend) setLifetime(d time.Duration) {
	b.lifetime = d
	b.live = 0
	for i := 0; i < int(d/b.step); i++ {
		b.live += b.ring[(b.head-i+len(b.ring))%len(b.ring)]
	}
}

func (b *simBackend) memory() (used, max int64) {
	frac := (b.base+float64(b.live)*b.perSess)/b.max + b.noise*(2*b.rng.Float64()-1)
	b.maxSeen = math.Max(b.maxSeen, frac)
	return int64(frac * b.max), int64(b.max)
}

// drive offers demand requests per second to m for d, probing memory every
// second. It returns the admitted rate per second over the last window.
func drive(m *MOP, b *simBackend, clock *ManualClock, demand float64, d time.Duration) (lastWindowRate float64) {
	perStep := demand * b.step.Seconds()
	steps := int(d / b.step)
	window := int(m.cfg.Window / b.step)
	admittedLastWindow := 0
	carry := 0.0
	for s := 0; s < steps; s++ {
		now := clock.Advance(b.step)
		carry += perStep
		n := 0
		for ; carry >= 1; carry-- {
			if m.Allow(now) {
				n++
			}
		}
		b.tick(n)
		if s >= steps-window {
			admittedLastWindow += n
		}
		if s%int(time.Second/b.step) == 0 {
			used, max := b.memory()
			m.Observe(now, used, max)
		}
	}
	return float64(admittedLastWindow) / m.cfg.Window.Seconds()
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

// TestMOPDiscovery: from a cold start MOP comes within 10% of the true safe
// rate in at most 10 averaging windows, and memory never passes the
// ceiling by more than 5 points.
func TestMOPDiscovery(t *testing.T) {
	for _, safe := range []float64{50, 200, 1000} {
		t.Run("", func(t *testing.T) {
			const ceiling = 0.85
			window := time.Minute
			b := newSimBackend(safe, window, ceiling)
			var clock ManualClock
			m, err := NewMOP(MOPConfig{Name: "sim", MaxHeap: ceiling, Window: window, InitialRate: 10})
			if err != nil {
				t.Fatal(err)
			}
			drive(m, b, &clock, 3*safe, 10*window)
			st := m.Status()
			if st.Phase != Learned {
				t.Errorf("safe %.0f/s: phase %v after 10 windows, want learned", safe, st.Phase)
			}
			if !within(st.AllowedRate, safe, 0.10) || !within(st.LearnedRate, safe, 0.10) {
				t.Errorf("safe %.0f/s: allowed %.1f/s learned %.1f/s, want within 10%%", safe, st.AllowedRate, st.LearnedRate)
			}
			if b.maxSeen > ceiling+0.05 {
				t.Errorf("safe %.0f/s: memory reached %.3f, want <= %.2f", safe, b.maxSeen, ceiling+0.05)
			}
		})
	}
}

// TestMOPImport: after Import, the learned rate is admitted from the first
// window on.
func TestMOPImport(t *testing.T) {
	const safe, ceiling = 200.0, 0.85
	window := time.Minute
	b := newSimBackend(safe, window, ceiling)
	var clock ManualClock
	m, _ := NewMOP(MOPConfig{Name: "sim", MaxHeap: ceiling, Window: window})
	drive(m, b, &clock, 3*safe, 10*window)
	saved := m.Export()
	if saved.Phase != Learned || saved.LearnedRate <= 0 {
		t.Fatalf("exported %+v, want a learned state", saved)
	}

	restarted, _ := NewMOP(MOPConfig{Name: "sim", MaxHeap: ceiling, Window: window})
	if err := restarted.Import(saved); err != nil {
		t.Fatal(err)
	}
	b2 := newSimBackend(safe, window, ceiling)
	var clock2 ManualClock
	got := drive(restarted, b2, &clock2, 3*safe, window)
	if !within(got, saved.LearnedRate, 0.05) {
		t.Errorf("first window after import admitted %.1f/s, want the learned %.1f/s", got, saved.LearnedRate)
	}
	if st := restarted.Status(); st.Phase != Learned {
		t.Errorf("phase after import: %v", st.Phase)
	}
	if err := restarted.Import(MOPState{}); err == nil {
		t.Error("import of an empty state succeeded")
	}
	if err := restarted.Import(MOPState{LearnedRate: 10, AllowedRate: 10, Slope: math.NaN()}); err == nil {
		t.Error("import of a NaN state succeeded")
	}
}

// TestMOPLifetimeDoubles: when sessions live twice as long, the learned
// rate halves (within 10%) in at most 5 windows.
func TestMOPLifetimeDoubles(t *testing.T) {
	const safe, ceiling = 200.0, 0.85
	window := time.Minute
	b := newSimBackend(safe, window, ceiling)
	var clock ManualClock
	m, _ := NewMOP(MOPConfig{Name: "sim", MaxHeap: ceiling, Window: window})
	drive(m, b, &clock, 3*safe, 10*window)
	b.setLifetime(2 * b.lifetime)
	drive(m, b, &clock, 3*safe, 5*window)
	st := m.Status()
	if !within(st.LearnedRate, safe/2, 0.10) || !within(st.AllowedRate, safe/2, 0.10) {
		t.Errorf("after the lifetime doubled: learned %.1f/s allowed %.1f/s, want %.0f ±10%%", st.LearnedRate, st.AllowedRate, safe/2)
	}
}

// TestMOPCreepsUp: a learned rate that is too low creeps up while demand is
// refused and memory stays well under the ceiling.
func TestMOPCreepsUp(t *testing.T) {
	const safe, ceiling = 200.0, 0.85
	window := time.Minute
	b := newSimBackend(safe, window, ceiling)
	var clock ManualClock
	m, _ := NewMOP(MOPConfig{Name: "sim", MaxHeap: ceiling, Window: window})
	if err := m.Import(MOPState{Phase: Learned, LearnedRate: 100, AllowedRate: 100, Base: 0.2, Slope: (ceiling - 0.2) / safe}); err != nil {
		t.Fatal(err)
	}
	drive(m, b, &clock, 3*safe, 10*window)
	if st := m.Status(); !within(st.AllowedRate, safe, 0.10) {
		t.Errorf("allowed %.1f/s after 10 windows, want %.0f ±10%%", st.AllowedRate, safe)
	}
}

func TestMOPGCRA(t *testing.T) {
	m, _ := NewMOP(MOPConfig{Name: "g", InitialRate: 10, Burst: time.Nanosecond})
	// 10/s: one every 100ms; the tolerance is one emission interval.
	got := 0
	for ms := int64(0); ms < 1000; ms++ {
		if m.Allow(ms * int64(time.Millisecond)) {
			got++
		}
	}
	if got < 10 || got > 11 {
		t.Errorf("admitted %d in one second at 10/s", got)
	}
	if m.Headroom(int64(time.Second)) > 1 {
		t.Errorf("headroom %.2f right after the rate was used", m.Headroom(int64(time.Second)))
	}
	var nilMOP *MOP
	if !nilMOP.Allow(0) {
		t.Error("a nil MOP refused")
	}
}

func TestMOPAllocs(t *testing.T) {
	m, _ := NewMOP(MOPConfig{Name: "a", InitialRate: 1e9})
	now := int64(0)
	if n := testing.AllocsPerRun(1000, func() { now += 1000; m.Allow(now) }); n != 0 {
		t.Errorf("Allow allocates %v per call, want 0", n)
	}
}

func TestMOPConfigValidate(t *testing.T) {
	for _, c := range []MOPConfig{{MaxHeap: 1.2}, {Window: -1}, {InitialRate: -1}} {
		if _, err := NewMOP(c); err == nil {
			t.Errorf("NewMOP(%+v) accepted", c)
		}
	}
}

// mopModel is one simulated backend of the discovery tests.
type mopModel struct {
	name   string
	cfg    MOPConfig
	model  BackendModel
	demand float64 // offered new work per second
}

// mopModels are the backends discovery must handle: sessions that live
// exactly one window, lifetimes with jitter, a garbage-collected heap, a
// probe one interval late, and the case reported by users (ceiling 0.50,
// safe rate about 206/s).
func mopModels() []mopModel {
	const gib = 1 << 30
	w := time.Minute
	// perSess gives the bytes per session for which rate holds memory at
	// ceiling with sessions living life.
	perSess := func(ceiling, base, rate float64, life time.Duration) float64 {
		return (ceiling - base) * gib / (rate * life.Seconds())
	}
	return []mopModel{
		{"one-window", MOPConfig{Name: "sim", MaxHeap: 0.85, Window: w},
			BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 200, w), Lifetime: w, Noise: 0.01, Seed: 1}, 600},
		{"jitter", MOPConfig{Name: "sim", MaxHeap: 0.85, Window: w},
			BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 200, 45*time.Second), Lifetime: 45 * time.Second, Jitter: 0.3, Noise: 0.01, Seed: 2}, 600},
		{"gc-sawtooth", MOPConfig{Name: "sim", MaxHeap: 0.85, Window: w},
			BackendModel{MaxBytes: gib, BaseBytes: 0.25 * gib, BytesPerSession: perSess(0.85, 0.25, 300, w/2), Lifetime: w / 2,
				GarbagePerSession: 0.5 * perSess(0.85, 0.25, 300, w/2), GCEvery: 7 * time.Second, Noise: 0.005, Seed: 3}, 900},
		{"probe-lag", MOPConfig{Name: "sim", MaxHeap: 0.85, Window: w},
			BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 1000, w), Lifetime: w, ProbeLag: 1, Noise: 0.01, Seed: 4}, 3000},
		{"reported", MOPConfig{Name: "sim", MaxHeap: 0.50, Window: 30 * time.Second, InitialRate: 20},
			BackendModel{MaxBytes: 512 << 20, BaseBytes: 0.1 * (512 << 20), BytesPerSession: perSess(0.50, 0.1, 206, 30*time.Second) / 2, Lifetime: 30 * time.Second, Noise: 0.005, Seed: 5}, 600},
		{"demo", MOPConfig{Name: "sim", MaxHeap: 0.85, Window: 30 * time.Second, InitialRate: 5},
			BackendModel{MaxBytes: 64 << 20, BaseBytes: 0.002 * (64 << 20), BytesPerSession: 64 << 10 / 40, Lifetime: 30 * time.Second, Noise: 0.001, Seed: 6}, 10},
	}
}

// TestMOPDiscoveryModels: against each backend of mopModels, from a cold
// start, discovery never lets memory pass the ceiling by more than 2
// points, never allows more than the backend's true safe rate while
// discovering, reaches its learned rate (within 10%) in at most 3
// windows, ends within 10% under the true safe rate, and refuses less new
// work while memory is under half the ceiling than the baseline that
// doubles the rate per window. The figures are the README's table.
func TestMOPDiscoveryModels(t *testing.T) {
	for _, mc := range mopModels() {
		t.Run(mc.name, func(t *testing.T) {
			run := func(doubling bool) *MOPSim {
				cfg := mc.cfg
				cfg.doubling = doubling
				s, err := NewMOPSim(cfg, mc.model)
				if err != nil {
					t.Fatal(err)
				}
				s.Run(mc.demand, 8*cfg.Window)
				return s
			}
			base, s := run(true), run(false)
			ceiling, w := mc.cfg.MaxHeap, mc.cfg.Window
			safe := mc.model.SafeRate(ceiling)
			t.Logf("%s: safe %.0f/s; refused under half the ceiling %d (baseline %d), in discovery %d (baseline %d); peak %.3f (baseline %.3f); within 10%% after %.2f windows (baseline %.2f); highest rate allowed in discovery %.0f/s (baseline %.0f/s)",
				mc.name, safe, s.RefusedLowMemory, base.RefusedLowMemory, s.RefusedDiscovery, base.RefusedDiscovery, s.Peak, base.Peak,
				s.Settled(0.1).Seconds()/w.Seconds(), base.Settled(0.1).Seconds()/w.Seconds(), s.MaxAllowedDiscovery, base.MaxAllowedDiscovery)
			if s.Peak > ceiling+0.02 {
				t.Errorf("peak memory %.3f, want <= %.2f", s.Peak, ceiling+0.02)
			}
			if s.MaxAllowedDiscovery > math.Max(safe, mc.cfg.InitialRate) {
				t.Errorf("discovery allowed %.1f/s, over the safe %.1f/s", s.MaxAllowedDiscovery, safe)
			}
			if got := s.Settled(0.1); got > 3*w {
				t.Errorf("allowed rate within 10%% of its last value after %s, want <= 3 windows (%s)", got, 3*w)
			}
			final := s.MOP.Status().AllowedRate
			if mc.demand > safe && (final > 1.02*safe || final < 0.9*safe) {
				t.Errorf("final allowed %.1f/s, want within 10%% under the safe %.1f/s", final, safe)
			}
			if mc.demand < safe && s.Refused > int(2*mc.demand) {
				t.Errorf("demand %.0f/s under the safe rate: %d refused, want at most 2 seconds' worth", mc.demand, s.Refused)
			}
			if s.RefusedLowMemory >= base.RefusedLowMemory {
				t.Errorf("refused under half the ceiling: %d, baseline %d; want fewer", s.RefusedLowMemory, base.RefusedLowMemory)
			}
		})
	}
}

// TestMOPDiscoverySweep runs discovery against many backends (lifetimes
// from a quarter window to a window, jitter, noise, a late probe, a
// collected heap, demand 1.5 to 5 times the safe rate, bases up to half
// the ceiling): memory never passes the ceiling by more than 2 points.
func TestMOPDiscoverySweep(t *testing.T) {
	if testing.Short() {
		t.Skip("sweep of 36 simulations")
	}
	const gib = 1 << 30
	w := time.Minute
	rng := rand.New(rand.NewSource(7))
	worst := 0.0
	for i := 0; i < 36; i++ {
		ceiling := []float64{0.5, 0.7, 0.85}[i%3]
		base := rng.Float64() * 0.5 * ceiling
		life := time.Duration(float64(w) * (0.25 + 0.75*rng.Float64()))
		safe := 20 + 280*rng.Float64()
		bm := BackendModel{MaxBytes: gib, BaseBytes: base * gib, Lifetime: life, Jitter: 0.3 * rng.Float64(),
			Noise: 0.01 * rng.Float64(), ProbeLag: i % 2, Seed: int64(i)}
		bm.BytesPerSession = (ceiling - base) * gib / (safe * life.Seconds())
		if i%4 < 2 {
			bm.GCEvery = time.Duration(2+rng.Intn(8)) * time.Second
			bm.GarbagePerSession = 0.2 * bm.BytesPerSession * life.Seconds() / bm.GCEvery.Seconds()
		}
		s, err := NewMOPSim(MOPConfig{Name: "sweep", MaxHeap: ceiling, Window: w}, bm)
		if err != nil {
			t.Fatal(err)
		}
		demand := (1.5 + 3.5*rng.Float64()) * bm.SafeRate(ceiling)
		s.Run(demand, 6*w)
		worst = math.Max(worst, s.Peak-ceiling)
		if s.Peak > ceiling+0.02 {
			t.Errorf("run %d %+v at %.0f/s: peak %.3f over the ceiling %.2f by more than 2 points", i, bm, demand, s.Peak, ceiling)
		}
	}
	t.Logf("worst peak over the ceiling: %+.3f", worst)
}

// TestSimBackend checks the simulated backend itself: memory at a steady
// rate is base + rate × lifetime × bytes; garbage leaves only at a
// collection; a lagging probe reports the previous reading.
func TestSimBackend(t *testing.T) {
	m := BackendModel{MaxBytes: 1000, BaseBytes: 100, BytesPerSession: 1, Lifetime: time.Second}
	b, err := NewSimBackend(m, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		b.Advance(2) // 200 per second, each held one second
	}
	if got, want := b.Used(), (100+200.0)/1000; math.Abs(got-want) > 1e-9 {
		t.Errorf("steady memory %.4f, want %.4f", got, want)
	}

	m.GCEvery, m.GarbagePerSession = 500*time.Millisecond, 1
	b, _ = NewSimBackend(m, 10*time.Millisecond)
	prev := 0.0
	drops := 0
	for i := 1; i <= 300; i++ {
		u := b.Advance(2)
		if u < prev {
			drops++
			if i%50 != 0 {
				t.Errorf("step %d: memory fell from %.3f to %.3f between collections", i, prev, u)
			}
		}
		prev = u
	}
	if drops < 4 {
		t.Errorf("%d collections seen in 3s at one per 500ms", drops)
	}

	m = BackendModel{MaxBytes: 1000, BaseBytes: 100, BytesPerSession: 1, Lifetime: time.Hour, ProbeLag: 1}
	b, _ = NewSimBackend(m, 10*time.Millisecond)
	b.Advance(100)
	if used, _ := b.Probe(); used != 200 {
		t.Errorf("first reading %d, want the memory now (200)", used)
	}
	b.Advance(100)
	if used, _ := b.Probe(); used != 200 {
		t.Errorf("lagging reading %d, want the previous one (200)", used)
	}

	b.SetLifetime(2 * time.Hour) // the ring grows and keeps what is scheduled
	if b.live != 200 || b.Used() != 0.3 {
		t.Errorf("after SetLifetime: %d live, memory %.3f; want 200 and 0.300", b.live, b.Used())
	}
}

func TestParseMOPSimSpec(t *testing.T) {
	s, err := ParseMOPSimSpec("base=10%,bytes=64KiB,lifetime=30s,max-heap=1GiB,rate=300,gc=5s,garbage=4k,lag=1,ceiling=0.5,window=30s,windows=4")
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseMOPSimSpec("base=10%,bytes=64KiB,lifetime=2s,max-heap=1GiB,rate=300,sigma=1,long=50s,long-share=0.1,spread=4")
	if err != nil {
		t.Fatal(err)
	}
	if d.Model.LogSigma != 1 || d.Model.LongLifetime != 50*time.Second || d.Model.LongShare != 0.1 || d.Model.BytesSpread != 4 {
		t.Errorf("parsed %+v", d.Model)
	}
	if s.Model.BaseBytes != 0.1*(1<<30) || s.Model.BytesPerSession != 64<<10 || s.Model.Lifetime != 30*time.Second ||
		s.Model.MaxBytes != 1<<30 || s.Rate != 300 || s.Model.GCEvery != 5*time.Second || s.Model.GarbagePerSession != 4096 ||
		s.Model.ProbeLag != 1 || s.MOP.MaxHeap != 0.5 || s.MOP.Window != 30*time.Second || s.Windows != 4 || s.MOP.InitialRate != 10 {
		t.Errorf("parsed %+v", s)
	}
	for _, tc := range []struct{ spec, key string }{
		{"bytes=1k,lifetime=1s,max-heap=1g,rate=1", "base"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g", "rate"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=-3", "rate"},
		{"base=1m,bytes=1q,lifetime=1s,max-heap=1g,rate=1", "bytes"},
		{"base=1m,bytes=1k,lifetime=soon,max-heap=1g,rate=1", "lifetime"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,ceiling=1.5", "max-heap"},
		{"base=120%,bytes=1k,lifetime=1s,max-heap=1g,rate=1", "base"},
		{"base=900m,bytes=1k,lifetime=1s,max-heap=1g,rate=1", "base"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,colour=red", "colour"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,rate=2", "rate"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,jitter=1", "jitter"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,windows=0", "windows"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,sigma=4", "sigma"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,long-share=0.1", "long-share"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,long=50s,long-share=1", "long-share"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,spread=0.5", "spread"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,long=soon", "long"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,deploy=1m", "deploy-bytes"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,deploy-bytes=2k", "deploy"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,deploy=-1m,deploy-bytes=2k", "deploy=-1m"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,deploy=1m,deploy-bytes=0", "deploy-bytes=0"},
		{"base=1m,bytes=1k,lifetime=1s,max-heap=1g,rate=1,deploy=6m,deploy-bytes=2k", "deploy=6m0s"},
	} {
		if _, err := ParseMOPSimSpec(tc.spec); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%q: error %v, want one naming %s", tc.spec, err, tc.key)
		}
	}
}

func TestRunMOPSimTable(t *testing.T) {
	spec, err := ParseMOPSimSpec("base=10%,bytes=1MiB,lifetime=30s,max-heap=512MiB,rate=30,window=30s,windows=3")
	if err != nil {
		t.Fatal(err)
	}
	r, err := RunMOPSim(spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Windows) != 3 {
		t.Fatalf("%d windows, want 3", len(r.Windows))
	}
	var out strings.Builder
	if err := r.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"allowed/s", "admitted", "refused", "memory", "peak memory", "safe rate at the ceiling", "lifetime", "p95", "bytes/session", "predicted"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if r.Windows[2].Admitted+r.Windows[2].Refused != 900 {
		t.Errorf("window 3 offered %d, want 900 (30/s for 30s)", r.Windows[2].Admitted+r.Windows[2].Refused)
	}
}

// TestMOPDiscoveryKeepsRateAcrossPause: demand that discovery has grown
// to, stopped for two windows and offered again, is admitted again
// without refusals: the bound proven by the first burst stands (only
// memory over the ceiling withdraws it), while the trailing admitted rate
// of the pause proves nothing.
func TestMOPDiscoveryKeepsRateAcrossPause(t *testing.T) {
	w := 30 * time.Second
	model := BackendModel{MaxBytes: 64 << 20, BaseBytes: 0.002 * (64 << 20), BytesPerSession: 64 << 10, Lifetime: 10 * time.Second, Noise: 0.001, Seed: 7}
	s, err := NewMOPSim(MOPConfig{Name: "sim", MaxHeap: 0.85, Window: w, InitialRate: 5}, model)
	if err != nil {
		t.Fatal(err)
	}
	s.Run(20, 20*time.Second) // grows from 5/s to cover 20/s
	if st := s.MOP.Status(); st.Phase != Discovery || st.AllowedRate < 20 {
		t.Fatalf("after the first burst: %+v, want discovery allowing >= 20/s", st)
	}
	s.Run(0, 2*w)
	before := s.Refused
	s.Run(20, 20*time.Second)
	if got := s.Refused - before; got != 0 {
		t.Fatalf("second burst after a pause: %d refused, want 0 (allowed %.1f/s)", got, s.MOP.Status().AllowedRate)
	}
	if s.Peak > 0.85 {
		t.Fatalf("peak memory %.3f over the ceiling", s.Peak)
	}
}

// TestMOPBurstAbsorbsJitter: Poisson arrivals at half the allowed rate
// are never refused with the default one-second tolerance; with 100 ms
// some are (why the default is a second).
func TestMOPBurstAbsorbsJitter(t *testing.T) {
	refusals := func(burst time.Duration) int {
		m, err := NewMOP(MOPConfig{Name: "jitter", InitialRate: 20, Burst: burst})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewSource(2))
		now, refused := int64(time.Hour), 0
		for range 1200 { // 120 s at 10/s
			now += int64(rng.ExpFloat64() / 10 * float64(time.Second))
			if !m.Allow(now) {
				refused++
			}
		}
		return refused
	}
	if got := refusals(0); got != 0 {
		t.Errorf("default tolerance: %d of 1200 refused, want 0", got)
	}
	if got := refusals(100 * time.Millisecond); got == 0 {
		t.Errorf("100 ms tolerance: none refused; the case for one second is gone")
	}
}

// TestMOPDiscoveryLongLivedSessions: sessions admitted in a first burst
// that affinity traffic then keeps alive past the window (sticky
// sessions, long dialogs) fill half the backend; after a pause, new work
// that lives one window arrives at three times what is left. The rate
// proven by the burst (when all memory looked like new work) must not be
// used on top of the memory the kept sessions still hold: memory stays
// within 2 points of the ceiling. Before the bound took the room left now
// into account it peaked at 1.12 after a 20 s pause and 1.04 after 40 s
// (0.82 with it).
// Straight after the burst nothing yet shows that its sessions will
// outlive the window (the operator's promise that -mop-window breaks
// here), so memory passes the ceiling and the cut brings it back: only
// the settled state is asserted then (peak 1.14, 1.17 before).
func TestMOPDiscoveryLongLivedSessions(t *testing.T) {
	for _, tc := range []struct {
		name string
		idle time.Duration
		peak float64 // highest memory allowed; 0: not asserted
	}{
		{"straight on", 0, 0},
		{"after a pause", 20 * time.Second, 0.87},
		{"after a window", 40 * time.Second, 0.87},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := 30 * time.Second
			model := BackendModel{MaxBytes: 64 << 20, BytesPerSession: 64 << 10, Lifetime: time.Hour, Noise: 0.001, Seed: 3}
			s, err := NewMOPSim(MOPConfig{Name: "sim", MaxHeap: 0.85, Window: w, InitialRate: 5}, model)
			if err != nil {
				t.Fatal(err)
			}
			s.Run(80, 20*time.Second) // kept alive for the rest of the run
			kept := s.Backend.Used()
			if kept < 0.4 {
				t.Fatalf("the burst left %.2f of memory, want the kept sessions to hold at least 0.40", kept)
			}
			s.Backend.SetLifetime(w)
			s.Run(0, tc.idle)
			safe := (0.85 - kept) * (64 << 20) / (64 << 10) / w.Seconds()
			wins := s.Run(3*safe, 6*w)
			if tc.peak > 0 && s.Peak > tc.peak {
				t.Errorf("peak memory %.3f with %.2f held by kept sessions, want at most %.2f (safe rate %.1f/s, allowed now %.1f/s)",
					s.Peak, kept, tc.peak, safe, s.MOP.Status().AllowedRate)
			}
			if last := wins[len(wins)-1]; last.PeakMem > 0.87 {
				t.Errorf("memory peaked at %.3f in the last window, want at most 0.87", last.PeakMem)
			}
			if got := s.MOP.Status().AllowedRate; got < 0.7*safe || got > 1.1*safe {
				t.Errorf("allowed rate %.1f/s after six windows, want within [0.7, 1.1] of the safe rate %.1f/s", got, safe)
			}
		})
	}
}
