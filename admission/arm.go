package admission

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Action is what an ARM rule does with a request over its limit.
type Action uint8

// ARM rule actions.
const (
	ActionDelay  Action = iota // queue it until the rate falls below the limit
	ActionReject               // refuse it at once
	ActionLog                  // admit it, count it, and write an event (TDWM warning mode)
)

var actionNames = [...]string{"delay", "reject", "log"}

// String returns the action's flag spelling.
func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", a)
}

// ParseAction parses "delay", "reject" or "log".
func ParseAction(s string) (Action, error) {
	for i, n := range actionNames {
		if strings.EqualFold(s, n) {
			return Action(i), nil
		}
	}
	return 0, fmt.Errorf("unknown action %q (want delay, reject or log)", s)
}

// Match selects the requests a rule applies to. An empty field matches
// anything. Method and Host compare case-insensitively; PathPrefix is a
// byte prefix of the path; Pool is the name of the pool the request was
// routed to, compared exactly (pool names are lower case, see
// CheckPoolName), so a rule with a pool is a budget of that pool alone.
// An HTTP rule for GET also matches HEAD: servers run the GET handler for
// a HEAD (Tomcat's HttpServlet, Spring, Go's ServeMux) and only drop the
// body, so a HEAD costs the backend what the GET does, and a GET rule that
// let HEAD through could be bypassed at will.
type Match struct {
	Proto      string // "http" or "sip"
	Method     string
	Host       string
	PathPrefix string
	Pool       string // the routed pool's name (Request.Pool)
}

// Matches reports whether r falls under m. It allocates nothing.
func (m *Match) Matches(r *Request) bool {
	return (m.Proto == "" || m.Proto == r.Proto) &&
		(m.Pool == "" || m.Pool == r.Pool) &&
		(m.Method == "" || strings.EqualFold(m.Method, r.Method) ||
			r.Proto == "http" && strings.EqualFold(m.Method, "GET") && strings.EqualFold(r.Method, "HEAD")) &&
		(m.Host == "" || strings.EqualFold(m.Host, r.Host)) &&
		(m.PathPrefix == "" || strings.HasPrefix(r.Path, m.PathPrefix))
}

// MaxPoolName is the longest pool name CheckPoolName accepts.
const MaxPoolName = 64

// CheckPoolName reports whether name is a pool name: 1 to MaxPoolName
// characters out of a-z, 0-9, '_' and '-'. Pool names are compared
// exactly, so the grammar has no case to fold and nothing to trim. The
// error says what is wanted; the caller names the key and the value.
func CheckPoolName(name string) error {
	ok := name != "" && len(name) <= MaxPoolName
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		ok = 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-'
	}
	if !ok {
		return errBadPoolName
	}
	return nil
}

var errBadPoolName = fmt.Errorf("want a pool name: 1 to %d characters out of a-z, 0-9, _ and - (lower case)", MaxPoolName)

// RuleConfig is one ARM rule.
type RuleConfig struct {
	Name  string
	Match Match
	// Limit is the most admissions per Unit. Unit is one of time.Second,
	// time.Minute or time.Hour.
	Limit int64
	Unit  time.Duration
	// LowLimit and LowerLimit replace Limit in the Low and Lower (and
	// Critical) memory states; 0 keeps the base limit.
	LowLimit, LowerLimit int64
	// LowUnit and LowerUnit are accepted for compatibility with TDWM rule
	// definitions but ignored: a rule has one time unit. A value different
	// from Unit writes a config.warning event.
	LowUnit, LowerUnit time.Duration
	// Qualify lets the rate exceed the limit until it has stayed at or
	// over the limit this long; 0 throttles at once.
	Qualify time.Duration
	Action  Action
	// Queue bounds the delay queue (ActionDelay). Default 1000.
	Queue int
	// MaxWait bounds how long a request waits in the delay queue before it
	// is refused; 0 means no bound other than the queue's length.
	MaxWait time.Duration
}

