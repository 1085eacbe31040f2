package http

// HTTP/2 to clients. A client connection that speaks HTTP/2 (ALPN h2 on
// the TLS listener, or prior-knowledge h2c on -http-h2c-listen) is served
// by golang.org/x/net/http2's server, which does the framing, HPACK, flow
// control and the defences against the known floods; sluice writes no
// framer. Each stream is one request to the same pipeline as HTTP/1.1:
// h2Handler turns the stream's head into an HTTP/1.1 head, runs the
// request-head check (checkHead) on it, parses it into a
// fasthttp.RequestCtx and goes down admit, waitDelay, pick and forward as
// the fasthttp engine's handle does; the answer in ctx.Response is then
// written to the stream. Backends are spoken to in HTTP/1.1, with the
// fasthttp engine's backend clients, whichever engine serves HTTP/1.1.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
)

// Limits of one HTTP/2 client connection. The reset-rate bound is
// x/net/http2's own: at most h2MaxStreams handlers run at once per
// connection and at most 4×h2MaxStreams more wait to start; a client that
// opens and resets streams faster than their handlers end (Rapid Reset,
// CVE-2023-44487) passes that and gets GOAWAY ENHANCE_YOUR_CALM. Header
// blocks (HEADERS and its CONTINUATIONs) are bounded by h2MaxHeaderList:
// past it the connection is closed (CVE-2023-45288); more than 10,000
// control-frame answers (SETTINGS and PING acknowledgements) queued for a
// client that does not read close the connection too.
const (
	// h2MaxStreams is SETTINGS_MAX_CONCURRENT_STREAMS.
	h2MaxStreams = 100
	// h2MaxHeaderList is the HTTP/1.1 head limit: a stream's header list
	// larger than an HTTP/1.1 head may be is refused before it is decoded
	// whole (x/net/http2 advertises it, plus its own allowance for HPACK
	// overhead, as SETTINGS_MAX_HEADER_LIST_SIZE).
	h2MaxHeaderList = maxHeadSize
	// h2MaxReadFrameSize is SETTINGS_MAX_FRAME_SIZE: the protocol's
	// minimum, so a frame read costs at most 16 KiB of buffer.
	h2MaxReadFrameSize = 16 << 10
	// h2StreamWindow and h2ConnWindow bound the request body bytes a
	// client may send before sluice reads them: 256 KiB per stream, 1 MiB
	// per connection over all its streams.
	h2StreamWindow = 256 << 10
	h2ConnWindow   = 1 << 20
)

// H2Stats counts the HTTP/2 client side. Fields are atomics.
type H2Stats struct {
	Conns   atomic.Uint64 // HTTP/2 client connections served (TLS with ALPN h2, and h2c)
	Open    atomic.Int64  // HTTP/2 client connections open now
	Streams atomic.Uint64 // streams handed to the pipeline (each one request)
	// Errors counts the protocol errors the HTTP/2 server answered with a
	// stream or connection error: malformed frames and headers, flow
	// control violations, and the floods it stops (too_many_early_resets
	// for Rapid Reset, oversized header blocks).
	Errors atomic.Uint64
}

// h2State is a server's HTTP/2 side: the x/net/http2 server, the
// connections it serves (closed at the end of Shutdown) and the h2c
// listeners.
type h2State struct {
	once sync.Once
	srv  *http2.Server
	base *http.Server // Shutdown sends GOAWAY to every connection through it
	done chan struct{}

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	lns    []net.Listener
	closed bool
	wg     sync.WaitGroup
}

