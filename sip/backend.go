package sip

import (
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// backend is an lb.Backend plus what SIP needs to reach it: a resolved
// address and a transport. Read-only after construction, except busyUntil.
type backend struct {
	lb   *lb.Backend
	id   string
	addr netip.AddrPort
	tcp  bool
	cfg  BackendConfig // normalised: id, transport and weight filled in
	// busyUntil is the deadline last given to lb.SetBusy (lb keeps it
	// write-only), so SetBackends can carry a 503's Retry-After over to
	// the backend's next lb.Backend.
	busyUntil atomic.Int64
	// unanswered counts in-dialog requests left unanswered past
	// -sip-in-dialog-timeout since the backend last answered anything.
	unanswered atomic.Int32
}

// transport returns "TCP" or "UDP" for Via.
func (b *backend) transport() string {
	if b.tcp {
		return "TCP"
	}
	return "UDP"
}

// drain keeps new work away from b for d (at most lb.MaxAvoid) after a
// 503 (RFC 3261 §21.5.4); affinity traffic continues. It never shortens
// a back-off under way, and reports whether b was taking new work until
// now.
func (b *backend) drain(now int64, d time.Duration) bool {
	d = min(d, lb.MaxAvoid)
	if d <= 0 {
		return false
	}
	u := now + int64(d)
	for {
		cur := b.busyUntil.Load()
		if cur >= u || b.busyUntil.CompareAndSwap(cur, u) {
			break
		}
	}
	return b.lb.Avoid(now, d)
}

// pool is the lb.Pool of SIP backends with address lookups. A pool is
// immutable once built: SetBackends builds a new one and swaps the
// Server's pointer, and every message works with the pool it loaded.
type pool struct {
	lb     *lb.Pool
	list   []*backend // by lb index
	byID   map[string]*backend
	byAddr map[netip.AddrPort]*backend

	// gone holds the backends SetBackends took out (removed, or whose id
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
	since time.Time // when SetBackends took it out
}

// dialogBackend returns the backend an affinity token names: a current
// one, or one SetBackends removed within the token lifetime (removed is
// then true). nil when the id is unknown.
func (p *pool) dialogBackend(id string) (b *backend, removed bool) {
	if b := p.byID[id]; b != nil {
		return b, false
	}
	if b := p.goneByID[id]; b != nil {
		return b, true
	}
	return nil, false
}

// backendAt returns the backend, current or recently removed, at a.
func (p *pool) backendAt(a netip.AddrPort) *backend {
	if b := p.byAddr[a]; b != nil {
		return b
	}
	return p.goneByAddr[a]
}

// backendSpec is a checked BackendConfig with its resolved address.
type backendSpec struct {
	cfg  BackendConfig
	addr netip.AddrPort
}

// checkBackends fills the defaults of cfgs (id: the address, transport
// udp, weight 1), checks transports, weights and ids, resolves the
// addresses and rejects duplicate ids. It returns the first error,
// naming the backend.
func checkBackends(cfgs []BackendConfig) ([]backendSpec, error) {
	if len(cfgs) == 0 {
		return nil, ErrNoBackends
	}
	if len(cfgs) > lb.MaxBackends {
		return nil, fieldError("Backends", "%d backends, at most %d", len(cfgs), lb.MaxBackends)
	}
	specs := make([]backendSpec, 0, len(cfgs))
	ids := make(map[string]bool, len(cfgs))
	for _, c := range cfgs {
		c.Addr = strings.TrimSpace(c.Addr)
		if c.Addr == "" {
			return nil, fieldError("Backends", "%q: missing address", c.ID)
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
		case c.Transport != "udp" && c.Transport != "tcp":
			return nil, fieldError("Backends", "%s: transport must be udp or tcp", c.ID)
		case c.Weight < 1 || c.Weight > lb.MaxWeight:
			return nil, fieldError("Backends", "%s: weight %d not in 1..%d", c.ID, c.Weight, lb.MaxWeight)
		case strings.ContainsAny(c.ID, " \t\r\n"):
			return nil, fieldError("Backends", "%q: id must not contain spaces", c.ID)
		case ids[c.ID]:
			return nil, fieldError("Backends", "duplicate id %q", c.ID)
		}
		ids[c.ID] = true
		ap, err := resolveAddr(c.Addr)
		if err != nil {
			return nil, fieldError("Backends", "%s: %w", c.Addr, err)
		}
		if !ap.Addr().IsValid() || ap.Port() == 0 {
			return nil, fieldError("Backends", "%s: no usable IP address and port", c.Addr)
		}
		specs = append(specs, backendSpec{cfg: c, addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())})
	}
	return specs, nil
}

