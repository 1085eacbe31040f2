//go:build linux

package http

// The loop engine, by layer (each file's functions call only down or
// sideways, never back up):
//
//	engine_loop.go   lifecycle: start, shutdown, the event loop, deadlines
//	loop_client.go   the client state machine: read, check, hand to the pipeline, answer
//	loop_backend.go  backend connections: pool per address, dial, send, relay
//	answer.go        answer framing: the head, then body bytes to the end
//	handoff.go       connections the loop gives to the fasthttp engine
//	epoll_linux.go   epoll, eventfd, sockets, raw reads and writes
//
// Ownership rules, which every function of the loop relies on:
//
//   - One goroutine per loop (run) owns everything reachable from its
//     evloop: client connections (cconn), backend connections (bconn), its
//     connPools and the scratch headers and buffers. No other goroutine
//     touches them. Other goroutines reach a loop only with post (a
//     function run on the loop's goroutine, after the eventfd wakes it).
//     Shared between loops are only the engine's atomics: stopping, force,
//     and the per-address connection counts against MaxConns.
//   - A descriptor has one owner, named by l.fds[fd] (the listener and the
//     eventfd are known by number). Closing a connection clears its l.fds
//     entry, so an event still queued for that number finds no owner and is
//     dropped (or, if the number was reused within the round, reaches the
//     new owner as a readiness its read or write finds EAGAIN on).
//   - A negative fd (c.fd < 0, bc.fd < 0) means closed or handed over: the
//     struct lives on only in references that have yet to see it. Any call
//     that may close a connection (writeClient, relay, failed, send...) is
//     followed by a check of fd before the connection is used again.
//   - A client carries one request at a time (c.busy; c.x is its
//     exchange); pipelined requests wait in c.in. While the request is at
//     a backend, c.x.bc and bc.c point at each other: the backend connection
//     belongs to that request until complete, failed or abort clears both.
//     An idle backend connection has bc.c == nil and is in its connPool's
//     idle list; only idle connections are given to another request.
//   - Generation counters: c.gen is bumped when the client connection is
//     closed or handed over, c.seq when it starts a request. Work that
//     outlives the event that started it (an ARM delay ending on another
//     goroutine, a request queued for a backend connection, a waiter)
//     records them and does nothing if they changed.
//   - The backend's outstanding count (lb.Backend Acquire/Release) is the
//     request's plan's (acquireBackend, releaseBackend: once each per
//     backend), whatever ends the request.
//   - Time: l.now is the loop's I/O clock for deadlines (read once per
//     wake-up); the pipeline uses the admission clock (Config.Clock).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/internal/uring"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/proxyproto"
)

const (
	loopSupported = true
	// DefaultEngine is the engine Config.Engine "" means on this platform.
	DefaultEngine = EngineLoop
)

// Sizes of the loop engine's buffers.
const (
	clientInitBuf  = 4 << 10  // a client connection's read buffer, grown for a larger head
	clientBufSize  = 16 << 10 // a request head must fit; larger heads go to fasthttp
	maxLoopBody    = 64 << 10 // request bodies up to this are buffered by the loop
	backendInitBuf = 16 << 10 // a backend connection's read buffer; answers are relayed through it
	backendBufSize = 64 << 10 // a response head must fit
	tickEvery      = 100 * time.Millisecond
)

