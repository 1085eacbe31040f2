package lb

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

func newBackends(t testing.TB, weights ...int) []*Backend {
	t.Helper()
	bs := make([]*Backend, len(weights))
	for i, w := range weights {
		b, err := NewBackend(BackendConfig{Addr: fmt.Sprintf("127.0.0.1:%d", 18081+i), Proto: "http", Weight: w})
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
	}
	return bs
}

func newPool(t testing.TB, policy string, weights ...int) *Pool {
	t.Helper()
	p, err := NewPool(PoolConfig{Policy: policy}, newBackends(t, weights...))
	if err != nil {
		t.Fatalf("NewPool(%s): %v", policy, err)
	}
	return p
}

// counts picks n times and returns how often each backend was chosen.
func counts(t *testing.T, p *Pool, n int, key func(int) uint64) []int {
	t.Helper()
	c := make([]int, p.Len())
	for i := range n {
		b, out, _ := p.Pick(0, key(i), nil)
		if out != Picked {
			t.Fatalf("pick %d: outcome %v", i, out)
		}
		c[b.Index()]++
	}
	return c
}

func constKey(int) uint64 { return 0 }

func TestRoundRobinSpreads(t *testing.T) {
	p := newPool(t, "round-robin", 1, 1, 1)
	if got := counts(t, p, 300, constKey); got[0] != 100 || got[1] != 100 || got[2] != 100 {
		t.Errorf("round robin counts = %v, want [100 100 100]", got)
	}
}

func TestRoundRobinSkipsUnavailable(t *testing.T) {
	p := newPool(t, "round-robin", 1, 1, 1)
	bs := p.Backends()
	bs[1].SetProbeDown(true)
	bs[2].Drain(true)
	if got := counts(t, p, 30, constKey); got[0] != 30 {
		t.Errorf("counts = %v, want all on backend 0", got)
	}
}

func TestWeightedRoundRobinSmooth(t *testing.T) {
	p := newPool(t, "weighted-round-robin", 5, 1, 1)
	var seq strings.Builder
	for range 7 {
		b, _, _ := p.Pick(0, 0, nil)
		seq.WriteByte("abc"[b.Index()])
	}
	// nginx's documented smooth sequence for weights 5, 1, 1.
	if got, want := seq.String(), "aabacaa"; got != want {
		t.Errorf("sequence = %s, want %s", got, want)
	}
	if got := counts(t, p, 700, constKey); got[0] != 500 || got[1] != 100 || got[2] != 100 {
		t.Errorf("counts = %v, want [500 100 100]", got)
	}
}

func TestWeightedRoundRobinLargeWeights(t *testing.T) {
	bs := newBackends(t, 1000, 1000, 1000, 1000, 1000, 500)
	w := NewWeightedRoundRobin(bs)
	if len(w.seq) > maxSequence+len(bs) {
		t.Fatalf("sequence length %d, want <= %d", len(w.seq), maxSequence+len(bs))
	}
	// 1000:500 reduces to 2:1.
	if got := len(NewWeightedRoundRobin(newBackends(t, 1000, 500)).seq); got != 3 {
		t.Errorf("sequence for 1000,500 has %d entries, want 3", got)
	}
}

func TestLeastOutstanding(t *testing.T) {
	p := newPool(t, "least-outstanding", 1, 1, 2)
	bs := p.Backends()
	for range 3 {
		bs[0].Acquire()
	}
	bs[1].Acquire()
	for range 3 {
		bs[2].Acquire()
	}
	// outstanding/weight: 3, 1, 1.5.
	b, _, _ := p.Pick(0, 0, nil)
	if b != bs[1] {
		t.Errorf("picked %s, want %s", b.ID(), bs[1].ID())
	}
	bs[1].Acquire()
	bs[1].Acquire() // now 3, 3, 1.5
	if b, _, _ := p.Pick(0, 0, nil); b != bs[2] {
		t.Errorf("picked %s, want %s", b.ID(), bs[2].ID())
	}
}

func TestLeastOutstandingTieBreaksOnHeadroom(t *testing.T) {
	clock := int64(0)
	m1 := newMOP(t, 10)
	m2 := newMOP(t, 10)
	for range 1 {
		m1.Allow(clock) // use up m1's burst
	}
	b1, _ := NewBackend(BackendConfig{Addr: "a:1", MOP: m1})
	b2, _ := NewBackend(BackendConfig{Addr: "b:1", MOP: m2})
	p, err := NewPool(PoolConfig{Policy: "least-outstanding"}, []*Backend{b1, b2})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		var tried Set
		if i := p.Policy().Select(p.Backends(), clock, 0, tried); i != 1 {
			t.Fatalf("selected %d, want 1 (more headroom)", i)
		}
	}
}

