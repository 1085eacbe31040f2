package admission

import (
	"errors"
	"math"
	"testing"
	"time"
)

// learnedAt returns a MOP in Learned at rate with a model whose base is
// high (0.8 of a 0.85 ceiling): memory barely depends on the rate there, so
// the model answers a sample at the ceiling with a deep cut.
func learnedAt(t *testing.T, rate float64) *MOP {
	t.Helper()
	m, err := NewMOP(MOPConfig{Name: "b", Window: time.Minute, MaxHeap: 0.85})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Import(MOPState{Phase: Learned, LearnedRate: rate, AllowedRate: rate, Base: 0.8, Slope: 0.05 / rate}); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMOPOneSampleCutBounded: one sample at max memory, under a model
// that would cut the rate to a quarter, cuts it only to half, and the
// state is provisional (not persisted) until a second sample over the
// ceiling confirms it.
func TestMOPOneSampleCutBounded(t *testing.T) {
	const rate = 100.0
	m := learnedAt(t, rate)
	var clock ManualClock
	sample := func(frac float64) {
		t.Helper()
		if err := m.Observe(clock.Advance(time.Second), int64(frac*1e9), 1e9); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		sample(0.82)
	}
	sample(1.0) // the model says 100 × 0.05/0.2 × 0.97 = 24/s
	st := m.Status()
	if st.AllowedRate < rate/2 || st.LearnedRate < rate/2 {
		t.Fatalf("one sample took allowed %.1f/s learned %.1f/s under half of %.0f/s", st.AllowedRate, st.LearnedRate, rate)
	}
	if st.AllowedRate >= rate {
		t.Fatalf("allowed %.1f/s: memory over the ceiling did not cut", st.AllowedRate)
	}
	ex := m.Export()
	if !ex.Provisional {
		t.Fatalf("export after one sample over the ceiling %+v: want provisional", ex)
	}
	sample(0.80) // back under the ceiling: still one sample of evidence
	if ex := m.Export(); !ex.Provisional {
		t.Fatalf("export after a sample under the ceiling %+v: want provisional", ex)
	}
	// Further samples in the same window do not cut under the floor either.
	for range 5 {
		sample(1.0)
	}
	if st := m.Status(); st.AllowedRate < rate/2 {
		t.Fatalf("allowed %.1f/s within the window, under half of %.0f/s", st.AllowedRate, rate)
	}
	if ex := m.Export(); ex.Provisional {
		t.Fatalf("export after a second sample over the ceiling %+v: want confirmed", ex)
	}
}

// TestMOPImpossibleSample: a sample that cannot be true is a failed probe:
// no learning, memory unknown, counted.
func TestMOPImpossibleSample(t *testing.T) {
	m := learnedAt(t, 100)
	var clock ManualClock
	if err := m.Observe(clock.Advance(time.Second), 500, 1000); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ used, max int64 }{{-1, 1000}, {10, 0}, {2e18, 4e18}, {1, -5}} {
		err := m.Observe(clock.Advance(time.Second), c.used, c.max)
		if !errors.Is(err, ErrBadMemorySample) {
			t.Errorf("Observe(%d, %d) = %v, want ErrBadMemorySample", c.used, c.max, err)
		}
	}
	st := m.Status()
	if st.MemoryKnown || st.ProbeError == "" || st.ProbeFailures != 4 || st.AllowedRate != 100 {
		t.Errorf("after impossible samples %+v: want memory unknown, an error, 4 failures, the rate untouched", st)
	}
	m.Observe(clock.Advance(time.Second), 500, 1000)
	if st := m.Status(); !st.MemoryKnown || st.ProbeError != "" || st.MemoryFraction != 0.5 {
		t.Errorf("after a good sample %+v: want memory known at 0.5, no error", st)
	}
}

func TestCheckMemorySample(t *testing.T) {
	for _, c := range []struct {
		used, max float64
		ok        bool
	}{
		{0, 1, true}, {50, 100, true}, {102, 100, true}, {1e18, 1e18, true},
		{math.NaN(), 100, false}, {math.Inf(1), 100, false}, {-1, 100, false},
		{1, math.NaN(), false}, {1, math.Inf(1), false}, {1, 0, false},
		{1e30, 1e30, false}, {103, 100, false},
	} {
		if err := CheckMemorySample(c.used, c.max); (err == nil) != c.ok {
			t.Errorf("CheckMemorySample(%g, %g) = %v, want ok %v", c.used, c.max, err, c.ok)
		}
	}
}

// TestMOPDiscoveryOneSampleAtMostDoubles: a sample showing almost no
// memory, under a flood, at most doubles the allowed rate.
func TestMOPDiscoveryOneSampleAtMostDoubles(t *testing.T) {
	m, err := NewMOP(MOPConfig{Name: "b", Window: time.Minute, InitialRate: 10})
	if err != nil {
		t.Fatal(err)
	}
	var clock ManualClock
	const max = 1 << 30
	for s := range 5 {
		// 10 000 requests a second offered, in 1 ms steps.
		for range 1000 {
			now := clock.Advance(time.Millisecond)
			for range 10 {
				m.Allow(now)
			}
		}
		before := m.Status().AllowedRate
		if err := m.Observe(clock.Now(), 1, max); err != nil { // 1 byte used
			t.Fatal(err)
		}
		if after := m.Status().AllowedRate; after > 2*before {
			t.Fatalf("sample %d moved the allowed rate from %.1f/s to %.1f/s", s, before, after)
		}
	}
}

