package http

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httputil"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
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
	p.secure = connSecure(ctx.Conn())
	if !p.secure && s.cfg.HTTPSRedirect {
		s.writeRedirect(&ctx.Response, h)
		restoreConnClose(ctx, closeAfter)
		return
	}
	v := viewPool.Get().(*reqView)
	defer viewPool.Put(v)
	now := s.clock.Now()
	r, d := s.admit(&p, h, v, now)
	var g *reqLog
	if s.cfg.RequestID || s.logging() {
		g = reqLogPool.Get().(*reqLog)
		start, head := headTimes(ctx, now)
		s.beginLog(g, &p, h, clientAddrPort(ctx), ctx.Conn(), s.wall(start), start, now)
		g.head = head
		defer s.endFastLog(ctx, g, &p)
	}
	if d.Verdict == admission.Delay {
		s.markDelayed(g, d)
		// Watch the client while the request waits in the queue: one that
		// leaves frees its slot at once. (Not while a streamed body is
		// unread: that is fasthttp's to read.)
		var gone <-chan struct{}
		end := func() {}
		if g, ok := ctx.Conn().(*gateConn); ok && !ctx.Request.IsBodyStream() {
			gone, end = g.watch()
		}
		d = s.waitDelay(ctx.Done(), gone, remoteAddr(ctx), &r, d)
		end()
		if g != nil {
			g.decided = s.clock.Now()
		}
		if gone != nil && isClosed(gone) {
			if g != nil {
				g.end, g.answered, g.status = accesslog.EndClientAbort, true, noAnswer
			}
			ctx.SetConnectionClose()
			return
		}
	}
	picked := s.pick(&p, &ctx.Response, &r, d, h, remoteAddr(ctx))
	if !picked && g != nil {
		g.refused = true
	}
	if picked {
		// No body: no Content-Length above 0, not chunked (-1; -2 is
		// fasthttp's "none given" for a request), nothing streamed.
		bodyless := h.ContentLength() != -1 && h.ContentLength() <= 0 && !ctx.Request.IsBodyStream() && len(ctx.Request.Body()) == 0
		if proto := s.upgradeAsked(h, bodyless); proto != nil {
			g.setRequestID(h)
			s.forwardUpgrade(ctx, &p, v, proto, g)
		} else {
			s.forward(ctx, &p, v, g)
		}
		s.observe(&p)
	}
	restoreConnClose(ctx, closeAfter)
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// viewPool holds the fasthttp engine's request views (reqView): one per
// request in flight, its buffers kept warm.
var viewPool = sync.Pool{New: func() any { return new(reqView) }}

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
func (s *Server) forward(ctx *fasthttp.RequestCtx, p *plan, v *reqView, g *reqLog) {
	h := &ctx.Request.Header
	ip := remoteAddr(ctx)
	s.prepareRequest(h, ip, p.secure)
	g.setRequestID(h)
	if p.strip != "" {
		if t := v.stripTarget(h, p.strip); t != nil {
			// On the request, not its header: the request's parsed URI
			// would otherwise write the target back.
			ctx.Request.SetRequestURIBytes(t)
		}
	}
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
	if body != nil {
		// A backend connection is taken only when there are bytes to
		// send: the first 64 KiB of the body (or all of a shorter one)
		// are read before; a client that sends a little and stalls holds
		// none.
		first, err := prefetchBody(body, h.ContentLength())
		if err != nil || body.broken(h.ContentLength()) {
			s.clientLeft(ctx, g, body.n)
			s.writeRefusal(&ctx.Response, fasthttp.StatusBadRequest, 0, psBadRequest, "malformed request body")
			ctx.SetConnectionClose()
			return
		}
		ctx.Request.SetBodyStream(io.MultiReader(bytes.NewReader(first), body), h.ContentLength())
	}
	// One source holds at most MaxConns/8 (at least 1) backend
	// connections at once, until its answer is relayed: a streamed
	// answer's count ends when its body is closed.
	if !s.held.take(ip) {
		s.stats.SourceLimited.Add(1)
		s.writeRefusal(&ctx.Response, fasthttp.StatusServiceUnavailable, connRetry, psSourceLimit, "backend connections for this client at their limit")
		if body != nil {
			ctx.SetConnectionClose() // the rest of the body is not read
		}
		return
	}
	held := true
	defer func() {
		if held {
			s.held.release(ip)
		}
	}()
	if g != nil && s.logging() {
		fastInFlight.track(&ctx.Request, g)
		defer fastInFlight.forget(&ctx.Request)
	}
	for {
		p.acquireBackend()
		err := s.roundTrip(ctx, p)
		if err == errAborted {
			p.acquired = false // the abandoned exchange releases it when it returns
			body = nil         // and may still read the body
			g.abortedCritical()
			return
		}
		if err != nil && body != nil && body.broken(h.ContentLength()) {
			// The client's body stream broke or ended early while it was
			// being sent on: the client's fault, not the backend's.
			p.releaseBackend(s.clock.Now(), lb.Abandoned)
			ctx.Response.CloseBodyStream()
			s.clientLeft(ctx, g, body.n)
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
			switch s.retryElsewhere(p, &ctx.Response, h, v, ip) {
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
	s.prepareResponse(&ctx.Response.Header, p, ip)
	if g != nil {
		g.answered = true
		if body != nil {
			g.rec.BytesIn = body.n
		}
	}
	if bb, ok := ctx.Response.BodyStream().(*backendBody); ok {
		bb.held, bb.src, held = &s.held, ip, false // counted until the body is closed
		if g != nil {
			// The exchange ends when the streamed body does: logged then.
			g.streamed = true
			bb.log, bb.s, bb.plan = g, s, *p
		}
	}
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

// exchange sends the request to b once. The answer is streamed from that
// one exchange: a request is never sent again to get its answer (see
// backendTransport).
func (s *Server) exchange(ctx *fasthttp.RequestCtx, set *backendSet, b *lb.Backend) error {
	if b.Proxy() != 0 {
		return s.exchangeProxied(ctx, b)
	}
	return set.clients[b.Index()].Do(&ctx.Request, &ctx.Response)
}

// newClient returns the connection pool to one backend; its exchanges run
// through backendTransport, which reads answers with a Content-Length up
// to buffer whole and streams the others. With tlsCfg set, connections
// speak TLS (dialTLS: the handshake within the connect timeout).
func (s *Server) newClient(addr string, buffer int, tlsCfg *tls.Config) *fasthttp.HostClient {
	dial := s.dialBackend
	if tlsCfg != nil {
		dial = func(addr string) (net.Conn, error) { return s.dialTLS(addr, tlsCfg) }
	}
	return &fasthttp.HostClient{
		Addr:                     addr,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
		MaxConns:                 s.cfg.MaxConns,
		MaxConnWaitTimeout:       s.cfg.ConnWait,
		MaxIdleConnDuration:      s.cfg.BackendIdle,
		ReadTimeout:              s.cfg.BackendTimeout,
		WriteTimeout:             s.cfg.BackendTimeout,
		ConnPoolStrategy:         fasthttp.LIFO, // reuse the warmest connection; idle extras time out
		ReadBufferSize:           16 << 10,      // answer heads up to 16 KiB (the default 4 KiB fails larger Set-Cookie/CSP heads)
		Transport:                &backendTransport{buffer: buffer, s: s},
		// One retry on the same backend, for a GET or HEAD whose pooled
		// keep-alive connection turned out to be closed before any byte
		// of an answer came (backendTransport reports only those as
		// retriable); never after a timeout, which would double the wait
		// on a slow backend, and never another method: a DELETE or PUT
		// the backend executed and then failed to answer must not run
		// twice.
		MaxIdemponentCallAttempts: 2,
		RetryIfErr: func(req *fasthttp.Request, attempts int, err error) (bool, bool) {
			return false, attempts < 2 && !errors.Is(err, fasthttp.ErrTimeout) && resendable(req.Header.Method())
		},
		Dial: dial, // one -http-backend-max-conns with the loops' connections
	}
}

// Errors of an answer the fasthttp engine refuses (502).
var (
	// errUnaskedUpgrade: a backend switched protocols, and sluice forwards
	// no upgrade (Upgrade is hop-by-hop and removed): whatever the
	// connection carries from then on is not HTTP, so it is closed.
	errUnaskedUpgrade = errors.New("backend answered 101 Switching Protocols to a request without an upgrade")
	// errInformational: more than maxInformational 1xx answers before the
	// final one.
	errInformational = errors.New("backend sent too many 1xx answers")
)

// maxInformational bounds the 1xx answers (103 Early Hints, 102
// Processing) a backend may send before its final answer, on either
// engine; all of them together must also come within the backend timeout.
const maxInformational = 16

// backendTransport is the fasthttp engine's exchange with a backend
// connection, in place of fasthttp's own:
//
//   - the answer is read once: a body with a Content-Length up to buffer
//     is read whole (the backend connection is free before the client
//     has read it), any other body is streamed from the same exchange;
//   - 1xx answers are skipped, at most maxInformational of them, all
//     within the read timeout set once for the final answer's head;
//   - a 101 is a bad answer, and its connection is closed, never pooled;
//   - retry is reported only when no byte of an answer arrived;
//   - a connection goes back to the pool only when the answer was read to
//     its end and nothing more is buffered.
type backendTransport struct {
	buffer int
	s      *Server // the access log's timings (markExchange)
}

// RoundTrip implements fasthttp.RoundTripper.
func (t *backendTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	cc, err := hc.AcquireConn(0, req.ConnectionClose())
	if err != nil {
		return false, err
	}
	t.s.markExchange(req, false)
	conn := cc.Conn()
	resp.ParseNetConn(conn)
	if err := conn.SetWriteDeadline(deadline(hc.WriteTimeout)); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	bw := hc.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	hc.ReleaseWriter(bw)
	if err != nil {
		hc.CloseConn(cc)
		return true, asTimeout(err)
	}
	if err := conn.SetReadDeadline(deadline(hc.ReadTimeout)); err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	br := hc.AcquireReader(conn)
	finish := func(reuse bool) {
		reuse = reuse && br.Buffered() == 0 // nothing sent beyond the answer
		hc.ReleaseReader(br)
		if reuse {
			hc.ReleaseConn(cc)
		} else {
			hc.CloseConn(cc)
		}
	}
	if _, err := br.Peek(1); err != nil {
		// Not a byte of an answer. Only on a reused keep-alive connection,
		// which the backend had closed before it read the request, may a
		// GET or HEAD go once more on a fresh one (see newClient); a fresh
		// connection that breaks is the backend's failure, and the
		// pipeline may move the request, counted again (retryElsewhere).
		reused := !cc.LastUseTime().IsZero()
		finish(false)
		return reused, asTimeout(err)
	}
	t.s.markExchange(req, true)
	h := &resp.Header
	err = readAnswerHead(h, br)
	for n := 0; err == nil; n++ {
		st := h.StatusCode()
		if st == fasthttp.StatusSwitchingProtocols {
			err = errUnaskedUpgrade
			break
		}
		if st >= 200 || st < 100 {
			break
		}
		if n == maxInformational {
			err = errInformational
			break
		}
		err = readAnswerHead(h, br)
	}
	if err != nil {
		finish(false)
		return false, asTimeout(err)
	}
	closeAfter := req.ConnectionClose() || h.ConnectionClose()
	st, cl := h.StatusCode(), h.ContentLength()
	if req.Header.IsHead() || st == fasthttp.StatusNoContent || st == fasthttp.StatusNotModified {
		resp.SkipBody = true
		finish(!closeAfter)
		return false, nil
	}
	if cl >= 0 && cl <= t.buffer {
		resp.StreamBody = false
		err := resp.ReadBody(br, t.buffer)
		if err != nil {
			finish(false)
			return false, asTimeout(err)
		}
		finish(!closeAfter)
		return false, nil
	}
	body := &backendBody{conn: conn, timeout: hc.ReadTimeout, br: br, want: int64(cl), reuse: !closeAfter && cl != -2}
	// The same as finish; a closure of its own, so that finish does not
	// escape (and allocate) on the other paths.
	body.finish = func(reuse bool) {
		reuse = reuse && br.Buffered() == 0
		hc.ReleaseReader(br)
		if reuse {
			hc.ReleaseConn(cc)
		} else {
			hc.CloseConn(cc)
		}
	}
	switch {
	case cl >= 0:
		body.r = io.LimitReader(br, int64(cl))
	case cl == -1:
		body.r = httputil.NewChunkedReader(br)
	default: // until the backend closes
		body.r = br
	}
	resp.SetBodyStream(body, cl)
	return false, nil
}

// deadline returns now+d, or no deadline for d 0.
func deadline(d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return time.Now().Add(d)
}

// asTimeout turns a network timeout into fasthttp.ErrTimeout, which the
// pipeline answers 504.
func asTimeout(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fasthttp.ErrTimeout
	}
	return err
}

// backendBody is a streamed answer body: read from the backend connection
// as the client takes it, each read within the backend timeout. Closing it
// puts the connection back in the pool if the body was read to its end,
// else closes it.
type backendBody struct {
	r       io.Reader
	conn    net.Conn
	br      *bufio.Reader
	timeout time.Duration
	want    int64 // Content-Length, -1 chunked, -2 until close
	got     int64
	eof     bool // the body ended where its framing says
	failed  bool
	failEnd accesslog.End // how the body failed: timeout or backend reset
	reuse   bool
	closed  bool
	finish  func(reuse bool)
	held    *clientLimit // the count of src to end on Close; nil when none
	src     netip.Addr
	// The access log's record, ended on Close.
	log  *reqLog
	s    *Server
	plan plan
}

func (b *backendBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.failed || b.closed {
		return 0, io.ErrUnexpectedEOF
	}
	if b.timeout > 0 {
		b.conn.SetReadDeadline(time.Now().Add(b.timeout))
	}
	n, err := b.r.Read(p)
	b.got += int64(n)
	switch {
	case err == nil:
	case err == io.EOF && b.want >= 0 && b.got < b.want:
		err = io.ErrUnexpectedEOF // the backend closed within the body
	case err == io.EOF && b.want == -1:
		// The last chunk: the trailer section (discarded) ends the body.
		if terr := skipTrailer(b.br); terr != nil {
			err = terr
		}
	}
	if err == io.EOF {
		b.eof = true
	} else if err != nil {
		b.failed = true
		err = asTimeout(err)
		b.failEnd = endOf(err)
	}
	return n, err
}

// Close ends the body: the connection is reused only when the body was
// read to its end.
func (b *backendBody) Close() error {
	if !b.closed {
		b.closed = true
		b.finish(b.reuse && b.eof && !b.failed)
		if b.held != nil {
			b.held.release(b.src)
		}
		if g := b.log; g != nil {
			b.log = nil
			switch {
			case b.eof:
			case b.failed:
				g.end = b.failEnd
			default:
				g.end = accesslog.EndClientAbort
			}
			b.s.endLog(g, &b.plan, g.status, b.got, b.s.clock.Now())
			reqLogPool.Put(g)
		}
	}
	return nil
}

// skipTrailer reads the trailer section after a chunked body's last chunk
// up to the empty line, at most 16 KiB.
func skipTrailer(br *bufio.Reader) error {
	for n := 0; n < 16<<10; {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if len(line) == 2 && line[0] == '\r' {
			return nil
		}
		n += len(line)
	}
	return errBadTrailer
}

var errBadTrailer = errors.New("backend answer's trailer section too large")

// uploadPrefetch is how much of a streamed request body must have arrived
// before a backend connection is taken for it.
const uploadPrefetch = 64 << 10

// prefetchBody reads the first uploadPrefetch bytes of a streamed body
// whose Content-Length is cl (-1 chunked), or all of a shorter one.
func prefetchBody(r io.Reader, cl int) ([]byte, error) {
	n := uploadPrefetch
	if cl >= 0 && cl < n {
		n = cl
	}
	buf := make([]byte, n)
	k, err := io.ReadFull(r, buf)
	if cl < 0 && (err == io.EOF || err == io.ErrUnexpectedEOF) {
		err = nil // a chunked body shorter than uploadPrefetch: all of it is here
	}
	return buf[:k], err
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

// clientLeft marks g, the record of a request whose streamed body broke
// after n bytes, as a client abort (499, no answer read) when the client
// closed or reset its connection while the body came, rather than sent a
// malformed one (logged 400) or stopped sending (its read timed out).
func (s *Server) clientLeft(ctx *fasthttp.RequestCtx, g *reqLog, n int64) {
	gc, ok := ctx.Conn().(*gateConn)
	if g == nil || !ok || gc.rerr == nil || gc.err != nil || (gc.state != gateBody && gc.state != gateChunked) {
		return
	}
	var ne net.Error
	if errors.As(gc.rerr, &ne) && ne.Timeout() {
		return
	}
	g.end, g.answered, g.status = accesslog.EndClientAbort, true, noAnswer
	g.rec.BytesIn = n
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

// readAnswerHead reads a backend's answer head into h after checking its
// status line as the loop engine does (statusLineOK): fasthttp reads a
// status "000" as 200 and "001" as 1.
func readAnswerHead(h *fasthttp.ResponseHeader, br *bufio.Reader) error {
	p, err := br.Peek(len("HTTP/1.1 200 "))
	if err != nil {
		return err // a timeout stays a timeout (504), a close a close
	}
	if !statusLineOK(p) {
		return errBadAnswer
	}
	return h.Read(br)
}
