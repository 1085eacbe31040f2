package tracing

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseTraceparent(t *testing.T) {
	const tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, c := range []struct {
		in      string
		ok      bool
		sampled bool
	}{
		{"00-" + tid + "-" + sid + "-01", true, true},
		{"00-" + tid + "-" + sid + "-00", true, false},
		{"00-" + tid + "-" + sid + "-03", true, true},        // other flags ignored
		{"01-" + tid + "-" + sid + "-01-future", true, true}, // a later version may add fields
		{"01-" + tid + "-" + sid + "-01", true, true},
		{"00-" + tid + "-" + sid + "-01-extra", false, false}, // version 00 has exactly four
		{"01-" + tid + "-" + sid + "-01x", false, false},
		{"ff-" + tid + "-" + sid + "-01", false, false}, // version ff is invalid
		{"00-00000000000000000000000000000000-" + sid + "-01", false, false},
		{"00-" + tid + "-0000000000000000-01", false, false},
		{"00-" + strings.ToUpper(tid) + "-" + sid + "-01", false, false},
		{"00-" + tid + "-" + sid + "-0g", false, false},
		{"00_" + tid + "-" + sid + "-01", false, false},
		{"00-" + tid[:31] + "-" + sid + "-01", false, false},
		{"", false, false},
		{"garbage", false, false},
	} {
		tc, ok := ParseTraceparent(c.in)
		if ok != c.ok || ok && tc.Sampled != c.sampled {
			t.Errorf("ParseTraceparent(%q) = %+v, %v; want ok %v sampled %v", c.in, tc, ok, c.ok, c.sampled)
			continue
		}
		if ok && (!bytes.Equal(tc.TraceID[:], mustHex(t, tid)) || !bytes.Equal(tc.SpanID[:], mustHex(t, sid))) {
			t.Errorf("ParseTraceparent(%q) ids = %x %x", c.in, tc.TraceID, tc.SpanID)
		}
		if ok && strings.HasPrefix(c.in, "00-") && tc.String() != c.in[:53]+map[bool]string{true: "01", false: "00"}[tc.Sampled] {
			t.Errorf("String() = %q for %q", tc.String(), c.in)
		}
	}
	if n := testing.AllocsPerRun(100, func() { ParseTraceparent("00-" + tid + "-" + sid + "-01") }); n != 0 {
		t.Errorf("ParseTraceparent allocates %v times", n)
	}
}

