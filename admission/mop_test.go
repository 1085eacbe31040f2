package admission

import (
	"math"
	"math/rand"
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
