package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// historyDoc is GET /status/history decoded; nulls become nil pointers.
type historyDoc struct {
	Capacity       int       `json:"capacity"`
	MaxHeapPercent float64   `json:"mop_max_heap_percent"`
	T              []float64 `json:"t"`
	Memory         struct {
		State      []*int     `json:"state"`
		UsedBytes  []*float64 `json:"used_bytes"`
		LimitBytes int64      `json:"limit_bytes"`
	} `json:"memory"`
	Refused  map[string][]*float64 `json:"refused"`
	Backends []struct {
		ID          string     `json:"id"`
		Protocol    string     `json:"protocol"`
		State       []*int     `json:"state"`
		NewRate     []*float64 `json:"new_rate"`
		RequestRate []*float64 `json:"request_rate"`
		AllowedRate []*float64 `json:"allowed_rate"`
		LearnedRate []*float64 `json:"learned_rate"`
		MemoryPct   []*float64 `json:"memory_percent"`
	} `json:"backends"`
	ARM []struct {
		Name   string     `json:"name"`
		Rate   []*float64 `json:"rate"`
		Limit  []*float64 `json:"limit"`
		Queued []*float64 `json:"queued"`
	} `json:"arm"`
}

func decodeHistory(t *testing.T, h *History, since int64) historyDoc {
	t.Helper()
	var buf bytes.Buffer
	h.WriteJSON(&buf, since)
	var d historyDoc
	if err := json.Unmarshal(buf.Bytes(), &d); err != nil {
		t.Fatalf("history is not JSON: %v\n%s", err, buf.String())
	}
	return d
}

// show renders a column with "-" for null, for got/want messages.
func show[T int | float64](col []*T) string {
	s := "["
	for i, v := range col {
		if i > 0 {
			s += " "
		}
		if v == nil {
			s += "-"
		} else {
			s += fmt.Sprint(*v)
		}
	}
	return s + "]"
}

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func backend(id, state string, admitted, requests uint64, memPct float64) BackendStatus {
	return BackendStatus{ID: id, Protocol: "http", State: state, Requests: requests,
		MOP: MOPStatus{Enabled: true, Phase: "discovery", AllowedRate: 30, MemoryPercent: memPct, Admitted: admitted}}
}

// TestHistoryRatesStepTable: rates are counter differences over the time
// between samples; the first sample, and a counter that went backwards (a
// replaced backend), have none.
func TestHistoryRatesStepTable(t *testing.T) {
	h := NewHistory(10)
	steps := []struct {
		at        time.Duration
		admitted  uint64
		requests  uint64
		mopRefuse uint64
		state     string
		mem       string
	}{
		{0, 100, 200, 0, "up", "normal"},
		{1 * time.Second, 110, 215, 4, "up", "normal"},
		{2 * time.Second, 130, 235, 4, "draining", "low"},
		{4 * time.Second, 150, 275, 10, "down", "critical"}, // 2 s later: halves
		{5 * time.Second, 5, 5, 10, "up", "normal"},         // counters restarted
	}
	for _, s := range steps {
		var c admission.Counts
		c.Refused[0][3] = s.mopRefuse // http, "mop"
		h.Record(t0.Add(s.at), Status{MemoryState: s.mem, Memory: MemoryStatus{UsedBytes: 1 << 20, LimitBytes: 1 << 30},
			Backends: []BackendStatus{backend("a", s.state, s.admitted, s.requests, 40)}}, &c)
	}
	d := decodeHistory(t, h, 0)
	if len(d.T) != len(steps) || d.T[0] != float64(t0.Unix()) || d.T[3] != float64(t0.Unix()+4) {
		t.Fatalf("t = %v", d.T)
	}
	b := d.Backends[0]
	for _, c := range []struct {
		name string
		got  string
		want string
	}{
		{"new_rate", show(b.NewRate), "[- 10 20 10 -]"},
		{"request_rate", show(b.RequestRate), "[- 15 20 20 -]"},
		{"state", show(b.State), "[0 0 1 2 0]"},
		{"memory.state", show(d.Memory.State), "[0 0 1 3 0]"},
		{"refused.mop", show(d.Refused["mop"]), "[- 4 0 3 0]"},
		{"refused.arm", show(d.Refused["arm"]), "[- 0 0 0 0]"},
		{"allowed_rate", show(b.AllowedRate), "[30 30 30 30 30]"},
		{"memory_percent", show(b.MemoryPct), "[40 40 40 40 40]"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %s, want %s", c.name, c.got, c.want)
		}
	}
	if d.Memory.LimitBytes != 1<<30 {
		t.Errorf("limit_bytes = %d", d.Memory.LimitBytes)
	}
}

// TestHistoryRingWraps: a full ring keeps the newest capacity samples,
// oldest first, and since selects the samples after it.
func TestHistoryRingWraps(t *testing.T) {
	h := NewHistory(3)
	for i := range 5 {
		h.Record(t0.Add(time.Duration(i)*time.Second), Status{MemoryState: "normal"}, nil)
	}
	if h.Len() != 3 {
		t.Fatalf("Len = %d, want 3", h.Len())
	}
	d := decodeHistory(t, h, 0)
	want := []float64{float64(t0.Unix() + 2), float64(t0.Unix() + 3), float64(t0.Unix() + 4)}
	if fmt.Sprint(d.T) != fmt.Sprint(want) || d.Capacity != 3 {
		t.Errorf("t = %v capacity %d, want %v capacity 3", d.T, d.Capacity, want)
	}
	if got := decodeHistory(t, h, t0.Add(3*time.Second).UnixMilli()).T; fmt.Sprint(got) != fmt.Sprint(want[2:]) {
		t.Errorf("since t0+3s: t = %v, want %v", got, want[2:])
	}
	if got := decodeHistory(t, h, t0.Add(9*time.Second).UnixMilli()).T; len(got) != 0 {
		t.Errorf("since the last sample: t = %v, want none", got)
	}
	// Without a controller there are no refusal counts: nulls, not zeros.
	if got := show(d.Refused["memory"]); got != "[- - -]" {
		t.Errorf("refused.memory without controller = %s", got)
	}
}

