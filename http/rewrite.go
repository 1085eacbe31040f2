package http

import (
	"bytes"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/lb"
)

// hopByHop are the headers a proxy removes in both directions (RFC 9110
// §7.6.1), besides those the Connection header names; in the order of
// their bits in headerBit.
var hopByHop = [...]string{
	"Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer",
	"Transfer-Encoding", "Upgrade", "Proxy-Authenticate", "Proxy-Authorization",
}

// Bits of headerBits: which headers of interest a message carries.
const (
	hConnection uint16 = 1 << iota
	hKeepAlive
	hProxyConnection
	hTE
	hTrailer
	hTransferEncoding
	hUpgrade
	hProxyAuthenticate
	hProxyAuthorization
	hXForwardedFor
	hForwarded
	hXForwardedProto
	hXForwardedHost
	hXRealIP
	// hForwardingAlias: one of the forwarding names spelt with '_' for
	// '-' (X_Forwarded_For). CGI-style servers (PHP, WSGI, Rack) read both
	// spellings as the same variable, so an alias would let a client
	// claim an address past the rewrite: it is removed from every request.
	hForwardingAlias
	// hXForwardedOther: X-Forwarded-Port, -Prefix, -Ssl and -Scheme, which
	// Spring, Tomcat's RemoteIpValve and Rack read to build URLs and
	// redirects: removed from untrusted clients, never written.
	hXForwardedOther

	hHopByHop = hXForwardedFor - 1
	// hOwned are the forwarding headers sluice owns: from a client outside
	// -http-trusted-proxy every line of them is removed, whatever its case,
	// before sluice writes its own.
	hOwned = hXForwardedFor | hForwarded | hXForwardedProto | hXForwardedHost | hXRealIP | hXForwardedOther
)

// headerBit returns the bit of a header name, 0 for the rest. It is one
// length switch and at most two comparisons, so that a message is checked
// in one pass instead of a Peek or Del per name.
func headerBit(k []byte) uint16 {
	eq := func(name string) bool { return bytes.EqualFold(k, []byte(name)) }
	switch len(k) {
	case 2:
		if eq("TE") {
			return hTE
		}
	case 7:
		if eq("Trailer") {
			return hTrailer
		}
		if eq("Upgrade") {
			return hUpgrade
		}
	case 9:
		if eq("Forwarded") {
			return hForwarded
		}
		if eq("X-Real-IP") {
			return hXRealIP
		}
		if aliasOf(k, "X-Real-IP") {
			return hForwardingAlias
		}
	case 10:
		if eq("Connection") {
			return hConnection
		}
		if eq("Keep-Alive") {
			return hKeepAlive
		}
	case 15:
		if eq("X-Forwarded-For") {
			return hXForwardedFor
		}
		if eq("X-Forwarded-Ssl") {
			return hXForwardedOther
		}
		if aliasOf(k, "X-Forwarded-For") || aliasOf(k, "X-Forwarded-Ssl") {
			return hForwardingAlias
		}
	case 16:
		if eq("Proxy-Connection") {
			return hProxyConnection
		}
		if eq("X-Forwarded-Host") {
			return hXForwardedHost
		}
		if eq("X-Forwarded-Port") {
			return hXForwardedOther
		}
		if aliasOf(k, "X-Forwarded-Host") || aliasOf(k, "X-Forwarded-Port") {
			return hForwardingAlias
		}
	case 17:
		if eq("Transfer-Encoding") {
			return hTransferEncoding
		}
		if eq("X-Forwarded-Proto") {
			return hXForwardedProto
		}
		if aliasOf(k, "X-Forwarded-Proto") {
			return hForwardingAlias
		}
	case 18:
		if eq("Proxy-Authenticate") {
			return hProxyAuthenticate
		}
		if eq("X-Forwarded-Prefix") || eq("X-Forwarded-Scheme") {
			return hXForwardedOther
		}
		if aliasOf(k, "X-Forwarded-Prefix") || aliasOf(k, "X-Forwarded-Scheme") {
			return hForwardingAlias
		}
	case 19:
		if eq("Proxy-Authorization") {
			return hProxyAuthorization
		}
	}
	return 0
}

