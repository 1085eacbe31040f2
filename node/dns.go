package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/discovery"
	"github.com/sluicelb/sluice/lb"
)

// Backends from DNS. A backend spec dns:HOST:PORT, srv:NAME or
// naptr:DOMAIN is a template: its backends are the addresses DNS gives,
// each an ordinary backend of the generation (lb.BackendSpec.Instance).
// Lookups run in the background (dnsLoop), each name again at its TTL
// bounded by -dns-min-ttl/-dns-max-ttl; a change builds a new generation
// the way a reload does (backends that stay keep their state; new ones
// are probed before they serve). An address that leaves DNS stays a
// member, draining (lb.BackendSpec.Gone), for -dns-drain, then goes. The
// request path never resolves: it sees a generation like any other.

// EventDNSChanged is the event of a change of a name's addresses: Subject
// "http dns:app:8080", Message the addresses added, removed and the
// count unchanged.
const EventDNSChanged admission.EventKind = "dns.changed"

// EventDNSStale is the event of a name whose lookups fail (or find it
// gone) while its last good answer stays in force; once per streak.
const EventDNSStale admission.EventKind = "dns.stale"

// DNSConfig configures the backends found in DNS.
type DNSConfig struct {
	// Server is the resolver to ask, ADDR[:PORT]; "" reads
	// /etc/resolv.conf. Flag -dns-server.
	Server string
	// MinTTL and MaxTTL bound the time between two lookups of a name
	// (its TTL otherwise); a failed lookup is retried after MinTTL.
	// Flags -dns-min-ttl, -dns-max-ttl.
	MinTTL, MaxTTL time.Duration
	// KeepStale is how long the last good answer of a name stays in
	// force while lookups fail or find it gone (NXDOMAIN). A pool is
	// never emptied: a name that is a pool's only source keeps its last
	// addresses past it. Flag -dns-keep-stale.
	KeepStale time.Duration
	// Drain is how long an address that left DNS stays in its pools,
	// draining (sticky sessions, dialogs and requests in flight go on; no
	// new work), before it is dropped. Flag -dns-drain.
	Drain time.Duration
	// Timeout bounds one query to the resolver. Flag -dns-timeout.
	Timeout time.Duration
	// Family is the address family of backends from DNS: any (A and
	// AAAA, both must be answered), ipv4 (A only) or ipv6 (AAAA only).
	// Flag -dns-family.
	Family string
}

// DefaultDNSConfig returns the defaults the -dns-* flags show.
func DefaultDNSConfig() DNSConfig {
	return DNSConfig{MinTTL: discovery.DefaultMinTTL, MaxTTL: discovery.DefaultMaxTTL, KeepStale: discovery.DefaultKeepStale,
		Drain: time.Minute, Timeout: 2 * time.Second, Family: "any"}
}

// check fills c's defaults and checks it; errors name the flag.
func (c *DNSConfig) check() error {
	d := DefaultDNSConfig()
	if c.Drain == 0 {
		c.Drain = d.Drain
	}
	if c.Timeout == 0 {
		c.Timeout = d.Timeout
	}
	if c.Server != "" {
		if err := discovery.CheckServer(c.Server); err != nil {
			return fmt.Errorf("-dns-server %q: %w", c.Server, err)
		}
	}
	if c.Drain < 0 {
		return fmt.Errorf("-dns-drain %s: must not be negative", c.Drain)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("-dns-timeout %s: must not be negative", c.Timeout)
	}
	if c.Family == "" {
		c.Family = d.Family
	}
	if !slices.Contains(discovery.Families, c.Family) {
		return fmt.Errorf("-dns-family %q: want one of %s", c.Family, strings.Join(discovery.Families, ", "))
	}
	tc := c.track()
	if err := tc.Check(); err != nil {
		return err
	}
	c.MinTTL, c.MaxTTL, c.KeepStale = tc.MinTTL, tc.MaxTTL, tc.KeepStale
	return nil
}

