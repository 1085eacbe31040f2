package lb

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/sluicelb/sluice/admission"
)

// MaxIDLen is the longest backend id, in bytes. Ids travel in sticky
// cookies, SIP Record-Route tokens, logs and metric labels.
const MaxIDLen = 64

// poolNameError checks a pool name with admission.CheckPoolName, the one
// grammar of pool names (backend specs, pool specs, routes, ARM rules):
// 1 to admission.MaxPoolName bytes of a-z, 0-9, _ and -. Upper case is
// refused rather than folded, and said so: a name is a metric label and
// an affinity token field, and "API" and "api" must not be two spellings
// of one pool in one place and two pools in another. The error quotes
// the name; the caller names the key or flag.
func poolNameError(name string) error {
	err := admission.CheckPoolName(name)
	switch {
	case err == nil:
		return nil
	case strings.ContainsFunc(name, unicode.IsUpper):
		return fmt.Errorf("pool name %q has upper case: %w", name, err)
	}
	return fmt.Errorf("pool name %q: %w", name, err)
}

// BackendSpec is one backend as an operator writes it, on the command line
// (-http-backend, -sip-backend), in a backends file or in a config file:
// ADDR[,key=value...]. Both protocols share the grammar, the parser and
// the limits; a key that belongs to one protocol is refused for the other.
type BackendSpec struct {
	// Addr is host:port with a port in 1..65535.
	Addr string
	// ID names the backend in affinity tokens, logs and metrics: 1 to
	// MaxIDLen bytes without white space or control characters. Key id,
	// default Addr.
	ID string
	// Weight is the relative share of new work, 1..MaxWeight. Key weight,
	// default 1.
	Weight int
	// MetricsURL is the backend's memory probe for MOP, an http(s) URL;
	// "" leaves MOP off for it. Key metrics.
	MetricsURL string
	// HealthPath is the path of the active HTTP health check; "" probes
	// by TCP connect. Key health, HTTP only.
	HealthPath string
	// Transport is "udp", "tcp" or "tls". Key transport, SIP only,
	// default "udp".
	Transport string
	// Pools are the pools the backend serves, in the order given, without
	// duplicates. Key pool, repeatable (ADDR,pool=api,pool=web), default
	// []string{DefaultPool}. A backend in two pools is one backend: one
	// MOP, one health state, one set of counters.
	Pools []string
	// TLS speaks TLS to the backend (requests and health checks alike),
	// its certificate verified against the system roots or CAFile, for
	// the name SNI (default the host of Addr). Key tls (on or off), HTTP
	// only; default off.
	TLS bool
	// CAFile is a PEM file of the certificates that verify a TLS backend
	// (instead of the system roots). Key ca: HTTP with tls=on, SIP with
	// transport=tls.
	CAFile string
	// SNI is the server name sent to a TLS backend and verified; default
	// the host of Addr. Key sni: HTTP with tls=on, SIP with transport=tls.
	SNI string
	// Proxy is the PROXY protocol version (1 or 2) sluice writes at the
	// start of every connection to the backend, naming the client whose
	// request opened it; 0 writes none. Key proxy (v1, v2 or off): HTTP,
	// and SIP with transport=tcp.
	Proxy uint8
}

// String is the canonical spec of b, FormatBackendSpec's: it parses back
// to b. The protocol is read off b: a SIP spec always has a Transport
// (ParseBackendSpec sets "udp" by default), an HTTP one never.
func (b BackendSpec) String() string {
	proto := "http"
	if b.Transport != "" {
		proto = "sip"
	}
	return FormatBackendSpec(proto, b)
}

// specKeys are the keys each protocol accepts, in the order error
// messages list them.
var specKeys = map[string][]string{
	"http": {"weight", "metrics", "id", "health", "pool", "tls", "ca", "sni", "proxy"},
	"sip":  {"weight", "metrics", "id", "transport", "ca", "sni", "pool", "proxy"},
}