// h2 returns the server's HTTP/2 side, built on first use.
func (s *Server) h2() *h2State {
	h := &s.h2s
	h.once.Do(func() {
		h.done = make(chan struct{})
		h.conns = map[net.Conn]struct{}{}
		h.srv = &http2.Server{
			MaxConcurrentStreams:         h2MaxStreams,
			MaxReadFrameSize:             h2MaxReadFrameSize,
			MaxUploadBufferPerStream:     h2StreamWindow,
			MaxUploadBufferPerConnection: h2ConnWindow,
			IdleTimeout:                  s.cfg.ClientIdle,
			// A connection whose writes make no progress for this long is
			// closed, as an HTTP/1.1 client that stops reading is.
			WriteByteTimeout: s.cfg.ClientReadTimeout,
			CountError:       func(string) { s.stats.H2.Errors.Add(1) },
		}
		h.base = &http.Server{
			MaxHeaderBytes: h2MaxHeaderList,
			IdleTimeout:    s.cfg.ClientIdle,
			// x/net/http2 logs what clients get wrong (bad prefaces,
			// protocol errors): at debug level, so that a flood of them
			// does not flood the log.
			ErrorLog: slog.NewLogLogger(s.logger.Handler(), slog.LevelDebug),
		}
		// Registers the connections' graceful shutdown (GOAWAY) with
		// base.Shutdown; base itself never listens.
		if err := http2.ConfigureServer(h.base, h.srv); err != nil {
			s.logger.Error("http2 server configuration", "err", err)
		}
	})
	return h
}

// track adds c to the connections served; false after Shutdown began.
func (h *h2State) track(c net.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.conns[c] = struct{}{}
	h.wg.Add(1)
	return true
}

func (h *h2State) untrack(c net.Conn) {
	h.mu.Lock()
	delete(h.conns, c)
	h.mu.Unlock()
	h.wg.Done()
}

// serveH2 serves c, a client connection whose next bytes are the HTTP/2
// client preface (a TLS connection that negotiated ALPN h2, or an h2c
// connection), until it ends, then closes it. The connection's count
// under the client limits is the caller's, ended by c.Close.
func (s *Server) serveH2(c net.Conn) {
	h := s.h2()
	if !h.track(c) {
		c.Close()
		return
	}
	defer h.untrack(c)
	defer c.Close()
	s.stats.H2.Conns.Add(1)
	s.stats.H2.Open.Add(1)
	defer s.stats.H2.Open.Add(-1)
	h.srv.ServeConn(c, &http2.ServeConnOpts{
		BaseConfig: h.base,
		Handler:    &h2Handler{s: s, conn: c},
	})
}

// ListenAndServeH2C listens on Config.H2CListen and serves h2c there.
func (s *Server) ListenAndServeH2C() error {
	ln, err := net.Listen("tcp", s.cfg.H2CListen)
	if err != nil {
		return errors.New("listen -http-h2c-listen " + s.cfg.H2CListen + ": " + err.Error())
	}
	return s.ServeH2C(ln)
}

// ServeH2C serves HTTP/2 over cleartext with prior knowledge (RFC 9113
// §3.3) on ln until Shutdown: every connection must open with the HTTP/2
// client preface; anything else (an HTTP/1.1 request, an Upgrade: h2c) is
// answered 505 (checkH2CPreface) and closed. Connections are counted
// under -http-max-conns and -http-max-conns-per-source with those of the
// HTTP/1.1 listener. It returns nil after Shutdown.
func (s *Server) ServeH2C(ln net.Listener) error {
	h := s.h2()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		ln.Close()
		return nil
	}
	h.lns = append(h.lns, ln)
	h.mu.Unlock()
	s.logger.Info("http h2c serving", "addr", ln.Addr().String())
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			select {
			case <-h.done:
				return nil
			default:
			}
			if !resourceErr(err) {
				return err
			}
			backoff = nextBackoff(backoff)
			s.acceptLog.failed(s.logger, err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		var ip netip.Addr
		if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			ip = ta.AddrPort().Addr().Unmap()
		}
		if hit := s.conns.admit(ip); hit != notLimited {
			s.connLimited(hit, ip)
			c.Close()
			continue
		}
		if s.proxyFrom(ip) {
			go s.serveH2Proxied(c, ip)
			continue
		}
		go s.serveH2C(&countedConn{Conn: c, release: func() { s.conns.release(ip) }})
	}
}

// h2cPrefaceTimeout bounds the wait for an h2c connection's first bytes:
// x/net's server gives the preface 10 s as well.
const h2cPrefaceTimeout = 10 * time.Second

// serveH2C serves an h2c connection once it opened with the HTTP/2
// preface; any other opening (an HTTP/1.1 request) gets a 505 that says
// the port speaks h2c only.
func (s *Server) serveH2C(c net.Conn) {
	pc, ok := checkH2CPreface(c, min(s.cfg.ClientReadTimeout, h2cPrefaceTimeout))
	if !ok {
		c.Close()
		return
	}
	s.serveH2(pc)
}