func (c DNSConfig) track() discovery.TrackConfig {
	return discovery.TrackConfig{MinTTL: c.MinTTL, MaxTTL: c.MaxTTL, KeepStale: c.KeepStale}
}

// dnsState is the node's names and what DNS said of them.
type dnsState struct {
	cfg DNSConfig
	res *discovery.Resolver
	now func() time.Time // wall clock (tests inject theirs)

	mu    sync.Mutex
	names map[string]*dnsName // by dnsKey
	// specs are the backend specs in force by protocol, templates and
	// plain ones (soleSource).
	specs map[string][]lb.BackendSpec
	kick  chan struct{} // wakes the loop: a name was added
	// selfWarned are the addresses of the node's own listeners a name
	// gave, warned about once each.
	selfWarned map[netip.AddrPort]bool
	// rounds counts the loop's rounds, each counted once its changes
	// are in force (tests wait on it).
	rounds atomic.Uint64
}

// dnsName is one name followed.
type dnsName struct {
	proto string
	spec  lb.BackendSpec // the first template of the name
	tr    *discovery.Tracker
	next  time.Time
	// gone are addresses that left the answer, draining until their
	// time is up (or they come back).
	gone map[netip.AddrPort]goneTarget
	// stale: the last lookup failed and the last answer is kept (for one
	// event per streak).
	stale bool
	// Lookups by result, for /metrics.
	ok, notFound, failed uint64
}

type goneTarget struct {
	t     discovery.Target
	until time.Time
}

// dnsKey names what is looked up for spec: specs that differ only in
// their pools, weights or checks share one lookup.
func dnsKey(proto string, spec lb.BackendSpec) string {
	return fmt.Sprintf("%s %s:%s:%d:%s:%v", proto, spec.DNS.Kind, spec.DNS.Name, spec.DNS.Port, spec.DNS.Transport, spec.TLS)
}

// dnsSubject is how events name a name: "http dns:app:8080".
func dnsSubject(proto string, spec lb.BackendSpec) string { return proto + " " + spec.Addr }

// dnsResolver returns the node's DNS state, built at the first template
// met.
func (n *Node) dnsResolver() (*dnsState, error) {
	if n.dns != nil {
		return n.dns, nil
	}
	c := n.cfg.DNS
	if err := c.check(); err != nil {
		return nil, err
	}
	res, err := discovery.NewResolver(discovery.Config{Server: c.Server, Timeout: c.Timeout, Family: c.Family})
	if err != nil {
		return nil, err
	}
	n.dns = &dnsState{cfg: c, res: res, now: time.Now, names: map[string]*dnsName{}, specs: map[string][]lb.BackendSpec{}, kick: make(chan struct{}, 1),
		selfWarned: map[netip.AddrPort]bool{}}
	n.dnsMetrics.Store(n.dns)
	if n.ctx != nil {
		n.startDNS(n.ctx)
	}
	return n.dns, nil
}

// lookup asks DNS for spec's name.
func (d *dnsState) lookup(ctx context.Context, proto string, spec lb.BackendSpec) (discovery.Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*d.cfg.Timeout+time.Second)
	defer cancel()
	var transports []string
	if spec.DNS.Transport != "" {
		transports = []string{spec.DNS.Transport}
	}
	switch spec.DNS.Kind {
	case "dns":
		return d.res.LookupHost(ctx, spec.DNS.Name, uint16(spec.DNS.Port))
	case "naptr":
		return d.res.LookupNAPTR(ctx, spec.DNS.Name, transports)
	}
	// srv:
	if proto == "sip" && !strings.HasPrefix(spec.DNS.Name, "_") {
		var ss []discovery.Service
		for _, s := range discovery.SIPServices {
			if transports == nil || slices.Contains(transports, s.Transport) {
				ss = append(ss, s)
			}
		}
		return d.res.LookupSIPSRV(ctx, spec.DNS.Name, ss)
	}
	name := spec.DNS.Name
	if !strings.HasPrefix(name, "_") {
		name = "_http._tcp." + name
		if spec.TLS {
			name = "_https._tcp." + spec.DNS.Name
		}
	}
	tr := ""
	if proto == "sip" {
		tr = sipTransportOf(name)
	}
	return d.res.LookupSRV(ctx, name, tr)
}

