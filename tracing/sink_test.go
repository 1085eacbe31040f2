package tracing

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/sluicelb/sluice/accesslog"
)

var t0 = time.Date(2026, 12, 1, 14, 2, 3, 456_000_000, time.UTC)

func httpRecord(traceparent string) accesslog.HTTPRecord {
	r := accesslog.HTTPRecord{
		Start: t0, Client: netip.MustParseAddrPort("198.51.100.4:50412"),
		Method: []byte("GET"), Host: []byte("shop.example.com"), Path: []byte("/cart"), Proto: "HTTP/1.1",
		Status: 200, BytesIn: 412, BytesOut: 5120, Pool: "web", Route: "shop", Backend: "w2",
		Class: accesslog.ClassNew, Decision: accesslog.Delayed, Reason: []byte("arm rule burst pool web"),
		Retries: 1, RetryBackends: [accesslog.MaxRetries]string{"w1"},
		HeadRead: 100 * time.Microsecond, AdmissionWait: 20 * time.Millisecond, Connect: 21 * time.Millisecond,
		FirstByte: 30 * time.Millisecond, Total: 31 * time.Millisecond, RequestID: []byte("req-1"),
	}
	r.TraceID, r.ParentSpan, r.TraceFlags, r.HasTrace = accesslog.ParseTraceparent(traceparent)
	return r
}

func sipRecord(traceparent string) accesslog.SIPRecord {
	r := accesslog.SIPRecord{
		Start: t0, Method: "INVITE", RURI: "sip:alice@example.com;transport=udp", CallID: "a84b4c76e66710@pc33",
		FromTag: "1928301774", CSeq: 314159, Transport: "udp", Source: netip.MustParseAddrPort("198.51.100.4:5060"),
		Pool: "default", Backend: "b2", Status: 200, StatusFrom: accesslog.ByBackend,
		Failovers: 1, FailoverBackends: [accesslog.MaxRetries]string{"b1"},
		Provisional: 40 * time.Millisecond, Final: 900 * time.Millisecond,
	}
	r.TraceID, r.ParentSpan, r.TraceFlags, r.HasTrace = accesslog.ParseTraceparent(traceparent)
	return r
}

func TestFromRecords(t *testing.T) {
	var sp Span
	hr := httpRecord("")
	FromHTTP(&sp, &hr)
	want := map[string]any{
		AttrHTTPMethod: "GET", AttrURLPath: "/cart", AttrServerAddress: "shop.example.com", AttrProtoVersion: "1.1",
		AttrHTTPStatus: int64(200), AttrClientAddress: "198.51.100.4", AttrPeerAddress: "198.51.100.4", AttrPeerPort: int64(50412),
		AttrRequestSize: int64(412), AttrResponseSize: int64(5120), AttrRequestID: "req-1", AttrPool: "web", AttrRoute: "shop",
		AttrBackend: "w2", AttrClass: "new", AttrDecision: "delayed", AttrReason: "arm rule burst pool web", AttrRetries: int64(1),
		AttrRetryBackends: "w1", AttrEnd: "complete", AttrHeadRead: int64(100), AttrAdmissionWait: int64(20000),
		AttrConnect: int64(21000), AttrFirstByte: int64(30000), AttrTotal: int64(31000),
	}
	checkAttrs(t, "http", &sp, want)
	if sp.Name != "GET" || !sp.Start.Equal(t0) || !sp.End.Equal(t0.Add(31*time.Millisecond)) || sp.Error || sp.Parent.Valid() {
		t.Errorf("http span %+v", sp)
	}
	hr.Status, hr.End = 502, accesslog.EndBackendReset
	FromHTTP(&sp, &hr)
	if !sp.Error || sp.ErrorText != "502 arm rule burst pool web" {
		t.Errorf("502: error %v %q", sp.Error, sp.ErrorText)
	}
	hr.Status, hr.End = 200, accesslog.EndClientAbort
	FromHTTP(&sp, &hr)
	if !sp.Error || sp.ErrorText != "client_abort" {
		t.Errorf("client abort: error %v %q", sp.Error, sp.ErrorText)
	}

	sr := sipRecord("")
	FromSIP(&sp, &sr, true)
	checkAttrs(t, "sip", &sp, map[string]any{
		AttrSIPMethod: "INVITE", AttrSIPRURI: "sip:*@example.com;transport=udp", AttrSIPCallID: "a84b4c76e66710@pc33",
		AttrSIPFromTag: "1928301774", AttrSIPCSeq: int64(314159), AttrSIPTransport: "udp", AttrPeerAddress: "198.51.100.4",
		AttrPeerPort: int64(5060), AttrSIPStatus: int64(200), AttrSIPStatusFrom: "backend", AttrPool: "default", AttrBackend: "b2",
		AttrClass: "new", AttrDecision: "admitted", AttrSIPFailovers: int64(1), AttrSIPFailedOver: "b1",
		AttrSIPProvisional: int64(40000), AttrSIPFinal: int64(900000),
	})
	if sp.Name != "SIP INVITE" || !sp.End.Equal(t0.Add(900*time.Millisecond)) || sp.Error {
		t.Errorf("sip span %+v", sp)
	}
	sr.Status, sr.StatusFrom, sr.Decision, sr.Reason = 503, accesslog.BySluice, accesslog.Refused, "overload: memory pool default"
	FromSIP(&sp, &sr, false)
	if !sp.Error || sp.ErrorText != "503 overload: memory pool default" {
		t.Errorf("503: error %v %q", sp.Error, sp.ErrorText)
	}
}

