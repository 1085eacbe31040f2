package sip

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/tlsedge"
)

// wsUpgradeHead is a whole WebSocket upgrade request head offering sip,
// blank line included (RFC 6455 §1.3's key).
const wsUpgradeHead = "GET / HTTP/1.1\r\nHost: sip.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
	"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: sip\r\n\r\n"

// upgradeStatus reads the answer to an upgrade request on c: its status,
// or an error when c closed without one.
func upgradeStatus(t *testing.T, c net.Conn) (int, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(wait))
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	res.Body.Close()
	return res.StatusCode, nil
}

// TestHalfWSHeadsHoldNoPlace: 300 plain WebSocket connections from 8
// addresses that each sent half an upgrade request head (and nothing
// more, within the per-source cap) hold no place of a 256-place gate: a
// WebSocket client at another address gets its upgrade, and a SIP TLS
// phone there its handshake. Taken when the reader started, the places
// were theirs (8 sources × their share of 32) and both were closed
// without a handshake.
func TestHalfWSHeadsHoldNoPlace(t *testing.T) {
	gate := tlsedge.NewHandshakeLimiter(256, 0)
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.Handshakes = gate
		c.HandshakeTimeout = time.Minute
	})
	half := wsUpgradeHead[:len(wsUpgradeHead)/2]
	const n = 300
	for i := range n {
		c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 2+i%8), s.WSAddr())
		if _, err := c.Write([]byte(half)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the half heads' connections accepted (or refused a place and closed)", func() bool {
		return s.tcp.len()+int(s.metrics.HandshakesRefused.Load()) == n
	})

	c := dialFrom(t, "127.0.0.200", s.WSAddr())
	if _, err := c.Write([]byte(wsUpgradeHead)); err != nil {
		t.Fatal(err)
	}
	if code, err := upgradeStatus(t, c); code != http.StatusSwitchingProtocols {
		st := gate.Stats()
		t.Fatalf("a WebSocket client at another address: %d %v; want 101 (in flight %d, refused %d)", code, err, st.InFlight, st.RefusedBusy)
	}
	p := dialFrom(t, "127.0.0.200", s.TLSAddr())
	p.SetDeadline(time.Now().Add(wait))
	if err := tls.Client(p, cli).Handshake(); err != nil {
		st := gate.Stats()
		t.Fatalf("a TLS phone at another address: %v (in flight %d, refused %d)", err, st.InFlight, st.RefusedBusy)
	}
	st := gate.Stats()
	if st.Started != 2 || st.RefusedBusy != 0 || st.RefusedSource != 0 || s.metrics.HandshakesRefused.Load() != 0 {
		t.Errorf("started %d, refused %d+%d/%d: want 2 and 0 (the half heads never asked)", st.Started, st.RefusedBusy, st.RefusedSource, s.metrics.HandshakesRefused.Load())
	}
	if s.tcp.len() != n+2 {
		t.Errorf("%d connections in the table, want %d: the half heads stay open until the handshake deadline", s.tcp.len(), n+2)
	}
}

// TestWSHalfHeadClosedAtDeadline: a plain WebSocket connection whose
// upgrade request head has not reached its blank line at the handshake
// deadline is closed, counted as a handshake timeout, and never asks the
// gate. The deadline is made past on the server's side of the
// connection, as the handshake timeout would; it is set again until the
// reader waits under it, since the reader sets the handshake's own at
// its start.
func TestWSHalfHeadClosedAtDeadline(t *testing.T) {
	gate := tlsedge.NewHandshakeLimiter(256, 0)
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.Handshakes = gate
		c.HandshakeTimeout = time.Minute
	})
	c := dialFrom(t, "127.0.0.1", s.WSAddr())
	if _, err := c.Write([]byte(wsUpgradeHead[:len(wsUpgradeHead)-2])); err != nil { // all but the blank line
		t.Fatal(err)
	}
	la := c.LocalAddr().(*net.TCPAddr).AddrPort()
	var tc *tcpConn
	eventually(t, "the connection in the table", func() bool { tc = s.tcp.get(la); return tc != nil })
	eventually(t, "the timeout counted", func() bool {
		tc.c.SetReadDeadline(time.Unix(1, 0))
		return s.metrics.HandshakeTimeouts.Load() == 1
	})
	c.SetReadDeadline(time.Now().Add(wait))
	if n, err := io.Copy(io.Discard, c); n != 0 || isTimeout(err) {
		t.Fatalf("half a head past the handshake deadline: %d bytes back, %v; want closed without an answer", n, err)
	}
	eventually(t, "the connection out of the table", func() bool { return s.tcp.get(la) == nil })
	if st := gate.Stats(); st.Started != 0 || st.InFlight != 0 || st.RefusedBusy+st.RefusedSource != 0 || s.metrics.HandshakesRefused.Load() != 0 {
		t.Errorf("gate asked: started %d, in flight %d, refused %d+%d/%d; want none", st.Started, st.InFlight, st.RefusedBusy, st.RefusedSource, s.metrics.HandshakesRefused.Load())
	}
}