// TestMOPImportRange: a stored rate outside [MinRate, MaxMOPRate] is
// refused and changes nothing.
func TestMOPImportRange(t *testing.T) {
	m, _ := NewMOP(MOPConfig{Name: "b", InitialRate: 10})
	for _, st := range []MOPState{
		{Phase: Learned, LearnedRate: 1e12, AllowedRate: 1e12},
		{Phase: Learned, LearnedRate: 0.01, AllowedRate: 0.01},
		{Phase: Discovery, AllowedRate: 2e6},
		{Phase: Learned, LearnedRate: 50, AllowedRate: 50, Slope: math.Inf(1)},
	} {
		if err := m.Import(st); err == nil {
			t.Errorf("Import(%+v) accepted", st)
		}
	}
	if st := m.Status(); st.AllowedRate != 10 || st.Phase != Discovery {
		t.Errorf("after refused imports %+v: want discovery at 10/s", st)
	}
	if err := m.Import(MOPState{Phase: Learned, LearnedRate: MaxMOPRate, AllowedRate: MaxMOPRate}); err != nil {
		t.Errorf("Import at MaxMOPRate: %v", err)
	}
}

// TestMOPDiscoveryCutProvisional: discovery ended by one sample over the
// ceiling is provisional too: what is persisted stays the discovery state
// until a second sample confirms the cut.
func TestMOPDiscoveryCutProvisional(t *testing.T) {
	m, err := NewMOP(MOPConfig{Name: "b", Window: time.Minute, InitialRate: 10, MaxHeap: 0.85})
	if err != nil {
		t.Fatal(err)
	}
	var clock ManualClock
	for range 5 {
		for range 1000 {
			now := clock.Advance(time.Millisecond)
			m.Allow(now)
			m.Allow(now)
		}
		m.Observe(clock.Now(), 30, 100)
	}
	m.Observe(clock.Advance(time.Second), 100, 100)
	if st := m.Status(); st.Phase != Learned {
		t.Fatalf("after memory at max: %+v, want learned", st)
	}
	if ex := m.Export(); !ex.Provisional {
		t.Fatalf("export after one sample ended discovery %+v: want provisional", ex)
	}
	m.Observe(clock.Advance(time.Second), 90, 100)
	if ex := m.Export(); ex.Provisional {
		t.Fatalf("export after a second sample over the ceiling %+v: want confirmed", ex)
	}
}

// noisy is memory m with a point of noise, as a real heap has.
func noisy(m float64, i int) float64 { return m + 0.01*float64(i%2) }

// TestMOPAdaptOneSampleProvisional: in the learned phase, a window whose
// peak is one sample lowers the rate (at most by half) but provisionally:
// windows after it at the old memory do not confirm it; windows whose own
// samples say the old rate was too high do.
func TestMOPAdaptOneSampleProvisional(t *testing.T) {
	for _, tc := range []struct {
		name        string
		spikeWindow func(late bool, i int) float64 // memory of sample i of window 4 (late: last quarter)
		after       func(late bool, i int) float64 // and of the windows after it
		confirmed   bool
	}{
		{"one sample", func(late bool, i int) float64 {
			if late && i == 50 {
				return 0.55
			}
			return noisy(0.40, i)
		}, func(_ bool, i int) float64 { return noisy(0.40, i) }, false},
		{"every sample", func(_ bool, i int) float64 { return noisy(0.55, i) }, func(_ bool, i int) float64 { return noisy(0.55, i) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMOP(MOPConfig{Name: "b", Window: time.Minute, MaxHeap: 0.85})
			if err != nil {
				t.Fatal(err)
			}
			// Safe at 0.40 memory: 0.65 / ((0.40-0.2)/40) × 0.97 = 126/s.
			if err := m.Import(MOPState{Phase: Learned, LearnedRate: 100, AllowedRate: 100, Base: 0.2, Slope: 0.2 / 40}); err != nil {
				t.Fatal(err)
			}
			var clock ManualClock
			window := func(mem func(late bool, i int) float64) {
				for i := range 60 {
					for range 40 { // 40 new requests a second, under the allowed 100
						m.Allow(clock.Advance(25 * time.Millisecond))
					}
					m.Observe(clock.Now(), int64(1000*mem(i >= 45, i)), 1000)
				}
			}
			normal := func(_ bool, i int) float64 { return noisy(0.40, i) }
			for range 3 {
				window(normal)
			}
			if st := m.Status(); st.LearnedRate != 100 {
				t.Fatalf("learned %v after steady windows at 0.40, want 100", st.LearnedRate)
			}
			window(tc.spikeWindow)
			window(tc.after) // window 4 is judged at its first sample
			window(tc.after)
			st, ex := m.Status(), m.Export()
			if st.LearnedRate >= 100 || st.LearnedRate < 50 {
				t.Fatalf("learned %v: want lowered, at most by half", st.LearnedRate)
			}
			if ex.Provisional == tc.confirmed {
				t.Errorf("export %+v: want provisional %v", ex, !tc.confirmed)
			}
		})
	}
}
