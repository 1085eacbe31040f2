package http

// The request pipeline, once for both engines. An engine reads a request
// head into a fasthttp.RequestHeader and then goes down these steps; it
// does the I/O in between (sending, relaying, answering) and nothing else:
//
//	admit       classify (affinity or new work) and ask admission
//	waitDelay   an ARM delay: block until the rule's queue releases it
//	pick        answer a refusal, or choose the backend (new work)
//	            prepareRequest (rewrite.go), then the engine sends
//	retryElsewhere  after a failure before a byte was sent: another backend
//	endedByCritical the answer arrives: new work under Critical gets 503
//	            prepareResponse (rewrite.go), then the engine relays
//	releaseBackend, observe: the backend's count and the latency, once
//
// Answers sluice makes itself are written into a fasthttp.Response by
// refuse.go's functions; the engine sends that response its own way.

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// plan is one request's way through the pipeline, whichever engine serves
// it. An engine keeps it for the life of the request (the fasthttp engine
// on the handler's stack, the loop in the client connection's exchange).
type plan struct {
	set      *backendSet  // loaded once: a SetGeneration during the request does not mix two sets
	ref      *poolRef     // the pool it is in: its session's, else the route's; nil: no route and no default pool
	b        *lb.Backend  // where it goes; nil until affinity or pick names one
	strip    string       // the matching route's strip=, when the request goes to that route's pool
	bad      routeRefusal // the routes could not choose: pick answers 400 or 414
	class    admission.Class
	key      uint64      // consistent-hash key (new work; 0 for other policies)
	start    int64       // admission clock when the request began
	renew    bool        // the answer sets the sticky cookie
	repinned bool        // a valid pin named a backend that is down
	idem     bool        // the method may be sent twice (resendable: GET, HEAD)
	retried  bool        // moved to another backend once already
	acquired bool        // b.Acquire was called: releaseBackend is due
	observed bool        // ObserveForward was called
	secure   bool        // the client came over TLS (X-Forwarded-Proto https, a Secure sticky cookie)
	route    int         // 1 + the index of the route that gave the pool; 0: none (the access log)
	prev     *lb.Backend // the backend a retry moved the request from
}

// reqView is the normalised view of a request head that routes and ARM
// rules match on: the host as matchHost gives it and the path as
// matchPath gives it (nil when nothing looks at paths). Both are copied
// into buffers the view keeps, so the view stays right while the head is
// rewritten (strip=) and, warm, costs no allocation. An engine keeps one
// per request in flight (the fasthttp engine from a pool, the loop one
// per loop, filled again from the client's bytes before a retry).
type reqView struct {
	host, path []byte // views of hbuf and pbuf
	hbuf, pbuf []byte
	tbuf       []byte // the target a strip= writes
}

// fill sets v from h; needPath says whether a route or an ARM rule
// looks at the path.
func (v *reqView) fill(h *fasthttp.RequestHeader, needPath bool) {
	v.host = append(v.hbuf[:0], matchHost(v.hbuf[:0], h.Host())...)
	v.hbuf = v.host[:0]
	v.path = nil
	if needPath {
		// matchPath writes into pbuf only when the target is not in normal
		// form; a view of the head is copied, so the path stays once the
		// head is rewritten.
		uri := h.RequestURI()
		if cap(v.pbuf) < len(uri) {
			// matchPath's output never outgrows its input: one buffer of
			// the longest target so far, kept, so that a target not in
			// normal form costs no allocation once warm.
			v.pbuf = make([]byte, 0, len(uri))
		}
		p := matchPath(v.pbuf[:0], uri)
		if cap(v.pbuf) == 0 || unsafe.SliceData(p) != unsafe.SliceData(v.pbuf[:1]) {
			p = append(v.pbuf[:0], p...)
		}
		v.path = p
		v.pbuf = v.path[:0]
	}
}

// needPath reports whether a request served by set needs its path
// normalised: an ARM rule or a route looks at it.
func (s *Server) needPath(set *backendSet) bool { return set.needPath || s.rules().needPath }

