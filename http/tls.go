package http

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/proxyproto"
	"github.com/sluicelb/sluice/tlsedge"
)

// HTTPS: a second listener beside the plain one, served by the same engine
// and pipeline. Both engines take TLS connections the same way: one
// goroutine accepts and applies the client limits; each connection then
// has a goroutine of its own, under Config.HandshakeTimeout from accept,
// that reads its ClientHello, asks the handshake gate (Config.Handshakes)
// once the hello is whole (tlshello.go), and runs the handshake with
// crypto/tls over the socket (Go's poller: a stalled handshake parks a
// goroutine, never a thread).
// An established connection then goes to the engine: the loop engine
// drives its record layer on a loop through a recordConn (tls_adapter.go,
// tls_loop.go); the fasthttp engine serves it with a goroutine, as a
// plain one. A connection that negotiated h2 goes to the HTTP/2 handler
// (Server.serveH2), or is closed when there is none.

// HandshakeGate bounds TLS handshakes (tlsedge.HandshakeLimiter implements
// it): how many are in flight and how fast new ones start.
type HandshakeGate interface {
	// Acquire reports whether one more TLS/WebSocket handshake may start at now (monotonic ns);
	// false: close the connection without a handshake (counted by the caller).
	Acquire(now int64) bool
	// Release ends a handshake that Acquire let start (done or failed).
	Release()
}

// sourceGate is a HandshakeGate that also holds each source to a share
// of the handshakes in flight (tlsedge.HandshakeLimiter): without one, a
// single address's silent connections could hold every place.
type sourceGate interface {
	AcquireFrom(src netip.Addr, now int64) bool
	ReleaseFrom(src netip.Addr)
}

// handshakeSource is the source a handshake from ip counts under: ip,
// or none for a trusted proxy's address (-http-trusted-proxy), which is
// not counted per source.
func (s *Server) handshakeSource(ip netip.Addr) netip.Addr {
	if !ip.IsValid() || !s.conns.perIP(ip) {
		return netip.Addr{}
	}
	return ip
}

// reasonGate is a sourceGate that says why it refused
// (tlsedge.HandshakeLimiter), for the log.
type reasonGate interface {
	TryFrom(src netip.Addr, now int64) tlsedge.Refusal
}

// acquireHandshake asks Config.Handshakes for a handshake from ip (its
// source's share too when the gate keeps shares): NotRefused, or why not
// (RefusedInFlight for a gate that does not say); NotRefused when there is
// no gate.
func (s *Server) acquireHandshake(ip netip.Addr) tlsedge.Refusal {
	ok := true
	switch g := s.cfg.Handshakes; g := g.(type) {
	case nil:
	case reasonGate:
		return g.TryFrom(s.handshakeSource(ip), s.clock.Now())
	case sourceGate:
		ok = g.AcquireFrom(s.handshakeSource(ip), s.clock.Now())
	default:
		ok = g.Acquire(s.clock.Now())
	}
	if !ok {
		return tlsedge.RefusedInFlight
	}
	return tlsedge.NotRefused
}

// releaseHandshake ends a handshake acquireHandshake(ip) let start.
func (s *Server) releaseHandshake(ip netip.Addr) {
	switch g := s.cfg.Handshakes; g := g.(type) {
	case nil:
	case sourceGate:
		g.ReleaseFrom(s.handshakeSource(ip))
	default:
		g.Release()
	}
}

// tlsFront is the HTTPS listener while it is served.
type tlsFront struct {
	ln  net.Listener
	cfg *tls.Config
	// ctx ends the handshakes under way at Shutdown.
	ctx    context.Context
	cancel context.CancelFunc
	// pending counts connections from accept until an engine took them
	// (or they were closed): the loops do not end while one may still
	// come to them.
	pending   atomic.Int64
	closeOnce sync.Once
	// refusals gathers the handshakes the gate refused, for the log.
	refusals tlsedge.RefusalLog
}

// close stops accepting and ends the handshakes under way.
func (t *tlsFront) close() {
	t.closeOnce.Do(func() {
		t.cancel()
		t.ln.Close()
	})
}

// tlsPending reports whether an HTTPS connection is on its way to an
// engine (accepted, in its handshake, or posted to a loop).
func (s *Server) tlsPending() bool {
	t := s.tls.Load()
	return t != nil && t.pending.Load() > 0
}

// deliverFunc takes an established TLS connection to an engine: tc over
// rc (in blocking mode over raw, the accepted socket), from ip, counted
// under the client limits and in tlsFront.pending. It owns all of that:
// it must end the pending count once the engine has the connection (or it
// was closed), and release ip's count when the connection closes.
type deliverFunc func(t *tlsFront, tc *tls.Conn, rc *recordConn, raw net.Conn, ip netip.Addr)

