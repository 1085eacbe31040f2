// Package discovery finds backends in DNS: the A/AAAA addresses of a
// name, the SRV records of a service and SIP's NAPTR → SRV → A/AAAA
// chain (RFC 3263). It asks a recursive resolver (/etc/resolv.conf's, or
// one given) over UDP, again over TCP when the answer was truncated, and
// bounds the TTLs it reports. It knows nothing of pools: the node turns
// its answers into backends (Tracker keeps the last good answer through
// resolver failures).
package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Limits on what one answer may give: DNS answers come from the network,
// and a name that suddenly lists thousands of addresses must not grow a
// pool without bound nor make the resolver chase thousands of names.
const (
	// MaxTargets is the most addresses one name gives; the rest are
	// dropped (the first ones by priority and address are kept).
	MaxTargets = 256
	// MaxSRV is the most SRV records of one service followed.
	MaxSRV = 64
	// MaxNAPTR is the most NAPTR records of one domain followed.
	MaxNAPTR = 16
	// MaxQueries is the most queries one lookup sends (a NAPTR record
	// leads to SRV records, each to a host's A and AAAA): past it the
	// lookup fails rather than fan out on a hostile or broken zone.
	MaxQueries = 128
)

// budget counts the queries of one lookup.
type budget struct{ left int }

func newBudget() *budget { return &budget{left: MaxQueries} }

// ErrNotFound is wrapped when the resolver answered that the name has no
// such record: NXDOMAIN, or no data of the type asked for. It is an
// answer, not a failure of the resolver.
var ErrNotFound = errors.New("no such record")

// Config configures a Resolver.
type Config struct {
	// Server is the resolver to ask, host or host:port (port 53 by
	// default). "" reads ResolvConf. Flag -dns-server.
	Server string
	// ResolvConf is the resolv.conf(5) file read when Server is "":
	// its nameservers, search list and ndots. Default /etc/resolv.conf.
	ResolvConf string
	// Timeout bounds one query to one server; default 2s.
	Timeout time.Duration
	// Family is the address family a name's addresses are taken in:
	// "" or "any" asks A and AAAA and needs both answered (records or
	// "no records"), "ipv4" asks A only, "ipv6" AAAA only (for a resolver
	// that refuses one of them, or backends reached over one family only,
	// as HAProxy's resolve-prefer and nginx's ipv6=off). Flag -dns-family.
	Family string
}

// Families are the values Config.Family takes.
var Families = []string{"any", "ipv4", "ipv6"}

// Resolver asks DNS for backends. It is safe for concurrent use; every
// lookup is bounded by its context and Config.Timeout per query.
type Resolver struct {
	servers []string // host:port
	search  *dns.ClientConfig
	udp     *dns.Client
	tcp     *dns.Client
	timeout time.Duration
	qtypes  []uint16 // the address queries of a name, in order (Family)
	v4, v6  bool     // the families whose records are taken
}

// NewResolver checks cfg and returns a Resolver. Errors name the flag.
func NewResolver(cfg Config) (*Resolver, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	r := &Resolver{timeout: cfg.Timeout}
	switch cfg.Family {
	case "", "any":
		r.qtypes, r.v4, r.v6 = []uint16{dns.TypeA, dns.TypeAAAA}, true, true
	case "ipv4":
		r.qtypes, r.v4 = []uint16{dns.TypeA}, true
	case "ipv6":
		r.qtypes, r.v6 = []uint16{dns.TypeAAAA}, true
	default:
		return nil, fmt.Errorf("-dns-family %q: want one of %s", cfg.Family, strings.Join(Families, ", "))
	}
	if cfg.Server != "" {
		addr, err := serverAddr(cfg.Server)
		if err != nil {
			return nil, fmt.Errorf("-dns-server %q: %w", cfg.Server, err)
		}
		r.servers = []string{addr}
		r.search = &dns.ClientConfig{Ndots: 1}
	} else {
		path := cfg.ResolvConf
		if path == "" {
			path = "/etc/resolv.conf"
		}
		cc, err := dns.ClientConfigFromFile(path)
		if err != nil {
			return nil, fmt.Errorf("read %s (give -dns-server to name a resolver): %w", path, err)
		}
		for _, s := range cc.Servers {
			r.servers = append(r.servers, net.JoinHostPort(s, cc.Port))
		}
		if len(r.servers) == 0 {
			return nil, fmt.Errorf("%s names no nameserver (give -dns-server to name a resolver)", path)
		}
		r.search = cc
	}
	r.udp = &dns.Client{Net: "udp", Timeout: cfg.Timeout, UDPSize: 1232}
	r.tcp = &dns.Client{Net: "tcp", Timeout: cfg.Timeout}
	return r, nil
}

