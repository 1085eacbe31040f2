package lb

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// GenConfig describes one backend generation of a front end: its backends,
// the pools they are members of, and what checks them. Both front ends
// build theirs the same way, with their protocol's prober.
type GenConfig struct {
	// Proto is "http" or "sip".
	Proto string
	// Backends in the operator's order; each is a member of the pools its
	// Pools names (none: DefaultPool). Ids (default the address) are
	// unique.
	Backends []BackendSpec
	// Pools are the settings of named pools; a pool named only by backends
	// gets the front end's settings (Policy, no health path). Every pool
	// named here must have a backend.
	Pools []PoolSpec
	// Routes choose the pool of new work, first match wins (see
	// RouteTable); each must name a pool of the generation. None: every
	// request goes to DefaultPool.
	Routes []RouteSpec
	// Policy is the front end's selection policy (-lb-policy, SIP's), for
	// pools that set none.
	Policy string
	// Passive is passive ejection, one for the generation: a backend is
	// ejected by its own traffic whatever the pool that sent it.
	Passive PassiveConfig
	// Health configures active checks; Interval 0 turns them off. Its
	// Clock and Events are taken from Clock and Events below when unset.
	Health HealthConfig
	// Prober builds the protocol's active check of b; pool is the first
	// pool of b's spec whose PoolSpec sets a HealthPath, or nil. nil
	// Prober: no active checks.
	Prober func(b *Backend, spec BackendSpec, pool *PoolSpec) Prober
	// MOP returns b's limiter (nil: none). It is called once per backend,
	// in spec order, after the rest of the configuration was checked; the
	// caller keeps learned rates across reloads (by protocol and address).
	// nil: no limiters.
	MOP func(spec BackendSpec) (*admission.MOP, error)
	// Probe is the memory probe configuration; each backend with a
	// MetricsURL and a MOP gets a probe with its URL.
	Probe MemoryProbeConfig
	// Prev is the generation in force, whose operator state carries over
	// to the backends that stay (NewGeneration); nil at start.
	Prev *Generation
	// Clock is the front end's monotonic clock (nil: admission.MonoClock).
	Clock admission.Clock
	// Logger receives the checks' and probes' logs (nil: none).
	Logger *slog.Logger
	// Events receives backend and pool state changes (may be nil).
	Events admission.EventSink
}

// Generation is one set of backends of a front end, the pools they are
// members of, their active health checks and memory probes. A backend in
// several pools is one Backend: one health state, one MOP, one set of
// counters. A reload builds a new Generation (carrying operator state
// over), hands it to the front end, and stops the old one.
//
// Its lists are fixed once built; Lookup and Pool take no lock.
type Generation struct {
	proto    string
	backends []*Backend
	specs    []BackendSpec // by Backend.Index
	poolsOf  [][]string    // by Backend.Index
	byID     map[string]*Backend
	pools    []*Pool
	byName   map[string]*Pool
	poolSpec map[string]PoolSpec
	routes   *RouteTable    // nil: no routes
	routeTo  []*Pool        // the pool of each route, by index
	dflt     *Pool          // DefaultPool, or nil
	health   *HealthChecker // nil: no active checks
	// first are the checks of Start's synchronous round: every backend at
	// start (no Prev), else only those new to the generation (no backend
	// of the same id and address in Prev), whose state is Unknown until
	// a verdict. Backends that stay keep theirs and are probed in the
	// background, so a route change or a reload that adds no backend does
	// not wait for probes.
	first []*healthCheck
	// prevRoutes is Prev's route table, whose hits Start carries over to
	// the routes of the same spec (then nil).
	prevRoutes *RouteTable
	probes     []*MemoryProbe
	clock      admission.Clock

	mu      sync.Mutex
	cancel  context.CancelFunc
	stopped bool
	wg      sync.WaitGroup
}

// ErrBadGeneration is wrapped by every NewGeneration error.
var ErrBadGeneration = errors.New("invalid backend configuration")