// ServeTLS serves HTTPS on ln (with Config.TLSConfig) until Shutdown, and
// no plain HTTP. See ServeListeners.
func (s *Server) ServeTLS(ln net.Listener) error { return s.ServeListeners(nil, ln) }

// ServeListeners serves plain HTTP on plain and HTTPS on secure (with
// Config.TLSConfig), either of them nil but not both, with one engine and
// pipeline, until Shutdown. It returns once both are closed.
func (s *Server) ServeListeners(plain, secure net.Listener) error {
	if plain == nil && secure == nil {
		return errors.New("http front end: no listener to serve")
	}
	if secure == nil {
		return s.Serve(plain)
	}
	if s.cfg.TLSConfig == nil {
		return fieldError("TLSListen", "HTTPS listener %s needs certificates (-tls-cert)", secure.Addr())
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &tlsFront{ln: secure, cfg: s.cfg.TLSConfig, ctx: ctx, cancel: cancel}
	if !s.tls.CompareAndSwap(nil, t) {
		cancel()
		return errors.New("http front end: already serving HTTPS")
	}
	if _, port, err := net.SplitHostPort(secure.Addr().String()); err == nil {
		s.httpsPort.Store(&port)
	}
	if s.shut.Load() {
		t.close()
	}
	if s.cfg.Engine == EngineLoop {
		return s.serveLoops(plain, t)
	}
	return s.serveFastTLS(plain, t)
}

// serveFastTLS serves both listeners with the fasthttp engine: the plain
// one as Serve does, the HTTPS one through a listener that yields
// connections after their handshake.
func (s *Server) serveFastTLS(plain net.Listener, t *tlsFront) error {
	hl := newHandoffListener(t.ln.Addr())
	s.logger.Info("https front end serving", "addr", t.ln.Addr().String(), "engine", EngineFastHTTP)
	errc := make(chan error, 2)
	n := 1
	go func() {
		err := s.srv.Serve(hl)
		t.close()
		errc <- err
	}()
	go s.acceptTLS(t, func(t *tlsFront, tc *tls.Conn, rc *recordConn, raw net.Conn, ip netip.Addr) {
		g := s.gate(tc, nil)
		g.release = func() { s.conns.release(ip) }
		hl.push(g) // closed when the listener is
		t.pending.Add(-1)
	}, func() { hl.Close() })
	if plain != nil {
		n++
		go func() { errc <- s.Serve(plain) }()
	}
	var err error
	for range n {
		if e := <-errc; err == nil && e != nil && !errors.Is(e, net.ErrClosed) {
			err = e
		}
	}
	return err
}

// closeTLS stops the HTTPS listener (Shutdown).
func (s *Server) closeTLS() {
	if t := s.tls.Load(); t != nil {
		t.close()
	}
}

// acceptTLS accepts on t.ln until it is closed, then calls done. Each
// connection within the client limits gets a goroutine of its own for its
// hello and handshake (helloHandshake), then goes to deliver.
func (s *Server) acceptTLS(t *tlsFront, deliver deliverFunc, done func()) {
	defer done()
	defer t.close()
	var backoff time.Duration
	for {
		c, err := t.ln.Accept()
		if err != nil {
			if !resourceErr(err) {
				if !errors.Is(err, net.ErrClosed) && !s.shut.Load() {
					s.logger.Error("https accept failed; the HTTPS listener stops", "err", err)
				}
				return
			}
			backoff = nextBackoff(backoff)
			s.acceptLog.failed(s.logger, err, backoff)
			select {
			case <-time.After(backoff):
			case <-t.ctx.Done():
				return
			}
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
			// The header first, on the connection's goroutine: the
			// handshake limits count the client it names.
			t.pending.Add(1)
			go s.proxiedHandshake(t, c, ip, deliver)
			continue
		}
		t.pending.Add(1)
		if s.shut.Load() { // after the count: a loop that saw none pending has seen shut too
			s.endAccepted(t, c, ip)
			continue
		}
		go s.helloHandshake(t, c, ip, nil, deliver)
	}
}

// proxiedHandshake reads the PROXY header of a connection from a
// balancer (peer) and goes on with the client it names as the
// connection's: its count under the client and handshake limits, its
// address for the requests. t.pending counts it already.
func (s *Server) proxiedHandshake(t *tlsFront, c net.Conn, peer netip.Addr, deliver deliverFunc) {
	var port uint16
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		port = ta.AddrPort().Port()
	}
	cl, err := s.readProxy(c, netip.AddrPortFrom(peer, port), time.Time{})
	ip := peer
	var remote net.Addr
	if err == nil && cl.Addr() != peer {
		if hit := s.conns.rekey(peer, cl.Addr()); hit != notLimited {
			s.connLimited(hit, cl.Addr())
			err = errSourceLimited
		} else {
			ip, remote = cl.Addr(), net.TCPAddrFromAddrPort(cl)
		}
	}
	if err != nil {
		c.Close()
		s.conns.release(peer)
		t.pending.Add(-1)
		return
	}
	s.helloHandshake(t, c, ip, remote, deliver)
}

