package admission

import (
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// The fast paths are benchmarked in parallel beside golang.org/x/time/rate's
// Limiter.Allow, the reference. Limits are set so that every call takes the
// admit path. Run: go test -run '^$' -bench . -benchmem -cpu 1,2 ./admission

func BenchmarkARMAdmitParallel(b *testing.B) {
	m, _ := NewMeter(RuleConfig{Name: "b", Limit: 1<<31 - 1, Unit: time.Hour}, 0, nil)
	var clock MonoClock
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Admit(clock.Now(), Normal)
		}
	})
}

// BenchmarkARMLeasedParallel is the fast path with a shared budget attached
// and tokens to spend (a cluster node between lease round trips).
func BenchmarkARMLeasedParallel(b *testing.B) {
	m, _ := NewMeter(RuleConfig{Name: "b", Limit: 1<<31 - 1, Unit: time.Hour}, 0, nil)
	l := NewLease(0, nil)
	l.Grant(1<<50, 0, 1<<62)
	m.SetLease(l)
	var clock MonoClock
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Admit(clock.Now(), Normal)
		}
	})
}

func BenchmarkMOPAllowParallel(b *testing.B) {
	m, _ := NewMOP(MOPConfig{Name: "b", InitialRate: 1e12, MinRate: 1})
	var clock MonoClock
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Allow(clock.Now())
		}
	})
}

func BenchmarkDecideParallel(b *testing.B) {
	c, _ := NewController(ControllerConfig{Rules: []RuleConfig{
		{Name: "invites", Match: Match{Proto: "sip", Method: "INVITE"}, Limit: 1<<31 - 1, Unit: time.Hour},
	}}, nil, 0)
	mop, _ := NewMOP(MOPConfig{Name: "b", InitialRate: 1e12})
	var clock MonoClock
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := &Request{Proto: "sip", Method: "INVITE"}
		for pb.Next() {
			c.Decide(clock.Now(), r, mop)
		}
	})
}

// BenchmarkXRateAllowParallel is the reference: x/time/rate with a limit
// high enough that every call is allowed.
func BenchmarkXRateAllowParallel(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(1e12), 1<<30)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.Allow()
		}
	})
}

// BenchmarkMOPObserve is the sample path with the lifetime estimate: one
// memory sample a second against a full history, as a probe feeds it.
// It runs under the learner's lock, off the request path.
func BenchmarkMOPObserve(b *testing.B) {
	m, _ := NewMOP(MOPConfig{Name: "b"})
	now := int64(0)
	for i := range 600 { // fill the history
		now += int64(time.Second)
		m.Allow(now)
		m.Observe(now, int64(1<<28+i<<16), 1<<30)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now += int64(time.Second)
		m.Allow(now)
		m.Observe(now, int64(1<<28+(i%600)<<16), 1<<30)
	}
}

// TestMOPObserveAllocs: the sample path, estimate included, allocates
// nothing once its history exists.
func TestMOPObserveAllocs(t *testing.T) {
	m, _ := NewMOP(MOPConfig{Name: "a"})
	now := int64(0)
	for i := range 100 {
		now += int64(time.Second)
		m.Allow(now)
		m.Observe(now, int64(1<<28+i<<16), 1<<30)
	}
	if n := testing.AllocsPerRun(100, func() {
		now += int64(time.Second)
		m.Allow(now)
		m.Observe(now, 1<<28, 1<<30)
	}); n != 0 {
		t.Errorf("Observe allocates %v per sample, want 0", n)
	}
}
