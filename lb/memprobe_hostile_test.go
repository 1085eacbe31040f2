package lb

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicelb/sluice/admission"
)

// page is a Micrometer heap page with the given used and max values.
func page(used, max string) []byte {
	return []byte("# TYPE jvm_memory_used_bytes gauge\n" +
		`jvm_memory_used_bytes{area="heap",id="G1 Old Gen",} ` + used + "\n" +
		`jvm_memory_used_bytes{area="nonheap",id="Metaspace",} 6.291456E7` + "\n" +
		"# TYPE jvm_memory_max_bytes gauge\n" +
		`jvm_memory_max_bytes{area="heap",id="G1 Old Gen",} ` + max + "\n" +
		`jvm_memory_max_bytes{area="heap",id="G1 Eden Space",} -1.0` + "\n")
}

func gzipped(tb testing.TB, b []byte) []byte {
	tb.Helper()
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// TestMemoryProbeHostilePages: what a backend's metrics page can make of
// the probe. Every page but the valid ones is a failed probe: MOP keeps
// its rate, shows memory unknown with the reason, and counts the failure.
func TestMemoryProbeHostilePages(t *testing.T) {
	var elsewhere atomic.Int64 // requests that reached another host
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.Write(page("1", "1000"))
	}))
	defer other.Close()

	valid := page("4.0E8", "8.0E8")
	// 9.9 MB unpacked from about 10 KB: a valid page padded with comments.
	bomb := append(append([]byte{}, valid...), bytes.Repeat([]byte("# padding padding padding\n"), 9_900_000/26)...)
	bombGz := gzipped(t, bomb)
	if len(bombGz) >= 256<<10 || len(bomb) <= 1<<20 { // the documented caps
		t.Fatalf("bomb %d bytes on the wire, %d unpacked: want under the wire cap and over the body cap", len(bombGz), len(bomb))
	}
	big := append(append([]byte{}, valid...), bytes.Repeat([]byte("x_total 1\n"), 8<<20/10)...)
	// 300 KB that do not compress: over the wire cap although gzipped.
	noise := make([]byte, 300<<10)
	rand.NewChaCha8([32]byte{1}).Read(noise)

	tests := []struct {
		name     string
		body     []byte
		gzip     bool
		redirect bool
		header   bool   // 1 MiB of response header
		encoding string // Content-Encoding other than gzip
		wantErr  string // "" for a good probe
		wantFrac float64
	}{
		{name: "valid", body: valid, wantFrac: 0.5},
		{name: "valid gzip", body: gzipped(t, valid), gzip: true, wantFrac: 0.5},
		{name: "valid 200 KB page", body: realisticPage(t, 200<<10), wantFrac: float64(4194304+125829120+20971520) / 536870912},
		{name: "NaN used", body: page("NaN", "8.0E8"), wantErr: "value NaN"},
		{name: "+Inf used", body: page("+Inf", "8.0E8"), wantErr: "value +Inf"},
		{name: "-1 used", body: page("-1", "8.0E8"), wantErr: "value -1"},
		{name: "NaN max", body: page("4.0E8", "NaN"), wantErr: "value NaN"},
		{name: "1e30 used", body: page("1e30", "1e30"), wantErr: "over 1e+18"},
		{name: "used over max", body: page("9.0E8", "8.0E8"), wantErr: "over max"},
		{name: "gzip bomb", body: bombGz, gzip: true, wantErr: "over 1024 KiB decoded"},
		{name: "8 MiB page", body: big, wantErr: "over 256 KiB on the wire"},
		{name: "gzip over the wire cap", body: gzipped(t, noise), gzip: true, wantErr: "over 256 KiB on the wire"},
		{name: "unknown encoding", body: valid, encoding: "br", wantErr: "content encoding \"br\" not supported"},
		{name: "redirect to another host", redirect: true, wantErr: "status 302"},
		{name: "1 MiB header", body: valid, header: true, wantErr: "exceeded"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.redirect {
					http.Redirect(w, r, other.URL+"/metrics", http.StatusFound)
					return
				}
				w.Header().Set("Content-Type", "text/plain; version=0.0.4")
				if tc.header {
					for i := range 16 {
						w.Header().Set(fmt.Sprintf("X-Pad-%d", i), strings.Repeat("x", 64<<10))
					}
				}
				if tc.gzip {
					w.Header().Set("Content-Encoding", "gzip")
				}
				if tc.encoding != "" {
					w.Header().Set("Content-Encoding", tc.encoding)
				}
				w.Write(tc.body)
			}))
			defer srv.Close()
			mop, _ := admission.NewMOP(admission.MOPConfig{Name: "b"})
			b, _ := NewBackend(BackendConfig{Addr: srv.Listener.Addr().String(), MOP: mop})
			p, err := NewMemoryProbe(b, MemoryProbeConfig{URL: srv.URL + "/metrics"}, &admission.ManualClock{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			// A good sample first, so that a failure has something to hide.
			mop.Observe(0, 1, 10)
			err = p.Poll(context.Background())
			st := mop.Status()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Poll = %v, want success", err)
				}
				if !st.MemoryKnown || st.MemoryFraction != tc.wantFrac || st.ProbeError != "" {
					t.Errorf("status %+v: want memory %v known, no error", st, tc.wantFrac)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Poll = %v, want an error containing %q", err, tc.wantErr)
			}
			if st.MemoryKnown || st.ProbeError != err.Error() || st.ProbeFailures != 1 {
				t.Errorf("status %+v: want memory unknown, the error shown, one failure", st)
			}
			if st.AllowedRate != 10 {
				t.Errorf("allowed rate %v after a failed probe, want the initial 10/s", st.AllowedRate)
			}
			if strings.Contains(tc.wantErr, "KiB") && !errors.Is(err, ErrMetricsTooLarge) {
				t.Errorf("error %v does not wrap ErrMetricsTooLarge", err)
			}
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Errorf("the probe followed a redirect to another host %d times", n)
	}
}

