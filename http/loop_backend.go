//go:build linux

package http

import (
	"crypto/tls"
	"net"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/sluicelb/sluice/lb"
)

// bconn is a backend connection.
type bconn struct {
	fd         int
	cp         *connPool // the loop's connections to its address
	c          *cconn    // the client whose request it carries; nil when idle
	in         []byte
	r, w       int
	rready     bool
	fresh      bool       // read by this round's batch (loop_uring.go), which set rready
	preErr     unix.Errno // the error the batch's read found, for the next read to return
	batched    bool       // in the batch of writes being made (loop_uring.go)
	hup        bool       // the backend has shut down its side: read until EOF
	bridged    bool       // a TLS bridge's end (loop_tls.go): the bridge holds the connection slot
	wready     bool
	connecting bool
	used       bool // it carried an exchange before: a keep-alive reuse
	// owner is the client connection whose PROXY header the connection
	// carries (proxyout.go): it serves that client only; nil for others.
	owner    *cconn
	hdr      []byte // the PROXY header still to write before pend
	pend     []byte // request bytes not written yet
	deadline int64
	// A tunnel's backend side (loop_tunnel.go): tunEOF once the backend
	// ended its side, shutWr once sluice shut down writing to it.
	tun, tunEOF, shutWr bool
}

// bpool is a loop's connections to one backend address.
type connPool struct {
	addr    string
	key     string      // its key in evloop.connPools: addr, or tlsPoolKey(addr)
	tls     *tls.Config // TLS backend: the settings of the latest request's generation; nil: plain
	proxy   uint8       // the PROXY protocol version its connections start with; 0: none
	sa      unix.Sockaddr
	idle    []*bconn      // LIFO: the warmest connection last
	open    *backendSlots // connections to addr of all loops and the fasthttp engine (a reference held)
	waiters []waiter
	live    int   // this loop's connections of the pool (idle ones included)
	used    int64 // loop time of the latest request that took the pool
}

// poolForgetAfter is how long a loop keeps a pool of an address that is
// no longer a backend's, once it has no connection and carried no request
// (see expire): an address that left the configuration or DNS costs
// nothing after it; one that comes back within it finds its pool, and a
// pool forgotten is made again on next use. Pools of the backends in
// force are kept (their addresses are resolved once per loop).
const poolForgetAfter = time.Minute

// waiter is a request queued for a connection to an address at its
// connection limit; gen and seq tell whether it still waits.
type waiter struct {
	c        *cconn
	gen, seq uint32
}

// valid reports whether the request that queued w still waits.
func (w waiter) valid() bool {
	return w.c.gen == w.gen && w.c.seq == w.seq && w.c.fd >= 0 && w.c.x.waitUntil != 0
}

// connPool returns the loop's connections to addr (over TLS with cfg
// when it is set), made on first use.
func (l *evloop) connPool(addr string, cfg *tls.Config) *connPool {
	key := addr
	if cfg != nil {
		key = tlsPoolKey(addr)
	}
	p := l.connPools[key]
	if p == nil {
		p = &connPool{addr: addr, key: key, open: l.s.backendSlots(addr)}
		l.connPools[key] = p
	}
	p.tls = cfg
	p.used = l.now
	return p
}

