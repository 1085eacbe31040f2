package sip

import (
	"crypto/tls"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// backend is what SIP keeps beside an lb.Backend of the generation it
// serves: the resolved address and the transport to reach it, and the
// count of in-dialog requests it left unanswered. Everything else (health,
// back-off, MOP, counters, the operator's switches) is the lb.Backend's.
type backend struct {
	lb   *lb.Backend
	id   string
	addr netip.AddrPort
	tcp  bool
	tls  *tls.Config    // transport=tls: the client side of its connections (tcp is set too)
	spec lb.BackendSpec // as the generation has it (ID and Pools filled in)
	// unanswered counts in-dialog requests left unanswered past
	// -sip-in-dialog-timeout since the backend last answered anything.
	unanswered atomic.Int32
}

// transport returns "TLS", "TCP" or "UDP" for Via.
func (b *backend) transport() string {
	switch {
	case b.tls != nil:
		return "TLS"
	case b.tcp:
		return "TCP"
	}
	return "UDP"
}

// viaTransport is the transport our Via names for a message sent to t:
// TLS to a TLS backend.
func (s *Server) viaTransport(t target) string {
	if !t.tcp {
		return "UDP"
	}
	if b := s.pool.Load().backendAt(t.addr); b != nil && b.tls != nil {
		return "TLS"
	}
	return "TCP"
}

// backendSet is the lb.Generation the server serves and SIP's side table
// of it. It is immutable once built: SetGeneration builds a new one and
// swaps the Server's pointer, and every message works with the set it
// loaded.
type backendSet struct {
	gen *lb.Generation
	// owned: the server built gen itself (New from Config.Backends,
	// SetBackends), so it starts and stops it.
	owned bool
	// cfgs are the backends as SetBackends or Config.Backends gave them
	// (defaults filled in); nil for a generation handed in.
	cfgs   []BackendConfig
	list   []*backend // by lb.Backend.Index()
	byID   map[string]*backend
	byAddr map[netip.AddrPort]*backend
	// homePool is where token-less in-dialog requests go by the Call-ID
	// hash when their dialog's pool is not known (a table entry from
	// before pools whose backend is gone, -sip-unknown-dialog hash):
	// DefaultPool, else the first pool.
	homePool *lb.Pool
	// routes is the generation's route table (nil: none, for the
	// metrics), and routeHeaders the header names its routes test.
	routes       *lb.RouteTable
	routeHeaders []string
	// stats are the per-pool counters, shared with the set before for
	// the pools that stay (their series stay monotonic across reloads);
	// sent counts the new work forwarded per pool and backend.
	stats map[string]*poolStats
	sent  map[poolBackend]*atomic.Uint64

	// gone holds the backends SetGeneration took out (removed, or whose id
	// moved to another address) for one token lifetime, so calls already
	// under way can still end: in-dialog requests whose token names a
	// removed id go to its last address (goneByID), and requests a removed
	// backend sends are still recognised as coming from a backend
	// (goneByAddr). Neither ever gets new work.
	gone       map[goneKey]goneBackend
	goneByID   map[string]*backend         // ids not in byID
	goneByAddr map[netip.AddrPort]*backend // addresses not in byAddr
}

type goneKey struct {
	id   string
	addr netip.AddrPort
}

type goneBackend struct {
	b     *backend
	since time.Time // when SetGeneration took it out
}

// newBackendSet builds SIP's side table of g: each backend's address
// resolved (a host name once, here) and its transport. Errors name the
// backend.
func newBackendSet(g *lb.Generation) (*backendSet, error) {
	if g == nil {
		return nil, fieldError("Backends", "%w", ErrNoBackends)
	}
	if g.Proto() != "sip" {
		return nil, fieldError("Backends", "generation of protocol %q, want sip", g.Proto())
	}
	bs := g.Backends()
	set := &backendSet{gen: g, list: make([]*backend, len(bs)), byID: make(map[string]*backend, len(bs)),
		byAddr: make(map[netip.AddrPort]*backend, len(bs))}
	for i, lbb := range bs {
		spec := g.Spec(lbb)
		if spec.Proxy != 0 && spec.Transport != "tcp" && spec.Transport != "tls" {
			return nil, fieldError("Backends", "backend %s: proxy=v%d needs transport=tcp or tls (a PROXY header starts a connection; UDP has none)", lbb.ID(), spec.Proxy)
		}
		ap, tcp, err := resolveSpec(spec)
		if err != nil {
			return nil, fieldError("Backends", "backend %s: %w", lbb.ID(), err)
		}
		b := &backend{lb: lbb, id: lbb.ID(), addr: ap, tcp: tcp, spec: spec}
		if spec.Transport == "tls" {
			if b.tls, err = clientTLS(spec); err != nil {
				return nil, fieldError("Backends", "backend %s: %w", lbb.ID(), err)
			}
		}
		set.list[i] = b
		set.byID[b.id] = b
		set.byAddr[b.addr] = b
	}
	set.routes = g.Routes()
	if set.routes != nil {
		set.routeHeaders = set.routes.HeaderNames()
	}
	set.stats = make(map[string]*poolStats, len(g.Pools()))
	set.sent = map[poolBackend]*atomic.Uint64{}
	for _, p := range g.Pools() {
		set.stats[p.Name()] = &poolStats{}
		for _, b := range p.Backends() {
			set.sent[poolBackend{p.Name(), b.ID()}] = new(atomic.Uint64)
		}
	}
	set.homePool = g.Pool(lb.DefaultPool)
	if set.homePool == nil && len(g.Pools()) > 0 {
		set.homePool = g.Pools()[0]
	}
	if set.homePool == nil {
		return nil, fieldError("Backends", "%w", ErrNoBackends)
	}
	return set, nil
}

// resolveSpec returns the IP:port and the transport of a SIP backend
// spec (transport udp unless it says tcp).
func resolveSpec(spec lb.BackendSpec) (netip.AddrPort, bool, error) {
	tcp := false
	switch strings.ToLower(spec.Transport) {
	case "", "udp":
	case "tcp", "tls":
		tcp = true
	default:
		return netip.AddrPort{}, false, fmt.Errorf("transport %q: want udp, tcp or tls", spec.Transport)
	}
	ap, err := resolveAddr(strings.TrimSpace(spec.Addr))
	if err != nil {
		return netip.AddrPort{}, false, err
	}
	if !ap.Addr().IsValid() || ap.Port() == 0 {
		return netip.AddrPort{}, false, fmt.Errorf("%s: no usable IP address and port", spec.Addr)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), tcp, nil
}

// dialogBackend returns the backend an affinity token names: a current
// one, or one SetGeneration removed within the token lifetime (removed is
// then true). nil when the id is unknown.
func (p *backendSet) dialogBackend(id string) (b *backend, removed bool) {
	if b := p.byID[id]; b != nil {
		return b, false
	}
	if b := p.goneByID[id]; b != nil {
		return b, true
	}
	return nil, false
}

// backendAt returns the backend, current or recently removed, at a.
func (p *backendSet) backendAt(a netip.AddrPort) *backend {
	if b := p.byAddr[a]; b != nil {
		return b
	}
	return p.goneByAddr[a]
}

// backendFrom returns the backend a message came from, or nil: the
// backend at src's address whose transport src came over. A backend over
// UDP sends datagrams; one over TCP or TLS speaks on a connection (the
// one we dialled, or one it opened from its own address, as a backend
// reusing its listening port does). A connection from a UDP backend's
// address is not that backend (anyone on the backend's host can bind the
// same port for TCP, which the backend does not hold), nor is a datagram
// from a TCP or TLS backend's address (anyone may spoof a UDP source):
// neither may use what only backends may (flows, downstream forwarding).
func (p *backendSet) backendFrom(src source) *backend {
	b := p.backendAt(src.addr)
	if b == nil || b.tcp != (src.conn != nil) {
		return nil
	}
	return b
}

// anyTLS reports whether p has a backend over TLS, which a sips: request
// may be sent to.
func (p *backendSet) anyTLS() bool {
	for _, b := range p.list {
		if b.tls != nil {
			return true
		}
	}
	return false
}

// of returns SIP's entry of lbb, an lb.Backend of p's generation, or nil.
func (p *backendSet) of(lbb *lb.Backend) *backend {
	if lbb == nil {
		return nil
	}
	if i := lbb.Index(); i >= 0 && i < len(p.list) && p.list[i].lb == lbb {
		return p.list[i]
	}
	return nil
}

// sameServer reports whether nb is ob under its id: the same configured
// and resolved address and the same transport.
func sameServer(ob, nb *backend) bool {
	return ob.spec.Addr == nb.spec.Addr && ob.addr == nb.addr && ob.tcp == nb.tcp &&
		ob.spec.Transport == nb.spec.Transport && ob.spec.CAFile == nb.spec.CAFile && ob.spec.SNI == nb.spec.SNI
}

// carryFrom gives p's backends what SIP alone knew of the backends with
// the same id and server in old: the run of in-dialog requests left
// unanswered; and p's pools the counters of old's pools of the same name.
// Everything else is carried by the generation (lb.GenConfig.Prev).
func (p *backendSet) carryFrom(old *backendSet) {
	for name := range p.stats {
		if st := old.stats[name]; st != nil {
			p.stats[name] = st
		}
	}
	for k := range p.sent {
		if c := old.sent[k]; c != nil {
			p.sent[k] = c
		}
	}
	for _, b := range p.list {
		if ob := old.byID[b.id]; ob != nil && sameServer(ob, b) {
			b.unanswered.Store(ob.unanswered.Load())
		}
	}
}

// retire fills p's gone set from old: old's gone entries younger than ttl,
// plus every backend of old, taken out at now. Entries that p has again
// under the same id and address are dropped. When several entries share
// an id or an address, the most recently removed one is used.
func (p *backendSet) retire(old *backendSet, now time.Time, ttl time.Duration) {
	p.gone = map[goneKey]goneBackend{}
	for k, g := range old.gone {
		if now.Sub(g.since) < ttl {
			p.gone[k] = g
		}
	}
	for _, ob := range old.list {
		p.gone[goneKey{ob.id, ob.addr}] = goneBackend{b: ob, since: now}
	}
	p.goneByID = map[string]*backend{}
	p.goneByAddr = map[netip.AddrPort]*backend{}
	idSince := map[string]time.Time{}
	addrSince := map[netip.AddrPort]time.Time{}
	for k, g := range p.gone {
		if b := p.byID[k.id]; b != nil && b.addr == k.addr {
			delete(p.gone, k) // back in the set, or never left
			continue
		}
		if t, seen := idSince[k.id]; p.byID[k.id] == nil && (!seen || g.since.After(t)) {
			p.goneByID[k.id], idSince[k.id] = g.b, g.since
		}
		if t, seen := addrSince[k.addr]; p.byAddr[k.addr] == nil && (!seen || g.since.After(t)) {
			p.goneByAddr[k.addr], addrSince[k.addr] = g.b, g.since
		}
	}
}

// remapTried translates a set of tried positions of pool from into
// positions of pool to, by backend id, so new work moving between
// backends across SetGeneration never goes back to a backend it tried.
func remapTried(from, to *lb.Pool, tried lb.Set) lb.Set {
	var out lb.Set
	if from == nil || to == nil {
		return out
	}
	for i, b := range from.Backends() {
		if !tried.Has(i) {
			continue
		}
		if j := to.IndexOf(to.Lookup(b.ID())); j >= 0 {
			out.Add(j)
		}
	}
	return out
}

// metricsURL returns the metrics URL SetBackends or Config.Backends gave
// backend id, "" when none or when p was handed in.
func (p *backendSet) metricsURL(id string) string {
	for _, c := range p.cfgs {
		if c.ID == id {
			return c.MetricsURL
		}
	}
	return ""
}

// sameAs reports whether p was built from exactly cfgs, in order.
func (p *backendSet) sameAs(cfgs []BackendConfig) bool {
	return p.cfgs != nil && slices.EqualFunc(p.cfgs, cfgs, func(a, b BackendConfig) bool {
		return a.ID == b.ID && a.Addr == b.Addr && a.Transport == b.Transport && a.CAFile == b.CAFile && a.SNI == b.SNI && a.Weight == b.Weight &&
			a.MetricsURL == b.MetricsURL && slices.Equal(a.Pools, b.Pools) && a.Proxy == b.Proxy
	})
}

// checkBackends fills the defaults of cfgs (id: the address, transport
// udp, weight 1), checks transports, weights and ids, resolves the
// addresses and rejects duplicate ids. It returns the backends as specs
// (without their metrics URL: memory probes are the caller's) and as
// normalised configs, or the first error, naming the backend. Pools are
// checked by lb.NewGeneration.
func checkBackends(cfgs []BackendConfig) ([]lb.BackendSpec, []BackendConfig, error) {
	if len(cfgs) == 0 {
		return nil, nil, fieldError("Backends", "%w", ErrNoBackends)
	}
	if len(cfgs) > lb.MaxBackends {
		return nil, nil, fieldError("Backends", "%d backends, at most %d", len(cfgs), lb.MaxBackends)
	}
	specs := make([]lb.BackendSpec, 0, len(cfgs))
	out := make([]BackendConfig, 0, len(cfgs))
	ids := make(map[string]bool, len(cfgs))
	for _, c := range cfgs {
		c.Addr = strings.TrimSpace(c.Addr)
		if c.Addr == "" {
			return nil, nil, fieldError("Backends", "%q: missing address", c.ID)
		}
		if c.ID == "" {
			c.ID = c.Addr
		}
		c.Transport = strings.ToLower(c.Transport)
		if c.Transport == "" {
			c.Transport = "udp"
		}
		if c.Weight == 0 {
			c.Weight = 1
		}
		switch {
		case c.Transport != "udp" && c.Transport != "tcp" && c.Transport != "tls":
			return nil, nil, fieldError("Backends", "%s: transport must be udp, tcp or tls", c.ID)
		case (c.CAFile != "" || c.SNI != "") && c.Transport != "tls":
			return nil, nil, fieldError("Backends", "%s: ca and sni need transport tls", c.ID)
		case c.Proxy > 2:
			return nil, nil, fieldError("Backends", "%s: proxy version %d, want 1 or 2 (0: none)", c.ID, c.Proxy)
		case c.Proxy != 0 && c.Transport == "udp":
			return nil, nil, fieldError("Backends", "%s: proxy needs transport tcp or tls", c.ID)
		case c.Weight < 1 || c.Weight > lb.MaxWeight:
			return nil, nil, fieldError("Backends", "%s: weight %d not in 1..%d", c.ID, c.Weight, lb.MaxWeight)
		case strings.ContainsAny(c.ID, " \t\r\n"):
			return nil, nil, fieldError("Backends", "%q: id must not contain spaces", c.ID)
		case ids[c.ID]:
			return nil, nil, fieldError("Backends", "duplicate id %q", c.ID)
		}
		ids[c.ID] = true
		c.Pools = slices.Clone(c.Pools)
		spec := lb.BackendSpec{Addr: c.Addr, ID: c.ID, Weight: c.Weight, Transport: c.Transport, CAFile: c.CAFile, SNI: c.SNI, Pools: c.Pools, Proxy: c.Proxy}
		if _, _, err := resolveSpec(spec); err != nil {
			return nil, nil, fieldError("Backends", "%s: %w", c.Addr, err)
		}
		specs = append(specs, spec)
		out = append(out, c)
	}
	return specs, out, nil
}

// home is homeOf the home pool.
func (p *backendSet) home(key uint64, now int64) *backend { return p.homeOf(nil, key, now) }

// homeOf returns the backend of pool (nil: the home pool) the policy
// gives key, ignoring MOP: the fallback of in-dialog requests that name
// no backend (lb.Pool.Home). It is never nil.
func (p *backendSet) homeOf(pool *lb.Pool, key uint64, now int64) *backend {
	if pool == nil {
		pool = p.homePool
	}
	return p.of(pool.Home(now, key))
}

// poolStats are the counters of one pool (sip/metrics.go).
type poolStats struct {
	refused [admission.NumReasons]atomic.Uint64 // new work refused, by admission.Reason
}

// poolBackend names a backend in a pool.
type poolBackend struct{ pool, id string }

// route returns the pool new work with in goes to and the index of the
// route that chose it: the first route that matches, else the pool
// "default" with -1; nil when no route matches and there is no pool
// "default" (lb.Generation.Route).
func (p *backendSet) route(in *lb.RouteInput) (*lb.Pool, int) { return p.gen.Route(in) }

// countRefused counts a refusal in the pool of d.
func (p *backendSet) countRefused(d admission.Decision) {
	if st := p.stats[d.Pool]; st != nil && int(d.Reason) < len(st.refused) {
		st.refused[d.Reason].Add(1)
	}
}

// countSent counts new work forwarded to backend id in pool.
func (p *backendSet) countSent(pool, id string) {
	if c := p.sent[poolBackend{pool, id}]; c != nil {
		c.Add(1)
	}
}