// CheckServer checks a -dns-server value: an IP address or host name
// with an optional :port.
func CheckServer(s string) error {
	_, err := serverAddr(s)
	return err
}

// serverAddr is s as host:port, port 53 when s has none.
func serverAddr(s string) (string, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return "", errors.New("bad port \"0\": want 1..65535")
		}
		return ap.String(), nil
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return netip.AddrPortFrom(a, 53).String(), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		host, port = s, "53"
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("bad port %q: want 1..65535", port)
	}
	if host == "" || strings.ContainsAny(host, " /") {
		return "", errors.New("want an IP address or host name, with an optional :port")
	}
	return net.JoinHostPort(host, port), nil
}

// Servers returns the resolvers asked, host:port, in order.
func (r *Resolver) Servers() []string { return slices.Clone(r.servers) }

// Target is one backend address DNS gave.
type Target struct {
	// Addr is the address and port to send to.
	Addr netip.AddrPort
	// Host is the name the address is of (an SRV target, or the name
	// asked for), without the trailing dot: the TLS server name.
	Host string
	// Priority orders the targets: lower first, the next one only when
	// every target of the lower ones failed (SRV priority, NAPTR order
	// and preference before it). 0 for plain A/AAAA names.
	Priority int
	// Weight is the SRV weight (0..65535); 0 for A/AAAA names.
	Weight int
	// Transport is "udp", "tcp" or "tls" as the SIP service says
	// (_sip._udp, _sip._tcp, _sips._tcp); "" for other names.
	Transport string
}

// Answer is what a lookup found: its targets in order (priority, then
// address), at most MaxTargets and each address once, and the smallest
// TTL of the records that gave them.
type Answer struct {
	Targets []Target
	TTL     time.Duration
	// ttlSet: TTL holds a record's TTL (0 is a TTL, not none).
	ttlSet bool
}

// query asks the servers in turn for name's records of type qtype:
// over UDP, over TCP when the answer is truncated. An NXDOMAIN or an
// answer without records of that type is ErrNotFound (the answer
// returned); a server that fails or answers SERVFAIL/REFUSED passes to
// the next, and the last one's error is returned.
func (r *Resolver) query(ctx context.Context, b *budget, name string, qtype uint16) (*dns.Msg, error) {
	if b.left <= 0 {
		return nil, fmt.Errorf("%s %s: more than %d queries for one lookup", dns.TypeToString[qtype], name, MaxQueries)
	}
	b.left--
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.RecursionDesired = true
	m.SetEdns0(1232, false)
	var last error
	for _, srv := range r.servers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		in, _, err := r.udp.ExchangeContext(ctx, m, srv)
		if err == nil && in.Truncated {
			in, _, err = r.tcp.ExchangeContext(ctx, m, srv)
		}
		if err != nil {
			last = fmt.Errorf("%s %s: %w", dns.TypeToString[qtype], name, err)
			continue
		}
		switch in.Rcode {
		case dns.RcodeSuccess:
			for _, rr := range in.Answer {
				if rr.Header().Rrtype == qtype {
					return in, nil
				}
			}
			return in, fmt.Errorf("%s %s: %w (no data)", dns.TypeToString[qtype], name, ErrNotFound)
		case dns.RcodeNameError:
			return in, fmt.Errorf("%s %s: %w (NXDOMAIN)", dns.TypeToString[qtype], name, ErrNotFound)
		default:
			last = fmt.Errorf("%s %s: server %s answered %s", dns.TypeToString[qtype], name, srv, dns.RcodeToString[in.Rcode])
		}
	}
	return nil, last
}

