package admission

import (
	"math"
	"testing"
	"time"
)

// lifeModel is one backend of the lifetime-aware discovery tests.
type lifeModel struct {
	name   string
	cfg    MOPConfig
	model  BackendModel
	demand float64 // offered new work per second
	short  bool    // lifetimes at most a quarter window: the speed targets apply
}

// lifeModels are the backends of issue 24 beside those of mopModels:
// short sessions (the reported 2 s case), a long tail (lognormal σ = 1
// around 5 s), a bimodal mix (90% live 2 s, 10% 50 s), memory per
// session spread ×4, a collected heap (every 7 s), a probe one interval
// late, and sessions of a quarter window.
func lifeModels() []lifeModel {
	const gib = 1 << 30
	w := time.Minute
	cfg := MOPConfig{Name: "sim", MaxHeap: 0.85, Window: w}
	// perSess gives the bytes per session for which rate holds memory at
	// ceiling with sessions living mean on average.
	perSess := func(ceiling, base, rate float64, mean time.Duration) float64 {
		return (ceiling - base) * gib / (rate * mean.Seconds())
	}
	logMean := time.Duration(5 * float64(time.Second) * math.Exp(0.5))
	bimMean := time.Duration(0.9*2e9 + 0.1*50e9)
	return []lifeModel{
		{"short-2s", cfg, BackendModel{MaxBytes: gib, BaseBytes: 100 << 20, BytesPerSession: 1 << 20, Lifetime: 2 * time.Second, Seed: 11}, 300, true},
		{"short-2s-noise", cfg, BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 400, 2*time.Second), Lifetime: 2 * time.Second, Noise: 0.01, Seed: 12}, 1200, true},
		{"quarter-window", cfg, BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 200, w/4), Lifetime: w / 4, Noise: 0.01, Seed: 13}, 600, true},
		{"lognormal", cfg, BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 300, logMean), Lifetime: 5 * time.Second, LogSigma: 1, Noise: 0.01, Seed: 14}, 900, false},
		{"bimodal", cfg, BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 300, bimMean), Lifetime: 2 * time.Second, LongShare: 0.1, LongLifetime: 50 * time.Second, Noise: 0.01, Seed: 15}, 900, false},
		{"bytes-x4", cfg, BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 300, 3*time.Second), Lifetime: 3 * time.Second, BytesSpread: 4, Noise: 0.01, Seed: 16}, 900, true},
		{"gc-7s-short", cfg, BackendModel{MaxBytes: gib, BaseBytes: 0.25 * gib, BytesPerSession: perSess(0.85, 0.25, 400, 3*time.Second) * 0.7, Lifetime: 3 * time.Second,
			GarbagePerSession: 0.3 * perSess(0.85, 0.25, 400, 3*time.Second) * 3 / 7, GCEvery: 7 * time.Second, Noise: 0.005, Seed: 17}, 1200, true},
		{"probe-lag-short", cfg, BackendModel{MaxBytes: gib, BaseBytes: 0.2 * gib, BytesPerSession: perSess(0.85, 0.2, 400, 3*time.Second), Lifetime: 3 * time.Second, ProbeLag: 1, Noise: 0.01, Seed: 18}, 1200, true},
	}
}

// runLife runs cfg against model from a cold start for windows windows,
// with the lifetime estimate (windowOnly false) or without.
func runLife(t *testing.T, cfg MOPConfig, model BackendModel, demand float64, windows int, windowOnly bool) *MOPSim {
	t.Helper()
	cfg.windowOnly = windowOnly
	s, err := NewMOPSim(cfg, model)
	if err != nil {
		t.Fatal(err)
	}
	s.Run(demand, time.Duration(windows)*cfg.Window)
	return s
}

// TestMOPLifetimeModels: against every backend of mopModels and
// lifeModels, from a cold start, with the lifetime estimate, memory never
// passes the ceiling by more than 2 points and discovery never allows
// more than the true safe rate. For lifetimes at most a quarter window,
// refusals while memory is under half the ceiling are at most 10% of
// those of discovery bounded by the window alone (today's), and the rate
// is within 10% of the learned one after at most 1 window. The figures
// are the README's table.
func TestMOPLifetimeModels(t *testing.T) {
	var all []lifeModel
	for _, mc := range mopModels() {
		all = append(all, lifeModel{mc.name, mc.cfg, mc.model, mc.demand, false})
	}
	all = append(all, lifeModels()...)
	for _, mc := range all {
		t.Run(mc.name, func(t *testing.T) {
			today := runLife(t, mc.cfg, mc.model, mc.demand, 8, true)
			s := runLife(t, mc.cfg, mc.model, mc.demand, 8, false)
			ceiling, w := mc.cfg.MaxHeap, mc.cfg.Window
			safe := mc.model.SafeRate(ceiling)
			st := s.MOP.Status()
			t.Logf("| %s | %.0f/s | %.0f/s | **%d** (%d) | **%.3f** (%.3f) of %.2f | **%.2f** (%.2f) | %.0f/s (%.0f/s) | %.1fs / %.1fs, %.0f B |",
				mc.name, safe, mc.demand, s.RefusedLowMemory, today.RefusedLowMemory, s.Peak, today.Peak, ceiling,
				s.Settled(0.1).Seconds()/w.Seconds(), today.Settled(0.1).Seconds()/w.Seconds(), s.MaxAllowedDiscovery, today.MaxAllowedDiscovery,
				st.Lifetime.Seconds(), st.LifetimeHigh.Seconds(), st.BytesPerSession)
			if s.Peak > ceiling+0.02 {
				t.Errorf("peak memory %.3f, want <= %.2f", s.Peak, ceiling+0.02)
			}
			if s.MaxAllowedDiscovery > math.Max(safe, mc.cfg.InitialRate) {
				t.Errorf("discovery allowed %.1f/s, over the safe %.1f/s", s.MaxAllowedDiscovery, safe)
			}
			if !mc.short {
				return
			}
			if lim := today.RefusedLowMemory / 10; s.RefusedLowMemory > lim {
				t.Errorf("refused under half the ceiling: %d, want at most 10%% of today's %d (%d)", s.RefusedLowMemory, today.RefusedLowMemory, lim)
			}
			if got := s.Settled(0.1); got > w {
				t.Errorf("allowed rate within 10%% of its last value after %s, want <= 1 window", got)
			}
		})
	}
}
