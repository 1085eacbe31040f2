package sip

import (
	"net"
	"net/netip"
	"time"

	"github.com/sluicelb/sluice/proxyproto"
)

// The PROXY protocol on the way in (-proxy-protocol-from). A TCP or TLS
// connection from a listed source (a layer-4 balancer) must start with a
// header, read before TLS on a goroutine of its own within
// -proxy-protocol-timeout; the client it names is the connection's source
// from then on, as if it had connected itself: Via received/rport, the
// per-source cap, the sticky source hash, responses and requests routed
// back to it over the connection, logs. A LOCAL header (the balancer's own
// health check) keeps the balancer's address. From other sources a header
// at the start of a TCP connection is refused: it is how a client would
// forge its address (on TLS the handshake fails on it, counted as
// untrusted: handshakeFailed). Refusals close the
// connection and are counted in Metrics.ProxyRejected.

// proxyFrom reports whether connections from ip must start with a header.
func (s *Server) proxyFrom(ip netip.Addr) bool {
	return len(s.cfg.ProxyFrom) > 0 && proxyproto.Trusted(s.cfg.ProxyFrom).Contains(ip)
}

// proxyRejected counts and logs (at debug) a connection closed for its
// header.
func (s *Server) proxyRejected(reason string, peer netip.AddrPort, err error) {
	s.metrics.ProxyRejected.Add(reason)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.log.Debug("sip connection refused: PROXY protocol", "reason", reason, "peer", peer.String(), "err", msg)
}

// acceptProxied reads the header of c (from peer, a balancer) on a
// goroutine of its own, then admits the connection as the client's. At
// most TCPMaxConns connections wait for their header at once; more are
// closed at once (counted as tcp_refused).
func (s *Server) acceptProxied(c *net.TCPConn, kind connKind, peer netip.AddrPort) {
	if s.proxyWaiting.Add(1) > int64(s.cfg.TCPMaxConns) {
		s.proxyWaiting.Add(-1)
		s.metrics.TCPRefused.Add(1)
		c.Close()
		return
	}
	s.wg.Add(1)
	s.proxyPending.Store(c, struct{}{})
	go func() {
		defer s.wg.Done()
		defer s.proxyWaiting.Add(-1)
		defer s.proxyPending.Delete(c)
		c.SetReadDeadline(time.Now().Add(s.cfg.ProxyTimeout))
		var buf [proxyproto.MaxLen]byte
		h, err := proxyproto.Read(c, buf[:])
		c.SetReadDeadline(time.Time{})
		if err != nil {
			s.proxyRejected(proxyproto.Reason(err), peer, err)
			c.Close()
			return
		}
		if s.closed.Load() {
			c.Close()
			return
		}
		s.proxyPending.Delete(c)
		cl := h.Client(peer)
		s.admitConn(c, kind, netip.AddrPortFrom(cl.Addr().Unmap(), cl.Port()))
	}()
}
