package http

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/sluicelb/sluice/tlsedge"
)

// TestHostileHandshakeSlotsPerSource: the node's bound on handshakes in
// flight (-tls-handshakes-max) protects the CPU from a flood, but one
// source alone must not be able to hold every place: its connections,
// each sending a ClientHello and then nothing, each keep a place until the handshake timeout
// (10 s by default), and when they are all of them, every other client's
// handshake is refused, on every TLS and WebSocket listener of the node,
// for as long as the one source repeats. One source gets a share (an
// eighth), as it does of the client connections and of backend
// connections.
func TestHostileHandshakeSlotsPerSource(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		const places = 8
		gate := tlsedge.NewHandshakeLimiter(places, 0)
		r := newRig(t, rigOpts{backends: 1, tls: true, cfg: Config{Handshakes: gate, HandshakeTimeout: time.Minute}})
		hello := clientHello(t)
		for range places {
			c, err := net.Dial("tcp", r.addr) // from 127.0.0.1: a ClientHello, then never a word
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			c.Write(hello)
		}
		eventually(t, "the silent connections accepted", func() bool {
			st := gate.Stats()
			return st.Started+st.RefusedBusy+st.RefusedSource >= places
		})
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp", r.addr, testTLS(t).client("a.example"))
		if err != nil {
			st := gate.Stats()
			t.Fatalf("another source's handshake: %v (in flight %d of %d, all from one source)", err, st.InFlight, places)
		}
		c.Close()
	})
}
