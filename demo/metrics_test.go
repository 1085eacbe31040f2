package demo

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicelb/sluice/lb"
)

func get(t *testing.T, h http.Handler, target string, header http.Header) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// scrape parses the handler's Prometheus text and returns the families.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	rec := get(t, h, "/metrics", nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: status %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type = %q, want text/plain", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	return fams
}

// value returns the single sample of a family, checking its labels.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("metric %s: want exactly one series, got %v", name, f)
	}
	m := f.GetMetric()[0]
	got := map[string]string{}
	for _, lp := range m.GetLabel() {
		got[lp.GetName()] = lp.GetValue()
	}
	for k, v := range labels {
		if got[k] != v {
			t.Errorf("metric %s: label %s = %q, want %q", name, k, got[k], v)
		}
	}
	switch {
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	}
	t.Fatalf("metric %s: neither gauge nor counter", name)
	return 0
}

func TestMetricsShowGrowth(t *testing.T) {
	l, clk := newTestLedger(t, LedgerConfig{Max: 1 << 20, Base: 1000})
	h := MetricsHandler(l)
	heap := map[string]string{"area": "heap", "id": "demo"}
	check := func(step string, used, live float64) {
		t.Helper()
		fams := scrape(t, h)
		if got := value(t, fams, "jvm_memory_used_bytes", heap); got != used {
			t.Errorf("%s: jvm_memory_used_bytes = %v, want %v", step, got, used)
		}
		if got := value(t, fams, "jvm_memory_max_bytes", heap); got != 1<<20 {
			t.Errorf("%s: jvm_memory_max_bytes = %v, want %v", step, got, 1<<20)
		}
		if got := value(t, fams, "demo_live_sessions", nil); got != live {
			t.Errorf("%s: demo_live_sessions = %v, want %v", step, got, live)
		}
	}
	check("empty", 1000, 0)
	for i, id := range []string{"a", "b", "c"} {
		mustHold(t, l, id, 4096, time.Minute)
		check("hold "+id, 1000+float64(4096*(i+1)), float64(i+1))
	}
	l.Release("b")
	check("release b", 1000+2*4096, 2)
	clk.Advance(time.Minute)
	l.Sweep()
	check("expired", 1000, 0)
	fams := scrape(t, h)
	if got := value(t, fams, "demo_sessions_total", nil); got != 3 {
		t.Errorf("demo_sessions_total = %v, want 3", got)
	}
	if got := value(t, fams, "demo_sessions_expired_total", nil); got != 2 {
		t.Errorf("demo_sessions_expired_total = %v, want 2", got)
	}
}

// TestMetricsReadByMemoryProbe feeds both formats to the parser MOP's
// memory probe uses, with its default selectors.
func TestMetricsReadByMemoryProbe(t *testing.T) {
	l, _ := newTestLedger(t, LedgerConfig{Max: 1 << 20, Base: 5000})
	mustHold(t, l, "a", 3000, 0)
	used, err := lb.ParseMetricSelector(lb.DefaultUsedMetric)
	if err != nil {
		t.Fatal(err)
	}
	max, err := lb.ParseMetricSelector(lb.DefaultMaxMetric)
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"/metrics", "/metrics?format=json"} {
		rec := get(t, MetricsHandler(l), target, http.Header{"Accept": {"text/plain;version=0.0.4, application/json;q=0.5"}})
		u, m, err := lb.ParseMemory(rec.Body.Bytes(), rec.Header().Get("Content-Type"), used, max)
		if err != nil {
			t.Fatalf("%s: ParseMemory: %v", target, err)
		}
		if u != 8000 || m != 1<<20 {
			t.Errorf("%s: ParseMemory = %d, %d, want 8000, %d", target, u, m, 1<<20)
		}
	}
}

func TestMetricsJSON(t *testing.T) {
	l, _ := newTestLedger(t, LedgerConfig{Max: 1 << 20, Base: 10})
	mustHold(t, l, "a", 90, 0)
	tests := []struct {
		name   string
		target string
		accept string
	}{
		{"query", "/metrics?format=json", ""},
		{"accept", "/metrics", "application/json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := get(t, MetricsHandler(l), tc.target, http.Header{"Accept": {tc.accept}})
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			var got struct {
				Used *int64 `json:"heap_used_bytes"`
				Max  *int64 `json:"heap_max_bytes"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("decode %q: %v", rec.Body, err)
			}
			if got.Used == nil || *got.Used != 100 || got.Max == nil || *got.Max != 1<<20 {
				t.Errorf("body %q, want heap_used_bytes 100 and heap_max_bytes %d", rec.Body, 1<<20)
			}
		})
	}
}

func TestHealth(t *testing.T) {
	const max = 1000 << 10
	l, _ := newTestLedger(t, LedgerConfig{Max: max})
	mux := NewMetricsMux(l)
	tests := []struct {
		name string
		held int // bytes held in total
		want int
	}{
		{"empty", 0, http.StatusOK},
		{"at 95%", max * 95 / 100, http.StatusOK},
		{"over 95%", max*95/100 + 1, http.StatusTooManyRequests},
		{"over max", max + 1, http.StatusTooManyRequests},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.held > 0 {
				mustHold(t, l, "s", tc.held, 0)
			} else {
				l.Release("s")
			}
			rec := get(t, mux, "/health", nil)
			if rec.Code != tc.want {
				body, _ := io.ReadAll(rec.Body)
				t.Errorf("GET /health with %d of %d bytes used: %d %q, want %d", tc.held, max, rec.Code, body, tc.want)
			}
		})
	}
}
