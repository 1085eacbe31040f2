package lb

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// State is a backend's state as seen by selection.
type State uint32

// Backend states, from the most to the least available.
const (
	// Up takes new work and affinity traffic.
	Up State = iota
	// Draining takes affinity traffic only: an operator drained it, or its
	// health answer said "send no new requests" (HTTP 429, SIP 503 with
	// Retry-After).
	Draining
	// Down takes no new work: traffic showed it dead (passive ejection
	// holds it out for a cool-down), an operator disabled it, or active
	// health checks failed and no real request was answered since they
	// began to fail. Affinity traffic still reaches a backend that is down
	// by its probes alone; in the other cases its clients are re-pinned.
	Down
	// Unknown takes no new work yet: it was added at run time and neither
	// a probe nor a real answer has shown it serving. Affinity passes.
	Unknown
)

var stateNames = [...]string{"up", "draining", "down", "unknown"}

// String returns "up", "draining", "down" or "unknown".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// Result is the outcome of one forwarded request, reported with Release
// for passive health.
type Result uint8

// Results of a forwarded request.
const (
	// OK is any answer that says nothing bad about the backend (including
	// 4xx answers).
	OK Result = iota
	// ConnectError: the backend could not be reached (dial refused or
	// timed out, connection reset before an answer).
	ConnectError
	// Timeout: the backend accepted the request but did not answer in time.
	Timeout
	// ServerError: the backend answered 5xx.
	ServerError
	// Abandoned: the request was given up for reasons of our own (client
	// gone, memory state Critical); it does not count for or against the
	// backend.
	Abandoned
)

var resultNames = [...]string{"ok", "connect error", "timeout", "server error", "abandoned"}

// String returns "ok", "connect error", "timeout", "server error" or
// "abandoned".
func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("result(%d)", r)
}

// BackendConfig describes one backend.
type BackendConfig struct {
	// ID names the backend in affinity tokens, logs and /status. It must be
	// unique in its pool and stable across restarts so that sticky clients
	// keep their backend. Default: Addr.
	ID string
	// Addr is host:port.
	Addr string
	// Proto is "http" or "sip" (informational; shown in /status).
	Proto string
	// Weight is the relative share of new work for weighted policies, in
	// [1, MaxWeight]. Default 1.
	Weight int
	// MOP is the backend's memory overload protection, or nil for none.
	MOP *admission.MOP
	// TLS, when set, is how front ends and health checks speak TLS to
	// the backend (BackendSpec.ClientTLS); nil: plain TCP. It is not
	// changed after.
	TLS *tls.Config
	// Proxy is the PROXY protocol version (1 or 2) front ends write at
	// the start of each connection to the backend; 0: none
	// (BackendSpec.Proxy).
	Proxy uint8
}

// MaxWeight is the largest backend weight.
const MaxWeight = 1000

// Backend is one server behind the balancer. Its counters and state are
// atomics, so selection and the request path take no lock; a Backend must
// not be copied. Build it with NewBackend and hand it to NewPool, or let
// NewGeneration build it from its spec.
//
// A Backend may be a member of any number of pools: its health state, MOP
// and counters are one whatever the number of pools; what differs per
// pool (its position, the pool's panic) is kept by the Pool.
type Backend struct {
	id     string
	addr   string
	proto  string
	weight atomic.Int32 // in [1, MaxWeight]; set at run time by Pool.SetWeight
	// index is the backend's position in its generation (or in the first
	// pool that took it, without a generation), for front ends' per-backend
	// slices; -1 before either.
	index int
	mop   *admission.MOP
	tls   *tls.Config // nil: plain TCP
	proxy uint8       // PROXY protocol version written to it; 0: none

	outstanding atomic.Int64
	// ctr are the backend's counters, shared with the backend of the same
	// id and address in the generations before and after it (carryFrom),
	// so that they only grow while the process lives: a reload or a route
	// change does not reset them, and requests in flight on the old
	// generation still count.
	ctr *backendCounters

	// Health. Each source sets its own word; State combines them.
	drained   atomic.Bool  // operator drain
	disabled  atomic.Bool  // operator disable: down, affinity included
	probeDown atomic.Bool  // active health check says down
	probeFrom atomic.Int64 // monotonic ns: answers before this do not overrule the probes
	servedAt  atomic.Int64 // monotonic ns real traffic last got an answer from it
	unknown   atomic.Bool  // added at run time, not yet shown serving
	gone      atomic.Bool  // its address left DNS: drains until dropped
	// priority orders new work in its pools: lower first (SRV priority);
	// fixed when built.
	priority int
	announce atomic.Bool // added at run time, its taking new work not yet logged (health.go)
	// panicPools counts the pools of the backend in panic
	// (Pool.Panicking), kept by the health checker deciding it.
	panicPools atomic.Int32
	probeBusy  atomic.Bool            // active health check says "send no new requests" (HTTP 429)
	busyUntil  atomic.Int64           // no new work before this monotonic ns (health 429, SIP 503 Retry-After); -1 is "until cleared"
	ejectedAt  atomic.Int64           // passive ejection: down before this monotonic ns
	consecErr  atomic.Int32           // consecutive failures, for passive ejection
	ejectWhy   atomic.Int32           // the Result that ejected it last, for Reason
	probeErr   atomic.Pointer[string] // the failed probe that took it down, for Reason; nil when none

	// passive is the passive ejection of the backend's protocol, set once
	// by its generation (or NewPool) before it serves; nil disables it.
	passive *passiveConfig
}

