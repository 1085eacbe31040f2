package sip

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluicelb/sluice/internal/opfile"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/proxyproto"
	"github.com/sluicelb/sluice/tlsedge"
)

// A stream listener (TCP, TLS, WS, WSS) accepts connections into the one
// TCP table: the same per-source cap, connection cap, idle eviction,
// partial-message budget and first-message deadline, one reader goroutine
// per connection and no read buffer between messages. Replies go back on
// the connection a request came on, found by its remote address, whatever
// its Via names (RFC 3261 §18.2.2; RFC 7118 §5.2 for the .invalid Via host
// of WebSocket clients).

// connKind is the protocol spoken over a stream connection.
type connKind uint8

const (
	kindTCP connKind = iota
	kindTLS
	kindWS
	kindWSS
)

// String is the transport as a Via names it.
func (k connKind) String() string {
	switch k {
	case kindTLS:
		return "TLS"
	case kindWS:
		return "WS"
	case kindWSS:
		return "WSS"
	}
	return "TCP"
}

// secure reports whether the connection carries a TLS session.
func (k connKind) secure() bool { return k == kindTLS || k == kindWSS }

// ws reports whether the connection carries WebSocket frames.
func (k connKind) ws() bool { return k == kindWS || k == kindWSS }

// HandshakeGate bounds the TLS and WebSocket handshakes in progress, so a
// flood of them cannot take the CPU and the goroutines that established
// connections need. tlsedge.HandshakeLimiter implements it.
type HandshakeGate interface {
	// Acquire reports whether one more TLS/WebSocket handshake may start at now (monotonic ns);
	// false: close the connection without a handshake (counted by the caller).
	Acquire(now int64) bool
	// Release ends a handshake that Acquire let start (done or failed).
	Release()
}

// DefaultHandshakeTimeout bounds a TLS or WebSocket handshake (both, for
// WSS) from its first byte to its end.
const DefaultHandshakeTimeout = 10 * time.Second

// rawConn is what a TLS session reads and writes: the TCP connection, with
// writes going through tcpConn.write, so that a TLS write never blocks on
// a peer that does not read (the rest is queued for the flusher).
type rawConn struct {
	*net.TCPConn
	tc *tcpConn
}

// Read reads for the TLS session. Bytes that come while the reader waits
// between messages start the message timeout: the session buffers a
// record until it is whole (up to 16 KiB, outside the partial-message
// budget), and a peer must not hold that for the idle timeout. Accepted
// connections only: a TLS backend sends session tickets between messages.
func (r rawConn) Read(p []byte) (int, error) {
	if r.tc.waiting.Load() == idleProbe {
		return 0, errProbe // readIdleTLS: what the session holds, not the socket
	}
	if h := r.tc.hello; h != nil {
		if len(h.b) > 0 {
			n := copy(p, h.b)
			h.b = h.b[n:]
			return n, nil
		}
		if h.only {
			return 0, errNotHello
		}
	}
	n, err := r.TCPConn.Read(p)
	if n > 0 && r.tc.accepted && r.tc.waiting.CompareAndSwap(idleWait, idleBytes) {
		_ = r.TCPConn.SetReadDeadline(time.Now().Add(r.tc.srv.cfg.TCPMessageTimeout))
	}
	return n, err
}

// States of tcpConn.waiting.
const (
	idleNot int32 = iota
	idleWait
	idleBytes
	idleProbe // asking the session what it holds: rawConn.Read does not read (tlsidle.go)
)