// serveH2Proxied serves an h2c connection from a -proxy-protocol-from
// balancer (peer): its PROXY header first, then HTTP/2 as the client it
// names (its address, its count under the per-source limit).
func (s *Server) serveH2Proxied(c net.Conn, peer netip.Addr) {
	var port uint16
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		port = ta.AddrPort().Port()
	}
	cl, err := s.readProxy(c, netip.AddrPortFrom(peer, port), time.Time{})
	if err == nil && cl.Addr() != peer {
		if hit := s.conns.rekey(peer, cl.Addr()); hit != notLimited {
			s.connLimited(hit, cl.Addr())
			err = errSourceLimited
		}
	}
	if err != nil {
		c.Close()
		s.conns.release(peer)
		return
	}
	ip := cl.Addr()
	s.serveH2C(&countedConn{Conn: proxyConn{Conn: c, remote: net.TCPAddrFromAddrPort(cl)}, release: func() { s.conns.release(ip) }})
}

// countedConn ends its connection's count under the client limits once,
// when it is closed.
type countedConn struct {
	net.Conn
	release func()
	closed  atomic.Bool
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.release()
	}
	return err
}

// shutdownH2 stops the h2c listeners, sends GOAWAY to every HTTP/2
// connection, lets their streams finish until ctx is done, then closes
// what is left.
func (s *Server) shutdownH2(ctx context.Context) error {
	h := s.h2()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	close(h.done)
	for _, ln := range h.lns {
		ln.Close()
	}
	h.mu.Unlock()
	h.base.Shutdown(ctx) // GOAWAY; returns at once, base serves no connection itself
	all := make(chan struct{})
	go func() { h.wg.Wait(); close(all) }()
	select {
	case <-all:
		return nil
	case <-ctx.Done():
	}
	h.mu.Lock()
	for c := range h.conns {
		c.Close()
	}
	h.mu.Unlock()
	<-all
	return ctx.Err()
}

// h2Handler serves the streams of one HTTP/2 connection.
type h2Handler struct {
	s    *Server
	conn net.Conn
	// bodies is the request body bytes the connection's streams hold in
	// memory now (read whole before admission), at most
	// -http-stream-threshold over all of them, as an HTTP/1.1 connection
	// holds at most one such body: a stream whose body does not fit is
	// streamed to its backend instead. Without it one connection's
	// h2MaxStreams uploads that never end would hold h2MaxStreams times
	// what an HTTP/1.1 connection may.
	bodies atomic.Int64
}

// h2Stream is what one stream in flight keeps: its request context, its
// HTTP/1.1 head and the buffers to parse it and copy the answer. Pooled.
type h2Stream struct {
	ctx  fasthttp.RequestCtx
	head []byte
	rd   bytes.Reader
	br   *bufio.Reader
	buf  []byte
	body *h2Body // the request body, when there is one
	held int64   // bytes of the connection's body budget this stream holds
}

var h2Streams = sync.Pool{New: func() any {
	st := &h2Stream{buf: make([]byte, 32<<10)}
	st.br = bufio.NewReaderSize(nil, maxHeadSize+4<<10)
	return st
}}

// Refusals of an HTTP/2 request head, besides checkHead's.
var (
	errH2Host        = badHead("Host differs from :authority")
	errH2Char        = badHead("line break or NUL in a pseudo-header or header field")
	errH2BodyMissing = badHead("Content-Length without a body")
	errH2BodyLength  = badHead("Content-Length differs from the body")
	errH2Body        = badHead("malformed request body")
)

