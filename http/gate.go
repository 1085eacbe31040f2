package http

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/proxyproto"
)

// gateConn is the front door of every client connection the fasthttp
// engine reads (its own, and those the loop hands over): fasthttp reads a
// request head only after checkHead accepted it, so both engines accept
// and refuse the same heads. The gate follows each body by the framing
// checkHead decided (Content-Length, or chunked with the strict chunk
// scanner), so it knows where the next head starts. A refused head is
// replaced by a line fasthttp cannot parse: fasthttp answers it through
// Server.refuseHeadCtx (the same answer the loop gives) and closes the
// connection, after answering the requests before it in order.
type gateConn struct {
	net.Conn
	s      *Server
	buf    []byte // bytes read from the client: buf[r:w] not yet passed on
	r, w   int
	ok     int   // buf[r:r+ok] is checked and may be passed on
	state  uint8 // gateHead, gateBody, gateChunked, gateRefused, gatePoisoned
	remain int64 // gateBody: body bytes still to come
	chunk  chunkScan
	err    *headError // the refused head
	rerr   error      // the read error to return once buf is passed on
	// release ends the connection's count under the client limits
	// (connlimit.go), once, when it is closed; nil when not counted.
	release func()
	closed  atomic.Bool
	// tunnel: the backend switched protocols (tunnel.go); from here Read
	// passes the client's bytes on unchecked, as the tunnel's.
	tunnel atomic.Bool
	// proxy is the PROXY protocol state (proxyin.go): proxyRead, the
	// header is still to be read; proxySniff, a header would be refused
	// (the source is not a balancer); proxyDone, neither.
	proxy uint8
	// peer is the socket's peer; remote, when set, the client a PROXY
	// header named, which RemoteAddr reports.
	peer   netip.AddrPort
	remote net.Addr
	// The access log's head timing, on the server's clock, when requests
	// are logged: headBegin is when the gate first saw bytes of the head
	// being read (0: none yet); lastBegin and lastHead are the last
	// accepted head's begin and the moment it was whole.
	headBegin, lastBegin, lastHead int64
	// bodyHead is a copy of the last accepted head of a request with a
	// body, when requests are logged: fasthttp forgets the head of a
	// request whose body fails, and a body cut short is logged as its
	// request (logBodyCut).
	bodyHead []byte
}

const (
	proxyDone = iota
	proxyRead
	proxySniff
)

// RemoteAddr is the client's address: the one a PROXY header named, else
// the socket's peer.
func (g *gateConn) RemoteAddr() net.Addr {
	if g.remote != nil {
		return g.remote
	}
	return g.Conn.RemoteAddr()
}

// readProxyHeader reads the PROXY header of a connection from a balancer
// and takes its client as the connection's (its address, its count under
// the per-source limit). On error the connection is to be closed.
func (g *gateConn) readProxyHeader() error {
	g.proxy = proxyDone
	cl, err := g.s.readProxy(g.Conn, g.peer, time.Now().Add(g.s.cfg.ClientReadTimeout))
	if err != nil {
		return err
	}
	if cl.Addr() != g.peer.Addr() {
		if hit := g.s.conns.rekey(g.peer.Addr(), cl.Addr()); hit != notLimited {
			g.s.connLimited(hit, cl.Addr())
			return errSourceLimited
		}
		ip := cl.Addr()
		g.release = func() { g.s.conns.release(ip) }
	}
	g.remote = net.TCPAddrFromAddrPort(cl)
	return nil
}

// errSourceLimited ends a connection whose PROXY header named a client
// over -http-max-conns-per-source.
var errSourceLimited = errors.New("client connections from this source at their limit")

// Write writes answer bytes, each write within -http-client-timeout: a
// client that stops reading is dropped, as on the loop, and the backend
// connection its streamed answer came on is closed rather than held.
// (fasthttp's WriteTimeout would bound the whole answer, cutting long
// downloads.)
func (g *gateConn) Write(p []byte) (int, error) {
	if d := g.s.cfg.ClientReadTimeout; d > 0 {
		g.Conn.SetWriteDeadline(time.Now().Add(d))
	}
	return g.Conn.Write(p)
}

// Close closes the connection and ends its count under the client limits.
func (g *gateConn) Close() error {
	err := g.Conn.Close()
	if g.closed.CompareAndSwap(false, true) && g.release != nil {
		g.release()
	}
	return err
}

const (
	gateHead = iota
	gateBody
	gateChunked
	gateRefused
	gatePoisoned
)

// gatePoison is what fasthttp reads in place of a refused head: no method,
// so it fails at once.
var gatePoison = []byte("\x00\r\n\r\n")

// gate wraps c; prefix holds bytes already read from it (a hand-over).
func (s *Server) gate(c net.Conn, prefix []byte) *gateConn {
	g := &gateConn{Conn: c, s: s, buf: make([]byte, max(4<<10, len(prefix)))}
	g.w = copy(g.buf, prefix)
	return g
}

