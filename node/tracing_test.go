package node

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluicelb/sluice/tracing"
)

// otlpReceiver is an OTLP/HTTP collector decoding the real protobuf
// messages and keeping their spans.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &msg) != nil {
			http.Error(w, "bad export", 400)
			return
		}
		r.mu.Lock()
		for _, rs := range msg.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *otlpReceiver) byName() map[string][]*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[string][]*tracepb.Span{}
	for _, sp := range r.spans {
		m[sp.Name] = append(m[sp.Name], sp)
	}
	return m
}

// sipAnswerer is a SIP backend on UDP that answers every request 200 OK,
// copying the headers an answer takes from its request.
func sipAnswerer(t *testing.T) string {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			head, _, _ := strings.Cut(string(buf[:n]), "\r\n\r\n")
			lines := strings.Split(head, "\r\n")
			if strings.HasPrefix(lines[0], "ACK ") || strings.HasPrefix(lines[0], "SIP/") {
				continue
			}
			var res strings.Builder
			res.WriteString("SIP/2.0 200 OK\r\n")
			for _, l := range lines[1:] {
				name, _, _ := strings.Cut(l, ":")
				switch strings.ToLower(strings.TrimSpace(name)) {
				case "via", "from", "call-id", "cseq":
					res.WriteString(l + "\r\n")
				case "to":
					res.WriteString(l + ";tag=be1\r\n")
				}
			}
			res.WriteString("Contact: <sip:" + c.LocalAddr().String() + ">\r\nContent-Length: 0\r\n\r\n")
			_, _ = c.WriteToUDPAddrPort([]byte(res.String()), from)
		}
	}()
	return c.LocalAddr().String()
}

// sipInvite sends an INVITE (with a traceparent header when tp is set)
// to the node and waits for its 200.
func sipInvite(t *testing.T, node net.Addr, callID, tp string) {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	extra := ""
	if tp != "" {
		extra = "traceparent: " + tp + "\r\n"
	}
	msg := fmt.Sprintf("INVITE sip:svc@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=f1\r\nTo: <sip:svc@test>\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:a@%s>\r\n%sContent-Length: 0\r\n\r\n",
		node, c.LocalAddr(), callID, callID, c.LocalAddr(), extra)
	if _, err := c.WriteTo([]byte(msg), node.(*net.UDPAddr)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65536)
	for {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			t.Fatalf("INVITE %s: no 200: %v", callID, err)
		}
		if bytes.HasPrefix(buf[:n], []byte("SIP/2.0 200")) {
			return
		}
	}
}

