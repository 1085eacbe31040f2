package tracing

import (
	"encoding/hex"
	"time"
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
// ("00-<32 hex>-<16 hex>-<2 hex>", https://www.w3.org/TR/trace-context/):
// version 00 exactly, or a later version's first four fields (a later
// version may append more after a dash). All-zero ids, version ff and
// upper-case hex are invalid, as the recommendation says. It allocates
// nothing.
func ParseTraceparent(v string) (tc TraceContext, ok bool) {
	if len(v) < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return tc, false
	}
	var ver [1]byte
	if !lowerHex(ver[:], v[0:2]) || ver[0] == 0xff {
		return tc, false
	}
	if ver[0] == 0 && len(v) != 55 || ver[0] != 0 && len(v) > 55 && v[55] != '-' {
		return tc, false
	}
	var flags [1]byte
	if !lowerHex(tc.TraceID[:], v[3:35]) || !lowerHex(tc.SpanID[:], v[36:52]) || !lowerHex(flags[:], v[53:55]) {
		return TraceContext{}, false
	}
	if !tc.Valid() {
		return TraceContext{}, false
	}
	tc.Sampled = flags[0]&1 == 1
	return tc, true
}

// lowerHex decodes s (lower-case hex only) into dst.
func lowerHex(dst []byte, s string) bool {
	if len(s) != 2*len(dst) {
		return false
	}
	for i := range dst {
		hi, ok1 := nibble(s[2*i])
		lo, ok2 := nibble(s[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func nibble(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// String is tc as a traceparent header value (version 00).
func (tc *TraceContext) String() string {
	b := make([]byte, 0, 55)
	b = append(b, "00-"...)
	b = hex.AppendEncode(b, tc.TraceID[:])
	b = append(b, '-')
	b = hex.AppendEncode(b, tc.SpanID[:])
	if tc.Sampled {
		b = append(b, "-01"...)
	} else {
		b = append(b, "-00"...)
	}
	return string(b)
}