// backendCounters are a backend's monotonic counters (Backend.ctr).
type backendCounters struct {
	requests atomic.Uint64 // forwarded, all classes
	failures atomic.Uint64 // Release with a result other than OK or Abandoned
}

type passiveConfig struct {
	maxFails int32
	cooldown int64
	onEject  func(b *Backend, r Result, until int64)
	// peers are the backends of the generation: traffic may eject at
	// most half of them (at least one), so an overload that makes every
	// backend slow (each failing its requests for a while) cannot take a
	// whole pool out and turn slow answers into refusals of everything
	// (Envoy's max_ejection_percent, with its "at least one host").
	peers []*Backend
}

// mayEject reports whether traffic may eject one more backend than those
// ejected at now.
func (p *passiveConfig) mayEject(b *Backend, now int64) bool {
	limit := max(len(p.peers)/2, 1)
	n := 0
	for _, o := range p.peers {
		if o != b && now < o.ejectedAt.Load() {
			n++
		}
	}
	return n < limit
}

// ErrBadBackend is wrapped by NewBackend and NewPool for an invalid backend.
var ErrBadBackend = errors.New("invalid backend")

// NewBackend validates cfg and returns a Backend in state Up.
func NewBackend(cfg BackendConfig) (*Backend, error) {
	if cfg.Addr == "" {
		return nil, fmt.Errorf("new backend: empty address: %w", ErrBadBackend)
	}
	if cfg.ID == "" {
		cfg.ID = cfg.Addr
	}
	if len(cfg.ID) > maxIDLen {
		return nil, fmt.Errorf("new backend %s: id longer than %d bytes: %w", cfg.ID, maxIDLen, ErrBadBackend)
	}
	if cfg.Weight == 0 {
		cfg.Weight = 1
	}
	if cfg.Weight < 1 || cfg.Weight > MaxWeight {
		return nil, fmt.Errorf("new backend %s: weight %d not in [1,%d]: %w", cfg.ID, cfg.Weight, MaxWeight, ErrBadBackend)
	}
	b := &Backend{id: cfg.ID, addr: cfg.Addr, proto: cfg.Proto, mop: cfg.MOP, tls: cfg.TLS, proxy: cfg.Proxy, index: -1, ctr: new(backendCounters)}
	b.weight.Store(int32(cfg.Weight))
	return b, nil
}

// ID returns the backend's id, the value carried in affinity tokens.
func (b *Backend) ID() string { return b.id }

// Addr returns host:port.
func (b *Backend) Addr() string { return b.addr }

// TLS returns the TLS configuration requests and health checks use to
// reach the backend, nil for plain TCP. Callers must not modify it; they
// may Clone it.
func (b *Backend) TLS() *tls.Config { return b.tls }

// Proxy returns the PROXY protocol version (1 or 2) to write at the start
// of each connection to the backend, 0 for none.
func (b *Backend) Proxy() uint8 { return b.proxy }

// Proto returns "http" or "sip".
func (b *Backend) Proto() string { return b.proto }

// Weight returns the backend's weight: the configured one until
// Pool.SetWeight changes it.
func (b *Backend) Weight() int { return int(b.weight.Load()) }

// Index returns the backend's position in its generation
// (Generation.Backends), or in the first pool that took it when it was
// built without a generation, so a front end can keep per-backend data (a
// connection pool) in a slice; -1 before either. It is not the position
// in a pool: a backend may be in several (Pool.IndexOf is that).
func (b *Backend) Index() int { return b.index }

// MOP returns the backend's limiter, possibly nil (which allows everything).
func (b *Backend) MOP() *admission.MOP { return b.mop }