// names is the list of names to try for name: the search list of
// resolv.conf applies to a name with fewer dots than ndots, as the C
// library does (a Kubernetes service's short name).
func (r *Resolver) names(name string) []string {
	if r.search == nil || len(r.search.Search) == 0 {
		return []string{dns.Fqdn(name)}
	}
	return r.search.NameList(name)
}

// LookupHost returns the A and AAAA addresses of name with port. Both
// types are asked; a failure of either fails the lookup (a half answer
// would drop the other family's backends), while a name with addresses
// of one family only is an answer.
func (r *Resolver) LookupHost(ctx context.Context, name string, port uint16) (Answer, error) {
	if err := CheckName(name); err != nil {
		return Answer{}, err
	}
	var last error
	b := newBudget()
	for _, fq := range r.names(name) {
		ans, err := r.lookupHost(ctx, b, fq, port)
		if err == nil || !errors.Is(err, ErrNotFound) {
			return ans, err
		}
		last = err
	}
	return Answer{}, last
}

func (r *Resolver) lookupHost(ctx context.Context, b *budget, fq string, port uint16) (Answer, error) {
	var ans Answer
	found := false
	var notFound error
	for _, qt := range r.qtypes {
		in, err := r.query(ctx, b, fq, qt)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				notFound = err
				continue
			}
			if qt == dns.TypeAAAA && len(ans.Targets) > 0 {
				// Say why addresses the A query gave are not used: an
				// operator who sees the name answer A records otherwise
				// cannot tell what is wrong (a resolver that refuses AAAA).
				return Answer{}, fmt.Errorf("%w (its A query gave %d addresses, not used: A and AAAA must both be answered, \"no records\" included, as a half answer would drop a family's backends; -dns-family ipv4 asks A only)", err, len(ans.Targets))
			}
			return Answer{}, err
		}
		found = true
		r.addAddrs(&ans, in.Answer, port, Target{Host: strings.TrimSuffix(fq, ".")})
	}
	if !found {
		return Answer{}, notFound
	}
	ans.finish()
	return ans, nil
}

// addAddrs adds the A/AAAA records of rrs of r's families to ans as
// targets like t, with port, and takes their TTLs into ans.TTL. It
// returns how many it added.
func (r *Resolver) addAddrs(ans *Answer, rrs []dns.RR, port uint16, t Target) int {
	n := 0
	for _, rr := range rrs {
		var ip net.IP
		switch v := rr.(type) {
		case *dns.A:
			if !r.v4 {
				continue
			}
			ip = v.A
		case *dns.AAAA:
			if !r.v6 {
				continue
			}
			ip = v.AAAA
		default:
			continue
		}
		a, ok := netip.AddrFromSlice(ip)
		a = a.Unmap()
		// Nothing can be sent to port 0, the unspecified address, a
		// multicast group or the limited broadcast address, and
		// 0.0.0.0/8 is "this network" (on Linux, 0.0.0.0 reaches the
		// host itself): such a record is a zone's mistake, skipped.
		if !ok || port == 0 || a.IsUnspecified() || a.IsMulticast() || !routable4(a) {
			continue
		}
		t.Addr = netip.AddrPortFrom(a, port)
		ans.Targets = append(ans.Targets, t)
		ans.ttl(rr.Header().Ttl)
		n++
	}
	return n
}

