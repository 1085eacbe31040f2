package lb

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// defaultCooldown is PassiveConfig.Cooldown's default (-health-cooldown).
const defaultCooldown = 10 * time.Second

// MaxBackends is the largest pool. Selection tracks the candidates it has
// tried in a fixed bitset on the stack so that it never allocates.
const MaxBackends = 1024

// Outcome says how Pick ended.
type Outcome uint8

// Pick outcomes.
const (
	// Picked: the returned backend accepts new work and its MOP admitted
	// the request (the admission is counted).
	Picked Outcome = iota
	// NoBackend: no backend accepts new work (all down or draining). HTTP
	// answers 503, SIP 500 or 503 (RFC 3261 §16.7).
	NoBackend
	// MOPRefused: at least one backend accepts new work but every such
	// candidate's MOP refused; answer with admission.Controller.RefuseMOPFor.
	MOPRefused
)

var outcomeNames = [...]string{"picked", "no_backend", "mop_refused"}

// String returns "picked", "no_backend" or "mop_refused".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// PassiveConfig configures passive ejection: a backend that fails MaxFails
// requests in a row (connect error, timeout or 5xx) is Down for Cooldown.
type PassiveConfig struct {
	// MaxFails is the number of consecutive failures that eject a backend;
	// 0 disables passive ejection. Flag -health-max-fails, default 3.
	MaxFails int
	// Cooldown is how long an ejected backend stays Down. Flag
	// -health-cooldown, default 10s.
	Cooldown time.Duration
	// OnEject, if not nil, is called when a backend that was not ejected
	// is ejected (not when a failure extends an ejection), with the result
	// that tipped it and the monotonic ns it is out until: for the log and
	// the event that tell an operator why a backend gets no traffic. It
	// runs on the request path: keep it short and do not block.
	OnEject func(b *Backend, r Result, until int64)
}

// DefaultPool is the name of the pool of a backend that names none, and
// of a pool built by NewPool without a name.
const DefaultPool = "default"

// PoolConfig configures a Pool.
type PoolConfig struct {
	// Name names the pool in routes, /status and metrics; "" is
	// DefaultPool.
	Name string
	// Policy names the selection policy (see PolicyNames). Flag
	// -lb-policy, default "round-robin".
	Policy string
	// Passive is passive ejection; the zero value disables it. It is set
	// on the backends (one per protocol, not per pool): NewGeneration
	// sets it once for all its pools.
	Passive PassiveConfig
}

// Pool is a fixed set of backends and the policy that picks among them.
// It is safe for concurrent use; Pick, Lookup and the Backend methods take
// no lock and allocate nothing. A backend may be in several pools (of one
// Generation): the pool keeps its members' positions and its panic itself.
type Pool struct {
	name     string
	backends []*Backend
	byID     map[string]int // id -> position in backends
	// policy is swapped by SetWeight when a policy that precomputes from
	// the weights (weighted-round-robin, consistent-hash) must be rebuilt;
	// Pick loads it once per call.
	policy     atomic.Pointer[policyBox]
	policyName string
	// reweigh serializes SetWeight so that two changes do not rebuild
	// from a mix of old and new weights.
	reweigh sync.Mutex
	// panicking is set by the pool's health checker when more than
	// HealthConfig.Panic of the pool's backends are down by their probes
	// alone: new work in this pool then goes to every member that traffic
	// has not shown dead. The pool's policy reads it.
	panicking atomic.Bool
	panics    atomic.Uint64 // times the pool went into panic
	// tiers, when the members have more than one Priority, are the
	// positions outside each priority, lowest priority first: PickTried
	// looks at one tier at a time (RFC 3263 §4.3). nil: one tier.
	tiers []Set
}

// Panicking reports whether the pool is in panic: past HealthConfig.Panic
// of its backends are down by their probes alone, and new work is spread
// over every backend not disabled, not shown dead by traffic and not
// draining, whatever its probes say (as Envoy's panic threshold does).
func (p *Pool) Panicking() bool { return p.panicking.Load() }

