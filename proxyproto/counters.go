package proxyproto

import (
	"fmt"
	"net/netip"
	"strings"
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

// ParseTrusted parses a -proxy-protocol-from value: a CIDR or an address,
// or a comma-separated list of them.
func ParseTrusted(s string) (Trusted, error) {
	var out Trusted
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p.Addr())).Masked())
			continue
		}
		if a, err := netip.ParseAddr(f); err == nil && a.Zone() == "" {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		return nil, fmt.Errorf("-proxy-protocol-from %q: %q is not a CIDR or an address (want e.g. 10.0.0.0/8 or 192.0.2.10)", s, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-proxy-protocol-from %q: no CIDR or address (want e.g. 10.0.0.0/8)", s)
	}
	return out, nil
}

// unmapBits is the bits an IPv4-mapped IPv6 prefix loses when unmapped.
func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}