// aliasOf reports whether k is name, of the same length, with at least
// one '-' spelt '_' (any case).
func aliasOf(k []byte, name string) bool {
	if len(k) != len(name) || bytes.IndexByte(k, '_') < 0 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c, n := k[i]|0x20, name[i]|0x20
		if c != n && !(k[i] == '_' && name[i] == '-') {
			return false
		}
	}
	return true
}

// prepareRequest removes hop-by-hop headers and writes the forwarding
// headers sluice owns (hOwned): X-Forwarded-For, Forwarded (RFC 7239) and
// X-Forwarded-Proto; it writes no X-Forwarded-Host or X-Real-IP, and
// removes X-Forwarded-Port, -Prefix, -Ssl and -Scheme from untrusted
// clients (hXForwardedOther). X-Forwarded-Proto and Forwarded's proto=
// are https for a client that came over TLS (secure), else http. From a
// client outside the trusted proxies every line of them (any case) is
// removed first; from a trusted one the X-Forwarded-For and Forwarded
// lines are joined and appended to, and a single X-Forwarded-Proto,
// X-Forwarded-Host or X-Real-IP line is kept (several are removed: which
// one a backend reads is its own choice). Underscore spellings of these
// names are removed from everyone. The client's headers are scanned once;
// names are deleted only when present.
func (s *Server) prepareRequest(h *fasthttp.RequestHeader, ip netip.Addr, secure bool) {
	var seen, dup uint16
	for k := range h.AllInOrder() {
		b := headerBit(k)
		dup |= seen & b
		seen |= b
	}
	if seen&hHopByHop != 0 {
		stripHopByHop(seen, h.Peek("Connection"), h.DelBytes, h.Del)
	}
	if seen&hForwardingAlias != 0 {
		delNames(h, hForwardingAlias)
	}
	trusted := s.isTrusted(ip)
	if seen&hXForwardedOther != 0 && !trusted {
		delNames(h, hXForwardedOther)
	}

	var buf [320]byte
	v := buf[:0]
	if trusted && seen&hXForwardedFor != 0 {
		v = appendLines(v, h, "X-Forwarded-For")
	}
	v = ip.AppendTo(v)
	if dup&hXForwardedFor != 0 {
		h.Del("X-Forwarded-For")
	}
	h.SetBytesV("X-Forwarded-For", v)

	if !trusted || dup&hXForwardedProto != 0 || seen&hXForwardedProto == 0 || len(h.Peek("X-Forwarded-Proto")) == 0 {
		if dup&hXForwardedProto != 0 {
			h.Del("X-Forwarded-Proto")
		}
		if secure {
			h.Set("X-Forwarded-Proto", "https")
		} else {
			h.Set("X-Forwarded-Proto", "http")
		}
	}

	if seen&hXForwardedHost != 0 && (!trusted || dup&hXForwardedHost != 0) {
		h.Del("X-Forwarded-Host")
	}

	if seen&hXRealIP != 0 && (!trusted || dup&hXRealIP != 0) {
		h.Del("X-Real-IP")
	}

	v = buf[:0]
	if trusted && seen&hForwarded != 0 {
		v = appendLines(v, h, "Forwarded")
	}
	v = append(v, "for="...)
	if ip.Is6() {
		v = append(v, `"[`...)
		v = ip.AppendTo(v)
		v = append(v, `]"`...)
	} else {
		v = ip.AppendTo(v)
	}
	if secure {
		v = append(v, ";proto=https"...)
	} else {
		v = append(v, ";proto=http"...)
	}
	if host := h.Host(); len(host) > 0 && len(host) < 200 && plainHost(host) {
		v = append(v, `;host="`...)
		v = append(v, host...)
		v = append(v, '"')
	}
	if dup&hForwarded != 0 {
		h.Del("Forwarded")
	}
	h.SetBytesV("Forwarded", v)
	h.AddBytesV(loopHeader, s.loopMark)
}

