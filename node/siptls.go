package node

import (
	lbsip "github.com/sluicelb/sluice/sip"
)

// sipEdge gives the SIP edge listeners what HTTPS has: certificates by SNI
// from the node's store (-tls-cert: live reload, expiry in /status) for
// -sip-tls-listen and -sip-wss-listen, and the node's one bound on TLS and
// WebSocket handshakes (-tls-handshakes-max, -tls-handshake-rate) and its
// timeout (-tls-handshake-timeout) for those and -sip-ws-listen. A TLS or
// WSS listener without any -tls-cert is refused, naming both flags. It
// also gives the SIP front end the node's -proxy-protocol-from and
// -proxy-protocol-timeout.
func (n *Node) sipEdge(cfg *lbsip.Config) error {
	from, err := n.proxyProtocolFrom()
	if err != nil {
		return err
	}
	if len(from) > 0 {
		cfg.ProxyFrom = from
		if n.cfg.HTTP.ProxyTimeout > 0 {
			cfg.ProxyTimeout = n.cfg.HTTP.ProxyTimeout
		}
	}
	if cfg.TLSListen == "" && cfg.WSSListen == "" && cfg.WSListen == "" {
		return nil
	}
	if cfg.Handshakes == nil && n.handshakes != nil {
		cfg.Handshakes = n.handshakes
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = n.HandshakeTimeout()
	}
	if cfg.TLSConfig != nil {
		return nil
	}
	for _, l := range []struct{ flag, addr string }{{"-sip-tls-listen", cfg.TLSListen}, {"-sip-wss-listen", cfg.WSSListen}} {
		if l.addr != "" {
			if err := n.cfg.needTLS(l.flag); err != nil {
				return err
			}
		}
	}
	if cfg.TLSListen != "" || cfg.WSSListen != "" {
		// No ALPN: SIP over TLS has none, and a WSS client's HTTP/1.1
		// handshake needs none.
		cfg.TLSConfig = n.tlsConfig()
	}
	return nil
}
