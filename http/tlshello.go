package http

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/sluicelb/sluice/tlsedge"
)

// An HTTPS connection takes a place of the handshake gate only once its
// ClientHello has arrived whole (tlsedge.ReadHello): until then it holds a
// socket and a parked goroutine, which the client limits (global and per
// source) and the handshake timeout bound. Taken at accept, the places
// went to whoever opened connections and trickled their hellos: a few
// addresses, each within its source's share, held them all for the
// timeout, and every other client of the node (HTTPS, SIP TLS, WSS) was
// refused its handshake for as long as they kept it up.

// helloHandshake reads the ClientHello of c (from ip; remote as for
// handshake) within Config.HandshakeTimeout, which it sets as c's deadline
// and which covers the handshake too, asks the gate for a place once the
// hello is whole (refused: closed, counted in HandshakeRefused), and runs
// the handshake. Bytes that are not a ClientHello go to crypto/tls without
// a place (they cost no cryptography): it fails on them as it did on the
// socket, so plain HTTP still gets its 400 and a PROXY header from a
// source not allowed to send one is still told apart. A hello not whole
// at the deadline, or cut off, is a failed handshake. t.pending counts c;
// Shutdown ends the read.
func (s *Server) helloHandshake(t *tlsFront, c net.Conn, ip netip.Addr, remote net.Addr, deliver deliverFunc) {
	c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	stop := context.AfterFunc(t.ctx, func() { c.SetReadDeadline(time.Unix(1, 0)) })
	hello, err := tlsedge.ReadHello(c, nil)
	stop()
	held := false
	switch {
	case err == nil:
		if why := s.acquireHandshake(ip); why != tlsedge.NotRefused {
			s.handshakeRefused(t, ip, why)
			s.endAccepted(t, c, ip)
			return
		}
		held = true
	case errors.Is(err, tlsedge.ErrNotHello):
	default:
		s.stats.HandshakeFailed.Add(1)
		s.logger.Debug("https handshake failed", "client", ip.String(), "err", err)
		s.endAccepted(t, c, ip)
		return
	}
	if s.shut.Load() {
		if held {
			s.releaseHandshake(ip)
		}
		s.endAccepted(t, c, ip)
		return
	}
	s.handshake(t, c, ip, remote, deliver, hello, held)
}

// noMoreReads is a socket crypto/tls reads nothing more of: its reads
// fail (errNoMoreReads). It writes, closes and keeps deadlines as the socket does.
type noMoreReads struct{ net.Conn }

func (noMoreReads) Read([]byte) (int, error) { return 0, errNoMoreReads }

// errNoMoreReads ends what crypto/tls may read of a connection whose
// first bytes were not a ClientHello.
var errNoMoreReads = errors.New("https: not a TLS ClientHello")

// drainRequest reads what the client of c sent past the bytes ReadHello
// read (one read, within a second), before c is closed: crypto/tls read
// them when it read the socket itself, and a socket closed with bytes
// unread is reset, which may lose the answer written just before.
func drainRequest(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(time.Second))
	var buf [2048]byte
	c.Read(buf[:])
}

// handshakeRefused counts a handshake the gate refused (why) to ip, and
// logs the refusals at most once every 10 s (tlsedge.RefusalLog): a
// refused client sees its connection closed, and without the line an
// operator had only a counter to tell that -tls-handshakes-max or
// -tls-handshake-rate turns clients away.
func (s *Server) handshakeRefused(t *tlsFront, ip netip.Addr, why tlsedge.Refusal) {
	s.stats.HandshakeRefused.Add(1)
	if sum, due := t.refusals.Note(why, ip, s.clock.Now()); due {
		s.logger.Warn("https handshakes refused since the last such line (at most one every 10 s): connections closed without a handshake (-tls-handshakes-max, -tls-handshake-rate)", sum.Args()...)
	}
}
