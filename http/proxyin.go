package http

import (
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/sluicelb/sluice/proxyproto"
)

// The PROXY protocol on the way in (-proxy-protocol-from). A connection
// from a listed source (a layer-4 balancer) must start with a header; the
// client address it carries is the connection's client address from then
// on: X-Forwarded-For and Forwarded, the sticky source hash, ARM source
// rules, the per-source connection limits, logs. A LOCAL header (the
// balancer's own health check) keeps the balancer's address. From any
// other source a header is refused: it is how a client would forge its
// address. Refusals close the connection unanswered and are counted in
// Stats.ProxyRejected.
//
// The loop engine parses the header from the connection's read buffer as
// bytes arrive (loopProxy); the accept goroutines of HTTPS and the
// fasthttp engine's gate read exactly its bytes with proxyproto.Read
// under -proxy-protocol-timeout (readProxy).

// proxyFrom reports whether connections from ip must start with a header.
func (s *Server) proxyFrom(ip netip.Addr) bool {
	return len(s.cfg.ProxyFrom) > 0 && proxyproto.Trusted(s.cfg.ProxyFrom).Contains(ip)
}

// proxyRejected counts and logs (at debug) a connection closed for its
// header.
func (s *Server) proxyRejected(reason string, peer netip.Addr, err error) {
	s.stats.ProxyRejected.Add(reason)
	s.logger.Debug("http connection refused: PROXY protocol", "reason", reason, "peer", peer.String(), "err", errString(err))
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// readProxy reads the header from c, whose peer is peer, within
// -proxy-protocol-timeout, and returns the client address it carries (peer
// for a LOCAL or UNKNOWN header). On error it has counted the refusal; the
// caller closes c. The read deadline is then after (zero: none), the one
// the caller's next read wants.
func (s *Server) readProxy(c net.Conn, peer netip.AddrPort, after time.Time) (netip.AddrPort, error) {
	c.SetReadDeadline(time.Now().Add(s.cfg.ProxyTimeout))
	var buf [proxyproto.MaxLen]byte
	h, err := proxyproto.Read(c, buf[:])
	c.SetReadDeadline(after)
	if err != nil {
		s.proxyRejected(proxyproto.Reason(err), peer.Addr(), err)
		return peer, err
	}
	cl := h.Client(peer)
	return netip.AddrPortFrom(cl.Addr().Unmap(), cl.Port()), nil
}

// rekey moves the count of a connection from a PROXY peer (counted in the
// total only: -proxy-protocol-from sources are exempt from the per-source
// limit) to the client its header named, under the per-source limit of
// that client. On sourceLimited the connection is still counted under
// peer: the caller closes it and releases peer.
func (l *clientLimit) rekey(peer, client netip.Addr) limitHit {
	if client == peer || !l.perIP(client) {
		return notLimited
	}
	ip := source(client)
	l.mu.Lock()
	defer l.mu.Unlock()
	if int(l.by[ip]) >= l.perSource {
		return sourceLimited
	}
	if l.by == nil {
		l.by = map[netip.Addr]int32{}
	}
	l.by[ip]++
	return notLimited
}

// proxyConn is a connection whose PROXY header named a client: it reports
// that client as its remote address (fasthttp's RemoteIP, net/http's
// RemoteAddr, logs).
type proxyConn struct {
	net.Conn
	remote net.Addr
}

func (p proxyConn) RemoteAddr() net.Addr { return p.remote }

// mayBeProxy reports whether b, shorter than a signature, may still grow
// into one: Sniff cannot tell yet.
func mayBeProxy(b []byte) bool {
	const v1, v2 = "PROXY ", "\r\n\r\n\x00"
	return (len(b) < len(v1) && string(b) == v1[:len(b)]) || (len(b) < len(v2) && string(b) == v2[:len(b)])
}

// proxyState is the PROXY protocol state a new connection from peer
// starts in: proxyRead from a balancer, proxySniff from others while
// balancers are configured (a header from them is refused), proxyDone
// without -proxy-protocol-from.
func (s *Server) proxyState(peer netip.Addr) uint8 {
	switch {
	case len(s.cfg.ProxyFrom) == 0:
		return proxyDone
	case s.proxyFrom(peer):
		return proxyRead
	}
	return proxySniff
}

// forgedBeforeTLS reports whether a failed TLS handshake met a PROXY
// header: from a source not in -proxy-protocol-from, a client forging its
// address, counted as untrusted rather than as a handshake failure.
func forgedBeforeTLS(err error) bool {
	var rh tls.RecordHeaderError
	return errors.As(err, &rh) && proxyproto.SniffRecord(rh.RecordHeader)
}
