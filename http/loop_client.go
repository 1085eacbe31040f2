//go:build linux

package http

import (
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/proxyproto"
)

// cconn is a client connection.
type cconn struct {
	fd       int
	gen      uint32     // bumped when closed or handed over; posted work checks it
	seq      uint32     // bumped per request
	ip       netip.Addr // the client's address: the socket's peer, or the one its PROXY header named
	port     uint16     // and its port
	pp       uint8      // PROXY protocol state: proxyDone, proxyRead, proxySniff (proxyin.go)
	own      *bconn     // an idle connection to a PROXY backend that carries this client's header (proxyout.go)
	in       []byte     // read buffer: in[r:w] not yet consumed
	r, w     int
	rready   bool   // the socket may have unread bytes
	fresh    bool   // read by this round's batch (loop_uring.go), which set rready
	batched  bool   // in the batch of writes being made (loop_uring.go)
	hup      bool   // the peer has shut down its side: read until EOF
	out      []byte // answer bytes the socket did not take yet: out[o:]
	o        int
	busy     bool // a request is being handled
	parsing  bool // clientIn is on the stack
	closing  bool // close once out is written
	deadline int64
	// headStart is when the first bytes of the current request were
	// read (loop clock), for the access log.
	headStart int64
	x         exchange
	tls       *loopTLS // an HTTPS connection's TLS state (tls_loop.go); nil: plain
	// A tunnel (loop_tunnel.go): tun after the backend's 101; tunEOF
	// once the client ended its side; shutWr once sluice shut down
	// writing to it.
	tun, tunEOF, shutWr bool
	// tunNotified: the TLS close_notify that ends sluice's side of an
	// HTTPS tunnel is written.
	tunNotified bool
}

// exchange is the request a client connection is handling: its way
// through the pipeline (plan) and the loop's state of its I/O.
type exchange struct {
	plan
	reqLen        int           // bytes of the request at in[r:]
	bodyLen       int           // its Content-Length, the last bytes of reqLen; -1 when it has none
	req           []byte        // the request as sent to the backend
	bc            *bconn        // the backend connection carrying it; nil before and after
	closeAfter    bool          // close the client connection after the answer
	head          bool          // a HEAD request: the answer has no body
	staleRetry    bool          // resent once after a reused connection turned out closed
	waitUntil     int64         // waiting for a backend connection until then (loop clock); 0 when not waiting
	gotHead       bool          // the answer's head was relayed: a failure can no longer be answered
	informational int           // 1xx answers relayed before the final one
	gone          chan struct{} // waiting in an ARM delay queue: closed when the client leaves
	holding       bool          // counted in Server.held (send), until the request ends
	status        int           // the answer's status
	framing       uint8         // the answer body's framing (answer.go)
	remain        int64         // frameLength: body bytes still to come
	chunk         chunkScan
	bclose        bool   // the backend connection is not reusable afterwards
	upgrade       []byte // an upgrade request: its Upgrade (loop_tunnel.go); nil for others
	tunPending    bool   // counted in Stats.TunnelsPending until answered
	log           reqLog // the access log's record and the request id
	began         int64  // the request was read whole and taken in, on the server's clock (Config.Clock)
}

// halfCloseGrace is how soon after its request a client's FIN is read as a
// half-close (it has nothing more to send and waits for its answer, as
// nc, scripted and pipelining clients do: the FIN comes with or right
// after the request's last bytes) rather than the client giving up on an
// answer it waited for (a timeout: curl -m, a browser leaving the page),
// which ends the exchange (clientEvent).
const halfCloseGrace = 100 * time.Millisecond

// accept takes up to 64 new client connections from the listener per
// event, watching each; other loops get the rest (EPOLLEXCLUSIVE).
func (l *evloop) accept() {
	for range 64 {
		fd, ip, port, err := accept(l.e.lnfd)
		if err != nil {
			switch err {
			case unix.EAGAIN, unix.EINTR:
			case unix.ECONNABORTED:
				continue
			default: // EMFILE, ENFILE, ENOBUFS, ENOMEM
				l.acceptFailed(err)
			}
			return
		}
		l.backoff = 0
		if l.e.stopping.Load() {
			closeFD(fd)
			continue
		}
		if hit := l.s.conns.admit(ip); hit != notLimited {
			l.s.connLimited(hit, ip)
			closeFD(fd)
			continue
		}
		c := &cconn{fd: fd, ip: ip, port: port, in: l.getBuf(), deadline: l.now + int64(l.s.cfg.ClientIdle), pp: l.s.proxyState(ip)}
		if c.pp == proxyRead {
			c.deadline = l.now + int64(l.s.cfg.ProxyTimeout)
		}
		if err := l.watch(fd); err != nil {
			closeFD(fd)
			l.s.conns.release(ip)
			continue
		}
		l.setFD(fd, fdOwner{c: c})
		l.clients++
	}
}