// NewGeneration checks cfg, builds its backends and pools, and carries
// over from cfg.Prev, for each backend whose id and address stay, its
// counters (requests, failures: shared with it, so they never go back),
// and what the operator and the traffic decided: drain and disable, a Retry-After
// back-off, a passive ejection and the last real answer; its probe verdict
// (down, busy, Unknown) only when active checks are on in both
// generations, since with checks off nothing would ever clear it. With
// checks on, a backend new to the set (or whose address changed) is
// Unknown until its first probe or answer.
//
// Errors name the backend or the pool at fault and wrap ErrBadGeneration;
// nothing is started. The configuration is checked whole before cfg.MOP
// is called: only an error of cfg.MOP itself comes after some calls.
// Call Start before the front end serves the generation.
func NewGeneration(cfg GenConfig) (*Generation, error) {
	bad := func(format string, a ...any) (*Generation, error) {
		return nil, fmt.Errorf("%s backends: %s: %w", cfg.Proto, fmt.Sprintf(format, a...), ErrBadGeneration)
	}
	if cfg.Proto != "http" && cfg.Proto != "sip" {
		return bad("protocol %q: want http or sip", cfg.Proto)
	}
	if len(cfg.Backends) == 0 {
		return bad("%v", ErrNoBackends)
	}
	if len(cfg.Backends) > MaxBackends {
		return bad("%d backends, at most %d", len(cfg.Backends), MaxBackends)
	}
	if cfg.Health.Interval < 0 {
		return bad("health check interval %s: must not be negative", cfg.Health.Interval)
	}
	if cfg.Clock == nil {
		cfg.Clock = admission.MonoClock{}
	}
	passive, err := cfg.Passive.build()
	if err != nil {
		return bad("%v", err)
	}
	checks := cfg.Health.Interval > 0 && cfg.Prober != nil
	if checks {
		if cfg.Health.Clock == nil {
			cfg.Health.Clock = cfg.Clock
		}
		if cfg.Health.Events == nil {
			cfg.Health.Events = cfg.Events
		}
	}

	// Pool settings, then membership, all checked before anything is
	// built.
	g := &Generation{proto: cfg.Proto, clock: cfg.Clock, byID: map[string]*Backend{}, byName: map[string]*Pool{}, poolSpec: map[string]PoolSpec{}}
	var order []string // pool names in order of first mention
	mention := func(name string) {
		if _, ok := g.poolSpec[name]; !ok {
			g.poolSpec[name] = PoolSpec{Name: name, Policy: cfg.Policy}
			order = append(order, name)
		}
	}
	declared := map[string]bool{}
	for _, ps := range cfg.Pools {
		if err := checkPoolName(ps.Name); err != nil {
			return bad("pool settings: %v", err)
		}
		if declared[ps.Name] {
			return bad("pool %s: settings given twice", ps.Name)
		}
		declared[ps.Name] = true
		if ps.Policy == "" {
			ps.Policy = cfg.Policy
		}
		if _, err := PolicyName(ps.Policy); err != nil {
			return bad("pool %s: policy %q: unknown (want one of %s)", ps.Name, ps.Policy, strings.Join(PolicyNames, ", "))
		}
		g.poolSpec[ps.Name] = ps
		order = append(order, ps.Name)
	}
	if _, err := PolicyName(cfg.Policy); err != nil {
		return bad("policy %q: unknown (want one of %s)", cfg.Policy, strings.Join(PolicyNames, ", "))
	}
	members := map[string][]int{} // pool -> spec indices
	g.specs = make([]BackendSpec, len(cfg.Backends))
	g.poolsOf = make([][]string, len(cfg.Backends))
	ids := make(map[string]int, len(cfg.Backends))
	for i, spec := range cfg.Backends {
		if spec.ID == "" {
			spec.ID = spec.Addr
		}
		if spec.Addr == "" {
			return bad("backend %d (%q): empty address", i+1, spec.ID)
		}
		if spec.DNS.Kind != "" {
			return bad("backend %s: a DNS name, not an address: its backends are its addresses (BackendSpec.Instance)", spec.ID)
		}
		if j, dup := ids[spec.ID]; dup {
			return bad("backend id %q given twice (%s and %s; ids default to the address)", spec.ID, cfg.Backends[j].Addr, spec.Addr)
		}
		ids[spec.ID] = i
		names := spec.Pools
		if len(names) == 0 {
			names = []string{DefaultPool}
		}
		seen := make(map[string]bool, len(names))
		for _, name := range names {
			if err := checkPoolName(name); err != nil {
				return bad("backend %s: %v", spec.ID, err)
			}
			if seen[name] {
				return bad("backend %s: pool %s named twice", spec.ID, name)
			}
			seen[name] = true
			mention(name)
			members[name] = append(members[name], i)
		}
		spec.Pools = append([]string(nil), names...)
		g.specs[i] = spec
		g.poolsOf[i] = spec.Pools
	}
	for _, name := range order {
		if len(members[name]) == 0 {
			return bad("pool %s has no backends (name it in a backend's pool=)", name)
		}
	}
	// "default" first, the others in order of first mention.
	for i, name := range order {
		if name == DefaultPool && i > 0 {
			copy(order[1:i+1], order[:i])
			order[0] = DefaultPool
			break
		}
	}

	// Backends. A dry run of every backend, its memory probe and the
	// health checker first, so that cfg.MOP is called only for a
	// configuration that holds.
	tlsOf := make([]*tls.Config, len(g.specs))
	for i, spec := range g.specs {
		b, err := NewBackend(BackendConfig{ID: spec.ID, Addr: spec.Addr, Proto: cfg.Proto, Weight: spec.Weight})
		if err != nil {
			return bad("backend %s: %v", spec.ID, err)
		}
		if tlsOf[i], err = spec.ClientTLS(); err != nil {
			return bad("%v", err)
		}
		if spec.MetricsURL != "" {
			pc := cfg.Probe
			pc.URL = spec.MetricsURL
			if _, err := NewMemoryProbe(b, pc, cfg.Clock, cfg.Logger); err != nil {
				return bad("backend %s: memory probe: %v", spec.ID, err)
			}
		}
	}
	var h *HealthChecker
	if checks {
		if h, err = NewHealthChecker(cfg.Health, cfg.Logger); err != nil {
			return bad("health checks: %v", err)
		}
	}
	g.backends = make([]*Backend, len(g.specs))
	for i, spec := range g.specs {
		var mop *admission.MOP
		if cfg.MOP != nil {
			if mop, err = cfg.MOP(spec); err != nil {
				return bad("backend %s: memory overload protection: %v", spec.ID, err)
			}
		}
		b, err := NewBackend(BackendConfig{ID: spec.ID, Addr: spec.Addr, Proto: cfg.Proto, Weight: spec.Weight, MOP: mop, TLS: tlsOf[i], Proxy: spec.Proxy})
		if err != nil {
			return bad("backend %s: %v", spec.ID, err) // not reached: the dry run passed
		}
		b.index = i
		b.passive = passive
		b.priority = spec.Priority
		b.gone.Store(spec.Gone)
		g.backends[i] = b
		g.byID[spec.ID] = b
	}
	if passive != nil {
		passive.peers = g.backends
	}

	// Pools.
	for _, name := range order {
		ms := make([]*Backend, len(members[name]))
		for j, i := range members[name] {
			ms[j] = g.backends[i]
		}
		p, err := buildPool(name, g.poolSpec[name].Policy, ms)
		if err != nil {
			return bad("pool %s: %v", name, err)
		}
		g.pools = append(g.pools, p)
		g.byName[name] = p
	}

	// Active checks: one per backend, whatever the number of its pools;
	// the panic of each pool over its own members.
	if h != nil {
		for i, b := range g.backends {
			var ps *PoolSpec
			for _, name := range g.poolsOf[i] {
				if s := g.poolSpec[name]; s.HealthPath != "" {
					ps = &s
					break
				}
			}
			h.Add(b, cfg.Prober(b, g.specs[i], ps))
		}
		h.pools = g.pools
		g.health = h
		g.first = h.checks
	}

	// Memory probes.
	for i, b := range g.backends {
		if g.specs[i].MetricsURL == "" || b.mop == nil {
			continue
		}
		pc := cfg.Probe
		pc.URL = g.specs[i].MetricsURL
		probe, err := NewMemoryProbe(b, pc, cfg.Clock, cfg.Logger)
		if err != nil {
			return bad("backend %s: memory probe: %v", b.id, err) // not reached: the dry run passed
		}
		g.probes = append(g.probes, probe)
	}

	if len(cfg.Routes) > 0 {
		for i, r := range cfg.Routes {
			if r.Proto != cfg.Proto {
				return bad("route %d (%s): a %s route", i+1, r, r.Proto)
			}
			if g.byName[r.Pool] == nil {
				return bad("route %d (%s): pool %q has no backends", i+1, r, r.Pool)
			}
		}
		if g.routes, err = NewRouteTable(cfg.Proto, cfg.Routes); err != nil {
			return bad("%v", err)
		}
		for _, r := range cfg.Routes {
			g.routeTo = append(g.routeTo, g.byName[r.Pool])
		}
	}
	g.dflt = g.byName[DefaultPool]
	if cfg.Prev != nil {
		g.carryFrom(cfg.Prev)
	}
	return g, nil
}

