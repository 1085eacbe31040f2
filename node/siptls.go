package node

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"

	lbsip "github.com/sluicelb/sluice/sip"
)

// The SIP edge listeners (-sip-tls-listen, -sip-wss-listen) serve the
// certificate of -sip-tls-cert-file and -sip-tls-key-file, loaded once at
// start, until the certificate store shared with HTTPS (-tls-cert: SNI,
// live reload, expiry in /status) takes their place; its
// ServerConfig gives the *tls.Config sip.Config.TLSConfig takes.

// DefaultSIPHandshakes bounds the TLS and WebSocket handshakes in progress
// on the SIP edge listeners (sip.Config.Handshakes) until the handshake
// limiter of the certificate store (in flight and a rate) replaces it.
const DefaultSIPHandshakes = 256

// sipEdge fills cfg's TLSConfig (from the certificate files, when a TLS or
// WSS listener is configured and none is given) and Handshakes.
func sipEdge(cfg *lbsip.Config, certFile, keyFile string) error {
	if cfg.TLSListen == "" && cfg.WSSListen == "" && cfg.WSListen == "" {
		return nil
	}
	if cfg.Handshakes == nil {
		cfg.Handshakes = &inFlightGate{max: DefaultSIPHandshakes}
	}
	if cfg.TLSConfig != nil || cfg.TLSListen == "" && cfg.WSSListen == "" {
		return nil
	}
	if certFile == "" || keyFile == "" {
		return fmt.Errorf("-sip-tls-cert-file and -sip-tls-key-file: both required by -sip-tls-listen / -sip-wss-listen (the certificate served)")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("-sip-tls-cert-file %q, -sip-tls-key-file %q: %w", certFile, keyFile, err)
	}
	cfg.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	return nil
}

// inFlightGate is a sip.HandshakeGate of at most max handshakes in
// progress (no rate).
type inFlightGate struct {
	max int64
	n   atomic.Int64
}

func (g *inFlightGate) Acquire(int64) bool {
	if g.n.Add(1) > g.max {
		g.n.Add(-1)
		return false
	}
	return true
}

func (g *inFlightGate) Release() { g.n.Add(-1) }
