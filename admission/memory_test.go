package admission

import (
	"strings"
	"testing"
	"time"
)

type fakeReader struct{ used, limit int64 }

func (r *fakeReader) ReadMemory() (int64, int64) { return r.used, r.limit }

func TestMemoryStates(t *testing.T) {
	r := &fakeReader{}
	var events []Event
	m, err := NewMemory(MemoryConfig{Limit: 1000, Low: 0.70, Lower: 0.80, Critical: 0.90, Hysteresis: 0.05}, r,
		func(e Event) { events = append(events, e) })
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		used int64
		want MemState
	}{
		{100, Normal},
		{699, Normal},
		{700, Low},
		{790, Low},
		{800, Lower},
		{760, Lower}, // 0.76 >= 0.80-0.05: hysteresis holds
		{749, Low},   // below 0.75: falls
		{950, Critical},
		{860, Critical}, // 0.86 >= 0.85
		{600, Normal},   // falls through several states at once
	}
	for i, s := range steps {
		r.used = s.used
		if got := m.Sample(); got != s.want {
			t.Fatalf("step %d used %d: state %v, want %v", i, s.used, got, s.want)
		}
		if m.State() != s.want {
			t.Fatalf("step %d: State() disagrees with Sample()", i)
		}
	}
	if len(events) != 5 {
		t.Errorf("got %d transition events, want 5: %+v", len(events), events)
	}
	if !strings.Contains(events[0].Message, "normal -> low") {
		t.Errorf("first event %q", events[0].Message)
	}
}

func TestMemoryLimitPrecedence(t *testing.T) {
	// -mem-limit wins over GOMEMLIMIT: with -mem-limit the runtime's limit
	// is set to the Low share of it, and must not become the states' limit.
	r := &fakeReader{used: 750, limit: 1000}
	m, _ := NewMemory(MemoryConfig{Limit: 10_000}, r, nil)
	if got := m.Sample(); got != Normal {
		t.Errorf("state %v, want normal (configured limit 10000)", got)
	}
	if _, limit := m.Usage(); limit != 10_000 {
		t.Errorf("limit %d, want 10000", limit)
	}
	m, _ = NewMemory(MemoryConfig{}, r, nil) // no -mem-limit: GOMEMLIMIT
	if got := m.Sample(); got != Low {
		t.Errorf("state %v, want low (limit from the reader)", got)
	}
	r.limit = 0 // neither: states off
	if got := m.Sample(); got != Low {
		t.Errorf("state %v, want low kept (no limit known)", got)
	}
}

// collectingReader holds live memory and garbage; Collect frees the garbage.
type collectingReader struct {
	live, garbage int64
	collects      int
}

func (r *collectingReader) ReadMemory() (int64, int64) { return r.live + r.garbage, 0 }
func (r *collectingReader) Collect()                   { r.garbage = 0; r.collects++ }

// Regression for the state held for minutes after a burst: garbage the
// runtime had not collected yet counted as used memory.
func TestMemoryStateFollowsLiveMemory(t *testing.T) {
	clk := &ManualClock{}
	r := &collectingReader{}
	m, err := NewMemory(MemoryConfig{Limit: 1000, CollectEvery: time.Second, Clock: clk}, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		advance       time.Duration
		live, garbage int64
		want          MemState
		collects      int
	}{
		{0, 100, 500, Normal, 0},                        // 600 < low 700: no collection asked
		{0, 300, 600, Normal, 1},                        // 900 read, collected: 300 live
		{100 * time.Millisecond, 300, 600, Critical, 1}, // within CollectEvery: the reading stands
		{900 * time.Millisecond, 300, 600, Normal, 2},   // a second later: collected, back at once
		{0, 950, 0, Critical, 2},                        // live memory over critical: rises (collect too recent)
		{time.Second, 950, 100, Critical, 3},            // collected, still live: stays
		{time.Second, 500, 0, Normal, 3},                // pressure gone: below low, no collection needed
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		r.live, r.garbage = s.live, s.garbage
		if got := m.Sample(); got != s.want {
			t.Fatalf("step %d (live %d garbage %d): state %v, want %v", i, s.live, s.garbage, got, s.want)
		}
		if r.collects != s.collects || m.Collections() != uint64(s.collects) {
			t.Fatalf("step %d: %d collections (counter %d), want %d", i, r.collects, m.Collections(), s.collects)
		}
	}
}

func TestMemoryRuntimeLimit(t *testing.T) {
	for _, tc := range []struct {
		cfg  MemoryConfig
		want int64
	}{
		{MemoryConfig{}, 0},
		{MemoryConfig{Limit: 1000}, 700},
		{MemoryConfig{Limit: 1000, Low: 0.5, Lower: 0.6, Critical: 0.7}, 500},
	} {
		if got := tc.cfg.RuntimeLimit(); got != tc.want {
			t.Errorf("%+v: runtime limit %d, want %d", tc.cfg, got, tc.want)
		}
	}
}

func TestMemoryCriticalChannel(t *testing.T) {
	r := &fakeReader{limit: 100}
	m, _ := NewMemory(MemoryConfig{}, r, nil)
	c := m.CriticalC()
	r.used = 95
	m.Sample()
	select {
	case <-c:
	default:
		t.Fatal("critical channel not closed in Critical")
	}
	r.used = 10
	m.Sample()
	select {
	case <-m.CriticalC():
		t.Fatal("new critical channel closed after leaving Critical")
	default:
	}
}

func TestMemoryHealthCodes(t *testing.T) {
	want := map[MemState]int{Normal: 200, Low: 429, Lower: 429, Critical: 429}
	for s, code := range want {
		if s.HealthCode() != code {
			t.Errorf("%v: %d, want %d", s, s.HealthCode(), code)
		}
	}
	if Low.RefusesNewWork() || !Lower.RefusesNewWork() || !Critical.RefusesNewWork() {
		t.Error("RefusesNewWork: only Lower and Critical refuse")
	}
}

func TestMemoryConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  MemoryConfig
		want string
	}{
		{MemoryConfig{Low: 0.9, Lower: 0.8, Critical: 0.95}, "MemoryConfig.Low"},
		{MemoryConfig{Limit: -1}, "MemoryConfig.Limit"},
	} {
		if _, err := NewMemory(tc.cfg, &fakeReader{}, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want one naming %s", tc.cfg, err, tc.want)
		}
	}
}

func TestRuntimeReader(t *testing.T) {
	used, _ := NewRuntimeReader().ReadMemory()
	if used <= 0 {
		t.Errorf("runtime reader: used %d", used)
	}
}

var sink [][]byte

// TestRuntimeCollectFreesGarbage runs the real reader: 64 MiB that became
// garbage would put the state in Critical, and the collection before the
// verdict frees it, so the state stays Normal.
func TestRuntimeCollectFreesGarbage(t *testing.T) {
	const chunk, n = 1 << 20, 64
	for i := 0; i < n; i++ {
		sink = append(sink, make([]byte, chunk))
		sink[i][0] = 1
	}
	r := NewRuntimeReader()
	used, _ := r.ReadMemory()
	sink = nil // garbage now, not collected yet
	m, err := NewMemory(MemoryConfig{Limit: used}, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sample(); got != Normal {
		after, _ := m.Usage()
		t.Fatalf("state %v with %d of %d bytes used after collection, want normal", got, after, used)
	}
	if m.Collections() != 1 {
		t.Errorf("%d collections, want 1", m.Collections())
	}
	after, _ := m.Usage()
	if freed := used - after; freed < n*chunk/2 {
		t.Errorf("freed %d bytes, want at least %d", freed, n*chunk/2)
	}
}