// routable4 is false for the IPv4 addresses no backend can have: the
// limited broadcast address and 0.0.0.0/8.
func routable4(a netip.Addr) bool {
	if !a.Is4() {
		return true
	}
	b := a.As4()
	return b[0] != 0 && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// ttl takes a record's TTL into a.TTL, the smallest seen: a TTL of 0
// counts (the name is to be asked again as soon as allowed).
func (a *Answer) ttl(sec uint32) {
	d := time.Duration(sec) * time.Second
	if !a.ttlSet || d < a.TTL {
		a.TTL, a.ttlSet = d, true
	}
}

// finish sorts the targets (priority, address), keeps each address once
// (its best priority) and at most MaxTargets.
func (a *Answer) finish() {
	slices.SortStableFunc(a.Targets, func(x, y Target) int {
		if x.Priority != y.Priority {
			return x.Priority - y.Priority
		}
		return x.Addr.Compare(y.Addr)
	})
	seen := make(map[netip.AddrPort]bool, len(a.Targets))
	out := a.Targets[:0]
	for _, t := range a.Targets {
		if seen[t.Addr] {
			continue
		}
		seen[t.Addr] = true
		out = append(out, t)
	}
	if len(out) > MaxTargets {
		out = out[:MaxTargets]
	}
	a.Targets = out
}

// Service is an SRV service name and the SIP transport it stands for.
type Service struct {
	Prefix    string // "_sip._udp."
	Transport string // "udp"
}

// SIPServices are the SIP services of RFC 3263 §4.1 in the order a
// domain without NAPTR records is tried: UDP (sluice's default
// transport), TCP, then TLS.
var SIPServices = []Service{
	{"_sip._udp.", "udp"},
	{"_sip._tcp.", "tcp"},
	{"_sips._tcp.", "tls"},
}

// srvStride keeps the ranks of services (or NAPTR records) apart in
// Target.Priority: an SRV priority is 16 bits.
const srvStride = 1 << 16

// LookupSRV returns the targets of the SRV records of name (a full
// service name, _service._proto.domain), every one with the addresses of
// its target host: from the answer's additional section when the
// resolver put them there, else asked. transport is set on each.
// A target of "." (the service is not offered) gives nothing.
func (r *Resolver) LookupSRV(ctx context.Context, name, transport string) (Answer, error) {
	if err := CheckName(name); err != nil {
		return Answer{}, err
	}
	ans, err := r.lookupSRV(ctx, newBudget(), dns.Fqdn(name), transport, 0)
	if err != nil {
		return Answer{}, err
	}
	ans.finish()
	return ans, nil
}

func (r *Resolver) lookupSRV(ctx context.Context, b *budget, fq, transport string, base int) (Answer, error) {
	in, err := r.query(ctx, b, fq, dns.TypeSRV)
	if err != nil {
		return Answer{}, err
	}
	var ans Answer
	n := 0
	for _, rr := range in.Answer {
		srv, ok := rr.(*dns.SRV)
		if !ok || srv.Target == "." || srv.Port == 0 {
			continue
		}
		if n++; n > MaxSRV {
			break
		}
		ans.ttl(srv.Hdr.Ttl)
		t := Target{Host: strings.TrimSuffix(srv.Target, "."), Priority: base + int(srv.Priority), Weight: int(srv.Weight), Transport: transport}
		var extra []dns.RR
		for _, x := range in.Extra {
			if strings.EqualFold(x.Header().Name, srv.Target) {
				extra = append(extra, x)
			}
		}
		if r.addAddrs(&ans, extra, srv.Port, t) > 0 {
			continue
		}
		host, err := r.lookupHost(ctx, b, dns.Fqdn(srv.Target), srv.Port)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				continue // one target without addresses; the others serve
			}
			return Answer{}, err
		}
		for _, h := range host.Targets {
			h.Host, h.Priority, h.Weight, h.Transport = t.Host, t.Priority, t.Weight, t.Transport
			ans.Targets = append(ans.Targets, h)
		}
		ans.ttl(uint32(host.TTL / time.Second))
	}
	if len(ans.Targets) == 0 {
		return Answer{}, fmt.Errorf("SRV %s: %w (no target with an address)", fq, ErrNotFound)
	}
	return ans, nil
}

// LookupSIPSRV returns the targets of a SIP domain without NAPTR
// records (RFC 3263 §4.1): the SRV records of each service of services
// (SIPServices when nil) in that order, a later service's priorities
// after every one of an earlier service. A service without records is
// skipped; none with any is ErrNotFound.
func (r *Resolver) LookupSIPSRV(ctx context.Context, domain string, services []Service) (Answer, error) {
	if err := CheckName(domain); err != nil {
		return Answer{}, err
	}
	if services == nil {
		services = SIPServices
	}
	return r.lookupSIPSRV(ctx, newBudget(), domain, services)
}

