package sip

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/proxyproto"
)

// tcpConn is one TCP connection, accepted or dialled. One goroutine reads
// it. Writes never block the caller: a write is tried once without waiting
// (tryWrite) and what the socket did not take is queued for a flusher
// goroutine that exists only while the queue is not empty. A peer that stops
// reading therefore stalls nobody (the UDP reader relays to TCP clients too);
// when its queue passes maxWriteQueue bytes the connection is closed.
type tcpConn struct {
	c      *net.TCPConn
	remote netip.AddrPort
	srv    *Server
	fid    uint64 // id in the flow table (flows.go); 0: dialled, not a flow
	// proxyKey is set on a per-client connection to a PROXY-protocol
	// backend (proxyout.go): its backend and client.
	proxyKey proxyKey

	// kind is the protocol over the stream (TCP, TLS, WS, WSS) and sess
	// the TLS session over c for TLS and WSS (nil otherwise): its writes
	// go down to write through rawConn, so they never block either.
	kind  connKind
	sess  *tls.Conn
	hello *tlsHello // TLS: the ClientHello read before the handshake, until it ends (stream.go)
	one   [1]byte   // TLS: the first byte read between messages (readIdle)
	// waiting is where a TLS reader waiting between messages is: idleNot,
	// idleWait (nothing received) or idleBytes (part of a record came:
	// the message timeout runs).
	waiting atomic.Int32
	// ready: the TLS and WebSocket handshakes are done, SIP may be sent
	// (always for TCP, which does not look).
	ready atomic.Bool

	mu       sync.Mutex
	out      [][]byte // queued for the flusher, in order
	outBytes int
	flushing bool // a flusher goroutine owns the socket's write side
	dead     bool // closed for writing: every write fails at once
	closing  bool // the reader ended: the flusher closes once the queue is out

	// connection accounting (tcpguard.go)
	accepted bool         // accepted, not dialled: counted and evictable
	source   netip.Prefix // what the per-source cap counts by
	lru      lruLink      // place in the activity order; tcpTable.mu
	touched  atomic.Int64 // unix nanos of the last move to the back
	partial  atomic.Bool  // part of a message is buffered: not idle
	budgeted bool         // its partial messages count in the budget: all but backends

	// the partial-message reservation; partialBudget.mu
	held      int64
	heldSince time.Time
	shed      bool
}

// maxWriteQueue bounds the bytes queued for one connection whose peer does
// not read; past it the connection is closed (about 250 SIP messages).
const maxWriteQueue = 256 << 10

// tcpWriteTimeout is how long the flusher waits for a peer to take a queued
// message before the connection is given up.
const tcpWriteTimeout = 5 * time.Second

var errConnDead = errors.New("sip tcp connection closed")

func (c *tcpConn) write(p []byte) error {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return errConnDead
	}
	if !c.flushing {
		n, err := tryWrite(c.c, p)
		if err != nil {
			c.kill()
			c.mu.Unlock()
			return err
		}
		if n == len(p) {
			c.mu.Unlock()
			return nil
		}
		p = p[n:]
	}
	if queued := c.outBytes + len(p); queued > maxWriteQueue {
		c.kill()
		c.mu.Unlock()
		if c.srv != nil {
			c.srv.metrics.TCPStalled.Add(1)
			c.srv.log.Warn("sip tcp peer does not read: connection closed", "remote", c.remote.String(), "queued_bytes", queued)
		}
		return errConnDead
	}
	c.out = append(c.out, append([]byte(nil), p...))
	c.outBytes += len(p)
	start := !c.flushing
	c.flushing = true
	c.mu.Unlock()
	if start {
		c.startFlush()
	}
	return nil
}

// kill marks the connection dead and closes it, which also ends its reader.
// c.mu must be held.
func (c *tcpConn) kill() {
	c.dead = true
	c.out, c.outBytes = nil, 0
	c.c.Close()
}

func (c *tcpConn) startFlush() {
	if c.srv != nil {
		c.srv.wg.Add(1)
	}
	go c.flush()
}