func checkAttrs(t *testing.T, what string, sp *Span, want map[string]any) {
	t.Helper()
	got := map[string]any{}
	for _, a := range sp.Attrs() {
		if a.IsInt {
			got[a.Key] = a.Int
		} else {
			got[a.Key] = a.Str
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %v, want %v", what, k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected attribute %s = %v", what, k, v)
		}
	}
}

func TestMaskUser(t *testing.T) {
	for _, c := range [][2]string{
		{"sip:alice@example.com", "sip:*@example.com"},
		{"sips:alice:secret@example.com;transport=tls", "sips:*@example.com;transport=tls"},
		{"sip:example.com;transport=udp", "sip:example.com;transport=udp"},
		{"sip:alice;x=y@127.0.0.1", "sip:*@127.0.0.1"},
		{"sip:+358-555-1234567;postd=pp22@foo.com;user=phone", "sip:*@foo.com;user=phone"},
		{"sip:example.com;maddr=x", "sip:example.com;maddr=x"},
		{"tel:+15551234;phone-context=x", "tel:*;phone-context=x"},
		{"TEL:+15551234", "TEL:*"},
		{"noscheme", "noscheme"},
		{"", ""},
	} {
		if got := MaskUser(c[0]); got != c[1] {
			t.Errorf("MaskUser(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}

// TestSinkThroughLogger: records logged with the access log reach the
// collector as spans whose parent is the client's traceparent, for an
// HTTP request and a SIP transaction; an unsampled traceparent is not
// exported, and dialog summaries are not spans.
func TestSinkThroughLogger(t *testing.T) {
	r := newReceiver(t)
	e := newTestExporter(t, r.srv.URL, 0, 64) // ratio 0: only sampled parents
	l, err := accesslog.New(accesslog.Options{Sample: accesslog.DefaultSample, Sinks: []accesslog.Sink{e.Sink()}})
	if err != nil {
		t.Fatal(err)
	}
	const tpHTTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const tpSIP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	hr := httpRecord(tpHTTP)
	l.LogHTTP(&hr)
	sr := sipRecord(tpSIP)
	l.LogSIP(&sr)
	un := httpRecord("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	l.LogHTTP(&un)
	none := sipRecord("") // no parent at ratio 0
	l.LogSIP(&none)
	dlg := sipRecord(tpSIP)
	dlg.Kind = accesslog.SIPDialogEnd
	l.LogSIP(&dlg)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := r.got()
	if len(got) != 2 {
		t.Fatalf("collector got %d spans, want 2", len(got))
	}
	byName := map[string]*tracepb.Span{}
	for _, sp := range got {
		byName[sp.Name] = sp
	}
	for name, tp := range map[string]string{"GET": tpHTTP, "SIP INVITE": tpSIP} {
		sp := byName[name]
		pc, _ := ParseTraceparent(tp)
		if sp == nil || !bytes.Equal(sp.TraceId, pc.TraceID[:]) || !bytes.Equal(sp.ParentSpanId, pc.SpanID[:]) {
			t.Errorf("span %s = %v, want the parent of %s", name, sp, tp)
			continue
		}
		if sp.StartTimeUnixNano != uint64(t0.UnixNano()) {
			t.Errorf("span %s starts at %d, want the record's %d", name, sp.StartTimeUnixNano, t0.UnixNano())
		}
	}
	if a := attrs(byName["GET"]); a[AttrDecision] != "delayed" || a[AttrAdmissionWait] != int64(20000) || a[AttrPool] != "web" {
		t.Errorf("http attributes %v", a)
	}
	if a := attrs(byName["SIP INVITE"]); a[AttrSIPCallID] != "a84b4c76e66710@pc33" || a[AttrSIPFailovers] != int64(1) || a[AttrBackend] != "b2" {
		t.Errorf("sip attributes %v", a)
	}
	if st := e.Stats(); st.Unsampled != 2 || st.Exported != 2 {
		t.Errorf("stats %+v, want 2 unsampled and 2 exported", st)
	}
}

// TestSinkWantAllocs: the data-plane half of the sink allocates nothing.
func TestSinkWantAllocs(t *testing.T) {
	e := &Exporter{bound: 1 << 62}
	k := e.Sink()
	hr := httpRecord("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	sr := sipRecord("")
	if n := testing.AllocsPerRun(1000, func() { k.WantHTTP(&hr); k.WantSIP(&sr) }); n != 0 {
		t.Errorf("Want* allocate %v times", n)
	}
}

// TestStartTraceRoot: a request given a trace by StartTrace (no valid
// traceparent from its client) is exported as a root span with that trace
// id and that span id, the parent of the traceparent its backend got; the
// sampled flag is the one StartTrace decided; a client's traceparent that
// happens to carry some other span id stays a parent.
func TestStartTraceRoot(t *testing.T) {
	r := newReceiver(t)
	e := newTestExporter(t, r.srv.URL, 1, 64)
	tid, sid, sampled := e.StartTrace()
	tid2, sid2, _ := e.StartTrace()
	if !sampled || tid == ([16]byte{}) || sid == ([8]byte{}) || tid == tid2 || sid == sid2 {
		t.Fatalf("StartTrace = %x %x %v, then %x %x: want fresh non-zero ids, sampled at ratio 1", tid, sid, sampled, tid2, sid2)
	}
	l, err := accesslog.New(accesslog.Options{Sample: accesslog.DefaultSample, Sinks: []accesslog.Sink{e.Sink()}})
	if err != nil {
		t.Fatal(err)
	}
	own := httpRecord("")
	own.TraceID, own.ParentSpan, own.TraceFlags, own.HasTrace = tid, sid, 1, true
	l.LogHTTP(&own)
	forged := httpRecord("")
	forged.Method = []byte("POST")
	forged.TraceID, forged.ParentSpan, forged.TraceFlags, forged.HasTrace = tid2, sid, 1, true // sid is tid's, not tid2's
	l.LogHTTP(&forged)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	byName := map[string]*tracepb.Span{}
	for _, sp := range r.got() {
		byName[sp.Name] = sp
	}
	if sp := byName["GET"]; sp == nil || !bytes.Equal(sp.TraceId, tid[:]) || !bytes.Equal(sp.SpanId, sid[:]) || len(sp.ParentSpanId) != 0 {
		t.Errorf("span %v: want trace %x, span id %x, no parent", sp, tid, sid)
	}
	if sp := byName["POST"]; sp == nil || !bytes.Equal(sp.ParentSpanId, sid[:]) || bytes.Equal(sp.SpanId, sid[:]) {
		t.Errorf("span %v: want parent %x and an id of its own", sp, sid)
	}

	// Unsampled at ratio 0: the flag says so, and the span is not exported.
	e0 := newTestExporter(t, r.srv.URL, 0, 64)
	if _, _, s := e0.StartTrace(); s {
		t.Error("StartTrace sampled at ratio 0")
	}
	if n := testing.AllocsPerRun(100, func() { e.StartTrace() }); n != 0 {
		t.Errorf("StartTrace allocates %v times", n)
	}
}