// plainHost reports whether host, the client's Host, may go into the
// host= parameter of Forwarded: letters, digits and "-._~:[]" only. A
// reg-name may hold sub-delimiters (checkHead accepts "a,for=6.6.6.6;proto=https"),
// and although the value is quoted, parsers that split Forwarded on ','
// and ';' without regard to quotes (Rack's, which takes the last for= and
// proto= it finds) read them as elements sluice wrote: a client address
// and scheme of the client's choosing. Such a host is left out.
func plainHost(host []byte) bool {
	for _, c := range host {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == ':', c == '[', c == ']':
		default:
			return false
		}
	}
	return true
}

// appendLines appends the non-empty values of every line of the header
// name to v, each followed by ", " (RFC 9110 §5.3: several lines of a
// list field are one list).
func appendLines(v []byte, h *fasthttp.RequestHeader, name string) []byte {
	for k, val := range h.All() {
		if len(val) > 0 && bytes.EqualFold(k, []byte(name)) {
			v = append(append(v, val...), ", "...)
		}
	}
	return v
}

// delNames removes every header whose name has the bit (hForwardingAlias
// or hXForwardedOther). Names are in canonical case, so there are at most
// 24 distinct ones (three underscore spellings of each of the eight names
// with two '-'): they are collected in one pass, then deleted.
func delNames(h *fasthttp.RequestHeader, bit uint16) {
	var names [24][18]byte
	var lens [24]uint8
	n := 0
next:
	for k := range h.All() {
		if headerBit(k) != bit {
			continue
		}
		for i := range n {
			if string(names[i][:lens[i]]) == string(k) {
				continue next
			}
		}
		if n == len(names) {
			break
		}
		lens[n] = uint8(copy(names[n][:], k))
		n++
	}
	for i := range n {
		h.DelBytes(names[i][:lens[i]])
	}
}

func (s *Server) isTrusted(ip netip.Addr) bool {
	for _, p := range s.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// stripHopByHop deletes the headers named in conn (the Connection value)
// and those of the fixed hop-by-hop list whose bits are in seen.
func stripHopByHop(seen uint16, conn []byte, delBytes func([]byte), del func(string)) {
	for len(conn) > 0 {
		var tok []byte
		if i := bytes.IndexByte(conn, ','); i >= 0 {
			tok, conn = conn[:i], conn[i+1:]
		} else {
			tok, conn = conn, nil
		}
		tok = bytes.TrimSpace(tok)
		if len(tok) > 0 && !bytes.EqualFold(tok, []byte("close")) && !bytes.EqualFold(tok, []byte("keep-alive")) {
			delBytes(tok)
		}
	}
	for i, k := range hopByHop {
		if seen&(1<<i) != 0 {
			del(k)
		}
	}
}

// prepareResponse removes hop-by-hop headers from the backend's answer to
// p, a request of client ip, learns the application session cookie and
// sets the sticky cookie.
func (s *Server) prepareResponse(h *fasthttp.ResponseHeader, p *plan, ip netip.Addr) {
	if h.StatusCode() == fasthttp.StatusServiceUnavailable {
		s.backendBusy(h, p.b)
	}
	var seen uint16
	for k := range h.All() {
		seen |= headerBit(k)
	}
	// All yields "Connection: close" too: a backend closing its connection
	// does not close the client's.
	if seen&hHopByHop != 0 {
		stripHopByHop(seen, h.Peek("Connection"), h.DelBytes, h.Del)
	}
	if s.sticky != nil {
		s.dropBackendSticky(h)
	}
	if s.sessions != nil {
		s.learnSession(h, p.b, p.ref.tag, p.start, ip)
	}
	if p.renew && s.sticky != nil {
		h.AddBytesV("Set-Cookie", s.sticky.header(&p.ref.cookies[p.b.Index()], p.ref.tag, p.ref.path, p.b, s.wall(p.start), p.secure))
	}
}

// learnSession records the application session id the backend set. A
// Set-Cookie that clears the cookie (empty value, Max-Age of 0 or less, an
// Expires in the past) is never learned, and the id it names is
// forgotten; an id the table would not take (too long, the table full of
// sessions in use, or the client's source holding its share) is counted
// in Stats.SessionNotLearned.
func (s *Server) learnSession(h *fasthttp.ResponseHeader, b *lb.Backend, pool string, now int64, ip netip.Addr) {
	for name, raw := range h.Cookies() {
		if string(name) != s.appName {
			continue
		}
		v, live := setCookieValue(raw, func() time.Time { return s.wall(now) })
		switch {
		case !live:
			if len(v) > 0 {
				s.sessions.forget(v)
			}
		case !s.sessions.learn(v, b, pool, now, ip):
			s.stats.SessionNotLearned.Add(1)
		}
	}
}

// setCookieValue reads a Set-Cookie value: the cookie's value (without
// surrounding quotes) and whether it sets the cookie rather than clears
// it. Per RFC 6265 §5.3 Max-Age wins over Expires; wall is called only
// for an Expires.
func setCookieValue(raw []byte, wall func() time.Time) (value []byte, live bool) {
	pair, attrs, _ := bytes.Cut(raw, []byte{';'})
	_, value, _ = bytes.Cut(pair, []byte{'='})
	value = bytes.TrimSpace(value)
	if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
		value = value[1 : len(value)-1]
	}
	live = len(value) > 0
	var maxAge, expires []byte
	for len(attrs) > 0 {
		var a []byte
		a, attrs, _ = bytes.Cut(attrs, []byte{';'})
		k, v, _ := bytes.Cut(a, []byte{'='})
		k, v = bytes.TrimSpace(k), bytes.TrimSpace(v)
		switch {
		case bytes.EqualFold(k, []byte("max-age")):
			maxAge = v
		case bytes.EqualFold(k, []byte("expires")):
			expires = v
		}
	}
	switch {
	case maxAge != nil:
		// RFC 6265 §5.2.2: a non-digit (but a leading '-') makes the
		// attribute ignored; zero or less expires the cookie at once.
		if n, err := strconv.ParseInt(string(maxAge), 10, 64); err == nil && n <= 0 {
			live = false
		}
	case expires != nil:
		for _, layout := range [...]string{time.RFC1123, "Mon, 02-Jan-2006 15:04:05 MST", time.RFC850, time.ANSIC} {
			if t, err := time.Parse(layout, string(expires)); err == nil {
				if !t.After(wall()) {
					live = false
				}
				break
			}
		}
	}
	return value, live
}