// Panics returns how many times the pool went into panic.
func (p *Pool) Panics() uint64 { return p.panics.Load() }

// policyBox holds a Policy for atomic.Pointer.
type policyBox struct{ Policy }

// ErrNoBackends is returned by NewPool for an empty backend list.
var ErrNoBackends = errors.New("pool has no backends")

// NewPool builds a pool of backends (their order is the pool's order)
// with the policy named by cfg.Policy, and sets cfg.Passive on them.
// Backend ids must be unique. A backend may already be in another pool:
// its Index stays the one the first pool (or its generation) gave it.
// Build pools before their backends serve.
func NewPool(cfg PoolConfig, backends []*Backend) (*Pool, error) {
	passive, err := cfg.Passive.build()
	if err != nil {
		return nil, err
	}
	p, err := buildPool(cfg.Name, cfg.Policy, backends)
	if err != nil {
		return nil, err
	}
	for i, b := range p.backends {
		if b.index < 0 {
			b.index = i
		}
		b.passive = passive
	}
	if passive != nil {
		passive.peers = p.backends
	}
	return p, nil
}

// build checks c and returns what the backends keep of it (nil: passive
// ejection off).
func (c PassiveConfig) build() (*passiveConfig, error) {
	if c.MaxFails < 0 || c.Cooldown < 0 {
		return nil, fieldError("PassiveConfig.MaxFails", "MaxFails and Cooldown must not be negative (got %d, %s)", c.MaxFails, c.Cooldown)
	}
	if c.MaxFails == 0 {
		return nil, nil
	}
	if c.Cooldown == 0 {
		c.Cooldown = defaultCooldown
	}
	return &passiveConfig{maxFails: int32(c.MaxFails), cooldown: int64(c.Cooldown), onEject: c.OnEject}, nil
}

// buildPool builds the pool name ("" is DefaultPool) of backends with the
// policy called policy, leaving the backends themselves alone.
func buildPool(name, policy string, backends []*Backend) (*Pool, error) {
	if name == "" {
		name = DefaultPool
	}
	if len(backends) == 0 {
		return nil, fmt.Errorf("pool %s: %w", name, ErrNoBackends)
	}
	if len(backends) > MaxBackends {
		return nil, fmt.Errorf("pool %s: %d backends, at most %d: %w", name, len(backends), MaxBackends, ErrBadBackend)
	}
	p := &Pool{name: name, backends: append([]*Backend(nil), backends...), byID: make(map[string]int, len(backends))}
	for i, b := range p.backends {
		if b == nil {
			return nil, fmt.Errorf("pool %s: backend %d is nil: %w", name, i, ErrBadBackend)
		}
		if _, dup := p.byID[b.id]; dup {
			return nil, fmt.Errorf("pool %s: duplicate backend id %q: %w", name, b.id, ErrBadBackend)
		}
		p.byID[b.id] = i
	}
	pol, err := p.newPolicy(policy)
	if err != nil {
		return nil, err
	}
	p.policy.Store(&policyBox{pol})
	p.policyName = policy
	p.tiers = priorityTiers(p.backends)
	return p, nil
}

// priorityTiers returns, for each distinct priority of backends from the
// lowest, the set of positions of the other priorities; nil when all
// have one priority.
func priorityTiers(backends []*Backend) []Set {
	var prios []int
	for _, b := range backends {
		if !slices.Contains(prios, b.priority) {
			prios = append(prios, b.priority)
		}
	}
	if len(prios) < 2 {
		return nil
	}
	slices.Sort(prios)
	tiers := make([]Set, len(prios))
	for t, pr := range prios {
		for i, b := range backends {
			if b.priority != pr {
				tiers[t].Add(i)
			}
		}
	}
	return tiers
}