func TestPowerOfTwoPrefersLessLoaded(t *testing.T) {
	p := newPool(t, "p2c", 1, 1)
	bs := p.Backends()
	for range 5 {
		bs[0].Acquire()
	}
	// With two backends both samples cover both (or fall back to a full
	// scan): the less loaded one always wins.
	if got := counts(t, p, 200, constKey); got[1] != 200 {
		t.Errorf("counts = %v, want all on backend 1", got)
	}
	bs[1].SetProbeDown(true)
	if got := counts(t, p, 20, constKey); got[0] != 20 {
		t.Errorf("with backend 1 down counts = %v, want all on backend 0", got)
	}
}

func TestPowerOfTwoSpreads(t *testing.T) {
	p := newPool(t, "p2c", 1, 1, 1, 1)
	got := counts(t, p, 4000, constKey)
	for i, c := range got {
		if c < 500 {
			t.Errorf("backend %d got %d of 4000 picks with nothing outstanding, want a fair share", i, c)
		}
	}
}

func TestConsistentHashStable(t *testing.T) {
	p := newPool(t, "consistent-hash", 1, 1, 1, 1)
	bs := p.Backends()
	const keys = 2000
	first := make([]*Backend, keys)
	spread := make([]int, len(bs))
	for k := range keys {
		b, _, _ := p.Pick(0, Hash(fmt.Sprintf("call-%d@example.com", k)), nil)
		first[k] = b
		spread[b.Index()]++
		if again, _, _ := p.Pick(0, Hash(fmt.Sprintf("call-%d@example.com", k)), nil); again != b {
			t.Fatalf("key %d moved from %s to %s", k, b.ID(), again.ID())
		}
	}
	for i, c := range spread {
		if c < keys/4*7/10 || c > keys/4*13/10 {
			t.Errorf("backend %d holds %d of %d keys, want about a quarter", i, c, keys)
		}
	}
	// Take backend 2 out: only its keys move, and each to a stable fallback.
	bs[2].SetProbeDown(true)
	for k := range keys {
		b, _, _ := p.Pick(0, Hash(fmt.Sprintf("call-%d@example.com", k)), nil)
		if first[k] != bs[2] && b != first[k] {
			t.Fatalf("key %d moved from healthy %s to %s", k, first[k].ID(), b.ID())
		}
		if b == bs[2] {
			t.Fatalf("key %d went to the down backend", k)
		}
	}
	// Same ids, same table: a restart keeps the mapping.
	q := newPool(t, "consistent-hash", 1, 1, 1, 1)
	for k := range 100 {
		key := Hash(fmt.Sprintf("call-%d@example.com", k))
		b, _, _ := q.Pick(0, key, nil)
		if b.ID() != first[k].ID() {
			t.Fatalf("key %d maps to %s after rebuild, was %s", k, b.ID(), first[k].ID())
		}
	}
}

func TestConsistentHashWeighted(t *testing.T) {
	p := newPool(t, "consistent-hash", 3, 1)
	got := counts(t, p, 4000, func(i int) uint64 { return Hash(fmt.Sprint("k", i)) })
	if got[0] < 2700 || got[0] > 3300 {
		t.Errorf("weight 3:1 split = %v, want about 3000:1000", got)
	}
}

func newMOP(t testing.TB, rate float64) *admission.MOP {
	t.Helper()
	m, err := admission.NewMOP(admission.MOPConfig{Name: "test", InitialRate: rate, Burst: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPickTriesNextWhenMOPRefuses(t *testing.T) {
	m1, m2 := newMOP(t, 1), newMOP(t, 1)
	b1, _ := NewBackend(BackendConfig{Addr: "a:1", MOP: m1})
	b2, _ := NewBackend(BackendConfig{Addr: "b:1", MOP: m2})
	p, err := NewPool(PoolConfig{Policy: "consistent-hash"}, []*Backend{b1, b2})
	if err != nil {
		t.Fatal(err)
	}
	key := uint64(42)
	now := int64(time.Hour)
	first, out, _ := p.Pick(now, key, nil)
	if out != Picked {
		t.Fatalf("first pick: %v", out)
	}
	// first's MOP (1/s, no burst) is now used up: the same key must land
	// on the other backend.
	second, out, _ := p.Pick(now, key, nil)
	if out != Picked || second == first {
		t.Fatalf("second pick = %v %v, want the other backend", second, out)
	}
	// Both used up: MOPRefused with the soonest retry.
	_, out, retry := p.Pick(now, key, nil)
	if out != MOPRefused {
		t.Fatalf("third pick outcome = %v, want MOPRefused", out)
	}
	if retry <= 0 || retry > time.Second {
		t.Errorf("retry = %v, want in (0, 1s]", retry)
	}
	// A second later both have room again.
	if _, out, _ := p.Pick(now+int64(time.Second), key, nil); out != Picked {
		t.Errorf("pick after a second = %v, want Picked", out)
	}
}

func TestPickNoBackend(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			p := newPool(t, pol, 1, 2)
			for _, b := range p.Backends() {
				b.SetProbeDown(true)
			}
			if b, out, _ := p.Pick(0, 7, nil); b != nil || out != NoBackend {
				t.Errorf("Pick = %v, %v; want nil, NoBackend", b, out)
			}
		})
	}
}