// Read passes on checked bytes, reading and checking more as needed.
func (g *gateConn) Read(p []byte) (int, error) {
	if g.tunnel.Load() {
		if g.r < g.w {
			n := copy(p, g.buf[g.r:g.w])
			g.r += n
			return n, nil
		}
		return g.Conn.Read(p)
	}
	if g.proxy == proxyRead {
		if err := g.readProxyHeader(); err != nil {
			// Closed unanswered: at EOF before a request fasthttp
			// answers nothing (another error would get a 400).
			g.rerr = io.EOF
			g.state = gatePoisoned
			return 0, io.EOF
		}
	}
	for {
		if g.ok > 0 {
			n := copy(p, g.buf[g.r:g.r+g.ok])
			g.r += n
			g.ok -= n
			return n, nil
		}
		switch g.state {
		case gateRefused:
			g.state = gatePoisoned
			return copy(p, gatePoison), nil
		case gatePoisoned:
			return 0, io.EOF
		}
		if g.r < g.w && g.check() {
			continue
		}
		if g.rerr != nil {
			return 0, g.rerr
		}
		if err := g.fill(); err != nil {
			if g.r < g.w && g.state == gateHead {
				// A head cut off by EOF or a timeout: dropped, as fasthttp
				// drops an unfinished request.
				g.r = g.w
			}
			if err == io.EOF && (g.state == gateBody || g.state == gateChunked) {
				err = io.ErrUnexpectedEOF // the client left in the middle of a body
			}
			g.rerr = err
		}
	}
}

// check looks at the unchecked bytes buf[r:w] and marks what may be passed
// on; it returns false when it needs more bytes.
func (g *gateConn) check() bool {
	avail := g.buf[g.r:g.w]
	switch g.state {
	case gateHead:
		logging := g.s.logging()
		if logging && g.headBegin == 0 {
			g.headBegin = g.s.clock.Now()
		}
		if g.proxy == proxySniff {
			if proxyproto.Sniff(avail) {
				g.s.proxyRejected(proxyproto.ReasonUntrusted, g.peer.Addr(), nil)
				g.r, g.w = 0, 0
				g.state = gatePoisoned
				g.rerr = io.EOF
				return false
			}
			if len(avail) >= 6 || !mayBeProxy(avail) {
				g.proxy = proxyDone
			}
		}
		hi, err := checkHead(avail, *g.s.denyNames.Load())
		err = g.s.checkLoop(hi, avail, err)
		if err == errHeadIncomplete {
			return false
		}
		if err != nil {
			var he *headError
			if !errors.As(err, &he) {
				he = errRequestLine
			}
			g.err, g.state = he, gateRefused
			g.s.stats.BadRequest.Add(1)
			g.s.logger.Debug("http request refused", "reason", he.reason, "client", g.RemoteAddr().String())
			g.r, g.w = 0, 0
			return true
		}
		g.ok = hi.n
		if logging {
			g.lastBegin, g.lastHead, g.headBegin = g.headBegin, g.s.clock.Now(), 0
			if hi.chunked || hi.bodyLen > 0 {
				g.bodyHead = append(g.bodyHead[:0], avail[:hi.n]...)
			}
		}
		switch {
		case hi.chunked:
			g.state, g.chunk = gateChunked, chunkScan{strict: true}
		case hi.bodyLen > 0:
			g.state, g.remain = gateBody, hi.bodyLen
		}
	case gateBody:
		n := int64(len(avail))
		if n >= g.remain {
			n = g.remain
			g.state = gateHead
		}
		g.remain -= n
		g.ok = int(n)
	case gateChunked:
		n, done, err := g.chunk.feed(avail)
		g.ok = n
		if err != nil {
			// A broken chunked body: what came before it is passed on,
			// then the connection ends; fasthttp reads a truncated body
			// and answers 400.
			g.state, g.err = gatePoisoned, badHead("malformed chunked body")
			g.w = g.r + n
		} else if done {
			g.state = gateHead
		}
		if n == 0 && !done && err == nil {
			return false
		}
	}
	return true
}

// watch reads the client's connection while its request waits in an ARM
// delay queue (when fasthttp reads nothing of it), to learn whether the
// client left: the returned channel is closed when the connection ends.
// Bytes that come meanwhile (a pipelined request) are kept for Read. The
// returned end stops watching; it must be called before fasthttp reads
// the connection again.
func (g *gateConn) watch() (<-chan struct{}, func()) {
	gone, exited := make(chan struct{}), make(chan struct{})
	var stopping atomic.Bool
	g.Conn.SetReadDeadline(time.Time{}) // the wait is bounded by the rule, not the read timeout
	go func() {
		defer close(exited)
		for !stopping.Load() {
			if g.w == len(g.buf) && (g.r == 0 || g.r == g.w) && len(g.buf) >= maxHeadSize+4<<10 {
				return // the buffer is full: nothing more to learn
			}
			if err := g.fill(); err != nil {
				if !stopping.Load() {
					g.rerr = err
					close(gone)
				}
				return
			}
		}
	}()
	return gone, func() {
		stopping.Store(true)
		g.Conn.SetReadDeadline(time.Unix(1, 0)) // ends the read under way
		<-exited
		g.Conn.SetReadDeadline(time.Time{})
	}
}