// acceptFailed pauses accepting on this loop after accept failed for lack
// of descriptors or memory: the listener stays ready (it is watched
// level-triggered), so retrying at once would spin on the failure. The
// loop stops watching it for 5 ms, doubling to 1 s while the failure
// lasts; the failure is logged at most once a second.
func (l *evloop) acceptFailed(err error) {
	l.backoff = nextBackoff(l.backoff)
	l.s.acceptLog.failed(l.s.logger, err, l.backoff)
	l.unwatch(l.e.lnfd)
	l.acceptPaused = true
	time.AfterFunc(l.backoff, func() { l.post(l.resumeAccept) })
}

// resumeAccept watches the listener again after a pause; connections that
// wait make it ready at once.
func (l *evloop) resumeAccept() {
	if !l.acceptPaused || l.stopped || l.e.stopping.Load() {
		return
	}
	l.acceptPaused = false
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, l.e.lnfd, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLEXCLUSIVE, Fd: int32(l.e.lnfd)}); err != nil {
		l.s.logger.Error("http loop: watching the listener again failed", "err", err)
	}
}

// dropInBuf hands the read buffer of c, which holds nothing, back: an
// idle keep-alive connection keeps none (4 KiB each, ten times nginx's
// idle cost), and its next read takes a warm one from the loop's pool
// (clientIn). A larger buffer, of a large head or a body, goes to the GC.
func (l *evloop) dropInBuf(c *cconn) {
	c.r, c.w = 0, 0
	if len(c.in) == clientInitBuf && len(l.bufs) < 1024 {
		l.bufs = append(l.bufs, c.in)
	}
	c.in = nil
}

// getBuf returns a client read buffer of clientInitBuf bytes, reused when one is free.
func (l *evloop) getBuf() []byte {
	if n := len(l.bufs); n > 0 {
		b := l.bufs[n-1]
		l.bufs = l.bufs[:n-1]
		return b
	}
	return make([]byte, clientInitBuf)
}

// clientEvent handles readiness of a client connection: writing pending
// answer bytes first, then reading and starting requests.
func (l *evloop) clientEvent(c *cconn, ev uint32) {
	if c.tun {
		l.tunClientEvent(c, ev)
		return
	}
	if ev&evWritable != 0 && c.o < len(c.out) {
		l.flushClient(c)
		if c.fd < 0 {
			return
		}
		if c.tun {
			// The flush resumed the relay, which met the backend's 101
			// (the interim answers before it had waited in c.out): the
			// rest of this event, the client's readable edge with it,
			// is the tunnel's. Read as HTTP it would be lost, and no
			// new edge comes for bytes already announced.
			l.tunClientEvent(c, ev&^evWritable)
			return
		}
	}
	if c.x.gone != nil && ev&evPeerShut != 0 {
		// The client left while its request waits in an ARM delay
		// queue: its slot is freed at once (closeClient), the request
		// never reaches a backend.
		l.closeClient(c)
		return
	}
	if ev&evPeerShut != 0 && !c.hup && c.busy && c.tls == nil && c.x.log.out == 0 && c.o >= len(c.out) &&
		l.s.clock.Now()-c.x.began >= int64(halfCloseGrace) {
		// The client closed while its request waits for the backend's
		// answer (nothing of it sent yet), well after sending it: it
		// gave up, as nginx reads it (proxy_ignore_client_abort off).
		// The exchange ends here, logged client_abort (499); its
		// backend connection is closed, not held for an answer nobody
		// reads. A FIN with or right after the request (within
		// halfCloseGrace) is a half-close: the client waits for its
		// answer, which it gets. Over TLS a FIN is not read as giving
		// up: a client that closes sends close_notify first, which the
		// loop does not read while busy, and a bare FIN is a
		// half-close.
		l.closeClient(c)
		return
	}
	if ev&evReadable != 0 {
		if c.fresh {
			c.fresh = false // the round's batched read decided rready (loop_uring.go)
		} else {
			c.rready = true
		}
		c.tls.sawReadable()
		// After a shutdown no new edge comes: a short read does not
		// mean drained, the EOF is still to be read.
		c.hup = c.hup || ev&evPeerShut != 0
		l.clientIn(c)
	}
}