// ParseBackendSpec parses one backend of protocol proto ("http" or
// "sip"). Errors quote the spec and name the part at fault.
func ParseBackendSpec(proto, s string) (BackendSpec, error) {
	keys, ok := specKeys[proto]
	if !ok {
		return BackendSpec{}, fmt.Errorf("backend %q: unknown protocol %q", s, proto)
	}
	bad := func(format string, a ...any) (BackendSpec, error) {
		return BackendSpec{}, fmt.Errorf("backend %q: %s", s, fmt.Sprintf(format, a...))
	}
	parts := strings.Split(s, ",")
	b := BackendSpec{Addr: strings.TrimSpace(parts[0]), Weight: 1}
	if proto == "sip" {
		b.Transport = "udp"
	}
	host, port, err := net.SplitHostPort(b.Addr)
	if err != nil || host == "" || port == "" {
		return bad("address %q: want host:port", b.Addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return bad("address %q: bad port %q", b.Addr, port)
	}
	seen := make(map[string]bool, len(parts))
	for _, kv := range parts[1:] {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return bad("%q is not key=value", kv)
		}
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		if seen[k] && k != "pool" {
			// One value per key (pool= is the repeatable one): a second
			// weight= or id= silently winning hides a typo.
			return bad("key %q given twice", k)
		}
		seen[k] = true
		known := false
		for _, key := range keys {
			known = known || key == k
		}
		if !known && proto == "sip" && (k == "tls" || k == "ca" || k == "sni") {
			return bad("key %q is for HTTP backends; a SIP backend's transport is its transport key", k)
		}
		if !known {
			return bad("unknown key %q for a %s backend (want %s)", k, proto, strings.Join(keys, ", "))
		}
		switch k {
		case "weight":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxWeight {
				return bad("weight must be a whole number in 1..%d", MaxWeight)
			}
			b.Weight = n
		case "metrics":
			u, err := url.Parse(v)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return bad("metrics must be an http(s) URL")
			}
			b.MetricsURL = v
		case "id":
			if v == "" || len(v) > MaxIDLen || strings.ContainsFunc(v, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
				return bad("id must be 1..%d bytes without spaces or control characters", MaxIDLen)
			}
			b.ID = v
		case "health":
			if !strings.HasPrefix(v, "/") {
				return bad("health must be a path starting with /")
			}
			b.HealthPath = v
		case "transport":
			v = strings.ToLower(v)
			if v != "udp" && v != "tcp" && v != "tls" {
				return bad("transport must be udp, tcp or tls")
			}
			b.Transport = v
		case "pool":
			if err := poolNameError(v); err != nil {
				return bad("pool: %v", err)
			}
			if slices.Contains(b.Pools, v) {
				return bad("pool %q given twice", v)
			}
			b.Pools = append(b.Pools, v)
		case "tls":
			switch strings.ToLower(v) {
			case "on":
				b.TLS = true
			case "off":
				b.TLS = false
			default:
				return bad("tls must be on or off (got %q)", v)
			}
		case "ca":
			if v == "" {
				return bad("ca must name a PEM file of CA certificates")
			}
			b.CAFile = v
		case "sni":
			if !validServerName(v) {
				return bad("sni %q: want a host name (letters, digits, '-' and '.')", v)
			}
			b.SNI = strings.ToLower(v)
		case "proxy":
			switch strings.ToLower(v) {
			case "v1":
				b.Proxy = 1
			case "v2":
				b.Proxy = 2
			case "off":
				b.Proxy = 0
			default:
				return bad("proxy must be v1, v2 or off (got %q)", v)
			}
		}
	}
	if proto == "sip" && b.Proxy != 0 && b.Transport != "tcp" {
		return bad("proxy needs transport=tcp (a SIP backend over %s gets no PROXY header)", b.Transport)
	}
	if proto == "http" && !b.TLS && (b.CAFile != "" || b.SNI != "") {
		return bad("ca and sni need tls=on")
	}
	if proto == "sip" && b.Transport != "tls" && (b.CAFile != "" || b.SNI != "") {
		return bad("ca and sni need transport=tls")
	}
	if b.ID == "" {
		b.ID = b.Addr
	}
	if b.Pools == nil {
		b.Pools = []string{DefaultPool}
	}
	return b, nil
}

// validServerName reports whether s is a DNS host name as a TLS client
// sends it in SNI: 1 to 253 bytes of labels of letters, digits and '-',
// dot-separated, none empty or over 63 bytes.
func validServerName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
