package http

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// handle is the request path: classify, admit, pick, forward.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	// The gate (gate.go) checked this head as the loop does; the target
	// and Host are made what the loop makes them: an absolute-form target
	// becomes origin-form with its authority as Host, and the Host header
	// is what the backend gets (fasthttp would otherwise take it from the
	// parsed target).
	ctx.Request.UseHostHeader = true
	if auth, rest, ok := splitAbsolute(ctx.Request.Header.RequestURI()); ok {
		ctx.Request.Header.SetHostBytes(auth)
		ctx.Request.SetRequestURIBytes(originForm(nil, rest))
	}
	now := s.clock.Now()
	rt := s.rt.Load()
	closeAfter := ctx.Request.Header.ConnectionClose()
	b, renew, repinned := s.affinity(&ctx.Request.Header, rt, now)
	class := admission.NewWork
	if b != nil {
		class = admission.Affinity
	}
	r := admission.Request{
		Class:  class,
		Proto:  "http",
		Method: b2s(ctx.Method()),
		Host:   b2s(ctx.Host()),
		Path:   b2s(ctx.Path()),
	}
	d := s.ctrl.Decide(now, &r, nil)
	for d.Verdict == admission.Delay {
		d = s.wait(ctx.Done(), &r, d)
	}
	if d.Verdict == admission.Refuse {
		s.refuseDecision(&ctx.Response, d)
		s.finish(ctx, closeAfter)
		return
	}
	var key uint64
	if b == nil {
		key = s.key(&ctx.Request.Header, remoteAddr(ctx), rt)
		var out lb.Outcome
		var retry time.Duration
		b, out, retry = rt.pool.Pick(now, key, nil)
		switch out {
		case lb.NoBackend:
			s.refuse(&ctx.Response, fasthttp.StatusServiceUnavailable, s.cfg.RetryAfterNoBackend, psNoBackend, "no backend available")
			s.finish(ctx, closeAfter)
			return
		case lb.MOPRefused:
			s.refuseDecision(&ctx.Response, s.ctrl.RefuseMOPFor(&r, retry))
			s.finish(ctx, closeAfter)
			return
		}
		renew = s.sticky != nil
		if repinned {
			s.stats.Repinned.Add(1)
		}
	}
	s.forward(ctx, rt, b, class, key, renew, now)
	if s.cfg.ObserveForward != nil {
		s.cfg.ObserveForward(time.Duration(s.clock.Now() - now))
	}
	s.finish(ctx, closeAfter)
}

// finish restores the client's Connection: close, which removing
// hop-by-hop headers cleared.
func (s *Server) finish(ctx *fasthttp.RequestCtx, closeAfter bool) {
	// After an abort (TimeoutErrorWithResponse) the abandoned exchange may
	// still write ctx.Response: leave ctx alone.
	if closeAfter && ctx.LastTimeoutErrorResponse() == nil {
		ctx.SetConnectionClose()
	}
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

// newClient returns the connection pool to one backend: streaming response
// bodies when buffer is 0, else buffering those up to buffer bytes and
// failing larger ones with fasthttp.ErrBodyTooLarge.
func (s *Server) newClient(addr string, buffer int) *fasthttp.HostClient {
	timeout := s.cfg.ConnectTimeout
	return &fasthttp.HostClient{
		Addr:                     addr,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
		MaxConns:                 s.cfg.MaxConns,
		MaxConnWaitTimeout:       s.cfg.ConnWait,
		MaxIdleConnDuration:      s.cfg.BackendIdle,
		ReadTimeout:              s.cfg.BackendTimeout,
		WriteTimeout:             s.cfg.BackendTimeout,
		StreamResponseBody:       buffer == 0,
		ConnPoolStrategy:         fasthttp.LIFO, // reuse the warmest connection; idle extras time out
		MaxResponseBodySize:      buffer,
		ReadBufferSize:           16 << 10, // answer heads up to 16 KiB (the default 4 KiB fails larger Set-Cookie/CSP heads)
		// One retry on the same backend, for idempotent requests whose
		// pooled keep-alive connection turned out to be closed; never
		// after a timeout, which would double the wait on a slow backend.
		MaxIdemponentCallAttempts: 2,
		RetryIfErr: func(req *fasthttp.Request, attempts int, err error) (bool, bool) {
			return false, attempts < 2 && !errors.Is(err, fasthttp.ErrTimeout) && idempotent(req.Header.Method())
		},
		Dial: func(addr string) (net.Conn, error) { return fasthttp.DialTimeout(addr, timeout) },
	}
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

// upstreamError answers a failed exchange: 502 when the backend could not
// be reached (including a connect timeout), 504 when it did not answer in
// time, 503 when no backend connection was free (RFC 9209 error types).
func (s *Server) upstreamError(ctx *fasthttp.RequestCtx, err error) {
	s.stats.UpstreamError.Add(1)
	ctx.Response.CloseBodyStream()
	s.writeUpstreamError(&ctx.Response, err)
}

// remoteAddr returns the client's address, unmapped from IPv4-in-IPv6.
func remoteAddr(ctx *fasthttp.RequestCtx) netip.Addr {
	a, _ := netip.AddrFromSlice(ctx.RemoteIP())
	return a.Unmap()
}

// fasthttpLogger sends fasthttp's own messages (malformed requests, accept
// errors) to slog at debug level: a flood of bad requests must not flood
// the log.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	if f.l.Enabled(context.Background(), slog.LevelDebug) {
		f.l.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
	}
}
