package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Class is the traffic class of a request.
type Class uint8

// Traffic classes.
const (
	// NewWork is everything without affinity: dialog-creating and
	// out-of-dialog SIP requests, HTTP requests without a valid sticky cookie.
	NewWork Class = iota
	// Affinity belongs to a dialog or session already under way; it is
	// always admitted and never counted against ARM or MOP.
	Affinity
)

// Request is what a rule matches on. Method, Host and Path may point into
// a front end's buffers: Decide keeps no reference to them after it
// returns.
type Request struct {
	Class  Class
	Proto  string // "http" or "sip"
	Method string
	Host   string
	Path   string
	// Pool is the name of the pool the front end's route chose, "" when
	// the front end has no pools. A Decision that delays or refuses
	// carries it (Decision.Pool), so it must be a string that outlives the
	// request: the route's pool name, never bytes of the message.
	Pool string
}

// Protocols counted apart by the Controller; anything else counts as other.
const (
	protoHTTP = iota
	protoSIP
	protoOther
	numProtos
)

// ProtoNames are the protocol labels of Counts, by index.
var ProtoNames = [numProtos]string{"http", "sip", "other"}

func protoIndex(p string) int {
	switch p {
	case "http":
		return protoHTTP
	case "sip":
		return protoSIP
	}
	return protoOther
}

// Verdict is the outcome of a decision.
type Verdict uint8

// Verdicts.
const (
	Admit  Verdict = iota // forward it
	Delay                 // wait on Decision.Wait, then call Controller.Resume
	Refuse                // answer with the refusal status and Retry-After
)

var verdictNames = [...]string{"admit", "delay", "refuse"}

func (v Verdict) String() string { return verdictNames[v] }

// Reason says which guard delayed or refused a request.
type Reason uint8

// Reasons.
const (
	ReasonNone     Reason = iota
	ReasonMemory          // node memory state Lower or Critical
	ReasonARM             // an ARM rule
	ReasonMOP             // every candidate backend is at its MOP rate
	ReasonDraining        // the balancer is shutting down (SIGTERM)
	NumReasons            // the number of reasons, for arrays indexed by Reason
	numReasons     = NumReasons
)

var reasonNames = [numReasons]string{"", "memory", "arm", "mop", "draining"}

// String returns "memory", "arm", "mop", "draining" or "".
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", r)
}

// Decision is the result of Decide: a small value, returned without
// allocation on the admit path.
type Decision struct {
	Verdict Verdict
	Reason  Reason
	// Rule is the index of the ARM rule that delayed or refused, or -1.
	Rule int16
	// HTTPStatus is the status to answer an HTTP refusal with (429 for memory
	// and ARM, the configured MOP code for MOP). SIP refusals are always 503.
	HTTPStatus uint16
	// RetryAfter is when the refusing guard expects room again.
	RetryAfter time.Duration
	// Wait is set for Delay.
	Wait *Wait
	// Pool is the pool of the request that was delayed or refused
	// (Request.Pool), "" when it had none or the request was admitted.
	Pool string
	// rule is the ARM rule that delayed or refused, nil for other
	// reasons: it names the rule even once the rule set has changed,
	// which the index Rule cannot.
	rule *Meter
}

// RuleName names the ARM rule that delayed or refused, "" when no rule
// did. Unlike Controller.RuleName it needs no controller and stays right
// after the rule set changed.
func (d Decision) RuleName() string {
	if d.Wait != nil {
		return d.Wait.m.cfg.Name
	}
	if d.rule != nil {
		return d.rule.cfg.Name
	}
	return ""
}

// Detail says what refused or delayed a request in the words a refusal
// carries to the client (Proxy-Status details, SIP Warning text) and
// that events use: the reason, then "rule NAME" when an ARM rule did it,
// then "pool NAME" when the request was routed to a pool. For example
// "arm rule api-burst pool api", "arm rule invites", "mop pool london",
// "memory", "draining"; "" for an admission. Names are as the operator
// wrote them: a front end that quotes the text escapes it as it would any
// other string.
func (d Decision) Detail() string {
	if d.Verdict == Admit {
		return ""
	}
	return string(d.AppendDetail(nil))
}

