//go:build linux

package http

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
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
	epollET        = 1 << 31
	connEvents     = syscall.EPOLLIN | syscall.EPOLLOUT | syscall.EPOLLRDHUP | epollET
)

var crlf2 = []byte("\r\n\r\n")

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
// Upgrade, Expect, a head over 16 KiB or one fasthttp rejects) is handed,
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
	openMu   sync.Mutex
	open     map[string]*atomic.Int64 // connections per backend address, all loops
}

// openCount returns the counter of connections to addr that all loops
// share.
func (e *loopEngine) openCount(addr string) *atomic.Int64 {
	e.openMu.Lock()
	defer e.openMu.Unlock()
	if e.open == nil {
		e.open = map[string]*atomic.Int64{}
	}
	n := e.open[addr]
	if n == nil {
		n = new(atomic.Int64)
		e.open[addr] = n
	}
	return n
}

// closeListener closes the listening socket once every loop has stopped
// watching it, so that no loop accepts on a descriptor number reused
// since.
func (e *loopEngine) closeListener() {
	e.lnOnce.Do(func() {
		syscall.Close(e.lnfd)
		e.ln.Close()
	})
}

// serveLoops serves ln with the loop engine until Shutdown.
func (s *Server) serveLoops(ln net.Listener) error {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		s.logger.Warn("http loop engine needs a TCP listener; serving with fasthttp", "listener", ln.Addr().String())
		return s.srv.Serve(ln)
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return err
	}
	lnfd := -1
	var derr error
	if err := rc.Control(func(fd uintptr) {
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_DUPFD_CLOEXEC, 0)
		if e != 0 {
			derr = e
			return
		}
		lnfd = int(r)
	}); err != nil {
		return err
	}
	if derr != nil {
		return derr
	}
	n := s.cfg.Loops
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	e := &loopEngine{s: s, lnfd: lnfd, ln: ln, stop: make(chan struct{}), handoff: newHandoffListener(ln.Addr())}
	for i := 0; i < n; i++ {
		l, err := newLoop(e)
		if err != nil {
			for _, l := range e.loops {
				l.closeFDs()
			}
			syscall.Close(lnfd)
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
		syscall.Close(lnfd)
		return errors.New("http front end is already serving")
	}
	s.logger.Info("http front end serving", "addr", ln.Addr().String(), "backends", s.rt.Load().pool.Len(), "engine", EngineLoop, "loops", n)
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

// evloop is one event loop and everything it owns: its client
// connections, a keep-alive pool per backend address, and scratch headers
// that are parsed and serialized within one event.
type evloop struct {
	e       *loopEngine
	s       *Server
	ep      int
	wakefd  int
	fds     []fdOwner
	events  []syscall.EpollEvent
	mu      sync.Mutex // guards posted and closed
	posted  []func()
	closed  bool
	pools   map[string]*bpool
	rd      bytes.Reader
	br      *bufio.Reader
	reqH    fasthttp.RequestHeader
	respH   fasthttp.ResponseHeader
	local   fasthttp.Response
	uri     fasthttp.URI
	target  []byte          // scratch: an absolute-form target made origin-form
	epFile  *os.File        // l.ep, registered with Go's poller
	epRaw   syscall.RawConn // of epFile; nil when ep could not be registered
	pollFn  func(fd uintptr) bool
	polled  int
	toWrite []*bconn // backend connections with a request to write this round
	toBuf   []*bconn
	out     []byte
	clients int
	now     int64 // I/O time (ns since start), read once per wake-up
	base    time.Time
	tick    int64
	stopped bool
	bufs    [][]byte // free client buffers
}

type fdOwner struct {
	c *cconn
	b *bconn
}

// cconn is a client connection.
type cconn struct {
	fd       int
	gen      uint32 // bumped when closed or handed over; posted work checks it
	seq      uint32 // bumped per request
	ip       netip.Addr
	in       []byte // read buffer: in[r:w] not yet consumed
	r, w     int
	rready   bool   // the socket may have unread bytes
	hup      bool   // the peer has shut down its side: read until EOF
	out      []byte // answer bytes the socket did not take yet: out[o:]
	o        int
	busy     bool // a request is being handled
	parsing  bool // clientIn is on the stack
	closing  bool // close once out is written
	deadline int64
	x        exchange
}

// exchange is the request a client connection is handling.
type exchange struct {
	reqLen     int    // bytes of the request at in[r:]
	bodyLen    int    // its Content-Length, the last bytes of reqLen; -1 when it has none
	req        []byte // the request as sent to the backend
	rt         *route
	b          *lb.Backend
	bc         *bconn
	class      admission.Class
	key        uint64
	start      int64 // admission clock
	renew      bool
	closeAfter bool
	idem       bool
	head       bool
	acquired   bool // b.Acquire was called and Release is due
	attempt    int  // another backend was tried
	staleRetry bool // resent once after a reused connection turned out closed
	waitUntil  int64
	gotHead    bool
	status     int
	framing    uint8
	remain     int64
	chunk      chunkScan
	bclose     bool // the backend connection is not reusable afterwards
	observed   bool // ObserveForward was called
}

// Body framings of a response.
const (
	frameNone = iota
	frameLength
	frameChunked
	frameClose
)

// bconn is a backend connection.
type bconn struct {
	fd         int
	pool       *bpool
	c          *cconn // the client whose request it carries; nil when idle
	in         []byte
	r, w       int
	rready     bool
	hup        bool // the backend has shut down its side: read until EOF
	wready     bool
	connecting bool
	used       bool   // it carried an exchange before: a keep-alive reuse
	pend       []byte // request bytes not written yet
	deadline   int64
}

// bpool is a loop's connections to one backend address.
type bpool struct {
	addr    string
	sa      syscall.Sockaddr
	idle    []*bconn      // LIFO: the warmest connection last
	open    *atomic.Int64 // connections to addr of all loops
	waiters []waiter
}

type waiter struct {
	c        *cconn
	gen, seq uint32
}

// valid reports whether the request that queued w still waits.
func (w waiter) valid() bool {
	return w.c.gen == w.gen && w.c.seq == w.seq && w.c.fd >= 0 && w.c.x.waitUntil != 0
}

func newLoop(e *loopEngine) (*evloop, error) {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	r, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		syscall.Close(ep)
		return nil, errno
	}
	l := &evloop{
		e: e, s: e.s, ep: ep, wakefd: int(r),
		events: make([]syscall.EpollEvent, 256),
		pools:  map[string]*bpool{},
		br:     bufio.NewReaderSize(nil, backendBufSize),
		base:   time.Now(),
	}
	l.local.Header.SetNoDefaultContentType(true)
	// Register the epoll descriptor with Go's poller (it is readable while
	// events are ready) so that waiting parks the goroutine, not the P.
	if err := syscall.SetNonblock(ep, true); err == nil {
		f := os.NewFile(uintptr(ep), "epoll")
		if f.SetReadDeadline(time.Time{}) == nil { // pollable
			if rc, err := f.SyscallConn(); err == nil {
				l.epFile, l.epRaw = f, rc
				l.pollFn = func(fd uintptr) bool {
					l.polled = l.poll(int(fd))
					return l.polled > 0
				}
			}
		}
		if l.epRaw == nil {
			// os.NewFile owns ep now; a descriptor that is not pollable
			// stays usable through the File's Fd.
			l.epFile = f
			l.ep = int(f.Fd())
		}
	}
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, l.wakefd, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(l.wakefd)}); err != nil {
		l.closeFDs()
		return nil, err
	}
	// EPOLLEXCLUSIVE: one loop is woken per incoming connection.
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, e.lnfd, &syscall.EpollEvent{Events: syscall.EPOLLIN | 1<<28, Fd: int32(e.lnfd)}); err != nil {
		l.closeFDs()
		return nil, err
	}
	return l, nil
}