// TestScanMemoryOnlySelected: lines of other families are not parsed, so
// a line the format does not allow elsewhere on the page does not fail
// the probe; the selected series are parsed strictly.
func TestScanMemoryOnlySelected(t *testing.T) {
	used, max := mustSelector(t, DefaultUsedMetric), mustSelector(t, DefaultMaxMetric)
	body := append([]byte("garbage{{{ line\nother_metric{a=\"\\q\"} 1\n"), page("1", "2")...)
	if u, m, err := ParseMemory(body, "", used, max); err != nil || u != 1 || m != 2 {
		t.Errorf("ParseMemory = %d %d %v, want 1 2", u, m, err)
	}
	for _, line := range []string{
		`jvm_memory_used_bytes{area="heap" 12`,
		`jvm_memory_used_bytes{area="heap"} 12 junk`,
		`jvm_memory_used_bytes{area="heap"} twelve`,
		`jvm_memory_used_bytes{area="he\qap"} 1`,
	} {
		if _, _, err := ParseMemory([]byte(line+"\n"+string(page("1", "2"))), "", used, max); err == nil {
			t.Errorf("ParseMemory accepted %q", line)
		}
	}
	// Escapes, a timestamp, a trailing comma and blanks are the format's.
	ok := "jvm_memory_used_bytes {area=\"heap\", id=\"a\\\"b\\\\c\\n\",} 5 1700000000000\n" + string(page("1", "100"))
	if u, _, err := ParseMemory([]byte(ok), "", used, max); err != nil || u != 6 {
		t.Errorf("ParseMemory = %d, %v; want used 6", u, err)
	}
	sel := mustSelector(t, `jvm_memory_used_bytes{area="heap",id="a\"b"}`)
	if sel.Labels["id"] != `a"b` {
		t.Errorf("selector %+v: want id a\"b", sel)
	}
	if u, _, err := ParseMemory([]byte("jvm_memory_used_bytes{area=\"heap\",id=\"a\\\"b\"} 7\n"+string(page("1", "100"))), "", sel, max); err != nil || u != 7 {
		t.Errorf("escaped selector: used %d, %v; want 7", u, err)
	}
}