// AppendDetail appends Detail to dst, allocating only when dst is too
// short: a front end may format into a stack buffer.
func (d Decision) AppendDetail(dst []byte) []byte {
	if d.Verdict == Admit {
		return dst
	}
	start := len(dst)
	word := func(w string) {
		if len(dst) > start {
			dst = append(dst, ' ')
		}
		dst = append(dst, w...)
	}
	if d.Reason != ReasonNone {
		word(d.Reason.String())
	}
	if name := d.RuleName(); name != "" {
		word("rule")
		word(name)
	}
	if d.Pool != "" {
		word("pool")
		word(d.Pool)
	}
	return dst
}

// RetryAfterSeconds rounds a Retry-After hint up to whole seconds for the
// wire, at least 1.
func RetryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	if s < 1 {
		return 1
	}
	return s
}

// ControllerConfig configures a Controller.
type ControllerConfig struct {
	// Rules are the ARM rules, evaluated in order; each one a request
	// matches must admit it.
	Rules []RuleConfig
	// RefuseCode is the HTTP status for memory and ARM refusals. Default 429.
	RefuseCode int
	// MOPRejectCode is the HTTP status for MOP refusals. Flag
	// -mop-reject-code, default 503.
	MOPRejectCode int
	// MemoryRetryAfter is the Retry-After of a memory-state refusal.
	// Default 5s.
	MemoryRetryAfter time.Duration
	// Events receives rule and configuration events. May be nil.
	Events EventSink
}

// Controller is the one decision API of both front ends. Safe for concurrent
// use; Decide allocates nothing on the admit path.
type Controller struct {
	cfg    ControllerConfig
	mem    *Memory
	rules  atomic.Pointer[[]*Meter] // in evaluation order; replaced whole by the rule changes
	ruleMu sync.Mutex               // serialises rule changes

	draining atomic.Bool
	admitted shards // admissions by protocol and class, counted per shard (shard.counts)
	refused  [numProtos][numReasons]atomic.Uint64
}

// ErrBadStatus is returned for a refusal status outside 400–599.
var ErrBadStatus = errors.New("refusal status must be in 400-599")

// NewController builds the rules at now. mem may be nil (no memory states).
func NewController(cfg ControllerConfig, mem *Memory, now int64) (*Controller, error) {
	if cfg.RefuseCode == 0 {
		cfg.RefuseCode = 429
	}
	if cfg.MOPRejectCode == 0 {
		cfg.MOPRejectCode = DefaultMOPRejectCode
	}
	if cfg.MemoryRetryAfter == 0 {
		cfg.MemoryRetryAfter = 5 * time.Second
	}
	if cfg.MOPRejectCode < 400 || cfg.MOPRejectCode > 599 {
		return nil, &FieldError{Field: "ControllerConfig.MOPRejectCode", Err: fmt.Errorf("%d: %w", cfg.MOPRejectCode, ErrBadStatus)}
	}
	if cfg.RefuseCode < 400 || cfg.RefuseCode > 599 {
		return nil, fmt.Errorf("refuse code %d: %w", cfg.RefuseCode, ErrBadStatus)
	}
	c := &Controller{cfg: cfg, mem: mem}
	if err := checkRules(cfg.Rules); err != nil {
		return nil, &FieldError{Field: "ControllerConfig.Rules", Err: err}
	}
	rules := []*Meter{}
	for _, rc := range cfg.Rules {
		m, err := NewMeter(rc, now, cfg.Events)
		if err != nil {
			return nil, &FieldError{Field: "ControllerConfig.Rules", Err: err}
		}
		rules = append(rules, m)
	}
	c.rules.Store(&rules)
	return c, nil
}

// maxRules bounds the rule set: Decision.Rule is an int16.
const maxRules = 1<<15 - 1