func (l *evloop) closeFDs() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.epFile != nil {
		l.epFile.Close() // leaves Go's poller and closes l.ep
	} else {
		syscall.Close(l.ep)
	}
	syscall.Close(l.wakefd)
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
		one := uint64(1)
		syscall.Write(l.wakefd, (*[8]byte)(unsafe.Pointer(&one))[:])
	}
}

func (l *evloop) run() {
	defer l.e.wg.Done()
	l.now = int64(time.Since(l.base))
	l.tick = l.now
	for {
		n, err := l.wait()
		l.now = int64(time.Since(l.base))
		if err != nil && err != syscall.EINTR {
			l.s.logger.Error("http loop: epoll_wait failed", "err", err)
			n = 0
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
				var buf [8]byte
				syscall.Read(l.wakefd, buf[:])
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
		l.flushBackends()
		if l.e.stopping.Load() && l.drain() {
			return
		}
	}
}

// wait returns the ready events, or none after tickEvery. It polls
// without blocking first: under load events are almost always ready. When
// none are, it parks the goroutine on Go's own poller, in which the loop's
// epoll descriptor is registered, so the P is free for other goroutines at
// once. A blocking epoll_wait would keep the P until sysmon takes it (20 µs
// to 10 ms later), holding up the rest of the process meanwhile (health
// checks, SIP, the admin server) and costing a thread switch back.
func (l *evloop) wait() (int, error) {
	if n := l.poll(l.ep); n > 0 {
		return n, nil
	}
	if l.epRaw == nil { // the descriptor could not join Go's poller
		return syscall.EpollWait(l.ep, l.events, int(tickEvery/time.Millisecond))
	}
	l.epFile.SetReadDeadline(time.Now().Add(tickEvery))
	l.polled = 0
	if err := l.epRaw.Read(l.pollFn); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, err
	}
	return l.polled, nil
}