// ServeHTTP runs one stream through the pipeline.
func (h *h2Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := h.s
	s.stats.H2.Streams.Add(1)
	st := h2Streams.Get().(*h2Stream)
	reuse := true
	defer func() {
		if st.body != nil {
			st.body.end()
		}
		if st.held != 0 {
			h.bodies.Add(-st.held)
			st.held = 0
		}
		if reuse {
			// Nothing of this stream stays reachable from the pool.
			st.body = nil
			st.ctx.Request.Reset()
			st.ctx.Response.Reset()
			st.rd.Reset(nil)
			st.br.Reset(nil)
			h2Streams.Put(st)
		}
	}()
	ctx := &st.ctx
	ctx.Init2(h.conn, fasthttpLogger{s.logger}, false)
	rc := http.NewResponseController(w)
	ip := remoteAddr(ctx)
	var began int64 // the stream's head was read (Go's HTTP/2 server read it)
	if s.logging() {
		began = s.clock.Now()
	}

	if he := s.h2Request(st, r, rc, &h.bodies); he != nil {
		s.stats.BadRequest.Add(1)
		s.logger.Debug("http request refused", "reason", he.reason, "client", r.RemoteAddr, "proto", "h2")
		if s.logging() {
			// A stream refused before it became a request (its head, or
			// a body that broke or stalled) has its line too, as an
			// HTTP/1.1 head refused does; bytes_in is what was read.
			s.logH2Refused(r, began, st, he)
		}
		s.writeRefusal(&ctx.Response, he.status, 0, he.proxyStatus(), he.reason)
		s.writeH2(w, rc, &ctx.Response, r.Method == http.MethodHead, st.buf)
		return
	}
	if r.Context().Err() != nil {
		return // the stream was reset while its body was read
	}
	hdr := &ctx.Request.Header
	var p plan
	p.secure = connSecure(h.conn) // admit keeps it: X-Forwarded-Proto https, a Secure cookie
	v := viewPool.Get().(*reqView)
	defer viewPool.Put(v)
	now := s.clock.Now()
	req, d := s.admit(&p, hdr, v, now)
	var g *reqLog
	if s.cfg.RequestID || s.logging() {
		g = reqLogPool.Get().(*reqLog)
		client, _ := netip.ParseAddrPort(r.RemoteAddr)
		start := now
		if began != 0 && began <= now {
			start = began
		}
		s.beginLog(g, &p, hdr, netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), h.conn, s.wall(start), start, now)
		g.rec.Proto = "HTTP/2.0"
		defer s.endH2Log(ctx, g, &p)
	}
	if d.Verdict == admission.Delay {
		s.markDelayed(g, d)
		// The stream's context ends when the client resets it or the
		// connection goes: its request leaves the queue at once.
		d = s.waitDelay(s.h2s.done, r.Context().Done(), ip, &req, d)
		if g != nil {
			g.decided = s.clock.Now()
		}
		if r.Context().Err() != nil {
			if g != nil {
				g.end, g.answered, g.status = accesslog.EndClientAbort, true, noAnswer
			}
			return
		}
	}
	if s.pick(&p, &ctx.Response, &req, d, hdr, ip) {
		s.forward(ctx, &p, v, g)
		s.observe(&p)
	} else if g != nil {
		g.refused = true
	}
	if g != nil && !g.answered {
		g.localAnswer(&ctx.Response)
	}
	if g != nil && g.streamed {
		// Ended here after the body's Close (endH2Log), not by it.
		if bb, ok := ctx.Response.BodyStream().(*backendBody); ok {
			bb.log, g.body = nil, bb
		}
		g.streamed = false
	}
	resp := &ctx.Response
	if tr := ctx.LastTimeoutErrorResponse(); tr != nil {
		// Ended by memory state Critical (roundTrip): the abandoned
		// exchange still owns ctx, which must not be used again.
		reuse = false
		resp = tr
	}
	defer resp.CloseBodyStream() // the backend connection goes back, or is closed
	if err := s.writeH2(w, rc, resp, r.Method == http.MethodHead, st.buf); errors.Is(err, errH2Truncated) {
		// The client must not take a cut answer for a whole one: the
		// stream is reset (RST_STREAM INTERNAL_ERROR).
		resp.CloseBodyStream()
		panic(http.ErrAbortHandler)
	}
}

