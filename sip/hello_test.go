package sip

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sluicelb/sluice/tlsedge"
)

// clientHello returns the first flight of a TLS client of cfg: one record
// holding its ClientHello.
func clientHello(t *testing.T, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, cfg).Handshake()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// dialFrom dials addr from the loopback address from.
func dialFrom(t *testing.T, from string, addr net.Addr) net.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestHalfHellosHoldNoPlace: 300 SIP TLS and WSS connections from 8
// addresses that each sent half a ClientHello (a trickle that never ends,
// within the per-source cap) hold no place of a 256-place gate: a phone
// at another address gets its TLS handshake, and a WSS client its. Taken
// when the handshake began, the places were theirs (8 sources × their
// share of 32) and the phone was closed without one.
func TestHalfHellosHoldNoPlace(t *testing.T) {
	gate := tlsedge.NewHandshakeLimiter(256, 0)
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.Handshakes = gate
		c.HandshakeTimeout = time.Minute
	})
	hello := clientHello(t, cli)
	half := hello[:len(hello)/2]
	for i := range 300 {
		a := s.TLSAddr()
		if i%2 == 1 {
			a = s.WSSAddr()
		}
		c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i%8), a)
		if _, err := c.Write(half); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []net.Addr{s.TLSAddr(), s.WSSAddr()} {
		c := dialFrom(t, "127.0.0.200", a)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := tls.Client(c, cli).Handshake(); err != nil {
			st := gate.Stats()
			t.Fatalf("%s: a client at another address: %v (in flight %d, refused %d)", a, err, st.InFlight, st.RefusedBusy)
		}
	}
	if st := gate.Stats(); st.Started != 2 || st.RefusedBusy != 0 || s.metrics.HandshakesRefused.Load() != 0 {
		t.Errorf("started %d, refused %d/%d: want 2 and 0 (the half hellos never asked)", st.Started, st.RefusedBusy, s.metrics.HandshakesRefused.Load())
	}
}

// TestHelloNotInTimeClosed: a TLS connection whose ClientHello is not
// whole at the handshake deadline (set when its reader starts) is closed,
// counted as a handshake timeout, and never asks the gate.
func TestHelloNotInTimeClosed(t *testing.T) {
	gate := &testGate{max: 4}
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) { c.Handshakes = gate; c.HandshakeTimeout = 100 * time.Millisecond })
	hello := clientHello(t, cli)
	c := dialFrom(t, "127.0.0.1", s.TLSAddr())
	c.Write(hello[:len(hello)/2])
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); isTimeout(err) {
		t.Fatalf("half a hello still open past the handshake deadline: %v", err)
	}
	eventually(t, "the timeout counted", func() bool { return s.metrics.HandshakeTimeouts.Load() == 1 })
	if gate.acquiredN() != 0 || gate.inFlight.Load() != 0 || s.metrics.HandshakesRefused.Load() != 0 {
		t.Errorf("gate asked: acquired %d, in flight %d, refused %d; want none", gate.acquiredN(), gate.inFlight.Load(), s.metrics.HandshakesRefused.Load())
	}
}

// TestRefusedAfterHello: a whole ClientHello the gate refuses closes the
// connection without a handshake and is counted in HandshakesRefused.
func TestRefusedAfterHello(t *testing.T) {
	gate := &testGate{max: 0}
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) { c.Handshakes = gate })
	c := dialFrom(t, "127.0.0.1", s.TLSAddr())
	c.Write(clientHello(t, cli))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.Copy(io.Discard, c); n != 0 || isTimeout(err) {
		t.Fatalf("refused hello: %d bytes back, %v; want closed without an answer", n, err)
	}
	eventually(t, "the refusal counted", func() bool { return s.metrics.HandshakesRefused.Load() == 1 })
	if gate.acquiredN() != 0 {
		t.Errorf("gate: acquired %d; want 0", gate.acquiredN())
	}
}

// acquiredN is how many handshakes g let start.
func (g *testGate) acquiredN() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.acquired
}

// isTimeout reports whether err is a timeout.
func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