func (r *Resolver) lookupSIPSRV(ctx context.Context, b *budget, domain string, services []Service) (Answer, error) {
	var ans Answer
	for i, s := range services {
		part, err := r.lookupSRV(ctx, b, dns.Fqdn(s.Prefix+domain), s.Transport, i*srvStride)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return Answer{}, err
		}
		ans.Targets = append(ans.Targets, part.Targets...)
		ans.ttl(uint32(part.TTL / time.Second))
	}
	if len(ans.Targets) == 0 {
		return Answer{}, fmt.Errorf("SIP SRV %s: %w (none of %s)", domain, ErrNotFound, serviceList(services))
	}
	ans.finish()
	return ans, nil
}

func serviceList(ss []Service) string {
	var b []string
	for _, s := range ss {
		b = append(b, strings.TrimSuffix(s.Prefix, "."))
	}
	return strings.Join(b, ", ")
}

// naptrServices maps the NAPTR services of RFC 3263 §4.1 to transports.
var naptrServices = map[string]string{"SIP+D2U": "udp", "SIP+D2T": "tcp", "SIPS+D2T": "tls"}

// LookupNAPTR returns the targets of a SIP domain by its NAPTR records
// (RFC 3263 §4.1): the records with flag "S" and a SIP service whose
// transport is in transports (all three when nil), in order and
// preference, each followed to its SRV records; a record's SRV
// priorities come after every one of a record before it. Without a
// usable NAPTR record it is LookupSIPSRV, as the RFC says.
func (r *Resolver) LookupNAPTR(ctx context.Context, domain string, transports []string) (Answer, error) {
	if err := CheckName(domain); err != nil {
		return Answer{}, err
	}
	b := newBudget()
	in, err := r.query(ctx, b, dns.Fqdn(domain), dns.TypeNAPTR)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Answer{}, err
	}
	var recs []*dns.NAPTR
	if err == nil {
		for _, rr := range in.Answer {
			n, ok := rr.(*dns.NAPTR)
			if !ok || !strings.EqualFold(n.Flags, "s") || n.Replacement == "." {
				continue
			}
			tr, ok := naptrServices[strings.ToUpper(n.Service)]
			if !ok || (transports != nil && !slices.Contains(transports, tr)) {
				continue
			}
			recs = append(recs, n)
			if len(recs) == MaxNAPTR {
				break
			}
		}
	}
	if len(recs) == 0 {
		var ss []Service
		for _, s := range SIPServices {
			if transports == nil || slices.Contains(transports, s.Transport) {
				ss = append(ss, s)
			}
		}
		return r.lookupSIPSRV(ctx, b, domain, ss)
	}
	slices.SortStableFunc(recs, func(a, b *dns.NAPTR) int {
		if a.Order != b.Order {
			return int(a.Order) - int(b.Order)
		}
		return int(a.Preference) - int(b.Preference)
	})
	var ans Answer
	for i, n := range recs {
		ans.ttl(n.Hdr.Ttl)
		part, err := r.lookupSRV(ctx, b, n.Replacement, naptrServices[strings.ToUpper(n.Service)], i*srvStride)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return Answer{}, err
		}
		ans.Targets = append(ans.Targets, part.Targets...)
		ans.ttl(uint32(part.TTL / time.Second))
	}
	if len(ans.Targets) == 0 {
		return Answer{}, fmt.Errorf("NAPTR %s: %w (no record leads to an address)", domain, ErrNotFound)
	}
	ans.finish()
	return ans, nil
}

// CheckName checks that name is a DNS name a backend may be found by:
// 1 to 253 bytes of dot-separated labels of letters, digits, '-' and
// '_' (service labels), none empty or over 63 bytes; one trailing dot
// allowed.
func CheckName(name string) error {
	s := strings.TrimSuffix(name, ".")
	if s == "" || len(s) > 253 {
		return fmt.Errorf("DNS name %q: want 1..253 bytes", name)
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("DNS name %q: labels must be 1..63 bytes", name)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("DNS name %q: byte %q is not a letter, digit, '-' or '_'", name, c)
			}
		}
	}
	return nil
}
