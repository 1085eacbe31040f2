package lb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// realisticPage is a Spring Boot actuator page of about size bytes:
// Micrometer's JVM families followed by HTTP server histograms over many
// URIs, the bulk of a real page.
func realisticPage(tb testing.TB, size int) []byte {
	tb.Helper()
	head, err := os.ReadFile(filepath.Join("testdata", "memory", "micrometer.prom"))
	if err != nil {
		tb.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("# HELP http_server_requests_seconds Duration of HTTP server request handling\n")
	b.WriteString("# TYPE http_server_requests_seconds histogram\n")
	for i := 0; b.Len() < size/2; i++ {
		for _, le := range []string{"0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "+Inf"} {
			fmt.Fprintf(&b, "http_server_requests_seconds_bucket{exception=\"None\",method=\"GET\",outcome=\"SUCCESS\",status=\"200\",uri=\"/api/v1/resource%d\",le=\"%s\",} %d.0\n", i, le, i*7)
		}
		fmt.Fprintf(&b, "http_server_requests_seconds_count{exception=\"None\",method=\"GET\",outcome=\"SUCCESS\",status=\"200\",uri=\"/api/v1/resource%d\",} %d.0\n", i, i*7)
		fmt.Fprintf(&b, "http_server_requests_seconds_sum{exception=\"None\",method=\"GET\",outcome=\"SUCCESS\",status=\"200\",uri=\"/api/v1/resource%d\",} %d.25\n", i, i)
	}
	b.Write(head)
	b.WriteString("# HELP tomcat_sessions_active_current_sessions\n# TYPE tomcat_sessions_active_current_sessions gauge\n")
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "tomcat_sessions_active_current_sessions{context=\"/app%d\",} %d.0\n", i, i)
	}
	return []byte(b.String())
}

// BenchmarkParseMemory parses a realistic 200 KB metrics page.
func BenchmarkParseMemory(b *testing.B) {
	page := realisticPage(b, 200<<10)
	used := mustSelector(b, DefaultUsedMetric)
	max := mustSelector(b, DefaultMaxMetric)
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		u, m, err := ParseMemory(page, "text/plain; version=0.0.4", used, max)
		if err != nil || u != 4194304+125829120+20971520 || m != 536870912 {
			b.Fatalf("used %d max %d err %v", u, m, err)
		}
	}
}

// BenchmarkPollHostile polls backends whose pages are over the limits: a
// plain 8 MiB page and 9.9 MB gzipped into about 24 KB. What one poll
// costs the node is what such a backend can make it spend every interval.
func BenchmarkPollHostile(b *testing.B) {
	valid := page("4.0E8", "8.0E8")
	big := append(append([]byte{}, valid...), bytes.Repeat([]byte("x_total 1\n"), 8<<20/10)...)
	bomb := gzipped(b, append(append([]byte{}, valid...), bytes.Repeat([]byte("# padding padding padding\n"), 9_900_000/26)...))
	for _, bc := range []struct {
		name string
		body []byte
		gzip bool
	}{{"8MiB", big, false}, {"gzip-bomb", bomb, true}} {
		b.Run(bc.name, func(b *testing.B) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if bc.gzip {
					w.Header().Set("Content-Encoding", "gzip")
				}
				w.Write(bc.body)
			}))
			defer srv.Close()
			mop, _ := admission.NewMOP(admission.MOPConfig{Name: "b"})
			be, _ := NewBackend(BackendConfig{Addr: srv.Listener.Addr().String(), MOP: mop})
			p, err := NewMemoryProbe(be, MemoryProbeConfig{URL: srv.URL, Interval: 10 * time.Second}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Poll(context.Background()); !errors.Is(err, ErrMetricsTooLarge) {
					b.Fatalf("Poll = %v, want ErrMetricsTooLarge", err)
				}
			}
		})
	}
}
