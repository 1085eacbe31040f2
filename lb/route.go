package lb

import (
	"bytes"
	"fmt"
	"math/bits"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"unicode/utf8"
	"unsafe"
)

// Limits of routes and route tables.
const (
	// MaxRoutes is the most routes a front end's table holds.
	MaxRoutes = 1024
	// MaxRouteHeaders is the most distinct header names the routes of one
	// table may test: RouteInput carries that many values.
	MaxRouteHeaders = 8
	// MaxRouteValueLen is the longest path or user prefix, strip prefix
	// and header value of a route, in bytes.
	MaxRouteValueLen = 1024
	// MaxRouteRegexLen is the longest regular expression of a route.
	MaxRouteRegexLen = 4096
	// MaxRouteRegexInput is the longest input (HTTP path, SIP user), in
	// bytes, a route's regular expression is run on. Go's regexp runs in
	// time linear in its input, but past a few hundred bytes it leaves its
	// fast matchers for the NFA, at tens of nanoseconds per byte and per
	// state: a 16 KiB path a client chooses cost one regex route about
	// 0.4 ms, 1,024 bytes about 13 µs (MaxRegexRoutes). A front end refuses a longer input before Match when its
	// table has regex routes (HTTP: 414), and Match never runs a regex on
	// a longer input (the route does not match) in case one does not.
	MaxRouteRegexInput = 1024
	// MaxRegexRoutes is the most routes with a regular expression one
	// table holds. Every request is a candidate for a regex route without
	// a host, prefix, method or header condition, tried in order until one
	// matches: BenchmarkRegexLongPath measures about 13 µs per such route
	// (path=~.*/tN\.(css|js)) at a MaxRouteRegexInput-byte path that
	// matches none, 1.4 µs at 100 bytes (2 shared cores), so 64 routes
	// bound the worst request near 0.9 ms of matching. More is better
	// written as one alternation, or narrowed by a host or prefix.
	MaxRegexRoutes = 64
	// maxHostLen is the longest host name (RFC 1035: 253 characters
	// written without the trailing dot).
	maxHostLen = 253
	// maxMethodLen is the longest method a route names.
	maxMethodLen = 64
)

// RouteSpec is one route as an operator writes it (-http-route,
// -sip-route, a config file, the control API): pool=NAME followed by
// conditions, all of which must hold. A route without conditions matches
// everything (a catch-all). Fields are canonical (ParseRouteSpec's
// output); an empty field is no condition.
//
// HTTP:  pool=NAME[,host=H][,path=/PREFIX|path=~REGEX][,method=M][,header=NAME:VALUE][,strip=/PREFIX]
// SIP:   pool=NAME[,domain=H][,user=PREFIX|user=~REGEX][,method=M][,header=NAME:VALUE][,from-domain=H]
//
// Values are written as they are: a comma ends a value only where the
// next key follows it (",method="), so a regular expression such as
// user=~\+44[0-9]{6,10} or a header value "a, b" needs no quoting. A value
// cannot hold a comma followed by a word and "=". A user= value starting
// with ~ is a regular expression.
type RouteSpec struct {
	// Proto is "http" or "sip".
	Proto string
	// Pool is the pool new work that matches goes to
	// (admission.CheckPoolName).
	// Key pool, required.
	Pool string
	// Host is the host the request names: HTTP the Host header (key
	// host), SIP the Request-URI host (key domain). Lower case, without
	// port or trailing dot; "*.example.com" matches any name under
	// example.com (a.example.com, a.b.example.com), not example.com
	// itself. Compared case-insensitively, the request's port and one
	// trailing dot ignored. An IPv6 address is kept in brackets in its
	// RFC 5952 form (lower case, zeros compressed); a request's bracketed
	// IPv6 host is put in that form before it is compared, so any
	// spelling of the address matches.
	Host string
	// Prefix is a byte prefix of the HTTP path (key path=/PREFIX, starts
	// with /) or of the SIP Request-URI user (key user=PREFIX).
	Prefix string
	// Regex is a regular expression (Go RE2 syntax) the whole HTTP path
	// (path=~REGEX) or SIP Request-URI user (user=~REGEX) must match: it
	// is anchored at both ends, ^(?:REGEX)$. At most one of Prefix and
	// Regex is set. An HTTP path regex sees the path in the normal form a
	// path= prefix must be written in (decoded, no dot-segments, no
	// ;parameters); it is never run on more than MaxRouteRegexInput bytes.
	Regex string
	// Method is the request method, compared exactly (methods are
	// case-sensitive in HTTP and SIP). An HTTP route for GET also matches
	// HEAD, as ARM rules do: a HEAD runs the GET handler. Key method.
	Method string
	// Header and HeaderValue: the request must carry header Header
	// (lower case here, matched in any case) with exactly HeaderValue.
	// Key header=NAME:VALUE.
	Header, HeaderValue string
	// FromDomain is the host of the SIP From URI, exact or "*." wildcard
	// as Host. Key from-domain, SIP only.
	FromDomain string
	// Strip is a path prefix removed before the request goes to the
	// backend (StripPrefix: whole path segments only). Key strip, HTTP
	// only; with path=/PREFIX it must be a prefix of PREFIX that ends
	// where a segment does.
	Strip string
}