// Routes returns the route table, nil when the generation has no routes.
func (g *Generation) Routes() *RouteTable { return g.routes }

// Route returns the pool for new work described by in: the pool of the
// first route that matches (its index in route), else DefaultPool with
// route -1, else nil and -1 (the front end answers "no route": HTTP 404,
// SIP -sip-no-route-code). It allocates nothing.
func (g *Generation) Route(in *RouteInput) (p *Pool, route int) {
	if g.routes != nil {
		if i := g.routes.Match(in); i >= 0 {
			return g.routeTo[i], i
		}
	}
	return g.dflt, -1
}

// checkPoolName is admission.CheckPoolName: backends, pool settings,
// routes and ARM rules agree on what a pool name is.
func checkPoolName(name string) error {
	if err := admission.CheckPoolName(name); err != nil {
		return fmt.Errorf("pool %q: %w", name, err)
	}
	return nil
}

// carryFrom gives g's backends what prev's backend of the same id and
// address knew (see NewGeneration). It runs before g serves.
func (g *Generation) carryFrom(prev *Generation) {
	g.prevRoutes = prev.routes
	checks, prevChecks := g.health != nil, prev.health != nil
	var first []*healthCheck
	defer func() {
		if checks {
			g.first = first
		}
	}()
	for _, b := range g.backends {
		ob := prev.byID[b.id]
		if ob == nil || ob.addr != b.addr {
			if checks {
				b.SetUnknown(true)
				first = append(first, g.health.checks[b.index]) // added in backend order
			}
			continue
		}
		// Its counters, shared: they never go back (Prometheus counters
		// reset only with the process).
		b.ctr = ob.ctr
		// The operator's switches.
		b.drained.Store(ob.drained.Load())
		b.disabled.Store(ob.disabled.Load())
		// What the traffic said: a back-off asked for, an ejection, the
		// last real answer (which overrules failing probes).
		b.busyUntil.Store(ob.busyUntil.Load())
		b.ejectedAt.Store(ob.ejectedAt.Load())
		b.ejectWhy.Store(ob.ejectWhy.Load())
		b.servedAt.Store(ob.servedAt.Load())
		b.consecErr.Store(ob.consecErr.Load())
		// What the probes said, only if probes will go on saying it: a
		// verdict with no checker to revise it would hold for good.
		if checks && prevChecks {
			b.probeFrom.Store(ob.probeFrom.Load())
			b.probeDown.Store(ob.probeDown.Load())
			b.probeErr.Store(ob.probeErr.Load())
			b.probeBusy.Store(ob.probeBusy.Load())
			b.unknown.Store(ob.unknown.Load())
			b.announce.Store(ob.announce.Load())
		}
	}
}

