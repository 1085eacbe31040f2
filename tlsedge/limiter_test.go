package tlsedge

import (
	"sync"
	"testing"
	"time"
)

// TestHandshakeLimiter drives a limiter through a script of acquires and
// releases at given times (an injected clock: now is passed in).
func TestHandshakeLimiter(t *testing.T) {
	const ms = int64(time.Millisecond)
	type step struct {
		at       int64 // ns
		op       string
		want     bool // for "acquire"
		repeat   int  // the op this many times (0: once)
		inFlight int64
	}
	for _, tc := range []struct {
		name       string
		max        int
		perSecond  float64
		steps      []step
		busy, rate uint64
	}{
		{name: "in-flight bound only", max: 2, steps: []step{
			{at: 0, op: "acquire", want: true, inFlight: 1},
			{at: 0, op: "acquire", want: true, inFlight: 2},
			{at: 0, op: "acquire", want: false, inFlight: 2},
			{at: 1, op: "release", inFlight: 1},
			{at: 1, op: "acquire", want: true, inFlight: 2},
		}, busy: 1},
		{name: "rate 10/s: burst of 10, then one per 100ms", perSecond: 10, steps: []step{
			{at: 0, op: "acquire", want: true, repeat: 10, inFlight: 10},
			{at: 0, op: "acquire", want: false, inFlight: 10},
			{at: 99 * ms, op: "acquire", want: false, inFlight: 10},
			{at: 100 * ms, op: "acquire", want: true, inFlight: 11},
			{at: 100 * ms, op: "acquire", want: false, inFlight: 11},
			{at: 5000 * ms, op: "acquire", want: true, repeat: 10, inFlight: 21}, // refilled to the burst
			{at: 5000 * ms, op: "acquire", want: false, inFlight: 21},
		}, rate: 4},
		{name: "both: a full in-flight bound spends no rate token", max: 1, perSecond: 1, steps: []step{
			{at: 0, op: "acquire", want: true, inFlight: 1},
			{at: 0, op: "acquire", want: false, inFlight: 1}, // busy
			{at: 1, op: "release", inFlight: 0},
			{at: 1, op: "acquire", want: false, inFlight: 0}, // rate: next token at 1s
			{at: 1000 * ms, op: "acquire", want: true, inFlight: 1},
		}, busy: 1, rate: 1},
		{name: "no bounds", steps: []step{
			{at: 0, op: "acquire", want: true, repeat: 1000, inFlight: 1000},
		}},
		{name: "fractional rate 0.5/s", perSecond: 0.5, steps: []step{
			{at: 0, op: "acquire", want: true, inFlight: 1},
			{at: 1000 * ms, op: "acquire", want: false, inFlight: 1},
			{at: 2000 * ms, op: "acquire", want: true, inFlight: 2},
		}, rate: 1},
	} {
		l := NewHandshakeLimiter(tc.max, tc.perSecond)
		for i, s := range tc.steps {
			for range max(1, s.repeat) {
				switch s.op {
				case "acquire":
					if got := l.Acquire(s.at); got != s.want {
						t.Errorf("%s: step %d: Acquire(%d) = %v; want %v", tc.name, i, s.at, got, s.want)
					}
				case "release":
					l.Release()
				}
			}
			if got := l.Stats().InFlight; got != s.inFlight {
				t.Errorf("%s: step %d: in flight %d; want %d", tc.name, i, got, s.inFlight)
			}
		}
		if st := l.Stats(); st.RefusedBusy != tc.busy || st.RefusedRate != tc.rate {
			t.Errorf("%s: refused busy %d rate %d; want %d, %d", tc.name, st.RefusedBusy, st.RefusedRate, tc.busy, tc.rate)
		}
	}
}

// gate is the HandshakeGate the front ends declare (http, sip): the
// limiter must keep satisfying it.
type gate interface {
	Acquire(now int64) bool
	Release()
}

var _ gate = (*HandshakeLimiter)(nil)

// TestReleaseWithoutAcquire: a stray Release does not loosen the bound.
func TestReleaseWithoutAcquire(t *testing.T) {
	l := NewHandshakeLimiter(1, 0)
	l.Release()
	l.Release()
	if !l.Acquire(0) || l.Acquire(0) {
		t.Fatal("after stray releases the bound of 1 let through other than one")
	}
	if st := l.Stats(); st.InFlight != 1 {
		t.Fatalf("in flight %d", st.InFlight)
	}
}

// TestHandshakeLimiterConcurrent: however many goroutines race, no more
// than max are ever admitted at once and the rate admits its burst
// exactly.
func TestHandshakeLimiterConcurrent(t *testing.T) {
	l := NewHandshakeLimiter(8, 100)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if l.Acquire(0) { // all at one instant: only the burst passes
					mu.Lock()
					admitted++
					mu.Unlock()
					if n := l.Stats().InFlight; n > 8 {
						t.Errorf("%d in flight", n)
					}
					l.Release()
				}
			}
		}()
	}
	wg.Wait()
	if admitted != 100 {
		t.Errorf("%d admitted at one instant; want the burst of 100", admitted)
	}
	if l.Stats().InFlight != 0 {
		t.Errorf("in flight %d after all released", l.Stats().InFlight)
	}
}

func TestHandshakeLimiterAllocs(t *testing.T) {
	l := NewHandshakeLimiter(256, 1000)
	now := int64(0)
	if n := testing.AllocsPerRun(1000, func() {
		now += int64(time.Millisecond)
		if l.Acquire(now) {
			l.Release()
		}
	}); n != 0 {
		t.Errorf("%v allocations per Acquire", n)
	}
}

func BenchmarkHandshakeLimiter(b *testing.B) {
	l := NewHandshakeLimiter(1<<30, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if l.Acquire(0) {
				l.Release()
			}
		}
	})
}