// The loop engine serves HTTP/1.1 keep-alive traffic on event loops: one
// goroutine per loop waits in epoll_wait and drives every client and
// backend connection of that loop. Compared with a goroutine per
// connection it saves, per request, the read that finds no data before a
// goroutine parks (Go reads first, then waits; the loop waits first) and
// two goroutine switches; on loopback that is about a fifth of the CPU a
// proxied request costs.
//
// The loop handles the common case: HTTP/1.1 requests with no body or a
// Content-Length body up to 64 KiB, and any response (Content-Length,
// chunked, or delimited by close), relayed as it arrives. A connection
// whose request it does not handle (HTTP/1.0, chunked or larger bodies,
// an Upgrade other than -http-upgrade's, Expect, a head over 16 KiB or
// one fasthttp rejects) is handed,
// with the bytes already read, to the fasthttp server for the rest of its
// life. Both paths share classification, admission, header rewriting and
// the answers sluice makes itself.
type loopEngine struct {
	s        *Server
	loops    []*evloop
	lnfd     int
	ln       net.Listener
	handoff  *handoffListener
	stopping atomic.Bool
	force    atomic.Bool
	stop     chan struct{}  // closed when shutdown starts
	detached sync.WaitGroup // a loop is done once it stopped watching the listener
	wg       sync.WaitGroup
	lnOnce   sync.Once
	next     atomic.Uint32 // the loop the next HTTPS connection goes to, round robin
	// Config.IOURing (loop_uring.go): ringWarned once a loop could not
	// set up its ring; uringSends counts the sends made through rings.
	ringWarned atomic.Bool
	uringSends atomic.Uint64
	uringRecvs atomic.Uint64
	ringLoops  atomic.Int64 // loops with a ring now (metric sluice_http_io_uring_loops)
}

// slotFreed tells the loops that a connection to addr closed outside them
// (the fasthttp engine's): a request waiting for one may dial, in any of
// the address's pools (plain, TLS, PROXY v1 or v2, see proxyPool).
func (e *loopEngine) slotFreed(addr string) {
	keys := [...]string{addr, proxyPoolKey(addr, 1), proxyPoolKey(addr, 2)}
	for _, l := range e.loops {
		l.post(func() {
			for _, k := range keys {
				for _, key := range [...]string{k, tlsPoolKey(k)} {
					if p := l.connPools[key]; p != nil && len(p.waiters) > 0 {
						l.serveWaiters(p)
					}
				}
			}
		})
	}
}

// fdLimit returns the process's descriptor limit (RLIMIT_NOFILE, soft).
func fdLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return 1 << 20
	}
	return rl.Cur
}

// closeListener closes the listening socket once every loop has stopped
// watching it, so that no loop accepts on a descriptor number reused
// since.
func (e *loopEngine) closeListener() {
	e.lnOnce.Do(func() {
		if e.ln != nil {
			closeFD(e.lnfd)
			e.ln.Close()
		}
	})
}

// serveLoops serves ln, and the HTTPS listener of t when not nil, with
// the loop engine until Shutdown; ln may be nil when t is not.
func (s *Server) serveLoops(ln net.Listener, t *tlsFront) error {
	lnfd, addr := -1, net.Addr(nil)
	if ln != nil {
		tl, ok := ln.(*net.TCPListener)
		if !ok {
			s.logger.Warn("http loop engine needs a TCP listener; serving with fasthttp", "listener", ln.Addr().String())
			if t != nil {
				return s.serveFastTLS(ln, t)
			}
			return s.srv.Serve(ln)
		}
		var err error
		if lnfd, err = dupListener(tl); err != nil {
			return err
		}
		addr = ln.Addr()
	} else {
		addr = t.ln.Addr()
	}
	n := s.cfg.Loops
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	e := &loopEngine{s: s, lnfd: lnfd, ln: ln, stop: make(chan struct{}), handoff: newHandoffListener(addr)}
	for i := 0; i < n; i++ {
		l, err := newLoop(e)
		if err != nil {
			for _, l := range e.loops {
				l.closeFDs()
			}
			closeFD(lnfd)
			return err
		}
		e.loops = append(e.loops, l)
	}
	e.detached.Add(len(e.loops))
	e.wg.Add(len(e.loops))
	if !s.loops.CompareAndSwap(nil, e) {
		for _, l := range e.loops {
			l.closeFDs()
		}
		closeFD(lnfd)
		return errors.New("http front end is already serving")
	}
	rings := 0
	for _, l := range e.loops {
		if l.ring != nil {
			rings++
		}
	}
	if ln != nil {
		s.logger.Info("http front end serving", "addr", ln.Addr().String(), "backends", len(s.backends.Load().backends), "engine", EngineLoop, "loops", n,
			"io_uring_loops", rings, "max_conns", s.conns.max, "max_conns_per_source", s.conns.perSource)
	}
	tlsDone := make(chan struct{})
	if t != nil {
		s.logger.Info("https front end serving", "addr", t.ln.Addr().String(), "engine", EngineLoop, "loops", n)
		go s.acceptTLS(t, e.adoptTLS, func() { close(tlsDone) })
	} else {
		close(tlsDone)
	}
	fastDone := make(chan struct{})
	go func() {
		defer close(fastDone)
		s.srv.Serve(e.handoff)
	}()
	if s.mem != nil {
		go e.watchCritical()
	}
	for _, l := range e.loops {
		go l.run()
	}
	if s.shut.Load() { // Shutdown ran before the loops were known
		go e.shutdown(context.Background())
	}
	e.wg.Wait()
	e.closeListener()
	<-fastDone
	<-tlsDone
	return nil
}

