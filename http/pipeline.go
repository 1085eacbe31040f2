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
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// plan is one request's way through the pipeline, whichever engine serves
// it. An engine keeps it for the life of the request (the fasthttp engine
// on the handler's stack, the loop in the client connection's exchange).
type plan struct {
	set      *backendSet // loaded once: a SetPool during the request does not mix two sets
	b        *lb.Backend // where it goes; nil until affinity or pick names one
	class    admission.Class
	key      uint64 // consistent-hash key (new work; 0 for other policies)
	start    int64  // admission clock when the request began
	renew    bool   // the answer sets the sticky cookie
	repinned bool   // a valid pin named a backend that is down
	idem     bool   // the method may be sent twice (resendable: GET, HEAD)
	retried  bool   // moved to another backend once already
	acquired bool   // b.Acquire was called: releaseBackend is due
	observed bool   // ObserveForward was called
}

// admit starts p for the request whose head is h and asks admission about
// it: affinity (a valid pin to a backend that takes affinity) skips the
// guards, new work goes through them. path is the request's path in normal form (matchPath),
// or nil when no ARM rule looks at paths (Server.rules). The returned
// request views h's bytes: use it before h changes, or clone it.
func (s *Server) admit(p *plan, h *fasthttp.RequestHeader, path []byte, now int64) (admission.Request, admission.Decision) {
	set := s.backends.Load()
	b, renew, repinned := s.affinity(h, set, now)
	*p = plan{set: set, b: b, start: now, renew: renew, repinned: repinned, idem: resendable(h.Method())}
	if b != nil {
		p.class = admission.Affinity
	}
	r := admissionRequest(p.class, h, path)
	return r, s.ctrl.Decide(now, &r, nil)
}

// admissionRequest is what admission sees of a request: plain values that
// view h's bytes without copying (Decide keeps no reference).
func admissionRequest(class admission.Class, h *fasthttp.RequestHeader, path []byte) admission.Request {
	return admission.Request{Class: class, Proto: "http", Method: b2s(h.Method()), Host: b2s(matchHost(nil, h.Host())), Path: b2s(path)}
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
	if d.Verdict == admission.Refuse {
		s.refuseDecision(resp, d)
		return false
	}
	if p.b != nil {
		return true
	}
	p.key = s.key(h, ip, p.set)
	b, out, retry := p.set.pool.Pick(p.start, p.key, nil)
	switch out {
	case lb.NoBackend:
		s.writeRefusal(resp, fasthttp.StatusServiceUnavailable, s.cfg.RetryAfterNoBackend, psNoBackend, "no backend available")
		return false
	case lb.MOPRefused:
		s.refuseDecision(resp, s.ctrl.RefuseMOPFor(r, retry))
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
// affinity request is from here new work, re-pinned. h and path are its
// head, as for admit.
func (s *Server) retryElsewhere(p *plan, resp *fasthttp.Response, h *fasthttp.RequestHeader, path []byte, ip netip.Addr) retryStep {
	now := s.clock.Now()
	// The backend may have executed the request (it timed out or broke
	// after taking it): a second exchange is counted as new work, as the
	// first was, so that admission sees every execution.
	r := admissionRequest(admission.NewWork, h, path)
	if d, ok := s.admitNow(&r, now); !ok {
		s.refuseDecision(resp, d)
		return retryRefused
	}
	if p.class == admission.Affinity {
		p.key = s.key(h, ip, p.set)
	}
	nb, out, _ := p.set.pool.Pick(now, p.key, p.b)
	if out != lb.Picked {
		return retryNone
	}
	s.stats.Retried.Add(1)
	p.retried = true
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
// pins the request to, if it still takes affinity traffic. renew is true
// when the sticky cookie should be sent again (absent via the session
// table, or past half its lifetime); repinned when a valid pin named a
// backend that is down. A request may carry several values of a cookie
// (one planted by a sibling domain, a stale one): the first valid one that
// pins a backend counts (cookieValues).
func (s *Server) affinity(h *fasthttp.RequestHeader, set *backendSet, now int64) (b *lb.Backend, renew, repinned bool) {
	if s.sticky != nil {
		for tok := range cookieValues(h, s.sticky.name) {
			wall := s.wall(now)
			if id, exp, ok := s.signer.VerifyExpiry(b2s(tok), wall); ok {
				if b = set.pool.Pinned(id, now); b != nil {
					return b, exp.Sub(wall) < s.cfg.StickyTTL/2, false
				}
				repinned = true
			}
		}
	}
	if s.sessions != nil {
		for sid := range cookieValues(h, s.appName) {
			if b = s.sessions.get(sid, now); b != nil {
				// The table may predate a reload: find the backend by id
				// in the set in use.
				if b = set.pool.Lookup(b.ID()); b != nil && b.AcceptsAffinity(now) {
					return b, s.sticky != nil, false
				}
				b, repinned = nil, true
			}
		}
	}
	return nil, false, repinned
}

// key returns the consistent-hash key of the request, 0 for other
// policies. It allocates nothing.
func (s *Server) key(h *fasthttp.RequestHeader, client netip.Addr, set *backendSet) uint64 {
	if !set.hashed {
		return 0
	}
	switch s.hashKind {
	case hashHeader:
		return lb.HashBytes(h.Peek(s.hashName))
	case hashCookie:
		return lb.HashBytes(h.Cookie(s.hashName))
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
