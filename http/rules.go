package http

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/sluicelb/sluice/admission"
)

// ruleView is what the front end derives from one ARM rule set: whether
// any rule matches on the path (so requests need their path parsed). The
// controller's rule
// set changes at run time (the admin listener, SIGHUP): the view follows
// it, so a path rule added later matches HTTP requests from the next one.
type ruleView struct {
	meters   []*admission.Meter // the rule set the view was built from
	needPath bool               // a rule matches on the path
}

func newRuleView(meters []*admission.Meter) *ruleView {
	v := &ruleView{meters: meters}
	for _, m := range meters {
		v.needPath = v.needPath || m.Config().Match.PathPrefix != ""
	}
	return v
}

// sameMeters reports whether a and b are the same rule set: the
// controller stores every new set in a new slice, so the first element's
// address and the length identify it.
func sameMeters(a, b []*admission.Meter) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// rules returns the view of the rule set in force: two atomic loads and a
// comparison per request, a rebuild only after the set changed.
func (s *Server) rules() *ruleView {
	meters := s.ctrl.Rules()
	if v := s.ruleView.Load(); v != nil && sameMeters(v.meters, meters) {
		return v
	}
	v := newRuleView(meters)
	s.ruleView.Store(v)
	for _, m := range meters {
		if why := unmatchable(m.Config().Match); why != "" {
			s.logger.Warn("http: arm rule can never match", "rule", m.Name(), "reason", why)
		}
	}
	return v
}

// unmatchable says why a rule's host or path can never equal what
// requests are matched as (matchHost, matchPath), "" when it can: a rule
// written with a port, a trailing dot, parameters, percent-encoding or
// dot-segments would silently match nothing.
func unmatchable(m admission.Match) string {
	if h := m.Host; h != "" && !strings.EqualFold(string(matchHost(nil, []byte(h))), h) {
		return fmt.Sprintf("host %q is matched as %q (no port, no trailing dot)", h, matchHost(nil, []byte(h)))
	}
	if p := m.PathPrefix; p != "" {
		if p[0] != '/' {
			return fmt.Sprintf("path %q does not start with /", p)
		}
		// A prefix may end in the middle of a segment ("/api/.w" matches
		// "/api/.well-known"): the part up to its last '/' must be in
		// normal form, the rest only free of what matchPath removes.
		i := strings.LastIndexByte(p, '/')
		if n := matchPath(nil, []byte(p[:i+1])); string(n) != p[:i+1] || strings.ContainsAny(p[i+1:], "%;\\") {
			return fmt.Sprintf("path %q is not in normal form (decoded, no empty segments, parameters or dot-segments)", p)
		}
	}
	return ""
}

// The normalised view of a request that ARM rules (and routes) match on:
// one function per part, the same on both engines, so that no spelling of
// a path or host that a backend reads as the one a rule names escapes the
// rule. The request is forwarded as the client sent it; only matching
// uses this view.

// matchPath returns the path of target, a request target as forwarded
// (origin-form; "*" is returned as it is), in the normal form rules match:
//
//   - the query is cut off; an origin-form target is a path only ("//api/h"
//     is the path /api/h, never an authority);
//   - every percent-encoded octet is decoded, once;
//   - '\' is a '/' (some servers read it so);
//   - empty segments are dropped ("//" is "/");
//   - a segment's ";parameters" are cut off, as the Java servers behind MOP
//     do ("/api;jsessionid=1/x" is /api/x). A ';' from "%3b" is cut off too:
//     a server that decodes before it strips parameters reads it so, and
//     cutting is the conservative choice (a rule can only match more);
//   - dot-segments are removed (RFC 3986 §5.2.4), after the parameters
//     ("/x/..;/api" is /api).
//
// A trailing '/' is kept. The result views target when target is already
// in that form (no allocation: the usual case), else it is appended to dst.
func matchPath(dst, target []byte) []byte {
	if len(target) == 0 || target[0] != '/' {
		return target
	}
	if i := bytes.IndexByte(target, '?'); i >= 0 {
		target = target[:i]
	}
	if normalPath(target) {
		return target
	}
	// Decode into dst, then rewrite dst's segments in place: the output
	// never outgrows what was read.
	out := dst[:0]
	for i := 0; i < len(target); i++ {
		c := target[i]
		if c == '%' && i+2 < len(target) && isHex(target[i+1]) && isHex(target[i+2]) {
			c = unhex(target[i+1])<<4 | unhex(target[i+2])
			i += 2
		}
		if c == '\\' {
			c = '/'
		}
		out = append(out, c)
	}
	// out[0] is '/'; each turn reads the '/' at r and the segment after
	// it, and writes it (or drops it) at w <= r.
	w := 0 // out[:w] is the path so far, without a trailing '/'
	trailing := false
	for r := 0; r < len(out); {
		r++
		end := r
		for end < len(out) && out[end] != '/' {
			end++
		}
		seg := out[r:end]
		if i := bytes.IndexByte(seg, ';'); i >= 0 {
			seg = seg[:i]
		}
		last := end == len(out)
		switch string(seg) {
		case "", ".":
			trailing = last
		case "..":
			w = max(bytes.LastIndexByte(out[:w], '/'), 0)
			trailing = last
		default:
			out[w] = '/'
			w += 1 + copy(out[w+1:], seg)
			trailing = false
		}
		r = end
	}
	if w == 0 || trailing {
		return append(out[:w], '/')
	}
	return out[:w]
}

// normalPath reports whether p is in the form matchPath makes: no
// percent-encoding, no '\' or ';', no empty and no dot-segment.
func normalPath(p []byte) bool {
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '%', ';', '\\':
			return false
		case '/':
			if i+1 < len(p) && p[i+1] == '/' {
				return false
			}
		case '.':
			if p[i-1] == '/' && (i+1 == len(p) || p[i+1] == '/' ||
				p[i+1] == '.' && (i+2 == len(p) || p[i+2] == '/')) {
				return false
			}
		}
	}
	return true
}

// matchHost returns host (a Host value checkHead accepted, or the
// authority of an absolute-form target) in the normal form rules match:
// lower case, without trailing dots and without any port (a rule names a
// host; nginx and Tomcat choose a virtual host by the name alone, so
// "shop.example:8080" must not escape a rule for shop.example). The result
// views host when it is already lower case, else it is appended to dst.
func matchHost(dst, host []byte) []byte {
	if len(host) > 0 && host[0] == '[' {
		if i := bytes.IndexByte(host, ']'); i > 0 {
			host = host[:i+1]
		}
	} else if i := bytes.IndexByte(host, ':'); i >= 0 {
		host = host[:i]
	}
	for len(host) > 0 && host[len(host)-1] == '.' {
		host = host[:len(host)-1]
	}
	for i, c := range host {
		if 'A' <= c && c <= 'Z' {
			out := append(dst[:0], host...)
			for j := i; j < len(out); j++ {
				if c := out[j]; 'A' <= c && c <= 'Z' {
					out[j] = c + 'a' - 'A'
				}
			}
			return out
		}
	}
	return host
}