// routeKeys are the keys each protocol accepts, in the order String
// writes them and errors list them.
var routeKeys = map[string][]string{
	"http": {"pool", "host", "path", "method", "header", "strip"},
	"sip":  {"pool", "domain", "user", "method", "header", "from-domain"},
}

// ParseRouteSpec parses one route of protocol proto ("http" or "sip").
// Keys are case-insensitive, in any order, each at most once. An unknown
// key, a key of the other protocol, a key given twice, a missing or bad
// pool, a bad host, prefix, regular expression, method or header is an
// error that quotes the spec and names the key, its value and what is
// wanted.
func ParseRouteSpec(proto, s string) (RouteSpec, error) {
	keys, ok := routeKeys[proto]
	if !ok {
		return RouteSpec{}, fmt.Errorf("route %q: unknown protocol %q", s, proto)
	}
	bad := func(format string, a ...any) (RouteSpec, error) {
		return RouteSpec{}, fmt.Errorf("route %q: %s", s, fmt.Sprintf(format, a...))
	}
	if strings.TrimSpace(s) == "" {
		return bad("empty: want pool=NAME followed by the conditions")
	}
	if !utf8.ValidString(s) {
		// Specs travel into metric labels, /status and events: one
		// spelling, valid text.
		return bad("not valid UTF-8")
	}
	items, err := splitSpec(s)
	if err != nil {
		return bad("%v", err)
	}
	r := RouteSpec{Proto: proto}
	seen := map[string]bool{}
	for _, it := range items {
		k, v := it.key, it.value
		if !slices.Contains(keys, k) {
			other := "sip"
			if proto == "sip" {
				other = "http"
			}
			if slices.Contains(routeKeys[other], k) {
				return bad("key %q is for %s routes only (a %s route takes %s)", k, strings.ToUpper(other), proto, strings.Join(keys, ", "))
			}
			return bad("unknown key %q for a %s route (want %s)", k, proto, strings.Join(keys, ", "))
		}
		if seen[k] {
			return bad("key %q given twice (every condition of a route must hold: write two routes for either of two values)", k)
		}
		seen[k] = true
		if v == "" {
			return bad("key %q has no value", k)
		}
		switch k {
		case "pool":
			if err := poolNameError(v); err != nil {
				return bad("pool: %v", err)
			}
			r.Pool = v
		case "host", "domain", "from-domain":
			h, err := canonicalHost(v)
			if err != nil {
				return bad("%s %q: %v", k, v, err)
			}
			if k == "from-domain" {
				r.FromDomain = h
			} else {
				r.Host = h
			}
		case "path", "user":
			if re, ok := strings.CutPrefix(v, "~"); ok {
				if err := checkRouteRegex(re); err != nil {
					return bad("%s %q: %v", k, v, err)
				}
				r.Regex = re
				break
			}
			if k == "path" && !strings.HasPrefix(v, "/") {
				return bad("path %q: want a prefix starting with / (or ~REGEX)", v)
			}
			if len(v) > MaxRouteValueLen || hasSpaceOrControl(v) {
				return bad("%s %q: want 1..%d bytes without spaces or control characters", k, v, MaxRouteValueLen)
			}
			if k == "path" {
				if why := abnormalPath(v); why != "" {
					return bad("path %q: %s, which no request path has once normalized: write the path in normal form: %s", v, why, normalFormHelp)
				}
			}
			r.Prefix = v
		case "method":
			if !isToken(v) || len(v) > maxMethodLen {
				return bad("method %q: want a method name (a token of at most %d bytes, such as GET or INVITE; compared case-sensitively)", v, maxMethodLen)
			}
			r.Method = v
		case "header":
			name, value, ok := strings.Cut(v, ":")
			name, value = strings.TrimSpace(name), strings.TrimSpace(value)
			if !ok || !isToken(name) || value == "" || len(value) > MaxRouteValueLen || hasControl(value) {
				return bad("header %q: want NAME:VALUE, NAME a header name and VALUE 1..%d bytes without control characters (matched exactly)", v, MaxRouteValueLen)
			}
			r.Header, r.HeaderValue = strings.ToLower(name), value
		case "strip":
			if !strings.HasPrefix(v, "/") || v == "/" || len(v) > MaxRouteValueLen || hasSpaceOrControl(v) {
				return bad("strip %q: want a path prefix such as /static (starting with /, more than /, at most %d bytes)", v, MaxRouteValueLen)
			}
			if why := abnormalPath(v); why != "" {
				return bad("strip %q: %s, which no request path has once normalized: write the path in normal form: %s", v, why, normalFormHelp)
			}
			r.Strip = v
		}
	}
	if r.Pool == "" {
		return bad("key pool is required (pool=NAME)")
	}
	if r.Strip != "" && r.Prefix != "" {
		if !strings.HasPrefix(r.Prefix, r.Strip) {
			return bad("strip %q is not a prefix of path %q: the path the route matches must start with what it strips", r.Strip, r.Prefix)
		}
		if rest := r.Prefix[len(r.Strip):]; rest != "" && rest[0] != '/' && !strings.HasSuffix(r.Strip, "/") {
			seg, _, _ := strings.Cut(rest, "/")
			return bad("strip %q ends inside a segment of path %q: it strips whole segments only (such as strip=%s)", r.Strip, r.Prefix, r.Strip+seg)
		}
	}
	return r, nil
}