func (r rawConn) Write(p []byte) (int, error) {
	if err := r.tc.write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// send writes one SIP message (or keep-alive answer) to the connection in
// its protocol: as is over TCP, in a TLS record over TLS, in a WebSocket
// frame over WS and WSS. It never blocks on the peer. A connection whose
// handshake is not done takes nothing.
func (c *tcpConn) send(p []byte) error {
	switch {
	case c.kind.ws():
		if !c.ready.Load() {
			return errConnDead
		}
		return c.sendFrame(wsOpFor(p), p)
	case c.sess != nil:
		if !c.ready.Load() {
			return errConnDead
		}
		_, err := c.sess.Write(p)
		return err
	}
	return c.write(p)
}

// sendStream writes bytes of the stream under SIP: over the TLS session
// when there is one.
func (c *tcpConn) sendStream(p []byte) error {
	if c.sess != nil {
		_, err := c.sess.Write(p)
		return err
	}
	return c.write(p)
}

// readIdle waits between messages for the first bytes of the next one,
// holding no buffer, and returns them in a buffer from the pool (nil with
// an error and nothing read). A TLS session is read one byte at first: the
// session holds what else its record carried until readMore asks; it
// waits as a TCP connection does, without its read buffers (tlsidle.go).
func (c *tcpConn) readIdle() ([]byte, error) {
	if c.sess == nil {
		return readParked(c.c)
	}
	if b, err := c.probeIdle(); b != nil || err != nil {
		return b, err
	}
	releaseTLSBuffers(c.sess)
	return c.waitIdle()
}

// readMore reads the rest of a message under way.
func (c *tcpConn) readMore(p []byte) (int, error) {
	if c.sess != nil {
		return c.sess.Read(p)
	}
	return c.c.Read(p)
}

// endConn is the end of a connection's reader: its budget reservation and
// read buffer given back, out of the table and the flows, closed once the
// answers already queued are out.
func (s *Server) endConn(tc *tcpConn, reserved *int64, buf []byte) {
	if *reserved != 0 {
		s.reservePartial(tc, 0, reserved)
	}
	if buf != nil {
		releaseReadBuf(buf)
		s.tcp.readBufs.Add(-1)
	}
	s.tcp.remove(tc)
	if tc.proxyKey.backend.IsValid() {
		s.proxied.remove(tc)
	}
	s.flows.remove(tc)
	tc.mu.Lock()
	if !tc.dead && !tc.flushing {
		tc.kill()
	} else if !tc.dead {
		// Let the flusher finish the answers already queued (a 400 before
		// the close); it closes the socket when done or stalled.
		_ = tc.c.CloseRead()
		tc.closing = true
	}
	tc.mu.Unlock()
}

// beginHandshake sets the deadline of tc's handshake, reads its
// ClientHello when it is TLS or WSS (readHello), and asks the gate for a
// place; false: refused or no hello, the connection is to be closed. A
// plain WebSocket asks once its upgrade request head is in (handshakeWS).
func (s *Server) beginHandshake(tc *tcpConn) bool {
	s.handshakeDeadline(tc)
	if tc.sess != nil && !s.readHello(tc) {
		return false
	}
	if tc.hello != nil && tc.hello.only {
		return true // not a hello: crypto/tls fails on it, no place needed
	}
	return s.takeHandshake(tc)
}

// handshakeDeadline starts the clock of tc's handshake: reads and writes
// end at -tls-handshake-timeout from now (endHandshake clears the write
// side, the reader sets its own once the handshake is done).
func (s *Server) handshakeDeadline(tc *tcpConn) {
	_ = tc.c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
}

// takeHandshake asks the gate for a place for tc's handshake; a refusal
// is counted and logged (at WARN at most once every 10 s) and false: the
// connection is to be closed without a handshake. true must be followed
// by one endHandshake.
func (s *Server) takeHandshake(tc *tcpConn) bool {
	if why := s.acquireHandshake(tc); why != tlsedge.NotRefused {
		s.metrics.HandshakesRefused.Add(1)
		s.log.Debug("sip handshake refused: too many in progress", "remote", tc.remote.String(), "transport", tc.kind.String(), "reason", why.String())
		if sum, due := s.handshakeRefusals.Note(why, tc.remote.Addr(), s.clock.Now()); due {
			s.log.Warn("sip handshakes refused since the last such line (at most one every 10 s): connections closed without a handshake (-tls-handshakes-max, -tls-handshake-rate)", sum.Args()...)
		}
		return false
	}
	return true
}

// endHandshake clears the handshake's deadline and gives its place back
// (if it took one).
func (s *Server) endHandshake(tc *tcpConn) {
	_ = tc.c.SetWriteDeadline(time.Time{})
	if tc.hello == nil || !tc.hello.only {
		s.releaseHandshake(tc)
	}
	tc.hello = nil
}

// A TLS or WSS connection takes a place of the handshake gate only once
// its ClientHello has arrived whole (tlsedge.ReadHello), under the
// handshake deadline set at its start: until then it holds a socket and a
// parked goroutine, which the connection limits (global and per source)
// and the deadline bound. Taken before, the places went to whoever opened
// connections and trickled their hellos: a few addresses, each within its
// source's share, held them all for the timeout, and every other client
// of the node (SIP TLS, WSS, HTTPS) was refused its handshake for as long
// as they kept it up. A plain WebSocket connection likewise takes its
// place only once its upgrade request head has arrived up to its blank
// line (readWSHead, handshakeWS), and gives it back once the upgrade is
// answered.

// tlsHello is the start of a TLS connection, read before its handshake
// and given to the session ahead of the socket (rawConn.Read). only: it
// is not a ClientHello (tlsedge.ErrNotHello), and the session reads
// nothing more of the socket; it fails on these bytes as it would have on
// the socket's (a PROXY header from a source not allowed to send one is
// still told apart), and never gets to cryptography without a place.
type tlsHello struct {
	b    []byte
	only bool
}

// errNotHello ends what a session reads of a connection whose first bytes
// are not a ClientHello.
var errNotHello = errors.New("sip tls: not a TLS ClientHello")

// readHello reads the ClientHello of tc into tc.hello; false: it did not
// come whole by the deadline or the connection ended (counted and logged
// as a failed handshake).
func (s *Server) readHello(tc *tcpConn) bool {
	b, err := tlsedge.ReadHello(tc.c, nil)
	switch {
	case err == nil:
		tc.hello = &tlsHello{b: b}
	case errors.Is(err, tlsedge.ErrNotHello):
		tc.hello = &tlsHello{b: b, only: true}
	default:
		s.handshakeFailed(tc, err)
		return false
	}
	return true
}

// sourceGate is a HandshakeGate that also holds each source to a share
// of the handshakes in flight (tlsedge.HandshakeLimiter): without one, a
// single address's silent connections could hold every place of the
// node, HTTPS included.
type sourceGate interface {
	AcquireFrom(src netip.Addr, now int64) bool
	ReleaseFrom(src netip.Addr)
}

// handshakeRefusals gathers the handshakes the gate refused, for a line
// at most every 10 s.
type handshakeRefusals = tlsedge.RefusalLog

// reasonGate is a sourceGate that says why it refused
// (tlsedge.HandshakeLimiter), for the log.
type reasonGate interface {
	TryFrom(src netip.Addr, now int64) tlsedge.Refusal
}

// acquireHandshake asks Config.Handshakes for a handshake on tc (its
// source's share too when the gate keeps shares): NotRefused, or why not
// (RefusedInFlight for a gate that does not say); NotRefused without a
// gate.
func (s *Server) acquireHandshake(tc *tcpConn) tlsedge.Refusal {
	ok := true
	switch g := s.cfg.Handshakes; g := g.(type) {
	case nil:
	case reasonGate:
		return g.TryFrom(tc.remote.Addr(), s.clock.Now())
	case sourceGate:
		ok = g.AcquireFrom(tc.remote.Addr(), s.clock.Now())
	default:
		ok = g.Acquire(s.clock.Now())
	}
	if !ok {
		return tlsedge.RefusedInFlight
	}
	return tlsedge.NotRefused
}

// releaseHandshake ends a handshake acquireHandshake let start on tc.
func (s *Server) releaseHandshake(tc *tcpConn) {
	switch g := s.cfg.Handshakes; g := g.(type) {
	case nil:
	case sourceGate:
		g.ReleaseFrom(tc.remote.Addr())
	default:
		g.Release()
	}
}

// handshakeFailed counts and logs a handshake that did not complete.
func (s *Server) handshakeFailed(tc *tcpConn, err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s.metrics.HandshakeTimeouts.Add(1)
		s.log.Debug("sip handshake not complete in time: connection closed", "remote", tc.remote.String(), "transport", tc.kind.String(), "timeout", s.cfg.HandshakeTimeout)
		return
	}
	var rh tls.RecordHeaderError
	if len(s.cfg.ProxyFrom) > 0 && errors.As(err, &rh) && proxyproto.SniffRecord(rh.RecordHeader) {
		// A PROXY header from a source not allowed to send one.
		s.proxyRejected(proxyproto.ReasonUntrusted, tc.remote, err)
		return
	}
	s.metrics.HandshakeFailures.Add(1)
	s.log.Debug("sip handshake failed", "remote", tc.remote.String(), "transport", tc.kind.String(), "err", err)
}