// clientIn reads and starts requests until the connection is busy, has
// nothing more to read, or is gone.
func (l *evloop) clientIn(c *cconn) {
	if c.parsing {
		return // the caller up the stack goes on
	}
	c.parsing = true
	defer func() { c.parsing = false }()
	// Not while an answer's bytes wait to be written: flushClient comes
	// back here when they are out. A request started meanwhile that the
	// loop hands over to fasthttp would take the socket with that tail
	// unsent, and its own answer would read as the rest of it.
	for c.fd >= 0 && !c.busy && !c.closing && c.o == len(c.out) {
		if c.w > c.r {
			if c.deadline == 0 || c.deadline > l.now+int64(l.s.cfg.ClientReadTimeout) {
				c.deadline = l.now + int64(l.s.cfg.ClientReadTimeout)
			}
			if c.pp != proxyDone && !l.clientProxy(c) {
				if c.fd < 0 {
					return
				}
			} else if l.parse(c) {
				continue
			}
		}
		if c.fd < 0 || !c.rready {
			return
		}
		if c.r > 0 {
			c.w = copy(c.in, c.in[c.r:c.w])
			c.r = 0
		}
		if c.in == nil {
			c.in = l.getBuf() // handed back while the connection was idle
		}
		if c.w == len(c.in) {
			if len(c.in) >= clientBufSize {
				l.handover(c) // parse wants more than the buffer holds
				return
			}
			nb := make([]byte, clientBufSize)
			copy(nb, c.in[:c.w])
			c.in = nb
		}
		n, errno := l.readClient(c, c.in[c.w:])
		switch {
		case errno == unix.EAGAIN:
			c.rready = false
			if c.w == c.r {
				l.dropInBuf(c)
			}
			if c.tls.midRecord() {
				// A TLS record begun and not finished is a request under
				// way, as half a head is: -http-client-timeout, not the
				// idle timeout, bounds it.
				if d := l.now + int64(l.s.cfg.ClientReadTimeout); c.deadline == 0 || c.deadline > d {
					c.deadline = d
				}
			}
			return
		case errno == unix.EINTR:
			continue
		case errno != 0 || n == 0:
			if c.pp == proxyRead && c.w > 0 {
				l.s.proxyRejected(proxyproto.ReasonTruncated, c.ip, nil)
			}
			l.logUnfinished(c, accesslog.EndClientAbort)
			l.closeClient(c) // EOF or reset: an unfinished request is not forwarded
			return
		}
		if n < len(c.in)-c.w && !c.hup && c.tls == nil {
			c.rready = false // a short read drained the socket; the next edge reports more
		}
		if c.w == c.r {
			c.headStart = l.now
		}
		c.w += n
	}
}

// parse looks at the buffered bytes: it returns true when it started a
// request (or handed the connection over, or answered), false when it
// needs more bytes. checkHead decides the request's framing from the
// client's bytes before anything else reads them; a head it refuses is
// answered (400, 414, 431, 501 or 505) and the connection closed.
func (l *evloop) parse(c *cconn) bool {
	buf := c.in[c.r:c.w]
	hi, err := checkHead(buf, *l.s.denyNames.Load())
	err = l.s.checkLoop(hi, buf, err)
	if err == errHeadIncomplete {
		return false
	}
	if err != nil {
		l.refuseHead(c, err)
		return true
	}
	hlen := hi.n
	h := &l.reqH
	if hi.http10 || hi.chunked || !l.readReqHead(buf[:hlen]) || len(h.Peek("Expect")) > 0 ||
		(len(h.Peek("Upgrade")) > 0 && l.s.upgradeAsked(h, hi.bodyLen <= 0) == nil) {
		l.handover(c) // fasthttp serves these, behind the same check
		return true
	}
	if hi.bodyLen > int64(min(maxLoopBody, l.s.cfg.StreamThreshold)) {
		l.handover(c) // a large body: fasthttp streams it
		return true
	}
	cl := int(max(hi.bodyLen, 0))
	need := hlen + cl
	if len(buf) < need {
		if c.r+need > len(c.in) {
			nb := make([]byte, clientBufSize+maxLoopBody)
			c.w = copy(nb, buf)
			c.r = 0
			c.in = nb
		}
		return false
	}
	c.busy = true
	c.deadline = 0
	c.x.reqLen = need
	c.x.bodyLen = int(hi.bodyLen)
	l.begin(c, h, buf[hlen:need])
	return true
}