// State returns the backend's state at now (monotonic ns): Down if
// disabled, passively ejected, or down by its probes with no real answer
// within the interval before the latest failed probe; Unknown if added at run time and not yet
// shown serving; Draining if drained or busy; else Up. It takes a few
// atomic loads.
func (b *Backend) State(now int64) State {
	if b.deadByTraffic(now) || b.downByProbes() {
		return Down
	}
	if b.unknown.Load() {
		return Unknown
	}
	if b.draining(now) {
		return Draining
	}
	return Up
}

// deadByTraffic: the operator took it out, or traffic showed it dead
// (passive ejection: refused connections, timeouts, requests unanswered).
func (b *Backend) deadByTraffic(now int64) bool {
	return b.disabled.Load() || now < b.ejectedAt.Load()
}

// downByProbes: the active check took it down and no real request was
// answered within the interval before its latest failed probe (the
// checker moves probeFrom on with each one). A backend that answers its
// traffic is not taken down by probes alone (a slow answer to GET /, a SIP
// answerer that ignores OPTIONS); one that stops answering is.
func (b *Backend) downByProbes() bool {
	if !b.probeDown.Load() {
		return false
	}
	at := b.servedAt.Load() // 0: never
	return at == 0 || at < b.probeFrom.Load()
}

func (b *Backend) draining(now int64) bool {
	if b.drained.Load() || b.probeBusy.Load() || b.gone.Load() {
		return true
	}
	u := b.busyUntil.Load()
	return u < 0 || now < u
}

// AcceptsNew reports whether the backend takes new work at now: Up, or
// down by its probes alone while one of its pools is in panic
// (Pool.Panicking). Selection in a pool asks the same with that pool's
// panic alone.
func (b *Backend) AcceptsNew(now int64) bool { return b.acceptsNew(now, b.panicPools.Load() > 0) }

// acceptsNew is AcceptsNew with the panic of the pool selecting.
func (b *Backend) acceptsNew(now int64, panicking bool) bool {
	switch b.State(now) {
	case Up:
		return true
	case Down:
		return panicking && !b.deadByTraffic(now) && !b.draining(now) && !b.unknown.Load()
	}
	return false
}

// AcceptsAffinity reports whether requests pinned to the backend may still
// go to it at now: unless an operator disabled it or traffic showed it
// dead (passive ejection). Active health checks alone never turn a
// dialog's or a session's requests away from a backend.
func (b *Backend) AcceptsAffinity(now int64) bool { return !b.deadByTraffic(now) }

// Served records that real traffic got an answer from the backend at now
// (any answer but a failure: Release with OK does it). It overrules a
// failing active check from then on, and ends Unknown.
func (b *Backend) Served(now int64) {
	if b.servedAt.Load() < now {
		b.servedAt.Store(now)
	}
	if b.unknown.Load() {
		b.unknown.Store(false)
	}
}

// AnsweredSince reports whether real traffic got an answer from the
// backend at or after t.
func (b *Backend) AnsweredSince(t int64) bool {
	at := b.servedAt.Load()
	return at != 0 && at >= t
}

// Acquire counts one request as outstanding on the backend. Every Acquire
// must be paired with one Release.
func (b *Backend) Acquire() {
	b.outstanding.Add(1)
	b.ctr.requests.Add(1)
}

// Release ends a request counted by Acquire and feeds passive health: with
// passive ejection on, MaxFails consecutive ConnectError, Timeout or
// ServerError results take the backend Down for the cool-down. OK resets
// the count; Abandoned leaves it alone.
//
// now must be the time the result became known (the end of the request),
// not its start: a timeout is charged when it fires, so an ejection it
// causes lasts its full cool-down from then, and a request that started
// before an ejection and fails after it extends it.
//
// An ejected backend stays on probation until a request succeeds: after
// the cool-down one more failure ejects it again at once, so a backend
// that still fails gets a trickle of new work rather than MaxFails
// requests per cool-down.
func (b *Backend) Release(now int64, r Result) {
	b.outstanding.Add(-1)
	switch r {
	case OK:
		b.Served(now)
		if b.consecErr.Load() != 0 {
			b.consecErr.Store(0)
		}
	case Abandoned:
	default:
		b.ctr.failures.Add(1)
		p := b.passive
		if p == nil {
			if r == ConnectError && b.downByProbes() {
				// Proof from the traffic itself, with passive ejection
				// off too: its affinity clients go elsewhere.
				b.ejectWhy.Store(int32(r))
				b.Eject(now, defaultCooldown)
			}
			return
		}
		// A refused connection to a backend its probes already call down
		// is proof enough: out at once, not after MaxFails.
		if n := b.consecErr.Add(1); n >= p.maxFails && (now < b.ejectedAt.Load() || p.mayEject(b, now)) || r == ConnectError && b.downByProbes() {
			b.consecErr.Store(p.maxFails - 1)
			until := now + p.cooldown
			prev := b.ejectedAt.Load()
			for until > prev && !b.ejectedAt.CompareAndSwap(prev, until) {
				prev = b.ejectedAt.Load()
			}
			b.ejectWhy.Store(int32(r))
			if now >= prev && p.onEject != nil {
				p.onEject(b, r, until)
			}
		}
	}
}

