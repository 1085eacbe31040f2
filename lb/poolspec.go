package lb

import (
	"fmt"
	"slices"
	"strings"
)

// PoolSpec is one pool's settings where they differ from the front end's,
// as an operator writes them (-http-pool, -sip-pool, a config file):
// name=NAME[,policy=P][,hash-key=K][,health=PATH]. An empty field means
// "the front end's setting" (-lb-policy, -http-hash-key, -health-path).
// A pool needs no spec at all: a pool named by a backend or a route and
// without a spec takes every setting from its front end.
type PoolSpec struct {
	// Name is the pool's name (admission.CheckPoolName). Key name,
	// required.
	Name string
	// Policy is an entry of PolicyNames; the aliases NewPolicy accepts
	// are read as the name they stand for. Key policy.
	Policy string
	// HashKey is the consistent-hash key, HTTP only: "source",
	// "header:NAME" or "cookie:NAME" (the grammar of -http-hash-key; src
	// and ip read as source). SIP hashes the Call-ID and has no key to
	// choose. Key hash-key. Like -http-hash-key it is accepted whatever
	// the policy and used only when the pool's policy is consistent-hash.
	HashKey string
	// HealthPath is the HTTP health check of the pool's backends: a path
	// starting with / (2xx/3xx up), or "-" for a TCP connect only, as
	// -health-path. A backend's own health= wins. HTTP only. Key health.
	HealthPath string
}

// poolKeys are the keys each protocol accepts in a pool spec, in the
// order error messages list them and String writes them.
var poolKeys = map[string][]string{
	"http": {"name", "policy", "hash-key", "health"},
	"sip":  {"name", "policy"},
}

// ParsePoolSpec parses one pool spec of protocol proto ("http" or "sip").
// Keys are case-insensitive and may come in any order, each at most once.
// Errors quote the spec and name the key, its value and what is wanted.
func ParsePoolSpec(proto, s string) (PoolSpec, error) {
	keys, ok := poolKeys[proto]
	if !ok {
		return PoolSpec{}, fmt.Errorf("pool %q: unknown protocol %q", s, proto)
	}
	bad := func(format string, a ...any) (PoolSpec, error) {
		return PoolSpec{}, fmt.Errorf("pool %q: %s", s, fmt.Sprintf(format, a...))
	}
	if strings.TrimSpace(s) == "" {
		return bad("empty: want name=NAME[,policy=P]...")
	}
	items, err := splitSpec(s)
	if err != nil {
		return bad("%v", err)
	}
	var p PoolSpec
	seen := map[string]bool{}
	for _, it := range items {
		if !slices.Contains(keys, it.key) {
			switch {
			case proto == "sip" && it.key == "hash-key":
				return bad("key hash-key is for HTTP pools only: a SIP pool hashes the Call-ID")
			case proto == "sip" && it.key == "health":
				return bad("key health is for HTTP pools only")
			}
			return bad("unknown key %q for a %s pool (want %s)", it.key, proto, strings.Join(keys, ", "))
		}
		if seen[it.key] {
			return bad("key %q given twice", it.key)
		}
		seen[it.key] = true
		v := it.value
		switch it.key {
		case "name":
			if err := poolNameError(v); err != nil {
				return bad("name: %v", err)
			}
			p.Name = v
		case "policy":
			canon, err := PolicyName(v)
			if err != nil || v == "" {
				return bad("policy %q: want one of %s", v, strings.Join(PolicyNames, ", "))
			}
			p.Policy = canon
		case "hash-key":
			k, err := canonicalHashKey(v)
			if err != nil {
				return bad("hash-key %q: %v", v, err)
			}
			p.HashKey = k
		case "health":
			if v != "-" && (!strings.HasPrefix(v, "/") || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r == '#' || r == 0x7f })) {
				return bad("health %q: want an absolute path such as /healthz, or - for a TCP connect only", v)
			}
			p.HealthPath = v
		}
	}
	if p.Name == "" {
		return bad("key name is required (name=NAME)")
	}
	return p, nil
}

// String is the canonical spec of p: keys in a fixed order, those left
// to the front end left out. It parses back to p.
func (p PoolSpec) String() string {
	var b strings.Builder
	b.WriteString("name=" + p.Name)
	if p.Policy != "" {
		b.WriteString(",policy=" + p.Policy)
	}
	if p.HashKey != "" {
		b.WriteString(",hash-key=" + p.HashKey)
	}
	if p.HealthPath != "" {
		b.WriteString(",health=" + p.HealthPath)
	}
	return b.String()
}

// canonicalHashKey checks an HTTP consistent-hash key in the grammar of
// -http-hash-key and writes it one way: "source" (also src, ip),
// "header:NAME" or "cookie:NAME" with NAME a token (RFC 9110 / 6265);
// the kind in lower case, NAME as given (header names match in any case).
func canonicalHashKey(s string) (string, error) {
	kind, name, _ := strings.Cut(s, ":")
	switch strings.ToLower(kind) {
	case "source", "src", "ip":
		if name == "" {
			return "source", nil
		}
	case "header", "cookie":
		if isToken(name) {
			return strings.ToLower(kind) + ":" + name, nil
		}
	}
	return "", fmt.Errorf("want source, header:NAME or cookie:NAME (NAME a token)")
}

// isToken reports whether s is a non-empty RFC 9110 token: the characters
// of a header name, a method and (RFC 6265) a cookie name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return true
}

func isTchar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// specItem is one key=value of a pool or route spec.
type specItem struct{ key, value string }

// splitSpec cuts a pool or route spec into its key=value items. A comma
// ends a value only where a key follows it (optional spaces, a name of
// letters, digits, _ and -, then =): values may hold commas otherwise, so
// a regular expression such as user=~\+44[0-9]{6,10} or a header value
// such as "a, b" is written as it is. Keys are lower-cased; keys and
// values are trimmed of white space.
func splitSpec(s string) ([]specItem, error) {
	var items []specItem
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && (s[i] != ',' || !keyFollows(s[i+1:])) {
			continue
		}
		part := s[start:i]
		start = i + 1
		k, v, ok := strings.Cut(part, "=")
		k = strings.TrimSpace(k)
		if !ok || !isKeyName(k) {
			return nil, fmt.Errorf("%q is not key=value", strings.TrimSpace(part))
		}
		items = append(items, specItem{key: strings.ToLower(k), value: strings.TrimSpace(v)})
	}
	return items, nil
}

// keyFollows reports whether s starts with optional spaces, a key name and
// "=". It reads no further than the key, so splitting a spec is linear in
// its length.
func keyFollows(s string) bool {
	i := 0
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	j := i
	for j < len(s) && isKeyChar(s[j]) {
		j++
	}
	if j == i {
		return false
	}
	for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
		j++
	}
	return j < len(s) && s[j] == '='
}

func isKeyName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if !isKeyChar(k[i]) {
			return false
		}
	}
	return true
}

func isKeyChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}