// logH2Refused logs a stream h2Request refused: the client, method,
// host and path, the status and reason, and the body bytes read. Rare
// and not on the hot path: it may allocate.
func (s *Server) logH2Refused(r *http.Request, began int64, st *h2Stream, he *headError) {
	client, _ := netip.ParseAddrPort(r.RemoteAddr)
	now := s.clock.Now()
	if began == 0 || began > now {
		began = now
	}
	rec := &accesslog.HTTPRecord{
		Start: s.wall(began), Client: netip.AddrPortFrom(client.Addr().Unmap(), client.Port()),
		Method: []byte(r.Method), Host: []byte(r.Host), Path: []byte(r.URL.Path), Proto: "HTTP/2.0",
		Status: he.status, Decision: accesslog.Refused, Reason: []byte(he.reason),
		End: accesslog.EndRefused, Total: time.Duration(now - began),
		BytesIn: int64(len(st.ctx.Request.Body())),
	}
	s.alog.LogHTTP(rec)
}

// h2Request fills st.ctx.Request from r: the head as HTTP/1.1, checked by
// checkHead and parsed by fasthttp as an HTTP/1.1 head is, and the body,
// read whole up to -http-stream-threshold as on HTTP/1.1, else streamed.
// It returns the refusal of a head HTTP/1.1 would refuse too, or one
// HTTP/2 alone makes malformed.
//
// A body read whole takes its bytes from the connection's budget
// (bodies, at most -http-stream-threshold); one that does not fit in
// what is left is streamed, as a body over the threshold is.
func (s *Server) h2Request(st *h2Stream, r *http.Request, rc *http.ResponseController, bodies *atomic.Int64) *headError {
	head, he := appendH2Head(st.head[:0], r)
	st.head = head
	if he != nil {
		return he
	}
	hi, err := checkHead(head, *s.denyNames.Load())
	err = s.checkLoop(hi, head, err)
	if err != nil {
		var he *headError
		if !errors.As(err, &he) {
			he = errRequestLine
		}
		return he
	}
	req := &st.ctx.Request
	st.rd.Reset(head)
	st.br.Reset(&st.rd)
	if err := req.Header.Read(st.br); err != nil {
		return errRequestLine
	}
	req.UseHostHeader = true
	req.Header.Del("Expect") // the body is read by sluice (x/net/http2 answers 100-continue)
	// The body. Its length is what the client sent in DATA frames, which
	// x/net/http2 holds to a Content-Length the client declared; the
	// backend gets exactly those bytes with a Content-Length, or chunked
	// when the client declared none and sent more than the threshold.
	cl, limit := r.ContentLength, int64(s.cfg.StreamThreshold)
	if r.Body == nil || r.Body == http.NoBody || cl == 0 {
		// No body, or an empty one (x/net/http2 resets a stream whose
		// DATA exceed its declared length).
		if hi.bodyLen > 0 {
			return errH2BodyMissing
		}
		return nil
	}
	if hi.bodyLen >= 0 && hi.bodyLen != cl {
		return errH2BodyLength
	}
	body := &h2Body{r: r.Body, rc: rc, timeout: s.cfg.ClientReadTimeout}
	st.body = body
	want := limit
	if cl >= 0 {
		want = min(cl, limit)
	}
	st.held = reserveBodies(bodies, int64(s.cfg.StreamThreshold), want)
	if cl > limit || cl >= 0 && st.held < cl {
		bodies.Add(-st.held) // streamed: nothing of it is held
		st.held = 0
		req.SetBodyStream(body, int(cl))
		return nil
	}
	limit = st.held
	var n int64
	err = nil
	for n <= limit && err == nil {
		var k int
		k, err = body.Read(st.buf[:min(int64(len(st.buf)), limit+1-n)])
		req.AppendBody(st.buf[:k])
		n += int64(k)
	}
	if err != nil && err != io.EOF {
		return errH2Body
	}
	switch {
	case cl >= 0 && n != cl:
		return errH2BodyLength
	case n <= limit:
		bodies.Add(n - st.held) // what the body did not take goes back
		st.held = n
		req.Header.SetContentLength(int(n))
		return nil
	}
	// Over the threshold without a declared length: what was read goes
	// first, the rest is streamed (chunked to the backend).
	first := bytes.Clone(req.Body())
	req.ResetBody()
	req.SetBodyStream(io.MultiReader(bytes.NewReader(first), body), -1)
	return nil
}

