package sip

import (
	"strings"
	"unsafe"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/lb"
)

// fillRouteInput fills in with what the routes of a SIP front end test in
// the new-work request req: the Request-URI host (domain=) and user
// (user=), the method, the host of the From URI (from-domain=) and the
// values of the headers names lists (lb.RouteTable.HeaderNames, lower
// case), in that order. The slices point into req's parsed strings:
// nothing is copied, and in must not outlive req.
//
// It reads what the proxy itself parsed, so a route sees the request as
// it is forwarded:
//   - The host is as written (brackets kept around an IPv6 address); the
//     table lower-cases it and drops one trailing dot.
//   - The user is unescaped (%2B4420 is +4420, RFC 3261 §19.1.4: the two
//     are the same URI), and a telephone number (a tel: URI, a sip: URI
//     with user=phone, or a user starting with '+') loses its visual
//     separators (- . ( ), RFC 3966) and its parameters (;isub=...,
//     ;phone-context=...): +44-20-7946 is +44207946. The parameter
//     user=phone is found in any case (RFC 3261 §19.1.4). Only a user
//     that needs either is copied (one allocation of at most
//     lb.MaxRouteValueLen bytes, however long the user as written). A
//     user whose normal form is longer than lb.MaxRouteValueLen is not
//     routed on a truncated form: fillRouteInput returns false, and the
//     request is answered 414 Request-URI Too Long. A tel: URI has no
//     host.
//   - A header is found by its name in any case or by its compact form
//     (s for Subject, ...); its first value counts, as the table wants.
//     A header present but empty is an empty value, not an absent one.
//     The headers the proxy parses itself (Via, To, Call-ID, CSeq, Route,
//     Max-Forwards, Content-Length) are written back from their parsed
//     form, which costs an allocation.
func fillRouteInput(in *lb.RouteInput, req *gosip.Request, names []string) (ok bool) {
	u := &req.Recipient
	ok = true
	switch strings.ToLower(u.Scheme) {
	case "sip", "sips":
		in.Host = bytesOf(u.Host)
		phone := false
		for _, kv := range u.UriParams {
			if strings.EqualFold(kv.K, "user") && strings.EqualFold(kv.V, "phone") {
				phone = true
				break
			}
		}
		in.Path, ok = routeUser(u.User, phone)
	case "tel":
		in.Host = nil
		in.Path, ok = routeUser(u.Raw(), true)
	default:
		in.Host, in.Path = nil, nil
	}
	in.Method = bytesOf(string(req.Method))
	in.FromHost = nil
	hs := req.Headers()
	for _, h := range hs {
		if headerNamed(h.Name(), "from") {
			in.FromHost = bytesOf(uriHost(h.Value()))
			break
		}
	}
	for i := range in.Headers {
		in.Headers[i] = nil
		if i >= len(names) {
			continue
		}
		for _, h := range hs {
			if headerNamed(h.Name(), names[i]) {
				v := h.Value()
				if v == "" {
					in.Headers[i] = emptyValue
				} else {
					in.Headers[i] = bytesOf(v)
				}
				break
			}
		}
	}
	return ok
}

// emptyValue is a present, empty header value (nil is an absent one).
var emptyValue = []byte{}