// Validate reports the first invalid field.
func (c RuleConfig) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("arm rule needs a name")
	case c.Limit < 0 || c.LowLimit < 0 || c.LowerLimit < 0:
		return fmt.Errorf("arm rule %s: limits must not be negative", c.Name)
	case c.Limit >= 1<<31:
		return fmt.Errorf("arm rule %s: limit %d too large", c.Name, c.Limit)
	case c.Unit != time.Second && c.Unit != time.Minute && c.Unit != time.Hour:
		return fmt.Errorf("arm rule %s: unit must be second, minute or hour", c.Name)
	case c.Qualify < 0 || c.MaxWait < 0 || c.Queue < 0:
		return fmt.Errorf("arm rule %s: qualify, wait and queue must not be negative", c.Name)
	case c.Action > ActionLog:
		return fmt.Errorf("arm rule %s: unknown action", c.Name)
	}
	if c.Match.Pool != "" {
		if err := CheckPoolName(c.Match.Pool); err != nil {
			return fmt.Errorf("arm rule %s: pool %q: %w", c.Name, c.Match.Pool, err)
		}
	}
	return nil
}

// subIntervals is the number of sub-intervals a unit is split into (TDWM).
const subIntervals = 6

// Layout of Meter.word: busy flag, sub-interval epoch, count in it.
const (
	wordBusy  = 1 << 63
	epochBits = 31
	epochMask = 1<<epochBits - 1
	countMask = 1<<32 - 1
)

func pack(epoch int64, count uint64) uint64 {
	return uint64(epoch&epochMask)<<32 | count
}

// Meter is an ARM rule in force: an arrival rate meter over six
// sub-intervals of its unit with a delay queue.
//
// The fast path (rate under the limit, nobody queued) is a CAS on one word
// holding the current sub-interval's epoch and count, checked against the sum
// of the five before it, which the slow path publishes while it holds the word
// busy. So admissions never exceed the limit in any six consecutive
// sub-intervals, however many goroutines admit at once. Everything else
// (rotation, queueing, qualification, releases) runs under a mutex.
type Meter struct {
	cfg    RuleConfig
	sub    int64                   // sub-interval length, ns
	limits [numStates]atomic.Int64 // by memory state; Reconfigure changes them at run time
	events EventSink

	_      [64]byte      // keep the hot words off the cache line of cfg
	word   atomic.Uint64 // busy | epoch | count of the current sub-interval
	_      [56]byte
	prev   atomic.Int64 // sum of the five sub-intervals before the current one
	queued atomic.Int64 // delay queue length, read by the fast path
	// reachedAt is when the rate last reached the limit, or -1: the start
	// of the qualification time.
	reachedAt atomic.Int64
	// lease, when set, makes the meter spend a budget leased from elsewhere
	// (see Lease); nil is a standalone node.
	lease atomic.Pointer[Lease]

	shards   shards        // parked reservations of the fast path
	counted  atomic.Uint64 // admissions of past sub-intervals, set at rotation
	released atomic.Uint64 // admitted from the queue
	delayed  atomic.Uint64
	refused  atomic.Uint64
	over     atomic.Uint64 // action=log: admitted over the limit

	mu        sync.Mutex
	epoch     int64 // current sub-interval (full width)
	ring      [subIntervals]int64
	ringEpoch [subIntervals]int64
	queue     []*Wait // FIFO; head at queue[0]
	engaged   bool
	refusing  bool // a refusal event was written during this engagement
	// underSince is when an engaged rule's rate went under its limit, or
	// -1. The rule is released (and says so) only after a whole unit
	// under it: a rule held at its limit dips under at every sub-interval
	// boundary, and an event per dip would flood the event log.
	underSince int64
	state      MemState // memory state seen by the last decision
}

