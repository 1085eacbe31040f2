package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/tlsedge"
)

// The TLS pieces every TLS listener of the node shares: one certificate
// store (-tls-cert) and one bound on handshakes (-tls-handshakes-max,
// -tls-handshake-rate), built in New before the front ends, so that
// buildHTTP and buildSIP hand them to their listeners (tlsConfig,
// n.handshakes, n.tlsCfg.HandshakeTimeout).

// TicketKeyLabel is the use the affinity key ring's keys are derived for
// (lb.DeriveKeys) to seal TLS session tickets: nodes sharing the key ring
// (-affinity-key-file) resume each other's sessions, and a standalone
// node's key in the data directory keeps resumption across restarts.
const TicketKeyLabel = "sluice tls session tickets v1"

// buildTLS builds the handshake limiter and, when any -tls-cert is
// given, the certificate store. A Config whose TLS fields are all zero
// (built in code, not from flags) gets tlsedge's defaults.
func (n *Node) buildTLS() error {
	c := n.cfg.TLS
	if len(c.Certs) == 0 && c.HandshakesMax == 0 && c.HandshakeRate == 0 && c.HandshakeTimeout == 0 {
		c = tlsedge.DefaultConfig()
	}
	if err := c.Validate(); err != nil {
		return err
	}
	n.tlsCfg = c
	n.handshakes = tlsedge.NewHandshakeLimiter(c.HandshakesMax, c.HandshakeRate)
	if len(c.Certs) == 0 {
		return nil
	}
	if n.cfg.HTTP.TLSListen == "" && n.cfg.SIP.TLSListen == "" && n.cfg.SIP.WSSListen == "" {
		// Most likely a forgotten listener: the certificates would be
		// loaded, reloaded and watched for expiry, and served nowhere.
		n.logger.Warn("-tls-cert given but no TLS listener: the certificates are served nowhere (add -https-listen, -sip-tls-listen or -sip-wss-listen)",
			"certs", len(c.Certs))
	}
	derived, err := lb.DeriveKeys(n.keyRing, TicketKeyLabel)
	if err != nil {
		return fmt.Errorf("session ticket keys: %w", err)
	}
	var secrets tlsedge.StaticSecrets
	for _, k := range slices.Backward(derived) { // newest first
		secrets = append(secrets, k.Secret)
	}
	n.tlsStore, err = tlsedge.New(c, tlsedge.Deps{
		Tickets: secrets,
		Events:  n.events,
		Reloaded: func(spec string, err error) {
			n.reloaded("-tls-cert "+spec, err, nil)
		},
	})
	return err
}

// needTLS refuses a TLS listener (flag, e.g. "-https-listen") without a
// certificate, naming both flags. Front ends' listener checks call it.
func (c *Config) needTLS(flag string) error {
	if len(c.TLS.Certs) == 0 {
		return fmt.Errorf("%s needs a certificate: give -tls-cert CERTFILE[,key=KEYFILE] (repeatable; the first is the default)", flag)
	}
	return nil
}

// tlsConfig is the tls.Config of a TLS listener offering alpn, from the
// node's store; nil when the node has no certificate (needTLS refused
// such a listener already).
func (n *Node) tlsConfig(alpn ...string) *tls.Config {
	if n.tlsStore == nil {
		return nil
	}
	return n.tlsStore.ServerConfig(alpn...)
}

// TLS returns the certificate store of the node's TLS listeners; nil
// without -tls-cert.
func (n *Node) TLS() *tlsedge.Store { return n.tlsStore }

// Handshakes returns the bound on TLS and WebSocket handshakes every
// listener of the node shares (after New, never nil).
func (n *Node) Handshakes() *tlsedge.HandshakeLimiter { return n.handshakes }

// HandshakeTimeout is -tls-handshake-timeout: how long a listener lets a
// client take over its handshake.
func (n *Node) HandshakeTimeout() time.Duration { return n.tlsCfg.HandshakeTimeout }

