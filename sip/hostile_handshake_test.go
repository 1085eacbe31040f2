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
// WebSocket connections as there are places and says nothing, and as
// many SIP TLS connections that send a whole ClientHello and stall: the
// silent WebSockets ask for no place (they have no upgrade head), the
// hellos get their source's share (one of 8) and no more, and a SIP over
// TLS phone from another address gets its handshake. Before the share,
// and while a WebSocket took its place at its first byte, the phone was
// closed without a handshake (as was every HTTPS client of the node).
func TestHostileHandshakeSlotsPerSource(t *testing.T) {
	const places = 8
	gate := tlsedge.NewHandshakeLimiter(places, 0)
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.Handshakes = gate
		c.HandshakeTimeout = time.Minute
	})
	hello := clientHello(t, cli)
	for range places {
		for _, a := range []net.Addr{s.WSAddr(), s.TLSAddr()} {
			c := dialFrom(t, "127.0.0.1", a) // silent WebSocket, stalled hello
			if a == s.TLSAddr() {
				c.Write(hello)
			}
		}
	}
	eventually(t, "the hellos asked", func() bool {
		st := gate.Stats()
		return st.Started+st.RefusedBusy+st.RefusedSource >= places
	})
	// The refused hellos closed; the silent WebSockets and the hello let
	// through stay.
	eventually(t, "the WebSockets and one hello open", func() bool { return s.tcp.len() == places+1 })
	if st := gate.Stats(); st.Started != 1 || st.RefusedSource != places-1 {
		t.Errorf("one source: %d started, %d refused for its share; want 1 and %d", st.Started, st.RefusedSource, places-1)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", s.TLSAddr().String(), cli)
	if err != nil {
		st := gate.Stats()
		t.Fatalf("a phone at another address: %v (handshakes in flight %d of %d, all one source's)", err, st.InFlight, places)
	}
	c.Close()
}
