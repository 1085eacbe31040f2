package http

import (
	"bytes"
	"errors"
)

// The request head check: every request head sluice forwards, on either
// engine, is first read by checkHead, which decides the request's framing
// once, from the bytes the client sent, and rejects every head that two
// HTTP/1.1 parsers could read differently (RFC 9112 §§2-7, RFC 9110
// §5.5, §7.6.1). A parser that frames bytes differently from the backend
// behind it lets one client smuggle a request onto a connection that
// carries other clients' requests; so where RFC 9112 allows a recipient to
// be lenient, sluice is strict and answers 400 with the connection closed.
// See the security section of the package README for the list.

// maxHeadSize is the largest request head either engine accepts; a larger
// head is answered 431.
const maxHeadSize = 16 << 10

// headInfo is what checkHead learned of a request head.
type headInfo struct {
	n         int   // bytes of the head, up to and including the empty line
	bodyLen   int64 // Content-Length; -1 when the head has none
	chunked   bool  // Transfer-Encoding: chunked
	http10    bool  // HTTP/1.0 (else HTTP/1.1)
	hostLen   int   // length of the Host value; -1 when there is none
	authStart int   // absolute-form target: the authority is head[authStart:authEnd]
	authEnd   int
	pathStart int // absolute-form target: the origin-form rest starts here ("" means "/")
	pathEnd   int
	// loopMarks: the head has a Sluice-Via field (loop.go); the front end
	// then looks for its own mark in it.
	loopMarks bool
}

// absolute reports whether the request target is in absolute form.
func (h *headInfo) absolute() bool { return h.authEnd > 0 }

// headError is a request head sluice refuses: the status to answer and a
// reason for the log and the Proxy-Status details. The connection is
// closed after the answer.
type headError struct {
	status int
	reason string
}

func (e *headError) Error() string { return e.reason }

// errHeadIncomplete means the head has not ended yet: read more bytes.
var errHeadIncomplete = errors.New("request head incomplete")

func badHead(reason string) *headError { return &headError{status: 400, reason: reason} }

// Refusals of checkHead, shared so the hot path does not allocate.
var (
	errHeadTooLarge   = &headError{status: 431, reason: "request head too large"}
	errURITooLong     = &headError{status: 414, reason: "request target too long"}
	errBareLF         = badHead("bare LF line end")
	errBareCR         = badHead("bare CR in request head")
	errRequestLine    = badHead("malformed request line")
	errMethod         = badHead("malformed method")
	errTarget         = badHead("malformed request target")
	errVersion        = &headError{status: 505, reason: "HTTP version not supported"}
	errFieldName      = badHead("malformed header field name")
	errSpaceColon     = badHead("whitespace between header field name and colon")
	errFieldValue     = badHead("control character in header field value")
	errObsFold        = badHead("obsolete line folding")
	errCLTE           = badHead("both Content-Length and Transfer-Encoding")
	errCL             = badHead("malformed Content-Length")
	errCLDup          = badHead("more than one Content-Length")
	errTE             = badHead("Transfer-Encoding other than chunked")
	errTE10           = badHead("Transfer-Encoding in an HTTP/1.0 request")
	errTEDup          = badHead("more than one Transfer-Encoding")
	errHostMissing    = badHead("HTTP/1.1 request without Host")
	errHostDup        = badHead("more than one Host")
	errHostBad        = badHead("malformed Host")
	errHostEmpty      = badHead("empty Host")
	errUserinfo       = badHead("userinfo in request target")
	errConnNominates  = badHead("Connection names a header the proxy relies on")
	errConnToken      = badHead("malformed Connection")
	errAsterisk       = badHead("asterisk-form target with a method other than OPTIONS")
	errConnect        = &headError{status: 501, reason: "CONNECT not supported"}
	errAuthorityForm  = badHead("authority-form target with a method other than CONNECT")
	errTooManyHeaders = &headError{status: 431, reason: "too many header fields"}
)

// maxHeaderFields bounds the fields of one head (fasthttp and the backend
// parse them all).
const maxHeaderFields = 200

// tchar marks the bytes of a token (RFC 9110 §5.6.2).
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-32] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return
}()