// Start runs the generation's checks: a first round of health probes,
// synchronously, so that the front end's first traffic sees their
// verdict; then the checks and memory probes in the background until ctx
// is done or Stop. Start after Stop does nothing.
//
// The first round probes every backend of a generation built without
// Prev, and only the backends new to it otherwise (those Unknown until
// a verdict): one that stays keeps its state and is probed in the
// background. Its probes run in parallel (at most 32 at once), so it
// lasts about one health timeout whatever the number of backends that
// do not answer, and a route change that adds no backend does not wait.
func (g *Generation) Start(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped || g.cancel != nil {
		return
	}
	ctx, g.cancel = context.WithCancel(ctx)
	defer g.carryRouteHits()
	if g.health != nil {
		g.health.probeSome(ctx, g.first)
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.health.Run(ctx)
		}()
	}
	for _, probe := range g.probes {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			probe.Run(ctx)
		}()
	}
}

// carryRouteHits gives each route the hits of the route of the same
// canonical spec in Prev's table (the first one of that spec), so that
// a route's counter (labelled by its spec in /metrics) never goes back
// when a route is added or removed before it. It runs at the end of
// Start, as late as possible before the generation serves: hits the old
// table counts after it are not carried.
func (g *Generation) carryRouteHits() {
	prev := g.prevRoutes
	g.prevRoutes = nil
	if prev == nil || g.routes == nil {
		return
	}
	bySpec := make(map[string]int, len(prev.specs))
	for j := range prev.specs {
		k := prev.specs[j].String()
		if _, ok := bySpec[k]; !ok {
			bySpec[k] = j
		}
	}
	for i := range g.routes.specs {
		if j, ok := bySpec[g.routes.specs[i].String()]; ok {
			g.routes.hits[i].Store(prev.hits[j].Load())
			delete(bySpec, g.routes.specs[i].String()) // one route takes them
		}
	}
}

