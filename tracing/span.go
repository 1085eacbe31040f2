package tracing

import (
	"time"

	"github.com/sluicelb/sluice/accesslog"
)

// Span is one finished request or transaction as the exporter takes it:
// a value with a fixed number of attributes and no pointer but strings, so
// queueing it copies it and allocates nothing. The front ends' records are
// turned into one (FromHTTP, FromSIP) on the path that ends the request;
// the OpenTelemetry span is built from it later, on the exporter's own
// goroutine.
type Span struct {
	// Name is the span's name ("GET", "SIP INVITE").
	Name string
	// Start and End are when the request arrived and when it ended.
	Start, End time.Time
	// Parent is the client's trace context (W3C traceparent); zero when
	// the client sent none, and the span is then the root of a new trace
	// (with TraceID when set, so that the access log and the trace name
	// the same trace).
	Parent TraceContext
	// TraceID is the trace of a span without Parent, when the request was
	// given one (the access log's trace id); zero: a new random one.
	TraceID [16]byte
	// SpanID is the span's own id when the request was given one before
	// it went to its backend (StartTrace: the parent in the traceparent
	// sluice sent), so that the backend's spans are its children; zero:
	// a new random one.
	SpanID [8]byte
	// Error marks a request that ended in failure (a 5xx, an abort); the
	// span's status is then Error with ErrorText as its description.
	Error     bool
	ErrorText string

	attrs [MaxAttrs]Attr
	n     int
}

// MaxAttrs is how many attributes a Span holds; more are dropped (a span
// built by this package never has that many).
const MaxAttrs = 32

// Attr is one span attribute: a string or an integer.
type Attr struct {
	Key   string
	Str   string
	Int   int64
	IsInt bool
}

// Str adds a string attribute; an empty value is left out.
func (s *Span) Str(key, v string) {
	if v == "" || s.n == MaxAttrs {
		return
	}
	s.attrs[s.n] = Attr{Key: key, Str: v}
	s.n++
}

// Int adds an integer attribute.
func (s *Span) Int(key string, v int64) {
	if s.n == MaxAttrs {
		return
	}
	s.attrs[s.n] = Attr{Key: key, Int: v, IsInt: true}
	s.n++
}

// Dur adds a duration attribute in microseconds, left out when negative
// (the phase did not happen).
func (s *Span) Dur(key string, d time.Duration) {
	if d < 0 {
		return
	}
	s.Int(key, d.Microseconds())
}

// Attrs returns the attributes added so far.
func (s *Span) Attrs() []Attr { return s.attrs[:s.n] }

// TraceContext is a parsed W3C trace context (traceparent, tracestate).
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
	// Sampled is the traceparent's sampled flag.
	Sampled bool
	// State is the tracestate header as received ("" when absent).
	State string
}

// Valid reports whether tc names a parent: both ids are non-zero.
func (tc *TraceContext) Valid() bool {
	return tc.TraceID != [16]byte{} && tc.SpanID != [8]byte{}
}

// ParseTraceparent parses a W3C traceparent header value
// ("00-<32 hex>-<16 hex>-<2 hex>", https://www.w3.org/TR/trace-context/)
// with the access log's parser (accesslog.ParseTraceparent: version ff,
// all-zero ids and upper-case hex are invalid; a version above 00 may
// carry more fields). It allocates nothing.
func ParseTraceparent(v string) (tc TraceContext, ok bool) {
	tid, pid, flags, ok := accesslog.ParseTraceparent(v)
	if !ok {
		return TraceContext{}, false
	}
	return TraceContext{TraceID: tid, SpanID: pid, Sampled: flags&1 == 1}, true
}

// String is tc as a traceparent header value (version 00).
func (tc *TraceContext) String() string {
	var flags byte
	if tc.Sampled {
		flags = 1
	}
	return accesslog.FormatTraceparent(tc.TraceID, tc.SpanID, flags)
}