// send gets a connection to the exchange's backend and writes the request.
func (l *evloop) send(c *cconn) {
	x := &c.x
	if !x.holding {
		// One source holds at most MaxConns/8 (at least 1) backend
		// connections at once (or waits for them), until its answer is
		// relayed: a client that stops reading cannot take them all.
		if !l.s.held.take(c.ip) {
			l.s.stats.SourceLimited.Add(1)
			l.s.writeRefusal(&l.local, fasthttp.StatusServiceUnavailable, connRetry, psSourceLimit, "backend connections for this client at their limit")
			l.answerLocal(c)
			return
		}
		x.holding = true
	}
	x.acquireBackend()
	x.waitUntil = 0
	p := l.connPool(x.b.Addr(), x.b.TLS())
	var bc *bconn
	if v := x.b.Proxy(); v != 0 {
		p = l.proxyPool(x.b.Addr(), x.b.TLS(), v)
		bc = l.takeOwn(c, p)
	}
	if bc != nil {
		// The client's own connection to this backend (proxyout.go).
	} else if n := len(p.idle); n > 0 {
		bc = p.idle[n-1]
		p.idle = p.idle[:n-1]
		x.log.connect = l.now
	} else if !p.open.take(l.s.cfg.MaxConns) {
		x.waitUntil = l.now + int64(l.s.cfg.ConnWait)
		p.waiters = append(p.waiters, waiter{c, c.gen, c.seq})
		l.e.shedIdle(p.key, l)
		return
	} else {
		var err error
		if bc, err = l.dialFor(p, c); err != nil { // it freed the slot
			l.failed(c, err, lb.ConnectError)
			return
		}
	}
	x.bc = bc
	bc.c = c
	bc.pend = x.req
	if bc.connecting {
		bc.deadline = l.now + int64(l.s.cfg.ConnectTimeout)
		return
	}
	x.log.connect = l.now
	bc.deadline = l.now + int64(l.s.cfg.BackendTimeout)
	l.toWrite = append(l.toWrite, bc) // written after this round of events, together
}

// dial opens a connection to p's address, for a slot the caller took,
// non-blocking: it may still be connecting when returned. The slot is
// freed by dial when it fails, by closeBackend after, or, for a TLS
// backend, by the bridge once its connection to the backend is closed.
// The address is resolved on first use and again after a failed dial.
// Errors are dial *net.OpErrors, so that the pipeline tells them from
// failures after sending (notSent).
func (l *evloop) dial(p *connPool) (*bconn, error) { return l.dialFor(p, nil) }