// admit starts p for the request whose head is h and asks admission about
// it. The request is routed first (the first matching route's pool, else
// the default pool); then affinity (a valid pin to a backend that takes
// affinity, in a pool the routes send this request to: see affinity)
// skips the guards, and new work goes through them with the routed pool
// as admission's Request.Pool. A request no route takes, with no default
// pool and no session, and one the routes cannot read (routeRequest's
// refusals) get a refusal without asking admission: pick answers it. v
// is filled with the request's normalised host and path. The returned
// request views v's and h's bytes: use it before they change, or clone
// it.
func (s *Server) admit(p *plan, h *fasthttp.RequestHeader, v *reqView, now int64) (admission.Request, admission.Decision) {
	set := s.backends.Load()
	v.fill(h, s.needPath(set))
	*p = plan{set: set, start: now, idem: resendable(h.Method()), secure: p.secure} // the engine set secure
	rq := routedReq{h: h, v: v}
	if v.path != nil {
		if raw := rawPath(h.RequestURI()); raw != nil && string(raw) != string(v.path) {
			rq.raw = raw
		}
	}
	routed, route, bad := set.routeRequest(&rq)
	if bad != routeOK {
		p.bad = bad
		s.stats.BadRequest.Add(1)
		return admission.Request{}, admission.Decision{Verdict: admission.Refuse, Rule: -1}
	}
	b, ref, renew, repinned := s.affinity(&rq, set, routed, now)
	switch {
	case b != nil:
		p.b, p.ref, p.renew, p.class = b, ref, renew, admission.Affinity
	case routed == nil:
		p.repinned = repinned
		s.stats.NoRoute.Add(1)
		return admission.Request{}, admission.Decision{Verdict: admission.Refuse, Rule: -1}
	default:
		p.ref, p.repinned = routed, repinned
	}
	if route >= 0 && p.ref == routed {
		// A hit is the route's pool getting the request, not a session
		// kept in another pool.
		set.routes.CountHit(route)
		p.strip = set.strips[route]
		p.route = route + 1
	}
	r := admissionRequest(p.class, h, v, p.ref.tag)
	return r, s.ctrl.Decide(now, &r, nil)
}

// routeRefusal is why the routes cannot choose a pool for a request:
// pick answers it instead of routing it.
type routeRefusal uint8

const (
	routeOK        routeRefusal = iota
	routeAmbiguous              // the raw and the normalized path select different routes: 400
	routeDupHeader              // a header a route tests is sent twice: 400
	routeLongPath               // a regex route would test a path over lb.MaxRouteRegexInput: 414
)

// routeRequest returns the pool new work r describes goes to and the
// route that chose it: the first matching route, else the default pool
// with route -1; nil and -1 when neither. It refuses (routeRefusal) a
// request whose pool the routes cannot tell for sure:
//
//   - a header a route tests sent more than once: a route and the backend
//     could read different lines (the first, the last, the two joined);
//   - a path that a regex route would test longer than
//     lb.MaxRouteRegexInput (the cost of regex routes grows with it);
//   - a target whose raw path (as received, which a backend without
//     sluice's normalization serves) and normalized path (what routes
//     match) select different routes, or one a route and the other none:
//     "/internal/x/..;/..;/api/y" is /api/y to the routes and
//     /internal/... to most servers. A path routes agree on, such as
//     /static/a;jsessionid=1 under path=/static/, passes untouched.
//
// It allocates nothing.
func (set *backendSet) routeRequest(r *routedReq) (*poolRef, int, routeRefusal) {
	if set.routes == nil {
		return set.def, -1, routeOK
	}
	in := lb.RouteInput{Host: r.v.host, Path: r.v.path}
	if set.needMethod {
		in.Method = r.h.Method()
	}
	for i, name := range set.hdrNames {
		v, dup := peekOnce(r.h, name)
		if dup {
			return nil, -1, routeDupHeader
		}
		in.Headers[i] = v
	}
	if set.hasRegex && (len(in.Path) > lb.MaxRouteRegexInput || len(r.raw) > lb.MaxRouteRegexInput) {
		return nil, -1, routeLongPath
	}
	i := set.routes.Select(&in)
	if set.testsPath && r.raw != nil {
		in.Path = r.raw
		if set.routes.Select(&in) != i {
			return nil, -1, routeAmbiguous
		}
	}
	if i >= 0 {
		return set.routePools[i], i, routeOK
	}
	return set.def, -1, routeOK
}

// peekOnce returns the value of header name in h (nil when absent) and
// whether it is there more than once. It allocates nothing once warm
// (fasthttp keeps the list it returns).
func peekOnce(h *fasthttp.RequestHeader, name string) (v []byte, dup bool) {
	switch all := h.PeekAll(name); len(all) {
	case 0:
		return nil, false
	case 1:
		return all[0], false
	}
	return nil, true
}

