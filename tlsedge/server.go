package tlsedge

import (
	"crypto/tls"
	"slices"
)

// ServerConfig returns the tls.Config of a TLS listener: TLS 1.2 and 1.3
// only, Go's default cipher suites and key exchanges (the README lists
// them), the certificate chosen by SNI from the store (GetCertificate),
// alpn as the protocols offered in order of preference (e.g. "h2",
// "http/1.1"; none: no ALPN), and session tickets sealed with the store's
// rotating keys. Each call returns a new config; every one of them (and
// their clones) follows the store's reloads and the ticket key rotation.
func (s *Store) ServerConfig(alpn ...string) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		MaxVersion:     tls.VersionTLS13,
		GetCertificate: s.GetCertificate,
		NextProtos:     slices.Clone(alpn),
		WrapSession:    s.tickets.wrap,
		UnwrapSession:  s.tickets.unwrap,
	}
}