// newPolicy builds the policy called name over p's backends, linked to
// p's panic.
func (p *Pool) newPolicy(name string) (Policy, error) {
	pol, err := NewPolicy(name, p.backends)
	if err != nil {
		return nil, err
	}
	if l, ok := pol.(panicLinker); ok {
		l.setPanic(&p.panicking)
	}
	return pol, nil
}

// Name returns the pool's name (DefaultPool when built without one).
func (p *Pool) Name() string { return p.name }

// IndexOf returns b's position in the pool, or -1 when b is not a member.
// It allocates nothing.
func (p *Pool) IndexOf(b *Backend) int {
	if b == nil {
		return -1
	}
	if i, ok := p.byID[b.id]; ok && p.backends[i] == b {
		return i
	}
	return -1
}

// Has reports whether b is a member of the pool.
func (p *Pool) Has(b *Backend) bool { return p.IndexOf(b) >= 0 }

// Backends returns the pool's backends in order. The slice is shared:
// do not modify it.
func (p *Pool) Backends() []*Backend { return p.backends }

// Len returns the number of backends.
func (p *Pool) Len() int { return len(p.backends) }

// Policy returns the selection policy in use.
func (p *Pool) Policy() Policy { return p.policy.Load().Policy }

// SetWeight changes the weight of the backend id at run time, within
// [1, MaxWeight], and rebuilds the policy from the new weights (policies
// that read weights per pick see it at once). Requests picked meanwhile use
// the old policy; weighted-round-robin starts its cycle over. It takes a
// lock and allocates: it is an operator's control, not a request path.
//
// The weight is the backend's, in every pool it is a member of: with
// several pools use Generation.SetWeight, which rebuilds each of them.
func (p *Pool) SetWeight(id string, w int) error {
	b := p.Lookup(id)
	if b == nil {
		return fmt.Errorf("set weight of %q in pool %s: %w", id, p.name, ErrUnknownBackend)
	}
	if w < 1 || w > MaxWeight {
		return fmt.Errorf("set weight of %q: %d not in [1,%d]: %w", id, w, MaxWeight, ErrBadBackend)
	}
	p.reweigh.Lock()
	defer p.reweigh.Unlock()
	old := b.weight.Swap(int32(w))
	if err := p.rebuildLocked(); err != nil {
		b.weight.Store(old) // the name was valid at NewPool: unreachable
		return fmt.Errorf("set weight of %q: %w", id, err)
	}
	return nil
}

// rebuild builds the policy again from the weights in force.
func (p *Pool) rebuild() error {
	p.reweigh.Lock()
	defer p.reweigh.Unlock()
	return p.rebuildLocked()
}

func (p *Pool) rebuildLocked() error {
	pol, err := p.newPolicy(p.policyName)
	if err != nil {
		return err
	}
	p.policy.Store(&policyBox{pol})
	return nil
}

// ErrUnknownBackend is wrapped by SetWeight for an id not in the pool.
var ErrUnknownBackend = errors.New("no such backend")

// Lookup returns the backend with the given id, or nil. Lookup with
// string(b) of a byte slice does not allocate.
func (p *Pool) Lookup(id string) *Backend {
	if i, ok := p.byID[id]; ok {
		return p.backends[i]
	}
	return nil
}

// Pinned returns the backend an affinity token names if it still takes
// affinity traffic at now (Up or Draining); otherwise nil, and the request
// is new work to be re-pinned.
func (p *Pool) Pinned(id string, now int64) *Backend {
	b := p.Lookup(id)
	if b == nil || !b.AcceptsAffinity(now) {
		return nil
	}
	return b
}

// Pick chooses a backend for new work at now. key feeds hash-based
// policies (use Hash or HashBytes on a source address, header, cookie or
// Call-ID); other policies ignore it. skip, if not nil, is never chosen:
// pass the backend that just failed to retry elsewhere.
//
// Candidates come in the policy's order; each one that accepts new work is
// asked its MOP, and the first that admits is returned with Picked. When
// every candidate's MOP refuses, Pick returns MOPRefused and the shortest
// Retry-After among them; when no backend accepts new work at all, it
// returns NoBackend. Pick allocates nothing.
func (p *Pool) Pick(now int64, key uint64, skip *Backend) (b *Backend, out Outcome, retryAfter time.Duration) {
	var tried Set
	if i := p.IndexOf(skip); i >= 0 {
		tried.Add(i)
	}
	return p.PickTried(now, key, &tried)
}

