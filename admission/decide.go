package admission

import (
	"context"
	"errors"
	"fmt"
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

// Request is what a rule matches on. Fields may point into a front end's
// buffers: Decide keeps no reference after it returns.
type Request struct {
	Class  Class
	Proto  string // "http" or "sip"
	Method string
	Host   string
	Path   string
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
	cfg   ControllerConfig
	mem   *Memory
	rules []*Meter

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
		cfg.MOPRejectCode = 503
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
	seen := map[string]bool{}
	for _, rc := range cfg.Rules {
		if seen[rc.Name] {
			return nil, fieldError("ControllerConfig.Rules", "duplicate rule name %q", rc.Name)
		}
		seen[rc.Name] = true
		m, err := NewMeter(rc, now, cfg.Events)
		if err != nil {
			return nil, &FieldError{Field: "ControllerConfig.Rules", Err: err}
		}
		c.rules = append(c.rules, m)
	}
	if len(c.rules) > 1<<15-1 {
		return nil, fieldError("ControllerConfig.Rules", "too many rules")
	}
	return c, nil
}

// SetDraining turns shutdown draining on or off: while on, new work is
// refused (reason draining, status 503) and affinity still passes.
func (c *Controller) SetDraining(on bool) { c.draining.Store(on) }

// Draining reports whether SetDraining(true) is in force.
func (c *Controller) Draining() bool { return c.draining.Load() }

// Memory returns the node memory tracker, possibly nil.
func (c *Controller) Memory() *Memory { return c.mem }

// Rules returns the ARM meters in evaluation order.
func (c *Controller) Rules() []*Meter { return c.rules }

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
	for i := first; i < len(c.rules); i++ {
		m := c.rules[i]
		if !m.cfg.Match.Matches(r) {
			continue
		}
		d := m.Admit(now, st)
		if d.Verdict == Admit {
			continue
		}
		d.Rule = int16(i)
		if d.Verdict == Refuse {
			return c.refuse(r, d)
		}
		d.HTTPStatus = uint16(c.cfg.RefuseCode)
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
		return c.refuse(r, Decision{Verdict: Refuse, Reason: ReasonARM, Rule: d.Rule, RetryAfter: d.Wait.RetryAfter()})
	}
	return c.decideFrom(now, r, mop, c.mem.State(), int(d.Rule)+1)
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
	c.refused[protoIndex(r.Proto)][d.Reason].Add(1)
	return d
}

// RuleName names the rule of a decision, or "" when no rule decided it.
func (c *Controller) RuleName(d Decision) string {
	if d.Rule < 0 || int(d.Rule) >= len(c.rules) {
		return ""
	}
	return c.rules[d.Rule].cfg.Name
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
	for _, m := range c.rules {
		m.Advance(now)
	}
}

// Run calls Advance every tick until ctx is done: the production driver of
// ARM sub-interval expiry and delay-queue release. tick should be well under
// the shortest sub-interval (a per-second rule has 166ms ones); 10ms is a
// good default.
func (c *Controller) Run(ctx context.Context, clock Clock, tick time.Duration) {
	if len(c.rules) == 0 {
		return
	}
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