// handshakeTLS runs the TLS handshake of a TLS connection within the gate
// and the handshake timeout; false: it failed and the connection is to be
// closed.
func (s *Server) handshakeTLS(tc *tcpConn) bool {
	if !s.beginHandshake(tc) {
		return false
	}
	defer s.endHandshake(tc)
	if err := tc.sess.Handshake(); err != nil {
		s.handshakeFailed(tc, err)
		return false
	}
	tc.ready.Store(true)
	return true
}

// listenEdge opens the TLS, WS and WSS listeners configured; on an error
// it closes those it opened.
func (s *Server) listenEdge() error {
	for _, l := range []struct {
		addr  string
		field string
		ln    **net.TCPListener
	}{
		{s.cfg.TLSListen, "TLSListen", &s.tlsLn},
		{s.cfg.WSListen, "WSListen", &s.wsLn},
		{s.cfg.WSSListen, "WSSListen", &s.wssLn},
	} {
		if l.addr == "" {
			continue
		}
		ta, err := net.ResolveTCPAddr("tcp", l.addr)
		if err == nil {
			*l.ln, err = net.ListenTCP("tcp", ta)
		}
		if err != nil {
			s.closeEdge()
			return fieldError(l.field, "%w", err)
		}
	}
	return nil
}

// serveEdge starts the accept loops of the listeners listenEdge opened.
func (s *Server) serveEdge() {
	for _, l := range []struct {
		ln   *net.TCPListener
		kind connKind
	}{{s.tlsLn, kindTLS}, {s.wsLn, kindWS}, {s.wssLn, kindWSS}} {
		if l.ln != nil {
			s.wg.Add(1)
			go s.serveStream(l.ln, l.kind)
		}
	}
}