// poll collects ready events without blocking.
func (l *evloop) poll(ep int) int {
	r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), 0, 0, 0)
	if e != 0 {
		return 0
	}
	return int(r)
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
		syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, l.e.lnfd, nil)
		l.e.detached.Done()
	}
	for _, o := range l.fds {
		if c := o.c; c != nil && (force || (!c.busy && c.o == len(c.out) && c.w == c.r)) {
			l.closeClient(c)
		}
	}
	if l.clients > 0 {
		return false
	}
	for _, o := range l.fds {
		if o.b != nil {
			l.closeBackend(o.b)
		}
	}
	l.closeFDs()
	return true
}

func (l *evloop) setFD(fd int, o fdOwner) {
	for fd >= len(l.fds) {
		l.fds = append(l.fds, make([]fdOwner, len(l.fds)+64)...)
	}
	l.fds[fd] = o
}

func (l *evloop) accept() {
	for range 64 {
		fd, sa, err := syscall.Accept4(l.e.lnfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			switch err {
			case syscall.EAGAIN, syscall.EINTR:
			case syscall.ECONNABORTED:
				continue
			default: // EMFILE, ENFILE, ENOBUFS: the listener stays ready, retried next wake-up
				l.s.logger.Warn("http accept failed", "err", err)
			}
			return
		}
		if l.e.stopping.Load() {
			syscall.Close(fd)
			continue
		}
		syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		c := &cconn{fd: fd, ip: sockaddrIP(sa), in: l.getBuf(), deadline: l.now + int64(l.s.cfg.ClientIdle)}
		if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: connEvents, Fd: int32(fd)}); err != nil {
			syscall.Close(fd)
			continue
		}
		l.setFD(fd, fdOwner{c: c})
		l.clients++
	}
}

func (l *evloop) getBuf() []byte {
	if n := len(l.bufs); n > 0 {
		b := l.bufs[n-1]
		l.bufs = l.bufs[:n-1]
		return b
	}
	return make([]byte, clientInitBuf)
}

func sockaddrIP(sa syscall.Sockaddr) netip.Addr {
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		return netip.AddrFrom4(a.Addr)
	case *syscall.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap()
	}
	return netip.Addr{}
}

// --- client side ---