// RouteHits is one route's hit counter as /metrics shows it: Spec, the
// route's canonical spec (its label), the pool it chooses, and the new
// work it took.
type RouteHits struct {
	Spec, Pool string
	Hits       uint64
}

// HitsBySpec returns each distinct route of t in order, labelled by its
// canonical spec (made valid UTF-8: a label must be), with its pool and
// hits. A route given twice is one entry with the hits summed (the later
// never matches: first match wins), so a metric labelled by spec has one
// series per label. nil t: none. For scrapes: it allocates.
func (t *RouteTable) HitsBySpec() []RouteHits {
	if t == nil {
		return nil
	}
	out := make([]RouteHits, 0, len(t.specs))
	at := make(map[string]int, len(t.specs))
	for i := range t.specs {
		spec := strings.ToValidUTF8(t.specs[i].String(), "\uFFFD")
		if j, ok := at[spec]; ok {
			out[j].Hits += t.hits[i].Load()
			continue
		}
		at[spec] = len(out)
		out = append(out, RouteHits{Spec: spec, Pool: t.specs[i].Pool, Hits: t.hits[i].Load()})
	}
	return out
}

// DrainedByOperator reports whether p takes no new work at now because
// its operator drained it: no backend of p takes new work, and every one
// that would but for an operator's drain is drained (there is at least
// one). A front end that finds no backend then says "pool NAME drained"
// and counts the refusal as draining, not as no backend up: the operator
// asked for it. It takes a few atomic loads per backend.
func (p *Pool) DrainedByOperator(now int64) bool {
	panicking := p.panicking.Load()
	drained := false
	for _, b := range p.backends {
		if b.acceptsNew(now, panicking) {
			return false
		}
		if b.drained.Load() && b.wouldAcceptUndrained(now, panicking) {
			drained = true
		}
	}
	return drained
}

// wouldAcceptUndrained reports whether b would take new work at now in a
// pool whose panic is panicking, were it not drained by the operator.
func (b *Backend) wouldAcceptUndrained(now int64, panicking bool) bool {
	if b.deadByTraffic(now) || b.unknown.Load() || b.probeBusy.Load() || b.gone.Load() {
		return false
	}
	if u := b.busyUntil.Load(); u < 0 || now < u {
		return false
	}
	return !b.downByProbes() || panicking
}

// Stop ends the generation's checks and probes and waits for them: a
// reload retires the old generation once the new one serves. Its
// backends keep their last state. Stop may be called more than once, and
// before Start.
func (g *Generation) Stop() {
	g.mu.Lock()
	g.stopped = true
	if g.cancel != nil {
		g.cancel()
	}
	g.mu.Unlock()
	g.wg.Wait()
	for _, b := range g.backends {
		forgetTLSProbeClient(b.tls)
	}
}