// shutdown stops accepting, lets requests under way finish and closes
// idle connections, until every loop connection is gone or ctx is done;
// then it shuts the fasthttp server down for the connections handed to it.
func (e *loopEngine) shutdown(ctx context.Context) error {
	if e.stopping.CompareAndSwap(false, true) {
		close(e.stop)
	}
	for _, l := range e.loops {
		l.wake()
	}
	// Refuse new connections at once, as fasthttp does.
	detached := make(chan struct{})
	go func() { e.detached.Wait(); close(detached) }()
	select {
	case <-detached:
		e.closeListener()
	case <-ctx.Done():
	}
	done := make(chan struct{})
	go func() { e.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		e.force.Store(true)
		for _, l := range e.loops {
			l.wake()
		}
		<-done
	}
	e.handoff.Close()
	if ferr := e.s.srv.ShutdownWithContext(ctx); err == nil {
		err = ferr
	}
	return err
}

// watchCritical ends in-flight new work on every loop as soon as the node
// memory state turns Critical.
func (e *loopEngine) watchCritical() {
	mem := e.s.mem
	for {
		select {
		case <-mem.CriticalC():
		case <-e.stop:
			return
		}
		for _, l := range e.loops {
			l.post(l.abortNewWork)
		}
		// Wait for the state to leave Critical before watching again.
		t := time.NewTicker(50 * time.Millisecond)
		for mem.State() == admission.Critical {
			select {
			case <-t.C:
			case <-e.stop:
				t.Stop()
				return
			}
		}
		t.Stop()
	}
}

// shedIdle asks the other loops to close one idle connection of the
// pool keyed addr (connPool.key), so
// that from, which has requests waiting for a connection and none idle,
// may dial one: -http-backend-max-conns counts the connections of all
// loops.
func (e *loopEngine) shedIdle(addr string, from *evloop) {
	for _, ol := range e.loops {
		if ol == from {
			continue
		}
		ol.post(func() {
			p := ol.connPools[addr]
			if p == nil || len(p.idle) == 0 {
				return
			}
			ol.closeBackend(p.idle[0]) // the coldest
			from.post(func() {
				if p := from.connPools[addr]; p != nil {
					from.serveWaiters(p)
				}
			})
		})
	}
}

// evloop is one event loop and everything it owns: its client
// connections, a keep-alive pool per backend address, and scratch headers
// that are parsed and serialized within one event.
type evloop struct {
	poller
	e         *loopEngine
	s         *Server
	fds       []fdOwner
	mu        sync.Mutex // guards posted and closed
	posted    []func()
	closed    bool
	connPools map[string]*connPool
	rd        bytes.Reader
	br        *bufio.Reader
	reqH      fasthttp.RequestHeader
	respH     fasthttp.ResponseHeader
	local     fasthttp.Response
	uri       fasthttp.URI
	target    []byte   // scratch: an absolute-form target made origin-form
	view      reqView  // scratch: the request's normalised host and path (admit), its stripped target
	toWrite   []*bconn // backend connections with a request to write this round
	toBuf     []*bconn
	out       []byte
	clients   int
	now       int64 // I/O time (ns since start), read once per wake-up
	base      time.Time
	tick      int64
	stopped   bool
	// Accepting pauses after accept failed for lack of resources
	// (acceptFailed): backoff is the pause, grown while it keeps failing.
	acceptPaused bool
	backoff      time.Duration
	bufs         [][]byte // free client buffers
	tlsOut       []byte   // scratch: the records of one TLS write (tls_loop.go)
	tlsBufs      [][]byte // free ciphertext read buffers of HTTPS connections
	// With Config.IOURing (loop_uring.go): the loop's ring (nil without),
	// the plain clients with answer bytes for the round's batch, the
	// batch's connections and completions, free answer buffers.
	ring     *uring.Ring
	minBatch int // ringMinBatch
	toFlush  []*cconn
	flushBuf []*cconn
	targets  []ioTarget
	comps    []uring.Completion
	outBufs  [][]byte
}