// logUnfinished logs the request whose head came whole but whose body
// did not, when the connection ends (end: the client closed it,
// client_abort, or stopped sending, timeout): its method, path, request
// id and timings, the body bytes that came, status 499 for an abort
// (nginx's), none for a timeout. Nothing reached a backend. A head still
// incomplete is not a request and is not logged (as nginx and fasthttp).
func (l *evloop) logUnfinished(c *cconn, end accesslog.End) {
	s := l.s
	if !s.logging() || c.busy || c.closing || c.tun || c.w <= c.r || c.pp != proxyDone {
		return
	}
	buf := c.in[c.r:c.w]
	hi, err := checkHead(buf, *s.denyNames.Load())
	if err != nil || !l.readReqHead(buf[:hi.n]) {
		return
	}
	var p plan
	g := &c.x.log
	start := min(c.headStart, l.now)
	wall := s.wall(s.clock.Now()).Add(-time.Duration(l.now - start))
	var tc net.Conn
	if c.tls != nil {
		tc = c.tls.conn
	}
	s.beginLog(g, &p, &l.reqH, netip.AddrPortFrom(c.ip, c.port), tc, wall, start, l.now)
	g.end = end
	g.rec.BytesIn = int64(len(buf) - hi.n)
	s.endLog(g, &p, noAnswer, 0, l.now)
}

// refuseHead answers a request head checkHead refused and closes the
// connection once the answer is out: after a head sluice cannot frame,
// nothing more on the connection can be trusted.
func (l *evloop) refuseHead(c *cconn, err error) {
	he, ok := err.(*headError)
	if !ok {
		he = errRequestLine
	}
	s := l.s
	s.stats.BadRequest.Add(1)
	s.logger.Debug("http request refused", "reason", he.reason, "client", c.ip.String())
	c.busy = true
	c.deadline = 0
	c.x = exchange{reqLen: c.w - c.r, req: c.x.req[:0], closeAfter: true}
	if s.logging() {
		start := min(c.headStart, l.now)
		s.logHeadRefused(netip.AddrPortFrom(c.ip, c.port), s.wall(s.clock.Now()).Add(-time.Duration(l.now-start)), time.Duration(l.now-start), he.status, he.reason)
	}
	s.writeRefusal(&l.local, he.status, 0, he.proxyStatus(), he.reason)
	l.answerLocal(c)
}

// reparse parses c's current request head into l.reqH again (the scratch
// header served other requests since) and returns the request's body.
func (l *evloop) reparse(c *cconn) []byte {
	buf := c.in[c.r : c.r+c.x.reqLen]
	end := len(buf) - max(c.x.bodyLen, 0)
	l.readReqHead(buf[:end])
	return buf[end:]
}

// readReqHead parses a head checkHead accepted into l.reqH; an
// absolute-form target becomes origin-form with its authority as Host
// (see splitAbsolute), as on the fasthttp engine.
func (l *evloop) readReqHead(p []byte) bool {
	l.rd.Reset(p)
	l.br.Reset(&l.rd)
	h := &l.reqH
	if h.Read(l.br) != nil {
		return false
	}
	if auth, rest, ok := splitAbsolute(h.RequestURI()); ok {
		h.SetHostBytes(auth)
		l.target = originForm(l.target[:0], rest)
		h.SetRequestURIBytes(l.target)
	}
	return true
}