// TestNodeExportsSpans: a node with -otlp-endpoint and -trace-sample 0
// (no access log) exports one span for an HTTP request and one for a SIP
// INVITE whose client sent a sampled traceparent, each a child of the
// client's span, and none for requests without one.
func TestNodeExportsSpans(t *testing.T) {
	rcv := newOTLPReceiver(t)
	made := regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-00$`) // a trace sluice started, unsampled at ratio 0
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tp := r.Header.Get("traceparent"); tp != httpTP && !made.MatchString(tp) {
			t.Errorf("traceparent to the backend %q, want the client's unchanged or one sluice made, unsampled", tp)
		}
		fmt.Fprint(w, "hello")
	}))
	defer be.Close()
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=h1"}
	cfg.SIPBackends = []string{sipAnswerer(t) + ",id=s1"}
	cfg.Tracing = tracing.Config{Endpoint: rcv.srv.URL, SampleRatio: 0}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	a := n.Addrs()
	for _, tp := range []string{httpTP, ""} {
		req, _ := http.NewRequest("GET", "http://"+a.HTTP.String()+"/cart", nil)
		if tp != "" {
			req.Header.Set("traceparent", tp)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("HTTP: %d", resp.StatusCode)
		}
	}
	sipInvite(t, a.SIP, "traced@test", sipTP)
	sipInvite(t, a.SIP, "untraced@test", "")
	tracer := n.tracer
	n.Stop(2 * time.Second) // flushes the spans

	got := rcv.byName()
	for name, tp := range map[string]string{"GET": httpTP, "SIP INVITE": sipTP} {
		spans := got[name]
		if len(spans) != 1 {
			t.Errorf("%d %q spans, want 1 (the traced request's): %v", len(spans), name, got)
			continue
		}
		pc, _ := tracing.ParseTraceparent(tp)
		sp := spans[0]
		if !bytes.Equal(sp.TraceId, pc.TraceID[:]) || !bytes.Equal(sp.ParentSpanId, pc.SpanID[:]) {
			t.Errorf("%s span trace %x parent %x, want %x %x", name, sp.TraceId, sp.ParentSpanId, pc.TraceID, pc.SpanID)
		}
		if sp.EndTimeUnixNano < sp.StartTimeUnixNano || sp.StartTimeUnixNano == 0 {
			t.Errorf("%s span times %d..%d", name, sp.StartTimeUnixNano, sp.EndTimeUnixNano)
		}
		attrs := map[string]string{}
		for _, kv := range sp.Attributes {
			attrs[kv.Key] = kv.GetValue().GetStringValue()
		}
		want := map[string]string{tracing.AttrBackend: "h1", tracing.AttrDecision: "admitted", tracing.AttrPool: "default"}
		if name == "SIP INVITE" {
			want = map[string]string{tracing.AttrBackend: "s1", tracing.AttrDecision: "admitted", tracing.AttrSIPCallID: "traced@test"}
		}
		for k, v := range want {
			if attrs[k] != v {
				t.Errorf("%s span %s = %q, want %q", name, k, attrs[k], v)
			}
		}
	}
	if st := tracer.Stats(); st.Exported != 2 || st.Unsampled != 2 {
		t.Errorf("tracer stats %+v, want 2 exported, 2 unsampled", st)
	}
}

// TestNodeStartsTrace: with -otlp-endpoint, an HTTP request without a
// traceparent gets the trace of the span sluice exports: its id in the
// access log line, and the backend gets a traceparent with that span as
// parent, so the backend's spans join it.
func TestNodeStartsTrace(t *testing.T) {
	rcv := newOTLPReceiver(t)
	got := make(chan string, 1)
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("traceparent")
		fmt.Fprint(w, "hello")
	}))
	defer be.Close()
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=h1"}
	cfg.Tracing = tracing.Config{Endpoint: rcv.srv.URL, SampleRatio: 1}
	logPath := t.TempDir() + "/access.log"
	cfg.AccessLog = DefaultAccessLogConfig()
	cfg.AccessLog.Dest = logPath
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + n.Addrs().HTTP.String() + "/cart")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	n.Stop(2 * time.Second) // flushes the log and the spans
	tp := <-got
	pc, ok := tracing.ParseTraceparent(tp)
	if !ok || !pc.Sampled {
		t.Fatalf("backend traceparent %q: want a valid, sampled one", tp)
	}
	spans := rcv.byName()["GET"]
	if len(spans) != 1 || !bytes.Equal(spans[0].TraceId, pc.TraceID[:]) || !bytes.Equal(spans[0].SpanId, pc.SpanID[:]) || len(spans[0].ParentSpanId) != 0 {
		t.Fatalf("spans %v: want one root span, trace and id of the backend's traceparent %s", spans, tp)
	}
	line, err := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(line), `"trace_id":"`+hex.EncodeToString(pc.TraceID[:])+`"`) {
		t.Errorf("access log %s (%v): want the trace id of %s", line, err, tp)
	}
}

const (
	httpTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sipTP  = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
)

// TestNodeCollectorDown: with nothing listening at -otlp-endpoint,
// traffic is served as without tracing, and the spans lost are counted.
func TestNodeCollectorDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") }))
	defer be.Close()
	cfg := testConfig(t)
	cfg.HTTPBackends = []string{be.Listener.Addr().String() + ",id=h1"}
	cfg.Tracing = tracing.DefaultConfig()
	cfg.Tracing.Endpoint = "http://" + dead
	cfg.AdminListen = "127.0.0.1:0"
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	const reqs = 50
	for range reqs {
		resp, err := http.Get("http://" + n.Addrs().HTTP.String() + "/")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d with the collector down", resp.StatusCode)
		}
	}
	// Counted in /metrics and /status while it runs.
	admin := "http://" + n.Addrs().Admin.String()
	fetch := func(path string) string {
		resp, err := http.Get(admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	want := fmt.Sprintf(`sluice_trace_spans_total{result="queued"} %d`, reqs)
	waitFor(t, 5*time.Second, want, func() bool { return strings.Contains(fetch("/metrics"), want) })
	var status struct {
		AccessLog struct {
			TraceSpans *tracing.Stats `json:"trace_spans"`
		} `json:"access_log"`
	}
	if err := json.Unmarshal([]byte(fetch("/status")), &status); err != nil || status.AccessLog.TraceSpans == nil || status.AccessLog.TraceSpans.Queued != reqs {
		t.Errorf("/status access_log.trace_spans %+v (%v), want %d queued", status.AccessLog.TraceSpans, err, reqs)
	}
	tracer := n.tracer
	n.Stop(2 * time.Second)
	if st := tracer.Stats(); st.Failed+st.Dropped != reqs || st.Exported != 0 {
		t.Errorf("tracer stats %+v: want all %d spans failed or dropped", st, reqs)
	}
}

func TestNodeTracingConfigErrors(t *testing.T) {
	for _, c := range []struct {
		tc   tracing.Config
		want string
	}{
		{tracing.Config{Endpoint: "grpc://collector:4317", SampleRatio: 1}, "-otlp-endpoint"},
		{tracing.Config{Endpoint: "http://collector:4318", SampleRatio: 2}, "-trace-sample 2"},
	} {
		cfg := testConfig(t)
		cfg.HTTPBackends = []string{"127.0.0.1:1,id=h1"}
		cfg.Tracing = c.tc
		if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New with %+v: %v, want an error naming %s", c.tc, err, c.want)
		}
	}
}

// TestNodeSIPAccessLogAndSpan: with -sip-access-log and -otlp-endpoint
// together, one SIP INVITE gives one JSON line (with the client's trace
// id) and one span, from the same record.
func TestNodeSIPAccessLogAndSpan(t *testing.T) {
	rcv := newOTLPReceiver(t)
	cfg := testConfig(t)
	cfg.SIPBackends = []string{sipAnswerer(t) + ",id=s1"}
	cfg.AccessLog = DefaultAccessLogConfig()
	file := filepath.Join(t.TempDir(), "sip.log")
	cfg.AccessLog.SIPDest = file
	cfg.Tracing = tracing.Config{Endpoint: rcv.srv.URL, SampleRatio: 1}
	n, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	sipInvite(t, n.Addrs().SIP, "logged@test", sipTP)
	n.Stop(2 * time.Second)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1: %q", len(lines), data)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("%v: %s", err, lines[0])
	}
	for k, v := range map[string]any{"method": "INVITE", "call_id": "logged@test", "status": float64(200), "status_from": "backend",
		"backend": "s1", "class": "new", "decision": "admitted", "trace_id": "0af7651916cd43dd8448eb211c80319c"} {
		if rec[k] != v {
			t.Errorf("line %s = %v, want %v", k, rec[k], v)
		}
	}
	if sp := rcv.byName()["SIP INVITE"]; len(sp) != 1 {
		t.Errorf("%d SIP INVITE spans, want 1", len(sp))
	}
}