func TestEndpointURL(t *testing.T) {
	for _, c := range []struct{ in, want, err string }{
		{"http://collector:4318", "http://collector:4318/v1/traces", ""},
		{"http://collector:4318/", "http://collector:4318/v1/traces", ""},
		{"https://otel.example.com/custom/traces", "https://otel.example.com/custom/traces", ""},
		{"http://[::1]:4318", "http://[::1]:4318/v1/traces", ""},
		{"collector:4318", "", "want an http:// or https:// URL"},
		{"grpc://collector:4317", "", "want an http:// or https:// URL"},
		{"http://", "", "want a host"},
		{"http://u:p@collector:4318", "", "credentials"},
		{"http://collector:4318/v1/traces?x=1", "", "no query"},
		{"http://collector:4318/%zz", "", "-otlp-endpoint"},
	} {
		got, err := EndpointURL(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), "-otlp-endpoint") {
				t.Errorf("EndpointURL(%q) err = %v, want one with %q naming the flag", c.in, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("EndpointURL(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		err string
	}{
		{Config{SampleRatio: 0.5}, ""},
		{Config{SampleRatio: 1.5}, "-trace-sample 1.5: want a ratio from 0 to 1"},
		{Config{SampleRatio: -0.1}, "-trace-sample -0.1"},
		{Config{SampleRatio: 1, Endpoint: "udp://x:1"}, "-otlp-endpoint"},
		{Config{SampleRatio: 1, QueueSize: -1}, "queue size"},
	} {
		err := c.cfg.Validate()
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("Validate(%+v) = %v, want %q", c.cfg, err, c.err)
		}
	}
}

// newTestExporter starts an Exporter posting to url; spans leave on Close
// (FlushInterval is an hour, so no test depends on a timer).
func newTestExporter(t *testing.T, url string, ratio float64, queue int) *Exporter {
	t.Helper()
	e, err := New(Config{Endpoint: url, SampleRatio: ratio, QueueSize: queue, BatchSize: 4,
		FlushInterval: time.Hour, ExportTimeout: 5 * time.Second, Instance: "node-1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

func testSpan(name string) Span {
	start := time.Date(2026, 12, 1, 14, 2, 0, 0, time.UTC)
	sp := Span{Name: name, Start: start, End: start.Add(1500 * time.Microsecond)}
	sp.Str("sluice.pool", "web")
	sp.Int("http.response.status_code", 200)
	sp.Dur("sluice.admission_wait_us", 250*time.Microsecond)
	sp.Dur("sluice.connect_us", -1) // did not happen: left out
	return sp
}

func TestSpansReachCollector(t *testing.T) {
	r := newReceiver(t)
	e := newTestExporter(t, r.srv.URL, 1, 64)

	parent, ok := ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if !ok {
		t.Fatal("traceparent")
	}
	parent.State = "congo=t61rcWkgMzE"
	child := testSpan("GET")
	child.Parent = parent
	child.Error, child.ErrorText = true, "backend reset"
	if !e.Offer(&child) {
		t.Fatal("sampled child not queued")
	}
	root := testSpan("SIP INVITE")
	copy(root.TraceID[:], mustHex(t, "0af7651916cd43dd8448eb211c80319c"))
	if !e.Offer(&root) {
		t.Fatal("root not queued")
	}
	anon := testSpan("SIP OPTIONS") // no parent, no trace id: a new trace
	e.Offer(&anon)
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := r.got()
	if len(got) != 3 {
		t.Fatalf("collector got %d spans, want 3", len(got))
	}
	if r.paths[0] != "/v1/traces" || r.ctype != "application/x-protobuf" {
		t.Errorf("posted to %q as %q, want /v1/traces as application/x-protobuf", r.paths[0], r.ctype)
	}
	if r.resource["service.name"] != "sluice" || r.resource["service.instance.id"] != "node-1" {
		t.Errorf("resource = %v", r.resource)
	}
	byName := map[string]*tracepb.Span{}
	for _, sp := range got {
		byName[sp.Name] = sp
	}
	c := byName["GET"]
	if c == nil || !bytes.Equal(c.TraceId, parent.TraceID[:]) || !bytes.Equal(c.ParentSpanId, parent.SpanID[:]) {
		t.Fatalf("child span %v: want trace %x parent %x", c, parent.TraceID, parent.SpanID)
	}
	if bytes.Equal(c.SpanId, parent.SpanID[:]) || len(c.SpanId) != 8 {
		t.Errorf("child span id %x must be its own", c.SpanId)
	}
	if c.TraceState != "congo=t61rcWkgMzE" {
		t.Errorf("trace state %q", c.TraceState)
	}
	if c.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("kind %v", c.Kind)
	}
	if c.StartTimeUnixNano != uint64(child.Start.UnixNano()) || c.EndTimeUnixNano != uint64(child.End.UnixNano()) {
		t.Errorf("times %d..%d, want the request's %d..%d", c.StartTimeUnixNano, c.EndTimeUnixNano, child.Start.UnixNano(), child.End.UnixNano())
	}
	if c.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || c.Status.GetMessage() != "backend reset" {
		t.Errorf("status %v", c.Status)
	}
	a := attrs(c)
	want := map[string]any{"sluice.pool": "web", "http.response.status_code": int64(200), "sluice.admission_wait_us": int64(250)}
	if len(a) != len(want) {
		t.Errorf("attributes %v, want %v", a, want)
	}
	for k, v := range want {
		if a[k] != v {
			t.Errorf("attribute %s = %v, want %v", k, a[k], v)
		}
	}
	rt := byName["SIP INVITE"]
	if rt == nil || hex.EncodeToString(rt.TraceId) != "0af7651916cd43dd8448eb211c80319c" || len(rt.ParentSpanId) != 0 {
		t.Errorf("root span %v: want trace 0af7651916cd43dd8448eb211c80319c, no parent", rt)
	}
	an := byName["SIP OPTIONS"]
	if an == nil || len(an.TraceId) != 16 || bytes.Equal(an.TraceId, make([]byte, 16)) || len(an.ParentSpanId) != 0 {
		t.Errorf("anonymous span %v: want a fresh trace id and no parent", an)
	}
	if st := e.Stats(); st.Exported != 3 || st.Queued != 3 || st.Dropped != 0 || st.Failed != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestSamplingParentBased(t *testing.T) {
	sampled, _ := ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	unsampled, _ := ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	low := [16]byte{15: 0x02}                                                            // id>>1 is 1: sampled at any ratio > 0
	high := [16]byte{8: 0xff, 9: 0xff, 10: 0xff, 11: 0xff, 12: 0xff, 13: 0xff, 14: 0xff} // near the top
	for _, c := range []struct {
		name   string
		ratio  float64
		parent TraceContext
		tid    [16]byte
		want   bool
	}{
		{"sampled parent, ratio 0", 0, sampled, [16]byte{}, true},
		{"unsampled parent, ratio 1", 1, unsampled, [16]byte{}, false},
		{"no parent, ratio 1", 1, TraceContext{}, high, true},
		{"no parent, ratio 0", 0, TraceContext{}, low, false},
		{"no parent, low id, ratio 0.5", 0.5, TraceContext{}, low, true},
		{"no parent, high id, ratio 0.5", 0.5, TraceContext{}, high, false},
	} {
		r := newReceiver(t)
		e := newTestExporter(t, r.srv.URL, c.ratio, 8)
		sp := testSpan("GET")
		sp.Parent, sp.TraceID = c.parent, c.tid
		if got := e.Offer(&sp); got != c.want {
			t.Errorf("%s: Offer = %v, want %v", c.name, got, c.want)
		}
		_ = e.Close(context.Background())
		n := 0
		if c.want {
			n = 1
		}
		if len(r.got()) != n {
			t.Errorf("%s: collector got %d spans, want %d", c.name, len(r.got()), n)
		}
		if st := e.Stats(); st.Unsampled != uint64(1-n) {
			t.Errorf("%s: unsampled %d", c.name, st.Unsampled)
		}
	}
}

// TestSamplingRatio: without a parent, about the ratio of random traces
// is kept (binomial, n=20000, p=0.25: 6 sigma is ±367).
func TestSamplingRatio(t *testing.T) {
	e := &Exporter{bound: uint64(0.25 * (1 << 63))}
	n := 0
	for range 20000 {
		if e.Sampled(nil, nil) {
			n++
		}
	}
	if n < 5000-367 || n > 5000+367 {
		t.Errorf("sampled %d of 20000 at 0.25", n)
	}
}

// TestCollectorDown: with nothing listening, every export fails and is
// counted; Offer never blocks.
func TestCollectorDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	e := newTestExporter(t, "http://"+addr, 1, 64)
	for range 10 {
		sp := testSpan("GET")
		e.Offer(&sp)
	}
	_ = e.Close(context.Background())
	if st := e.Stats(); st.Failed != 10 || st.Exported != 0 {
		t.Errorf("stats %+v, want 10 failed", st)
	}
}

// TestCollectorStalled: a collector that takes a request and does not
// answer holds the exporter's goroutine; the queue fills and further
// spans are dropped and counted, and Offer returns at once all along.
func TestCollectorStalled(t *testing.T) {
	r := newReceiver(t)
	r.hold = make(chan struct{})
	const queue = 16
	e := newTestExporter(t, r.srv.URL, 1, queue)
	// One batch (BatchSize 4) goes out and is held.
	for range 4 {
		sp := testSpan("GET")
		e.Offer(&sp)
	}
	<-r.arrived
	const n = 1000
	for range n {
		sp := testSpan("GET")
		e.Offer(&sp)
	}
	st := e.Stats()
	// The goroutine may hold one more batch besides the queue.
	if st.Dropped < n-queue-4 || st.Queued+st.Dropped != n+4 {
		t.Errorf("stats %+v: want at least %d dropped of %d", st, n-queue-4, n+4)
	}
	r.release()
	_ = e.Close(context.Background())
	st = e.Stats()
	if st.Exported != st.Queued {
		t.Errorf("after the collector came back: %+v, want every queued span exported", st)
	}
}

func TestOfferAllocs(t *testing.T) {
	r := newReceiver(t)
	r.hold = make(chan struct{}) // the exporter's goroutine, which allocates, waits in its first export
	e := newTestExporter(t, r.srv.URL, 1, 8)
	sp := testSpan("GET")
	sp.Parent, _ = ParseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if n := testing.AllocsPerRun(1000, func() { e.Offer(&sp) }); n != 0 {
		t.Errorf("Offer allocates %v times", n)
	}
	unsampled := sp
	unsampled.Parent.Sampled = false
	if n := testing.AllocsPerRun(1000, func() { e.Offer(&unsampled) }); n != 0 {
		t.Errorf("Offer of an unsampled span allocates %v times", n)
	}
	r.release()
	_ = e.Close(context.Background())
}

func BenchmarkOffer(b *testing.B) {
	e := &Exporter{all: true, queue: make(chan Span, 1024)}
	sp := testSpan("GET")
	go func() {
		for range e.queue {
		}
	}()
	b.ReportAllocs()
	for b.Loop() {
		e.Offer(&sp)
	}
	close(e.queue)
}
