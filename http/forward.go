package http

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// hopByHop are the headers a proxy removes in both directions (RFC 9110
// §7.6.1), besides those the Connection header names; in the order of
// their bits in headerBit.
var hopByHop = [...]string{
	"Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer",
	"Transfer-Encoding", "Upgrade", "Proxy-Authenticate", "Proxy-Authorization",
}

// errAborted marks a request ended by memory state Critical.
var errAborted = errors.New("aborted: memory state critical")

// forward sends the request to b and relays the answer, retrying once on
// another backend when the request is idempotent and failed before a byte
// was sent. Affinity requests are retried elsewhere too, since a backend
// that refuses connections is down and its clients are re-pinned.
func (s *Server) forward(ctx *fasthttp.RequestCtx, rt *route, b *lb.Backend, class admission.Class, key uint64, renew bool, now int64) {
	s.prepareRequest(&ctx.Request.Header, remoteAddr(ctx))
	// An HTTP/1.0 request may come without Host, and "Host:" empty is
	// valid: the backend gets its own address as authority (the fasthttp
	// client would refuse to send the request, and that refusal would be
	// charged to the backend).
	noHost := len(ctx.Request.Header.Host()) == 0
	var body *bodyReader
	if ctx.Request.IsBodyStream() {
		// Watch the client's body as it is streamed on, to tell a broken
		// upload (400) from a backend failure (502). SetBodyStream only
		// drops fasthttp's reference to its stream; the server still owns,
		// drains and recycles it after the handler.
		body = bodyReaders.Get().(*bodyReader)
		body.r, body.err = ctx.RequestBodyStream(), nil
		ctx.Request.SetBodyStream(body, ctx.Request.Header.ContentLength())
	}
	defer func() {
		if body != nil {
			body.r = nil
			bodyReaders.Put(body)
		}
	}()
	for attempt := 0; ; attempt++ {
		if noHost {
			ctx.Request.Header.SetHost(b.Addr())
		}
		b.Acquire()
		err := s.roundTrip(ctx, rt, b, class)
		if err == errAborted {
			body = nil // the abandoned exchange may still read it
			return     // answered, and the backend released by the round trip
		}
		if err != nil && body != nil && body.err != nil && body.err != io.EOF {
			// The client's body stream broke while it was being sent on:
			// the client's fault, not the backend's.
			b.Release(now, lb.Abandoned)
			ctx.Response.CloseBodyStream()
			s.writeRefusal(&ctx.Response, fasthttp.StatusBadRequest, 0, psBadRequest, "malformed request body")
			ctx.SetConnectionClose()
			return
		}
		// The request's start time stands in for its end: passive
		// ejection cool-downs are seconds, requests milliseconds.
		b.Release(now, result(err, ctx.Response.StatusCode()))
		if err == nil {
			break
		}
		if attempt == 0 && notSent(err) && idempotent(ctx.Method()) {
			now = s.clock.Now()
			if class == admission.Affinity {
				// Its backend refuses connections: from here it is new
				// work, re-pinned, and admitted as such.
				if !s.admitRepin(ctx, now) {
					return
				}
				key = s.key(&ctx.Request.Header, remoteAddr(ctx), rt)
			}
			nb, out, _ := rt.pool.Pick(now, key, b)
			if out == lb.Picked {
				s.stats.Retried.Add(1)
				b, renew, class = nb, s.sticky != nil, admission.NewWork
				continue
			}
		}
		s.upstreamError(ctx, err)
		return
	}
	if class == admission.NewWork && s.mem.State() == admission.Critical {
		// The state turned Critical while this request was in flight on
		// the fast path (see roundTrip): drop the answer, closing the
		// backend connection if the body is still streaming.
		ctx.Response.CloseBodyStream()
		s.stats.Aborted.Add(1)
		s.writeRefusal(&ctx.Response, fasthttp.StatusServiceUnavailable, memoryRetry, psCritical, "memory state critical")
		return
	}
	if class == admission.Affinity {
		s.stats.Affinity.Add(1)
	} else {
		s.stats.NewWork.Add(1)
	}
	s.prepareResponse(&ctx.Response.Header, rt, b, renew, now)
}

