package proxyproto

import (
	"net/netip"
	"sync/atomic"
)

// MetricName and MetricHelp are the metric front ends export their
// Rejected counts as, labelled by protocol and reason: one help text for
// every front end, as Prometheus wants one per family.
const (
	MetricName = "sluice_proxy_protocol_rejected_total"
	MetricHelp = "Connections closed for their PROXY protocol header, by protocol and reason: missing (a source of -proxy-protocol-from sent none), malformed, truncated (the connection ended within it), timeout (not whole within -proxy-protocol-timeout), untrusted (a header from a source not in -proxy-protocol-from)."
)

// Reasons lists the reasons in the order Rejected.Each gives them.
var Reasons = [...]string{ReasonMissing, ReasonMalformed, ReasonTruncated, ReasonTimeout, ReasonUntrusted}

// Rejected counts connections closed for their header, by reason.
type Rejected struct {
	n [len(Reasons)]atomic.Uint64
}

// Add counts one connection closed for reason (one of Reasons; another
// counts as malformed).
func (r *Rejected) Add(reason string) {
	for i, s := range Reasons {
		if s == reason {
			r.n[i].Add(1)
			return
		}
	}
	r.n[1].Add(1)
}

// Get returns the count for reason.
func (r *Rejected) Get(reason string) uint64 {
	for i, s := range Reasons {
		if s == reason {
			return r.n[i].Load()
		}
	}
	return 0
}

// Each calls f with each reason and its count.
func (r *Rejected) Each(f func(reason string, n uint64)) {
	for i, s := range Reasons {
		f(s, r.n[i].Load())
	}
}

// Trusted is the set of sources allowed to send a header
// (-proxy-protocol-from).
type Trusted []netip.Prefix

// Contains reports whether ip (unmapped from IPv4-in-IPv6 first) is in
// the set.
func (t Trusted) Contains(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, p := range t {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
