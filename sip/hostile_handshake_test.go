package sip

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/sluicelb/sluice/tlsedge"
)

// TestHostileHandshakeSlotsPerSource: the node's one bound on handshakes
// in flight (-tls-handshakes-max, shared by HTTPS, SIP TLS, WS and WSS)
// must not be all one source's. Here one source opens as many plain
// WebSocket connections as there are places and says nothing: no
// cryptography asked of it, each holds a place until the handshake
// timeout, and a SIP over TLS phone from another address is closed
// without a handshake (as is every HTTPS client of the node).
func TestHostileHandshakeSlotsPerSource(t *testing.T) {
	const places = 8
	gate := tlsedge.NewHandshakeLimiter(places, 0)
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.Handshakes = gate
		c.HandshakeTimeout = time.Minute
	})
	for range places {
		c, err := net.Dial("tcp", s.WSAddr().String()) // from 127.0.0.1, silent
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	eventually(t, "the silent connections accepted", func() bool {
		st := gate.Stats()
		return st.Started+st.RefusedBusy+st.RefusedSource >= places
	})
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", s.TLSAddr().String(), cli)
	if err != nil {
		st := gate.Stats()
		t.Fatalf("a phone at another address: %v (handshakes in flight %d of %d, all one source's silent WebSockets)", err, st.InFlight, places)
	}
	c.Close()
}
