package lb

import (
	"fmt"
	"net"
	"net/netip"
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
	// DNS, when its Kind is set, makes the spec a template: its backends
	// are the addresses DNS gives for the name (Instance builds each),
	// and Addr and ID are the spec's head as written ("dns:app:8080").
	DNS DNSName
	// Priority orders the backends of a pool for new work: every backend
	// of the lowest priority is tried before any of the next (SRV
	// priorities, RFC 3263 §4.3 failover). 0 for backends not from SRV.
	// Set by Instance, not by the grammar.
	Priority int
	// Gone marks a backend whose address left DNS: it drains (affinity
	// and requests in flight finish, no new work) until it is dropped.
	// Set by the node, not by the grammar.
	Gone bool
	// Proxy is the PROXY protocol version (1 or 2) sluice writes at the
	// start of every connection to the backend, naming the client whose
	// request opened it; 0 writes none. Key proxy (v1, v2 or off): HTTP,
	// and SIP with transport=tcp.
	Proxy uint8
}

// DNSName is where a template spec's backends are found.
type DNSName struct {
	// Kind is "dns" (A/AAAA of Name, each with Port), "srv" (the SRV
	// records of Name: for SIP the services of RFC 3263 §4.1, for HTTP
	// _http._tcp or _https._tcp unless Name is a full service name) or
	// "naptr" (SIP: NAPTR → SRV → A/AAAA); "" for a plain backend.
	Kind string
	Name string
	Port int // "dns" only
	// Transport is the one SIP transport wanted of srv: and naptr:
	// (transport= given): only its service is asked. "": every one.
	Transport string
}

// dnsKinds are the heads of template specs.
var dnsKinds = []string{"dns", "srv", "naptr"}

// parseDNSHead parses the head of a template spec, "dns:HOST:PORT",
// "srv:NAME" or "naptr:DOMAIN"; ok false when head is not one (a host
// called dns, srv or naptr with a port, "srv:5060", is a plain address).
func parseDNSHead(proto, head string) (d DNSName, ok bool, err error) {
	kind, rest, found := strings.Cut(head, ":")
	kind = strings.ToLower(kind)
	if !found || !slices.Contains(dnsKinds, kind) {
		return DNSName{}, false, nil
	}
	if _, err := strconv.Atoi(rest); err == nil {
		return DNSName{}, false, nil // host:port of a host called dns, srv or naptr
	}
	d.Kind = kind
	switch kind {
	case "dns":
		host, port, err := net.SplitHostPort(rest)
		if err != nil || host == "" {
			return d, true, fmt.Errorf("address %q: want dns:HOST:PORT", head)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return d, true, fmt.Errorf("address %q: bad port %q", head, port)
		}
		if net.ParseIP(host) != nil {
			return d, true, fmt.Errorf("address %q: %s is an IP address: give it without dns:", head, host)
		}
		d.Name, d.Port = strings.ToLower(host), n
	case "naptr":
		if proto != "sip" {
			return d, true, fmt.Errorf("address %q: naptr: is for SIP backends (use dns: or srv:)", head)
		}
		d.Name = strings.ToLower(rest)
	default:
		d.Name = strings.ToLower(rest)
	}
	if !validDNSName(d.Name) {
		return d, true, fmt.Errorf("address %q: %q is not a DNS name (labels of letters, digits, '-' and '_')", head, d.Name)
	}
	return d, true, nil
}

// validDNSName is validServerName with '_' allowed (service labels)
// and one trailing dot.
func validDNSName(s string) bool {
	return validServerName(strings.ReplaceAll(strings.TrimSuffix(s, "."), "_", "a"))
}

// MetricsHost is what a template's metrics= URL names its backend by:
// each backend's URL has it replaced by the backend's IP address.
const MetricsHost = "{host}"

// Instance returns the spec of one backend of template b: the address
// addr of the name host (the SRV target, or b's name), at the given
// priority and SRV weight, over transport ("udp", "tcp", "tls"; "" keeps
// b's). Its id is its address; a weight from SRV (0 counts as 1, more
// than MaxWeight as MaxWeight) replaces b's for srv: and naptr:; a TLS
// backend verifies, unless b names an sni, host for dns: and the domain
// asked for srv: and naptr: (its service labels "_sips._tcp." removed),
// never the SRV or NAPTR target: a zone without DNSSEC can name any
// target, and a certificate valid for the attacker's own host would pass
// (RFC 5922 §4, RFC 6125 §6.2.1); metrics= gets the address for
// MetricsHost.
func (b BackendSpec) Instance(addr netip.AddrPort, host string, priority, weight int, transport string) BackendSpec {
	out := b
	out.Addr = addr.String()
	out.ID = out.Addr
	out.Priority = priority
	out.Pools = slices.Clone(b.Pools)
	if b.DNS.Kind != "dns" {
		out.Weight = min(max(weight, 1), MaxWeight)
	}
	if transport != "" {
		out.Transport = transport
	}
	if b.MetricsURL != "" {
		ip := addr.Addr().String()
		if addr.Addr().Is6() {
			ip = "[" + ip + "]"
		}
		out.MetricsURL = strings.ReplaceAll(b.MetricsURL, MetricsHost, ip)
	}
	if b.DNS.Kind == "srv" || b.DNS.Kind == "naptr" {
		host = serviceDomain(b.DNS.Name)
	}
	if out.SNI == "" && (out.TLS || out.Transport == "tls") && validServerName(host) {
		out.SNI = strings.ToLower(host)
	}
	out.DNS = DNSName{}
	return out
}

// serviceDomain is the domain of an SRV or NAPTR name: name without its
// leading service and protocol labels ("_sips._tcp.example.com." is
// example.com) and its trailing dot.
func serviceDomain(name string) string {
	name = strings.TrimSuffix(name, ".")
	for strings.HasPrefix(name, "_") {
		_, rest, ok := strings.Cut(name, ".")
		if !ok {
			break
		}
		name = rest
	}
	return name
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
	if d, ok, err := parseDNSHead(proto, b.Addr); err != nil {
		return bad("%v", err)
	} else if ok {
		b.DNS = d
	} else {
		host, port, err := net.SplitHostPort(b.Addr)
		if err != nil || host == "" || port == "" {
			return bad("address %q: want host:port, dns:HOST:PORT, srv:NAME or naptr:DOMAIN (SIP)", b.Addr)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return bad("address %q: bad port %q", b.Addr, port)
		}
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
			if b.DNS.Kind == "srv" || b.DNS.Kind == "naptr" {
				return bad("weight of %s: backends comes from their SRV records", b.DNS.Kind)
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > MaxWeight {
				return bad("weight must be a whole number in 1..%d", MaxWeight)
			}
			b.Weight = n
		case "metrics":
			if b.DNS.Kind != "" && !strings.Contains(v, MetricsHost) {
				return bad("metrics of a DNS name's backends must name each by %s (metrics=http://%s:9100/metrics)", MetricsHost, MetricsHost)
			}
			u, err := url.Parse(strings.ReplaceAll(v, MetricsHost, "192.0.2.1"))
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return bad("metrics must be an http(s) URL")
			}
			b.MetricsURL = v
		case "id":
			if b.DNS.Kind != "" {
				return bad("id names one backend; a DNS name gives several, each named by its address")
			}
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
	if proto == "sip" && (b.DNS.Kind == "srv" || b.DNS.Kind == "naptr") && seen["transport"] {
		b.DNS.Transport = b.Transport
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