// rawPath is the path of an origin-form target as received, without the
// query; nil for another form (absolute, authority, asterisk).
func rawPath(target []byte) []byte {
	if len(target) == 0 || target[0] != '/' {
		return nil
	}
	if i := bytes.IndexByte(target, '?'); i >= 0 {
		return target[:i]
	}
	return target
}

// admissionRequest is what admission sees of a request: plain values that
// view h's and v's bytes without copying (Decide keeps no reference); pool
// is the pool's own name, which outlives the request.
func admissionRequest(class admission.Class, h *fasthttp.RequestHeader, v *reqView, pool string) admission.Request {
	return admission.Request{Class: class, Proto: "http", Method: b2s(h.Method()), Host: b2s(v.host), Path: b2s(v.path), Pool: pool}
}

// waitDelay blocks on a delayed decision until it is an admission or a
// refusal (see wait). It runs off the loop's goroutine on the loop engine.
// gone is closed when the client leaves meanwhile: its request leaves the
// queue at once, refused (nil when the engine cannot tell). One source
// holds at most an eighth of the delaying rule's queue (at least one
// slot; -http-trusted-proxy addresses excepted): a request over its
// share is refused at once, as if the queue were full.
func (s *Server) waitDelay(done, gone <-chan struct{}, ip netip.Addr, r *admission.Request, d admission.Decision) admission.Decision {
	if d.Verdict != admission.Delay {
		return d
	}
	if !s.delayed.take(ip, s.delayShare(d)) {
		s.stats.DelayLimited.Add(1)
		d.Wait.Cancel()
		<-d.Wait.Done()
		return s.ctrl.Resume(s.clock.Now(), r, d, nil)
	}
	defer s.delayed.release(ip)
	for d.Verdict == admission.Delay {
		d = s.wait(done, gone, r, d)
	}
	return d
}

// delayShare is the most requests one source may have in the queue of
// the rule that delayed d: an eighth of it, at least 1.
func (s *Server) delayShare(d admission.Decision) int {
	q := 1000 // admission's default queue
	if rules := s.ctrl.Rules(); d.Rule >= 0 && int(d.Rule) < len(rules) {
		q = rules[d.Rule].Config().Queue
	}
	return max(1, q/8)
}

// pick goes on from a decision that is not a delay. It returns true when
// the request is to be sent to p.b: the pinned backend for affinity, else
// one the pool picks (trying the next when MOP refuses). It returns false
// when the request is refused; resp then holds the answer (admission's
// refusal, MOP on every backend, or no backend up).
func (s *Server) pick(p *plan, resp *fasthttp.Response, r *admission.Request, d admission.Decision, h *fasthttp.RequestHeader, ip netip.Addr) bool {
	if p.bad != routeOK {
		s.writeRouteRefusal(resp, p.bad)
		return false
	}
	if p.ref == nil {
		s.writeNoRoute(resp)
		return false
	}
	if d.Verdict == admission.Refuse {
		s.refuseDecision(resp, p.ref, d)
		return false
	}
	if p.b != nil {
		return true
	}
	p.key = p.ref.key(h, ip)
	b, out, retry := p.ref.pool.Pick(p.start, p.key, nil)
	switch out {
	case lb.NoBackend:
		if p.ref.pool.DrainedByOperator(p.start) {
			// The operator's doing, not a failure: said and counted so.
			p.ref.stats.Refused[admission.ReasonDraining].Add(1)
			s.writeRefusal(resp, fasthttp.StatusServiceUnavailable, s.cfg.RetryAfterNoBackend, p.ref.psDrained, "pool drained")
			return false
		}
		p.ref.stats.NoBackend.Add(1)
		s.writeRefusal(resp, fasthttp.StatusServiceUnavailable, s.cfg.RetryAfterNoBackend, psNoBackend, "no backend available")
		return false
	case lb.MOPRefused:
		s.refuseDecision(resp, p.ref, s.ctrl.RefuseMOPFor(r, retry))
		return false
	}
	p.b, p.renew = b, s.sticky != nil
	if p.repinned {
		s.stats.Repinned.Add(1)
	}
	return true
}