// stripTarget returns the target h is to be sent with for a route's
// strip= (see lb.StripPrefix), nil when it stays as it is: the request
// line only, the query kept. A target in the normal form routes match
// (normalPath) loses the prefix as the client spelled it; any other
// spelling is sent as its normal form (v.path, the path the route matched:
// decoded, without dot-segments, empty segments or ";parameters"),
// percent-encoded where a path may not hold the byte, so that what the
// backend gets is the path the route saw, minus the prefix. A path the
// strip does not begin (a path=~REGEX route) is sent as it is. The result
// is in v's buffer: set it before v is filled again.
func (v *reqView) stripTarget(h *fasthttp.RequestHeader, strip string) []byte {
	target := h.RequestURI()
	raw, query := target, []byte(nil)
	if i := bytes.IndexByte(target, '?'); i >= 0 {
		raw, query = target[:i], target[i:]
	}
	var rest []byte
	escape := false
	if len(raw) > 0 && raw[0] == '/' && normalPath(raw) {
		rest = lb.StripPrefix(raw, strip)
		if len(rest) == len(raw) {
			return nil
		}
	} else {
		rest = lb.StripPrefix(v.path, strip)
		if len(rest) == len(v.path) {
			return nil
		}
		escape = true
	}
	out := v.tbuf[:0]
	if escape {
		out = appendPathEscaped(out, rest)
	} else {
		out = append(out, rest...)
	}
	out = append(out, query...)
	v.tbuf = out[:0]
	return out
}

// appendPathEscaped appends p, a decoded path, with every byte a path
// segment may not hold as it is (RFC 3986 §3.3: unreserved, sub-delims,
// ':', '@' and '/'; and ';', which servers read as the start of
// parameters) percent-encoded.
func appendPathEscaped(dst, p []byte) []byte {
	const hexDigits = "0123456789ABCDEF"
	for _, c := range p {
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~!$&'()*+,=:@/", c) >= 0 {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
	}
	return dst
}