// sipTransportOf is the transport of a full SIP service name.
func sipTransportOf(name string) string {
	for _, s := range discovery.SIPServices {
		if strings.HasPrefix(strings.ToLower(name), s.Prefix) {
			return s.Transport
		}
	}
	return ""
}

// expand returns specs with every template replaced by its backends:
// the addresses in force of its name, then those draining. A name met
// for the first time is looked up now (at start, or a reload that adds
// it). An address given twice (by two names, or by a name and a plain
// spec) is one backend: the plain spec's, else the first name's. The
// caller holds op.mu, or the node is not started.
func (n *Node) expand(proto string, specs []lb.BackendSpec) ([]lb.BackendSpec, error) {
	if !slices.ContainsFunc(specs, func(s lb.BackendSpec) bool { return s.DNS.Kind != "" }) {
		return specs, nil
	}
	d, err := n.dnsResolver()
	if err != nil {
		return nil, err
	}
	// First lookups, without the lock: the loop may be running.
	var errs []string
	for _, s := range specs {
		if s.DNS.Kind == "" {
			continue
		}
		key := dnsKey(proto, s)
		d.mu.Lock()
		_, known := d.names[key]
		d.mu.Unlock()
		if known {
			continue
		}
		ctx := n.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		ans, lerr := d.lookup(ctx, proto, s)
		nm := &dnsName{proto: proto, spec: s, tr: discovery.NewTracker(d.cfg.track()), gone: map[netip.AddrPort]goneTarget{}}
		u := nm.tr.Observe(d.now(), ans, lerr)
		nm.count(lerr)
		nm.next = u.Next
		if lerr != nil {
			errs = append(errs, fmt.Sprintf("%s: no address from DNS (%v)", s.Addr, lerr))
			n.events(admission.Event{Time: time.Now(), Kind: EventDNSStale, Subject: dnsSubject(proto, s),
				Message: fmt.Sprintf("no address yet, asked again in %s: %v", d.cfg.MinTTL, lerr)})
			nm.stale = true
		} else {
			n.events(admission.Event{Time: time.Now(), Kind: EventDNSChanged, Subject: dnsSubject(proto, s), Message: changeMessage(u, d.cfg.Drain)})
		}
		d.mu.Lock()
		d.names[key] = nm
		d.mu.Unlock()
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.specs[proto] = specs
	inForce := map[string]bool{}
	for _, s := range specs {
		if s.DNS.Kind != "" {
			inForce[dnsKey(proto, s)] = true
		}
	}
	for key, nm := range d.names {
		if nm.proto == proto && !inForce[key] {
			delete(d.names, key) // no longer configured: no longer asked
		}
	}
	plain := map[string]bool{}
	for _, s := range specs {
		if s.DNS.Kind == "" {
			plain[s.ID] = true
		}
	}
	taken := map[string]bool{}
	out := make([]lb.BackendSpec, 0, len(specs))
	own := n.ownListeners()
	add := func(s lb.BackendSpec) {
		if taken[s.ID] || plain[s.ID] {
			return
		}
		taken[s.ID] = true
		out = append(out, s)
	}
	// selfOnly: names whose every address is one of the node's own
	// listeners, for the error when that leaves a pool without backends.
	var selfOnly []string
	for _, s := range specs {
		if s.DNS.Kind == "" {
			out = append(out, s)
			continue
		}
		nm := d.names[dnsKey(proto, s)]
		self := func(a netip.AddrPort) bool {
			if !own.has(a) {
				return false
			}
			if !d.selfWarned[a] && len(d.selfWarned) < maxSelfWarned {
				d.selfWarned[a] = true
				n.logger.Warn("dns names a listener of this node: not a backend", "proto", proto, "name", s.Addr, "address", a.String())
			}
			return true
		}
		var selves []string
		targets := nm.tr.Targets()
		for _, t := range targets {
			if !self(t.Addr) {
				add(s.Instance(t.Addr, t.Host, t.Priority, t.Weight, t.Transport))
			} else {
				selves = append(selves, t.Addr.String())
			}
		}
		if len(targets) > 0 && len(selves) == len(targets) {
			selfOnly = append(selfOnly, fmt.Sprintf("%s: every address DNS gives (%s) is a listener of this node, no backend", s.Addr, strings.Join(selves, ", ")))
		}
		for _, g := range nm.goneSorted() {
			if self(g.t.Addr) {
				continue
			}
			in := s.Instance(g.t.Addr, g.t.Host, g.t.Priority, g.t.Weight, g.t.Transport)
			in.Gone = true
			add(in)
		}
	}
	if len(out) > lb.MaxBackends {
		return nil, fmt.Errorf("%s backends: %d with the addresses DNS gives, at most %d", proto, len(out), lb.MaxBackends)
	}
	if empty := emptyPools(out, specs); len(errs) > 0 && len(empty) > 0 {
		resolver := "-dns-server " + d.cfg.Server
		if d.cfg.Server == "" {
			resolver = "/etc/resolv.conf's nameservers, or -dns-server"
		}
		return nil, fmt.Errorf("%s backend %s, and no other backend in pool %s: check the name and the resolver (%s), or give the pool another backend",
			proto, strings.Join(errs, "; "), strings.Join(empty, ", "), resolver)
	}
	if empty := emptyPools(out, specs); len(selfOnly) > 0 && len(empty) > 0 {
		return nil, fmt.Errorf("%s backend %s, and no other backend in pool %s: the name leads back to sluice (a backend that is this node would loop); check the name and the port, or give the pool another backend",
			proto, strings.Join(selfOnly, "; "), strings.Join(empty, ", "))
	}
	return out, nil
}

// maxSelfWarned bounds the addresses of the node's own listeners warned
// about once each.
const maxSelfWarned = 64

// listeners are the addresses a node listens on.
type listeners struct {
	addrs []netip.AddrPort // an unspecified address: every local one
	local map[netip.Addr]bool
}

// ownListeners returns the node's listeners: as configured, and as bound
// once Start has bound them (a configured port 0). A DNS answer naming
// one of them is no backend: the admin listener would take clients'
// requests from loopback (where the control API takes no token), a
// front end's own address would send requests round through the node.
func (n *Node) ownListeners() listeners {
	var l listeners
	for _, s := range []string{n.cfg.AdminListen, n.cfg.HTTP.Listen, n.cfg.HTTP.TLSListen, n.cfg.HTTP.H2CListen,
		n.cfg.SIP.Listen, n.cfg.SIP.TLSListen, n.cfg.SIP.WSListen, n.cfg.SIP.WSSListen} {
		host, port, err := net.SplitHostPort(s)
		if err != nil {
			continue
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 {
			continue
		}
		var addrs []netip.Addr
		switch a, err := netip.ParseAddr(strings.Trim(host, "[]")); {
		case host == "":
			addrs = []netip.Addr{netip.IPv4Unspecified()}
		case err == nil:
			addrs = []netip.Addr{a.Unmap()}
		case strings.EqualFold(host, "localhost"):
			addrs = []netip.Addr{netip.AddrFrom4([4]byte{127, 0, 0, 1}), netip.IPv6Loopback()}
		}
		for _, a := range addrs {
			l.addrs = append(l.addrs, netip.AddrPortFrom(a, uint16(p)))
		}
	}
	if b := n.boundAddrs.Load(); b != nil {
		l.addrs = append(l.addrs, *b...)
	}
	return l
}

// has reports whether a is one of the listeners.
func (l *listeners) has(a netip.AddrPort) bool {
	a = netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
	for _, o := range l.addrs {
		if o.Port() != a.Port() {
			continue
		}
		if o.Addr() == a.Addr() {
			return true
		}
		if o.Addr().IsUnspecified() && l.isLocal(a.Addr()) {
			return true
		}
	}
	return false
}

// isLocal reports whether a is an address of this host.
func (l *listeners) isLocal(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	if l.local == nil {
		l.local = map[netip.Addr]bool{}
		if ias, err := net.InterfaceAddrs(); err == nil {
			for _, ia := range ias {
				if p, err := netip.ParsePrefix(ia.String()); err == nil {
					l.local[p.Addr().Unmap()] = true
				}
			}
		}
	}
	return l.local[a]
}

// emptyPools returns, sorted, the pools the specs name that have no
// backend in out.
func emptyPools(out, specs []lb.BackendSpec) []string {
	have := map[string]bool{}
	for _, s := range out {
		for _, p := range s.Pools {
			have[p] = true
		}
	}
	var empty []string
	for _, s := range specs {
		for _, p := range s.Pools {
			if !have[p] && !slices.Contains(empty, p) {
				empty = append(empty, p)
			}
		}
	}
	slices.Sort(empty)
	return empty
}

// count counts a lookup's result. d.mu is held (or nm is not shared yet).
func (nm *dnsName) count(err error) {
	switch {
	case err == nil:
		nm.ok++
	case errors.Is(err, discovery.ErrNotFound):
		nm.notFound++
	default:
		nm.failed++
	}
}

// maxDNSGone bounds the addresses of one name that drain: a zone whose
// every answer is new addresses (hostile, or broken, with a short TTL)
// would otherwise add a whole answer per lookup for -dns-drain, growing
// without bound and soon past lb.MaxBackends, when no generation can be
// built and no later answer is put in force.
const maxDNSGone = discovery.MaxTargets

// capGone drops the draining addresses due first until at most max are
// left. d.mu is held.
func (nm *dnsName) capGone(max int) {
	if len(nm.gone) <= max {
		return
	}
	all := nm.goneSorted()
	slices.SortStableFunc(all, func(a, b goneTarget) int { return a.until.Compare(b.until) })
	for _, g := range all[:len(all)-max] {
		delete(nm.gone, g.t.Addr)
	}
}

func (nm *dnsName) goneSorted() []goneTarget {
	out := make([]goneTarget, 0, len(nm.gone))
	for _, g := range nm.gone {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b goneTarget) int { return a.t.Addr.Compare(b.t.Addr) })
	return out
}

// changeMessage says what a lookup changed, for the dns.changed event.
func changeMessage(u discovery.Update, drain time.Duration) string {
	list := func(ts []discovery.Target) string {
		var b []string
		for i, t := range ts {
			if i == 8 {
				b = append(b, fmt.Sprintf("and %d more", len(ts)-8))
				break
			}
			b = append(b, t.Addr.String())
		}
		return strings.Join(b, ", ")
	}
	msg := fmt.Sprintf("added %d, removed %d, unchanged %d", len(u.Added), len(u.Removed), u.Unchanged)
	if len(u.Added) > 0 {
		msg += "; added " + list(u.Added)
	}
	if len(u.Removed) > 0 {
		msg += fmt.Sprintf("; removed %s (draining for %s)", list(u.Removed), drain)
	}
	if u.Expired {
		msg += fmt.Sprintf("; no good answer for -dns-keep-stale: %v", u.Err)
	}
	return msg
}

// startDNS runs the lookups in the background until ctx ends.
func (n *Node) startDNS(ctx context.Context) {
	if n.dns == nil || n.dnsRunning {
		return
	}
	n.dnsRunning = true
	n.goBackground(func() { n.dnsLoop(ctx) })
}

// dnsLoop looks names up again when due and puts each change in force.
// A lookup never holds a lock the request path or the operator waits on.
func (n *Node) dnsLoop(ctx context.Context) {
	d := n.dns
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-d.kick:
		}
		changed := n.dnsRound(ctx)
		for _, proto := range []string{"http", "sip"} {
			if changed[proto] {
				n.dnsApply(proto)
			}
		}
		d.rounds.Add(1)
		// Sleep until the next name or drain is due (at most a second,
		// so that a name added by a reload is not waited for long).
		wait := time.Second
		now := d.now()
		d.mu.Lock()
		for _, nm := range d.names {
			wait = min(wait, nm.next.Sub(now))
			for _, g := range nm.gone {
				wait = min(wait, g.until.Sub(now))
			}
		}
		d.mu.Unlock()
		timer.Reset(max(wait, 10*time.Millisecond))
	}
}