// closeEdge closes the TLS, WS and WSS listeners.
func (s *Server) closeEdge() {
	for _, ln := range []*net.TCPListener{s.tlsLn, s.wsLn, s.wssLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// serveStream accepts connections of kind on ln.
func (s *Server) serveStream(ln *net.TCPListener, kind connKind) {
	defer s.wg.Done()
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if s.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("sip accept", "transport", kind.String(), "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.acceptConn(c, kind)
	}
}

// TLSAddr, WSAddr and WSSAddr return the address of the SIP over TLS,
// WebSocket and secure WebSocket listeners, nil when not configured or
// before Start.
func (s *Server) TLSAddr() net.Addr { return lnAddr(s.tlsLn) }

// WSAddr: see TLSAddr.
func (s *Server) WSAddr() net.Addr { return lnAddr(s.wsLn) }

// WSSAddr: see TLSAddr.
func (s *Server) WSSAddr() net.Addr { return lnAddr(s.wssLn) }

func lnAddr(ln *net.TCPListener) net.Addr {
	if ln == nil {
		return nil
	}
	return ln.Addr()
}

// checkEdge validates the edge listeners' fields of c.
func (c *Config) checkEdge() error {
	for _, l := range []struct{ addr, field string }{{c.TLSListen, "TLSListen"}, {c.WSListen, "WSListen"}, {c.WSSListen, "WSSListen"}} {
		if l.addr == "" {
			continue
		}
		_, port, err := net.SplitHostPort(l.addr)
		if p, perr := strconv.Atoi(port); err != nil || perr != nil || p < 0 || p > 65535 {
			return fieldError(l.field, "%q: want HOST:PORT or :PORT", l.addr)
		}
	}
	for _, l := range []struct{ adv, listen, field, listenFlag string }{
		{c.TLSAdvertise, c.TLSListen, "TLSAdvertise", "TLSListen"},
		{c.WSAdvertise, c.WSListen, "WSAdvertise", "WSListen"},
		{c.WSSAdvertise, c.WSSListen, "WSSAdvertise", "WSSListen"},
	} {
		if l.adv == "" {
			continue
		}
		if l.listen == "" {
			return fieldError(l.field, "%q: there is no listener to advertise (set %s too)", l.adv, l.listenFlag)
		}
		if err := checkAdvertise(l.adv); err != nil {
			return fieldError(l.field, "%v", err)
		}
	}
	switch {
	case c.TLSListen != "" && c.TLSConfig == nil:
		return fieldError("TLSListen", "%q needs a certificate to serve", c.TLSListen)
	case c.WSSListen != "" && c.TLSConfig == nil:
		return fieldError("WSSListen", "%q needs a certificate to serve", c.WSSListen)
	case c.HandshakeTimeout < 100*time.Millisecond:
		return fieldError("HandshakeTimeout", "%s: must be at least 100ms", c.HandshakeTimeout)
	case c.WSPath != "" && c.WSPath[0] != '/':
		return fieldError("WSPath", "%q: want a path starting with /", c.WSPath)
	}
	for _, o := range c.WSOrigins {
		scheme, host, ok := strings.Cut(o, "://")
		if !ok || scheme == "" || host == "" || strings.ContainsAny(host, " \t\r\n,/") || len(o) > 512 {
			return fieldError("WSOrigins", "%q: want an origin as a browser sends it, such as https://phone.example.com", o)
		}
	}
	return nil
}

// addrString is a's text, "" for nil.
func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// clientTLS is the client side of a transport=tls backend's connections:
// its certificate must be valid for sni= (else the host of its address)
// and chain to ca= (else to the system's authorities).
func clientTLS(spec lb.BackendSpec) (*tls.Config, error) {
	host, _, err := net.SplitHostPort(spec.Addr)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host}
	if spec.SNI != "" {
		cfg.ServerName = spec.SNI
	}
	if spec.CAFile != "" {
		pem, err := opfile.Read(spec.CAFile, 1<<20)
		if err != nil {
			return nil, fmt.Errorf("ca=%s: %w", spec.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca=%s: no PEM certificate in the file", spec.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// clientHandshake runs the TLS handshake of tc, a connection dialled to a
// TLS backend, within the handshake timeout.
func (s *Server) clientHandshake(tc *tcpConn, cfg *tls.Config) error {
	tc.kind = kindTLS
	tc.sess = tls.Client(rawConn{TCPConn: tc.c, tc: tc}, cfg)
	_ = tc.c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	err := tc.sess.Handshake()
	_ = tc.c.SetDeadline(time.Time{})
	if err != nil {
		tc.mu.Lock()
		if !tc.dead {
			tc.kill()
		}
		tc.mu.Unlock()
		return err
	}
	tc.ready.Store(true)
	return nil
}

// checkAdvertise validates an advertised HOST:PORT: a host and a port in
// 1..65535, which the entries naming it carry as they are.
func checkAdvertise(a string) error {
	h, p, err := net.SplitHostPort(a)
	if n, perr := strconv.Atoi(p); err != nil || perr != nil || h == "" || n < 1 || n > 65535 {
		return fmt.Errorf("%q: want HOST:PORT (a host name or IP, and a port in 1..65535)", a)
	}
	return nil
}

// edgeAdv is the address a listener is known by: what our entries name
// and what isOurs recognises.
type edgeAdv struct {
	hp    hostPort
	ip    netip.Addr // hp's host when it is an IP
	local netip.Addr // the address the listener is bound to, when not a wildcard
	lport int        // the port it is bound to
	on    bool
}

// matches reports whether host (no brackets) and port name this
// address; ip is host parsed (unmapped), the zero Addr for a name. The
// bound address (IP and port, when not a wildcard) is ours too, as a
// listen socket is "myself" to Kamailio whatever it advertises.
func (a *edgeAdv) matches(host string, ip netip.Addr, port int) bool {
	if !a.on || (port != a.hp.port && port != a.lport) {
		return false
	}
	if port == a.hp.port && strings.EqualFold(host, a.hp.host) {
		return true
	}
	if !ip.IsValid() {
		return false
	}
	return port == a.hp.port && ip == a.ip || port == a.lport && a.local.IsValid() && ip == a.local
}

// newEdgeAdv is the address of a listener bound to la, advertised as
// adv ("" for the default: la, or, for a wildcard bind, main's host with
// la's port).
func newEdgeAdv(adv string, la netip.AddrPort, main hostPort) (edgeAdv, error) {
	a := edgeAdv{lport: int(la.Port())}
	lip := la.Addr().Unmap()
	if lip.IsValid() && !lip.IsUnspecified() {
		a.local = lip
	}
	if adv == "" {
		host := main.host
		if a.local.IsValid() {
			host = a.local.String()
		}
		adv = net.JoinHostPort(host, strconv.Itoa(int(la.Port())))
	}
	hp, err := parseHostPort(adv)
	if err != nil {
		return a, err
	}
	a.hp, a.on = hp, true
	if ip, err := netip.ParseAddr(hp.host); err == nil {
		a.ip = ip.Unmap()
	}
	return a, nil
}

// setEdgeAdvertise sets the advertised addresses of the TLS, WS and WSS
// listeners listenEdge opened; s.adv is set.
func (s *Server) setEdgeAdvertise() error {
	// UDP/TCP: the advertised address, and the bound IP with the
	// advertised port (as before the edge listeners).
	s.edgeAdv[kindTCP] = edgeAdv{hp: s.adv, ip: s.advIP, lport: s.adv.port, on: true}
	if la, ok := s.udp.LocalAddr().(*net.UDPAddr); ok {
		if lip, ok := netip.AddrFromSlice(la.IP); ok && !lip.Unmap().IsUnspecified() {
			s.edgeAdv[kindTCP].local = lip.Unmap()
		}
	}
	for _, l := range []struct {
		ln    *net.TCPListener
		kind  connKind
		adv   string
		field string
	}{
		{s.tlsLn, kindTLS, s.cfg.TLSAdvertise, "TLSAdvertise"},
		{s.wsLn, kindWS, s.cfg.WSAdvertise, "WSAdvertise"},
		{s.wssLn, kindWSS, s.cfg.WSSAdvertise, "WSSAdvertise"},
	} {
		if l.ln == nil {
			continue
		}
		a, err := newEdgeAdv(l.adv, l.ln.Addr().(*net.TCPAddr).AddrPort(), s.adv)
		if err != nil {
			return fieldError(l.field, "%v", err)
		}
		s.edgeAdv[l.kind] = a
	}
	return nil
}

// advFor is the address our entries name for transport tr (a Via
// transport: UDP, TCP, TLS, WS, WSS): that listener's, the UDP/TCP one
// for UDP and TCP or a listener that is not open.
func (s *Server) advFor(tr string) hostPort {
	k := kindTCP
	switch {
	case strings.EqualFold(tr, "TLS"):
		k = kindTLS
	case strings.EqualFold(tr, "WS"):
		k = kindWS
	case strings.EqualFold(tr, "WSS"):
		k = kindWSS
	}
	if a := &s.edgeAdv[k]; a.on {
		return a.hp
	}
	return s.adv
}