// Proto returns "http" or "sip".
func (g *Generation) Proto() string { return g.proto }

// Pools returns the pools, DefaultPool first when there is one, the others
// in order of first mention (pool settings, then backends). The slice is
// shared: do not modify it.
func (g *Generation) Pools() []*Pool { return g.pools }

// Pool returns the pool called name, or nil.
func (g *Generation) Pool(name string) *Pool { return g.byName[name] }

// PoolSpec returns the settings in force of the pool called name: its
// own, or the front end's (Policy) for a pool named only by backends.
func (g *Generation) PoolSpec(name string) (PoolSpec, bool) {
	s, ok := g.poolSpec[name]
	return s, ok
}

// Backends returns every backend once, in spec order (a backend's Index
// is its position here). The slice is shared: do not modify it.
func (g *Generation) Backends() []*Backend { return g.backends }

// Lookup returns the backend with the given id, or nil. Lookup with
// string(b) of a byte slice does not allocate.
func (g *Generation) Lookup(id string) *Backend { return g.byID[id] }

// Spec returns the spec b was built from (defaults filled in: ID and
// Pools), or the zero spec when b is not of g.
func (g *Generation) Spec(b *Backend) BackendSpec {
	if !g.owns(b) {
		return BackendSpec{}
	}
	return g.specs[b.index]
}

// PoolsOf returns the names of the pools b is a member of, in its spec's
// order; nil when b is not of g. The slice is shared: do not modify it.
func (g *Generation) PoolsOf(b *Backend) []string {
	if !g.owns(b) {
		return nil
	}
	return g.poolsOf[b.index]
}

func (g *Generation) owns(b *Backend) bool {
	return b != nil && b.index >= 0 && b.index < len(g.backends) && g.backends[b.index] == b
}

// HealthChecks reports whether the generation runs active health checks.
func (g *Generation) HealthChecks() bool { return g.health != nil }

// SetWeight changes the weight of backend id at run time, in every pool
// it is a member of (see Pool.SetWeight).
func (g *Generation) SetWeight(id string, w int) error {
	b := g.byID[id]
	if b == nil {
		return fmt.Errorf("set weight of %s backend %q: %w", g.proto, id, ErrUnknownBackend)
	}
	if w < 1 || w > MaxWeight {
		return fmt.Errorf("set weight of %q: %d not in [1,%d]: %w", id, w, MaxWeight, ErrBadBackend)
	}
	b.weight.Store(int32(w))
	for _, name := range g.poolsOf[b.index] {
		if err := g.byName[name].rebuild(); err != nil {
			return fmt.Errorf("set weight of %q in pool %s: %w", id, name, err) // not reached: the policy was built before
		}
	}
	return nil
}

// CatchUp copies again, as g is put in force, what changed on prev's
// backends since NewGeneration carried it over: the operator's switches
// (drain, disable), back-offs and passive ejections, for backends of the
// same id and address. A front end calls it right before it swaps g in:
// between the build and the swap, g's Start ran a first round of probes,
// and a 503's Retry-After or an operator's drain made meanwhile landed on
// prev alone. Back-offs and ejections are extended, never shortened;
// probe verdicts are not copied (g's own first round is newer).
func (g *Generation) CatchUp(prev *Generation, now int64) {
	if prev == nil || prev == g {
		return
	}
	for _, b := range g.backends {
		ob := prev.byID[b.id]
		if ob == nil || ob == b || ob.addr != b.addr {
			continue
		}
		b.drained.Store(ob.drained.Load())
		b.disabled.Store(ob.disabled.Load())
		switch until := ob.busyUntil.Load(); {
		case until < 0:
			b.busyUntil.Store(until) // until cleared
		case until > now:
			b.BackOff(now, time.Duration(until-now))
		}
		if e := ob.ejectedAt.Load(); e > b.ejectedAt.Load() {
			b.ejectedAt.Store(e)
			b.ejectWhy.Store(ob.ejectWhy.Load())
		}
	}
}
