package tracing

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluicelb/sluice/accesslog"
)

// Sink returns the access log's consumer that turns its records into
// spans: give it to accesslog.Options.Sinks. Its Want* methods run on
// the front ends' goroutines and only decide sampling (no allocation);
// its Write* methods run on the logger's writer goroutine and queue the
// span without blocking (Offer).
func (e *Exporter) Sink() accesslog.Sink { return sink{e} }

type sink struct{ e *Exporter }

func (k sink) WantHTTP(r *accesslog.HTTPRecord) bool {
	return k.want(r.HasTrace, r.TraceID, r.ParentSpan, r.TraceFlags)
}

func (k sink) WantSIP(r *accesslog.SIPRecord) bool {
	if r.Kind != accesslog.SIPTransaction {
		return false // a dialog summary is no request of its own
	}
	return k.want(r.HasTrace, r.TraceID, r.ParentSpan, r.TraceFlags)
}

func (k sink) want(has bool, tid [16]byte, pid [8]byte, flags byte) bool {
	var p TraceContext
	if has {
		p = TraceContext{TraceID: tid, SpanID: pid, Sampled: flags&1 == 1}
	}
	if k.e.Sampled(&p, nil) {
		return true
	}
	k.e.unsampled.Add(1)
	return false
}

func (k sink) WriteHTTP(r *accesslog.HTTPRecord, _ []byte) {
	var sp Span
	FromHTTP(&sp, r)
	if k.e.ownRoot(r.HasTrace, &r.TraceID, &r.ParentSpan) {
		// The trace context StartTrace made: the record's parent is
		// this span itself, a root.
		sp.Parent, sp.TraceID, sp.SpanID = TraceContext{}, r.TraceID, r.ParentSpan
	}
	k.e.enqueue(&sp)
}

func (k sink) WriteSIP(r *accesslog.SIPRecord, _ []byte) {
	if r.Kind != accesslog.SIPTransaction {
		return
	}
	var sp Span
	FromSIP(&sp, r, k.e.cfg.MaskUser)
	k.e.enqueue(&sp)
}

// enqueue is Offer for a span already sampled.
func (e *Exporter) enqueue(sp *Span) bool {
	select {
	case e.queue <- *sp:
		e.queued.Add(1)
		return true
	default:
		e.dropped.Add(1)
		return false
	}
}

// Span attribute names. The OpenTelemetry semantic conventions' names
// where they have one (HTTP server spans), sluice.* for what only sluice
// knows, sip.* for SIP (which the conventions do not cover). They are
// stable across versions.
const (
	AttrHTTPMethod     = "http.request.method"
	AttrHTTPStatus     = "http.response.status_code"
	AttrURLPath        = "url.path"
	AttrServerAddress  = "server.address"
	AttrProtoVersion   = "network.protocol.version"
	AttrClientAddress  = "client.address"
	AttrPeerAddress    = "network.peer.address"
	AttrPeerPort       = "network.peer.port"
	AttrTLSServerName  = "tls.server.name"
	AttrRequestSize    = "sluice.bytes_in"
	AttrResponseSize   = "sluice.bytes_out"
	AttrRequestID      = "sluice.request_id"
	AttrPool           = "sluice.pool"
	AttrRoute          = "sluice.route"
	AttrBackend        = "sluice.backend"
	AttrClass          = "sluice.admission.class"
	AttrDecision       = "sluice.admission.decision"
	AttrReason         = "sluice.admission.reason"
	AttrRetries        = "sluice.retries"
	AttrRetryBackends  = "sluice.retry_backends"
	AttrEnd            = "sluice.end"
	AttrHeadRead       = "sluice.head_read_us"
	AttrAdmissionWait  = "sluice.admission_wait_us"
	AttrConnect        = "sluice.connect_us"
	AttrFirstByte      = "sluice.first_byte_us"
	AttrTotal          = "sluice.total_us"
	AttrSIPMethod      = "sip.method"
	AttrSIPRURI        = "sip.request_uri"
	AttrSIPCallID      = "sip.call_id"
	AttrSIPFromTag     = "sip.from_tag"
	AttrSIPToTag       = "sip.to_tag"
	AttrSIPCSeq        = "sip.cseq"
	AttrSIPTransport   = "sip.transport"
	AttrSIPStatus      = "sip.status_code"
	AttrSIPStatusFrom  = "sip.status_from"
	AttrSIPFailovers   = "sluice.failovers"
	AttrSIPFailedOver  = "sluice.failover_backends"
	AttrSIPProvisional = "sluice.provisional_us"
	AttrSIPFinal       = "sluice.final_us"
)

