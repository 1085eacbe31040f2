package sip

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestHostileFlowFromBackendAddressOverTCP: a client that connects over
// TCP from the very address:port a UDP backend listens on (TCP and UDP
// ports are separate, so anyone on the backend's host can bind it; off
// host, the address is spoofable for UDP towards a TCP backend likewise)
// is not that backend: a request it sends with another client's Path
// must not be sent over that client's flow. Backends are known by
// address and transport: a message on an accepted connection is never
// from a backend.
func TestHostileFlowFromBackendAddressOverTCP(t *testing.T) {
	s, reg := flowServer(t, nil)
	victim := dialTCP(t, s)
	p := pathOf(t, registerTCP(t, s, victim, reg, "victim"))

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: reg.addr.Addr().AsSlice(), Port: int(reg.addr.Port())}}
	ac, err := d.Dial("tcp", s.udpAddr().String())
	if err != nil {
		t.Skipf("cannot bind TCP %s: %v", reg.addr, err)
	}
	t.Cleanup(func() { ac.Close() })
	attacker := &tcpClient{t: t, conn: ac}
	attacker.write(strings.Replace(incomingInvite(reg, "sip:victim@10.9.9.9", "<"+p.String()+">", "forged-from-backend@test"),
		"Via: SIP/2.0/UDP", "Via: SIP/2.0/TCP", 1))

	_ = victim.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if m, err := victim.next(); err == nil {
		t.Fatalf("a TCP client at the UDP backend's address reached another client's flow:\n%v", m)
	}
	if n := s.metrics.FlowRouted.Load(); n != 0 {
		t.Errorf("flow_routed %d, want 0", n)
	}
}