// roundTrip does one exchange with b. New work admitted while the node
// memory state is above Normal runs on its own goroutine so that turning
// Critical can end it at once: the client gets 503 and the backend
// connection is closed when the exchange returns. In state Normal the
// exchange runs inline (no goroutine per request); if the state turns
// Critical meanwhile, forward discards the answer when it arrives.
func (s *Server) roundTrip(ctx *fasthttp.RequestCtx, rt *route, b *lb.Backend, class admission.Class) error {
	if class == admission.Affinity || s.mem == nil || s.mem.State() == admission.Normal {
		return s.exchange(ctx, rt, b)
	}
	crit := s.mem.CriticalC()
	const (
		running = iota
		finished
		abandoned
	)
	var state atomic.Uint32
	done := make(chan error, 1)
	go func() {
		err := s.exchange(ctx, rt, b)
		if state.CompareAndSwap(running, finished) {
			done <- err
			return
		}
		// The handler has returned and fasthttp has let go of ctx: clean
		// up what the exchange left.
		ctx.Response.CloseBodyStream()
		b.Release(s.clock.Now(), lb.Abandoned)
	}()
	select {
	case err := <-done:
		return err
	case <-crit:
		if !state.CompareAndSwap(running, abandoned) {
			return <-done
		}
	}
	s.stats.Aborted.Add(1)
	resp := fasthttp.AcquireResponse()
	s.writeRefusal(resp, fasthttp.StatusServiceUnavailable, memoryRetry, psCritical, "memory state critical")
	ctx.TimeoutErrorWithResponse(resp)
	fasthttp.ReleaseResponse(resp)
	return errAborted
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

// exchange sends the request to b once, or twice when a buffered answer
// turned out too large (see Config.ResponseBuffer).
func (s *Server) exchange(ctx *fasthttp.RequestCtx, rt *route, b *lb.Backend) error {
	if rt.buffered != nil && !ctx.Request.IsBodyStream() && idempotent(ctx.Method()) {
		err := rt.buffered[b.Index()].Do(&ctx.Request, &ctx.Response)
		if !errors.Is(err, fasthttp.ErrBodyTooLarge) {
			return err
		}
		s.stats.Restreamed.Add(1)
	}
	return rt.clients[b.Index()].Do(&ctx.Request, &ctx.Response)
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

// bodyReader passes a streamed request body through and keeps the first
// error reading it.
type bodyReader struct {
	r   io.Reader
	err error
}

var bodyReaders = sync.Pool{New: func() any { return new(bodyReader) }}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && b.err == nil {
		b.err = err
	}
	return n, err
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

// idempotent reports whether a method may be sent twice (RFC 9110 §9.2.2).
func idempotent(m []byte) bool {
	switch string(m) {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE", "QUERY":
		return true
	}
	return false
}

// upstreamError answers a failed exchange: 502 when the backend could not
// be reached (including a connect timeout), 504 when it did not answer in
// time, 503 when no backend connection was free (RFC 9209 error types).
func (s *Server) upstreamError(ctx *fasthttp.RequestCtx, err error) {
	s.stats.UpstreamError.Add(1)
	ctx.Response.CloseBodyStream()
	s.writeUpstreamError(&ctx.Response, err)
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

// Bits of headerBits: which headers of interest a message carries.
const (
	hConnection uint16 = 1 << iota
	hKeepAlive
	hProxyConnection
	hTE
	hTrailer
	hTransferEncoding
	hUpgrade
	hProxyAuthenticate
	hProxyAuthorization
	hXForwardedFor
	hForwarded
	hXForwardedProto

	hHopByHop = hXForwardedFor - 1
)

// headerBit returns the bit of a header name, 0 for the rest. It is one
// length switch and at most two comparisons, so that a message is checked
// in one pass instead of a Peek or Del per name.
func headerBit(k []byte) uint16 {
	eq := func(name string) bool { return bytes.EqualFold(k, []byte(name)) }
	switch len(k) {
	case 2:
		if eq("TE") {
			return hTE
		}
	case 7:
		if eq("Trailer") {
			return hTrailer
		}
		if eq("Upgrade") {
			return hUpgrade
		}
	case 9:
		if eq("Forwarded") {
			return hForwarded
		}
	case 10:
		if eq("Connection") {
			return hConnection
		}
		if eq("Keep-Alive") {
			return hKeepAlive
		}
	case 15:
		if eq("X-Forwarded-For") {
			return hXForwardedFor
		}
	case 16:
		if eq("Proxy-Connection") {
			return hProxyConnection
		}
	case 17:
		if eq("Transfer-Encoding") {
			return hTransferEncoding
		}
		if eq("X-Forwarded-Proto") {
			return hXForwardedProto
		}
	case 18:
		if eq("Proxy-Authenticate") {
			return hProxyAuthenticate
		}
	case 19:
		if eq("Proxy-Authorization") {
			return hProxyAuthorization
		}
	}
	return 0
}

// prepareRequest removes hop-by-hop headers and sets X-Forwarded-For,
// X-Forwarded-Proto and Forwarded (RFC 7239). Values from clients outside
// the trusted proxies are replaced, from trusted ones appended to. The
// client's headers are scanned once; names are deleted only when present.
func (s *Server) prepareRequest(h *fasthttp.RequestHeader, ip netip.Addr) {
	var seen uint16
	for k := range h.AllInOrder() {
		seen |= headerBit(k)
	}
	if seen&hHopByHop != 0 {
		stripHopByHop(seen, h.Peek("Connection"), h.DelBytes, h.Del)
	}

	trusted := s.isTrusted(ip)
	var buf [320]byte
	v := buf[:0]
	if seen&hXForwardedFor != 0 {
		if prior := h.Peek("X-Forwarded-For"); trusted && len(prior) > 0 {
			v = append(append(v, prior...), ", "...)
		}
	}
	v = ip.AppendTo(v)
	h.SetBytesV("X-Forwarded-For", v)

	if !trusted || seen&hXForwardedProto == 0 || len(h.Peek("X-Forwarded-Proto")) == 0 {
		h.Set("X-Forwarded-Proto", "http")
	}

	v = buf[:0]
	if seen&hForwarded != 0 {
		if prior := h.Peek("Forwarded"); trusted && len(prior) > 0 {
			v = append(append(v, prior...), ", "...)
		}
	}
	v = append(v, "for="...)
	if ip.Is6() {
		v = append(v, `"[`...)
		v = ip.AppendTo(v)
		v = append(v, `]"`...)
	} else {
		v = ip.AppendTo(v)
	}
	v = append(v, ";proto=http"...)
	if host := h.Host(); len(host) > 0 && len(host) < 200 && bytes.IndexAny(host, "\"\\\r\n") < 0 {
		v = append(v, `;host="`...)
		v = append(v, host...)
		v = append(v, '"')
	}
	h.SetBytesV("Forwarded", v)
}

func (s *Server) isTrusted(ip netip.Addr) bool {
	for _, p := range s.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// stripHopByHop deletes the headers named in conn (the Connection value)
// and those of the fixed hop-by-hop list whose bits are in seen.
func stripHopByHop(seen uint16, conn []byte, delBytes func([]byte), del func(string)) {
	for len(conn) > 0 {
		var tok []byte
		if i := bytes.IndexByte(conn, ','); i >= 0 {
			tok, conn = conn[:i], conn[i+1:]
		} else {
			tok, conn = conn, nil
		}
		tok = bytes.TrimSpace(tok)
		if len(tok) > 0 && !bytes.EqualFold(tok, []byte("close")) && !bytes.EqualFold(tok, []byte("keep-alive")) {
			delBytes(tok)
		}
	}
	for i, k := range hopByHop {
		if seen&(1<<i) != 0 {
			del(k)
		}
	}
}

// prepareResponse removes hop-by-hop headers from the backend's answer,
// learns the application session cookie and sets the sticky cookie.
func (s *Server) prepareResponse(h *fasthttp.ResponseHeader, rt *route, b *lb.Backend, renew bool, now int64) {
	var seen uint16
	for k := range h.All() {
		seen |= headerBit(k)
	}
	// All yields "Connection: close" too: a backend closing its connection
	// does not close the client's.
	if seen&hHopByHop != 0 {
		stripHopByHop(seen, h.Peek("Connection"), h.DelBytes, h.Del)
	}
	if s.sessions != nil {
		s.learnSession(h, b, now)
	}
	if renew && s.sticky != nil {
		h.AddBytesV("Set-Cookie", s.sticky.header(&rt.cookies[b.Index()], b, s.wall(now)))
	}
}

// learnSession records the application session id the backend set.
func (s *Server) learnSession(h *fasthttp.ResponseHeader, b *lb.Backend, now int64) {
	for name, raw := range h.Cookies() {
		if string(name) != s.appName {
			continue
		}
		c := fasthttp.AcquireCookie()
		// Entries end by TTL; a backend clearing the cookie sets an empty
		// or different value, which the client then sends instead.
		if c.ParseBytes(raw) == nil && len(c.Value()) > 0 {
			s.sessions.put(c.Value(), b, now)
		}
		fasthttp.ReleaseCookie(c)
	}
}