// fieldChar marks the bytes allowed in a field value: visible ASCII,
// obs-text, SP and HTAB (RFC 9110 §5.5).
var fieldChar = func() (t [256]bool) {
	for c := 0x21; c <= 0xff; c++ {
		t[c] = c != 0x7f
	}
	t[' '], t['\t'] = true, true
	return
}()

// targetChar marks the bytes allowed in a request target: visible ASCII
// but '#' (a fragment is never sent, RFC 9112 §3.2; parsers differ on
// whether they cut it off). Raw non-ASCII bytes are refused (clients
// percent-encode them).
var targetChar = func() (t [256]bool) {
	for c := 0x21; c <= 0x7e; c++ {
		t[c] = c != '#'
	}
	return
}()

// hostChar marks the bytes of a Host value: reg-name, IP literal and
// port characters (RFC 3986 §3.2.2). validHost checks the structure.
var hostChar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-32] = true
	}
	for _, c := range "-._~!$&'()*+,;=:%[]" {
		t[c] = true
	}
	return
}()

// regNameChar marks the bytes of a reg-name or IPv4 address without
// percent-encoding (unreserved and sub-delims, RFC 3986 §3.2.2).
var regNameChar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-32] = true
	}
	for _, c := range "-._~!$&'()*+,;=" {
		t[c] = true
	}
	return
}()

// validHost reports whether v is uri-host [ ":" port ]: a reg-name or
// IPv4 address of unreserved and sub-delim characters, or an IPv6 literal
// in brackets, then at most one port of 1 to 5 digits. Percent-encoding
// is refused: parsers disagree on whether to decode it.
func validHost(v []byte) bool {
	host, port, hasPort := v, []byte(nil), false
	if len(v) > 0 && v[0] == '[' {
		i := bytes.IndexByte(v, ']')
		if i < 2 {
			return false
		}
		for _, c := range v[1:i] {
			if !isHex(c) && c != ':' && c != '.' {
				return false
			}
		}
		rest := v[i+1:]
		if len(rest) > 0 {
			if rest[0] != ':' {
				return false
			}
			port, hasPort = rest[1:], true
		}
		host = nil
	} else if i := bytes.IndexByte(v, ':'); i >= 0 {
		host, port, hasPort = v[:i], v[i+1:], true
	}
	for _, c := range host {
		if !regNameChar[c] {
			return false
		}
	}
	if hasPort {
		if len(port) == 0 || len(port) > 5 {
			return false
		}
		for _, c := range port {
			if c < '0' || c > '9' {
				return false
			}
		}
	}
	return len(v) > 0
}