// newPool builds the pool of specs with mops[i] (nil: no limiter) as the
// MOP limiter of specs[i]. mops may be nil.
func newPool(specs []backendSpec, policy string, mops []*admission.MOP) (*pool, error) {
	switch policy {
	case "hash":
		policy = "consistent-hash"
	}
	p := &pool{byID: map[string]*backend{}, byAddr: map[netip.AddrPort]*backend{}}
	var lbs []*lb.Backend
	for i, sp := range specs {
		c := sp.cfg
		var mop *admission.MOP
		if mops != nil {
			mop = mops[i]
		}
		lbb, err := lb.NewBackend(lb.BackendConfig{ID: c.ID, Addr: sp.addr.String(), Proto: "sip", Weight: c.Weight, MOP: mop})
		if err != nil {
			return nil, fieldError("Backends", "%s: %w", c.Addr, err)
		}
		b := &backend{lb: lbb, id: c.ID, addr: sp.addr, tcp: c.Transport == "tcp", cfg: c}
		lbs = append(lbs, lbb)
		p.list = append(p.list, b)
		p.byID[b.id] = b
		p.byAddr[b.addr] = b
	}
	lp, err := lb.NewPool(lb.PoolConfig{Policy: policy}, lbs)
	if err != nil {
		return nil, fieldError("Policy", "%w", err)
	}
	p.lb = lp
	return p, nil
}

// sameAs reports whether p is made of exactly specs, in order.
func (p *pool) sameAs(specs []backendSpec) bool {
	if len(p.list) != len(specs) {
		return false
	}
	for i, b := range p.list {
		if b.cfg != specs[i].cfg || b.addr != specs[i].addr {
			return false
		}
	}
	return true
}

// sameServer reports whether spec is old under its id: the same
// configured and resolved address and the same transport. Such a backend
// keeps its health state across SetBackends.
func sameServer(old *backend, sp backendSpec) bool {
	return old.cfg.Addr == sp.cfg.Addr && old.addr == sp.addr && old.cfg.Transport == sp.cfg.Transport
}

// carryFrom gives p's backends the state of the backends with the same
// id and server in old: the health verdict (down) and the no-new-work
// deadline of a 503. The MOP limiter is handed over by the caller.
func (p *pool) carryFrom(old *pool, now int64) {
	for _, b := range p.list {
		ob := old.byID[b.id]
		if ob == nil || !sameServer(ob, backendSpec{cfg: b.cfg, addr: b.addr}) {
			continue
		}
		// The probe verdict, the last real answer (which overrules it)
		// and an ejection for requests left unanswered.
		b.lb.CarryHealth(ob.lb)
		if u := ob.busyUntil.Load(); u != 0 {
			b.busyUntil.Store(u)
			b.lb.SetBusy(u)
		}
	}
}

// retire fills p's gone set from old: old's gone entries younger than ttl,
// plus every backend of old, taken out at now. Entries that p has again
// under the same id and address are dropped. When several entries share
// an id or an address, the most recently removed one is used.
func (p *pool) retire(old *pool, now time.Time, ttl time.Duration) {
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
			delete(p.gone, k) // back in the pool, or never left
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

// remapTried translates a set of tried indices of from into indices of
// to, by backend id, so new work moving between backends across
// SetBackends never goes back to a backend it tried.
func remapTried(from, to *pool, tried lb.Set) lb.Set {
	var out lb.Set
	if from == nil {
		return out
	}
	for i, b := range from.list {
		if !tried.Has(i) {
			continue
		}
		if nb := to.byID[b.id]; nb != nil {
			out.Add(nb.lb.Index())
		}
	}
	return out
}

// pick returns the backend for new work with key at now that is not in
// tried and whose MOP admits the request, adding every candidate it looks
// at to tried (so a failover never comes back to one). It is lb.Pool.Pick
// with a set of backends to skip instead of one. It allocates nothing.
func (p *pool) pick(key uint64, now int64, tried *lb.Set) (*backend, lb.Outcome, time.Duration) {
	out := lb.NoBackend
	var retry time.Duration
	for {
		i := p.lb.Policy().Select(p.lb.Backends(), now, key, *tried)
		if i < 0 {
			return nil, out, retry
		}
		tried.Add(i)
		c := p.lb.Backends()[i]
		if c.MOP().Allow(now) {
			return p.list[i], lb.Picked, 0
		}
		if ra := c.MOP().RetryAfter(now); out != lb.MOPRefused || ra < retry {
			retry = ra
		}
		out = lb.MOPRefused
	}
}

// home returns the backend the policy gives key, ignoring MOP: the
// fallback for in-dialog requests that carry no token. It is never nil. Only the hash
// policy makes this the backend of the dialog's INVITE.
func (p *pool) home(key uint64, now int64) *backend {
	i := p.lb.Policy().Select(p.lb.Backends(), now, key, lb.Set{})
	if i < 0 {
		// Nothing takes new work (all down or draining): in-dialog
		// requests still go somewhere fixed rather than being refused.
		return p.list[key%uint64(len(p.list))]
	}
	return p.list[i]
}