// TestHistoryBackendsComeAndGo: a backend added by a reload has nulls
// before it appeared, a removed one nulls after; a series absent from every
// held sample is dropped, so the ring's memory stays bounded.
func TestHistoryBackendsComeAndGo(t *testing.T) {
	h := NewHistory(4)
	rec := func(i int, bs ...BackendStatus) {
		h.Record(t0.Add(time.Duration(i)*time.Second), Status{MemoryState: "normal", Backends: bs}, nil)
	}
	rec(0, backend("a", "up", 0, 0, 10))
	rec(1, backend("a", "up", 5, 5, 10), backend("b", "up", 0, 0, 20))
	rec(2, backend("b", "up", 3, 3, 20))
	d := decodeHistory(t, h, 0)
	if len(d.Backends) != 2 {
		t.Fatalf("backends = %d, want 2", len(d.Backends))
	}
	if got := show(d.Backends[0].MemoryPct); got != "[10 10 -]" {
		t.Errorf("a memory = %s, want [10 10 -]", got)
	}
	if got := show(d.Backends[1].MemoryPct); got != "[- 20 20]" {
		t.Errorf("b memory = %s, want [- 20 20]", got)
	}
	if got := show(d.Backends[1].NewRate); got != "[- - 3]" {
		t.Errorf("b new_rate = %s, want [- - 3]", got)
	}
	for i := 3; i < 6; i++ {
		rec(i, backend("b", "up", 3, 3, 20))
	}
	d = decodeHistory(t, h, 0)
	if len(d.Backends) != 1 || d.Backends[0].ID != "b" {
		t.Errorf("after a's samples aged out: backends %+v, want only b", d.Backends)
	}
	// Back after its series was dropped: no rate from the stale counter.
	rec(6, backend("a", "up", 100, 100, 10), backend("b", "up", 3, 3, 20))
	d = decodeHistory(t, h, 0)
	if got := show(d.Backends[1].NewRate); d.Backends[1].ID != "a" || got != "[- - - -]" {
		t.Errorf("a again: %s new_rate %s, want a [- - - -]", d.Backends[1].ID, got)
	}
}

// TestHistoryBounded: series beyond MaxHistoryBackends and
// MaxHistoryRules are left out, and the bytes per sample are as stated in
// the package (129 for the demo's four backends).
func TestHistoryBounded(t *testing.T) {
	h := NewHistory(2)
	demo := Status{MemoryState: "normal"}
	for _, id := range []string{"h1", "h2", "s1", "s2"} {
		demo.Backends = append(demo.Backends, backend(id, "up", 0, 0, 0))
	}
	h.Record(t0, demo, nil)
	if got := h.BytesPerSample(); got != 129 {
		t.Errorf("bytes per sample with four backends = %d, want 129", got)
	}
	var many Status
	for i := range MaxHistoryBackends + 10 {
		many.Backends = append(many.Backends, backend(fmt.Sprintf("b%d", i), "up", 0, 0, 0))
	}
	for i := range MaxHistoryRules + 5 {
		many.ARM = append(many.ARM, RuleStatus{Name: fmt.Sprintf("r%d", i), Rate: 1, Limit: 10})
	}
	h = NewHistory(2)
	h.Record(t0, many, nil)
	d := decodeHistory(t, h, 0)
	if len(d.Backends) != MaxHistoryBackends || len(d.ARM) != MaxHistoryRules {
		t.Errorf("series = %d backends, %d rules; want %d, %d", len(d.Backends), len(d.ARM), MaxHistoryBackends, MaxHistoryRules)
	}
	if got, want := h.BytesPerSample(), 29+25*MaxHistoryBackends+12*MaxHistoryRules; got != want {
		t.Errorf("bytes per sample at the caps = %d, want %d", got, want)
	}
	if got := show(d.ARM[0].Limit); got != "[10]" {
		t.Errorf("arm limit = %s", got)
	}
}

// BenchmarkHistoryRecord: one sample of the demo's four backends; and
// the full 900-sample answer of GET /status/history.
func BenchmarkHistoryRecord(b *testing.B) {
	h := NewHistory(0)
	st := Status{MemoryState: "normal"}
	for _, id := range []string{"h1", "h2", "s1", "s2"} {
		st.Backends = append(st.Backends, backend(id, "up", 0, 0, 0))
	}
	var c admission.Counts
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Record(t0.Add(time.Duration(i)*time.Second), st, &c)
	}
}

func BenchmarkHistoryWriteJSON(b *testing.B) {
	h := NewHistory(0)
	st := Status{MemoryState: "normal"}
	for _, id := range []string{"h1", "h2", "s1", "s2"} {
		st.Backends = append(st.Backends, backend(id, "up", 0, 0, 0))
	}
	for i := range h.Capacity() {
		h.Record(t0.Add(time.Duration(i)*time.Second), st, nil)
	}
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		h.WriteJSON(&buf, 0)
	}
	b.ReportMetric(float64(buf.Len()), "bytes/answer")
}