// checkRules validates a whole rule set: every rule, unique names, and not
// too many.
func checkRules(rules []RuleConfig) error {
	if len(rules) > maxRules {
		return errors.New("too many rules")
	}
	seen := map[string]bool{}
	for _, rc := range rules {
		if seen[rc.Name] {
			return fmt.Errorf("duplicate rule name %q", rc.Name)
		}
		seen[rc.Name] = true
		if err := rc.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Errors of the rule changes.
var (
	// ErrNoSuchRule: no ARM rule has the name.
	ErrNoSuchRule = errors.New("no such arm rule")
	// ErrRuleExists: AddRule of a name already in use.
	ErrRuleExists = errors.New("arm rule already exists")
)

// RuleChange says what SetRules did to one rule.
type RuleChange struct {
	Name string
	// How is "added", "removed", "changed" (limits, action, queue or wait
	// changed in place: counters and metered rate kept), "replaced" (its
	// match, unit or qualification changed: a new meter, counters from
	// zero) or "unchanged".
	How string
	// Old and New are the rule before and after (zero when absent).
	Old, New RuleConfig
}

// SetRules makes rules the rule set in force at now, in their order. A
// rule whose name is already in force keeps its meter (counters, metered
// rate, queue) when only its limits, action, queue or wait differ; other
// rules get new meters; requests queued by a removed rule are admitted by
// it (the remaining rules still decide them). Nothing changes when any
// rule is invalid. The next decision uses the new set.
func (c *Controller) SetRules(rules []RuleConfig, now int64) ([]RuleChange, error) {
	c.ruleMu.Lock()
	defer c.ruleMu.Unlock()
	return c.setRulesLocked(rules, now)
}

func (c *Controller) setRulesLocked(rules []RuleConfig, now int64) ([]RuleChange, error) {
	for i := range rules {
		if rules[i].Queue == 0 {
			rules[i].Queue = 1000
		}
	}
	if err := checkRules(rules); err != nil {
		return nil, err
	}
	old := map[string]*Meter{}
	for _, m := range *c.rules.Load() {
		old[m.cfg.Name] = m
	}
	next := make([]*Meter, 0, len(rules))
	var changes []RuleChange
	var reconf []func() // in-place changes, made once every new meter is built
	for _, rc := range rules {
		m := old[rc.Name]
		delete(old, rc.Name)
		switch {
		case m == nil:
			nm, err := NewMeter(rc, now, c.cfg.Events)
			if err != nil {
				return nil, err
			}
			next = append(next, nm)
			changes = append(changes, RuleChange{Name: rc.Name, How: "added", New: rc})
		case m.Config() == rc:
			next = append(next, m)
			changes = append(changes, RuleChange{Name: rc.Name, How: "unchanged", Old: rc, New: rc})
		case m.Reconfigurable(rc):
			next = append(next, m)
			changes = append(changes, RuleChange{Name: rc.Name, How: "changed", Old: m.Config(), New: rc})
			reconf = append(reconf, func() { m.Reconfigure(rc) })
		default:
			nm, err := NewMeter(rc, now, c.cfg.Events)
			if err != nil {
				return nil, err
			}
			next = append(next, nm)
			changes = append(changes, RuleChange{Name: rc.Name, How: "replaced", Old: m.Config(), New: rc})
			old[rc.Name] = m // retired below
		}
	}
	for _, f := range reconf {
		f()
	}
	c.rules.Store(&next)
	for _, m := range *c.sortedMeters(old) {
		m.retire()
		if _, kept := ruleIn(next, m.cfg.Name); !kept {
			changes = append(changes, RuleChange{Name: m.cfg.Name, How: "removed", Old: m.Config()})
		}
	}
	return changes, nil
}

// sortedMeters lists the meters of set by name, so events come in a stable order.
func (c *Controller) sortedMeters(set map[string]*Meter) *[]*Meter {
	out := make([]*Meter, 0, len(set))
	for _, m := range set {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *Meter) int { return strings.Compare(a.cfg.Name, b.cfg.Name) })
	return &out
}

func ruleIndex(rules []*Meter, m *Meter) (int, bool) {
	for i, r := range rules {
		if r == m {
			return i, true
		}
	}
	return -1, false
}

func ruleIn(rules []*Meter, name string) (int, bool) {
	for i, m := range rules {
		if m.cfg.Name == name {
			return i, true
		}
	}
	return -1, false
}

// RuleConfigs returns the rules in force, in evaluation order.
func (c *Controller) RuleConfigs() []RuleConfig {
	rules := c.Rules()
	out := make([]RuleConfig, len(rules))
	for i, m := range rules {
		out[i] = m.Config()
	}
	return out
}

// Rule returns the rule in force named name.
func (c *Controller) Rule(name string) (RuleConfig, bool) {
	if i, ok := ruleIn(c.Rules(), name); ok {
		return c.Rules()[i].Config(), true
	}
	return RuleConfig{}, false
}

// UpdateRule changes the rule named rc.Name (see SetRules for what is
// kept); ErrNoSuchRule when there is none.
func (c *Controller) UpdateRule(rc RuleConfig, now int64) (RuleChange, error) {
	return c.edit(now, func(rules []RuleConfig) ([]RuleConfig, error) {
		for i := range rules {
			if rules[i].Name == rc.Name {
				rules[i] = rc
				return rules, nil
			}
		}
		return nil, fmt.Errorf("arm rule %q: %w", rc.Name, ErrNoSuchRule)
	}, rc.Name)
}

// AddRule appends a rule, evaluated after the others; ErrRuleExists when
// the name is in use.
func (c *Controller) AddRule(rc RuleConfig, now int64) (RuleChange, error) {
	return c.edit(now, func(rules []RuleConfig) ([]RuleConfig, error) {
		for _, r := range rules {
			if r.Name == rc.Name {
				return nil, fmt.Errorf("arm rule %q: %w", rc.Name, ErrRuleExists)
			}
		}
		return append(rules, rc), nil
	}, rc.Name)
}

// RemoveRule takes the rule named name out; requests it queued are
// admitted by it. ErrNoSuchRule when there is none.
func (c *Controller) RemoveRule(name string, now int64) (RuleChange, error) {
	return c.edit(now, func(rules []RuleConfig) ([]RuleConfig, error) {
		for i := range rules {
			if rules[i].Name == name {
				return append(rules[:i], rules[i+1:]...), nil
			}
		}
		return nil, fmt.Errorf("arm rule %q: %w", name, ErrNoSuchRule)
	}, name)
}

func (c *Controller) edit(now int64, f func([]RuleConfig) ([]RuleConfig, error), name string) (RuleChange, error) {
	c.ruleMu.Lock()
	defer c.ruleMu.Unlock()
	rules, err := f(c.RuleConfigs())
	if err != nil {
		return RuleChange{}, err
	}
	changes, err := c.setRulesLocked(rules, now)
	if err != nil {
		return RuleChange{}, err
	}
	for _, ch := range changes {
		if ch.Name == name {
			return ch, nil
		}
	}
	return RuleChange{}, fmt.Errorf("arm rule %q: %w", name, ErrNoSuchRule)
}

// SetDraining turns shutdown draining on or off: while on, new work is
// refused (reason draining, status 503) and affinity still passes.
func (c *Controller) SetDraining(on bool) { c.draining.Store(on) }

// Draining reports whether SetDraining(true) is in force.
func (c *Controller) Draining() bool { return c.draining.Load() }

// Memory returns the node memory tracker, possibly nil.
func (c *Controller) Memory() *Memory { return c.mem }

// Rules returns the ARM meters in evaluation order.
func (c *Controller) Rules() []*Meter { return *c.rules.Load() }

// Decide admits, delays or refuses r at now. mop is the candidate backend's
// limiter, or nil to leave MOP to the caller (see RefuseMOPFor): a front end
// that tries several candidates calls Decide with nil and then MOP.Allow on
// each (RefuseMOPFor when all refuse). Affinity is always admitted.
func (c *Controller) Decide(now int64, r *Request, mop *MOP) Decision {
	if r.Class == Affinity {
		c.admitted.pick().counts[protoIndex(r.Proto)][Affinity].Add(1)
		return Decision{Verdict: Admit, Rule: -1}
	}
	if c.draining.Load() {
		return c.refuse(r, Decision{Verdict: Refuse, Reason: ReasonDraining, Rule: -1, RetryAfter: c.cfg.MemoryRetryAfter})
	}
	st := c.mem.State()
	if st.RefusesNewWork() {
		return c.refuse(r, Decision{Verdict: Refuse, Reason: ReasonMemory, Rule: -1, RetryAfter: c.cfg.MemoryRetryAfter})
	}
	return c.decideFrom(now, r, mop, st, 0)
}

func (c *Controller) decideFrom(now int64, r *Request, mop *MOP, st MemState, first int) Decision {
	rules := *c.rules.Load()
	for i := first; i < len(rules); i++ {
		m := rules[i]
		if !m.cfg.Match.Matches(r) {
			continue
		}
		d := m.Admit(now, st)
		if d.Verdict == Admit {
			continue
		}
		d.Rule, d.rule = int16(i), m
		if d.Verdict == Refuse {
			return c.refuse(r, d)
		}
		d.HTTPStatus = uint16(c.cfg.RefuseCode)
		d.Pool = r.Pool
		return d
	}
	if mop != nil && !mop.Allow(now) {
		return c.RefuseMOPFor(r, mop.RetryAfter(now))
	}
	c.admitted.pick().counts[protoIndex(r.Proto)][NewWork].Add(1)
	return Decision{Verdict: Admit, Rule: -1}
}

// Resume continues a delayed decision once its Wait is done: refused if the
// wait ran out or was canceled, else the remaining rules and mop decide.
func (c *Controller) Resume(now int64, r *Request, d Decision, mop *MOP) Decision {
	if d.Verdict != Delay || d.Wait == nil {
		return d
	}
	if !d.Wait.Admitted() {
		return c.refuse(r, Decision{Verdict: Refuse, Reason: ReasonARM, Rule: d.Rule, RetryAfter: d.Wait.RetryAfter(), rule: d.Wait.m})
	}
	// The rules after the one that delayed it decide next; if the set
	// changed meanwhile, after that rule's place in the new set (a removed
	// rule's place is kept by index).
	next := int(d.Rule) + 1
	if i, ok := ruleIndex(*c.rules.Load(), d.Wait.m); ok {
		next = i + 1
	}
	return c.decideFrom(now, r, mop, c.mem.State(), next)
}

// Wait blocks on a Delay decision until it is released, refused, or ctx is
// done (then the request is withdrawn and refused), and returns the final
// decision. clock supplies the time to continue at.
func (c *Controller) Wait(ctx context.Context, clock Clock, r *Request, d Decision, mop *MOP) Decision {
	if d.Verdict != Delay || d.Wait == nil {
		return d
	}
	select {
	case <-d.Wait.Done():
	case <-ctx.Done():
		d.Wait.Cancel()
		<-d.Wait.Done()
	}
	return c.Resume(clock.Now(), r, d, mop)
}

// RefuseMOPFor is the decision for new work r that no candidate backend's
// MOP would take; retry is the soonest any of them frees up. It is counted
// under r's protocol.
func (c *Controller) RefuseMOPFor(r *Request, retry time.Duration) Decision {
	return c.refuse(r, Decision{Verdict: Refuse, Reason: ReasonMOP, Rule: -1, RetryAfter: retry})
}

func (c *Controller) refuse(r *Request, d Decision) Decision {
	switch d.Reason {
	case ReasonMOP:
		d.HTTPStatus = uint16(c.cfg.MOPRejectCode)
	case ReasonDraining:
		d.HTTPStatus = 503
	default:
		d.HTTPStatus = uint16(c.cfg.RefuseCode)
	}
	d.Pool = r.Pool
	c.refused[protoIndex(r.Proto)][d.Reason].Add(1)
	return d
}

// RuleName names the rule of a decision, or "" when no rule decided it
// (see Decision.RuleName). A Decision made by hand with only the index
// Rule set is looked up in the rule set in force.
func (c *Controller) RuleName(d Decision) string {
	if name := d.RuleName(); name != "" {
		return name
	}
	rules := *c.rules.Load()
	if d.Rule < 0 || int(d.Rule) >= len(rules) {
		return ""
	}
	return rules[d.Rule].cfg.Name
}

// Counts is what a Controller decided since start, indexed by protocol
// (see ProtoNames), class and reason.
type Counts struct {
	Admitted [numProtos][2]uint64          // by protocol and Class
	Refused  [numProtos][numReasons]uint64 // by protocol and Reason
}

// Counts returns how many requests were admitted and refused since start.
func (c *Controller) Counts() Counts {
	var out Counts
	for p := range out.Admitted {
		for cl := range out.Admitted[p] {
			out.Admitted[p][cl] = c.admitted.count(p, cl)
		}
		for r := range out.Refused[p] {
			out.Refused[p][r] = c.refused[p][r].Load()
		}
	}
	return out
}

// ClassNames are the class labels of Counts, by index.
var ClassNames = [2]string{"new", "affinity"}

// ReasonNames are the reason labels of Counts, by index ("" for none).
var ReasonNames = reasonNames

// Advance moves every rule to now (expiry, releases, timeouts).
func (c *Controller) Advance(now int64) {
	for _, m := range *c.rules.Load() {
		m.Advance(now)
	}
}

// Run calls Advance every tick until ctx is done: the production driver of
// ARM sub-interval expiry and delay-queue release. tick should be well under
// the shortest sub-interval (a per-second rule has 166ms ones); 10ms is a
// good default. It runs also while there are no rules: rules may be added
// at run time.
func (c *Controller) Run(ctx context.Context, clock Clock, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Advance(clock.Now())
		}
	}
}