// String is the canonical spec of r: pool first, then the conditions in
// a fixed order (see RouteSpec). It parses back to r.
func (r RouteSpec) String() string {
	var b strings.Builder
	add := func(k, v string) {
		if v == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + v)
	}
	host, prefix := "host", "path"
	if r.Proto == "sip" {
		host, prefix = "domain", "user"
	}
	add("pool", r.Pool)
	add(host, r.Host)
	add(prefix, r.Prefix)
	if r.Regex != "" {
		add(prefix, "~"+r.Regex)
	}
	add("method", r.Method)
	if r.Header != "" {
		add("header", r.Header+":"+r.HeaderValue)
	}
	add("from-domain", r.FromDomain)
	add("strip", r.Strip)
	return b.String()
}

// canonicalHost checks a route's host, domain or from-domain and writes it
// in lower case without a trailing dot: a DNS name or IPv4 address, a
// bracketed IPv6 address, or "*." and a DNS name.
func canonicalHost(v string) (string, error) {
	h := strings.TrimSuffix(strings.ToLower(v), ".")
	if strings.HasPrefix(h, "[") {
		a, err := netip.ParseAddr(strings.TrimSuffix(h[1:], "]"))
		if !strings.HasSuffix(h, "]") || err != nil || !a.Is6() || a.Zone() != "" {
			return "", fmt.Errorf("want a host name, *.DOMAIN or a bracketed IPv6 address without port")
		}
		return "[" + a.String() + "]", nil
	}
	name, wild := strings.CutPrefix(h, "*.")
	if !validHostName(name) {
		return "", fmt.Errorf("want a host name (letters, digits, - and _ in dot-separated labels, at most %d bytes) or *.DOMAIN, without port", maxHostLen)
	}
	if wild {
		return "*." + name, nil
	}
	return name, nil
}