// dnsRound looks up every name that is due and records the answers;
// it returns the protocols whose backends changed.
func (n *Node) dnsRound(ctx context.Context) map[string]bool {
	d := n.dns
	changed := map[string]bool{}
	d.mu.Lock()
	var due []string
	now := d.now()
	for key, nm := range d.names {
		if !now.Before(nm.next) {
			due = append(due, key)
		}
		for addr, g := range nm.gone {
			if !now.Before(g.until) {
				delete(nm.gone, addr)
				changed[nm.proto] = true
			}
		}
	}
	d.mu.Unlock()
	slices.Sort(due)
	for _, key := range due {
		d.mu.Lock()
		nm := d.names[key]
		d.mu.Unlock()
		ans, err := d.lookup(ctx, nm.proto, nm.spec)
		if ctx.Err() != nil {
			return changed
		}
		d.mu.Lock()
		now := d.now()
		prev := nm.tr.Targets()
		u := nm.tr.Observe(now, ans, err)
		nm.count(err)
		nm.next = u.Next
		if len(u.Targets) == 0 && len(prev) > 0 && n.soleSource(nm) {
			// The name is the only source of one of its pools: never
			// empty it.
			nm.tr.Restore(prev)
			u = discovery.Update{Targets: prev, Unchanged: len(prev), Next: u.Next, Stale: true, Err: err}
		}
		for _, t := range u.Removed {
			nm.gone[t.Addr] = goneTarget{t: t, until: now.Add(d.cfg.Drain)}
		}
		nm.capGone(maxDNSGone)
		for _, t := range u.Targets {
			if _, ok := nm.gone[t.Addr]; ok {
				delete(nm.gone, t.Addr) // back before it was dropped
			}
		}
		wasStale := nm.stale
		nm.stale = u.Stale || (err != nil && len(u.Targets) == 0)
		sole := nm.stale && !wasStale && len(u.Targets) > 0 && n.soleSource(nm)
		d.mu.Unlock()
		if u.Changed {
			changed[nm.proto] = true
			n.events(admission.Event{Time: time.Now(), Kind: EventDNSChanged, Subject: dnsSubject(nm.proto, nm.spec), Message: changeMessage(u, d.cfg.Drain)})
		}
		if nm.stale && !wasStale {
			msg := fmt.Sprintf("lookup failed, the last answer (%d addresses) stays in force for -dns-keep-stale %s: %v", len(u.Targets), d.cfg.KeepStale, err)
			if sole {
				msg = fmt.Sprintf("lookup failed, the last answer (%d addresses) stays in force for -dns-keep-stale %s, and past it while the name is the only source of one of its pools: %v", len(u.Targets), d.cfg.KeepStale, err)
			}
			if len(u.Targets) == 0 {
				msg = fmt.Sprintf("lookup failed, no address: %v", err)
			}
			n.events(admission.Event{Time: time.Now(), Kind: EventDNSStale, Subject: dnsSubject(nm.proto, nm.spec), Message: msg})
			n.logger.Warn("dns lookup failed", "name", nm.spec.Addr, "proto", nm.proto, "addresses_kept", len(u.Targets), "err", err)
		}
	}
	return changed
}