// ReloadTLS re-reads every -tls-cert (SIGHUP): a good file replaces its
// certificate for new handshakes, a bad one is refused (an event, its
// error in /status) and the certificate in service stays. nil without
// certificates.
func (n *Node) ReloadTLS() error {
	if n.tlsStore == nil {
		return nil
	}
	return n.tlsStore.Reload()
}

// startTLS polls the certificate files for changes (and expiry) while
// ctx runs.
func (n *Node) startTLS(ctx context.Context) {
	if n.tlsStore == nil {
		return
	}
	t := time.NewTicker(tlsedge.DefaultPollInterval)
	n.goBackground(func() {
		defer t.Stop()
		n.tlsStore.Watch(ctx, t.C)
	})
}

// tlsCertStatus is /status's tls_certificates: nil (left out) without
// certificates.
func (n *Node) tlsCertStatus() any {
	if n.tlsStore == nil {
		return nil
	}
	return n.tlsStore.Certs()
}

var (
	descCertExpiry  = prometheus.NewDesc("sluice_tls_certificate_expiry_seconds", "Seconds until the certificate in service expires (negative once expired), by -tls-cert file and its first name.", []string{"file", "name"}, nil)
	descCertReloads = prometheus.NewDesc("sluice_tls_certificate_reloads_total", "Loads of certificate files after start (SIGHUP or a change of the file), by result: ok (a new certificate in service), unchanged (the file held the certificate in service already), or failed (the certificate in service stays).", []string{"result"}, nil)
	descHSInFlight  = prometheus.NewDesc("sluice_tls_handshakes_in_flight", "TLS and WebSocket handshakes under way on every listener.", nil, nil)
	descHSStarted   = prometheus.NewDesc("sluice_tls_handshakes_started_total", "TLS and WebSocket handshakes the handshake bound let start.", nil, nil)
	descHSRefused   = prometheus.NewDesc("sluice_tls_handshakes_refused_total", "Connections closed without a handshake once their ClientHello came, by reason: in_flight (-tls-handshakes-max under way), source (the client's address, or IPv6 /64, has its eighth of them under way) or rate (over -tls-handshake-rate).", []string{"reason"}, nil)
)

// tlsCollector is the TLS families of /metrics.
type tlsCollector struct{ n *Node }

func (c tlsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCertExpiry, descCertReloads, descHSInFlight, descHSStarted, descHSRefused} {
		ch <- d
	}
}

func (c tlsCollector) Collect(ch chan<- prometheus.Metric) {
	if h := c.n.handshakes; h != nil {
		st := h.Stats()
		ch <- prometheus.MustNewConstMetric(descHSInFlight, prometheus.GaugeValue, float64(st.InFlight))
		ch <- prometheus.MustNewConstMetric(descHSStarted, prometheus.CounterValue, float64(st.Started))
		ch <- prometheus.MustNewConstMetric(descHSRefused, prometheus.CounterValue, float64(st.RefusedBusy), "in_flight")
		ch <- prometheus.MustNewConstMetric(descHSRefused, prometheus.CounterValue, float64(st.RefusedSource), "source")
		ch <- prometheus.MustNewConstMetric(descHSRefused, prometheus.CounterValue, float64(st.RefusedRate), "rate")
	}
	s := c.n.tlsStore
	if s == nil {
		return
	}
	for _, ci := range s.Certs() {
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(ci.SecondsToExpiry), ci.File, ci.Names[0])
	}
	st := s.Stats()
	ch <- prometheus.MustNewConstMetric(descCertReloads, prometheus.CounterValue, float64(st.ReloadOK), "ok")
	ch <- prometheus.MustNewConstMetric(descCertReloads, prometheus.CounterValue, float64(st.ReloadFailed), "failed")
	ch <- prometheus.MustNewConstMetric(descCertReloads, prometheus.CounterValue, float64(st.ReloadUnchanged), "unchanged")
}