// acquireBackend counts the request on p.b, once per backend it goes to.
func (p *plan) acquireBackend() {
	if !p.acquired {
		p.b.Acquire()
		p.acquired = true
	}
}

// releaseBackend ends p.b's count of the request with its result, once.
// now is the time the result is known (the request's end): a timeout is
// charged when it fires, so the passive ejection it causes lasts its whole
// cool-down from then (charged at the request's start, a 10 s cool-down
// had expired by the time a 30 s timeout landed).
func (p *plan) releaseBackend(now int64, res lb.Result) {
	if p.acquired {
		p.acquired = false
		p.b.Release(now, res)
	}
}

// mayRetry reports whether an exchange that failed before any byte of the
// answer was relayed may go once more to another backend: the request may
// be sent twice (resendable: GET or HEAD) and has not been moved already. That
// covers a request that never reached the backend and one the backend
// took and never answered in time, reset, or answered with garbage; any
// other method is never sent twice. Affinity requests are moved
// too, since a backend that fails them is down or hung and its clients
// are re-pinned.
func (p *plan) mayRetry() bool {
	return p.idem && !p.retried
}

// retryStep is what follows a failed exchange that mayRetry allowed.
type retryStep uint8

const (
	retryNone    retryStep = iota // no other backend: answer the failure
	retrySend                     // p.b is another backend: send it there
	retryRefused                  // re-admission refused it: resp holds the answer
)

// retryElsewhere moves p, whose backend failed before a byte was sent, to
// another backend. The second exchange is admitted as new work (a delay
// counts as a refusal: the client has already waited for one backend); an
// affinity request is from here new work, re-pinned. The other backend is
// of the same pool: a request never moves pool. h is its head and v its
// view, as admit left them (the client's target, not a stripped one).
func (s *Server) retryElsewhere(p *plan, resp *fasthttp.Response, h *fasthttp.RequestHeader, v *reqView, ip netip.Addr) retryStep {
	now := s.clock.Now()
	// The backend may have executed the request (it timed out or broke
	// after taking it): a second exchange is counted as new work, as the
	// first was, so that admission sees every execution.
	r := admissionRequest(admission.NewWork, h, v, p.ref.tag)
	if d, ok := s.admitNow(&r, now); !ok {
		s.refuseDecision(resp, p.ref, d)
		return retryRefused
	}
	if p.class == admission.Affinity {
		p.key = p.ref.key(h, ip)
	}
	nb, out, _ := p.ref.pool.Pick(now, p.key, p.b)
	if out != lb.Picked {
		return retryNone
	}
	s.stats.Retried.Add(1)
	p.retried = true
	p.prev = p.b
	p.b, p.renew, p.class = nb, s.sticky != nil, admission.NewWork
	return retrySend
}

// endedByCritical reports whether p is new work that memory state
// Critical ends while it is in flight.
func (s *Server) endedByCritical(p *plan) bool {
	return p.class == admission.NewWork && s.mem != nil && s.mem.State() == admission.Critical
}

// writeAborted counts and answers new work ended by memory state Critical.
func (s *Server) writeAborted(resp *fasthttp.Response) {
	s.stats.Aborted.Add(1)
	s.writeRefusal(resp, fasthttp.StatusServiceUnavailable, memoryRetry, psCritical, "memory state critical")
}

// writeFailure counts and answers an exchange that failed before any of
// the answer was relayed: 502, 503 or 504 by cause (writeUpstreamError).
func (s *Server) writeFailure(resp *fasthttp.Response, err error) {
	s.stats.UpstreamError.Add(1)
	s.writeUpstreamError(resp, err)
}

// observe reports p's time to Config.ObserveForward, once, when it was
// sent to a backend.
func (s *Server) observe(p *plan) {
	if p.b != nil && !p.observed && s.cfg.ObserveForward != nil {
		p.observed = true
		s.cfg.ObserveForward(time.Duration(s.clock.Now() - p.start))
	}
}