// soleSource reports whether nm is the only source of backends of one of
// its pools among the specs in force (plain specs, other names with
// addresses). d.mu is held.
func (n *Node) soleSource(nm *dnsName) bool {
	specs := n.dns.specs[nm.proto]
	self := dnsKey(nm.proto, nm.spec)
	for _, pool := range nm.spec.Pools {
		other := false
		for _, s := range specs {
			if !slices.Contains(s.Pools, pool) {
				continue
			}
			if s.DNS.Kind == "" {
				other = true
				break
			}
			if k := dnsKey(nm.proto, s); k != self {
				if o := n.dns.names[k]; o != nil && len(o.tr.Targets()) > 0 {
					other = true
					break
				}
			}
		}
		if !other {
			return true
		}
	}
	return false
}

// dnsApply builds proto's generation again with the addresses in force
// and puts it in force, as a reload does.
func (n *Node) dnsApply(proto string) {
	n.op.mu.Lock()
	defer n.op.mu.Unlock()
	var err error
	switch {
	case proto == "http" && n.httpSrv != nil:
		var gen *lb.Generation
		if gen, err = n.buildGen("http", n.specs("http"), n.httpGen); err == nil {
			err = n.installHTTP(gen)
		}
	case proto == "sip" && n.sipSrv != nil:
		err = n.reloadSIP(n.specs("sip"))
	default:
		return
	}
	if err != nil {
		n.events(admission.Event{Time: time.Now(), Kind: EventDNSChanged, Subject: proto + " backends",
			Message: "the addresses DNS gave were not put in force, the backends in force are unchanged: " + err.Error()})
		n.logger.Error("dns change not applied", "proto", proto, "err", err)
		return
	}
	n.applyOverrides("backend/", "mop/")
}

