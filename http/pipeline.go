package http

import (
	"errors"
	"net"
	"net/netip"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// affinity returns the backend a valid sticky cookie or learned session
// pins the request to, if it still takes affinity traffic. renew is true
// when the sticky cookie should be sent again (absent via the session
// table, or past half its lifetime); repinned when a valid pin named a
// backend that is down.
func (s *Server) affinity(h *fasthttp.RequestHeader, rt *route, now int64) (b *lb.Backend, renew, repinned bool) {
	if s.sticky != nil {
		if tok := h.Cookie(s.sticky.name); len(tok) > 0 {
			wall := s.wall(now)
			if id, exp, ok := s.signer.VerifyExpiry(b2s(tok), wall); ok {
				if b = rt.pool.Pinned(id, now); b != nil {
					return b, exp.Sub(wall) < s.cfg.StickyTTL/2, false
				}
				repinned = true
			}
		}
	}
	if s.sessions != nil {
		if sid := h.Cookie(s.appName); len(sid) > 0 {
			if b = s.sessions.get(sid, now); b != nil {
				// The table may predate a reload: find the backend by id
				// in the set in use.
				if b = rt.pool.Lookup(b.ID()); b != nil && b.AcceptsAffinity(now) {
					return b, s.sticky != nil, false
				}
				b, repinned = nil, true
			}
		}
	}
	return nil, false, repinned
}

// wait blocks on a delayed decision until the rule releases the request,
// its wait runs out, done is closed (shutdown), or memory turns Critical.
func (s *Server) wait(done <-chan struct{}, r *admission.Request, d admission.Decision) admission.Decision {
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
	}
	<-d.Wait.Done()
	return s.ctrl.Resume(s.clock.Now(), r, d, nil)
}

// key returns the consistent-hash key of the request, 0 for other
// policies. It allocates nothing.
func (s *Server) key(h *fasthttp.RequestHeader, client netip.Addr, rt *route) uint64 {
	if !rt.hashed {
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

// admitRepin asks admission about an affinity request whose backend
// failed, as new work. It answers the refusal itself and returns false
// when the request may not go on; a delay counts as a refusal here, since
// the client has already waited for one backend.
func (s *Server) admitRepin(ctx *fasthttp.RequestCtx, now int64) bool {
	r := admission.Request{Class: admission.NewWork, Proto: "http", Method: b2s(ctx.Method()), Host: b2s(ctx.Host()), Path: b2s(ctx.Path())}
	d, ok := s.admitNow(&r, now)
	if !ok {
		s.refuseDecision(&ctx.Response, d)
	}
	return ok
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

// idempotent reports whether a method may be sent twice (RFC 9110 §9.2.2).
func idempotent(m []byte) bool {
	switch string(m) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE", "QUERY":
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
	case err == nil && status >= 500:
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
