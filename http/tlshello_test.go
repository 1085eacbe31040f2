package http

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/tlsedge"
)

// dialFrom dials addr from the loopback address from.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestHTTPSHalfHellosHoldNoPlace: 300 connections from 8 addresses that
// each sent half a ClientHello (a trickle that never ends, within every
// connection limit) hold no place of a 256-place gate: a client from
// another address gets its handshake. Taken at accept, the places were
// theirs (8 sources × their share of 32) and the client was refused. The
// same behind a PROXY balancer, the sources being those its headers name.
func TestHTTPSHalfHellosHoldNoPlace(t *testing.T) {
	for _, proxied := range []bool{false, true} {
		t.Run(fmt.Sprintf("proxied=%v", proxied), func(t *testing.T) {
			onEngines(t, func(t *testing.T) {
				gate := tlsedge.NewHandshakeLimiter(256, 0)
				cfg := Config{Handshakes: gate, HandshakeTimeout: time.Minute}
				if proxied {
					cfg.ProxyFrom = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
				}
				r := newRig(t, rigOpts{backends: 1, tls: true, cfg: cfg})
				hello := clientHello(t)
				half := hello[:len(hello)/2]
				for i := range 300 {
					c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i%8), r.addr)
					if proxied {
						fmt.Fprintf(c, "PROXY TCP4 10.0.%d.1 127.0.0.1 40000 443\r\n", i%8)
					}
					if _, err := c.Write(half); err != nil {
						t.Fatal(err)
					}
				}
				c := dialFrom(t, "127.0.0.200", r.addr)
				if proxied {
					fmt.Fprintf(c, "PROXY TCP4 10.9.9.9 127.0.0.1 40000 443\r\n")
				}
				c.SetDeadline(time.Now().Add(10 * time.Second))
				tc := tls.Client(c, testTLS(t).client("a.example"))
				if err := tc.Handshake(); err != nil {
					st := gate.Stats()
					t.Fatalf("another source's handshake: %v (in flight %d, refused %d)", err, st.InFlight, st.RefusedBusy)
				}
				eventually(t, "the handshake's place given back", func() bool { return gate.Stats().InFlight == 0 })
				if st := gate.Stats(); st.Started != 1 || st.RefusedBusy != 0 || r.srv.Stats().HandshakeRefused.Load() != 0 {
					t.Errorf("started %d, refused %d/%d: want 1 and 0 (the half hellos never asked)", st.Started, st.RefusedBusy, r.srv.Stats().HandshakeRefused.Load())
				}
			})
		})
	}
}

// TestHTTPSHelloNotInTimeClosed: a connection whose ClientHello is not
// whole at the handshake deadline (set at accept; already past here) is
// closed, counted as a failed handshake, and never takes a place.
func TestHTTPSHelloNotInTimeClosed(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		gate := &countingGate{max: 4}
		r := newRig(t, rigOpts{backends: 1, tls: true, cfg: Config{Handshakes: gate, HandshakeTimeout: time.Nanosecond}})
		hello := clientHello(t)
		c := dialFrom(t, "127.0.0.1", r.addr)
		c.Write(hello[:len(hello)/2])
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); isTimeout(err) {
			t.Fatalf("the connection with half a hello is open past the handshake deadline: %v", err)
		}
		eventually(t, "the failed handshake counted", func() bool { return r.srv.Stats().HandshakeFailed.Load() == 1 })
		if gate.acquired.Load() != 0 || gate.refused.Load() != 0 || gate.inFlight.Load() != 0 {
			t.Errorf("gate asked: acquired %d, refused %d, in flight %d; want none", gate.acquired.Load(), gate.refused.Load(), gate.inFlight.Load())
		}
	})
}

// TestHTTPSRefusedAfterHello: a whole ClientHello the gate refuses closes
// the connection without a handshake and is counted in HandshakeRefused;
// a connection that sent half a hello and went away was never asked about.
func TestHTTPSRefusedAfterHello(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		gate := &countingGate{max: 0}
		r := newRig(t, rigOpts{backends: 1, tls: true, cfg: Config{Handshakes: gate}})
		hello := clientHello(t)
		gone := dialFrom(t, "127.0.0.1", r.addr)
		gone.Write(hello[:len(hello)/2])
		gone.Close()
		eventually(t, "the half hello's end counted", func() bool { return r.srv.Stats().HandshakeFailed.Load() == 1 })
		c := dialFrom(t, "127.0.0.1", r.addr)
		c.Write(hello)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := io.Copy(io.Discard, c); n != 0 || isTimeout(err) {
			t.Fatalf("refused hello: %d bytes back, %v; want closed without an answer", n, err)
		}
		eventually(t, "the refusal counted", func() bool { return r.srv.Stats().HandshakeRefused.Load() == 1 })
		if gate.refused.Load() != 1 || gate.acquired.Load() != 0 {
			t.Errorf("gate: refused %d, acquired %d; want 1 and 0", gate.refused.Load(), gate.acquired.Load())
		}
	})
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
func (w *warnLog) lines(t *testing.T, prefix string) []map[string]any {
	t.Helper()
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

// TestHTTPSRefusalsLogged: handshake refusals are logged at WARN, at
// most one line every 10 s (the injected clock), the line telling the
// refusals since the last one by reason and the source refused most.
func TestHTTPSRefusalsLogged(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		gate := tlsedge.NewHandshakeLimiter(8, 0) // a source's share: 1
		w := &warnLog{}
		logger := slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
		r := newRig(t, rigOpts{backends: 1, tls: true, logger: logger, cfg: Config{Handshakes: gate, HandshakeTimeout: time.Minute}})
		hello := clientHello(t)
		held := dialFrom(t, "127.0.0.1", r.addr)
		held.Write(hello) // takes 127.0.0.1's one place and keeps it
		eventually(t, "the first hello's handshake under way", func() bool { return gate.Stats().InFlight == 1 })
		refuse := func(n uint64) {
			t.Helper()
			c := dialFrom(t, "127.0.0.1", r.addr)
			c.Write(hello)
			eventually(t, fmt.Sprintf("refusal %d", n), func() bool { return r.srv.Stats().HandshakeRefused.Load() == n })
		}
		const msg = "https handshakes refused"
		refuse(1)
		refuse(2)
		if got := w.lines(t, msg); len(got) != 1 || got[0]["source"] != 1.0 || got[0]["in_flight"] != 0.0 || got[0]["top_source"] != "127.0.0.1" {
			t.Fatalf("after 2 refusals within 10 s: %v; want one line, source=1, top_source=127.0.0.1", got)
		}
		r.clock.Advance(tlsedge.RefusalLogEvery)
		refuse(3)
		got := w.lines(t, msg)
		if len(got) != 2 || got[1]["source"] != 2.0 || got[1]["rate"] != 0.0 || got[1]["top_source_refusals"] != 2.0 {
			t.Fatalf("10 s later: %v; want a second line, source=2 (the refusals since the first), top_source_refusals=2", got)
		}
		if st := gate.Stats(); st.RefusedSource != 3 || st.RefusedBusy != 0 {
			t.Errorf("gate: %+v; want 3 refused by source, none by the bound", st)
		}
	})
}