// flush writes the queue in order, blocking up to tcpWriteTimeout per
// message, and exits when the queue is empty.
func (c *tcpConn) flush() {
	if c.srv != nil {
		defer c.srv.wg.Done()
	}
	for {
		c.mu.Lock()
		if c.dead || len(c.out) == 0 {
			if c.closing && !c.dead {
				c.kill()
			}
			c.flushing = false
			c.mu.Unlock()
			return
		}
		q := c.out
		c.out = nil
		c.mu.Unlock()
		for i, m := range q {
			_ = c.c.SetWriteDeadline(time.Now().Add(tcpWriteTimeout))
			_, err := c.c.Write(m)
			c.mu.Lock()
			c.outBytes -= len(m)
			if err != nil {
				if !c.dead && c.srv != nil {
					c.srv.metrics.SendErrors.Add(uint64(len(q) - i))
					if errors.Is(err, os.ErrDeadlineExceeded) {
						c.srv.metrics.TCPStalled.Add(1)
					}
				}
				c.kill()
				c.flushing = false
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
		}
	}
}

// tcpTable maps remote addresses to live connections.
type tcpTable struct {
	mu      sync.RWMutex
	conns   map[netip.AddrPort]*tcpConn
	peak    int                         // most entries conns held since it was made
	dialing map[netip.AddrPort][][]byte // messages waiting for the connection

	// Accepted connections (tcpguard.go): their count, their count per
	// source and their activity order, least recently active in front.
	accepted    int
	sources     map[netip.Prefix]int
	front, back *tcpConn
	touchEvery  time.Duration
	now         func() int64              // unix nanos, for touchEvery
	readBufs    atomic.Int64              // connections holding a read buffer
	linger      atomic.Int64              // idleLinger in ns; tests set 0 (every wait handed over)
	byKind      [kindWSS + 1]atomic.Int64 // connections in conns by protocol

	budget partialBudget // bytes of partial messages

	lastRefusedSource netip.Addr // the latest source refused over -sip-tcp-max-conns-per-source, for the log
}

// tcpRefusalsSeen is what the last summary of refused TCP connections
// counted (logTCPRefusals).
type tcpRefusalsSeen struct{ source, full, unknown uint64 }

// logTCPRefusals logs, when any were refused since the summary seen,
// the TCP connections closed at accept over -sip-tcp-max-conns-per-source
// (with the latest source) and over -sip-tcp-max-conns, and the requests
// of unknown dialogs refused over -sip-unknown-dialog-source-rate:
// otherwise clients behind one NAT or SBC past a cap see resets or 503s
// and the log says nothing. The tick calls it every 10 s.
func (s *Server) logTCPRefusals(seen *tcpRefusalsSeen) {
	if n := s.metrics.TCPRefusedSource.Load(); n != seen.source {
		s.tcp.mu.RLock()
		src := s.tcp.lastRefusedSource
		s.tcp.mu.RUnlock()
		s.log.Warn("sip tcp connections closed at accept: their source holds -sip-tcp-max-conns-per-source connections (clients behind one NAT or an SBC: raise it)",
			"closed", n-seen.source, "source", src.String(), "max_per_source", s.cfg.TCPMaxConnsPerSource, "tcp_refused_source_total", n)
		seen.source = n
	}
	if n := s.metrics.UnknownDialogSourceLimited.Load(); n != seen.unknown {
		// An SBC or a NAT is one source for all its calls: after a
		// restart (the dialog table is in memory) their token-less BYEs
		// and re-INVITEs are unknown dialogs and share its 20/s.
		s.log.Warn("sip requests of unknown dialogs refused 503: their source passed -sip-unknown-dialog-source-rate (one SBC or NAT is one source; after a restart every token-less in-dialog request is an unknown dialog)",
			"refused", n-seen.unknown, "per_source_rate", s.cfg.UnknownDialogSourceRate, "unknown_dialog_source_limited_total", n)
		seen.unknown = n
	}
	if n := s.metrics.TCPRefused.Load(); n != seen.full {
		s.log.Warn("sip tcp connections closed at accept: -sip-tcp-max-conns are open and none idle to close instead",
			"closed", n-seen.full, "max", s.cfg.TCPMaxConns, "tcp_refused_total", n)
		seen.full = n
	}
}

func (t *tcpTable) init() {
	t.conns = map[netip.AddrPort]*tcpConn{}
	t.dialing = map[netip.AddrPort][][]byte{}
	t.sources = map[netip.Prefix]int{}
	t.touchEvery = lruTouchEvery
	t.now = wallNanos
	t.linger.Store(int64(idleLinger))
}

// put registers c under its remote address, in place of any other
// there. t.mu held.
func (t *tcpTable) put(c *tcpConn) {
	if old := t.conns[c.remote]; old != nil {
		t.byKind[old.kind].Add(-1)
	}
	t.conns[c.remote] = c
	t.byKind[c.kind].Add(1)
}

func (t *tcpTable) get(a netip.AddrPort) *tcpConn {
	t.mu.RLock()
	c := t.conns[a]
	t.mu.RUnlock()
	return c
}

func (t *tcpTable) remove(c *tcpConn) {
	t.mu.Lock()
	if t.conns[c.remote] == c {
		delete(t.conns, c.remote)
		t.byKind[c.kind].Add(-1)
	}
	t.uncount(c)
	// A Go map never gives back its buckets: after a wave of thousands of
	// connections, copy the survivors into a map of their own size.
	if t.peak >= 1024 && len(t.conns) < t.peak/8 {
		m := make(map[netip.AddrPort]*tcpConn, len(t.conns))
		for k, v := range t.conns {
			m[k] = v
		}
		t.conns, t.peak = m, len(m)
	}
	t.mu.Unlock()
}

func (t *tcpTable) len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.conns)
}

