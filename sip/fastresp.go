package sip

import (
	"bytes"
	"io"
	"sync"

	gosip "github.com/emiago/sipgo/sip"
)

// A response relayed by the Via stack (1xx and 2xx to INVITE, the 200 to
// a BYE, ...) needs little of the message: our branch and address in the
// top Via, the received, rport, host, port and branch of the Via under
// it, the status, CSeq, Call-ID and the From and To tags; its bytes go on
// with our Via removed. The fast path (scanResponse) finds exactly these
// with a byte scan, without sipgo's parse and re-serialisation, and only
// for a message it is certain sipgo reads the same way and writes back as
// the same bytes: every header line in the form sipgo writes ("Name:
// value", printable ASCII, no folding, no compact forms of the headers
// sipgo types, no duplicate of a header read once, one Via value a line),
// the body exactly Content-Length long. Anything else declines, and the
// message takes the sipgo path (handleDatagram). FuzzFastResponse holds
// the two paths to the same fields and the same bytes out.
//
// The decisions are not made twice: both paths hand an inResponse to
// routeResponse. Where a rare case needs the whole message (an earlier
// attempt's 2xx, a 503's Retry-After, the ACK of a non-2xx, an access log
// record), full parses it with sipgo as the slow path would have.

// inResponse is a response once our Via is popped: what routeResponse
// reads, and either the parsed message (res) or the bytes to relay
// (wire, on the fast path).
type inResponse struct {
	res     *gosip.Response // nil on the fast path until full
	raw     []byte          // fast path: the datagram as received
	wire    []byte          // fast path: raw without our Via, To as sipgo writes it
	tr      string          // fast path: the transport full sets
	code    int
	method  gosip.RequestMethod
	seq     uint32
	callID  string
	fromTag string
	toTag   string
}

// full returns the parsed response with our Via removed, parsing it on
// the fast path (the scan proved sipgo reads it the same way).
func (r *inResponse) full(s *Server) *gosip.Response {
	if r.res != nil {
		return r.res
	}
	m, err := s.parser.ParseSIP(r.raw)
	res, ok := m.(*gosip.Response)
	if err != nil || !ok {
		// Not reached: scanResponse takes only what sipgo parses. An
		// empty response keeps the callers' reads safe.
		res = gosip.NewResponse(r.code, "")
	} else {
		res.RemoveHeader("Via")
	}
	res.SetTransport(r.tr)
	r.res = res
	return res
}

// StringWrite writes the response as it is relayed.
func (r *inResponse) StringWrite(w io.StringWriter) {
	if r.res != nil || r.wire == nil {
		r.res.StringWrite(w)
		return
	}
	if b, ok := w.(*bytes.Buffer); ok {
		b.Write(r.wire)
		return
	}
	w.WriteString(string(r.wire))
}

// relayIn relays r to dst.
func (s *Server) relayIn(r *inResponse, dst target) {
	if r.res == nil && r.wire != nil {
		s.post(r.wire, dst, &s.metrics.Relayed)
		return
	}
	s.relay(r.res, dst)
}