// TestWSRefusedAfterHead: with the gate's one place held by a SIP TLS
// handshake from 127.0.0.1, a plain WebSocket whose head is whole is
// refused, closed without an answer, counted in HandshakesRefused and
// logged with its reason as the TLS path's are (source: 127.0.0.1 has its
// share; in_flight: another address, the gate full); one that has sent
// half its head meanwhile has asked nothing, and once the place is free
// the rest of its head gets it its upgrade.
func TestWSRefusedAfterHead(t *testing.T) {
	for _, tc := range []struct {
		from, reason, other string
	}{
		{"127.0.0.1", "source", "in_flight"},
		{"127.0.0.2", "in_flight", "source"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			gate := tlsedge.NewHandshakeLimiter(1, 0) // one place, a source's share: 1
			w := &warnLog{}
			clock := &admission.ManualClock{}
			clock.Set(int64(time.Hour))
			srv, cli := testTLS(t)
			b1 := newUAS(t, "b1")
			s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), clock: clock,
				log: slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})),
				mut: func(c *Config) {
					c.TLSListen, c.WSListen, c.TLSConfig = "127.0.0.1:0", "127.0.0.1:0", srv
					c.Handshakes, c.HandshakeTimeout = gate, time.Minute
				}})
			holder := dialFrom(t, "127.0.0.1", s.TLSAddr())
			holder.Write(clientHello(t, cli)) // takes the place, then stalls
			eventually(t, "the TLS handshake under way", func() bool { return gate.Stats().InFlight == 1 })

			half := dialFrom(t, tc.from, s.WSAddr())
			half.Write([]byte(wsUpgradeHead[:len(wsUpgradeHead)/2]))
			whole := dialFrom(t, tc.from, s.WSAddr())
			whole.Write([]byte(wsUpgradeHead))
			eventually(t, "the whole head refused", func() bool { return s.metrics.HandshakesRefused.Load() >= 1 })
			whole.SetReadDeadline(time.Now().Add(wait))
			if n, err := io.Copy(io.Discard, whole); n != 0 || isTimeout(err) {
				t.Fatalf("refused head: %d bytes back, %v; want closed without an answer", n, err)
			}
			got := w.lines("sip handshakes refused")
			if len(got) != 1 || got[0][tc.reason] != 1.0 || got[0][tc.other] != 0.0 || got[0]["top_source"] != tc.from {
				t.Fatalf("WARN lines %v; want one, %s=1, %s=0, top_source=%s", got, tc.reason, tc.other, tc.from)
			}

			holder.Close()
			eventually(t, "the place free", func() bool { return gate.Stats().InFlight == 0 })
			half.Write([]byte(wsUpgradeHead[len(wsUpgradeHead)/2:]))
			if code, err := upgradeStatus(t, half); code != http.StatusSwitchingProtocols {
				t.Fatalf("the half head completed with the place free: %d %v; want 101 (it asked for none while half)", code, err)
			}
			st := gate.Stats()
			if n := s.metrics.HandshakesRefused.Load(); n != 1 || st.RefusedBusy+st.RefusedSource != 1 || st.Started != 2 {
				t.Errorf("refused %d (gate %d+%d), started %d; want 1 refusal (the whole head) and 2 started (the TLS hello, the completed head)", n, st.RefusedBusy, st.RefusedSource, st.Started)
			}
		})
	}
}
