package http

import (
	"bytes"
	"net/netip"

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

	hHopByHop = hXForwardedFor - 1
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
	case 16:
		if eq("Proxy-Connection") {
			return hProxyConnection
		}
	case 17:
		if eq("Transfer-Encoding") {
			return hTransferEncoding
		}
		if eq("X-Forwarded-Proto") {
			return hXForwardedProto
		}
	case 18:
		if eq("Proxy-Authenticate") {
			return hProxyAuthenticate
		}
	case 19:
		if eq("Proxy-Authorization") {
			return hProxyAuthorization
		}
	}
	return 0
}

// prepareRequest removes hop-by-hop headers and sets X-Forwarded-For,
// X-Forwarded-Proto and Forwarded (RFC 7239). Values from clients outside
// the trusted proxies are replaced, from trusted ones appended to. The
// client's headers are scanned once; names are deleted only when present.
func (s *Server) prepareRequest(h *fasthttp.RequestHeader, ip netip.Addr) {
	var seen uint16
	for k := range h.AllInOrder() {
		seen |= headerBit(k)
	}
	if seen&hHopByHop != 0 {
		stripHopByHop(seen, h.Peek("Connection"), h.DelBytes, h.Del)
	}

	trusted := s.isTrusted(ip)
	var buf [320]byte
	v := buf[:0]
	if seen&hXForwardedFor != 0 {
		if prior := h.Peek("X-Forwarded-For"); trusted && len(prior) > 0 {
			v = append(append(v, prior...), ", "...)
		}
	}
	v = ip.AppendTo(v)
	h.SetBytesV("X-Forwarded-For", v)

	if !trusted || seen&hXForwardedProto == 0 || len(h.Peek("X-Forwarded-Proto")) == 0 {
		h.Set("X-Forwarded-Proto", "http")
	}

	v = buf[:0]
	if seen&hForwarded != 0 {
		if prior := h.Peek("Forwarded"); trusted && len(prior) > 0 {
			v = append(append(v, prior...), ", "...)
		}
	}
	v = append(v, "for="...)
	if ip.Is6() {
		v = append(v, `"[`...)
		v = ip.AppendTo(v)
		v = append(v, `]"`...)
	} else {
		v = ip.AppendTo(v)
	}
	v = append(v, ";proto=http"...)
	if host := h.Host(); len(host) > 0 && len(host) < 200 && bytes.IndexAny(host, "\"\\\r\n") < 0 {
		v = append(v, `;host="`...)
		v = append(v, host...)
		v = append(v, '"')
	}
	h.SetBytesV("Forwarded", v)
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
// p, learns the application session cookie and sets the sticky cookie.
func (s *Server) prepareResponse(h *fasthttp.ResponseHeader, p *plan) {
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
	if s.sessions != nil {
		s.learnSession(h, p.b, p.start)
	}
	if p.renew && s.sticky != nil {
		h.AddBytesV("Set-Cookie", s.sticky.header(&p.set.cookies[p.b.Index()], p.b, s.wall(p.start)))
	}
}

// learnSession records the application session id the backend set.
func (s *Server) learnSession(h *fasthttp.ResponseHeader, b *lb.Backend, now int64) {
	for name, raw := range h.Cookies() {
		if string(name) != s.appName {
			continue
		}
		c := fasthttp.AcquireCookie()
		// Entries end by TTL; a backend clearing the cookie sets an empty
		// or different value, which the client then sends instead.
		if c.ParseBytes(raw) == nil && len(c.Value()) > 0 {
			s.sessions.put(c.Value(), b, now)
		}
		fasthttp.ReleaseCookie(c)
	}
}
