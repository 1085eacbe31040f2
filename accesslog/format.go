package accesslog

import (
	"net/netip"
	"strconv"
	"time"
	"unicode/utf8"
)

// The field names below are the README's table: they are stable across
// versions (a new field may be added; none is renamed or removed).

// enc appends fields in one of the key=value formats.
type enc struct {
	b     []byte
	f     Format
	first bool
	ts    *stampCache // the writer's; nil: no cache
}

// stampCache keeps the last timestamp formatted, so that the many lines
// of one millisecond (one second in the combined format) format it once:
// time.Time.AppendFormat was about a fifth of a JSON line's cost. Only
// the writer goroutine uses a Logger's.
type stampCache struct {
	ms   int64 // UTC milliseconds of iso; valid when isoN > 0
	iso  [24]byte
	isoN int
	sec  int64          // Unix seconds of clf; valid when clfN > 0
	loc  *time.Location // and the location it was formatted in
	clf  [32]byte
	clfN int
}

// appendISO appends t as 2006-01-02T15:04:05.000Z (UTC).
func (c *stampCache) appendISO(b []byte, t time.Time) []byte {
	if c == nil {
		return t.UTC().AppendFormat(b, isoLayout)
	}
	ms := t.UnixMilli()
	if c.isoN == 0 || ms != c.ms {
		// AppendFormat may outgrow the array (it appends nine digits of
		// the fraction, then cuts them): keep what it returns.
		n := len(b)
		b = t.UTC().AppendFormat(b, isoLayout)
		if len(b)-n > len(c.iso) { // a year past 9999: not cached
			c.isoN = 0
			return b
		}
		c.isoN, c.ms = copy(c.iso[:], b[n:]), ms
		return b
	}
	return append(b, c.iso[:c.isoN]...)
}

// appendCLF appends t as 02/Jan/2006:15:04:05 -0700 in t's location.
func (c *stampCache) appendCLF(b []byte, t time.Time) []byte {
	if c == nil {
		return t.AppendFormat(b, clfLayout)
	}
	sec, loc := t.Unix(), t.Location()
	if c.clfN == 0 || sec != c.sec || loc != c.loc {
		n := len(b)
		b = t.AppendFormat(b, clfLayout)
		if len(b)-n > len(c.clf) { // a year past 9999: not cached
			c.clfN = 0
			return b
		}
		c.clfN, c.sec, c.loc = copy(c.clf[:], b[n:]), sec, loc
		return b
	}
	return append(b, c.clf[:c.clfN]...)
}

const (
	isoLayout = "2006-01-02T15:04:05.000Z"
	clfLayout = "02/Jan/2006:15:04:05 -0700"
)

func (e *enc) key(k string) {
	if e.f == JSON {
		if !e.first {
			e.b = append(e.b, ',')
		}
		e.b = append(e.b, '"')
		e.b = append(e.b, k...)
		e.b = append(e.b, '"', ':')
	} else {
		if !e.first {
			e.b = append(e.b, ' ')
		}
		e.b = append(e.b, k...)
		e.b = append(e.b, '=')
	}
	e.first = false
}

func (e *enc) str(k string, v string) {
	e.key(k)
	if e.f == JSON {
		e.b = appendJSONString(e.b, v)
	} else {
		e.b = appendLogfmtValue(e.b, v)
	}
}

func (e *enc) bytes(k string, v []byte) {
	e.key(k)
	if e.f == JSON {
		e.b = appendJSONString(e.b, v)
	} else {
		e.b = appendLogfmtValue(e.b, v)
	}
}

func (e *enc) int(k string, v int64) {
	e.key(k)
	e.b = strconv.AppendInt(e.b, v, 10)
}

// ms writes a duration in milliseconds with microsecond precision
// (1.234), the unit of HAProxy's and Envoy's timers.
func (e *enc) ms(k string, d time.Duration) {
	e.key(k)
	e.b = appendMillis(e.b, d)
}

func appendMillis(b []byte, d time.Duration) []byte {
	if d < 0 {
		d = 0
	}
	us := int64(d / time.Microsecond)
	b = strconv.AppendInt(b, us/1000, 10)
	f := us % 1000
	return append(b, '.', byte('0'+f/100), byte('0'+f/10%10), byte('0'+f%10))
}

func (e *enc) addr(k string, a netip.Addr) {
	e.key(k)
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
	if a.IsValid() {
		e.b = a.Unmap().AppendTo(e.b)
	}
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
}

func (e *enc) addrPort(k string, a netip.AddrPort) {
	e.key(k)
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
	if a.IsValid() {
		e.b = netip.AddrPortFrom(a.Addr().Unmap(), a.Port()).AppendTo(e.b)
	}
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
}

