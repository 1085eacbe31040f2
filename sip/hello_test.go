package sip

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
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

// warnLog is a JSON slog logger whose WARN lines a test reads.
type warnLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *warnLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// lines returns the WARN lines whose message starts with prefix.
func (w *warnLog) lines(prefix string) []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(w.buf.String()), "\n") {
		var m map[string]any
		if l == "" || json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		if m["level"] == "WARN" && strings.HasPrefix(m["msg"].(string), prefix) {
			out = append(out, m)
		}
	}
	return out
}

// TestRefusalsLogged: SIP TLS handshake refusals are logged at WARN, at
// most one line every 10 s (the injected clock), the line telling the
// refusals since the last one by reason and the source refused most.
func TestRefusalsLogged(t *testing.T) {
	gate := tlsedge.NewHandshakeLimiter(8, 0) // a source's share: 1
	w := &warnLog{}
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	srv, cli := testTLS(t)
	b1 := newUAS(t, "b1")
	s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), clock: clock,
		log: slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})),
		mut: func(c *Config) {
			c.TLSListen, c.TLSConfig = "127.0.0.1:0", srv
			c.Handshakes, c.HandshakeTimeout = gate, time.Minute
		}})
	hello := clientHello(t, cli)
	held := dialFrom(t, "127.0.0.1", s.TLSAddr())
	held.Write(hello) // takes 127.0.0.1's one place and keeps it
	eventually(t, "the first hello's handshake under way", func() bool { return gate.Stats().InFlight == 1 })
	refuse := func(n uint64) {
		t.Helper()
		c := dialFrom(t, "127.0.0.1", s.TLSAddr())
		c.Write(hello)
		eventually(t, fmt.Sprintf("refusal %d", n), func() bool { return s.metrics.HandshakesRefused.Load() == n })
	}
	const msg = "sip handshakes refused"
	refuse(1)
	refuse(2)
	if got := w.lines(msg); len(got) != 1 || got[0]["source"] != 1.0 || got[0]["in_flight"] != 0.0 || got[0]["top_source"] != "127.0.0.1" {
		t.Fatalf("after 2 refusals within 10 s: %v; want one line, source=1, top_source=127.0.0.1", got)
	}
	clock.Advance(tlsedge.RefusalLogEvery)
	refuse(3)
	got := w.lines(msg)
	if len(got) != 2 || got[1]["source"] != 2.0 || got[1]["rate"] != 0.0 || got[1]["top_source_refusals"] != 2.0 {
		t.Fatalf("10 s later: %v; want a second line, source=2 (the refusals since the first), top_source_refusals=2", got)
	}
}