// reserveBodies takes up to want bytes from a connection's body budget
// (used of max) and returns how many it took.
func reserveBodies(used *atomic.Int64, max, want int64) int64 {
	for {
		u := used.Load()
		n := min(want, max-u)
		if n <= 0 {
			return 0
		}
		if used.CompareAndSwap(u, u+n) {
			return n
		}
	}
}

// appendH2Head appends r's head as an HTTP/1.1 head: the request line
// from :method and :path, Host from :authority, then the header fields
// (several Cookie fields joined with "; ", RFC 9113 §8.2.3). A Host field
// that differs from :authority is refused (RFC 9113 §8.3.1), and so is any
// CR, LF or NUL, which would start a line of the client's making
// (x/net/http2 refuses them already; the check does not depend on it).
func appendH2Head(dst []byte, r *http.Request) ([]byte, *headError) {
	if hv, ok := r.Header["Host"]; ok && (len(hv) != 1 || hv[0] != r.Host) {
		return dst, errH2Host
	}
	if badH2(r.Method) || badH2(r.RequestURI) || badH2(r.Host) {
		return dst, errH2Char
	}
	if r.Method == "" || r.RequestURI == "" || strings.IndexByte(r.Method, ' ') >= 0 || strings.IndexByte(r.RequestURI, ' ') >= 0 || strings.IndexByte(r.Host, ' ') >= 0 {
		return dst, errRequestLine
	}
	dst = append(dst, r.Method...)
	dst = append(dst, ' ')
	dst = append(dst, r.RequestURI...)
	dst = append(dst, " HTTP/1.1\r\n"...)
	if r.Host != "" {
		dst = append(dst, "Host: "...)
		dst = append(dst, r.Host...)
		dst = append(dst, "\r\n"...)
	}
	for k, vs := range r.Header {
		if k == "Host" {
			continue
		}
		if badH2(k) {
			return dst, errH2Char
		}
		if k == "Cookie" && len(vs) > 1 {
			dst = append(dst, "Cookie: "...)
			for i, v := range vs {
				if badH2(v) {
					return dst, errH2Char
				}
				if i > 0 {
					dst = append(dst, "; "...)
				}
				dst = append(dst, v...)
			}
			dst = append(dst, "\r\n"...)
			continue
		}
		for _, v := range vs {
			if badH2(v) {
				return dst, errH2Char
			}
			dst = append(dst, k...)
			dst = append(dst, ": "...)
			dst = append(dst, v...)
			dst = append(dst, "\r\n"...)
		}
		if len(dst) > maxHeadSize {
			return dst, errHeadTooLarge
		}
	}
	dst = append(dst, "\r\n"...)
	if len(dst) > maxHeadSize {
		return dst, errHeadTooLarge
	}
	return dst, nil
}

// badH2 reports whether s holds CR, LF or NUL.
func badH2(s string) bool { return strings.ContainsAny(s, "\r\n\x00") }

// h2Body is a stream's request body, each read within
// -http-client-timeout, as an HTTP/1.1 body is read. An exchange that
// memory state Critical abandoned (roundTrip) may read it after the
// handler returned, when the stream's ResponseController must no longer
// be used: end marks that moment.
type h2Body struct {
	r       io.Reader
	rc      *http.ResponseController
	timeout time.Duration
	mu      sync.Mutex
	ended   bool
}

var errH2StreamEnded = errors.New("http2 stream ended")

func (b *h2Body) Read(p []byte) (int, error) {
	if b.timeout > 0 {
		b.mu.Lock()
		ended := b.ended
		if !ended {
			b.rc.SetReadDeadline(time.Now().Add(b.timeout))
		}
		b.mu.Unlock()
		if ended {
			return 0, errH2StreamEnded
		}
	}
	return b.r.Read(p)
}

// end is called as the stream's handler returns.
func (b *h2Body) end() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
}

// errH2Truncated: the backend's answer broke off within its body.
var errH2Truncated = errors.New("answer body cut off")

