package http

import (
	"bufio"
	"encoding/hex"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"
)

// fixedTraces is a TraceStarter giving known ids: trace n is
// 0…0n (16 bytes), span n is 0…0n+0x10, sampled when n is odd.
type fixedTraces struct{ n atomic.Uint32 }

func (f *fixedTraces) StartTrace() (tid [16]byte, sid [8]byte, sampled bool) {
	n := f.n.Add(1)
	tid[15], sid[7] = byte(n), byte(n)+0x10
	return tid, sid, n%2 == 1
}

// TestTraceStartedForRequestWithout: with spans exported (Deps.Tracer), a
// request without a valid traceparent gets the trace the exporter makes:
// its id in the log line, and the backend gets a traceparent naming the
// request's span as parent with the sampled flag as decided (a client's
// invalid traceparent and its tracestate replaced). A valid traceparent
// is passed on unchanged; without a tracer nothing is made up.
func TestTraceStartedForRequestWithout(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		tr := &fixedTraces{}
		r, sink := logRig(t, rigOpts{backends: 1, setup: func(s *Server) { s.trace = tr }})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		br := bufio.NewReader(c)
		valid := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		for i, tc := range []struct {
			headers, wantTP, wantTrace, wantParent string
		}{
			{"", "00-00000000000000000000000000000001-0000000000000011-01", "00000000000000000000000000000001", "0000000000000011"},
			{"traceparent: 00-bogus\r\ntracestate: k=v\r\n", "00-00000000000000000000000000000002-0000000000000012-00", "00000000000000000000000000000002", "0000000000000012"},
			{"traceparent: " + valid + "\r\ntracestate: k=v\r\n", valid, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"},
		} {
			c.Write([]byte("GET /t HTTP/1.1\r\nHost: x\r\n" + tc.headers + "\r\n"))
			var resp fasthttp.Response
			if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
				t.Fatal(err, resp.StatusCode())
			}
			l := sink.next(t)
			hs := r.backends[0].lastHeaders()
			if got := hs["Traceparent"]; len(got) != 1 || got[0] != tc.wantTP {
				t.Errorf("%d: backend traceparent %q, want %q", i, got, tc.wantTP)
			}
			if wantTS := tc.wantTP == valid; (hs["Tracestate"] != nil) != wantTS {
				t.Errorf("%d: backend tracestate %q (kept: %v)", i, hs["Tracestate"], wantTS)
			}
			if hex.EncodeToString(l.TraceID[:]) != tc.wantTrace || hex.EncodeToString(l.ParentSpan[:]) != tc.wantParent ||
				!strings.Contains(l.line, `"trace_id":"`+tc.wantTrace+`"`) {
				t.Errorf("%d: record trace %x parent %x, line %s: want %s %s", i, l.TraceID, l.ParentSpan, l.line, tc.wantTrace, tc.wantParent)
			}
		}
		if n := tr.n.Load(); n != 2 {
			t.Errorf("StartTrace called %d times, want 2 (not for a valid traceparent)", n)
		}
	})
}

// TestNoTraceWithoutTracer: without spans exported, no traceparent is
// made up and none is logged.
func TestNoTraceWithoutTracer(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r, sink := logRig(t, rigOpts{backends: 1})
		if rep := r.get("/", ""); rep.status != 200 {
			t.Fatalf("status %d", rep.status)
		}
		l := sink.next(t)
		if hs := r.backends[0].lastHeaders(); hs["Traceparent"] != nil || l.HasTrace || !strings.Contains(l.line, `"trace_id":""`) {
			t.Errorf("backend traceparent %q, record trace %v", hs["Traceparent"], l.HasTrace)
		}
	})
}

var _ TraceStarter = (*fixedTraces)(nil)