// PickTried is Pick with a set of pool positions never to choose instead
// of one backend: every candidate it looks at is added to tried, so a
// failover that calls it again never comes back to one. It allocates
// nothing.
//
// In a pool whose backends have several priorities (SRV), every backend
// of the lowest priority is tried before any of the next: a failover
// that calls it again moves to the next priority once the lower ones are
// all tried, down or refused by their MOP (RFC 3263 §4.3).
func (p *Pool) PickTried(now int64, key uint64, tried *Set) (b *Backend, out Outcome, retryAfter time.Duration) {
	pol := p.policy.Load().Policy
	if p.tiers == nil {
		return p.pickIn(pol, now, key, tried, nil)
	}
	out = NoBackend
	for t := range p.tiers {
		mask := p.tiers[t]
		mask.union(tried)
		c, o, ra := p.pickIn(pol, now, key, &mask, tried)
		switch {
		case o == Picked:
			return c, o, 0
		case o == MOPRefused && (out != MOPRefused || ra < retryAfter):
			out, retryAfter = MOPRefused, ra
		}
	}
	return nil, out, retryAfter
}

// pickIn is PickTried over the positions not in skip; each candidate it
// looks at is added to skip and to also (when not nil).
func (p *Pool) pickIn(pol Policy, now int64, key uint64, skip, also *Set) (b *Backend, out Outcome, retryAfter time.Duration) {
	out = NoBackend
	for {
		i := pol.Select(p.backends, now, key, *skip)
		if i < 0 {
			return nil, out, retryAfter
		}
		skip.Add(i)
		if also != nil {
			also.Add(i)
		}
		c := p.backends[i]
		if c.mop.Allow(now) {
			return c, Picked, 0
		}
		ra := c.mop.RetryAfter(now)
		if out != MOPRefused || ra < retryAfter {
			retryAfter = ra
		}
		out = MOPRefused
	}
}

// Home returns the backend the policy gives key at now, ignoring MOP and
// the backends that take no new work; when none takes new work, a
// member fixed by key all the same. It is never nil: the fallback of
// in-dialog requests that name no backend (SIP without a token), which
// must go somewhere fixed rather than be refused. Only a hash policy
// makes it the backend new work with key was given. It allocates nothing.
func (p *Pool) Home(now int64, key uint64) *Backend {
	pol := p.policy.Load().Policy
	if p.tiers != nil {
		if i := pol.Select(p.backends, now, key, p.tiers[0]); i >= 0 {
			return p.backends[i]
		}
	}
	if i := pol.Select(p.backends, now, key, Set{}); i >= 0 {
		return p.backends[i]
	}
	return p.backends[key%uint64(len(p.backends))]
}

// Status returns the status of every backend at now.
func (p *Pool) Status(now int64) []BackendStatus {
	s := make([]BackendStatus, len(p.backends))
	for i, b := range p.backends {
		s[i] = b.Status(now)
	}
	return s
}

// Set is a set of backend indices in [0, MaxBackends), used by Pick to
// remember the candidates it has tried. Its zero value is empty.
type Set struct {
	w [MaxBackends / 64]uint64
}

// Add puts i in the set.
func (s *Set) Add(i int) { s.w[i>>6] |= 1 << (i & 63) }

// union adds the members of o.
func (s *Set) union(o *Set) {
	for i := range s.w {
		s.w[i] |= o.w[i]
	}
}

// Has reports whether i is in the set.
func (s *Set) Has(i int) bool { return s.w[i>>6]&(1<<(i&63)) != 0 }