// endAccepted closes a connection that will not have its handshake, holding
// no place of the handshake gate: its count under the client limits and
// in t.pending end.
func (s *Server) endAccepted(t *tlsFront, c net.Conn, ip netip.Addr) {
	c.Close()
	s.conns.release(ip)
	t.pending.Add(-1)
}

// handshake runs the TLS handshake of c within the socket's deadline
// (helloHandshake set it; cleared after) and hands the connection on: to
// deliver for HTTP/1.1, to the HTTP/2 handler when the client chose h2.
// remote, when set, is the client a PROXY header named: the address the
// TLS connection reports. hello is what was read of c before (crypto/tls
// reads it first); held says whether the handshake holds a place of the
// gate (acquireHandshake), to be given back when it ends. A handshake that
// holds none was given bytes that are not a ClientHello: crypto/tls sees
// them and no more of the socket, and fails on them.
func (s *Server) handshake(t *tlsFront, c net.Conn, ip netip.Addr, remote net.Addr, deliver deliverFunc, hello []byte, held bool) {
	rc := newRecordConn(c)
	if remote != nil {
		rc.remote = remote
	}
	if !held {
		rc.conn = noMoreReads{c}
	}
	rc.feed(hello)
	tc := tls.Server(rc, t.cfg)
	err := tc.HandshakeContext(t.ctx)
	if held {
		s.releaseHandshake(ip)
	}
	if err == nil {
		err = c.SetDeadline(time.Time{})
	}
	if err == nil && s.shut.Load() {
		err = net.ErrClosed
	}
	if err != nil && len(s.cfg.ProxyFrom) > 0 && forgedBeforeTLS(err) {
		s.proxyRejected(proxyproto.ReasonUntrusted, ip, err)
	} else if err != nil {
		s.stats.HandshakeFailed.Add(1)
		s.logger.Debug("https handshake failed", "client", ip.String(), "err", err)
		if plainHTTPOnTLS(err) {
			// A client speaking plain HTTP to the HTTPS port gets a
			// 400 that says so, as nginx and Go's net/http answer,
			// rather than a connection closed without a word.
			c.SetWriteDeadline(time.Now().Add(time.Second))
			io.WriteString(c, plainHTTPAnswer)
			if !held {
				drainRequest(c)
			}
		}
	}
	if err != nil {
		c.Close()
		s.conns.release(ip)
		t.pending.Add(-1)
		return
	}
	if proto := tc.ConnectionState().NegotiatedProtocol; proto == "h2" {
		t.pending.Add(-1)
		s.serveH2(tc) // h2.go; closes tc when the connection ends
		tc.Close()
		s.conns.release(ip)
		return
	}
	deliver(t, tc, rc, c, ip)
}

// plainHTTPAnswer is the answer to plain HTTP sent to an HTTPS listener.
const plainHTTPAnswer = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n" +
	"Content-Length: 49\r\nConnection: close\r\n\r\nThis port speaks HTTPS: use https:// to reach it\n"

// plainHTTPOnTLS reports whether a failed handshake met plain HTTP: crypto/tls
// found no TLS record (it sets Conn then) and the bytes start as an HTTP
// method does, with an upper-case letter.
func plainHTTPOnTLS(err error) bool {
	var rh tls.RecordHeaderError
	return errors.As(err, &rh) && rh.Conn != nil && rh.RecordHeader[0] >= 'A' && rh.RecordHeader[0] <= 'Z'
}

// connSecure reports whether c, a connection the fasthttp engine serves,
// is a TLS connection.
func connSecure(c net.Conn) bool {
	if g, ok := c.(*gateConn); ok {
		c = g.Conn
	}
	_, ok := c.(*tls.Conn)
	return ok
}

// tlsListenPort returns the port of a listen address, "" when it has none.
func tlsListenPort(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return port
}

// ListenAndServe listens on Config.Listen, and on Config.TLSListen when
// set, and serves both.
func (s *Server) ListenAndServe() error {
	var plain, secure net.Listener
	var err error
	if s.cfg.Listen != ListenOff {
		if plain, err = net.Listen("tcp", s.cfg.Listen); err != nil {
			return fmt.Errorf("listen -http-listen %s: %w", s.cfg.Listen, err)
		}
	}
	if s.cfg.TLSListen != "" {
		if secure, err = net.Listen("tcp", s.cfg.TLSListen); err != nil {
			if plain != nil {
				plain.Close()
			}
			return fmt.Errorf("listen -https-listen %s: %w", s.cfg.TLSListen, err)
		}
	}
	return s.ServeListeners(plain, secure)
}