// validHostName accepts a lower-case DNS name (or IPv4 address): labels of
// a-z, 0-9, - and _, none empty.
func validHostName(h string) bool {
	if h == "" || len(h) > maxHostLen {
		return false
	}
	label := 0
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
		case 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_':
			label++
		default:
			return false
		}
	}
	return label > 0
}

// checkRouteRegex compiles re alone before it is anchored: a pattern such
// as "a)|(b" would otherwise escape ^(?:...)$ and match unanchored.
func checkRouteRegex(re string) error {
	if re == "" || len(re) > MaxRouteRegexLen {
		return fmt.Errorf("want a regular expression of 1..%d bytes after ~", MaxRouteRegexLen)
	}
	if _, err := regexp.Compile(re); err != nil {
		return fmt.Errorf("bad regular expression: %v", err)
	}
	if _, err := regexp.Compile(anchored(re)); err != nil {
		return fmt.Errorf("bad regular expression once anchored: %v", err)
	}
	return nil
}

// normalFormHelp says what the normal form of a route's path is.
const normalFormHelp = "decoded ASCII (no %XX), / between segments (no \\), no empty, . or .. segment, no ;parameters, no ? or #"

// abnormalPath says why the path prefix p (path=, strip=) can never be a
// prefix of a request path in the normal form the HTTP front end matches
// routes in ("" when it can): a percent-escape (paths are matched
// decoded), '\' (read as '/'), ';' (parameters are cut), '?' or '#'
// (never part of a path), a byte outside ASCII (a request target is
// ASCII: such a byte arrives percent-encoded and its decoded path differs
// from the raw one, which the front end refuses as ambiguous), an empty,
// "." or ".." segment before the last '/' (removed). The last segment may
// be anything else: /api/. is a prefix of /api/.well-known.
func abnormalPath(p string) string {
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '%':
			return "a percent-escape"
		case c == '\\':
			return `a \`
		case c == ';':
			return "a ;parameter"
		case c == '?' || c == '#':
			return fmt.Sprintf("a %c", c)
		case c >= 0x80:
			return "a byte outside ASCII"
		}
	}
	segs := strings.Split(p, "/")
	for _, seg := range segs[1 : len(segs)-1] {
		switch seg {
		case "":
			return "an empty segment (//)"
		case ".", "..":
			return "a " + seg + " segment"
		}
	}
	return ""
}

func anchored(re string) string { return "^(?:" + re + ")$" }

func hasSpaceOrControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f })
}

func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f })
}

// StripPrefix removes strip from the front of path, a whole path segment
// at a time, for a route's strip=: with strip /static, /static/a.css
// becomes /a.css and /static becomes /; /staticfile and a path that does
// not start with strip are unchanged. A strip ending in / (/static/)
// removes the same: /static/a.css becomes /a.css. The result is never
// empty and always starts with / when path does; it shares path's
// bytes (no allocation).
func StripPrefix(path []byte, strip string) []byte {
	if strip == "" || len(path) < len(strip) || string(path[:len(strip)]) != strip {
		return path
	}
	rest := path[len(strip):]
	switch {
	case len(rest) == 0:
		if strings.HasSuffix(strip, "/") {
			return path[len(path)-1:]
		}
		return path[:1]
	case rest[0] == '/':
		return rest
	case strings.HasSuffix(strip, "/"):
		return path[len(strip)-1:]
	}
	return path
}

// RouteInput is what a route can test in one request. The front end fills
// it without allocating: the slices point into the request.
type RouteInput struct {
	// Host: HTTP the Host header as received (Match ignores the port,
	// case and trailing dots); SIP the Request-URI host.
	Host []byte
	// Path: HTTP the normalized path without query (as for ARM rules);
	// SIP the Request-URI user.
	Path   []byte
	Method []byte
	// FromHost is the host of the SIP From URI.
	FromHost []byte
	// Headers are the values of the headers HeaderNames lists, in its
	// order; nil is an absent header. The HTTP front end refuses (400) a
	// request that sends a tested header more than once, before Match: a
	// route and the backend could read different lines.
	Headers [MaxRouteHeaders][]byte
}

// maxWords is the bitset length for MaxRoutes routes.
const maxWords = (MaxRoutes + 63) / 64

// RouteTable selects the first route a request matches. Each dimension
// a route may constrain (host, path or user prefix, method, header, SIP
// From host) yields the set of routes still possible for the request,
// found by hash lookups (exact names, "*." suffixes per label, methods,
// header values) and a walk of a prefix tree: routes that do not
// constrain a dimension are always in its set. The sets are intersected
// and the lowest route in the result wins once its regular expression,
// if any, matches. So the cost grows with the request's host labels and
// path length, not with the number of routes (beyond one bit per route).
// A RouteTable is immutable but for its hit counters; Match is safe for
// concurrent use, takes no lock and allocates nothing.
type RouteTable struct {
	proto       string
	specs       []RouteSpec
	hits        []atomic.Uint64
	nw          int      // words per set
	all         []uint64 // every route
	host, from  nameIndex
	prefix      prefixIndex
	method      valueIndex
	header      []valueIndex // per HeaderNames entry
	headerAny   []uint64     // routes without a header condition
	headerNames []string
	regex       []*regexp.Regexp // per route; nil: none
	nregex      int              // routes with a regex
}

// nameIndex finds the routes whose host (or From host) condition a name
// meets.
type nameIndex struct {
	used  bool     // some route has the condition
	any   []uint64 // routes without it
	exact map[string][]uint64
	wild  map[string][]uint64 // by the suffix after "*."
}

// prefixIndex is a radix tree (a byte trie with single-child chains
// merged) of the path or user prefixes: at most two nodes per route
// whatever the prefixes' lengths, and a walk of one node per branch
// point.
type prefixIndex struct {
	used  bool
	any   []uint64
	nodes []trieNode // nodes[0] is the root, label ""
}

type trieNode struct {
	label string  // the bytes from the parent to this node
	keys  []byte  // first byte of each child's label
	kids  []int32 // child node indexes, in keys' order
	set   []uint64
}

// valueIndex finds the routes whose condition on one value (a method, a
// header's value) is met.
type valueIndex struct {
	used bool
	any  []uint64
	sets map[string][]uint64
}

// NewRouteTable builds the table of routes, first match first. Every
// route must be of protocol proto and canonical (as ParseRouteSpec gives
// it); at most MaxRoutes routes and MaxRouteHeaders distinct header names.
func NewRouteTable(proto string, routes []RouteSpec) (*RouteTable, error) {
	if _, ok := routeKeys[proto]; !ok {
		return nil, fmt.Errorf("route table: unknown protocol %q", proto)
	}
	if len(routes) > MaxRoutes {
		return nil, fmt.Errorf("route table: %d %s routes: at most %d", len(routes), proto, MaxRoutes)
	}
	t := &RouteTable{
		proto: proto,
		specs: slices.Clone(routes),
		hits:  make([]atomic.Uint64, len(routes)),
		nw:    (len(routes) + 63) / 64,
		regex: make([]*regexp.Regexp, len(routes)),
	}
	for i, r := range routes {
		if r.Proto != proto {
			return nil, fmt.Errorf("route %d (%s): a %q route in the %s table", i+1, r, r.Proto, proto)
		}
		p, err := ParseRouteSpec(proto, r.String())
		if err != nil {
			return nil, fmt.Errorf("route %d: %w", i+1, err)
		}
		if p != r {
			return nil, fmt.Errorf("route %d (%s): not canonical (ParseRouteSpec gives %s)", i+1, r, p)
		}
		if r.Regex != "" {
			if t.nregex++; t.nregex > MaxRegexRoutes {
				return nil, fmt.Errorf("route %d (%s): more than %d %s routes with a regular expression (path=~ or user=~): each costs every request that reaches it; join them into one alternation", i+1, r, MaxRegexRoutes, proto)
			}
			t.regex[i] = regexp.MustCompile(anchored(r.Regex))
		}
		if r.Header != "" && !slices.Contains(t.headerNames, r.Header) {
			t.headerNames = append(t.headerNames, r.Header)
		}
	}
	if len(t.headerNames) > MaxRouteHeaders {
		return nil, fmt.Errorf("route table: the %s routes test %d distinct headers (%s): at most %d", proto, len(t.headerNames), strings.Join(t.headerNames, ", "), MaxRouteHeaders)
	}
	sort.Strings(t.headerNames)
	t.all = t.newSet()
	for i := range routes {
		setBit(t.all, i)
	}
	t.host = t.newNameIndex(func(r RouteSpec) string { return r.Host })
	t.from = t.newNameIndex(func(r RouteSpec) string { return r.FromDomain })
	t.prefix = t.newPrefixIndex()
	t.method = t.newValueIndex(func(r RouteSpec) (string, bool) { return r.Method, r.Method != "" })
	if proto == "http" {
		// A route for GET also takes HEAD.
		if get, ok := t.method.sets["GET"]; ok {
			head := t.method.sets["HEAD"]
			if head == nil {
				head = t.newSet()
				t.method.sets["HEAD"] = head
			}
			orInto(head, get)
		}
	}
	t.headerAny = t.newSet()
	for i, r := range routes {
		if r.Header == "" {
			setBit(t.headerAny, i)
		}
	}
	for _, name := range t.headerNames {
		t.header = append(t.header, t.newValueIndex(func(r RouteSpec) (string, bool) { return r.HeaderValue, r.Header == name }))
	}
	return t, nil
}

func (t *RouteTable) newSet() []uint64 { return make([]uint64, t.nw) }

func setBit(s []uint64, i int) { s[i/64] |= 1 << (uint(i) % 64) }

func orInto(dst, src []uint64) {
	for w := range dst {
		dst[w] |= src[w]
	}
}

func (t *RouteTable) newNameIndex(field func(RouteSpec) string) nameIndex {
	x := nameIndex{any: t.newSet(), exact: map[string][]uint64{}, wild: map[string][]uint64{}}
	for i, r := range t.specs {
		h := field(r)
		m := x.exact
		if suffix, ok := strings.CutPrefix(h, "*."); ok {
			h, m = suffix, x.wild
		}
		switch {
		case h == "":
			setBit(x.any, i)
			continue
		case m[h] == nil:
			m[h] = t.newSet()
		}
		setBit(m[h], i)
		x.used = true
	}
	return x
}

func (t *RouteTable) newPrefixIndex() prefixIndex {
	x := prefixIndex{any: t.newSet(), nodes: []trieNode{{}}}
	for i, r := range t.specs {
		if r.Prefix == "" {
			setBit(x.any, i)
			continue
		}
		x.used = true
		n := x.insert(r.Prefix)
		if x.nodes[n].set == nil {
			x.nodes[n].set = t.newSet()
		}
		setBit(x.nodes[n].set, i)
	}
	return x
}

// insert returns the node that ends prefix p, splitting an edge or adding
// a leaf as needed.
func (x *prefixIndex) insert(p string) int32 {
	n := int32(0)
	for p != "" {
		k := bytes.IndexByte(x.nodes[n].keys, p[0])
		if k < 0 {
			x.nodes = append(x.nodes, trieNode{label: p})
			leaf := int32(len(x.nodes) - 1)
			x.nodes[n].keys = append(x.nodes[n].keys, p[0])
			x.nodes[n].kids = append(x.nodes[n].kids, leaf)
			return leaf
		}
		c := x.nodes[n].kids[k]
		label := x.nodes[c].label
		common := 0
		for common < len(label) && common < len(p) && label[common] == p[common] {
			common++
		}
		if common < len(label) {
			// Split the edge n -> c at common: n -> m -> c.
			x.nodes = append(x.nodes, trieNode{label: label[:common], keys: []byte{label[common]}, kids: []int32{c}})
			m := int32(len(x.nodes) - 1)
			x.nodes[c].label = label[common:]
			x.nodes[n].kids[k] = m
			c = m
		}
		n, p = c, p[common:]
	}
	return n
}

func (t *RouteTable) newValueIndex(cond func(RouteSpec) (string, bool)) valueIndex {
	x := valueIndex{any: t.newSet(), sets: map[string][]uint64{}}
	for i, r := range t.specs {
		v, ok := cond(r)
		if !ok {
			setBit(x.any, i)
			continue
		}
		x.used = true
		if x.sets[v] == nil {
			x.sets[v] = t.newSet()
		}
		setBit(x.sets[v], i)
	}
	return x
}

// Len is the number of routes (0 for a nil table).
func (t *RouteTable) Len() int {
	if t == nil {
		return 0
	}
	return len(t.specs)
}

// Spec is route i as parsed.
func (t *RouteTable) Spec(i int) RouteSpec { return t.specs[i] }

// Hits is how many requests route i took, since the table was built.
func (t *RouteTable) Hits(i int) uint64 { return t.hits[i].Load() }

// HeaderNames are the distinct header names the routes test, lower case,
// sorted: RouteInput.Headers[i] carries the value of HeaderNames()[i].
// It returns a copy: a front end reads it once per table.
func (t *RouteTable) HeaderNames() []string { return slices.Clone(t.headerNames) }

// StripPath is the path route i sends to its backend: StripPrefix with
// the route's strip (path itself when it has none).
func (t *RouteTable) StripPath(i int, path []byte) []byte {
	return StripPrefix(path, t.specs[i].Strip)
}

// HasRegex reports whether a route has a regular expression
// (path=~REGEX, user=~REGEX): a front end then refuses inputs longer
// than MaxRouteRegexInput before Match.
func (t *RouteTable) HasRegex() bool { return t != nil && t.nregex > 0 }

// Match returns the index of the first route whose every condition in
// holds, or -1 when none does, and counts a hit for it (Select and
// CountHit). It allocates nothing.
func (t *RouteTable) Match(in *RouteInput) int {
	i := t.Select(in)
	if i >= 0 {
		t.hits[i].Add(1)
	}
	return i
}

// CountHit counts a request that route i took. A front end that may
// send a request elsewhere than the route says (a session kept in its
// pool) uses Select and counts the hit only when the route's pool gets
// the request.
func (t *RouteTable) CountHit(i int) { t.hits[i].Add(1) }

// Select is Match without counting a hit. A regular expression is never
// run on a path longer than MaxRouteRegexInput: its route does not match
// such a path (the front end should have refused the request before).
func (t *RouteTable) Select(in *RouteInput) int {
	if t == nil || len(t.specs) == 0 {
		return -1
	}
	var candBuf, tmpBuf [maxWords]uint64
	cand, tmp := candBuf[:t.nw], tmpBuf[:t.nw]
	copy(cand, t.all)
	if t.host.used && !t.host.and(cand, tmp, in.Host) {
		return -1
	}
	if t.from.used && !t.from.and(cand, tmp, in.FromHost) {
		return -1
	}
	if t.method.used && !t.method.and(cand, tmp, in.Method) {
		return -1
	}
	if t.prefix.used && !t.prefix.and(cand, tmp, in.Path) {
		return -1
	}
	if len(t.header) > 0 {
		copy(tmp, t.headerAny)
		for i := range t.header {
			if v := in.Headers[i]; v != nil {
				if s := t.header[i].sets[string(v)]; s != nil {
					orInto(tmp, s)
				}
			}
		}
		if !andInto(cand, tmp) {
			return -1
		}
	}
	for w, x := range cand {
		for x != 0 {
			i := w*64 + bits.TrailingZeros64(x)
			if re := t.regex[i]; re == nil || len(in.Path) <= MaxRouteRegexInput && re.Match(in.Path) {
				return i
			}
			x &= x - 1
		}
	}
	return -1
}

// andInto sets dst to dst AND src and reports whether any bit is left.
func andInto(dst, src []uint64) bool {
	var left uint64
	for w := range dst {
		dst[w] &= src[w]
		left |= dst[w]
	}
	return left != 0
}

// and narrows cand to the routes whose name condition raw meets (raw as
// received: port, case and trailing dots ignored); tmp is scratch.
func (x *nameIndex) and(cand, tmp []uint64, raw []byte) bool {
	copy(tmp, x.any)
	var buf [maxHostLen + 2]byte
	if h, ok := normalizeHost(buf[:0], raw); ok {
		if s := x.exact[string(h)]; s != nil {
			orInto(tmp, s)
		}
		if len(x.wild) > 0 {
			// Each suffix after a dot that has a label before it and one
			// after: a.b.example.com tries b.example.com, example.com, com.
			for i := 1; i < len(h)-1; i++ {
				if h[i] == '.' {
					if s := x.wild[string(h[i+1:])]; s != nil {
						orInto(tmp, s)
					}
				}
			}
		}
	}
	return andInto(cand, tmp)
}

// normalizeHost appends to dst the host of raw in lower case, without
// port and trailing dots; false when it is empty or longer than any
// route's host can be.
func normalizeHost(dst, raw []byte) ([]byte, bool) {
	h := raw
	if len(h) > 0 && h[0] == '[' {
		if end := bytes.IndexByte(h, ']'); end > 0 {
			h = h[:end+1]
		}
	} else if c := bytes.IndexByte(h, ':'); c >= 0 {
		h = h[:c]
	}
	// Every trailing dot, as the HTTP front end's rule matching does:
	// "api.example.com.." must not dodge a route to api.example.com.
	for len(h) > 0 && h[len(h)-1] == '.' {
		h = h[:len(h)-1]
	}
	if len(h) == 0 || len(h) > cap(dst) {
		return nil, false
	}
	if h[0] == '[' && h[len(h)-1] == ']' {
		// An IPv6 address has several spellings (RFC 4291 §2.2): compare
		// its RFC 5952 form, the form a route keeps. A zone is not part
		// of a route's address (canonicalHost refuses it).
		if a, err := netip.ParseAddr(unsafe.String(unsafe.SliceData(h[1:]), len(h)-2)); err == nil && a.Is6() && a.Zone() == "" {
			dst = append(dst, '[')
			dst = a.AppendTo(dst)
			return append(dst, ']'), true
		}
	}
	for _, c := range h {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst, true
}

// and narrows cand to the routes whose prefix is a prefix of p.
func (x *prefixIndex) and(cand, tmp []uint64, p []byte) bool {
	copy(tmp, x.any)
	n := &x.nodes[0]
	for len(p) > 0 {
		k := bytes.IndexByte(n.keys, p[0])
		if k < 0 {
			break
		}
		n = &x.nodes[n.kids[k]]
		if len(p) < len(n.label) || string(p[:len(n.label)]) != n.label {
			break
		}
		p = p[len(n.label):]
		if n.set != nil {
			orInto(tmp, n.set)
		}
	}
	return andInto(cand, tmp)
}

// and narrows cand to the routes whose value condition v meets.
func (x *valueIndex) and(cand, tmp []uint64, v []byte) bool {
	copy(tmp, x.any)
	if s := x.sets[string(v)]; s != nil {
		orInto(tmp, s)
	}
	return andInto(cand, tmp)
}