func TestPickSkip(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			p := newPool(t, pol, 1, 1)
			bs := p.Backends()
			for k := range 50 {
				b, out, _ := p.Pick(0, uint64(k), bs[0])
				if out != Picked || b != bs[1] {
					t.Fatalf("Pick skipping 0 = %v, %v; want backend 1", b, out)
				}
			}
			bs[1].SetProbeDown(true)
			if _, out, _ := p.Pick(0, 1, bs[0]); out != NoBackend {
				t.Errorf("only candidate skipped: outcome %v, want NoBackend", out)
			}
		})
	}
}

func TestStatesAndAffinity(t *testing.T) {
	p := newPool(t, "round-robin", 1)
	b := p.Backends()[0]
	check := func(name string, now int64, want State) {
		t.Helper()
		if got := b.State(now); got != want {
			t.Errorf("%s: state = %v, want %v", name, got, want)
		}
		pinned := p.Pinned(b.ID(), now) != nil
		// Probes alone never turn affinity away (TestProbesAloneKeepAffinity).
		if wantPinned := want != Down || b.probeDown.Load() && !b.deadByTraffic(now); pinned != wantPinned {
			t.Errorf("%s: Pinned = %v, want %v", name, pinned, wantPinned)
		}
	}
	check("fresh", 0, Up)
	b.Drain(true)
	check("drained", 0, Draining)
	b.Drain(false)
	b.SetBusy(100)
	check("busy", 50, Draining)
	check("busy over", 100, Up)
	b.SetBusy(-1)
	check("busy until cleared", 1e18, Draining)
	b.ClearBusy()
	b.SetProbeDown(true)
	check("probe down", 0, Down)
	b.SetProbeDown(false)
	b.Eject(0, time.Second)
	check("ejected", int64(time.Second)-1, Down)
	check("ejection over", int64(time.Second), Up)
	if p.Pinned("no-such-backend", 0) != nil {
		t.Error("Pinned found an unknown id")
	}
}

func TestPassiveEjection(t *testing.T) {
	bs := newBackends(t, 1, 1)
	p, err := NewPool(PoolConfig{Passive: PassiveConfig{MaxFails: 3, Cooldown: 10 * time.Second}}, bs)
	if err != nil {
		t.Fatal(err)
	}
	b := p.Backends()[0]
	fail := func(now int64, r Result) {
		b.Acquire()
		b.Release(now, r)
	}
	fail(0, ConnectError)
	fail(0, ServerError)
	fail(0, OK) // resets
	fail(0, Timeout)
	fail(0, Abandoned) // neutral
	fail(0, ConnectError)
	if s := b.State(1); s != Up {
		t.Fatalf("after 2 consecutive failures state = %v, want up", s)
	}
	fail(5, ServerError)
	if s := b.State(6); s != Down {
		t.Fatalf("after 3 consecutive failures state = %v, want down", s)
	}
	if s := b.State(5 + int64(10*time.Second)); s != Up {
		t.Errorf("after the cool-down state = %v, want up", s)
	}
	if o := b.Outstanding(); o != 0 {
		t.Errorf("outstanding = %d, want 0", o)
	}
	if st := b.Status(0); st.Failures != 5 || st.Requests != 7 {
		t.Errorf("status failures/requests = %d/%d, want 5/7", st.Failures, st.Requests)
	}
}

// TestPassiveEjectionBound: traffic ejects at most half of the backends
// (at least one): when every backend fails its requests at once (an
// overload that makes them all slow), the rest keep taking work instead of
// the pool refusing everything.
func TestPassiveEjectionBound(t *testing.T) {
	for _, tc := range []struct{ backends, ejectable int }{{1, 1}, {2, 1}, {3, 1}, {4, 2}, {5, 2}} {
		t.Run(fmt.Sprint(tc.backends), func(t *testing.T) {
			p, err := NewPool(PoolConfig{Passive: PassiveConfig{MaxFails: 1, Cooldown: 10 * time.Second}}, newBackends(t, make([]int, tc.backends)...))
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range p.Backends() {
				b.Acquire()
				b.Release(1, Timeout)
			}
			down := 0
			for _, b := range p.Backends() {
				if b.State(2) == Down {
					down++
				}
			}
			if down != tc.ejectable {
				t.Errorf("%d of %d backends ejected after each failed, want %d", down, tc.backends, tc.ejectable)
			}
			// Once the ejected ones are back, the others may go in turn.
			later := 1 + int64(10*time.Second)
			for _, b := range p.Backends() {
				if b.State(later) == Up && b.State(2) == Up {
					b.Acquire()
					b.Release(later, Timeout)
					if b.State(later+1) != Down {
						t.Errorf("%s still up after the first ejections ended", b.ID())
					}
					break
				}
			}
		})
	}
}