// fdOwner is the connection that holds a descriptor: one of c and b is set.
type fdOwner struct {
	c *cconn
	b *bconn
}

// newLoop makes a loop of e with its epoll instance, watching the listener.
func newLoop(e *loopEngine) (*evloop, error) {
	l := &evloop{
		e: e, s: e.s,
		connPools: map[string]*connPool{},
		br:        bufio.NewReaderSize(nil, backendBufSize),
		base:      time.Now(),
	}
	if err := l.poller.open(e.lnfd); err != nil {
		return nil, err
	}
	l.local.Header.SetNoDefaultContentType(true)
	l.openRing()
	return l, nil
}

// closeFDs closes the loop's epoll instance and eventfd, once its
// connections are closed; wake does nothing after it.
func (l *evloop) closeFDs() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.poller.close()
	l.closeRing()
}

// post runs f on the loop's goroutine soon.
func (l *evloop) post(f func()) {
	l.mu.Lock()
	l.posted = append(l.posted, f)
	l.mu.Unlock()
	l.wake()
}

// wake interrupts epoll_wait. After the loop has ended it does nothing:
// its descriptor number may belong to another file by then.
func (l *evloop) wake() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.signal()
	}
}

// run is the loop's goroutine: wait for events, handle backend events
// before client events, run posted work, enforce deadlines every
// tickEvery, write the requests the round started, and on shutdown drain
// until no connection is left.
func (l *evloop) run() {
	defer l.e.wg.Done()
	l.now = int64(time.Since(l.base))
	l.tick = l.now
	for {
		n, err := l.wait(tickEvery)
		l.now = int64(time.Since(l.base))
		if err != nil && err != unix.EINTR {
			l.s.logger.Error("http loop: epoll_wait failed", "err", err)
			n = 0
		}
		if l.ring != nil {
			l.prefetchReads(n)
		}
		// Answers first: relaying them ends requests, while new requests
		// only queue writes to the backends until the round is over.
		for i := 0; i < n; i++ {
			if fd := int(l.events[i].Fd); fd < len(l.fds) && l.fds[fd].b != nil {
				l.backendEvent(l.fds[fd].b, l.events[i].Events)
				l.events[i].Fd = -1
			}
		}
		for i := 0; i < n; i++ {
			ev := l.events[i]
			fd := int(ev.Fd)
			switch {
			case fd < 0:
			case fd == l.e.lnfd:
				l.accept()
			case fd == l.wakefd:
				l.clearSignal()
				l.runPosted()
			case fd < len(l.fds):
				if o := l.fds[fd]; o.c != nil {
					l.clientEvent(o.c, ev.Events)
				} else if o.b != nil {
					l.backendEvent(o.b, ev.Events)
				}
			}
		}
		if l.now-l.tick >= int64(tickEvery) {
			l.tick = l.now
			l.expire()
		}
		l.flushRound()
		if l.e.stopping.Load() && l.drain() {
			return
		}
	}
}

// flushBackends writes the requests started in this round of events.
// Writing them back to back, rather than each as its client's event is
// handled, lets a backend find several requests per wake-up instead of
// being woken for each.
func (l *evloop) flushBackends() {
	for len(l.toWrite) > 0 {
		bs := l.toWrite
		l.toWrite = l.toBuf[:0]
		for i, bc := range bs {
			if bc.fd >= 0 && bc.c != nil && len(bc.pend) > 0 && !bc.connecting {
				l.writeBackend(bc) // may queue a retry
			}
			bs[i] = nil
		}
		l.toBuf = bs[:0]
	}
}