// affinity returns the backend a valid sticky cookie or learned session
// pins the request to, if it still takes affinity traffic, and the pool
// it is in. routed is the pool the routes give the request. A pin is
// honoured only where the routes would send the request: a token or
// learned id naming pool P pins it when the current route table sends
// this request to P (P is routed), or one of the last maxPastTables
// tables the server served did (so a session stays in its pool across a
// route change, for a few changes), and P still holds its backend.
// Otherwise the request is routed as new work: a cookie never opens a
// path, host or header the routes do not give its pool (with no route and
// no default pool: 404, whatever the cookie). A token issued without a
// pool pins its backend only when the routed pool has it. A pin whose
// pool is gone is new work, routed. renew is true when the sticky cookie
// should be sent again (absent via the session table, past half its
// lifetime, or a token without its pool); repinned when a valid pin
// named a backend that is down or a pool that is gone. A request may
// carry several values of a cookie (one planted by a sibling domain, a
// stale one): the first valid one that pins a backend counts
// (cookieValues), the routed pool's before another's.
func (s *Server) affinity(rq *routedReq, set *backendSet, routed *poolRef, now int64) (b *lb.Backend, ref *poolRef, renew, repinned bool) {
	h := rq.h
	var other *lb.Backend // the first pin honoured in a pool other than routed
	var otherRef *poolRef
	var otherRenew bool
	if s.sticky != nil {
		wall := s.wall(now)
		for tok := range cookieValues(h, s.sticky.name) {
			pool, id, exp, ok := s.signer.VerifyPool(b2s(tok), wall)
			if !ok {
				continue
			}
			c, cref, down := set.pinned(rq, pool, id, routed, other == nil, now)
			if down {
				repinned = true
			}
			if c == nil {
				continue
			}
			rn := pool != cref.tag || exp.Sub(wall) < s.cfg.StickyTTL/2
			if cref == routed {
				return c, cref, rn, false
			}
			other, otherRef, otherRenew = c, cref, rn
		}
	}
	if s.sessions != nil && other == nil {
		for sid := range cookieValues(h, s.appName) {
			e, pool := s.sessions.lookup(sid, now)
			if e == nil {
				continue
			}
			// The table may predate a reload: find the backend by id in
			// the set in use.
			c, cref, down := set.pinned(rq, pool, e.ID(), routed, other == nil, now)
			if down {
				repinned = true
			}
			if c == nil {
				continue
			}
			if cref == routed {
				return c, cref, s.sticky != nil, false
			}
			other, otherRef, otherRenew = c, cref, s.sticky != nil
		}
	}
	if other != nil {
		return other, otherRef, otherRenew, false
	}
	return nil, nil, false, repinned
}

// pinned returns the backend a pin (pool, id) names and the pool the
// request continues in, when the pin is honoured for the request rq
// (see Server.affinity): pool is the routed pool, or (when others is
// true) a table the set keeps sends rq to pool; and the backend is in
// that pool and takes affinity traffic at now. A pin without a pool (a
// token issued before pools) is honoured in the routed pool only; with
// one pool and no routes (SetPool), a pin naming that pool is too. down
// reports a pin that would be honoured but whose pool is gone or whose
// backend is not in it or is down.
func (set *backendSet) pinned(rq *routedReq, pool, id string, routed *poolRef, others bool, now int64) (b *lb.Backend, ref *poolRef, down bool) {
	switch {
	case pool == "" || routed != nil && (pool == routed.tag || set.gen == nil && pool == routed.name):
		ref = routed
	case !others || set.gen == nil:
		return nil, nil, false
	default:
		if !set.sendsAny(rq, pool) {
			return nil, nil, false
		}
		if ref = set.byName[pool]; ref == nil {
			return nil, nil, true
		}
	}
	if ref == nil {
		return nil, nil, false
	}
	if b = ref.pool.Pinned(id, now); b == nil {
		return nil, nil, true
	}
	return b, ref, false
}

// key returns the consistent-hash key of the request in pool p, 0 for
// other policies. It allocates nothing.
func (p *poolRef) key(h *fasthttp.RequestHeader, client netip.Addr) uint64 {
	if !p.hashed {
		return 0
	}
	switch p.hashKind {
	case hashHeader:
		return lb.HashBytes(h.Peek(p.hashName))
	case hashCookie:
		return lb.HashBytes(h.Cookie(p.hashName))
	}
	if client.IsValid() {
		ip := client.As16()
		return lb.HashBytes(ip[:])
	}
	return 0
}