// checkHead reads the request head at the start of p. It returns
// errHeadIncomplete when p holds no complete head yet (and is not over
// maxHeadSize), a *headError when the head is refused, else what it
// learned. It allocates nothing. extra are more header names (lower
// case) that Connection may not name: the consistent-hash headers and
// the headers routes test (denyList).
func checkHead(p []byte, extra []string) (headInfo, error) {
	h := headInfo{bodyLen: -1, hostLen: -1}
	// The request line. RFC 9112 §2.2 lets a server ignore empty lines
	// before it; sluice does not (a client sends none).
	eol, err := lineEnd(p, 0)
	if err == errHeadTooLarge {
		return h, longRequestLine(p)
	}
	if err != nil {
		return h, err
	}
	line := p[:eol]
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return h, errRequestLine
	}
	method := line[:sp1]
	for _, c := range method {
		if !tchar[c] {
			return h, errMethod
		}
	}
	rest := line[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 {
		return h, errRequestLine
	}
	target := rest[:sp2]
	switch proto := rest[sp2+1:]; string(proto) {
	case "HTTP/1.1":
	case "HTTP/1.0":
		h.http10 = true
	default:
		if len(proto) == 8 && string(proto[:5]) == "HTTP/" && proto[5] >= '0' && proto[5] <= '9' && proto[6] == '.' && proto[7] >= '0' && proto[7] <= '9' {
			return h, errVersion
		}
		return h, errRequestLine
	}
	for i, c := range target {
		if !targetChar[c] {
			return h, errTarget
		}
		// A '%' starts a percent-encoded octet (RFC 3986 §2.1); a backend
		// that decodes the target refuses a broken one.
		if c == '%' && (i+2 >= len(target) || !isHex(target[i+1]) || !isHex(target[i+2])) {
			return h, errTarget
		}
	}
	tOff := sp1 + 1
	switch {
	case target[0] == '/':
	case len(target) == 1 && target[0] == '*':
		if string(method) != "OPTIONS" {
			return h, errAsterisk
		}
	case string(method) == "CONNECT":
		return h, errConnect
	default:
		if err := h.absoluteForm(target, tOff); err != nil {
			return h, err
		}
	}

	// The header fields.
	var (
		teSeen, connBad bool
		fields          int
	)
	pos := eol + 2
	for {
		eol, err := lineEnd(p, pos)
		if err != nil {
			return h, err
		}
		line := p[pos:eol]
		pos = eol + 2
		if len(line) == 0 {
			break
		}
		if fields++; fields > maxHeaderFields {
			return h, errTooManyHeaders
		}
		if line[0] == ' ' || line[0] == '\t' {
			return h, errObsFold
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return h, errFieldName
		}
		name := line[:colon]
		for _, c := range name {
			if !tchar[c] {
				if last := name[len(name)-1]; last == ' ' || last == '\t' {
					return h, errSpaceColon
				}
				return h, errFieldName
			}
		}
		value := trimOWS(line[colon+1:])
		for _, c := range value {
			if !fieldChar[c] {
				if c == '\r' {
					return h, errBareCR
				}
				return h, errFieldValue
			}
		}
		switch len(name) {
		case 4, 10, 14, 17: // host, connection and sluice-via, content-length, transfer-encoding
		default:
			continue
		}
		switch {
		case eqFold(name, loopHeaderLower):
			h.loopMarks = true
		case eqFold(name, "content-length"):
			if h.bodyLen >= 0 {
				return h, errCLDup
			}
			n, ok := parseLength(value)
			if !ok {
				return h, errCL
			}
			h.bodyLen = n
		case eqFold(name, "transfer-encoding"):
			if teSeen {
				return h, errTEDup
			}
			teSeen = true
			if !eqFold(value, "chunked") {
				return h, errTE
			}
			h.chunked = true
		case eqFold(name, "host"):
			if h.hostLen >= 0 {
				return h, errHostDup
			}
			if len(value) == 0 {
				// Valid only for targets without an authority (RFC 9112
				// §3.2), which no origin server behind a balancer serves;
				// fasthttp refuses it too.
				return h, errHostEmpty
			}
			if !validHost(value) {
				return h, errHostBad
			}
			h.hostLen = len(value)
		case eqFold(name, "connection"):
			if bad, ok := connectionNominates(value, extra); !ok {
				return h, errConnToken
			} else if bad {
				connBad = true
			}
		}
	}
	h.n = pos
	switch {
	case connBad:
		return h, errConnNominates
	case teSeen && h.bodyLen >= 0:
		return h, errCLTE
	case teSeen && h.http10:
		return h, errTE10
	case h.hostLen < 0 && !h.http10:
		return h, errHostMissing
	}
	return h, nil
}

// longRequestLine is the refusal of a request line that does not end
// within maxHeadSize: a method and a space, then a target that long, is
// 414 (RFC 9110 §15.5.15); anything else is not a request line.
func longRequestLine(p []byte) *headError {
	for i, c := range p[:min(len(p), 32)] {
		if c == ' ' && i > 0 {
			return errURITooLong
		}
		if !tchar[c] {
			break
		}
	}
	return errRequestLine
}

// absoluteForm reads an absolute-form target (RFC 9112 §3.2.2), which
// starts at off in the head: scheme http or https, an authority without
// userinfo, and the rest, which becomes the origin-form target.
func (h *headInfo) absoluteForm(t []byte, off int) error {
	i := bytes.Index(t, []byte("://"))
	if i <= 0 {
		return errAuthorityForm
	}
	if scheme := t[:i]; !eqFold(scheme, "http") && !eqFold(scheme, "https") {
		return errTarget
	}
	a := i + 3
	e := a
	for e < len(t) && t[e] != '/' && t[e] != '?' && t[e] != '#' {
		e++
	}
	auth := t[a:e]
	if bytes.IndexByte(auth, '@') >= 0 {
		return errUserinfo
	}
	if !validHost(auth) {
		return errTarget
	}
	if e < len(t) && t[e] == '#' {
		return errTarget
	}
	h.authStart, h.authEnd = off+a, off+e
	h.pathStart, h.pathEnd = off+e, off+len(t)
	return nil
}

