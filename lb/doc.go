// Package lb owns the backends behind the balancer: their identity, state
// (up, down, draining), outstanding-request counters, per-backend MOP
// limiters, health checks and the selection policies that pick one of them
// for a request.
//
// The package is protocol-agnostic: the HTTP and SIP front ends share the
// same Pool type and differ only in the key they pass to hash-based
// policies (a cookie or source address for HTTP, a Call-ID for SIP).
// It also provides the encrypted affinity token (Signer) that carries a
// backend id in the HTTP sticky cookie and in the SIP Record-Route, and
// the key ring (LoadOrCreateKeyRing) its keys come from.
//
// lb imports the standard library and admission only; the memory probe is
// the single exception and imports the Prometheus text parser.
package lb