// fastResponse handles data from src as handleDatagram would if it is a
// response the fast path takes (scanResponse) and is answering a request
// of ours; it reports false, having done nothing, for anything else.
func (s *Server) fastResponse(data []byte, src source) bool {
	if src.conn != nil || s.noFastPath {
		return false
	}
	var sc respScan
	if !scanResponse(data, &sc) {
		return false
	}
	// One string of the head, and every field a substring of it: one
	// allocation where a conversion of each would take ten.
	head := string(data[:sc.headLen])
	str := func(b []byte) string {
		if len(b) == 0 {
			return ""
		}
		off := cap(data) - cap(b) // b is a slice of data's head
		if off < 0 || off+len(b) > len(head) {
			return string(b) // not reached: every field is in the head
		}
		return head[off : off+len(b)]
	}
	top := &sc.vias[0]
	br := str(top.branch)
	if len(br) < len(ourBranchPrefix) || br[:len(ourBranchPrefix)] != ourBranchPrefix || len(br) >= len(pingBranchPrefix) && br[:len(pingBranchPrefix)] == pingBranchPrefix {
		return false
	}
	if !s.isOurs(&gosip.Uri{Host: str(top.host), Port: top.port}) {
		return false
	}
	if sc.nvia < 2 {
		return false
	}
	nv := &sc.vias[1]
	next := viaFields{host: str(nv.host), port: nv.port, branch: str(nv.branch), received: str(nv.received), rport: str(nv.rport)}
	// The relayed bytes are copied by the send (or its batch's queue)
	// and by anything that keeps them (relayConfirmed, lastFinal), so a
	// pooled buffer holds them.
	wb := wirePool.Get().(*[]byte)
	r := inResponse{raw: data, wire: sc.appendWire((*wb)[:0], data), tr: src.transport(), code: sc.code,
		method: methodOf(sc.method, str), seq: sc.seq, callID: str(sc.callID), fromTag: tagParam(str(sc.fromVal)), toTag: str(sc.toTag)}
	s.metrics.Responses.Add(1)
	s.metrics.FastPath.Add(1)
	s.routeResponse(&r, br, next, src)
	*wb = r.wire[:0]
	wirePool.Put(wb)
	return true
}

// wirePool holds the buffers relayed responses are built in.
var wirePool = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// methodOf is the method m names, without allocating for the common ones.
func methodOf(m []byte, str func([]byte) string) gosip.RequestMethod {
	for _, k := range [...]gosip.RequestMethod{gosip.INVITE, gosip.ACK, gosip.BYE, gosip.CANCEL, gosip.OPTIONS, gosip.REGISTER,
		gosip.PRACK, gosip.UPDATE, gosip.INFO, gosip.SUBSCRIBE, gosip.NOTIFY, gosip.REFER, gosip.MESSAGE, gosip.PUBLISH} {
		if string(m) == string(k) {
			return k
		}
	}
	return gosip.RequestMethod(str(m))
}

// viaScan is one Via value as scanResponse found it.
type viaScan struct {
	lineStart, lineEnd int // the header line, its CRLF included (fastreq.go)
	transport, host    []byte
	port               int
	branch             []byte
	hasBranch          bool
	received, rport    []byte
	hasReceived        bool
	hasRport           bool
}

// respScan is what scanResponse finds in a response.
type respScan struct {
	code    int
	method  []byte
	seq     uint32
	callID  []byte
	fromVal []byte // the From value, its tag read by tagParam
	toTag   []byte
	headLen int        // the head's length, its empty line included
	vias    [2]viaScan // the top two
	nvia    int
	// The To value's parts as sipgo writes them.
	toDisplay []byte // "" when none
	toRest    []byte // from '<' to the end of the value
}

// appendWire appends to b the response in data as it is relayed, as
// sipgo writes it: without its top Via, each Via value on a line of its
// own, every header "Name: value", the To value with its display name
// quoted, then the body. data is what scanResponse took.
func (sc *respScan) appendWire(b, data []byte) []byte {
	eol := bytes.IndexByte(data, '\r')
	b = append(b, data[:eol+2]...)
	first := true
	for i := eol + 2; i < sc.headLen-2; {
		end := i + bytes.IndexByte(data[i:], '\r')
		name, val, _ := headerLine(data[i:end], true)
		i = end + 2
		switch string(name) {
		case "Via":
			for rest := val; rest != nil; {
				var part []byte
				part, rest = nextViaValue(rest)
				if first {
					first = false // ours, removed
					continue
				}
				b = append(b, "Via: "...)
				b = append(b, part...)
				b = append(b, '\r', '\n')
			}
			continue
		case "To":
			b = append(b, "To: "...)
			if len(sc.toDisplay) > 0 {
				b = append(b, '"')
				b = append(b, sc.toDisplay...)
				b = append(b, '"', ' ')
			}
			b = append(b, sc.toRest...)
		default:
			b = append(b, name...)
			b = append(b, ':', ' ')
			b = append(b, val...)
		}
		b = append(b, '\r', '\n')
	}
	return append(b, data[sc.headLen-2:]...)
}

