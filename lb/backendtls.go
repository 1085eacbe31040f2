package lb

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"

	"github.com/sluicelb/sluice/internal/opfile"
)

// maxCAFile bounds the ca=FILE a backend spec names: a bundle of every
// public root is about 200 KiB.
const maxCAFile = 4 << 20

// ClientTLS returns the TLS configuration that speaks to the backend b
// describes, or nil when b has tls off. The backend's certificate is
// verified (there is no key to turn verification off): against the
// certificates of b.CAFile when it names one, else the system roots, for
// the name b.SNI, else the host of b.Addr (an IP address is verified
// against the certificate's IP addresses). TLS 1.2 is the lowest version
// offered; ALPN offers http/1.1 alone, the protocol sluice speaks to
// backends.
func (b BackendSpec) ClientTLS() (*tls.Config, error) {
	if !b.TLS {
		return nil, nil
	}
	name := b.SNI
	if name == "" {
		host, _, err := net.SplitHostPort(b.Addr)
		if err != nil {
			return nil, fmt.Errorf("backend %s: address %q: want host:port", b.ID, b.Addr)
		}
		name = host
	}
	cfg := &tls.Config{
		ServerName: name,
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		// A client session cache lets reconnections to the backend resume
		// instead of a full handshake.
		ClientSessionCache: tls.NewLRUClientSessionCache(64),
	}
	if b.CAFile != "" {
		pem, err := opfile.Read(b.CAFile, maxCAFile)
		if err != nil {
			return nil, fmt.Errorf("backend %s: ca=%s: %w", b.ID, b.CAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("backend %s: ca=%s: no PEM certificate in the file", b.ID, b.CAFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
