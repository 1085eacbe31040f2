package lb

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admission"
)

func mustSelector(t testing.TB, s string) MetricSelector {
	t.Helper()
	sel, err := ParseMetricSelector(s)
	if err != nil {
		t.Fatalf("ParseMetricSelector(%q): %v", s, err)
	}
	return sel
}

func TestParseMemoryGolden(t *testing.T) {
	tests := []struct {
		file, contentType string
		used, max         string
		wantUsed, wantMax int64
		wantErr           string
	}{
		// Heap pools summed: 4 MiB + 120 MiB + 20 MiB; max: only Old Gen
		// defines one (the -1 of the others is skipped).
		{file: "micrometer.prom", contentType: "text/plain; version=0.0.4", wantUsed: 4194304 + 125829120 + 20971520, wantMax: 536870912},
		{file: "custom.prom", used: `app_heap_bytes{kind="used"}`, max: `app_heap_bytes{kind="limit"}`, wantUsed: 300, wantMax: 1000},
		// Used over max by more than 2% cannot be true.
		{file: "custom.prom", used: `go_memstats_heap_inuse_bytes`, max: `app_heap_bytes{kind="limit"}`, wantErr: "over max"},
		{file: "report.json", contentType: "application/json", wantUsed: 734003200, wantMax: 1073741824},
		{file: "report.json", contentType: "", wantUsed: 734003200, wantMax: 1073741824},
		{file: "missing.prom", wantErr: "not found"},
		{file: "broken.prom", wantErr: "parse memory metrics"},
		{file: "partial.json", wantErr: "heap_max_bytes"},
		{file: "custom.prom", used: `app_heap_bytes{kind="nope"}`, wantErr: "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.file+" "+tc.used, func(t *testing.T) {
			body, err := os.ReadFile(filepath.Join("testdata", "memory", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			used, max := DefaultUsedMetric, DefaultMaxMetric
			if tc.used != "" {
				used = tc.used
			}
			if tc.max != "" {
				max = tc.max
			}
			u, m, err := ParseMemory(body, tc.contentType, mustSelector(t, used), mustSelector(t, max))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if u != tc.wantUsed || m != tc.wantMax {
				t.Errorf("got used %d max %d, want %d %d", u, m, tc.wantUsed, tc.wantMax)
			}
		})
	}
}

func TestParseMetricSelector(t *testing.T) {
	sel := mustSelector(t, `jvm_memory_used_bytes{area="heap",id="G1 Old Gen"}`)
	if sel.Name != "jvm_memory_used_bytes" || sel.Labels["area"] != "heap" || sel.Labels["id"] != "G1 Old Gen" || len(sel.Labels) != 2 {
		t.Errorf("got %+v", sel)
	}
	for _, bad := range []string{"", "{", `x{a=}`, "a b", "x\ny 1"} {
		if _, err := ParseMetricSelector(bad); err == nil {
			t.Errorf("ParseMetricSelector(%q) succeeded, want an error", bad)
		}
	}
}

func TestParseMemoryNoErrorSentinel(t *testing.T) {
	_, _, err := ParseMemory([]byte("x 1\n"), "", mustSelector(t, "a"), mustSelector(t, "x"))
	if !errors.Is(err, ErrNoMemoryMetric) {
		t.Errorf("error = %v, want ErrNoMemoryMetric", err)
	}
}

func FuzzParseMemory(f *testing.F) {
	for _, name := range []string{"micrometer.prom", "custom.prom", "report.json", "broken.prom"} {
		b, err := os.ReadFile(filepath.Join("testdata", "memory", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	used, _ := ParseMetricSelector(DefaultUsedMetric)
	max, _ := ParseMetricSelector(DefaultMaxMetric)
	f.Fuzz(func(t *testing.T, body []byte) {
		u, m, err := ParseMemory(body, "", used, max)
		if err == nil && (u < 0 || m <= 0) {
			t.Fatalf("accepted used %d max %d", u, m)
		}
	})
}

func TestMemoryProbeFeedsMOP(t *testing.T) {
	body, err := os.ReadFile(filepath.Join("testdata", "memory", "micrometer.prom"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/actuator/prometheus" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		w.Write(body)
	}))
	defer srv.Close()
	mop, err := admission.NewMOP(admission.MOPConfig{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewBackend(BackendConfig{Addr: srv.Listener.Addr().String(), MOP: mop})
	clock := &admission.ManualClock{}
	p, err := NewMemoryProbe(b, MemoryProbeConfig{URL: srv.URL + "/actuator/prometheus"}, clock, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Poll(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := float64(4194304+125829120+20971520) / 536870912
	if got := mop.Status().MemoryFraction; got != want {
		t.Errorf("MOP memory fraction = %v, want %v", got, want)
	}
	bad, err := NewMemoryProbe(b, MemoryProbeConfig{URL: srv.URL + "/nope"}, clock, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := bad.Poll(context.Background()); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("poll of a 404 = %v, want an error naming the status", err)
	}
}

func TestNewMemoryProbeErrors(t *testing.T) {
	b, _ := NewBackend(BackendConfig{Addr: "a:1"})
	for _, tc := range []struct {
		cfg  MemoryProbeConfig
		want string
	}{
		{MemoryProbeConfig{}, "empty metrics url"},
		{MemoryProbeConfig{URL: "ftp://x"}, "http://"},
		{MemoryProbeConfig{URL: "http://x", UsedMetric: "a{"}, "MemoryProbeConfig.UsedMetric"},
		{MemoryProbeConfig{URL: "http://x", MaxMetric: "a b"}, "MemoryProbeConfig.MaxMetric"},
		{MemoryProbeConfig{URL: "http://x", MaxBytes: 100}, "MemoryProbeConfig.MaxBytes"},
		{MemoryProbeConfig{URL: "http://x", MaxBytes: 64 << 20}, "MemoryProbeConfig.MaxBytes"},
		{MemoryProbeConfig{URL: "http://x", MaxBytes: -1}, "MemoryProbeConfig.MaxBytes"},
	} {
		if _, err := NewMemoryProbe(b, tc.cfg, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewMemoryProbe(%+v) = %v, want error containing %q", tc.cfg, err, tc.want)
		}
	}
}