// lineEnd returns the index of the CR of the CRLF that ends the line
// starting at pos. A LF without CR before it is refused; a head without
// its end within maxHeadSize is refused too. Bytes inside the line are
// checked by the caller (a CR or NUL there is refused as a control byte).
func lineEnd(p []byte, pos int) (int, error) {
	i := bytes.IndexByte(p[pos:], '\n')
	if i < 0 {
		if len(p) >= maxHeadSize {
			return 0, errHeadTooLarge
		}
		return 0, errHeadIncomplete
	}
	i += pos
	if i+1 > maxHeadSize {
		return 0, errHeadTooLarge
	}
	if i == pos || p[i-1] != '\r' {
		return 0, errBareLF
	}
	return i - 1, nil
}

// connectionNominates reads a Connection value: ok is false when it is not
// a list of tokens; bad is true when it names a header the proxy frames,
// routes or identifies clients by. Removing such a header as hop-by-hop
// (RFC 9110 §7.6.1) would change the request's framing (Content-Length,
// Transfer-Encoding: the body would be read as the next request), its
// routing (Host, Cookie, the hash header) or what the backend learns of
// the client (X-Forwarded-*, Forwarded, X-Real-IP).
func connectionNominates(v []byte, extra []string) (bad, ok bool) {
	for len(v) > 0 {
		var tok []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			tok, v = v, nil
		}
		tok = trimOWS(tok)
		if len(tok) == 0 {
			continue // empty list elements are allowed (RFC 9110 §5.6.1)
		}
		for _, c := range tok {
			if !tchar[c] {
				return false, false
			}
		}
		switch {
		case eqFold(tok, "content-length"), eqFold(tok, "transfer-encoding"), eqFold(tok, "host"),
			eqFold(tok, "cookie"), eqFold(tok, "x-forwarded-for"), eqFold(tok, "x-forwarded-proto"),
			eqFold(tok, "x-forwarded-host"), eqFold(tok, "forwarded"), eqFold(tok, "x-real-ip"),
			eqFold(tok, "expect"), eqFold(tok, "connection"):
			bad = true
		default:
			for _, x := range extra {
				if eqFold(tok, x) {
					bad = true
				}
			}
		}
	}
	return bad, true
}

// parseLength reads a Content-Length value: decimal digits only, at most
// 18 of them (RFC 9110 §8.6; a list such as "5, 5" is refused).
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// trimOWS removes optional whitespace (SP, HTAB) at both ends.
func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// eqFold reports whether b equals the lower-case ASCII s, ignoring case.
func eqFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// splitAbsolute splits an absolute-form request target that checkHead
// accepted into its authority and the origin-form rest ("/" when empty).
// ok is false for origin-form and asterisk-form targets. RFC 9112 §3.2.2:
// a server receiving an absolute-form target ignores Host and uses the
// target's authority; both engines forward such a request in origin form
// with that authority as Host, and never turn userinfo into credentials
// (checkHead refuses userinfo).
func splitAbsolute(t []byte) (auth, rest []byte, ok bool) {
	if len(t) == 0 || t[0] == '/' || t[0] == '*' {
		return nil, nil, false
	}
	i := bytes.Index(t, []byte("://"))
	if i <= 0 {
		return nil, nil, false
	}
	a := i + 3
	e := a
	for e < len(t) && t[e] != '/' && t[e] != '?' {
		e++
	}
	auth, rest = t[a:e], t[e:]
	return auth, rest, true
}

// originForm appends to dst the origin-form target of rest, the part of
// an absolute-form target after its authority: "/" when rest is empty or
// starts with '?'.
func originForm(dst, rest []byte) []byte {
	if len(rest) == 0 || rest[0] == '?' {
		dst = append(dst, '/')
	}
	return append(dst, rest...)
}

// hasField reports whether the head p has a field named name (lower
// case), looking only at line starts.
func hasField(p []byte, name string) bool {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			return false
		}
		p = p[i+1:]
		if len(p) > len(name) && p[len(name)] == ':' && eqFold(p[:len(name)], name) {
			return true
		}
	}
	return false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