// TestMemoryProbeStoppedIsNotFailed: a poll cut short because the probe
// stops (shutdown, reload) leaves the last sample standing.
func TestMemoryProbeStoppedIsNotFailed(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	defer srv.Close()
	defer close(release)
	mop, _ := admission.NewMOP(admission.MOPConfig{Name: "b"})
	b, _ := NewBackend(BackendConfig{Addr: srv.Listener.Addr().String(), MOP: mop})
	p, err := NewMemoryProbe(b, MemoryProbeConfig{URL: srv.URL}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	mop.Observe(0, 1, 10)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Poll(ctx); err == nil {
		t.Fatal("Poll with a cancelled context succeeded")
	}
	if st := mop.Status(); !st.MemoryKnown || st.ProbeFailures != 0 {
		t.Errorf("status %+v: want the last sample known, no failure", st)
	}
}

// TestMemoryProbeMaxBytes: -mop-probe-max-bytes raises the limit for a
// backend whose page is larger; unpacked, four times it.
func TestMemoryProbeMaxBytes(t *testing.T) {
	body := realisticPage(t, 300<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }))
	defer srv.Close()
	for _, tc := range []struct {
		max  int64
		want string
	}{{0, "over 256 KiB on the wire"}, {320 << 10, ""}, {64 << 10, "over 64 KiB on the wire"}} {
		mop, _ := admission.NewMOP(admission.MOPConfig{Name: "b"})
		b, _ := NewBackend(BackendConfig{Addr: srv.Listener.Addr().String(), MOP: mop})
		p, err := NewMemoryProbe(b, MemoryProbeConfig{URL: srv.URL, MaxBytes: tc.max}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = p.Poll(context.Background())
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("MaxBytes %d: Poll = %v, want %q", tc.max, err, tc.want)
		}
	}
}

// TestReadMemoryStreams: a page is read line by line: a long line of
// another family is skipped, a selected series longer than a line buffer
// and a JSON report over 64 KiB are refused, and line numbers count from
// the page's first line.
func TestReadMemoryStreams(t *testing.T) {
	used, max := mustSelector(t, DefaultUsedMetric), mustSelector(t, DefaultMaxMetric)
	long := "# " + strings.Repeat("x", 100<<10) + "\nother{a=\"" + strings.Repeat("y", 50<<10) + "\"} 1\n"
	if u, m, err := ParseMemory([]byte(long+string(page("1", "2"))+long), "", used, max); err != nil || u != 1 || m != 2 {
		t.Errorf("page with long lines of other families: %d %d %v, want 1 2", u, m, err)
	}
	longSel := `jvm_memory_used_bytes{area="heap",id="` + strings.Repeat("z", 20<<10) + "\"} 1\n"
	if _, _, err := ParseMemory([]byte(string(page("1", "2"))+longSel), "", used, max); err == nil || !strings.Contains(err.Error(), "over 16 KiB") {
		t.Errorf("selected series over the line buffer: %v, want an error", err)
	}
	bigJSON := `{"heap_used_bytes":1,"heap_max_bytes":2,"pad":"` + strings.Repeat("p", 64<<10) + `"}`
	if _, _, err := ParseMemory([]byte(bigJSON), "application/json", used, max); !errors.Is(err, ErrMetricsTooLarge) {
		t.Errorf("JSON report over 64 KiB: %v, want ErrMetricsTooLarge", err)
	}
	if u, m, err := ParseMemory([]byte("\n \n"+`{"heap_used_bytes":1,"heap_max_bytes":2}`), "", used, max); err != nil || u != 1 || m != 2 {
		t.Errorf("JSON after blank lines: %d %d %v, want 1 2", u, m, err)
	}
	_, _, err := ParseMemory([]byte("\n\n# c\n"+`jvm_memory_used_bytes{area="heap"} NaN`+"\n"), "", used, max)
	if err == nil || !strings.Contains(err.Error(), "line 4:") {
		t.Errorf("NaN on line 4: %v, want an error naming line 4", err)
	}
	// The last line needs no newline.
	if u, _, err := ParseMemory(bytes.TrimSuffix(page("3", "4"), []byte("\n")), "", used, max); err != nil || u != 3 {
		t.Errorf("page without a final newline: used %d, %v; want 3", u, err)
	}
}