// wait blocks on a delayed decision until the rule releases the request,
// its wait runs out, done is closed (shutdown), gone is closed (the client
// left: its slot in the queue is freed at once), or memory turns Critical.
func (s *Server) wait(done, gone <-chan struct{}, r *admission.Request, d admission.Decision) admission.Decision {
	var crit <-chan struct{}
	if s.mem != nil {
		crit = s.mem.CriticalC()
	}
	select {
	case <-d.Wait.Done():
	case <-crit:
		// admission has no "refuse for memory" call: Decide gives that
		// refusal when the state refuses new work, which it checks first.
		if d.Wait.Cancel() && s.mem.State().RefusesNewWork() {
			md := s.ctrl.Decide(s.clock.Now(), r, nil)
			if md.Verdict == admission.Refuse {
				return md
			}
			if md.Verdict == admission.Delay {
				md.Wait.Cancel()
			}
		}
	case <-done:
		d.Wait.Cancel()
	case <-gone:
		if d.Wait.Cancel() {
			s.stats.DelayAbandoned.Add(1)
		}
	}
	<-d.Wait.Done()
	return s.ctrl.Resume(s.clock.Now(), r, d, nil)
}

// admitNow asks admission about r and reports whether it is admitted at
// once; a delay is cancelled and counts as a refusal (the decision to
// answer with is returned).
func (s *Server) admitNow(r *admission.Request, now int64) (admission.Decision, bool) {
	d := s.ctrl.Decide(now, r, nil)
	switch d.Verdict {
	case admission.Admit:
		return d, true
	case admission.Delay:
		d.Wait.Cancel()
		<-d.Wait.Done()
		if d = s.ctrl.Resume(now, r, d, nil); d.Verdict == admission.Admit {
			return d, true
		}
	}
	return d, false
}

// resendable reports whether a request with method m may be sent a second
// time after its first exchange failed before any byte of an answer came:
// GET and HEAD only. RFC 9110 §9.2.2 also calls PUT, DELETE, OPTIONS and
// others idempotent, but a DELETE that the backend executed before its
// connection broke would run twice, and its second answer (404) would be
// the one the client sees.
func resendable(m []byte) bool {
	switch string(m) {
	case "GET", "HEAD":
		return true
	}
	return false
}

// notSent reports whether err happened before any byte of the request
// reached the backend: the dial failed, or no connection was free.
func notSent(err error) bool {
	if errors.Is(err, fasthttp.ErrNoFreeConns) || errors.Is(err, fasthttp.ErrDialTimeout) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// result classifies an exchange for passive health.
func result(err error, status int) lb.Result {
	switch {
	case err == nil && (status == 502 || status == 503 || status == 504):
		// The backend says it cannot serve (or cannot reach what it
		// needs). A 500 or 501 is the application's answer to that one
		// request, which any client could provoke at will: it is relayed
		// and does not count toward ejection.
		return lb.ServerError
	case err == nil:
		return lb.OK
	case errors.Is(err, fasthttp.ErrTimeout):
		return lb.Timeout
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return lb.Abandoned // our own limit, not the backend's fault
	}
	return lb.ConnectError
}

// writeUpstreamError makes the answer to a failed exchange, by cause. Both
// engines describe causes with fasthttp's errors, net.OpError for dials
// and syscall errors.
func (s *Server) writeUpstreamError(resp *fasthttp.Response, err error) {
	var op *net.OpError
	switch {
	case errors.Is(err, fasthttp.ErrDialTimeout):
		s.writeRefusal(resp, fasthttp.StatusBadGateway, 0, psConnectTimeout, "backend connect timeout")
	case errors.Is(err, fasthttp.ErrTimeout):
		s.writeRefusal(resp, fasthttp.StatusGatewayTimeout, 0, psResponseTimeout, "backend response timeout")
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		s.writeRefusal(resp, fasthttp.StatusServiceUnavailable, connRetry, psConnLimit, "backend connection limit reached")
	case errors.Is(err, syscall.ECONNREFUSED):
		s.writeRefusal(resp, fasthttp.StatusBadGateway, 0, psConnRefused, "backend refused the connection")
	case errors.As(err, &op) && op.Op == "dial":
		s.writeRefusal(resp, fasthttp.StatusBadGateway, 0, psDestUnavailable, "backend unreachable")
	case errors.Is(err, fasthttp.ErrConnectionClosed):
		s.writeRefusal(resp, fasthttp.StatusBadGateway, 0, psConnTerminated, "backend closed the connection")
	default:
		s.logger.Debug("upstream error", "err", err)
		s.writeRefusal(resp, fasthttp.StatusBadGateway, 0, psProtocolError, "bad answer from backend")
	}
}