// maxFastVias bounds the Via lines the fast path takes (each is checked).
const maxFastVias = 16

// scanResponse reports whether data is a response the fast path takes,
// and fills sc. It declines (false) anything it is not certain sipgo
// parses to the same fields and writes back as the same bytes.
func scanResponse(data []byte, sc *respScan) bool {
	if len(data) > gosip.ParseMaxMessageLength || len(data) < 16 {
		return false
	}
	// Status line: "SIP/2.0 DDD Reason\r\n".
	if string(data[:8]) != "SIP/2.0 " {
		return false
	}
	c0, c1, c2 := data[8], data[9], data[10]
	if c0 < '1' || c0 > '6' || c1 < '0' || c1 > '9' || c2 < '0' || c2 > '9' || data[11] != ' ' {
		return false
	}
	sc.code = int(c0-'0')*100 + int(c1-'0')*10 + int(c2-'0')
	i := 12
	// The reason: printable ASCII, at least one character, no leading
	// or trailing space.
	start := i
	for i < len(data) && data[i] != '\r' {
		if data[i] < 0x20 || data[i] > 0x7e {
			return false
		}
		i++
	}
	if i == start || data[start] == ' ' || data[i-1] == ' ' || i+1 >= len(data) || data[i+1] != '\n' {
		return false
	}
	i += 2
	var have struct{ to, from, callID, cseq, cl bool }
	cl := -1
	sc.nvia = 0
	nvia := 0
	for {
		// One header line, or the empty line ending the head.
		line, next, ok := headLine(data, i)
		if !ok {
			return false
		}
		i = next
		if len(line) == 0 {
			break
		}
		name, val, ok := headerLine(line, true)
		if !ok {
			return false
		}
		switch {
		case string(name) == "Via":
			// One value, or several separated by ", " (SIPp's
			// [last_Via:] joins them so): sipgo splits them at the
			// commas and writes each on a line of its own.
			for rest := val; rest != nil; {
				var part []byte
				part, rest = nextViaValue(rest)
				nvia++
				if nvia > maxFastVias {
					return false
				}
				var v viaScan
				if !scanVia(part, &v) || bytes.IndexByte(part, ';') < 0 {
					return false // a comma in a Via without parameters: sipgo reads it otherwise
				}
				if nvia <= len(sc.vias) {
					sc.vias[nvia-1] = v
				}
			}
		case string(name) == "To":
			if have.to || !scanTo(val, sc) {
				return false
			}
			have.to = true
		case string(name) == "Call-ID":
			if have.callID || bytes.IndexByte(val, ' ') >= 0 {
				return false
			}
			have.callID = true
			sc.callID = val
		case string(name) == "CSeq":
			if have.cseq || !scanCSeq(val, sc) {
				return false
			}
			have.cseq = true
		case string(name) == "Content-Length":
			n, ok := scanDecimal(val, 1<<31)
			if have.cl || !ok {
				return false
			}
			have.cl = true
			cl = n
		case headerNamed(string(name), "from") || headerNamed(string(name), "f"):
			if have.from {
				return false
			}
			have.from = true
			sc.fromVal = val
		default:
			// Any other header sipgo gives a type (restricted by
			// newParser) declines: written back in its own form.
			if typedHeader(name) {
				return false
			}
		}
	}
	sc.nvia = nvia
	sc.headLen = i
	if nvia == 0 || !have.to || !have.callID || !have.cseq || !have.cl || !have.from {
		return false
	}
	// The body: exactly Content-Length bytes, nothing after it.
	return len(data)-i == cl
}

// nextViaValue splits the first value off a Via line's values separated
// by ", "; rest is nil after the last.
func nextViaValue(v []byte) (part, rest []byte) {
	i := bytes.Index(v, []byte(", "))
	if i < 0 {
		return v, nil
	}
	return v[:i], v[i+2:]
}

