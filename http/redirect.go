package http

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// writeRedirect answers a plain request 308 to the same host and target
// over HTTPS (Config.HTTPSRedirect): https://HOST[:PORT]TARGET, PORT
// being the HTTPS listener's unless it is 443. The host is the Host
// header's, checked to be a DNS name or an IP literal (a Host that could
// make the Location name another authority, such as one with '@', '/' or
// '\', is answered 400); the client's port is dropped. 308 keeps the
// method and body (RFC 9110 §15.4.9).
func (s *Server) writeRedirect(resp *fasthttp.Response, h *fasthttp.RequestHeader) {
	host, ok := redirectHost(h.Host())
	if !ok {
		s.stats.BadRequest.Add(1)
		s.writeRefusal(resp, fasthttp.StatusBadRequest, 0, psHeadRefused, "Host is not a name or address to redirect to")
		return
	}
	s.stats.Redirected.Add(1)
	resp.Reset()
	resp.SetStatusCode(fasthttp.StatusPermanentRedirect)
	loc := make([]byte, 0, 16+len(host)+len(h.RequestURI()))
	loc = append(loc, "https://"...)
	loc = append(loc, host...)
	if p := s.redirectPort(); p != "" && p != "443" {
		loc = append(append(loc, ':'), p...)
	}
	target := h.RequestURI()
	if len(target) == 0 || target[0] != '/' {
		target = []byte("/") // "*" (OPTIONS) or nothing: the root
	}
	loc = append(loc, target...)
	resp.Header.SetBytesV("Location", loc)
	resp.Header.SetContentType("text/plain; charset=utf-8")
	resp.Header.Set("Cache-Control", "no-store")
	resp.SetBodyString("use https\n")
}

// redirectPort is the port of the HTTPS listener: the one served, else
// the one configured, else "" (the scheme's default).
func (s *Server) redirectPort() string {
	if p := s.httpsPort.Load(); p != nil {
		return *p
	}
	return tlsListenPort(s.cfg.TLSListen)
}

// redirectHost returns the host part of a Host value (its port dropped)
// if it is a DNS name (letters, digits, '-', '.', '_') or a bracketed
// IPv6 literal, at most 255 bytes.
func redirectHost(v []byte) ([]byte, bool) {
	if len(v) == 0 || len(v) > 255+8 {
		return nil, false
	}
	host, port := v, []byte(nil)
	if v[0] == '[' {
		end := bytes.IndexByte(v, ']')
		if end < 0 {
			return nil, false
		}
		host = v[:end+1]
		for _, c := range v[1:end] {
			if !(c == ':' || c == '.' || '0' <= c && c <= '9' || 'a' <= c|0x20 && c|0x20 <= 'f') {
				return nil, false
			}
		}
		rest := v[end+1:]
		if len(rest) > 0 {
			if rest[0] != ':' {
				return nil, false
			}
			port = rest[1:]
		}
		if len(host) < 4 {
			return nil, false
		}
	} else {
		if i := bytes.IndexByte(v, ':'); i >= 0 {
			host, port = v[:i], v[i+1:]
		}
		if len(host) == 0 || len(host) > 255 || host[0] == '.' || host[0] == '-' {
			return nil, false
		}
		for _, c := range host {
			if !('a' <= c|0x20 && c|0x20 <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_') {
				return nil, false
			}
		}
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return nil, false
		}
	}
	if len(port) > 5 {
		return nil, false
	}
	return host, true
}