func (e *enc) hex(k string, b []byte, valid bool) {
	e.key(k)
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
	if valid {
		e.b = AppendHex(e.b, b)
	}
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
}

// list writes names joined by ','.
func (e *enc) list(k string, names []string) {
	e.key(k)
	if e.f == JSON {
		e.b = append(e.b, '"')
	} else {
		quote := false
		for _, n := range names {
			if logfmtNeedsQuote(n) {
				quote = true
			}
		}
		if quote {
			// rare: a backend id with a space or a quote
			s := ""
			for i, n := range names {
				if i > 0 {
					s += ","
				}
				s += n
			}
			e.b = appendLogfmtValue(e.b, s)
			return
		}
	}
	for i, n := range names {
		if i > 0 {
			e.b = append(e.b, ',')
		}
		if e.f == JSON {
			e.b = appendJSONInner(e.b, n)
		} else {
			e.b = append(e.b, n...)
		}
	}
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
}

func (e *enc) time(k string, t time.Time) {
	e.key(k)
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
	e.b = e.ts.appendISO(e.b, t)
	if e.f == JSON {
		e.b = append(e.b, '"')
	}
}

func tlsName(v uint16) string {
	switch v {
	case 0:
		return ""
	case 0x0301:
		return "TLSv1.0"
	case 0x0302:
		return "TLSv1.1"
	case 0x0303:
		return "TLSv1.2"
	case 0x0304:
		return "TLSv1.3"
	}
	return "unknown"
}

func retried(names *[MaxRetries]string, n int) []string {
	if n > MaxRetries {
		n = MaxRetries
	}
	if n < 0 {
		n = 0
	}
	return names[:n]
}

// formatHTTP and formatSIP append a record's line to b without a
// timestamp cache (tests, benchmarks).
func (l *Logger) formatHTTP(b []byte, r *HTTPRecord) []byte { return l.fmtHTTP(b, r, nil) }

func (l *Logger) formatSIP(b []byte, r *SIPRecord) []byte { return l.fmtSIP(b, r, nil) }

// fmtHTTP appends r's line to b; ts is the calling writer's timestamp
// cache (nil: none).
func (l *Logger) fmtHTTP(b []byte, r *HTTPRecord, ts *stampCache) []byte {
	if l.opts.Format == Combined {
		return l.combinedHTTP(b, r, ts)
	}
	e := enc{b: b, f: l.opts.Format, first: true, ts: ts}
	if e.f == JSON {
		e.b = append(e.b, '{')
	}
	e.time("time", r.Start)
	e.str("log", "http")
	e.addrPort("client", r.Client)
	e.addr("forwarded_for", r.Forwarded)
	e.str("tls", tlsName(r.TLSVersion))
	e.bytes("sni", r.SNI)
	e.bytes("method", r.Method)
	e.bytes("host", r.Host)
	e.bytes("path", r.Path)
	// Always present, as every field: empty unless -access-log-query.
	if l.opts.Query {
		e.bytes("query", r.Query)
	} else {
		e.str("query", "")
	}
	e.str("protocol", r.Proto)
	e.int("status", int64(r.Status))
	e.int("bytes_in", r.BytesIn)
	e.int("bytes_out", r.BytesOut)
	e.str("pool", r.Pool)
	e.str("route", r.Route)
	e.str("backend", r.Backend)
	e.str("class", r.Class.String())
	e.str("decision", r.Decision.String())
	e.bytes("reason", r.Reason)
	e.int("retries", int64(r.Retries))
	e.list("retry_backends", retried(&r.RetryBackends, r.Retries))
	e.ms("t_head_ms", r.HeadRead)
	e.ms("t_wait_ms", r.AdmissionWait)
	e.ms("t_connect_ms", r.Connect)
	e.ms("t_first_byte_ms", r.FirstByte)
	e.ms("t_total_ms", r.Total)
	e.bytes("request_id", r.RequestID)
	e.hex("trace_id", r.TraceID[:], r.HasTrace)
	e.hex("parent_span_id", r.ParentSpan[:], r.HasTrace)
	e.bytes("user_agent", r.UserAgent)
	e.bytes("referer", r.Referer)
	e.str("end", r.End.String())
	if e.f == JSON {
		e.b = append(e.b, '}')
	}
	return e.b
}