// headerLine splits a header line into its name and value: the name a
// token directly before the colon; the value after the colon and the
// spaces after it (with pad, any number of them, which sipgo trims; else
// exactly one), not empty, no space at its end.
func headerLine(line []byte, pad bool) (name, val []byte, ok bool) {
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || colon+2 >= len(line) || line[colon+1] != ' ' {
		return nil, nil, false
	}
	name, val = line[:colon], line[colon+2:]
	for pad && len(val) > 0 && val[0] == ' ' {
		val = val[1:]
	}
	if len(val) == 0 || val[0] == ' ' || val[len(val)-1] == ' ' {
		return nil, nil, false
	}
	for _, c := range name {
		if !isTokenChar(c) {
			return nil, nil, false
		}
	}
	return name, val, true
}

// typedHeader reports whether newParser gives the header named name (any
// case) a type of its own.
func typedHeader(name []byte) bool {
	for _, n := range [...]string{"via", "v", "to", "t", "call-id", "i", "cseq", "max-forwards", "content-length", "l", "route"} {
		if len(name) == len(n) && headerNamed(string(name), n) {
			return true
		}
	}
	return false
}

// isTokenChar reports whether c is an RFC 3261 token character.
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '-', '.', '!', '%', '*', '_', '+', '`', '\'', '~':
		return true
	}
	return false
}

// isHostChar reports whether c may be in a host name or IPv4 address as
// the fast path takes them.
func isHostChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-'
}