// dialFor is dial for client c: a connection to a PROXY backend (p.proxy)
// starts with c's header and is c's own (bc.owner).
func (l *evloop) dialFor(p *connPool, c *cconn) (*bconn, error) {
	var pre []byte
	if p.proxy != 0 && c != nil {
		pre = l.proxyHeaderFor(c, p.proxy)
	}
	if p.tls != nil {
		// The slot is the bridge's from here: it frees it once its
		// connection to the backend is closed, which may come after the
		// loop closed its end (closeBackend does not free it).
		addr, slots := p.addr, p.open
		fd, err := tlsBridge(p.addr, p.tls, l.s.cfg.ConnectTimeout, l.s.cfg.BackendTimeout, pre,
			func() { l.s.freedOutside(addr, slots) })
		if err != nil {
			p.open.release()
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
		}
		if err := l.watch(fd); err != nil {
			closeFD(fd) // the bridge ends and frees the slot
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
		}
		bc := &bconn{fd: fd, cp: p, in: make([]byte, backendInitBuf), wready: true, bridged: true}
		if pre != nil {
			bc.owner = c
		}
		l.setFD(fd, fdOwner{b: bc})
		p.live++
		return bc, nil
	}
	fd, connecting, err := l.connectPool(p)
	if err != nil {
		p.open.release()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	bc := &bconn{fd: fd, cp: p, in: make([]byte, backendInitBuf), connecting: connecting, wready: !connecting}
	if pre != nil {
		bc.owner, bc.hdr = c, pre
	}
	l.setFD(fd, fdOwner{b: bc})
	p.live++
	return bc, nil
}

// connectPool starts a non-blocking connection to p's address, watched by the
// loop, resolving the address first if needed.
func (l *evloop) connectPool(p *connPool) (fd int, connecting bool, err error) {
	if p.sa == nil {
		if p.sa, err = resolve(p.addr); err != nil {
			return -1, false, err
		}
	}
	if fd, connecting, err = connect(p.sa); err != nil {
		p.sa = nil // resolve again next time
		return -1, false, err
	}
	if err := l.watch(fd); err != nil {
		closeFD(fd)
		return -1, false, err
	}
	return fd, connecting, nil
}

// backendEvent handles readiness of a backend connection: a connect that
// finished, room to write the request, or answer bytes (or the close of
// an idle connection).
func (l *evloop) backendEvent(bc *bconn, ev uint32) {
	if bc.tun {
		l.tunBackendEvent(bc, ev)
		return
	}
	if bc.connecting {
		if ev&evConnDone == 0 {
			return
		}
		if err := connectResult(bc.fd); err != nil {
			bc.cp.sa = nil
			if c := bc.c; c != nil {
				l.closeBackend(bc)
				l.failed(c, &net.OpError{Op: "dial", Net: "tcp", Err: err}, lb.ConnectError)
			} else {
				l.closeBackend(bc)
			}
			return
		}
		bc.connecting = false
		bc.wready = true
		if bc.c != nil {
			bc.c.x.log.connect = l.now
			bc.deadline = l.now + int64(l.s.cfg.BackendTimeout)
		}
	}
	if ev&evWritable != 0 {
		bc.wready = true
		if len(bc.pend) > 0 {
			l.writeBackend(bc)
		}
	}
	if ev&evReadable != 0 {
		if bc.fresh {
			bc.fresh = false // the round's batched read decided rready (loop_uring.go)
		} else {
			bc.rready = true
		}
		bc.hup = bc.hup || ev&evPeerShut != 0
		if bc.c == nil {
			// An idle connection: the backend closed it or sent bytes
			// nobody asked for; a read that finds nothing was a stale edge.
			var one [1]byte
			if _, errno := rawRead(bc.fd, one[:]); errno != unix.EAGAIN {
				l.closeBackend(bc)
			}
			return
		}
		l.relay(bc)
	}
}

// writeBackend writes the request bytes still pending while the socket
// takes them; the rest waits for the next EPOLLOUT edge.
func (l *evloop) writeBackend(bc *bconn) {
	for len(bc.hdr) > 0 && bc.wready {
		n, errno := rawWrite(bc.fd, bc.hdr)
		switch {
		case errno == unix.EINTR:
			continue
		case errno == unix.EAGAIN:
			bc.wready = false
			return
		case errno != 0:
			l.backendBroke(bc)
			return
		}
		bc.hdr = bc.hdr[n:]
	}
	for len(bc.pend) > 0 && bc.wready {
		n, errno := rawWrite(bc.fd, bc.pend)
		switch {
		case errno == unix.EINTR:
			continue
		case errno == unix.EAGAIN:
			bc.wready = false
			return
		case errno != 0:
			l.backendBroke(bc)
			return
		}
		bc.pend = bc.pend[n:]
	}
}

// backendBroke handles a backend connection that failed while carrying an
// exchange: a reused keep-alive connection that the backend had closed
// gets the request once more on a fresh one when that is safe; otherwise
// the client gets 502, or loses its connection if the answer had begun.
func (l *evloop) backendBroke(bc *bconn) {
	c := bc.c
	used, gotBytes := bc.used, bc.w > 0
	l.closeBackend(bc)
	if c == nil {
		return
	}
	x := &c.x
	if used && !x.gotHead && !gotBytes && x.idem && !x.staleRetry {
		x.staleRetry = true
		x.releaseBackend(l.s.clock.Now(), lb.Abandoned)
		x.bc = nil
		l.send(c)
		return
	}
	l.failed(c, fasthttp.ErrConnectionClosed, lb.ConnectError)
}

// relay reads the backend's answer and passes it on to the client as it
// arrives, until the answer is complete or the client cannot take more.
func (l *evloop) relay(bc *bconn) {
	c := bc.c
	for c != nil && bc.c == c && c.fd >= 0 && c.o == len(c.out) {
		// Consume what is buffered for as long as it makes progress: a
		// 1xx answer and the final answer may arrive in one read.
		for bc.r < bc.w {
			r0 := bc.r
			if l.consume(bc) {
				return // complete, or failed
			}
			if bc.c != c || c.o < len(c.out) {
				return
			}
			if bc.r == r0 {
				break // a head not complete yet
			}
		}
		if !bc.rready {
			return
		}
		if bc.r == bc.w {
			bc.r, bc.w = 0, 0
		} else if bc.r > 0 {
			bc.w = copy(bc.in, bc.in[bc.r:bc.w])
			bc.r = 0
		}
		if bc.w == len(bc.in) { // only while reading a head: bodies are consumed as they come
			if len(bc.in) >= backendBufSize {
				l.failed(c, errBadAnswer, lb.ServerError) // a head over 64 KiB
				return
			}
			nb := make([]byte, backendBufSize)
			copy(nb, bc.in[:bc.w])
			bc.in = nb
		}
		var n int
		var errno unix.Errno
		if bc.preErr != 0 { // what the round's batched read found (loop_uring.go)
			errno, bc.preErr = bc.preErr, 0
		} else {
			n, errno = rawRead(bc.fd, bc.in[bc.w:])
		}
		switch {
		case errno == unix.EAGAIN:
			bc.rready = false
			return
		case errno == unix.EINTR:
			continue
		case errno != 0:
			l.backendBroke(bc)
			return
		case n == 0:
			if c.x.gotHead && c.x.framing == frameClose {
				l.complete(c)
				return
			}
			l.backendBroke(bc)
			return
		}
		if n < len(bc.in)-bc.w && !bc.hup {
			bc.rready = false
		}
		bc.w += n
		if c.x.gotHead {
			// Between bytes of the body. Before the final head the
			// deadline set when the request was sent holds: 1xx answers
			// or a head trickling in do not extend it.
			bc.deadline = l.now + int64(l.s.cfg.BackendTimeout)
		}
	}
}

// complete ends a successful exchange: the backend connection goes back to
// the pool (or is closed), and the client goes on.
func (l *evloop) complete(c *cconn) {
	x := &c.x
	bc := x.bc
	s := l.s
	l.settle(c) // for answers that end when the backend closes
	if bc != nil {
		bc.c = nil
		x.bc = nil
		// Not reusable: the backend said so or shut down its side, sent
		// more than the answer, did not read the whole request, or may
		// have bytes unread (the last read filled the buffer) that no
		// edge will announce.
		if x.bclose || bc.hup || bc.rready || bc.r < bc.w || len(bc.pend) > 0 || bc.fd < 0 {
			l.closeBackend(bc)
		} else {
			bc.r, bc.w = 0, 0
			bc.used = true
			if len(bc.in) > backendInitBuf {
				bc.in = make([]byte, backendInitBuf)
			}
			bc.deadline = l.now + int64(s.cfg.BackendIdle)
			if bc.owner == c {
				l.keepOwn(c, bc)
			} else {
				l.putIdle(bc)
			}
		}
	}
	l.endRequest(c)
}

// putIdle puts an idle connection back, or gives it to a request waiting
// for one.
func (l *evloop) putIdle(bc *bconn) {
	p := bc.cp
	for len(p.waiters) > 0 {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		if !w.valid() {
			continue
		}
		p.idle = append(p.idle, bc)
		l.send(w.c)
		return
	}
	p.idle = append(p.idle, bc)
}

// closeBackend closes a backend connection and frees its slot under
// -http-backend-max-conns, which a waiting request may take. The request
// it carried, if any, is the caller's to answer.
func (l *evloop) closeBackend(bc *bconn) {
	if bc.fd < 0 {
		return
	}
	closeFD(bc.fd)
	l.fds[bc.fd] = fdOwner{}
	bc.fd = -1
	p := bc.cp
	if !bc.bridged {
		p.open.release() // a TLS bridge frees its slot itself (dialFor)
	}
	p.live--
	for i, ib := range p.idle {
		if ib == bc {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			break
		}
	}
	if c := bc.c; c != nil && c.x.bc == bc {
		c.x.bc = nil
	}
	if o := bc.owner; o != nil && o.own == bc {
		o.own = nil
	}
	bc.c, bc.owner = nil, nil
	l.serveWaiters(p) // a connection slot is free: a waiting request may dial
}

// serveWaiters sends requests waiting for a connection to p while one is
// idle or may be dialled.
func (l *evloop) serveWaiters(p *connPool) {
	for len(p.waiters) > 0 && (len(p.idle) > 0 || p.open.n.Load() < int64(l.s.cfg.MaxConns)) {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		if w.valid() {
			l.send(w.c)
		}
	}
}