// fmtSIP is fmtHTTP for a SIP record.
func (l *Logger) fmtSIP(b []byte, r *SIPRecord, ts *stampCache) []byte {
	if l.opts.Format == Combined {
		return l.combinedSIP(b, r, ts)
	}
	e := enc{b: b, f: l.opts.Format, first: true, ts: ts}
	if e.f == JSON {
		e.b = append(e.b, '{')
	}
	e.time("time", r.Start)
	e.str("log", "sip")
	e.str("kind", r.Kind.String())
	e.str("method", r.Method)
	e.key("ruri")
	ruri := r.RURI
	if l.opts.MaskUser {
		var mb [512]byte
		m := maskUser(mb[:0], ruri)
		if e.f == JSON {
			e.b = appendJSONString(e.b, m)
		} else {
			e.b = appendLogfmtValue(e.b, m)
		}
	} else if e.f == JSON {
		e.b = appendJSONString(e.b, ruri)
	} else {
		e.b = appendLogfmtValue(e.b, ruri)
	}
	e.str("call_id", r.CallID)
	e.str("from_tag", r.FromTag)
	e.str("to_tag", r.ToTag)
	e.int("cseq", int64(r.CSeq))
	e.str("transport", r.Transport)
	e.addrPort("source", r.Source)
	e.str("pool", r.Pool)
	e.str("backend", r.Backend)
	e.int("status", int64(r.Status))
	e.str("status_from", r.StatusFrom.String())
	e.str("class", r.Class.String())
	e.str("decision", r.Decision.String())
	e.str("reason", r.Reason)
	e.int("failovers", int64(r.Failovers))
	e.list("failover_backends", retried(&r.FailoverBackends, r.Failovers))
	e.ms("t_provisional_ms", r.Provisional)
	e.ms("t_final_ms", r.Final)
	if r.Kind == SIPDialogEnd {
		e.ms("duration_ms", r.Duration)
		e.str("bye_side", r.ByeSide)
	}
	e.hex("trace_id", r.TraceID[:], r.HasTrace)
	e.hex("parent_span_id", r.ParentSpan[:], r.HasTrace)
	if e.f == JSON {
		e.b = append(e.b, '}')
	}
	return e.b
}

// maskUser replaces the user part of a SIP or tel URI with '*':
// sip:alice@host -> sip:*@host, tel:+123 -> tel:*. The user part of a SIP
// URI is everything between the scheme's ':' and the first '@', its
// parameters and password included (sip:+358-555;postd=pp22@host ->
// sip:*@host); a URI without '@' has none and is left as it is.
func maskUser(dst []byte, uri string) []byte {
	start, end := userPart(uri)
	if start < 0 {
		return append(dst, uri...)
	}
	dst = append(dst, uri[:start]...)
	dst = append(dst, '*')
	return append(dst, uri[end:]...)
}

// MaskUser is maskUser for a string: uri itself when it has no user part
// (no allocation), else a new string. A front end masks before it cuts a
// long Request-URI to its bound, so a user part longer than the bound is
// masked too.
func MaskUser(uri string) string {
	start, end := userPart(uri)
	if start < 0 || end-start == 1 && uri[start] == '*' {
		return uri
	}
	return uri[:start] + "*" + uri[end:]
}

// userPart is where the user part of uri starts and ends; start < 0:
// none. The scheme is at most 5 bytes (sip, sips, tel).
func userPart(uri string) (start, end int) {
	colon := -1
	for i := 0; i < len(uri) && i < 6; i++ {
		if uri[i] == ':' {
			colon = i
			break
		}
	}
	if colon < 0 {
		return -1, -1
	}
	start = colon + 1
	if s := uri[:colon]; len(s) == 3 && (s[0]|0x20) == 't' && (s[1]|0x20) == 'e' && (s[2]|0x20) == 'l' {
		end = len(uri)
		for i := start; i < len(uri); i++ {
			if uri[i] == ';' {
				end = i
				break
			}
		}
		return start, end
	}
	for i := start; i < len(uri); i++ {
		if uri[i] == '@' {
			return start, i
		}
	}
	return -1, -1
}

// MasksUser reports whether the log masks the user part of SIP
// Request-URIs (Options.MaskUser): a front end then masks with MaskUser
// before it cuts the URI to its bound.
func (l *Logger) MasksUser() bool { return l != nil && l.opts.MaskUser }

// combinedHTTP is Apache's and nginx's combined format:
// HOST - - [TIME] "METHOD TARGET PROTO" STATUS BYTES "REFERER" "USER-AGENT"
// with the forwarded client as HOST when a trusted proxy gave one.
func (l *Logger) combinedHTTP(b []byte, r *HTTPRecord, ts *stampCache) []byte {
	switch {
	case r.Forwarded.IsValid():
		b = r.Forwarded.Unmap().AppendTo(b)
	case r.Client.IsValid():
		b = r.Client.Addr().Unmap().AppendTo(b)
	default:
		b = append(b, '-')
	}
	b = append(b, " - - ["...)
	b = ts.appendCLF(b, r.Start)
	b = append(b, "] \""...)
	if len(r.Method) == 0 {
		b = append(b, '-')
	} else {
		b = appendCombined(b, r.Method)
		b = append(b, ' ')
		b = appendCombined(b, r.Path)
		if l.opts.Query && len(r.Query) > 0 {
			b = append(b, '?')
			b = appendCombined(b, r.Query)
		}
		b = append(b, ' ')
		b = appendCombined(b, r.Proto)
	}
	b = append(b, "\" "...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, r.BytesOut, 10)
	b = append(b, " \""...)
	b = appendCombinedOrDash(b, r.Referer)
	b = append(b, "\" \""...)
	b = appendCombinedOrDash(b, r.UserAgent)
	return append(b, '"')
}