func TestNewPoolErrors(t *testing.T) {
	dup := newBackends(t, 1)
	dup2, _ := NewBackend(BackendConfig{Addr: dup[0].Addr()})
	tests := []struct {
		name string
		cfg  PoolConfig
		bs   []*Backend
		want string
	}{
		{"empty", PoolConfig{}, nil, "no backends"},
		{"unknown policy", PoolConfig{Policy: "fastest"}, newBackends(t, 1), "PoolConfig.Policy"},
		{"duplicate id", PoolConfig{}, append(dup, dup2), "duplicate backend id"},
		{"negative max fails", PoolConfig{Passive: PassiveConfig{MaxFails: -1}}, newBackends(t, 1), "PassiveConfig.MaxFails"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPool(tc.cfg, tc.bs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	// A backend may be in several pools: it keeps the Index the first
	// gave it, and each pool knows its own position of it.
	bs := newBackends(t, 1, 1)
	p1, err := NewPool(PoolConfig{Name: "a"}, bs)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := NewPool(PoolConfig{Name: "b"}, []*Backend{bs[1]})
	if err != nil {
		t.Fatalf("a backend in a second pool: %v", err)
	}
	if bs[1].Index() != 1 || p1.IndexOf(bs[1]) != 1 || p2.IndexOf(bs[1]) != 0 || p2.IndexOf(bs[0]) != -1 {
		t.Errorf("Index %d, IndexOf in a %d, in b %d (of the other %d), want 1, 1, 0, -1",
			bs[1].Index(), p1.IndexOf(bs[1]), p2.IndexOf(bs[1]), p2.IndexOf(bs[0]))
	}
	if p1.Name() != "a" || p2.Name() != "b" {
		t.Errorf("names %q %q", p1.Name(), p2.Name())
	}
}

func TestNewBackendErrors(t *testing.T) {
	for _, cfg := range []BackendConfig{
		{},
		{Addr: "a:1", Weight: -1},
		{Addr: "a:1", Weight: MaxWeight + 1},
		{Addr: "a:1", ID: strings.Repeat("x", 256)},
	} {
		if _, err := NewBackend(cfg); err == nil {
			t.Errorf("NewBackend(%+v) succeeded, want an error", cfg)
		}
	}
}

func TestPickAllocatesNothing(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			bs := newBackends(t, 1, 2, 3)
			bs[0].mop = newMOP(t, 1e9)
			p, err := NewPool(PoolConfig{Policy: pol}, bs)
			if err != nil {
				t.Fatal(err)
			}
			bs[1].SetProbeDown(true)
			key := uint64(0)
			n := testing.AllocsPerRun(1000, func() {
				key++
				b, _, _ := p.Pick(int64(key), key, bs[2])
				p.Pinned("127.0.0.1:18081", 0)
				_ = b
			})
			if n != 0 {
				t.Errorf("Pick allocates %v times per call, want 0", n)
			}
		})
	}
}

// TestPickConcurrentExactMOP hammers Pick from many goroutines on a pool
// whose MOP admits a known number: exactly that many are picked.
func TestPickConcurrentExactMOP(t *testing.T) {
	m, err := admission.NewMOP(admission.MOPConfig{Name: "x", InitialRate: 1, Burst: 49 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewBackend(BackendConfig{Addr: "a:1", MOP: m})
	p, err := NewPool(PoolConfig{Policy: "p2c"}, []*Backend{b})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	picked := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for range 100 {
				if _, out, _ := p.Pick(0, 0, nil); out == Picked {
					n++
				}
			}
			mu.Lock()
			picked += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	// A fresh limiter asked one at a time admits the same number.
	ref, _ := admission.NewMOP(admission.MOPConfig{Name: "ref", InitialRate: 1, Burst: 49 * time.Second})
	want := 0
	for range 800 {
		if ref.Allow(0) {
			want++
		}
	}
	if picked != want || want == 0 {
		t.Errorf("picked %d of 800, want exactly %d", picked, want)
	}
}