// begin takes the request whose head is h into the pipeline: admit, then
// (after an ARM delay, off the loop) admitted.
func (l *evloop) begin(c *cconn, h *fasthttp.RequestHeader, body []byte) {
	c.seq++
	x := &c.x
	// Cleared in place and the kept fields set again: a composite
	// literal with fields set is built on the stack (1.8 KB) and copied.
	reqLen, bodyLen, req, logBuf := x.reqLen, x.bodyLen, x.req[:0], x.log.buf
	*x = exchange{}
	x.reqLen, x.bodyLen, x.req, x.log.buf = reqLen, bodyLen, req, logBuf
	x.closeAfter = h.ConnectionClose() || l.e.stopping.Load()
	x.head = h.IsHead()
	x.secure = c.tls != nil
	if !x.secure && l.s.cfg.HTTPSRedirect {
		l.s.writeRedirect(&l.local, h)
		l.answerLocal(c)
		return
	}
	x.began = l.s.clock.Now()
	r, d := l.s.admit(&x.plan, h, &l.view, x.began)
	if l.s.cfg.RequestID || l.s.logging() {
		start := min(c.headStart, l.now)
		wall := l.s.wall(l.s.clock.Now()).Add(-time.Duration(l.now - start))
		var tc net.Conn
		if c.tls != nil {
			tc = c.tls.conn
		}
		l.s.beginLog(&x.log, &x.plan, h, netip.AddrPortFrom(c.ip, c.port), tc, wall, start, l.now)
	}
	if d.Verdict == admission.Delay {
		l.s.markDelayed(&x.log, d)
		l.delay(c, r, d)
		return
	}
	l.admitted(c, h, body, &r, d)
}

// delay waits for an ARM rule's queue off the loop, then carries on with
// the request on the loop (admitted), unless the connection is gone by
// then. r is cloned: the bytes it viewed are the loop's scratch.
func (l *evloop) delay(c *cconn, r admission.Request, d admission.Decision) {
	if c.hup {
		// The client shut its side down with its request (no edge will
		// tell it again): it has gone, and its request leaves the queue
		// at once.
		if d.Wait.Cancel() {
			l.s.stats.DelayAbandoned.Add(1)
		}
		<-d.Wait.Done()
		l.s.ctrl.Resume(l.s.clock.Now(), &r, d, nil)
		l.closeClient(c)
		return
	}
	r.Method, r.Host, r.Path = strings.Clone(r.Method), strings.Clone(r.Host), strings.Clone(r.Path)
	gen, ip := c.gen, c.ip
	gone := make(chan struct{}) // closed by closeClient: the client left while queued
	c.x.gone = gone
	go func() {
		d := l.s.waitDelay(l.e.stop, gone, ip, &r, d)
		l.post(func() {
			if c.gen != gen || c.fd < 0 {
				return
			}
			c.x.gone = nil
			c.x.log.decided = l.now
			body := l.reparse(c)
			l.view.fill(&l.reqH, l.s.needPath(c.x.set))
			l.admitted(c, &l.reqH, body, &r, d)
		})
	}()
}

// admitted goes on from an admission decision: answer the refusal, or
// (pick) rewrite the head for the backend and send the request.
func (l *evloop) admitted(c *cconn, h *fasthttp.RequestHeader, body []byte, r *admission.Request, d admission.Decision) {
	s := l.s
	x := &c.x
	if !s.pick(&x.plan, &l.local, r, d, h, c.ip) {
		x.log.refused = true
		l.answerLocal(c)
		return
	}
	up := l.loopUpgrade(h, x.bodyLen) // before prepareRequest removes it
	if up != nil {
		if !s.takeTunnel() {
			l.tunnelRefused(c)
			return
		}
		x.tunPending, x.upgrade = true, up
	}
	s.prepareRequest(h, c.ip, x.secure)
	x.log.setRequestID(h)
	if x.strip != "" {
		// The view is of this request: the delayed path (delay) fills it
		// again before it comes here.
		if t := l.view.stripTarget(h, x.strip); t != nil {
			h.SetRequestURIBytes(t)
		}
	}
	h.ResetConnectionClose()
	if len(h.Host()) == 0 {
		// Only HTTP/1.0 may come without Host (the loop hands those to
		// fasthttp, which does the same): the authority the client
		// connected to, never the backend's own address.
		h.SetHost(localAuthority(c.fd))
	}
	// The framing checkHead decided, and nothing else: the body that
	// follows is exactly bodyLen bytes, or there is none.
	if x.bodyLen >= 0 {
		h.SetContentLength(x.bodyLen)
	}
	if up != nil {
		setUpgrade(h, up)
	}
	x.req = h.AppendBytes(x.req[:0])
	x.req = append(x.req, body...)
	l.send(c)
}