// Outstanding returns the number of requests in flight on the backend.
func (b *Backend) Outstanding() int64 { return b.outstanding.Load() }

// Drain stops (true) or resumes (false) new work to the backend; affinity
// traffic continues. It is the operator's switch.
func (b *Backend) Drain(on bool) { b.drained.Store(on) }

// Gone reports whether the backend's address left DNS (BackendSpec.Gone):
// it drains until the node drops it.
func (b *Backend) Gone() bool { return b.gone.Load() }

// Priority returns the backend's priority in its pools (BackendSpec.Priority):
// new work goes to the lowest first.
func (b *Backend) Priority() int { return b.priority }

// Drained reports whether the operator drained the backend.
func (b *Backend) Drained() bool { return b.drained.Load() }

// Disable takes the backend out entirely (true): it is Down, gets no new
// work and no affinity traffic (its clients are re-pinned), whatever its
// health checks say; false puts it back. It is the operator's switch for a
// backend being taken away.
func (b *Backend) Disable(on bool) { b.disabled.Store(on) }

// Disabled reports whether the operator disabled the backend.
func (b *Backend) Disabled() bool { return b.disabled.Load() }

// SetBusy makes the backend take no new work until the monotonic time
// until; until < 0 keeps it busy until ClearBusy. Affinity traffic
// continues. Unlike BackOff it may shorten a back-off and is not capped:
// it is kept for the front ends' tests and goes once they use BackOff.
func (b *Backend) SetBusy(until int64) { b.busyUntil.Store(until) }

// MaxAvoid bounds BackOff: a backend's Retry-After keeps it from new work
// for at most this long, so a typo (Retry-After: 86400) on one answer
// cannot take a backend out for a day. It is the one cap of every
// Retry-After back-off: HTTP's 429/503, SIP's 503 answers and health-ping
// 503s.
const MaxAvoid = 5 * time.Minute

// BackOff keeps new work away from the backend for d from now: the
// answer to a 429 or 503 with Retry-After (RFC 9110 §10.2.3, RFC 3261
// §21.5.4), whatever the protocol; d is capped at MaxAvoid. It never
// shortens a back-off under way (nor ends one set "until cleared" by
// SetBusy). Affinity traffic continues. It reports whether the backend
// was taking new work until now: a new back-off, worth a log line and an
// event; an extension is not.
func (b *Backend) BackOff(now int64, d time.Duration) (started bool) {
	if d <= 0 {
		return false
	}
	until := now + int64(min(d, MaxAvoid))
	for {
		cur := b.busyUntil.Load()
		if cur < 0 || cur >= until {
			return false
		}
		if b.busyUntil.CompareAndSwap(cur, until) {
			return cur <= now
		}
	}
}

// Avoid is BackOff under its former name; it goes once the front ends
// call BackOff.
func (b *Backend) Avoid(now int64, d time.Duration) bool { return b.BackOff(now, d) }

// BusyUntil returns the monotonic ns before which the backend takes no
// new work by a back-off (BackOff, SetBusy): 0 for none (or a deadline
// that is past when it is earlier than now), -1 for "until cleared". A
// reload carries it over to the backend's next generation.
func (b *Backend) BusyUntil() int64 { return b.busyUntil.Load() }

// ClearBusy ends a back-off (SetBusy or BackOff) at once.
func (b *Backend) ClearBusy() { b.busyUntil.Store(0) }

// SetProbeDown records the verdict of the active health check. A down
// verdict set this way holds whatever traffic shows (MarkProbeDown is the
// checker's, which real answers overrule).
func (b *Backend) SetProbeDown(down bool) {
	if down {
		b.MarkProbeDown(1<<63 - 1)
		return
	}
	b.probeDown.Store(false)
}

// MarkProbeDown records that the active check took the backend down: it
// is Down unless real traffic is answered at or after since (monotonic
// ns), which the checker moves on with every failed probe.
func (b *Backend) MarkProbeDown(since int64) {
	b.probeFrom.Store(since)
	b.probeDown.Store(true)
	b.unknown.Store(false)
}