// runPosted runs the functions other goroutines posted, in order.
func (l *evloop) runPosted() {
	l.mu.Lock()
	fs := l.posted
	l.posted = nil
	l.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// drain handles shutdown: stop accepting, close idle clients (busy ones
// close after their answer), and once no client is left close the backend
// connections. It reports whether the loop is done.
func (l *evloop) drain() bool {
	force := l.e.force.Load()
	if !l.stopped {
		l.stopped = true
		if l.e.lnfd >= 0 {
			l.unwatch(l.e.lnfd)
		}
		l.e.detached.Done()
	}
	for _, o := range l.fds {
		if c := o.c; c != nil && (force || (!c.busy && c.o == len(c.out) && c.w == c.r)) {
			l.closeClient(c)
		}
	}
	if l.clients > 0 || l.s.tlsPending() {
		return false // an HTTPS connection in its handshake may yet be posted to this loop
	}
	for _, o := range l.fds {
		if o.b != nil {
			l.closeBackend(o.b)
		}
	}
	l.closeFDs()
	return true
}

// setFD records o as the owner of descriptor fd, growing the table.
func (l *evloop) setFD(fd int, o fdOwner) {
	for fd >= len(l.fds) {
		l.fds = append(l.fds, make([]fdOwner, len(l.fds)+64)...)
	}
	l.fds[fd] = o
}

// expire enforces deadlines: idle and slow clients are closed, backend
// connects and answers that take too long fail, idle backend connections
// are closed, requests waiting for a connection get 503.
func (l *evloop) expire() {
	now := l.now
	for _, o := range l.fds {
		if c := o.c; c != nil && c.deadline != 0 && now > c.deadline {
			if c.tun {
				c.x.log.end = accesslog.EndTimeout
			}
			if c.pp == proxyRead {
				l.s.proxyRejected(proxyproto.ReasonTimeout, c.ip, nil)
			}
			l.logUnfinished(c, accesslog.EndTimeout)
			l.closeClient(c)
		}
		if bc := o.b; bc != nil && bc.deadline != 0 && now > bc.deadline {
			if c := bc.c; c != nil && c.o < len(c.out) {
				bc.deadline = now + int64(l.s.cfg.BackendTimeout) // paused for a slow client, whose own deadline counts
				continue
			}
			switch c := bc.c; {
			case c == nil:
				l.closeBackend(bc)
			case bc.connecting:
				bc.cp.sa = nil
				l.failed(c, fasthttp.ErrDialTimeout, lb.Timeout)
			default:
				l.failed(c, fasthttp.ErrTimeout, lb.Timeout)
			}
		}
	}
	forget := l.s.poolForget.Load()
	var inForce map[string]struct{}
	if set := l.s.backends.Load(); set != nil {
		inForce = set.addrs
	}
	for key, p := range l.connPools {
		// A waiter whose request no longer waits here (it went on: a
		// retry waiting in another pool, with a later deadline) is
		// dropped whatever that deadline, so that it does not hold the
		// ones behind it past theirs.
		for len(p.waiters) > 0 {
			w := p.waiters[0]
			if w.valid() && now <= w.c.x.waitUntil {
				break
			}
			p.waiters = p.waiters[1:]
			if w.valid() {
				w.c.x.waitUntil = 0
				l.failed(w.c, fasthttp.ErrNoFreeConns, lb.Abandoned)
			}
		}
		if _, kept := inForce[p.addr]; !kept && p.live == 0 && len(p.waiters) == 0 && now-p.used >= forget {
			// Its address left the backends (a reload, DNS) and nothing
			// of it is left: forget it (poolForgetAfter), and give its
			// reference to the address's slots back.
			delete(l.connPools, key)
			l.s.dropSlots(p.addr, p.open)
		}
	}
}

// abortNewWork runs on the loop when memory turned Critical.
func (l *evloop) abortNewWork() {
	if l.s.mem.State() != admission.Critical {
		return
	}
	for _, o := range l.fds {
		c := o.c
		if c == nil || !c.busy || c.tun || c.x.class != admission.NewWork || c.x.b == nil {
			continue
		}
		if c.x.bc != nil || c.x.waitUntil != 0 {
			l.abort(c)
		}
	}
}
