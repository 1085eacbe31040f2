package admission

import (
	"math"
	"os"
	"sort"
	"testing"
	"time"
)

// TestMOPWideSweep is the README's wide sweep: 2 016 backends (ceilings
// 0.5 and 0.85; bases 5% to 70% of the ceiling; lifetimes 2 s, 5 s and a
// quarter to a whole window; with and without jitter; ±1% noise, a probe
// one interval late, or a sawtooth of 30% garbage collected every 7 s;
// demand 1.5 to 10 times the safe rate), 6 windows each from a cold
// start. Memory never passes the ceiling by more than 2 points, and no
// change point is found (none has a deploy). It takes
// minutes: it runs only with MOP_WIDE_SWEEP=1.
func TestMOPWideSweep(t *testing.T) {
	if os.Getenv("MOP_WIDE_SWEEP") == "" {
		t.Skip("set MOP_WIDE_SWEEP=1 to run the 2 016 simulations")
	}
	const gib = 1 << 30
	w := time.Minute
	lives := []time.Duration{2 * time.Second, 5 * time.Second, w / 4, w / 2, 3 * w / 4, w}
	worst, runs, over := -1.0, 0, 0
	var settle []float64
	slowShort, shifts := 0, 0
	for _, ceiling := range []float64{0.5, 0.85} {
		for _, bf := range []float64{0.05, 0.15, 0.25, 0.35, 0.5, 0.6, 0.7} {
			for _, life := range lives {
				for _, jitter := range []float64{0, 0.3} {
					for variant := range 3 {
						for _, mult := range []float64{1.5, 3, 5, 10} {
							base := bf * ceiling
							safe := 100.0
							bm := BackendModel{MaxBytes: gib, BaseBytes: base * gib, Lifetime: life, Jitter: jitter, Noise: 0.01, Seed: int64(runs)}
							per := (ceiling - base) * gib / (safe * life.Seconds())
							switch variant {
							case 1:
								bm.ProbeLag = 1
							case 2:
								bm.GCEvery = 7 * time.Second
								bm.BytesPerSession = 0.7 * per
								bm.GarbagePerSession = 0.3 * per * life.Seconds() / bm.GCEvery.Seconds()
								bm.Noise = 0.005
							}
							if bm.BytesPerSession == 0 {
								bm.BytesPerSession = per
							}
							s, err := NewMOPSim(MOPConfig{Name: "sweep", MaxHeap: ceiling, Window: w}, bm)
							if err != nil {
								t.Fatal(err)
							}
							s.Run(mult*bm.SafeRate(ceiling), 6*w)
							runs++
							if at := s.MOP.l.shift.at; at != 0 {
								shifts++ // a change point where there was no deploy
								t.Errorf("change point at %s without a deploy: ceiling %.2f base %.2f life %s jitter %.1f variant %d demand ×%.1f: peak %.3f",
									time.Duration(at), ceiling, base, life, jitter, variant, mult, s.Peak)
							}
							worst = math.Max(worst, s.Peak-ceiling)
							if s.Peak > ceiling+0.02 {
								over++
								t.Errorf("ceiling %.2f base %.2f life %s jitter %.1f variant %d demand ×%.1f: peak %.3f", ceiling, base, life, jitter, variant, mult, s.Peak)
							}
							st := s.Settled(0.1).Seconds() / w.Seconds()
							settle = append(settle, st)
							if life <= w/4 && st > 1 {
								slowShort++
							}
						}
					}
				}
			}
		}
	}
	sort.Float64s(settle)
	t.Logf("%d runs: worst peak over the ceiling %+.3f, %d over by more than 2 points; windows to within 10%%: median %.2f, 90th %.2f, max %.2f; lifetimes <= 1/4 window over 1 window: %d of %d; runs with a change point (none has a deploy): %d",
		runs, worst, over, settle[len(settle)/2], settle[len(settle)*9/10], settle[len(settle)-1], slowShort, runs/2, shifts)
}