// answerLocal sends l.local, an answer sluice made itself, and ends the
// request.
func (l *evloop) answerLocal(c *cconn) {
	resp := &l.local
	body := resp.Body()
	resp.Header.SetContentLength(len(body))
	if c.x.closeAfter || l.e.stopping.Load() {
		resp.Header.SetConnectionClose()
	}
	c.x.log.localAnswer(resp)
	c.x.log.status = resp.StatusCode()
	out := resp.Header.AppendBytes(l.out[:0])
	c.x.log.headOut += int64(len(out))
	if !c.x.head { // an answer to HEAD has the length of its body, not the body
		out = append(out, body...)
	}
	l.out = out[:0]
	l.s.observe(&c.x.plan)
	l.writeClient(c, out)
	l.endRequest(c)
}

// endRequest ends the client's current request and goes on with the next.
func (l *evloop) endRequest(c *cconn) {
	l.logEnd(c)
	l.unhold(c)
	l.untakeTunnel(c)
	if c.fd < 0 {
		return
	}
	l.s.observe(&c.x.plan)
	c.r += c.x.reqLen
	c.x.reqLen = 0
	c.headStart = l.now // a pipelined request's head is in already
	c.x.set, c.x.b, c.x.bc = nil, nil, nil
	c.busy = false
	if c.x.closeAfter || l.e.stopping.Load() {
		c.closing = true
		if c.o == len(c.out) {
			l.closeClient(c)
		}
		return
	}
	if c.o < len(c.out) {
		c.deadline = l.now + int64(l.s.cfg.ClientReadTimeout)
		return // clientIn runs when the answer is written
	}
	c.deadline = l.now + int64(l.s.cfg.ClientIdle)
	if c.w == c.r {
		l.dropInBuf(c)
	}
	if c.w > c.r || c.rready {
		l.clientIn(c)
	}
}

// logEnd hands c's request to the access log, once.
func (l *evloop) logEnd(c *cconn) {
	x := &c.x
	switch {
	case c.tun:
		end := x.log.end
		if x.log.tunDone {
			end = accesslog.EndComplete
		}
		l.s.endTunnelLog(&x.log, &x.plan, x.log.tunIn, x.log.tunOut, end, l.now)
	case c.busy:
		l.s.endLog(&x.log, &x.plan, x.log.status, max(x.log.out-x.log.headOut, 0), l.now)
	}
}

// unhold ends the request's count in Server.held, once.
func (l *evloop) unhold(c *cconn) {
	if c.x.holding {
		c.x.holding = false
		l.s.held.release(c.ip)
	}
}

// settle accounts for a relayed answer before its last bytes go out (a
// client that has its answer sees it counted): the backend's count and
// the latency.
func (l *evloop) settle(c *cconn) {
	x := &c.x
	if !x.acquired {
		return
	}
	x.releaseBackend(l.s.clock.Now(), result(nil, x.status))
	l.s.observe(&x.plan)
}

// writeClient writes p to the client (in TLS records on an HTTPS
// connection), keeping what the socket does not take.
func (l *evloop) writeClient(c *cconn, p []byte) {
	c.x.log.out += int64(len(p))
	if c.tls != nil && c.fd >= 0 {
		p = l.seal(c, p)
	}
	l.writeRaw(c, p)
}

// writeRaw writes p to the client's socket, keeping what it does not take.
func (l *evloop) writeRaw(c *cconn, p []byte) {
	if c.fd < 0 || len(p) == 0 {
		return
	}
	if c.o < len(c.out) {
		c.out = append(c.out, p...)
		return
	}
	if l.deferWrite(c, p) {
		return // written with the round's batch (loop_uring.go)
	}
	for len(p) > 0 {
		n, errno := rawWrite(c.fd, p)
		if errno == unix.EINTR {
			continue
		}
		if errno == unix.EAGAIN {
			break
		}
		if errno != 0 {
			l.closeClient(c)
			return
		}
		p = p[n:]
	}
	if len(p) > 0 {
		c.out = append(c.out[:0], p...)
		c.o = 0
		c.deadline = l.now + int64(l.s.cfg.ClientReadTimeout) // a client that stops reading is dropped
	}
}