// scanDecimal reads a decimal number in its shortest form (no sign, no
// leading zero but for 0 itself) below limit.
func scanDecimal(b []byte, limit int) (int, bool) {
	if len(b) == 0 || len(b) > 10 || len(b) > 1 && b[0] == '0' {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n < limit
}

// scanCSeq reads "N METHOD".
func scanCSeq(val []byte, sc *respScan) bool {
	sp := bytes.IndexByte(val, ' ')
	if sp <= 0 || sp == len(val)-1 {
		return false
	}
	n, ok := scanDecimal(val[:sp], 1<<31)
	if !ok {
		return false
	}
	for _, c := range val[sp+1:] {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	sc.seq = uint32(n)
	sc.method = val[sp+1:]
	return true
}

// scanHost reads "host[:port]" (port in its shortest form, not 0).
func scanHostPort(b []byte) (host []byte, port int, ok bool) {
	colon := bytes.IndexByte(b, ':')
	host = b
	if colon >= 0 {
		host = b[:colon]
		p, ok := scanDecimal(b[colon+1:], 65536)
		if !ok || p == 0 {
			return nil, 0, false
		}
		port = p
	}
	if len(host) == 0 {
		return nil, 0, false
	}
	for _, c := range host {
		if !isHostChar(c) {
			return nil, 0, false
		}
	}
	return host, port, true
}

// scanParams checks ";k[=v]" parameters: token keys and values, no key
// twice (sipgo keeps the last), a value not empty; f, when not nil, is
// called with each.
func scanParams(b []byte, f func(k, v []byte, hasV bool)) bool {
	var seen [16][]byte
	n := 0
	for len(b) > 0 {
		if b[0] != ';' {
			return false
		}
		b = b[1:]
		end := bytes.IndexByte(b, ';')
		if end < 0 {
			end = len(b)
		}
		p := b[:end]
		b = b[end:]
		k, v, hasV := p, []byte(nil), false
		if eq := bytes.IndexByte(p, '='); eq >= 0 {
			k, v, hasV = p[:eq], p[eq+1:], true
			if len(v) == 0 {
				return false
			}
			for _, c := range v {
				if !isTokenChar(c) {
					return false
				}
			}
		}
		if len(k) == 0 || n == len(seen) {
			return false
		}
		for _, c := range k {
			if !isTokenChar(c) {
				return false
			}
		}
		for _, s := range seen[:n] {
			if bytes.Equal(s, k) {
				return false
			}
		}
		seen[n] = k
		n++
		if f != nil {
			f(k, v, hasV)
		}
	}
	return true
}

// scanVia reads one Via value: "SIP/2.0/TRANSPORT host[:port];params".
func scanVia(val []byte, v *viaScan) bool {
	if len(val) < 9 || string(val[:8]) != "SIP/2.0/" {
		return false
	}
	rest := val[8:]
	sp := bytes.IndexByte(rest, ' ')
	if sp <= 0 {
		return false
	}
	for _, c := range rest[:sp] {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	v.transport = rest[:sp]
	rest = rest[sp+1:]
	semi := bytes.IndexByte(rest, ';')
	if semi < 0 {
		semi = len(rest)
	}
	var ok bool
	if v.host, v.port, ok = scanHostPort(rest[:semi]); !ok {
		return false
	}
	return scanParams(rest[semi:], func(k, pv []byte, hasV bool) {
		switch string(k) {
		case "branch":
			v.branch, v.hasBranch = pv, true
		case "received":
			v.received, v.hasReceived = pv, true
		case "rport":
			v.rport, v.hasRport = pv, true
		}
	})
}

// scanURI checks a sip: or sips: URI inside '<' '>': [user@]host[:port]
// and parameters, the form sipgo writes back unchanged.
func scanURI(u []byte) bool {
	switch {
	case bytes.HasPrefix(u, []byte("sip:")):
		u = u[4:]
	case bytes.HasPrefix(u, []byte("sips:")):
		u = u[5:]
	default:
		return false
	}
	if at := bytes.IndexByte(u, '@'); at >= 0 {
		if at == 0 {
			return false
		}
		for _, c := range u[:at] {
			if !isTokenChar(c) || c == '%' {
				return false
			}
		}
		u = u[at+1:]
	}
	semi := bytes.IndexByte(u, ';')
	if semi < 0 {
		semi = len(u)
	}
	if _, _, ok := scanHostPort(u[:semi]); !ok {
		return false
	}
	return scanParams(u[semi:], nil)
}

// scanTo reads the To value: [display] <URI> [;params], the display a
// quoted string or tokens separated by single spaces (sipgo writes it
// quoted either way).
func scanTo(val []byte, sc *respScan) bool {
	lt := bytes.IndexByte(val, '<')
	if lt < 0 {
		return false
	}
	disp := val[:lt]
	switch {
	case len(disp) == 0:
	case disp[0] == '"':
		// "display" <
		if len(disp) < 4 || disp[len(disp)-1] != ' ' || disp[len(disp)-2] != '"' {
			return false
		}
		disp = disp[1 : len(disp)-2]
		if len(disp) == 0 {
			return false
		}
	default:
		// display <  (sipgo trims it: the spaces before '<' go)
		for len(disp) > 0 && disp[len(disp)-1] == ' ' {
			disp = disp[:len(disp)-1]
		}
		if len(disp) == 0 {
			return false
		}
	}
	prev := byte(' ')
	for _, c := range disp {
		if !isTokenChar(c) && c != ' ' || c == ' ' && prev == ' ' {
			return false
		}
		prev = c
	}
	if prev == ' ' && len(disp) > 0 {
		return false
	}
	gt := bytes.IndexByte(val[lt:], '>')
	if gt < 0 {
		return false
	}
	gt += lt
	if !scanURI(val[lt+1 : gt]) {
		return false
	}
	sc.toTag = nil
	if !scanParams(val[gt+1:], func(k, v []byte, hasV bool) {
		if string(k) == "tag" {
			sc.toTag = v
		}
	}) {
		return false
	}
	sc.toDisplay = disp
	sc.toRest = val[lt:]
	return true
}

// headLine returns the line of data from i to its CRLF, and where the
// next begins: false for a byte outside printable ASCII or a CR without
// its LF (the fast paths leave such a head to sipgo).
func headLine(data []byte, i int) (line []byte, next int, ok bool) {
	ls := i
	for i < len(data) && data[i] != '\r' {
		if data[i] < 0x20 || data[i] > 0x7e {
			return nil, 0, false
		}
		i++
	}
	if i+1 >= len(data) || data[i+1] != '\n' {
		return nil, 0, false
	}
	return data[ls:i], i + 2, true
}
