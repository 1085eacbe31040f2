package node

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicelb/sluice/tlsedge"
)

// TestTLSRefusedByReason: /metrics tells a refusal for the source's share
// (reason="source") from one for the node's bound (reason="in_flight")
// and the rate (reason="rate").
func TestTLSRefusedByReason(t *testing.T) {
	l := tlsedge.NewHandshakeLimiter(2, 0) // a source's share: 1
	a, b, c := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("192.0.2.3")
	l.AcquireFrom(a, 0)
	l.AcquireFrom(a, 0) // source
	l.AcquireFrom(a, 0) // source
	l.AcquireFrom(b, 0)
	l.AcquireFrom(c, 0) // in_flight
	want := `
# HELP sluice_tls_handshakes_refused_total Connections closed without a handshake once their ClientHello came, by reason: in_flight (-tls-handshakes-max under way), source (the client's address, or IPv6 /64, has its eighth of them under way) or rate (over -tls-handshake-rate).
# TYPE sluice_tls_handshakes_refused_total counter
sluice_tls_handshakes_refused_total{reason="in_flight"} 1
sluice_tls_handshakes_refused_total{reason="rate"} 0
sluice_tls_handshakes_refused_total{reason="source"} 2
`
	if err := testutil.CollectAndCompare(tlsCollector{&Node{handshakes: l}}, strings.NewReader(want), "sluice_tls_handshakes_refused_total"); err != nil {
		t.Error(err)
	}
}
