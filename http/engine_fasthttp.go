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

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// The fasthttp engine: fasthttp's server, a goroutine per connection,
// reads each request (behind the gate, gate.go) and calls handle, which
// goes down the pipeline (pipeline.go) and does the backend I/O with a
// fasthttp.HostClient per backend (backendSet.clients). It also serves
// every connection the loop engine hands over.

// handle is the fasthttp engine's request path: admit, pick, forward.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	// The gate (gate.go) checked this head as the loop does; the target
	// and Host are made what the loop makes them: an absolute-form target
	// becomes origin-form with its authority as Host, and the Host header
	// is what the backend gets (fasthttp would otherwise take it from the
	// parsed target).
	ctx.Request.UseHostHeader = true
	h := &ctx.Request.Header
	if auth, rest, ok := splitAbsolute(h.RequestURI()); ok {
		h.SetHostBytes(auth)
		ctx.Request.SetRequestURIBytes(originForm(nil, rest))
	}
	closeAfter := h.ConnectionClose()
	var p plan
	path := s.pathOf(ctx)
	r, d := s.admit(&p, h, path, s.clock.Now())
	if d.Verdict == admission.Delay {
		d = s.waitDelay(ctx.Done(), &r, d)
	}
	if s.pick(&p, &ctx.Response, &r, d, h, remoteAddr(ctx)) {
		s.forward(ctx, &p, path)
		s.observe(&p)
	}
	restoreConnClose(ctx, closeAfter)
}

// pathOf returns the request's path in the normal form ARM rules match
// (matchPath), as on the loop; nil when no rule looks at paths.
func (s *Server) pathOf(ctx *fasthttp.RequestCtx) []byte {
	if !s.rules().needPath {
		return nil
	}
	return matchPath(nil, ctx.Request.Header.RequestURI())
}

// restoreConnClose restores the client's Connection: close, which
// removing hop-by-hop headers cleared.
func restoreConnClose(ctx *fasthttp.RequestCtx, closeAfter bool) {
	// After an abort (TimeoutErrorWithResponse) the abandoned exchange may
	// still write ctx.Response: leave ctx alone.
	if closeAfter && ctx.LastTimeoutErrorResponse() == nil {
		ctx.SetConnectionClose()
	}
}

// errAborted marks a request ended by memory state Critical.
var errAborted = errors.New("aborted: memory state critical")

// forward sends the request to p.b and relays the answer, once more to
// another backend when the pipeline allows it (retryElsewhere).
func (s *Server) forward(ctx *fasthttp.RequestCtx, p *plan, path []byte) {
	h := &ctx.Request.Header
	ip := remoteAddr(ctx)
	s.prepareRequest(h, ip)
	// An HTTP/1.0 request may come without Host: the backend gets the
	// address the client connected to as authority (the fasthttp client
	// would refuse to send the request without one, and that refusal would
	// be charged to the backend). Never the backend's own address, which
	// a backend echoes in redirects.
	if len(h.Host()) == 0 {
		h.SetHost(ctx.LocalAddr().String())
	}
	var body *bodyReader
	if ctx.Request.IsBodyStream() {
		// Watch the client's body as it is streamed on, to tell a broken
		// upload (400) from a backend failure (502). SetBodyStream only
		// drops fasthttp's reference to its stream; the server still owns,
		// drains and recycles it after the handler.
		body = bodyReaders.Get().(*bodyReader)
		body.r, body.err, body.n = ctx.RequestBodyStream(), nil, 0
		ctx.Request.SetBodyStream(body, h.ContentLength())
	}
	defer func() {
		if body != nil {
			body.r = nil
			bodyReaders.Put(body)
		}
	}()
	for {
		p.acquireBackend()
		err := s.roundTrip(ctx, p)
		if err == errAborted {
			p.acquired = false // the abandoned exchange releases it when it returns
			body = nil         // and may still read the body
			return
		}
		if err != nil && body != nil && body.broken(h.ContentLength()) {
			// The client's body stream broke or ended early while it was
			// being sent on: the client's fault, not the backend's.
			p.releaseBackend(s.clock.Now(), lb.Abandoned)
			ctx.Response.CloseBodyStream()
			s.writeRefusal(&ctx.Response, fasthttp.StatusBadRequest, 0, psBadRequest, "malformed request body")
			ctx.SetConnectionClose()
			return
		}
		p.releaseBackend(s.clock.Now(), result(err, ctx.Response.StatusCode()))
		if err == nil {
			break
		}
		// An error here came before any of the answer was relayed; a body
		// streamed from the client can be sent only once, so such a
		// request moves only if it never left.
		if p.mayRetry() && (body == nil || notSent(err)) {
			switch s.retryElsewhere(p, &ctx.Response, h, path, ip) {
			case retrySend:
				continue
			case retryRefused:
				return
			}
		}
		ctx.Response.CloseBodyStream()
		s.writeFailure(&ctx.Response, err)
		return
	}
	if s.endedByCritical(p) {
		// The state turned Critical while this request was in flight on
		// the fast path (see roundTrip): drop the answer, closing the
		// backend connection if the body is still streaming.
		ctx.Response.CloseBodyStream()
		s.writeAborted(&ctx.Response)
		return
	}
	s.prepareResponse(&ctx.Response.Header, p)
}

// roundTrip does one exchange with p.b. New work admitted while the node
// memory state is above Normal runs on its own goroutine so that turning
// Critical can end it at once: the client gets 503 and the backend
// connection is closed when the exchange returns. In state Normal the
// exchange runs inline (no goroutine per request); if the state turns
// Critical meanwhile, forward discards the answer when it arrives.
func (s *Server) roundTrip(ctx *fasthttp.RequestCtx, p *plan) error {
	set, b := p.set, p.b
	if p.class == admission.Affinity || s.mem == nil || s.mem.State() == admission.Normal {
		return s.exchange(ctx, set, b)
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
		err := s.exchange(ctx, set, b)
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
	resp := fasthttp.AcquireResponse()
	s.writeAborted(resp)
	ctx.TimeoutErrorWithResponse(resp)
	fasthttp.ReleaseResponse(resp)
	return errAborted
}

// exchange sends the request to b once, or twice when a buffered answer
// turned out too large (see Config.ResponseBuffer).
func (s *Server) exchange(ctx *fasthttp.RequestCtx, set *backendSet, b *lb.Backend) error {
	if set.buffered != nil && !ctx.Request.IsBodyStream() && idempotent(ctx.Method()) {
		err := set.buffered[b.Index()].Do(&ctx.Request, &ctx.Response)
		if !errors.Is(err, fasthttp.ErrBodyTooLarge) {
			return err
		}
		s.stats.Restreamed.Add(1)
	}
	return set.clients[b.Index()].Do(&ctx.Request, &ctx.Response)
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

// bodyReader passes a streamed request body through, counting its bytes
// and keeping the first error reading it.
type bodyReader struct {
	r   io.Reader
	err error
	n   int64
}

var bodyReaders = sync.Pool{New: func() any { return new(bodyReader) }}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err != nil && b.err == nil {
		b.err = err
	}
	return n, err
}

// broken reports whether the client's body failed: a read error, or an
// end before the Content-Length (cl, -1 when chunked) was read.
func (b *bodyReader) broken(cl int) bool {
	return (b.err != nil && b.err != io.EOF) || (b.err == io.EOF && cl >= 0 && b.n < int64(cl))
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