// writeH2 writes resp to the stream: the status, the header fields but
// the hop-by-hop ones (HTTP/2 has no Connection, Keep-Alive,
// Transfer-Encoding or Upgrade), a Content-Length when the answer has one,
// and the body, streamed (each write within -http-client-timeout, flushed
// as it comes). No Date or Content-Type is added that the answer did not
// have, as on HTTP/1.1. It returns errH2Truncated when the body broke off.
func (s *Server) writeH2(w http.ResponseWriter, rc *http.ResponseController, resp *fasthttp.Response, head bool, buf []byte) error {
	hdr := w.Header()
	resp.Header.SetNoDefaultContentType(true) // as the fasthttp server answers
	for k, v := range resp.Header.All() {
		if h2Hop(k) {
			continue
		}
		name := http.CanonicalHeaderKey(string(k))
		hdr[name] = append(hdr[name], string(v))
	}
	if _, ok := hdr["Date"]; !ok {
		hdr["Date"] = nil // x/net/http2 would add one
	}
	if _, ok := hdr["Content-Type"]; !ok {
		hdr["Content-Type"] = nil // x/net/http2 would sniff one
	}
	status := resp.StatusCode()
	stream := resp.IsBodyStream()
	cl := -1
	switch {
	case status == http.StatusNoContent || status < 200:
	case stream, head, status == http.StatusNotModified:
		cl = resp.Header.ContentLength()
	default:
		cl = len(resp.Body())
	}
	if cl >= 0 {
		hdr["Content-Length"] = []string{strconv.Itoa(cl)}
	}
	deadline := func() {
		if d := s.cfg.ClientReadTimeout; d > 0 {
			rc.SetWriteDeadline(time.Now().Add(d))
		}
	}
	deadline()
	w.WriteHeader(status)
	if head || status == http.StatusNoContent || status == http.StatusNotModified {
		return nil
	}
	if !stream {
		_, err := w.Write(resp.Body())
		return err
	}
	body := resp.BodyStream()
	for {
		n, err := body.Read(buf)
		if n > 0 {
			deadline()
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if ferr := rc.Flush(); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return errH2Truncated
		}
	}
}

// h2Hop reports whether an answer header is one HTTP/2 does not carry
// (RFC 9113 §8.2.2) or one writeH2 sets itself (Content-Length).
func h2Hop(k []byte) bool {
	switch len(k) {
	case 2:
		return bytes.EqualFold(k, []byte("TE"))
	case 7:
		return bytes.EqualFold(k, []byte("Upgrade")) || bytes.EqualFold(k, []byte("Trailer"))
	case 10:
		return bytes.EqualFold(k, []byte("Connection")) || bytes.EqualFold(k, []byte("Keep-Alive"))
	case 14:
		return bytes.EqualFold(k, []byte("Content-Length"))
	case 16:
		return bytes.EqualFold(k, []byte("Proxy-Connection"))
	case 17:
		return bytes.EqualFold(k, []byte("Transfer-Encoding"))
	}
	return false
}

var (
	descH2Conns   = prometheus.NewDesc("sluice_http2_conns_total", "HTTP/2 client connections served (TLS with ALPN h2, and h2c).", nil, nil)
	descH2Open    = prometheus.NewDesc("sluice_http2_conns_open", "HTTP/2 client connections open now.", nil, nil)
	descH2Streams = prometheus.NewDesc("sluice_http2_streams_total", "HTTP/2 streams taken as requests (each is admitted, refused or forwarded as an HTTP/1.1 request is).", nil, nil)
	descH2Errors  = prometheus.NewDesc("sluice_http2_errors_total", "HTTP/2 protocol errors answered with a stream or connection error, the stopped floods among them (Rapid Reset, oversized header blocks).", nil, nil)
)

func describeH2(ch chan<- *prometheus.Desc) {
	ch <- descH2Conns
	ch <- descH2Open
	ch <- descH2Streams
	ch <- descH2Errors
}

func collectH2(ch chan<- prometheus.Metric, st *H2Stats) {
	ch <- prometheus.MustNewConstMetric(descH2Conns, prometheus.CounterValue, float64(st.Conns.Load()))
	ch <- prometheus.MustNewConstMetric(descH2Open, prometheus.GaugeValue, float64(st.Open.Load()))
	ch <- prometheus.MustNewConstMetric(descH2Streams, prometheus.CounterValue, float64(st.Streams.Load()))
	ch <- prometheus.MustNewConstMetric(descH2Errors, prometheus.CounterValue, float64(st.Errors.Load()))
}
