// Package tlsedge owns what every TLS listener of a node shares: the
// certificates (a Store chosen from by SNI, reloaded live, watched for
// expiry), the server side tls.Config built from them (ServerConfig:
// TLS 1.2 and 1.3, Go's default cipher suites, session tickets whose keys
// rotate every hour and are the same on every node of a cluster) and the
// bound on handshakes (HandshakeLimiter: handshakes in flight and a rate
// cap, so that a handshake flood cannot starve established connections).
//
// It imports only the standard library, admission (for its event and
// field error types) and internal/opfile (bounded reads of operator
// files), so the HTTP and SIP front ends and node may all import it.
//
// The front ends take a *tls.Config and a HandshakeGate; node builds one
// Store and one HandshakeLimiter per node and hands them to every TLS
// listener. The README lists the cipher suites, the ticket key scheme and
// the measured handshake cost of ECDSA P-256 against RSA 2048.
package tlsedge