// combinedSIP fits a SIP transaction into the combined shape: SOURCE - -
// [TIME] "METHOD R-URI SIP/2.0" STATUS 0 "CALL-ID" "BACKEND".
func (l *Logger) combinedSIP(b []byte, r *SIPRecord, ts *stampCache) []byte {
	if r.Source.IsValid() {
		b = r.Source.Addr().Unmap().AppendTo(b)
	} else {
		b = append(b, '-')
	}
	b = append(b, " - - ["...)
	b = ts.appendCLF(b, r.Start)
	b = append(b, "] \""...)
	b = appendCombined(b, r.Method)
	b = append(b, ' ')
	if l.opts.MaskUser {
		var mb [512]byte
		b = appendCombined(b, maskUser(mb[:0], r.RURI))
	} else {
		b = appendCombined(b, r.RURI)
	}
	b = append(b, " SIP/2.0\" "...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, " 0 \""...)
	b = appendCombinedOrDash(b, r.CallID)
	b = append(b, "\" \""...)
	b = appendCombinedOrDash(b, r.Backend)
	return append(b, '"')
}

func appendCombinedOrDash[T ~string | ~[]byte](b []byte, s T) []byte {
	if len(s) == 0 {
		return append(b, '-')
	}
	return appendCombined(b, s)
}

// appendCombined escapes as nginx does: '"', '\' and bytes outside
// printable ASCII as \xHH.
func appendCombined[T ~string | ~[]byte](b []byte, s T) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			b = append(b, '\\', 'x', hexDigits[c>>4], hexDigits[c&15])
			continue
		}
		b = append(b, c)
	}
	return b
}

func appendJSONString[T ~string | ~[]byte](b []byte, s T) []byte {
	b = append(b, '"')
	b = appendJSONInner(b, s)
	return append(b, '"')
}

// jsonSafe marks the ASCII bytes a JSON string holds as they are: not a
// quote, a backslash, a control byte or DEL.
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < 0x7f; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendJSONInner escapes s as the inside of a JSON string: quotes,
// backslashes and control bytes escaped, invalid UTF-8 as U+FFFD, so a
// hostile path or user agent cannot break the line or the object. Runs
// of bytes that need nothing are appended at once.
func appendJSONInner[T ~string | ~[]byte](b []byte, s T) []byte {
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] < utf8.RuneSelf && jsonSafe[s[j]] {
			j++
		}
		if j > i {
			b = append(b, s[i:j]...)
			i = j
			if i == len(s) {
				break
			}
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			default: // c < 0x20 || c == 0x7f
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
			}
			i++
			continue
		}
		var rb [utf8.UTFMax]byte
		k := copy(rb[:], s[i:min(i+utf8.UTFMax, len(s))])
		r, n := utf8.DecodeRune(rb[:k])
		if r == utf8.RuneError && n <= 1 {
			b = append(b, `\ufffd`...)
			i++
			continue
		}
		if escapedRune(r) {
			b = append(b, '\\', 'u', hexDigits[r>>12&15], hexDigits[r>>8&15], hexDigits[r>>4&15], hexDigits[r&15])
			i += n
			continue
		}
		b = append(b, rb[:n]...)
		i += n
	}
	return b
}

// escapedRune reports whether r, valid UTF-8 JSON may carry as it is, is
// written as \uXXXX anyway: the line separators U+2028 and U+2029 (a
// line break to JavaScript and some log viewers), the C1 controls (U+0085
// is a line break to others), and the bidirectional controls (U+200E,
// U+200F, U+202A-U+202E, U+2066-U+2069), which make a terminal or a
// viewer show a field's text in another order than it has: a client's
// value could make a line read as something it does not say.
func escapedRune(r rune) bool {
	switch {
	case r >= 0x80 && r <= 0x9f, r == 0x2028, r == 0x2029, r == 0x200e, r == 0x200f,
		r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

func logfmtNeedsQuote[T ~string | ~[]byte](s T) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c == '=' || c == '"' || c == '\\' || c >= 0x7f {
			return true
		}
	}
	return false
}

// appendLogfmtValue writes s bare when it can, else as a quoted string
// with JSON's escapes.
func appendLogfmtValue[T ~string | ~[]byte](b []byte, s T) []byte {
	if !logfmtNeedsQuote(s) {
		return append(b, s...)
	}
	return appendJSONString(b, s)
}