// bytesOf returns the bytes of s without copying them. The route table
// only reads them.
func bytesOf(s string) []byte {
	if s == "" {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// routeUser returns the user a route tests: user unescaped and, when it
// is a telephone number (phone, or a user starting with '+' once
// unescaped), without visual separators and parameters. It copies only
// a user that needs either, and then exactly its normal form, at most
// lb.MaxRouteValueLen bytes, whatever the length of user: a client may pad a number with
// any number of separators or escapes. ok is false (and the user nil)
// when the normal form is longer than lb.MaxRouteValueLen: a route must
// not test a truncated user, which may read as another number than the
// backend reads.
func routeUser(user string, phone bool) (out []byte, ok bool) {
	escaped := strings.IndexByte(user, '%') >= 0
	phone = phone || strings.HasPrefix(user, "+") || escaped && len(user) >= 3 && strings.EqualFold(user[:3], "%2B")
	if phone {
		if i := strings.IndexByte(user, ';'); i >= 0 {
			user = user[:i]
		}
	}
	if !escaped && !(phone && strings.ContainsAny(user, "-.()")) {
		if len(user) > lb.MaxRouteValueLen {
			return nil, false
		}
		return bytesOf(user), true
	}
	n := normalUser(user, phone, nil)
	if n > lb.MaxRouteValueLen {
		return nil, false
	}
	out = make([]byte, n)
	normalUser(user, phone, out)
	return out, true
}

// normalUser writes user unescaped and, with phone, without visual
// separators into out (nil: nowhere) and returns the length of that
// form, counting at most lb.MaxRouteValueLen+1 bytes of it.
func normalUser(user string, phone bool, out []byte) int {
	n := 0
	for i := 0; i < len(user); i++ {
		c := user[i]
		if c == '%' && i+2 < len(user) && isHex(user[i+1]) && isHex(user[i+2]) {
			c = unhex(user[i+1])<<4 | unhex(user[i+2])
			i += 2
		}
		if phone && (c == '-' || c == '.' || c == '(' || c == ')') {
			continue
		}
		if n > lb.MaxRouteValueLen {
			return n
		}
		if out != nil {
			out[n] = c
		}
		n++
	}
	return n
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c|0x20 && c|0x20 <= 'f'
}

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c | 0x20 - 'a' + 10
}

// uriHost returns the host of the SIP or SIPS URI in a From (or To)
// header value: name-addr ("Alice" <sip:alice@host;p>;tag=x) or
// addr-spec (sip:alice@host;tag=x). An IPv6 host keeps its brackets; ""
// for another scheme or a value that holds no URI. It takes the user to
// end at the first '@', as the parser does for the Request-URI.
func uriHost(v string) string {
	u := v
	if i := indexOutsideQuotes(v, '<'); i >= 0 {
		u = v[i+1:]
		if j := strings.IndexByte(u, '>'); j >= 0 {
			u = u[:j]
		}
	} else if j := strings.IndexByte(u, ';'); j >= 0 {
		u = u[:j] // header parameters of an addr-spec
	}
	u = strings.TrimSpace(u)
	c := strings.IndexByte(u, ':')
	if c < 0 {
		return ""
	}
	if s := u[:c]; !strings.EqualFold(s, "sip") && !strings.EqualFold(s, "sips") {
		return ""
	}
	u = u[c+1:]
	if at := strings.IndexAny(u, "@["); at >= 0 && u[at] == '@' {
		u = u[at+1:]
	}
	if strings.HasPrefix(u, "[") {
		if j := strings.IndexByte(u, ']'); j >= 0 {
			return u[:j+1]
		}
		return ""
	}
	if j := strings.IndexAny(u, ":;?>"); j >= 0 {
		u = u[:j]
	}
	return u
}

// compactForms maps the compact form of a header name (RFC 3261 §7.3.3
// and the extensions that define one) to its full name, lower case.
var compactForms = [26]string{
	'a' - 'a': "accept-contact", 'b' - 'a': "referred-by", 'c' - 'a': "content-type",
	'd' - 'a': "request-disposition", 'e' - 'a': "content-encoding", 'f' - 'a': "from",
	'i' - 'a': "call-id", 'j' - 'a': "reject-contact", 'k' - 'a': "supported",
	'l' - 'a': "content-length", 'm' - 'a': "contact", 'o' - 'a': "event",
	'r' - 'a': "refer-to", 's' - 'a': "subject", 't' - 'a': "to", 'u' - 'a': "allow-events",
	'v' - 'a': "via", 'x' - 'a': "session-expires", 'y' - 'a': "identity",
}

// headerNamed reports whether a header called name (as received) is the
// header lower (lower case, full name).
func headerNamed(name, lower string) bool {
	if len(name) == 1 {
		c := name[0] | 0x20
		if 'a' <= c && c <= 'z' && compactForms[c-'a'] == lower {
			return true
		}
	}
	return strings.EqualFold(name, lower)
}