// fill reads more bytes from the client into buf.
func (g *gateConn) fill() error {
	if g.r == g.w {
		g.r, g.w = 0, 0
	} else if g.r > 0 && g.w == len(g.buf) {
		g.w = copy(g.buf, g.buf[g.r:g.w])
		g.r = 0
	}
	if g.w == len(g.buf) {
		if len(g.buf) >= maxHeadSize+4<<10 {
			return nil // cannot happen: checkHead refuses heads over maxHeadSize
		}
		nb := make([]byte, min(2*len(g.buf), maxHeadSize+4<<10))
		copy(nb, g.buf[:g.w])
		g.buf = nb
	}
	n, err := g.Conn.Read(g.buf[g.w:])
	g.w += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// errorHandlerCtx answers what fasthttp could not read: a head the gate
// refused gets the refusal checkHead gave (the loop's answer), others the
// status fasthttp would give. fasthttp closes the connection after it.
func (s *Server) errorHandlerCtx(ctx *fasthttp.RequestCtx, err error) {
	if g, ok := ctx.Conn().(*gateConn); ok && g.err != nil {
		s.logHeadRefused(clientAddrPort(ctx), s.wall(s.clock.Now()), 0, g.err.status, g.err.reason)
		s.writeRefusal(&ctx.Response, g.err.status, 0, g.err.proxyStatus(), g.err.reason)
		return
	}
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	timeout := errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
	logged := false
	if g, ok := ctx.Conn().(*gateConn); ok && (g.state == gateBody || g.state == gateChunked) && g.rerr != nil {
		// The head came whole and the body did not: the client left
		// (or stopped sending) while its body was coming. Logged as
		// that request, not as a malformed one.
		// A client that only shut its side down reads the answer below.
		s.logBodyCut(ctx, g, timeout)
		logged = true
	}
	switch {
	case errors.As(err, &small):
		s.writeRefusal(&ctx.Response, errHeadTooLarge.status, 0, psHeadRefused, errHeadTooLarge.reason)
	case timeout:
		s.writeRefusal(&ctx.Response, fasthttp.StatusRequestTimeout, 0, psHeadRefused, "request timeout")
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		s.writeRefusal(&ctx.Response, fasthttp.StatusRequestEntityTooLarge, 0, psHeadRefused, "request body too large")
	default:
		if !logged {
			s.stats.BadRequest.Add(1)
			s.logHeadRefused(clientAddrPort(ctx), s.wall(s.clock.Now()), 0, fasthttp.StatusBadRequest, "malformed request")
		}
		s.writeRefusal(&ctx.Response, fasthttp.StatusBadRequest, 0, psHeadRefused, "malformed request")
	}
}

// logBodyCut logs the request on g whose body was cut: its head (in ctx)
// was read whole, then the client closed the connection (client_abort,
// status 499) or stopped sending within -http-client-timeout (timeout,
// status 408, the answer fasthttp sends). bytes_in is the body that came.
// Nothing reached a backend.
func (s *Server) logBodyCut(ctx *fasthttp.RequestCtx, gc *gateConn, timeout bool) {
	if !s.logging() {
		return
	}
	var h fasthttp.RequestHeader
	if h.Read(bufio.NewReader(bytes.NewReader(gc.bodyHead))) != nil {
		return
	}
	if auth, rest, ok := splitAbsolute(h.RequestURI()); ok {
		h.SetHostBytes(auth)
		h.SetRequestURIBytes(originForm(nil, rest))
	}
	now := s.clock.Now()
	var p plan
	g := reqLogPool.Get().(*reqLog)
	defer reqLogPool.Put(g)
	start, head := headTimes(ctx, now)
	s.beginLog(g, &p, &h, clientAddrPort(ctx), ctx.Conn(), s.wall(start), start, now)
	g.head = head
	status := noAnswer
	g.end = accesslog.EndClientAbort
	if timeout {
		status, g.end = fasthttp.StatusRequestTimeout, accesslog.EndTimeout
	}
	if cl := h.ContentLength(); gc.state == gateBody && cl > 0 {
		g.rec.BytesIn = max(int64(cl)-gc.remain, 0)
	}
	s.endLog(g, &p, status, 0, now)
}