func (t *tcpTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, c := range t.conns {
		c.c.Close()
	}
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcpLn.AcceptTCP()
		if err != nil {
			if s.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("sip tcp accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.acceptConn(c, kindTCP)
	}
}

// acceptConn registers an accepted connection and starts its reader, or
// closes it: over its source's cap (-sip-tcp-max-conns-per-source), or with
// the table full and no idle connection to close in its place.
func (s *Server) acceptConn(c *net.TCPConn, kind connKind) {
	ra := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	ra = netip.AddrPortFrom(ra.Addr().Unmap(), ra.Port())
	if s.proxyFrom(ra.Addr()) && !kind.ws() {
		s.acceptProxied(c, kind, ra) // its header first, on a goroutine of its own
		return
	}
	s.admitConn(c, kind, ra)
}

// admitConn is acceptConn for a connection whose source (remote) is
// known: the socket's peer, or the client a PROXY header named.
func (s *Server) admitConn(c *net.TCPConn, kind connKind, remote netip.AddrPort) {
	tc := &tcpConn{c: c, remote: remote, srv: s, source: sourceKey(remote.Addr()), budgeted: true, kind: kind, fid: s.flows.newID()}
	if kind.secure() {
		tc.sess = tls.Server(rawConn{TCPConn: c, tc: tc}, s.cfg.TLSConfig)
	}
	s.tcp.mu.Lock()
	verdict, victim := s.tcp.admit(tc, s.cfg.TCPMaxConns, s.cfg.TCPMaxConnsPerSource)
	if verdict == admitted {
		s.tcp.put(tc)
		s.tcp.peak = max(s.tcp.peak, len(s.tcp.conns))
	} else if verdict == refusedSource {
		s.tcp.lastRefusedSource = tc.remote.Addr()
	}
	s.tcp.mu.Unlock()
	switch verdict {
	case refusedSource:
		s.metrics.TCPRefusedSource.Add(1)
		s.log.Debug("sip tcp connection refused: its source has -sip-tcp-max-conns-per-source connections", "remote", tc.remote.String(), "max", s.cfg.TCPMaxConnsPerSource)
		c.Close()
		return
	case refusedFull:
		s.metrics.TCPRefused.Add(1)
		c.Close()
		return
	}
	if victim != nil {
		s.metrics.TCPEvicted.Add(1)
		s.log.Debug("sip tcp table full: the least recently active idle connection closed for a new one", "closed", victim.remote.String(), "new", tc.remote.String())
		victim.mu.Lock()
		if !victim.dead {
			victim.kill()
		}
		victim.mu.Unlock()
	}
	if s.closed.Load() {
		c.Close()
	}
	s.flows.add(tc) // a flow requests from backends can come back over; readConn removes it
	s.wg.Add(1)
	if kind.ws() {
		go s.readWS(tc)
	} else {
		go s.readConn(tc)
	}
}

// startConnQueued registers c and starts its reader. When dialled is
// valid, the messages queued for it by dialAsync are written first, before
// any other writer can reach the connection, so they keep their order.
func (s *Server) startConnQueued(c *net.TCPConn, dialled netip.AddrPort) *tcpConn {
	return s.startDialled(s.newDialled(c), dialled)
}

// newDialled is the tcpConn of a connection sluice dialled, not yet
// registered.
func (s *Server) newDialled(c *net.TCPConn) *tcpConn {
	ra := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	tc := &tcpConn{c: c, remote: netip.AddrPortFrom(ra.Addr().Unmap(), ra.Port()), srv: s}
	// A connection dialled to a client (a request from a backend going
	// downstream) shares the partial-message budget; one to a backend not.
	tc.budgeted = s.pool.Load().backendAt(tc.remote) == nil
	return tc
}

// startDialled registers tc (startConnQueued); a TLS connection, its
// handshake done, gets the queued messages through its session, still
// unseen by any other writer.
func (s *Server) startDialled(tc *tcpConn, dialled netip.AddrPort) *tcpConn {
	if tc.sess != nil {
		s.tcp.mu.Lock()
		s.tcp.put(tc)
		s.tcp.peak = max(s.tcp.peak, len(s.tcp.conns))
		if dialled.IsValid() {
			for _, m := range s.tcp.dialing[dialled] {
				_ = tc.send(m)
			}
			delete(s.tcp.dialing, dialled)
		}
		s.tcp.mu.Unlock()
		if s.closed.Load() {
			tc.c.Close()
		}
		s.wg.Add(1)
		go s.readConn(tc)
		return tc
	}
	c := tc.c
	tc.mu.Lock()
	s.tcp.mu.Lock()
	s.tcp.put(tc)
	s.tcp.peak = max(s.tcp.peak, len(s.tcp.conns))
	var q [][]byte
	if dialled.IsValid() {
		q = s.tcp.dialing[dialled]
		delete(s.tcp.dialing, dialled)
	}
	s.tcp.mu.Unlock()
	if s.closed.Load() {
		c.Close()
	}
	s.wg.Add(1)
	go s.readConn(tc)
	// The queued messages go first, through the flusher, so that no caller
	// waits for a slow peer here either.
	for _, m := range q {
		tc.out = append(tc.out, m)
		tc.outBytes += len(m)
	}
	if len(tc.out) > 0 {
		tc.flushing = true
		tc.mu.Unlock()
		tc.startFlush()
		return tc
	}
	tc.mu.Unlock()
	return tc
}

// maxPending bounds the messages queued for a connection being dialled.
const maxPending = 64

// dialAsync opens a connection to a without blocking the caller. p, if not
// nil, is sent once the connection is up (with anything else queued for a
// meanwhile); nil only opens it. It reports whether p was queued.
func (s *Server) dialAsync(a netip.AddrPort, p []byte) bool {
	s.tcp.mu.Lock()
	if s.tcp.conns[a] != nil || s.closed.Load() {
		s.tcp.mu.Unlock()
		return false
	}
	q, dialing := s.tcp.dialing[a]
	if p != nil && len(q) < maxPending {
		q = append(q, append([]byte(nil), p...))
	}
	s.tcp.dialing[a] = q
	queued := p != nil && len(q) > 0 && len(q) <= maxPending
	s.tcp.mu.Unlock()
	if dialing {
		return queued
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err := d.DialContext(s.ctx, "tcp", a.String())
		if err != nil {
			s.tcp.mu.Lock()
			q := s.tcp.dialing[a]
			delete(s.tcp.dialing, a)
			s.tcp.mu.Unlock()
			s.log.Debug("sip tcp dial", "addr", a.String(), "err", err)
			s.metrics.SendErrors.Add(uint64(len(q)))
			s.dialRefused(a, err)
			return
		}
		tc := s.newDialled(c.(*net.TCPConn))
		if b := s.pool.Load().backendAt(a); b != nil && b.spec.Proxy != 0 {
			// The backend reads a PROXY header on every connection: this
			// one, shared by what no client sent, names none.
			_ = c.SetWriteDeadline(time.Now().Add(tcpWriteTimeout))
			_, err := c.Write(proxyLocalHeader(b.spec.Proxy))
			_ = c.SetWriteDeadline(time.Time{})
			if err != nil {
				c.Close()
				s.tcp.mu.Lock()
				q := s.tcp.dialing[a]
				delete(s.tcp.dialing, a)
				s.tcp.mu.Unlock()
				s.metrics.SendErrors.Add(uint64(len(q)))
				return
			}
		}
		if b := s.pool.Load().backendAt(a); b != nil && b.tls != nil {
			if err := s.clientHandshake(tc, b.tls); err != nil {
				s.tcp.mu.Lock()
				q := s.tcp.dialing[a]
				delete(s.tcp.dialing, a)
				s.tcp.mu.Unlock()
				s.metrics.SendErrors.Add(uint64(len(q)))
				s.metrics.BackendTLSFailures.Add(1)
				s.log.Warn("sip tls backend: handshake failed", "backend", b.id, "addr", a.String(), "err", err)
				return
			}
		}
		s.startDialled(tc, a)
	}()
	return queued
}

// tcpReadSize is the read buffer a connection gets from a pool when bytes
// arrive between messages. A message that does not fit gets a buffer of
// exactly its size once its head is in (Content-Length tells); while a head
// is still coming the buffer doubles, never past -sip-max-message + 1
// bytes. Once the messages read are handled the buffer goes back to the
// pool (a larger one to the collector), so a connection waiting between
// messages holds no buffer, only its reader goroutine's stack.
const tcpReadSize = 2048

// readBufPool holds the tcpReadSize buffers of connections between
// messages.
var readBufPool = sync.Pool{New: func() any { return new([tcpReadSize]byte) }}

// getReadBuf returns an empty buffer of capacity tcpReadSize.
func getReadBuf() []byte { return readBufPool.Get().(*[tcpReadSize]byte)[:0] }

// releaseReadBuf gives b back to the pool when it is one of its size;
// larger buffers are left to the collector. Nothing may use b after.
func releaseReadBuf(b []byte) {
	if cap(b) == tcpReadSize {
		readBufPool.Put((*[tcpReadSize]byte)(b[:tcpReadSize]))
	}
}

// tcpMinRead is the least room a read gets before the buffer grows.
const tcpMinRead = 512

// readCap is the capacity buf needs before the next read: the message's
// size once its head is in (size > 0), else room for tcpMinRead more
// bytes, doubling, never past limit+1 (a longer head is a framing error).
func readCap(buf []byte, size, limit int) int {
	c := cap(buf)
	if size > 0 {
		return max(c, size)
	}
	if c-len(buf) >= tcpMinRead {
		return c
	}
	return max(c, min(2*c, limit+1))
}

// readConn frames messages by Content-Length (RFC 3261 §18.3) across
// partial reads and hands each to handleDatagram. A framing error is
// answered with 400 when possible and closes the connection; so does
// silence longer than TCPIdleTimeout between messages, and a message not
// complete TCPMessageTimeout after its first byte: the head deadline is set
// once per message, so a peer that trickles a byte at a time cannot hold the
// connection by extending it. An accepted connection must complete its
// first message within TCPFirstMessageTimeout of being accepted, keep-alives
// or not; the bytes it holds for a message not yet complete are reserved in
// the partial-message budget (tcpguard.go).
//
// A connection silent between messages longer than idleLinger is waited
// on by a goroutine of its own (streamWait), as a WebSocket one is
// (readWS): the reader's stack, grown by the messages (and a TLS
// handshake), ends with the goroutine.
func (s *Server) readConn(tc *tcpConn) {
	if tc.sess != nil && !tc.ready.Load() && !s.handshakeTLS(tc) {
		s.endIdle(tc)
		return
	}
	// A dialled connection has no first-message deadline.
	s.connFrames(tc, streamIdle{greeted: !tc.accepted, firstDeadline: time.Now().Add(s.cfg.TCPFirstMessageTimeout)}, nil)
}

// connFrames is readConn from the handshake or a wait on: buf holds the
// bytes a wait read (nil when none). It returns when the connection
// ends, or with a streamWait started when it waits for its next message.
func (s *Server) connFrames(tc *tcpConn, st streamIdle, buf []byte) {
	var reserved int64 // this connection's reservation in the partial budget
	waits := false     // a streamWait carries on: this goroutine ends holding nothing
	defer func() {
		if !waits {
			s.endConn(tc, &reserved, buf)
			s.wg.Done()
		}
	}()
	src := source{addr: tc.remote, conn: tc}
	var fr framer
	var msgDeadline time.Time // zero between messages
	greeted, firstDeadline := st.greeted, st.firstDeadline
	read := buf != nil // bytes a wait read are handled first
	for {
		var n int
		var err error
		first := false // the read's deadline is the first-message deadline
		if read {
			read, n = false, len(buf)
		} else {
			now := time.Now()
			dl := now.Add(s.cfg.TCPIdleTimeout)
			if len(buf) > 0 {
				if msgDeadline.IsZero() {
					msgDeadline = now.Add(s.cfg.TCPMessageTimeout)
				}
				dl = msgDeadline
			}
			first = !greeted && firstDeadline.Before(dl)
			if first {
				dl = firstDeadline
			}
			_ = tc.c.SetReadDeadline(dl)
			if len(buf) == 0 {
				// Between messages: what a TLS session holds comes first;
				// then this goroutine waits idleLinger for bytes, and after
				// it one of its own, without a buffer; either reads into
				// one from the pool.
				if tc.sess != nil {
					if buf, err = tc.probeIdle(); buf == nil && err == nil {
						dl = tc.idleDeadline(dl)
					}
				}
				if buf == nil && err == nil {
					if !tc.linger(time.Duration(s.tcp.linger.Load()), dl) {
						s.handOver(tc, streamIdle{greeted: greeted, firstDeadline: firstDeadline, first: first}, (*Server).connFrames)
						waits = true
						return
					}
					buf, err = tc.readWoken()
				}
				n = len(buf)
				if buf != nil {
					s.tcp.readBufs.Add(1)
				}
			} else {
				if want := readCap(buf, fr.size, s.cfg.MaxMessage); want > cap(buf) {
					if !s.reservePartial(tc, int64(want), &reserved) {
						return
					}
					nb := append(make([]byte, 0, want), buf...)
					releaseReadBuf(buf)
					buf = nb
				}
				n, err = tc.readMore(buf[len(buf):cap(buf)])
				buf = buf[:len(buf)+max(n, 0)]
			}
		}
		if n > 0 && !greeted && tc.accepted && tc.sess == nil && len(s.cfg.ProxyFrom) > 0 && proxyproto.Sniff(buf) {
			// A PROXY header from a source not allowed to send one: a
			// client forging its address (proxyin.go).
			s.proxyRejected(proxyproto.ReasonUntrusted, tc.remote, nil)
			return
		}
		if n > 0 {
			done, touched := false, false // touched: a message moved tc in the activity order
			pongs := 0                    // keep-alives to answer
			for {
				// RFC 5626 §3.5.1 keep-alive: each CRLFCRLF is answered with
				// CRLF, the answers of one read in one write (a write per
				// 4-byte ping let a flood of them take a core); stray CRLFs
				// between messages are skipped. Neither counts as a message.
				off := 0
				for len(buf)-off >= 4 && string(buf[off:off+4]) == "\r\n\r\n" {
					off += 4
				}
				if off > 0 {
					pongs += off / 4
					buf = buf[:copy(buf, buf[off:])]
					fr = framer{}
					done = true
					continue
				}
				skip := 0
				for skip+1 < len(buf) && buf[skip] == '\r' && buf[skip+1] == '\n' {
					skip += 2
				}
				if skip > 0 && skip+2 <= len(buf) {
					buf = buf[:copy(buf, buf[skip:])]
					fr = framer{}
				}
				size, ok, ferr := fr.next(buf, s.cfg.MaxMessage)
				if ferr != nil {
					s.malformed(buf, src, "framing")
					return
				}
				if !ok {
					break
				}
				if pongs > 0 { // in order, before the message's answers
					s.pong(tc, pongs)
					pongs = 0
				}
				if !touched { // before its answer can go out
					s.tcp.touch(tc)
					touched = true
				}
				s.handleDatagram(buf[:size], src)
				greeted = true
				buf = buf[:copy(buf, buf[size:])]
				done = true
			}
			if pongs > 0 {
				s.pong(tc, pongs)
			}
			if done || len(buf) == 0 {
				msgDeadline = time.Time{} // the next message starts its own clock
			}
			switch {
			case len(buf) == 0:
				releaseReadBuf(buf)
				buf = nil
				s.tcp.readBufs.Add(-1)
			case len(buf) <= tcpReadSize/2 && cap(buf) > tcpReadSize:
				buf = append(getReadBuf(), buf...)
			}
			// What is left is part of a message: its buffer stays reserved.
			tc.partial.Store(len(buf) > 0)
			want := int64(0)
			if len(buf) > 0 {
				want = int64(cap(buf))
			}
			if want != reserved && !s.reservePartial(tc, want, &reserved) {
				return
			}
		}
		if err != nil {
			var ne net.Error
			switch {
			case !errors.As(err, &ne) || !ne.Timeout():
			case first:
				s.metrics.TCPFirstMessage.Add(1)
				s.log.Debug("sip tcp connection sent no complete message in time: closed", "remote", tc.remote.String(), "bytes", len(buf), "timeout", s.cfg.TCPFirstMessageTimeout)
			case len(buf) > 0 || tc.waiting.Load() == idleBytes:
				s.metrics.TCPSlow.Add(1)
				s.log.Debug("sip tcp message not complete in time: connection closed", "remote", tc.remote.String(), "bytes", len(buf), "timeout", s.cfg.TCPMessageTimeout)
			}
			return
		}
	}
}

// crlfs are the answers to keep-alives, a CRLF each; never written to.
var crlfs = bytes.Repeat([]byte("\r\n"), 1024)

// pong answers k keep-alives on tc, up to 1,024 per write.
func (s *Server) pong(tc *tcpConn, k int) {
	s.metrics.TCPKeepAlives.Add(uint64(k))
	for k > 0 {
		m := min(k, len(crlfs)/2)
		s.metrics.TCPKeepAliveWrites.Add(1)
		if tc.send(crlfs[:2*m]) != nil {
			return
		}
		k -= m
	}
}

var errFrame = errors.New("bad framing")

// frame returns the size of the first complete message in b: headers up to
// the blank line plus Content-Length bytes of body. ok is false while more
// bytes are needed. A missing or malformed Content-Length, or a message
// over max, is an error: a stream has no other boundary to resync on.
func frame(b []byte, max int) (size int, ok bool, err error) {
	var f framer
	return f.next(b, max)
}

var crlfcrlf = []byte("\r\n\r\n")

// framer frames one connection's messages across reads without searching
// the same bytes twice for the end of a head: a head trickled in small
// pieces costs its length, not its length squared.
type framer struct {
	scanned int // leading bytes searched for the blank line, without a match
	size    int // the message's full size once its head is in; 0 before
}

// next returns the size of the first complete message of b, the buffer
// the framer saw last grown by what arrived since; see frame. The framer
// starts over after a complete message.
func (f *framer) next(b []byte, limit int) (size int, ok bool, err error) {
	if f.size == 0 {
		from := max(0, f.scanned-3)
		i := bytes.Index(b[from:], crlfcrlf)
		if i < 0 {
			if len(b) > limit {
				return 0, false, errFrame
			}
			f.scanned = len(b)
			return 0, false, nil
		}
		n, err := headSize(b[:from+i+4], limit)
		if err != nil {
			return 0, false, err
		}
		f.size = n
	}
	if len(b) < f.size {
		return 0, false, nil
	}
	size = f.size
	*f = framer{}
	return size, true, nil
}

// headSize returns the size of the message whose head (ending with the
// blank line) is head: the head plus its Content-Length.
func headSize(head []byte, limit int) (int, error) {
	hdr := head[:len(head)-2]
	cl := -1
	for len(hdr) > 0 {
		i := bytes.Index(hdr, []byte("\r\n"))
		line := hdr[:i]
		hdr = hdr[i+2:]
		name, val, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		name = bytes.TrimSpace(name)
		if bytes.EqualFold(name, []byte("content-length")) || bytes.EqualFold(name, []byte("l")) {
			n, ok := parseDigits(bytes.TrimSpace(val), limit)
			if !ok {
				return 0, errFrame
			}
			cl = n
		}
	}
	if cl < 0 {
		return 0, errFrame
	}
	size := len(head) + cl
	if size > limit {
		return 0, errFrame
	}
	return size, nil
}

// parseDigits parses a decimal number of at most limit.
func parseDigits(b []byte, limit int) (int, bool) {
	if len(b) == 0 || len(b) > 9 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n <= limit
}