// FromHTTP fills sp from an HTTP record: named by the method, from the
// request's start to its end, the client's traceparent as parent, and
// the admission decision, pool, route, backend, retries and timings as
// attributes. A 5xx answer or an exchange that did not complete (client
// abort, backend reset, timeout) has status Error.
func FromHTTP(sp *Span, r *accesslog.HTTPRecord) {
	*sp = Span{Name: string(r.Method), Start: r.Start, End: r.Start.Add(r.Total)}
	if sp.Name == "" {
		sp.Name = "HTTP"
	}
	if r.HasTrace {
		sp.Parent = TraceContext{TraceID: r.TraceID, SpanID: r.ParentSpan, Sampled: r.TraceFlags&1 == 1}
	}
	sp.Str(AttrHTTPMethod, string(r.Method))
	sp.Str(AttrURLPath, string(r.Path))
	sp.Str(AttrServerAddress, string(r.Host))
	sp.Str(AttrProtoVersion, strings.TrimPrefix(r.Proto, "HTTP/"))
	if r.Status != 0 {
		sp.Int(AttrHTTPStatus, int64(r.Status))
	}
	if r.Forwarded.IsValid() {
		sp.Str(AttrClientAddress, r.Forwarded.String())
	} else if r.Client.IsValid() {
		sp.Str(AttrClientAddress, r.Client.Addr().String())
	}
	if r.Client.IsValid() {
		sp.Str(AttrPeerAddress, r.Client.Addr().String())
		sp.Int(AttrPeerPort, int64(r.Client.Port()))
	}
	sp.Str(AttrTLSServerName, string(r.SNI))
	sp.Int(AttrRequestSize, r.BytesIn)
	sp.Int(AttrResponseSize, r.BytesOut)
	sp.Str(AttrRequestID, string(r.RequestID))
	sp.Str(AttrPool, r.Pool)
	sp.Str(AttrRoute, r.Route)
	sp.Str(AttrBackend, r.Backend)
	sp.Str(AttrClass, r.Class.String())
	sp.Str(AttrDecision, r.Decision.String())
	sp.Str(AttrReason, string(r.Reason))
	sp.Int(AttrRetries, int64(r.Retries))
	sp.Str(AttrRetryBackends, joinTried(&r.RetryBackends, r.Retries))
	sp.Str(AttrEnd, r.End.String())
	durIf(sp, AttrHeadRead, r.HeadRead)
	durIf(sp, AttrAdmissionWait, r.AdmissionWait)
	durIf(sp, AttrConnect, r.Connect)
	durIf(sp, AttrFirstByte, r.FirstByte)
	sp.Dur(AttrTotal, r.Total)
	switch {
	case r.Status >= 500:
		sp.Error, sp.ErrorText = true, strconv.Itoa(r.Status)+" "+string(r.Reason)
	case r.End == accesslog.EndClientAbort || r.End == accesslog.EndBackendReset || r.End == accesslog.EndTimeout:
		sp.Error, sp.ErrorText = true, r.End.String()
	}
	sp.ErrorText = strings.TrimSpace(sp.ErrorText)
}

// FromSIP fills sp from a SIP transaction record: named "SIP " and the
// method, from the request to its final answer, the traceparent header
// of the request as parent, and the admission decision, pool, backend,
// failovers and timings as attributes. With maskUser the Request-URI's
// user part is replaced by '*' (-access-log-mask-user). A 5xx or 6xx
// final answer, or none, has status Error.
func FromSIP(sp *Span, r *accesslog.SIPRecord, maskUser bool) {
	end := r.Final
	if r.Provisional > end {
		end = r.Provisional
	}
	*sp = Span{Name: "SIP " + r.Method, Start: r.Start, End: r.Start.Add(end)}
	if r.HasTrace {
		sp.Parent = TraceContext{TraceID: r.TraceID, SpanID: r.ParentSpan, Sampled: r.TraceFlags&1 == 1}
	}
	sp.Str(AttrSIPMethod, r.Method)
	ruri := r.RURI
	if maskUser {
		ruri = MaskUser(ruri)
	}
	sp.Str(AttrSIPRURI, ruri)
	sp.Str(AttrSIPCallID, r.CallID)
	sp.Str(AttrSIPFromTag, r.FromTag)
	sp.Str(AttrSIPToTag, r.ToTag)
	sp.Int(AttrSIPCSeq, int64(r.CSeq))
	sp.Str(AttrSIPTransport, r.Transport)
	if r.Source.IsValid() {
		sp.Str(AttrPeerAddress, r.Source.Addr().String())
		sp.Int(AttrPeerPort, int64(r.Source.Port()))
	}
	if r.Status != 0 {
		sp.Int(AttrSIPStatus, int64(r.Status))
		sp.Str(AttrSIPStatusFrom, r.StatusFrom.String())
	}
	sp.Str(AttrPool, r.Pool)
	sp.Str(AttrBackend, r.Backend)
	sp.Str(AttrClass, r.Class.String())
	sp.Str(AttrDecision, r.Decision.String())
	sp.Str(AttrReason, r.Reason)
	sp.Int(AttrSIPFailovers, int64(r.Failovers))
	sp.Str(AttrSIPFailedOver, joinTried(&r.FailoverBackends, r.Failovers))
	durIf(sp, AttrSIPProvisional, r.Provisional)
	sp.Dur(AttrSIPFinal, r.Final)
	switch {
	case r.Status == 0:
		sp.Error, sp.ErrorText = true, "no final answer"
	case r.Status >= 500:
		sp.Error, sp.ErrorText = true, strings.TrimSpace(strconv.Itoa(r.Status)+" "+r.Reason)
	}
}

// durIf adds a timing that is 0 when its step did not happen.
func durIf(sp *Span, key string, d time.Duration) {
	if d > 0 {
		sp.Dur(key, d)
	}
}

// joinTried is the first n backends of names, comma-separated ("" for none).
func joinTried(names *[accesslog.MaxRetries]string, n int) string {
	n = min(n, len(names))
	switch n {
	case 0:
		return ""
	case 1:
		return names[0]
	}
	return strings.Join(names[:n], ",")
}

// MaskUser replaces the user part of a SIP or tel URI with '*', exactly
// as the access log does with -access-log-mask-user (accesslog.MaskUser:
// everything between the scheme and the first '@', its ';' parameters and
// a password included): sip:alice;x=y@host -> sip:*@host, tel:+123;x ->
// tel:*;x. A span must not keep what the log line hides.
func MaskUser(uri string) string { return accesslog.MaskUser(uri) }