// NewMeter validates cfg and returns a meter starting empty at now.
func NewMeter(cfg RuleConfig, now int64, events EventSink) (*Meter, error) {
	if cfg.Queue == 0 {
		cfg.Queue = 1000
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Meter{cfg: cfg, sub: int64(cfg.Unit) / subIntervals, events: events, underSince: -1}
	m.reachedAt.Store(-1)
	for _, u := range []struct {
		unit  time.Duration
		state string
	}{{cfg.LowUnit, "low"}, {cfg.LowerUnit, "lower"}} {
		if u.unit != 0 && u.unit != cfg.Unit {
			events.emit(EventConfigWarning, cfg.Name, fmt.Sprintf(
				"arm rule %s: time unit %s given for the %s state is ignored; the rule's unit %s is used",
				cfg.Name, u.unit, u.state, cfg.Unit))
		}
	}
	m.setLimits(cfg)
	m.epoch = now / m.sub
	for i := range m.ringEpoch {
		m.ringEpoch[i] = -1 << 62
	}
	m.word.Store(pack(m.epoch, 0))
	return m, nil
}

// setLimits publishes cfg's limit of each memory state.
func (m *Meter) setLimits(cfg RuleConfig) {
	lim := [numStates]int64{cfg.Limit, cfg.Limit, cfg.Limit, cfg.Limit}
	if cfg.LowLimit > 0 {
		lim[Low], lim[Lower], lim[Critical] = cfg.LowLimit, cfg.LowLimit, cfg.LowLimit
	}
	if cfg.LowerLimit > 0 {
		lim[Lower], lim[Critical] = cfg.LowerLimit, cfg.LowerLimit
	}
	for i := range lim {
		m.limits[i].Store(lim[i])
	}
}

// limit is the rule's limit in force in state.
func (m *Meter) limit(state MemState) int64 { return m.limits[state].Load() }

// Config returns the rule as in force (after any Reconfigure).
func (m *Meter) Config() RuleConfig {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfg
}

// Reconfigurable reports whether Reconfigure can change the meter from its
// rule to cfg in place: only the limits, the action, the queue length and
// the maximum wait differ. The name, the match, the unit and the
// qualification time are read without the meter's lock, so a change of
// any of them needs a new meter.
func (m *Meter) Reconfigurable(cfg RuleConfig) bool {
	// Name, Match, Unit and Qualify never change after NewMeter: read
	// field by field, apart from the ones Reconfigure writes.
	return cfg.Name == m.cfg.Name && cfg.Match == m.cfg.Match && cfg.Unit == m.cfg.Unit && cfg.Qualify == m.cfg.Qualify
}

// Reconfigure changes the limits, action, queue length and maximum wait of
// the rule in force, keeping its counters and the rate it has metered, so
// the next decision uses the new values. A rising limit releases queued
// requests at the next Advance; a falling one holds new work until the rate
// is under it. It returns an error, changing nothing, when cfg is invalid
// or not Reconfigurable.
func (m *Meter) Reconfigure(cfg RuleConfig) error {
	if cfg.Queue == 0 {
		cfg.Queue = 1000
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if !m.Reconfigurable(cfg) {
		return fmt.Errorf("arm rule %s: only limit, low, lower, action, queue and wait change in place", m.cfg.Name)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cfg.Limit, m.cfg.LowLimit, m.cfg.LowerLimit = cfg.Limit, cfg.LowLimit, cfg.LowerLimit
	m.cfg.LowUnit, m.cfg.LowerUnit = cfg.LowUnit, cfg.LowerUnit
	m.cfg.Action, m.cfg.Queue, m.cfg.MaxWait = cfg.Action, cfg.Queue, cfg.MaxWait
	m.setLimits(cfg)
	return nil
}

// retire admits every request still queued: the rule was removed, so its
// limit no longer holds them back.
func (m *Meter) retire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.queue) > 0 {
		w := m.queue[0]
		m.popLocked()
		if w.finish(waitAdmitted) {
			m.released.Add(1)
		}
	}
}

// Name returns the rule's name.
func (m *Meter) Name() string { return m.cfg.Name }

// SetLease attaches a lease (the meter then spends its tokens as well as
// counting locally) or, with nil, makes the meter standalone again.
func (m *Meter) SetLease(l *Lease) { m.lease.Store(l) }

// Lease returns the attached lease, or nil.
func (m *Meter) Lease() *Lease { return m.lease.Load() }

// LimitIn returns the rule's base limit in state (per unit, before any
// lease divisor).
func (m *Meter) LimitIn(state MemState) int64 { return m.limit(state) }

// SubInterval returns the length of one of the six sub-intervals.
func (m *Meter) SubInterval() time.Duration { return time.Duration(m.sub) }

// limitInForce is the limit this node applies in state: the rule's limit,
// divided by the lease's divisor when a lease in LeaseLocal mode is
// attached.
func (m *Meter) limitInForce(state MemState) int64 {
	lim := m.limit(state)
	if l := m.lease.Load(); l != nil && l.mode.Load() == LeaseLocal {
		if d := l.divisor.Load(); d > 1 {
			lim /= d
			if lim < 1 {
				lim = 1
			}
		}
	}
	return lim
}

// leaseShared returns the attached lease if decisions spend its tokens.
func (m *Meter) leaseShared() *Lease {
	if l := m.lease.Load(); l != nil {
		if md := l.mode.Load(); md == LeaseShared || md == LeaseClosed {
			return l
		}
	}
	return nil
}

// Admit decides one request at now while the node is in state. It returns
// Admit, Delay (with a Wait to block on) or Refuse.
func (m *Meter) Admit(now int64, state MemState) Decision {
	if l := m.lease.Load(); l != nil {
		l.note(state)
		if md := l.mode.Load(); md == LeaseShared || md == LeaseClosed {
			return m.admitLeased(now, state, l)
		}
	}
	e := (now / m.sub) & epochMask
	sh := m.shards.pick()
	if m.queued.Load() == 0 && sh.take(uint32(e)) {
		return Decision{Verdict: Admit}
	}
	lim := m.limitInForce(state)
	for {
		w := m.word.Load()
		if w&wordBusy != 0 || int64(w>>32)&epochMask != e || m.queued.Load() != 0 {
			break
		}
		rate := m.prev.Load() + int64(w&countMask)
		if rate >= lim {
			break
		}
		n := batchFor(lim - rate)
		if m.word.CompareAndSwap(w, w+uint64(n)) {
			if rate+n >= lim && m.cfg.Qualify > 0 {
				m.reachedAt.CompareAndSwap(-1, now)
			}
			if n > 1 {
				if lost := sh.park(uint32(e), uint64(n-1)); lost > 0 {
					m.giveBack(e, lost)
				}
			}
			return Decision{Verdict: Admit}
		}
	}
	return m.admitSlow(now, state)
}

// admitLeased is the fast path with a shared budget: one token from the
// lease and one count in the local word, both by CAS. Queued requests are
// served first (by Advance), so a decision takes a token only when nobody
// waits. Without a token it asks the leaser and waits at most the lease's
// budget, then falls to the slow path where the rule's action applies.
func (m *Meter) admitLeased(now int64, state MemState, l *Lease) Decision {
	if m.queued.Load() != 0 {
		return m.admitSlow(now, state)
	}
	gen, ok := l.take(now)
	if !ok && l.awaitRefill(now) {
		now = l.refreshed(now)
		gen, ok = l.take(now)
	}
	if !ok {
		return m.admitSlow(now, state)
	}
	e := (now / m.sub) & epochMask
	lim := m.limit(state)
	for {
		w := m.word.Load()
		if w&wordBusy != 0 || int64(w>>32)&epochMask != e || m.prev.Load()+int64(w&countMask) >= lim {
			break
		}
		if m.word.CompareAndSwap(w, w+1) {
			return Decision{Verdict: Admit}
		}
	}
	l.putBack(gen) // not spent: the slow path takes one again
	return m.admitSlow(now, state)
}

// giveBack returns n reserved admissions of epoch e that were displaced
// from a shard, if the sub-interval is still current.
func (m *Meter) giveBack(e int64, n uint64) {
	for {
		w := m.word.Load()
		if w&wordBusy != 0 || int64(w>>32)&epochMask != e || w&countMask < n {
			return // rotated meanwhile: they stay counted, a conservative error
		}
		if m.word.CompareAndSwap(w, w-n) {
			return
		}
	}
}

func (m *Meter) admitSlow(now int64, state MemState) Decision {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.state = state
	m.advanceLocked(now)
	lim := m.limitInForce(state)
	if len(m.queue) == 0 && m.tryCountLocked(now, lim) {
		return Decision{Verdict: Admit}
	}
	// At or over the limit, or others are waiting.
	m.reachedAt.CompareAndSwap(-1, now)
	m.underSince = -1
	if !m.engaged {
		m.engaged = true
		kind, verb := EventARMEngaged, m.cfg.Action.String()
		if m.cfg.Action == ActionLog {
			kind, verb = EventARMWouldLimit, "log only"
		}
		m.events.emit(kind, m.cfg.Name, fmt.Sprintf("%s reached its limit %d/%s (%s)", m.label(), lim, UnitName(m.cfg.Unit), verb))
	}
	if m.cfg.Action == ActionLog || (m.cfg.Qualify > 0 && now-m.reachedAt.Load() < int64(m.cfg.Qualify)) {
		m.word.Add(1) // we hold mu and the word is not busy: counted over the limit
		m.over.Add(1)
		return Decision{Verdict: Admit}
	}
	retry := m.retryAfterLocked(now)
	if m.cfg.Action == ActionReject || len(m.queue) >= m.cfg.Queue {
		m.refused.Add(1)
		why := "over the limit"
		if m.cfg.Action == ActionDelay {
			why = "over the limit and the delay queue is full"
		}
		m.noteRefusalLocked(why)
		return Decision{Verdict: Refuse, Reason: ReasonARM, RetryAfter: retry}
	}
	w := &Wait{m: m, done: make(chan struct{}), deadline: -1}
	if m.cfg.MaxWait > 0 {
		w.deadline = now + int64(m.cfg.MaxWait)
	}
	m.queue = append(m.queue, w)
	m.queued.Store(int64(len(m.queue)))
	m.delayed.Add(1)
	return Decision{Verdict: Delay, Reason: ReasonARM, RetryAfter: retry, Wait: w}
}

// tryCountLocked counts one admission in the current sub-interval if the
// rate is under lim and, with a shared lease, a token is left. The caller
// holds mu, so the word is not busy.
func (m *Meter) tryCountLocked(now, lim int64) bool {
	l := m.leaseShared()
	var gen uint64
	if l != nil {
		var ok bool
		if gen, ok = l.take(now); !ok {
			return false
		}
	}
	for {
		w := m.word.Load()
		rate := m.prev.Load() + int64(w&countMask)
		if rate >= lim {
			if l != nil {
				l.putBack(gen)
			}
			return false
		}
		if m.word.CompareAndSwap(w, w+1) {
			if rate+1 == lim {
				m.reachedAt.CompareAndSwap(-1, now)
			}
			return true
		}
	}
}

// Advance moves the meter to now: expired sub-intervals leave the rate,
// queued requests are released oldest first while the rate is under the
// limit, and those waiting past MaxWait are refused. A ticker calls it in
// production; tests call it with an injected clock. It returns how many
// requests it released.
func (m *Meter) Advance(now int64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.advanceLocked(now)
}

func (m *Meter) advanceLocked(now int64) int {
	e := now / m.sub
	if e > m.epoch {
		m.rotateLocked(e)
	}
	lim := m.limitInForce(m.state)
	released := 0
	for len(m.queue) > 0 {
		w := m.queue[0]
		if w.result.Load() == waitPending && !m.tryCountLocked(now, lim) {
			break
		}
		m.popLocked()
		if w.finish(waitAdmitted) {
			released++
			m.released.Add(1)
		} else if w.result.Load() == waitCanceled {
			m.word.Add(^uint64(0)) // canceled after its slot was counted: give it back
		}
	}
	for len(m.queue) > 0 { // time out the oldest waiters; deadlines are in queue order
		w := m.queue[0]
		if w.result.Load() == waitPending && (w.deadline < 0 || now < w.deadline) {
			break
		}
		m.popLocked()
		w.retryAfter = m.retryAfterLocked(now) // written before done is closed
		if w.finish(waitTimedOut) {
			m.refused.Add(1)
			m.noteRefusalLocked("a delayed request waited past its maximum wait")
		}
	}
	rate := m.prev.Load() + int64(m.word.Load()&countMask)
	// With a shared budget the rule is under its limit while tokens are left.
	if l := m.leaseShared(); l != nil && l.Tokens() <= 0 {
		rate = lim
	}
	if rate < lim && len(m.queue) == 0 {
		m.reachedAt.Store(-1)
		if m.engaged {
			if m.underSince < 0 {
				m.underSince = now
			}
			if now-m.underSince >= int64(m.cfg.Unit) {
				m.engaged, m.refusing, m.underSince = false, false, -1
				m.events.emit(EventARMReleased, m.cfg.Name, fmt.Sprintf("%s is under its limit again (rate %d of %d)", m.label(), rate, lim))
			}
		}
	} else {
		m.underSince = -1
	}
	return released
}

// noteRefusalLocked writes one arm.refusing event per engagement, so a
// refusing rule is visible in the event log without an event per request.
func (m *Meter) noteRefusalLocked(why string) {
	if m.refusing {
		return
	}
	m.refusing = true
	m.events.emit(EventARMRefusing, m.cfg.Name, fmt.Sprintf("%s is refusing requests: %s", m.label(), why))
}

// label names the rule in events: "arm rule NAME", with " pool POOL" for
// a rule that budgets one pool, the words a refusal's Detail uses.
func (m *Meter) label() string {
	if m.cfg.Match.Pool != "" {
		return "arm rule " + m.cfg.Name + " pool " + m.cfg.Match.Pool
	}
	return "arm rule " + m.cfg.Name
}

func (m *Meter) popLocked() {
	m.queue[0] = nil
	m.queue = m.queue[1:]
	m.queued.Store(int64(len(m.queue)))
}

// rotateLocked moves the current sub-interval to epoch e. It marks the word
// busy first, so a fast-path CAS that read the old sums fails.
func (m *Meter) rotateLocked(e int64) {
	var w uint64
	for {
		w = m.word.Load()
		if m.word.CompareAndSwap(w, w|wordBusy) {
			break
		}
	}
	// Reservations parked in shards and not used are not admissions.
	unused := m.shards.drain(uint32(m.epoch & epochMask))
	i := m.epoch % subIntervals
	m.ring[i], m.ringEpoch[i] = int64(w&countMask)-int64(unused), m.epoch
	m.counted.Add(uint64(m.ring[i]))
	var sum int64
	for j := range m.ring {
		if m.ringEpoch[j] > e-subIntervals && m.ringEpoch[j] < e {
			sum += m.ring[j]
		}
	}
	m.epoch = e
	m.prev.Store(sum)
	m.word.Store(pack(e, 0))
}

// retryAfterLocked is the time until the oldest counted sub-interval expires.
func (m *Meter) retryAfterLocked(now int64) time.Duration {
	oldest := m.epoch
	for j := range m.ring {
		if ep := m.ringEpoch[j]; ep > m.epoch-subIntervals && ep < oldest && m.ring[j] > 0 {
			oldest = ep
		}
	}
	d := (oldest+subIntervals)*m.sub - now
	if d < 0 {
		d = 0
	}
	return time.Duration(d)
}

// RuleStatus is a point-in-time view of a rule for /status and metrics.
type RuleStatus struct {
	Name     string
	Rate     int64 // admissions in the current six sub-intervals
	Limit    int64 // base limit per unit
	Unit     time.Duration
	Queued   int64
	Admitted uint64 // admitted at once, including over the limit while qualifying or logging
	Released uint64 // admitted after a delay
	Delayed  uint64
	Refused  uint64
	Over     uint64 // admitted over the limit by an action=log rule or while qualifying
}

// Status returns the rule's counters. Rate is as of the last decision or
// Advance, and includes admissions reserved on the fast path and not yet used.
func (m *Meter) Status() RuleStatus {
	cur := m.word.Load() & countMask
	return RuleStatus{
		Name:     m.cfg.Name,
		Rate:     m.prev.Load() + int64(m.word.Load()&countMask),
		Limit:    m.limit(Normal),
		Unit:     m.cfg.Unit,
		Queued:   m.queued.Load(),
		Admitted: m.counted.Load() + cur - m.released.Load(),
		Released: m.released.Load(),
		Delayed:  m.delayed.Load(),
		Refused:  m.refused.Load(),
		Over:     m.over.Load(),
	}
}

// UnitName spells a rule's unit as in the -arm grammar: "s", "min" or "h".
func UnitName(u time.Duration) string {
	switch u {
	case time.Second:
		return "s"
	case time.Minute:
		return "min"
	case time.Hour:
		return "h"
	}
	return u.String()
}

// Results a Wait ends with.
const (
	waitPending uint32 = iota
	waitAdmitted
	waitTimedOut
	waitCanceled
)

// Wait is a request in a rule's delay queue. Done is closed when it is
// released (Admitted reports true) or refused because its wait ran out.
// Cancel takes it out of the queue when the caller gives up.
type Wait struct {
	m          *Meter
	done       chan struct{}
	result     atomic.Uint32
	deadline   int64
	retryAfter time.Duration
}

// finish ends the wait with r unless it has already ended.
func (w *Wait) finish(r uint32) bool {
	if !w.result.CompareAndSwap(waitPending, r) {
		return false
	}
	close(w.done)
	return true
}

// Done is closed when the wait ends.
func (w *Wait) Done() <-chan struct{} { return w.done }

// Admitted reports whether the request was released into the system.
func (w *Wait) Admitted() bool { return w.result.Load() == waitAdmitted }

// RetryAfter is the hint for a request whose wait ran out.
func (w *Wait) RetryAfter() time.Duration {
	if w.result.Load() != waitTimedOut {
		return 0
	}
	<-w.done
	return w.retryAfter
}

// Cancel withdraws a request that is still waiting. It reports false if the
// wait had already ended (then Admitted tells how).
func (w *Wait) Cancel() bool {
	if !w.finish(waitCanceled) {
		return false
	}
	w.m.mu.Lock()
	for i, q := range w.m.queue {
		if q == w {
			w.m.queue = append(w.m.queue[:i], w.m.queue[i+1:]...)
			w.m.queued.Store(int64(len(w.m.queue)))
			break
		}
	}
	w.m.mu.Unlock()
	return true
}