var (
	descDNSAddrs    = prometheus.NewDesc("sluice_dns_addresses", "Addresses a backend name gives now (in force, draining ones aside).", []string{"protocol", "name"}, nil)
	descDNSDraining = prometheus.NewDesc("sluice_dns_draining", "Addresses that left a backend name's answer and drain until -dns-drain is over.", []string{"protocol", "name"}, nil)
	descDNSStale    = prometheus.NewDesc("sluice_dns_stale", "1 while a backend name's lookups fail and its last good answer is kept.", []string{"protocol", "name"}, nil)
	descDNSLookups  = prometheus.NewDesc("sluice_dns_lookups_total", "Lookups of a backend name by result: ok, not_found (NXDOMAIN, no records), failed (timeout, SERVFAIL, REFUSED).", []string{"protocol", "name", "result"}, nil)
)

// dnsCollector is /metrics of the backend names.
type dnsCollector struct{ n *Node }

func (c dnsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDNSAddrs, descDNSDraining, descDNSStale, descDNSLookups} {
		ch <- d
	}
}

func (c dnsCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.n.dnsMetrics.Load()
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, nm := range d.names {
		name := nm.spec.Addr
		stale := 0.0
		if nm.stale {
			stale = 1
		}
		ch <- prometheus.MustNewConstMetric(descDNSAddrs, prometheus.GaugeValue, float64(len(nm.tr.Targets())), nm.proto, name)
		ch <- prometheus.MustNewConstMetric(descDNSDraining, prometheus.GaugeValue, float64(len(nm.gone)), nm.proto, name)
		ch <- prometheus.MustNewConstMetric(descDNSStale, prometheus.GaugeValue, stale, nm.proto, name)
		for _, r := range []struct {
			v    uint64
			name string
		}{{nm.ok, "ok"}, {nm.notFound, "not_found"}, {nm.failed, "failed"}} {
			ch <- prometheus.MustNewConstMetric(descDNSLookups, prometheus.CounterValue, float64(r.v), nm.proto, name, r.name)
		}
	}
}