func (l *evloop) clientEvent(c *cconn, ev uint32) {
	if ev&syscall.EPOLLOUT != 0 && c.o < len(c.out) {
		l.flushClient(c)
		if c.fd < 0 {
			return
		}
	}
	if ev&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
		c.rready = true
		// After a shutdown no new edge comes: a short read does not
		// mean drained, the EOF is still to be read.
		c.hup = c.hup || ev&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0
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
	for c.fd >= 0 && !c.busy && !c.closing {
		if c.w > c.r {
			if c.deadline == 0 || c.deadline > l.now+int64(l.s.cfg.ClientReadTimeout) {
				c.deadline = l.now + int64(l.s.cfg.ClientReadTimeout)
			}
			if l.parse(c) {
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
		if c.w == len(c.in) {
			if len(c.in) >= clientBufSize {
				l.handover(c) // parse wants more than the buffer holds
				return
			}
			nb := make([]byte, clientBufSize)
			copy(nb, c.in[:c.w])
			c.in = nb
		}
		n, errno := rawRead(c.fd, c.in[c.w:])
		switch {
		case errno == syscall.EAGAIN:
			c.rready = false
			return
		case errno == syscall.EINTR:
			continue
		case errno != 0 || n == 0:
			l.closeClient(c) // EOF or reset; an unfinished request is dropped, as fasthttp does
			return
		}
		if n < len(c.in)-c.w && !c.hup {
			c.rready = false // a short read drained the socket; the next edge reports more
		}
		c.w += n
	}
}

// parse looks at the buffered bytes: it returns true when it started a
// request (or handed the connection over, or answered), false when it
// needs more bytes. checkHead decides the request's framing from the
// client's bytes before anything else reads them; a head it refuses is
// answered (400, 431, 501 or 505) and the connection closed.
func (l *evloop) parse(c *cconn) bool {
	buf := c.in[c.r:c.w]
	hi, err := checkHead(buf, l.s.connDeny)
	if err == errHeadIncomplete {
		return false
	}
	if err != nil {
		l.refuseHead(c, err)
		return true
	}
	hlen := hi.n
	h := &l.reqH
	if hi.http10 || hi.chunked || !l.readReqHead(buf[:hlen]) || len(h.Peek("Upgrade")) > 0 || len(h.Peek("Expect")) > 0 {
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
	s.writeRefusal(&l.local, he.status, 0, psHeadRefused, he.reason)
	l.answerLocal(c)
}

// path returns the request's path as fasthttp's RequestCtx.Path does
// (decoded and normalized), so ARM rules see the same path on both
// engines; nil when no rule looks at paths.
func (l *evloop) path(h *fasthttp.RequestHeader) []byte {
	if !l.s.needPath {
		return nil
	}
	l.uri.Reset()
	if l.uri.Parse(nil, h.RequestURI()) != nil {
		return h.RequestURI()
	}
	return l.uri.Path()
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

// begin classifies and admits the request whose head is h.
func (l *evloop) begin(c *cconn, h *fasthttp.RequestHeader, body []byte) {
	s := l.s
	now := s.clock.Now()
	c.seq++
	x := &c.x
	*x = exchange{reqLen: x.reqLen, bodyLen: x.bodyLen, req: x.req[:0], start: now, rt: s.rt.Load()}
	x.closeAfter = h.ConnectionClose() || l.e.stopping.Load()
	x.idem = idempotent(h.Method())
	x.head = h.IsHead()
	b, renew, repinned := s.affinity(h, x.rt, now)
	x.class = admission.NewWork
	if b != nil {
		x.class = admission.Affinity
	}
	r := admission.Request{Class: x.class, Proto: "http", Method: b2s(h.Method()), Host: b2s(h.Host()), Path: b2s(l.path(h))}
	d := s.ctrl.Decide(now, &r, nil)
	if d.Verdict == admission.Delay {
		l.delay(c, r, d, renew, repinned)
		return
	}
	l.admitted(c, h, body, &r, d, b, renew, repinned)
}

// delay waits for an ARM rule's queue off the loop, then carries on with
// the request on the loop.
func (l *evloop) delay(c *cconn, r admission.Request, d admission.Decision, renew, repinned bool) {
	r.Method, r.Host, r.Path = strings.Clone(r.Method), strings.Clone(r.Host), strings.Clone(r.Path)
	gen := c.gen
	go func() {
		d := d
		for d.Verdict == admission.Delay {
			d = l.s.wait(l.e.stop, &r, d)
		}
		l.post(func() {
			if c.gen != gen || c.fd < 0 {
				return
			}
			body := l.reparse(c)
			l.admitted(c, &l.reqH, body, &r, d, nil, renew, repinned)
		})
	}()
}

// admitted goes on from an admission decision: refuse, or pick a backend
// and send.
func (l *evloop) admitted(c *cconn, h *fasthttp.RequestHeader, body []byte, r *admission.Request, d admission.Decision, b *lb.Backend, renew, repinned bool) {
	s := l.s
	x := &c.x
	if d.Verdict == admission.Refuse {
		s.refuseDecision(&l.local, d)
		l.answerLocal(c)
		return
	}
	if b == nil {
		var out lb.Outcome
		var retry time.Duration
		x.key = s.key(h, c.ip, x.rt)
		b, out, retry = x.rt.pool.Pick(x.start, x.key, nil)
		switch out {
		case lb.NoBackend:
			s.refuse(&l.local, fasthttp.StatusServiceUnavailable, s.cfg.RetryAfterNoBackend, psNoBackend, "no backend available")
			l.answerLocal(c)
			return
		case lb.MOPRefused:
			s.refuseDecision(&l.local, s.ctrl.RefuseMOPFor(r, retry))
			l.answerLocal(c)
			return
		}
		renew = s.sticky != nil
		if repinned {
			s.stats.Repinned.Add(1)
		}
	}
	x.b, x.renew = b, renew
	s.prepareRequest(h, c.ip)
	h.ResetConnectionClose()
	if len(h.Host()) == 0 {
		h.SetHost(b.Addr()) // "Host:" empty is valid (RFC 9112 §3.2); the backend gets an authority
	}
	// The framing checkHead decided, and nothing else: the body that
	// follows is exactly bodyLen bytes, or there is none.
	if x.bodyLen >= 0 {
		h.SetContentLength(x.bodyLen)
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
	out := resp.Header.AppendBytes(l.out[:0])
	if !c.x.head { // an answer to HEAD has the length of its body, not the body
		out = append(out, body...)
	}
	l.out = out[:0]
	l.observe(c)
	l.writeClient(c, out)
	l.finish(c)
}

// finish ends the client's current request and goes on with the next.
func (l *evloop) finish(c *cconn) {
	if c.fd < 0 {
		return
	}
	l.observe(c)
	c.r += c.x.reqLen
	c.x.reqLen = 0
	c.x.rt, c.x.b, c.x.bc = nil, nil, nil
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
		c.r, c.w = 0, 0
		if len(c.in) > clientInitBuf {
			c.in = l.getBuf() // drop the larger buffer of a large head or a body
		}
	}
	if c.w > c.r || c.rready {
		l.clientIn(c)
	}
}

// observe reports a forwarded request's time to Config.ObserveForward,
// once, before the last bytes of its answer go out (a client that has its
// answer sees it counted).
func (l *evloop) observe(c *cconn) {
	if x := &c.x; x.b != nil && !x.observed && l.s.cfg.ObserveForward != nil {
		x.observed = true
		l.s.cfg.ObserveForward(time.Duration(l.s.clock.Now() - x.start))
	}
}

// settle accounts for a relayed answer before its last bytes go out: the
// backend's count, the front end's counters, the latency.
func (l *evloop) settle(c *cconn) {
	x := &c.x
	if !x.acquired {
		return
	}
	x.release(result(nil, x.status))
	if x.class == admission.Affinity {
		l.s.stats.Affinity.Add(1)
	} else {
		l.s.stats.NewWork.Add(1)
	}
	l.observe(c)
}

// writeClient writes p to the client, keeping what the socket does not take.
func (l *evloop) writeClient(c *cconn, p []byte) {
	if c.fd < 0 || len(p) == 0 {
		return
	}
	if c.o < len(c.out) {
		c.out = append(c.out, p...)
		return
	}
	for len(p) > 0 {
		n, errno := rawWrite(c.fd, p)
		if errno == syscall.EINTR {
			continue
		}
		if errno == syscall.EAGAIN {
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
		if errno == syscall.EINTR {
			continue
		}
		if errno == syscall.EAGAIN {
			return
		}
		if errno != 0 {
			l.closeClient(c)
			return
		}
		c.o += n
		c.deadline = l.now + int64(l.s.cfg.ClientReadTimeout)
	}
	c.out, c.o = c.out[:0], 0
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
		c.deadline = l.now + int64(l.s.cfg.ClientIdle)
		l.clientIn(c)
	}
}

func (l *evloop) closeClient(c *cconn) {
	if c.fd < 0 {
		return
	}
	if bc := c.x.bc; c.busy && bc != nil {
		// The client left mid-exchange: the backend connection is in an
		// unknown state.
		c.x.release(lb.Abandoned)
		l.closeBackend(bc)
	}
	syscall.Close(l.detach(c))
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

// handover gives the connection, with the bytes read so far, to the
// fasthttp server for the rest of its life.
func (l *evloop) handover(c *cconn) {
	l.s.stats.HandedOver.Add(1)
	prefix := append([]byte(nil), c.in[c.r:c.w]...)
	syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, c.fd, nil)
	f := os.NewFile(uintptr(l.detach(c)), "http-client")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		l.s.logger.Warn("http: handing a connection to fasthttp failed", "err", err)
		return
	}
	l.e.handoff.push(l.s.gate(nc, prefix))
}

// --- backend side ---

func (l *evloop) pool(addr string) *bpool {
	p := l.pools[addr]
	if p == nil {
		p = &bpool{addr: addr, open: l.e.openCount(addr)}
		l.pools[addr] = p
	}
	return p
}

// send gets a connection to the exchange's backend and writes the request.
func (l *evloop) send(c *cconn) {
	x := &c.x
	if !x.acquired {
		x.b.Acquire()
		x.acquired = true
	}
	x.waitUntil = 0
	p := l.pool(x.b.Addr())
	var bc *bconn
	if n := len(p.idle); n > 0 {
		bc = p.idle[n-1]
		p.idle = p.idle[:n-1]
	} else if p.open.Load() >= int64(l.s.cfg.MaxConns) {
		x.waitUntil = l.now + int64(l.s.cfg.ConnWait)
		p.waiters = append(p.waiters, waiter{c, c.gen, c.seq})
		l.e.shedIdle(p.addr, l)
		return
	} else {
		var err error
		if bc, err = l.dial(p); err != nil {
			l.failed(c, err, lb.ConnectError, true)
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
	bc.deadline = l.now + int64(l.s.cfg.BackendTimeout)
	l.toWrite = append(l.toWrite, bc) // written after this round of events, together
}

func (l *evloop) dial(p *bpool) (*bconn, error) {
	if p.sa == nil {
		a, err := net.ResolveTCPAddr("tcp", p.addr)
		if err != nil {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
		}
		if ip4 := a.IP.To4(); ip4 != nil {
			p.sa = &syscall.SockaddrInet4{Port: a.Port, Addr: [4]byte(ip4)}
		} else {
			p.sa = &syscall.SockaddrInet6{Port: a.Port, Addr: [16]byte(a.IP.To16())}
		}
	}
	family := syscall.AF_INET
	if _, ok := p.sa.(*syscall.SockaddrInet6); ok {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	err = syscall.Connect(fd, p.sa)
	if err != nil && err != syscall.EINPROGRESS {
		syscall.Close(fd)
		p.sa = nil // resolve again next time
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: connEvents, Fd: int32(fd)}); err != nil {
		syscall.Close(fd)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	bc := &bconn{fd: fd, pool: p, in: make([]byte, backendInitBuf), connecting: err != nil, wready: err == nil}
	l.setFD(fd, fdOwner{b: bc})
	p.open.Add(1)
	return bc, nil
}

func (l *evloop) backendEvent(bc *bconn, ev uint32) {
	if bc.connecting {
		if ev&(syscall.EPOLLOUT|syscall.EPOLLERR|syscall.EPOLLHUP) == 0 {
			return
		}
		soerr, err := syscall.GetsockoptInt(bc.fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
		if err == nil && soerr != 0 {
			err = syscall.Errno(soerr)
		}
		if err != nil {
			bc.pool.sa = nil
			if c := bc.c; c != nil {
				l.closeBackend(bc)
				l.failed(c, &net.OpError{Op: "dial", Net: "tcp", Err: err}, lb.ConnectError, true)
			} else {
				l.closeBackend(bc)
			}
			return
		}
		bc.connecting = false
		bc.wready = true
		if bc.c != nil {
			bc.deadline = l.now + int64(l.s.cfg.BackendTimeout)
		}
	}
	if ev&syscall.EPOLLOUT != 0 {
		bc.wready = true
		if len(bc.pend) > 0 {
			l.writeBackend(bc)
		}
	}
	if ev&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
		bc.rready = true
		bc.hup = bc.hup || ev&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0
		if bc.c == nil {
			// An idle connection: the backend closed it or sent bytes
			// nobody asked for; a read that finds nothing was a stale edge.
			var one [1]byte
			if _, errno := rawRead(bc.fd, one[:]); errno != syscall.EAGAIN {
				l.closeBackend(bc)
			}
			return
		}
		l.relay(bc)
	}
}

func (l *evloop) writeBackend(bc *bconn) {
	for len(bc.pend) > 0 && bc.wready {
		n, errno := rawWrite(bc.fd, bc.pend)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno == syscall.EAGAIN:
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
		x.release(lb.Abandoned)
		x.bc = nil
		l.send(c)
		return
	}
	l.failed(c, fasthttp.ErrConnectionClosed, lb.ConnectError, false)
}

// relay reads the backend's answer and passes it on to the client as it
// arrives, until the answer is complete or the client cannot take more.
func (l *evloop) relay(bc *bconn) {
	c := bc.c
	for c != nil && bc.c == c && c.fd >= 0 && c.o == len(c.out) {
		if bc.r < bc.w && l.consume(bc) {
			return // complete, or failed
		}
		if bc.c != c || c.o < len(c.out) {
			return
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
				l.failed(c, errBadAnswer, lb.ServerError, false) // a head over 64 KiB
				return
			}
			nb := make([]byte, backendBufSize)
			copy(nb, bc.in[:bc.w])
			bc.in = nb
		}
		n, errno := rawRead(bc.fd, bc.in[bc.w:])
		switch {
		case errno == syscall.EAGAIN:
			bc.rready = false
			return
		case errno == syscall.EINTR:
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
		bc.deadline = l.now + int64(l.s.cfg.BackendTimeout)
	}
}

var errBadAnswer = errors.New("malformed answer from backend")

// consume handles the bytes in bc.in[r:w]: the answer's head, then body
// bytes. It returns true when the exchange ended (complete or failed).
func (l *evloop) consume(bc *bconn) bool {
	c := bc.c
	x := &c.x
	if !x.gotHead {
		buf := bc.in[bc.r:bc.w]
		end := bytes.Index(buf, crlf2)
		if end < 0 {
			return false
		}
		hlen := end + 4
		h := &l.respH
		l.rd.Reset(buf[:hlen])
		l.br.Reset(&l.rd)
		if err := h.Read(l.br); err != nil {
			l.failed(c, errBadAnswer, lb.ServerError, false)
			return true
		}
		st := h.StatusCode()
		if st < 200 {
			if st == fasthttp.StatusSwitchingProtocols {
				l.failed(c, errBadAnswer, lb.ServerError, false)
				return true
			}
			l.writeClient(c, buf[:hlen]) // 1xx informational: passed on as is
			bc.r += hlen
			return false
		}
		x.gotHead, x.status = true, st
		cl := h.ContentLength()
		switch {
		case x.head || st == fasthttp.StatusNoContent || st == fasthttp.StatusNotModified:
			x.framing = frameNone
		case cl >= 0:
			x.framing, x.remain = frameLength, int64(cl)
		case cl == -1:
			x.framing, x.chunk = frameChunked, chunkScan{}
		default:
			x.framing = frameClose
		}
		// An answer with both Transfer-Encoding and Content-Length is
		// relayed chunked (RFC 9112 §6.3), but the connection it came on
		// is not trusted with another request.
		x.bclose = h.ConnectionClose() || x.framing == frameClose ||
			(x.framing == frameChunked && hasField(buf[:hlen], "content-length"))
		if x.class == admission.NewWork && l.s.mem != nil && l.s.mem.State() == admission.Critical {
			l.abort(c)
			return true
		}
		s := l.s
		s.prepareResponse(h, x.rt, x.b, x.renew, x.start)
		switch x.framing {
		case frameNone:
			if cl >= 0 {
				h.SetContentLength(cl) // a HEAD answer keeps its length
			}
		case frameLength:
			h.SetContentLength(cl)
		case frameChunked:
			h.SetContentLength(-1)
		case frameClose:
			h.SetContentLength(-2)
			x.closeAfter = true
		}
		h.ResetConnectionClose()
		if x.closeAfter || l.e.stopping.Load() {
			h.SetConnectionClose()
		}
		h.SetNoDefaultContentType(true)
		bc.r += hlen
		out := h.AppendBytes(l.out[:0])
		k, done, err := x.bodyBytes(bc.in[bc.r:bc.w])
		if err != nil {
			l.failed(c, errBadAnswer, lb.ServerError, false)
			return true
		}
		out = append(out, bc.in[bc.r:bc.r+k]...)
		l.out = out[:0]
		bc.r += k
		if done {
			l.settle(c)
		}
		l.writeClient(c, out)
		if done {
			l.complete(c)
		}
		return done || c.fd < 0
	}
	k, done, err := x.bodyBytes(bc.in[bc.r:bc.w])
	if err != nil {
		l.failed(c, errBadAnswer, lb.ServerError, false)
		return true
	}
	if done {
		l.settle(c)
	}
	l.writeClient(c, bc.in[bc.r:bc.r+k])
	bc.r += k
	if done {
		l.complete(c)
	}
	return done || c.fd < 0
}

// release ends the backend's count of this request, once. The request's
// start time stands in for its end: passive ejection cool-downs are
// seconds, requests milliseconds.
func (x *exchange) release(res lb.Result) {
	if x.acquired {
		x.acquired = false
		x.b.Release(x.start, res)
	}
}

// bodyBytes returns how many bytes of p belong to the answer's body and
// whether the body ends within them.
func (x *exchange) bodyBytes(p []byte) (int, bool, error) {
	switch x.framing {
	case frameNone:
		return 0, true, nil
	case frameLength:
		k := int64(len(p))
		if k >= x.remain {
			k = x.remain
		}
		x.remain -= k
		return int(k), x.remain == 0, nil
	case frameChunked:
		return x.chunk.feed(p)
	}
	return len(p), false, nil // frameClose: until the backend closes
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
			l.release(bc)
		}
	}
	l.finish(c)
}

// release puts an idle connection back, or gives it to a request waiting
// for one.
func (l *evloop) release(bc *bconn) {
	p := bc.pool
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

func (l *evloop) closeBackend(bc *bconn) {
	if bc.fd < 0 {
		return
	}
	syscall.Close(bc.fd)
	l.fds[bc.fd] = fdOwner{}
	bc.fd = -1
	p := bc.pool
	p.open.Add(-1)
	for i, ib := range p.idle {
		if ib == bc {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			break
		}
	}
	if c := bc.c; c != nil && c.x.bc == bc {
		c.x.bc = nil
	}
	bc.c = nil
	l.serveWaiters(p) // a connection slot is free: a waiting request may dial
}

// serveWaiters sends requests waiting for a connection to p while one is
// idle or may be dialled.
func (l *evloop) serveWaiters(p *bpool) {
	for len(p.waiters) > 0 && (len(p.idle) > 0 || p.open.Load() < int64(l.s.cfg.MaxConns)) {
		w := p.waiters[0]
		p.waiters = p.waiters[1:]
		if w.valid() {
			l.send(w.c)
		}
	}
}

// shedIdle asks the other loops to close one idle connection to addr, so
// that from, which has requests waiting for a connection and none idle,
// may dial one: -http-backend-max-conns counts the connections of all
// loops.
func (e *loopEngine) shedIdle(addr string, from *evloop) {
	for _, ol := range e.loops {
		if ol == from {
			continue
		}
		ol.post(func() {
			p := ol.pools[addr]
			if p == nil || len(p.idle) == 0 {
				return
			}
			ol.closeBackend(p.idle[0]) // the coldest
			from.post(func() {
				if p := from.pools[addr]; p != nil {
					from.serveWaiters(p)
				}
			})
		})
	}
}

// failed answers a failed exchange: once more on another backend when the
// request never reached the first one and may be sent twice, else 502,
// 503 or 504 by cause; if part of the answer was already relayed the
// client's connection is closed instead.
func (l *evloop) failed(c *cconn, err error, res lb.Result, notSent bool) {
	s := l.s
	x := &c.x
	if bc := x.bc; bc != nil {
		l.closeBackend(bc)
	}
	x.bc = nil
	x.waitUntil = 0
	x.release(res)
	if c.fd < 0 {
		return
	}
	if x.gotHead {
		s.stats.UpstreamError.Add(1)
		x.closeAfter = true
		l.finish(c)
		return
	}
	if notSent && x.attempt == 0 && x.idem {
		now := s.clock.Now()
		if x.class == admission.Affinity && !l.admitRepin(c, now) {
			return
		}
		nb, out, _ := x.rt.pool.Pick(now, x.key, x.b)
		if out == lb.Picked {
			s.stats.Retried.Add(1)
			x.attempt++
			x.b, x.renew, x.class = nb, s.sticky != nil, admission.NewWork
			l.send(c)
			return
		}
	}
	s.stats.UpstreamError.Add(1)
	s.writeUpstreamError(&l.local, err)
	l.answerLocal(c)
}

// admitRepin admits, as new work, an affinity request whose backend
// refused the connection; it answers the refusal itself and returns false
// when the request may not go on.
func (l *evloop) admitRepin(c *cconn, now int64) bool {
	l.reparse(c)
	h := &l.reqH
	r := admission.Request{Class: admission.NewWork, Proto: "http", Method: b2s(h.Method()), Host: b2s(h.Host()), Path: b2s(l.path(h))}
	c.x.key = l.s.key(h, c.ip, c.x.rt)
	d, ok := l.s.admitNow(&r, now)
	if !ok {
		l.s.refuseDecision(&l.local, d)
		l.answerLocal(c)
	}
	return ok
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
	x.release(lb.Abandoned)
	l.s.stats.Aborted.Add(1)
	if x.gotHead {
		l.closeClient(c)
		return
	}
	l.s.writeRefusal(&l.local, fasthttp.StatusServiceUnavailable, memoryRetry, psCritical, "memory state critical")
	l.answerLocal(c)
}

// abortNewWork runs on the loop when memory turned Critical.
func (l *evloop) abortNewWork() {
	if l.s.mem.State() != admission.Critical {
		return
	}
	for _, o := range l.fds {
		c := o.c
		if c == nil || !c.busy || c.x.class != admission.NewWork || c.x.b == nil {
			continue
		}
		if c.x.bc != nil || c.x.waitUntil != 0 {
			l.abort(c)
		}
	}
}

// expire enforces deadlines: idle and slow clients are closed, backend
// connects and answers that take too long fail, idle backend connections
// are closed, requests waiting for a connection get 503.
func (l *evloop) expire() {
	now := l.now
	for _, o := range l.fds {
		if c := o.c; c != nil && c.deadline != 0 && now > c.deadline {
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
				bc.pool.sa = nil
				l.failed(c, fasthttp.ErrDialTimeout, lb.Timeout, true)
			default:
				l.failed(c, fasthttp.ErrTimeout, lb.Timeout, false)
			}
		}
	}
	for _, p := range l.pools {
		for len(p.waiters) > 0 && now > p.waiters[0].c.x.waitUntil {
			w := p.waiters[0]
			p.waiters = p.waiters[1:]
			if w.valid() {
				w.c.x.waitUntil = 0
				l.failed(w.c, fasthttp.ErrNoFreeConns, lb.Abandoned, true)
			}
		}
	}
}

// --- helpers ---

func rawRead(fd int, p []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(r), e
}

func rawWrite(fd int, p []byte) (int, syscall.Errno) {
	r, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	return int(r), e
}

// handoffListener is the net.Listener the fasthttp server accepts handed
// over connections from.
type handoffListener struct {
	addr net.Addr
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, ch: make(chan net.Conn, 256), done: make(chan struct{})}
}

func (h *handoffListener) push(c net.Conn) {
	select {
	case h.ch <- c:
	case <-h.done:
		c.Close()
	}
}

func (h *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.ch:
		return c, nil
	case <-h.done:
		return nil, net.ErrClosed
	}
}

func (h *handoffListener) Close() error {
	h.once.Do(func() { close(h.done) })
	return nil
}

func (h *handoffListener) Addr() net.Addr { return h.addr }
