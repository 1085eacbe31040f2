package admission

import (
	"strings"
	"testing"
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

func TestMemoryPrefersReaderLimit(t *testing.T) {
	r := &fakeReader{used: 750, limit: 1000} // GOMEMLIMIT 1000
	m, _ := NewMemory(MemoryConfig{Limit: 10_000}, r, nil)
	if got := m.Sample(); got != Low {
		t.Errorf("state %v, want low (limit from the reader)", got)
	}
	r.limit = 0 // GOMEMLIMIT unset: configured limit
	if got := m.Sample(); got != Normal {
		t.Errorf("state %v, want normal (configured limit)", got)
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
		{MemoryConfig{Low: 0.9, Lower: 0.8, Critical: 0.95}, "-mem-low"},
		{MemoryConfig{Limit: -1}, "-mem-limit"},
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