// ProbeDownSince returns the time from which real answers overrule the
// probes, and whether it is down by its probes (to carry the verdict
// over to a backend that replaces it at a reload).
func (b *Backend) ProbeDownSince() (int64, bool) {
	return b.probeFrom.Load(), b.probeDown.Load()
}

// SetUnknown marks a backend added at run time (true): it takes no new
// work until a probe passes or real traffic is answered (Served). Call it
// before the backend serves.
func (b *Backend) SetUnknown(on bool) { b.unknown.Store(on); b.announce.Store(on) }

// SetProbeBusy records a health answer of "send no new requests" (OHI's
// 429): the backend drains new work while affinity continues. It is kept
// apart from SetBusy so that a health check clearing it does not cut short
// a Retry-After.
func (b *Backend) SetProbeBusy(busy bool) { b.probeBusy.Store(busy) }

// Eject takes the backend Down until now+d, as passive ejection does.
// Unlike passive ejection it sets the deadline as given, even if earlier.
func (b *Backend) Eject(now int64, d time.Duration) { b.ejectedAt.Store(now + int64(d)) }

// Reason says why the backend is not Up at now, in words for /status and
// `sluice ctl status`: who or what took it out or keeps new work from it
// (the operator, its traffic, its health checks with the probe's error,
// a Retry-After, its first probe still to come); "" when Up.
func (b *Backend) Reason(now int64) string {
	why := b.reason(now)
	// An address that left DNS goes away whatever else keeps it out: say
	// so beside a reason that comes first (its health checks, say).
	if b.gone.Load() && why != reasonGone {
		why += "; " + reasonGone
	}
	return why
}

// reasonGone is Reason's words for a backend whose address left DNS.
const reasonGone = "its address left DNS: drains (affinity and requests in flight finish, no new work) until it is dropped"

// reason is Reason but for the gone mark beside another cause.
func (b *Backend) reason(now int64) string {
	switch {
	case b.disabled.Load():
		return "disabled by the operator"
	case now < b.ejectedAt.Load():
		return fmt.Sprintf("ejected by its traffic (%s) for %s more", Result(b.ejectWhy.Load()), time.Duration(b.ejectedAt.Load()-now).Round(time.Second))
	case b.downByProbes():
		why := "down by its health checks, and no real answer since they failed"
		if e := b.probeErr.Load(); e != nil {
			why += ": " + *e
		}
		if b.panicPools.Load() > 0 && !b.draining(now) && !b.unknown.Load() {
			why += " (a pool of it is in panic, -health-panic: it gets new work there all the same)"
		}
		return why
	case b.unknown.Load():
		return "added by a reload: no new work until a health check passes or it answers traffic"
	case b.gone.Load():
		return reasonGone
	case b.drained.Load():
		return "drained by the operator"
	case b.probeBusy.Load():
		return "its health check answers 429"
	}
	if u := b.busyUntil.Load(); u < 0 {
		return "busy: no new work until cleared"
	} else if now < u {
		return fmt.Sprintf("busy: it asked for no new work (503 Retry-After) for %s more", time.Duration(u-now).Round(time.Second))
	}
	return ""
}

// BackendStatus is a point-in-time view of a backend for /status.
type BackendStatus struct {
	ID          string
	Proto       string
	Addr        string
	Weight      int
	State       State
	Reason      string // why it is not Up (Backend.Reason); "" when Up
	Outstanding int64
	Requests    uint64
	Failures    uint64
	MOP         admission.MOPStatus
}

// Status returns the backend's view at now.
func (b *Backend) Status(now int64) BackendStatus {
	return BackendStatus{
		ID:          b.id,
		Proto:       b.proto,
		Addr:        b.addr,
		Weight:      b.Weight(),
		State:       b.State(now),
		Reason:      b.Reason(now),
		Outstanding: b.outstanding.Load(),
		Requests:    b.ctr.requests.Load(),
		Failures:    b.ctr.failures.Load(),
		MOP:         b.mop.Status(),
	}
}

// LastProbeError is the error of the failed health check that took the
// backend down ("" when none did, or it has passed since): the cause
// behind a category such as "connect error" (a TLS backend whose
// certificate does not verify, say).
func (b *Backend) LastProbeError() string {
	if e := b.probeErr.Load(); e != nil {
		return *e
	}
	return ""
}

// setProbeErr keeps the error of the latest failed probe for Reason.
func (b *Backend) setProbeErr(err error) {
	if err == nil {
		b.probeErr.Store(nil)
		return
	}
	e := err.Error()
	b.probeErr.Store(&e)
}