// flushClient writes pending answer bytes after EPOLLOUT, then resumes
// the backend it was relaying or the next request.
func (l *evloop) flushClient(c *cconn) {
	for c.o < len(c.out) {
		n, errno := rawWrite(c.fd, c.out[c.o:])
		if errno == unix.EINTR {
			continue
		}
		if errno == unix.EAGAIN {
			return
		}
		if errno != 0 {
			l.closeClient(c)
			return
		}
		c.o += n
		c.deadline = l.now + int64(l.s.cfg.ClientReadTimeout)
	}
	l.outWritten(c)
	if c.busy {
		c.deadline = 0
	}
	if c.closing {
		l.closeClient(c)
		return
	}
	if bc := c.x.bc; c.busy && bc != nil {
		l.relay(bc) // relaying was paused while the client was slow
		return
	}
	if !c.busy {
		// As endRequest does when the answer went out at once.
		c.deadline = l.now + int64(l.s.cfg.ClientIdle)
		if c.w == c.r {
			l.dropInBuf(c)
		}
		l.clientIn(c)
	}
}

// closeClient closes a client connection; a backend connection carrying
// its request is closed too, as its state is unknown.
func (l *evloop) closeClient(c *cconn) {
	if c.fd < 0 {
		return
	}
	if c.busy && c.x.log.end == 0 {
		c.x.log.end = accesslog.EndClientAbort
	}
	l.logEnd(c)
	if bc := c.x.bc; c.busy && bc != nil {
		// The client left mid-exchange: the backend connection is in an
		// unknown state.
		c.x.releaseBackend(l.s.clock.Now(), lb.Abandoned)
		l.closeBackend(bc)
	}
	if c.x.gone != nil {
		close(c.x.gone)
		c.x.gone = nil
	}
	l.unhold(c)
	l.untakeTunnel(c)
	l.tunClosed(c)
	if own := c.own; own != nil {
		l.closeBackend(own)
	}
	ip := c.ip
	closeFD(l.detach(c))
	l.s.conns.release(ip)
}

// detach makes the loop forget c (posted work and waiters see it gone)
// and returns its descriptor, for the caller to close or hand on.
func (l *evloop) detach(c *cconn) int {
	fd := c.fd
	l.fds[fd] = fdOwner{}
	c.fd = -1
	c.gen++
	l.clients--
	if len(c.in) == clientInitBuf && len(l.bufs) < 1024 {
		l.bufs = append(l.bufs, c.in)
	}
	c.in = nil
	return fd
}

// failed answers a failed exchange: once more on another backend when the
// pipeline allows it (mayRetry, retryElsewhere), else 502, 503 or 504 by
// cause; if part of the answer was already relayed the client's connection
// is closed instead.
func (l *evloop) failed(c *cconn, err error, res lb.Result) {
	s := l.s
	x := &c.x
	if bc := x.bc; bc != nil {
		l.closeBackend(bc)
	}
	x.bc = nil
	x.waitUntil = 0
	x.releaseBackend(l.s.clock.Now(), res)
	if c.fd < 0 {
		return
	}
	if x.gotHead {
		s.stats.UpstreamError.Add(1)
		x.log.end = endOf(err)
		x.closeAfter = true
		l.endRequest(c)
		return
	}
	if x.mayRetry() {
		l.reparse(c) // the head, for re-admitting an affinity request
		l.view.fill(&l.reqH, s.needPath(x.set))
		switch s.retryElsewhere(&x.plan, &l.local, &l.reqH, &l.view, c.ip) {
		case retrySend:
			l.send(c)
			return
		case retryRefused:
			l.answerLocal(c)
			return
		}
	}
	s.writeFailure(&l.local, err)
	l.answerLocal(c)
}

// abort ends in-flight new work when memory turns Critical: 503 if no byte
// of the answer was relayed yet, else the client connection is closed.
func (l *evloop) abort(c *cconn) {
	x := &c.x
	if bc := x.bc; bc != nil {
		l.closeBackend(bc)
	}
	x.bc = nil
	x.waitUntil = 0
	x.releaseBackend(l.s.clock.Now(), lb.Abandoned)
	if x.gotHead {
		l.s.stats.Aborted.Add(1)
		l.closeClient(c)
		return
	}
	l.s.writeAborted(&l.local)
	l.answerLocal(c)
}
