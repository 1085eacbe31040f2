package sip

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
	"github.com/gobwas/ws"
	"github.com/prometheus/client_golang/prometheus"
)

const testSDP = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"

// TestTLSCall: a Go TLS UA calls through sluice to a UDP backend:
// INVITE/180/200/ACK/BYE/200 over one TLS connection, the answers back on
// it, the in-dialog requests at the INVITE's backend.
func TestTLSCall(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, nil)
	c := dialTLS(t, s, cli)
	la := c.conn.LocalAddr().String()
	// sip: URIs: a sips: request is not forwarded to a UDP backend
	// without -sip-allow-sips-downgrade (480).
	inv := fmt.Sprintf("INVITE sip:svc@sip.test SIP/2.0\r\nVia: SIP/2.0/TLS %s;branch=z9hG4bK-tls-1\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=ta\r\nTo: <sip:svc@test>\r\nCall-ID: tls-1@test\r\nCSeq: 1 INVITE\r\nContact: <sip:a@%s;transport=tls>\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s", la, la, len(testSDP), testSDP)
	c.write(inv[:50]) // across TLS records
	c.write(inv[50:])
	c.response(180)
	ok := c.response(200)
	tag, _ := ok.To().Params.Get("tag")
	routes := ""
	rrs := ok.GetHeaders("Record-Route")
	for i := len(rrs) - 1; i >= 0; i-- {
		routes += "Route: " + rrs[i].Value() + "\r\n"
	}
	in := func(m string, cseq int, br string) string {
		return fmt.Sprintf("%s sip:svc@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TLS %s;branch=%s\r\nMax-Forwards: 70\r\n%sFrom: <sip:a@test>;tag=ta\r\nTo: <sip:svc@test>;tag=%s\r\nCall-ID: tls-1@test\r\nCSeq: %d %s\r\nContent-Length: 0\r\n\r\n", m, la, br, routes, tag, cseq, m)
	}
	c.write(in("ACK", 1, "z9hG4bK-tls-ack") + in("BYE", 2, "z9hG4bK-tls-bye"))
	c.response(200)
	eventually(t, "ACK and BYE at the backend", func() bool {
		return b1.count(gosip.ACK, "tls-1@test") == 1 && b1.count(gosip.BYE, "tls-1@test") == 1
	})
	v := b1.find(gosip.INVITE, "tls-1@test")[0].Req.GetHeaders("Via")
	if len(v) != 2 || !strings.HasPrefix(v[1].Value(), "SIP/2.0/TLS") || !strings.Contains(v[1].Value(), "received=127.0.0.1") {
		t.Errorf("backend's Vias %v: want ours and the client's TLS Via with received", v)
	}
	// Keep-alive on TLS: CRLFCRLF answered with CRLF.
	c.write("\r\n\r\n")
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	b := make([]byte, 2)
	if _, err := c.conn.Read(b); err != nil || string(b) != "\r\n" {
		t.Errorf("keep-alive answer %q %v, want CRLF", b, err)
	}
}

// TestWSRegisterAndCall: a WebSocket client (WS and WSS) registers and
// calls through sluice to a UDP backend. Its Via names an .invalid host:
// every answer comes back on its connection (RFC 7118 §5.2).
func TestWSRegisterAndCall(t *testing.T) {
	for _, tr := range []string{"WS", "WSS"} {
		t.Run(tr, func(t *testing.T) {
			b1 := newUAS(t, "b1")
			s, cli := edgeServer(t, []*uas{b1}, nil)
			var c *wsClient
			if tr == "WS" {
				c = dialWS(t, s.WSAddr(), nil)
			} else {
				c = dialWS(t, s.WSSAddr(), cli)
			}
			id := "ws-" + tr + "@test"
			c.text(wsReq("REGISTER", tr, "reg-"+id, "z9hG4bK-reg-"+tr, 1, "", "", ""))
			c.response(200)
			c.text(wsReq("INVITE", tr, id, "z9hG4bK-inv-"+tr, 1, "", "", testSDP))
			c.response(180)
			ok := c.response(200)
			tag, _ := ok.To().Params.Get("tag")
			routes := ""
			rrs := ok.GetHeaders("Record-Route")
			for i := len(rrs) - 1; i >= 0; i-- {
				routes += "Route: " + rrs[i].Value() + "\r\n"
			}
			c.text(wsReq("ACK", tr, id, "z9hG4bK-ack-"+tr, 1, tag, routes, ""))
			c.text(wsReq("BYE", tr, id, "z9hG4bK-bye-"+tr, 2, tag, routes, ""))
			c.response(200)
			eventually(t, "ACK and BYE at the backend", func() bool {
				return b1.count(gosip.ACK, id) == 1 && b1.count(gosip.BYE, id) == 1
			})
			v := b1.find(gosip.INVITE, id)[0].Req.GetHeaders("Via")
			if len(v) != 2 || !strings.HasPrefix(v[1].Value(), "SIP/2.0/"+tr+" df7jal23ls0d.invalid") || !strings.Contains(v[1].Value(), "received=127.0.0.1") {
				t.Errorf("backend's Vias %v: want ours and the client's %s Via with received", v, tr)
			}
		})
	}
}

// TestWSFrames: what RFC 6455 lets a client send: binary frames, a
// message in fragments with a Ping between them, Ping (Pong with its
// payload), the CRLFCRLF keep-alive (CRLF), Close (echoed).
func TestWSFrames(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, nil)
	c := dialWS(t, s.WSAddr(), nil)

	c.frame(ws.OpBinary, true, []byte(crlf(wsReq("OPTIONS", "WS", "bin@test", "z9hG4bK-bin", 1, "", "", ""))))
	c.response(200)

	msg := []byte(crlf(wsReq("OPTIONS", "WS", "frag@test", "z9hG4bK-frag", 1, "", "", "")))
	c.frame(ws.OpText, false, msg[:10])
	c.frame(ws.OpPing, true, []byte("mid"))
	c.frame(ws.OpContinuation, false, msg[10:100])
	c.frame(ws.OpContinuation, true, msg[100:])
	f, err := c.read()
	if err != nil || f.Header.OpCode != ws.OpPong || string(f.Payload) != "mid" {
		t.Fatalf("answer to a Ping between fragments: %v %q %v, want Pong mid", f.Header.OpCode, f.Payload, err)
	}
	c.response(200)
	if b1.count(gosip.OPTIONS, "frag@test") != 1 || b1.count(gosip.OPTIONS, "bin@test") != 1 {
		t.Errorf("backend got %d fragmented, %d binary OPTIONS, want 1 each", b1.count(gosip.OPTIONS, "frag@test"), b1.count(gosip.OPTIONS, "bin@test"))
	}

	c.frame(ws.OpText, true, []byte("\r\n\r\n"))
	f, err = c.read()
	if err != nil || !f.Header.OpCode.IsData() || string(f.Payload) != "\r\n" {
		t.Fatalf("keep-alive answer %v %q %v, want CRLF", f.Header.OpCode, f.Payload, err)
	}

	c.frame(ws.OpClose, true, ws.NewCloseFrameBody(ws.StatusGoingAway, "bye"))
	if code := c.closeCode(); code != int(ws.StatusGoingAway) {
		t.Errorf("Close echoed with %d, want %d", code, ws.StatusGoingAway)
	}
	if _, err := c.read(); err == nil {
		t.Errorf("connection still open after Close")
	}
}

// TestWSRefusedFrames: frames the server must not take end the
// connection with the right status: over -sip-max-message in one frame or
// in fragments (1009), unmasked (1002), a continuation with nothing to
// continue (1002), a new message inside a fragmented one (1002).
func TestWSRefusedFrames(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, func(c *Config) { c.MaxMessage = 2048; c.TCPPartialBudget = 1 << 20 })
	big := bytes.Repeat([]byte("x"), 3000)
	for _, tc := range []struct {
		name string
		send func(c *wsClient)
		want ws.StatusCode
	}{
		{"oversize", func(c *wsClient) { c.frame(ws.OpText, true, big) }, ws.StatusMessageTooBig},
		{"oversize-fragments", func(c *wsClient) {
			c.frame(ws.OpText, false, big[:1500])
			c.frame(ws.OpContinuation, true, big[1500:])
		}, ws.StatusMessageTooBig},
		{"oversize-header-only", func(c *wsClient) {
			var h [14]byte
			p := appendWSHeader(h[:0], ws.OpText, 1<<20)
			p[1] |= 0x80
			p = append(p, 1, 2, 3, 4)
			_, _ = c.conn.Write(p)
		}, ws.StatusMessageTooBig},
		{"unmasked", func(c *wsClient) {
			_ = ws.WriteFrame(c.conn, ws.NewTextFrame([]byte("OPTIONS")))
		}, ws.StatusProtocolError},
		{"lone-continuation", func(c *wsClient) { c.frame(ws.OpContinuation, true, []byte("x")) }, ws.StatusProtocolError},
		{"message-in-message", func(c *wsClient) {
			c.frame(ws.OpText, false, []byte("OPT"))
			c.frame(ws.OpText, true, []byte("IONS"))
		}, ws.StatusProtocolError},
		{"reserved-opcode", func(c *wsClient) { c.frame(ws.OpCode(3), true, []byte("x")) }, ws.StatusProtocolError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialWS(t, s.WSAddr(), nil)
			tc.send(c)
			if code := c.closeCode(); code != int(tc.want) {
				t.Errorf("closed with %d, want %d", code, tc.want)
			}
		})
	}
	if s.metrics.WSTooBig.Load() != 3 || s.metrics.WSProtocolErrors.Load() != 4 {
		t.Errorf("ws_too_big %d, ws_protocol_errors %d, want 3 and 4", s.metrics.WSTooBig.Load(), s.metrics.WSProtocolErrors.Load())
	}
}

// TestWSHandshake: the upgrade must offer sip (answered with exactly
// sip), come from an allowed Origin and ask for the configured path.
func TestWSHandshake(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.WSOrigins = []string{"https://phone.example.com"}
		c.WSPath = "/sip"
	})
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	for _, tc := range []struct {
		name, path, proto, origin string
		want                      int
	}{
		{"ok", "/sip", "sip", "https://phone.example.com", 101},
		{"ok-among-others", "/sip?x=1", "chat, sip", "https://PHONE.example.com", 101},
		{"no-sip", "/sip", "chat", "https://phone.example.com", 400},
		{"no-protocol", "/sip", "", "https://phone.example.com", 400},
		{"sip-prefix-only", "/sip", "sipx", "https://phone.example.com", 400},
		{"bad-origin", "/sip", "sip", "https://evil.example.com", 403},
		{"no-origin", "/sip", "sip", "", 403},
		{"bad-path", "/other", "sip", "https://phone.example.com", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", s.WSAddr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			req := "GET " + tc.path + " HTTP/1.1\r\nHost: sip.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " + key + "\r\nSec-WebSocket-Version: 13\r\n"
			if tc.proto != "" {
				req += "Sec-WebSocket-Protocol: " + tc.proto + "\r\n"
			}
			if tc.origin != "" {
				req += "Origin: " + tc.origin + "\r\n"
			}
			if _, err := c.Write([]byte(req + "\r\n")); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(wait))
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", res.StatusCode, tc.want)
			}
			if tc.want == 101 {
				if p := res.Header.Values("Sec-WebSocket-Protocol"); len(p) != 1 || p[0] != "sip" {
					t.Errorf("Sec-WebSocket-Protocol %q, want exactly sip", p)
				}
				if a := res.Header.Get("Sec-WebSocket-Accept"); a != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
					t.Errorf("Sec-WebSocket-Accept %q (RFC 6455 §1.3's example)", a)
				}
			}
		})
	}
}

// TestHandshakeSlow: a client that trickles its handshake (TLS, WS, WSS)
// is closed at the handshake timeout, however many bytes it sends.
func TestHandshakeSlow(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, func(c *Config) { c.HandshakeTimeout = 300 * time.Millisecond })
	for _, tc := range []struct {
		name string
		addr net.Addr
		data string
	}{
		{"tls", s.TLSAddr(), "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"},
		{"ws", s.WSAddr(), "GET / HTTP/1.1\r\nHost: sip.test\r\n"},
		{"wss", s.WSSAddr(), "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := s.metrics.HandshakeTimeouts.Load()
			c, err := net.Dial("tcp", tc.addr.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// One byte at a time until the server closes: it must do so
			// long before the client runs out of bytes.
			closedByServer := false
			for i := 0; i < 400 && !closedByServer; i++ {
				if _, err := c.Write([]byte{tc.data[i%len(tc.data)]}); err != nil {
					closedByServer = true
				}
				_ = c.SetReadDeadline(time.Now().Add(25 * time.Millisecond))
				if _, err := c.Read(make([]byte, 256)); err != nil {
					if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
						closedByServer = true
					}
				}
			}
			if !closedByServer {
				t.Fatalf("server still holds a handshake trickled for 10 s")
			}
			if s.metrics.HandshakeTimeouts.Load() != before+1 {
				t.Errorf("handshake_timeouts %d, want %d", s.metrics.HandshakeTimeouts.Load(), before+1)
			}
		})
	}
}

// TestHandshakeFlood: with the gate at 2 handshakes, two stalled
// handshakes (a ClientHello, then nothing) hold it and every further
// connection is closed without a handshake (a TLS one once its hello came,
// a WebSocket one once its upgrade request head came), while a TLS and a
// WSS client set up before keep working.
func TestHandshakeFlood(t *testing.T) {
	b1 := newUAS(t, "b1")
	gate := &testGate{max: 2}
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) { c.Handshakes = gate })
	tc := dialTLS(t, s, cli)
	wc := dialWS(t, s.WSSAddr(), cli)
	la := tc.conn.LocalAddr().String()
	opt := func(n int) string {
		return fmt.Sprintf("OPTIONS sip:svc@test SIP/2.0\r\nVia: SIP/2.0/TLS %s;branch=z9hG4bK-fl-%d\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=ta\r\nTo: <sip:svc@test>\r\nCall-ID: flood-%d@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n", la, n, n)
	}
	eventually(t, "the two handshakes done", func() bool { return gate.inFlight.Load() == 0 })
	var stalled []net.Conn
	hello := clientHello(t, cli)
	for _, a := range []net.Addr{s.TLSAddr(), s.WSSAddr()} {
		c, err := net.Dial("tcp", a.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(hello)
		stalled = append(stalled, c)
	}
	eventually(t, "the gate held by two stalled handshakes", func() bool { return gate.inFlight.Load() == 2 })
	const flood = 20
	for i := range flood {
		a := s.TLSAddr()
		if i%2 == 1 {
			a = s.WSAddr()
		}
		c, err := net.Dial("tcp", a.String())
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			c.Write(hello)
		} else {
			c.Write([]byte(wsUpgradeHead))
		}
		if !closed(&tcpClient{t: t, conn: c}) {
			t.Fatalf("connection %d not closed with the gate full", i)
		}
		c.Close()
	}
	if n := s.metrics.HandshakesRefused.Load(); n != flood {
		t.Errorf("handshakes_refused %d, want %d", n, flood)
	}
	tc.write(opt(1))
	tc.response(200)
	wc.text(wsReq("OPTIONS", "WSS", "flood-ws@test", "z9hG4bK-flood-ws", 1, "", "", ""))
	wc.response(200)
	for _, c := range stalled {
		c.Close()
	}
	eventually(t, "the gate free", func() bool { return gate.inFlight.Load() == 0 })
	dialTLS(t, s, cli) // a handshake again
}

// TestFlowSend: every accepted connection has a flow id under which a
// message reaches that connection in its protocol; once it is closed the
// flow is gone.
func TestFlowSend(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, nil)
	wc := dialWS(t, s.WSSAddr(), cli)
	tc := dialTLS(t, s, cli)
	pc := dialTCP(t, s)
	msg := "OPTIONS sip:alice@df7jal23ls0d.invalid;transport=ws SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5999;branch=z9hG4bK-flow\r\nMax-Forwards: 70\r\nFrom: <sip:b@test>;tag=tb\r\nTo: <sip:alice@test>\r\nCall-ID: flow@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
	idOf := func(c net.Conn) uint64 {
		var id uint64
		eventually(t, "the connection in the table", func() bool {
			a := c.LocalAddr().(*net.TCPAddr).AddrPort()
			if tcc := s.tcp.get(a); tcc != nil && tcc.ready.Load() || tcc != nil && tcc.kind == kindTCP {
				id = tcc.fid
			}
			return id != 0
		})
		return id
	}
	wid, tid, pid := idOf(wc.conn), idOf(tc.conn), idOf(pc.conn)
	if got := connGauges(t, s); got != "tcp=1 tls=1 ws=0 wss=1" {
		t.Errorf("sluice_frontend_connections %s, want tcp=1 tls=1 ws=0 wss=1", got)
	}
	if wid == tid || tid == pid || wid == pid {
		t.Fatalf("flow ids %d %d %d not distinct", wid, tid, pid)
	}
	for _, id := range []uint64{wid, tid, pid} {
		if err := s.flowSend(id, []byte(msg)); err != nil {
			t.Fatalf("flowSend(%d): %v", id, err)
		}
	}
	f, err := wc.read()
	if err != nil || f.Header.OpCode != ws.OpText || string(f.Payload) != msg {
		t.Errorf("WSS flow got %v %q %v", f.Header.OpCode, f.Payload, err)
	}
	for _, c := range []*tcpClient{tc, pc} {
		m, err := c.next()
		if req, ok := m.(*gosip.Request); err != nil || !ok || req.CallID().Value() != "flow@test" {
			t.Errorf("stream flow got %v %v", m, err)
		}
	}
	wc.conn.Close()
	eventually(t, "the flow gone", func() bool { return s.flowSend(wid, []byte(msg)) == errFlowGone })
	if got := connGauges(t, s); got != "tcp=1 tls=1 ws=0 wss=0" {
		t.Errorf("sluice_frontend_connections %s after the WSS client left", got)
	}
	if err := s.flowSend(1<<60, []byte(msg)); err != errFlowGone {
		t.Errorf("flowSend of an unknown id: %v, want errFlowGone", err)
	}
}

// TestWSDrain: while draining, a WebSocket client's in-dialog requests
// still pass on its connection; new work gets 503.
func TestWSDrain(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, nil)
	c := dialWS(t, s.WSAddr(), nil)
	c.text(wsReq("INVITE", "WS", "drain@test", "z9hG4bK-dr-inv", 1, "", "", testSDP))
	c.response(180)
	ok := c.response(200)
	tag, _ := ok.To().Params.Get("tag")
	routes := ""
	rrs := ok.GetHeaders("Record-Route")
	for i := len(rrs) - 1; i >= 0; i-- {
		routes += "Route: " + rrs[i].Value() + "\r\n"
	}
	s.Drain()
	c.text(wsReq("INVITE", "WS", "drain-new@test", "z9hG4bK-dr-new", 1, "", "", testSDP))
	c.response(503)
	c.text(wsReq("ACK", "WS", "drain@test", "z9hG4bK-dr-ack", 1, tag, routes, ""))
	c.text(wsReq("BYE", "WS", "drain@test", "z9hG4bK-dr-bye", 2, tag, routes, ""))
	c.response(200)
}

// TestWSHeaderVectors: the frame header parser and writer against golden
// vectors and gobwas/ws.
func TestWSHeaderVectors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want wsFrame
		n    int
		err  bool
	}{
		{"short", []byte{0x81}, wsFrame{}, 0, false},
		{"text-5-masked", []byte{0x81, 0x85, 1, 2, 3, 4}, wsFrame{fin: true, op: ws.OpText, masked: true, mask: [4]byte{1, 2, 3, 4}, length: 5}, 6, false},
		{"mask-incomplete", []byte{0x81, 0x85, 1, 2, 3}, wsFrame{}, 0, false},
		{"binary-126", []byte{0x02, 0xfe, 0x01, 0x00, 9, 9, 9, 9}, wsFrame{op: ws.OpBinary, masked: true, mask: [4]byte{9, 9, 9, 9}, length: 256}, 8, false},
		{"len-64", []byte{0x80, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0}, wsFrame{fin: true, op: ws.OpContinuation, length: 65536}, 10, false},
		{"len-64-top-bit", []byte{0x80, 0x7f, 0x80, 0, 0, 0, 0, 1, 0, 0}, wsFrame{}, 0, true},
		{"rsv1", []byte{0xc1, 0x80, 0, 0, 0, 0}, wsFrame{}, 0, true},
		{"reserved-op", []byte{0x8b, 0x80, 0, 0, 0, 0}, wsFrame{}, 0, true},
		{"ping-fragmented", []byte{0x09, 0x80, 0, 0, 0, 0}, wsFrame{}, 0, true},
		{"ping-126", []byte{0x89, 0xfe, 0, 126, 0, 0, 0, 0}, wsFrame{}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, n, err := parseWSHeader(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			if tc.err {
				return
			}
			if n != tc.n || n > 0 && f != tc.want {
				t.Errorf("got %+v (%d bytes), want %+v (%d)", f, n, tc.want, tc.n)
			}
		})
	}
	for _, size := range []int{0, 5, 125, 126, 65535, 65536, 1 << 20} {
		var got bytes.Buffer
		got.Write(appendWSHeader(nil, ws.OpText, size))
		var want bytes.Buffer
		if err := ws.WriteHeader(&want, ws.Header{Fin: true, OpCode: ws.OpText, Length: int64(size)}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("header of %d bytes % x, gobwas writes % x", size, got.Bytes(), want.Bytes())
		}
		h, err := ws.ReadHeader(bytes.NewReader(got.Bytes()))
		if err != nil || h.Length != int64(size) || !h.Fin || h.OpCode != ws.OpText {
			t.Errorf("gobwas reads our header of %d as %+v %v", size, h, err)
		}
	}
}

// TestEdgeConfig: the edge fields are checked with the field named.
func TestEdgeConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mut   func(*Config)
		field string
	}{
		{"tls-without-cert", func(c *Config) { c.TLSListen = ":5061" }, "TLSListen"},
		{"wss-without-cert", func(c *Config) { c.WSSListen = ":443" }, "WSSListen"},
		{"bad-port", func(c *Config) { c.WSListen = "127.0.0.1:99999" }, "WSListen"},
		{"no-port", func(c *Config) { c.WSListen = "127.0.0.1" }, "WSListen"},
		{"short-handshake", func(c *Config) { c.HandshakeTimeout = time.Millisecond }, "HandshakeTimeout"},
		{"relative-path", func(c *Config) { c.WSPath = "sip" }, "WSPath"},
		{"origin-without-scheme", func(c *Config) { c.WSOrigins = []string{"phone.example.com"} }, "WSOrigins"},
		{"origin-with-path", func(c *Config) { c.WSOrigins = []string{"https://phone.example.com/x"} }, "WSOrigins"},
		{"ws-alone-ok", func(c *Config) { c.WSListen = ":8080"; c.WSOrigins = []string{"https://a.example:8443"} }, ""},
		{"tls-ok", func(c *Config) { c.TLSListen = ":5061"; c.TLSConfig = &tls.Config{} }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mut(&c)
			err := CheckSettings(c)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			fe, ok := err.(*FieldError)
			if !ok || fe.Field != tc.field {
				t.Fatalf("error %v, want one naming %s", err, tc.field)
			}
		})
	}
}

// TestTLSBackend: a UDP client's call to a backend reached over TLS
// (transport=tls): its certificate is verified against ca= for sni=, our
// Via names TLS, and a backend whose certificate is not valid for the
// name gets nothing.
func TestTLSBackend(t *testing.T) {
	srv, _ := testTLS(t)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificates[0].Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	be := newTCPUASOn(t, ln)
	for _, tc := range []struct {
		name string
		sni  string
		ok   bool
	}{
		{"verified", "sip.test", true},
		{"wrong-name", "other.test", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testServer(t, nil, nil, func(c *Config) {
				c.Backends = []BackendConfig{{ID: "tls1", Addr: be.addr, Transport: "tls", CAFile: ca, SNI: tc.sni, Weight: 1}}
				c.TLSListen, c.TLSConfig = "127.0.0.1:0", srv
			})
			if tc.ok {
				eventually(t, "connection to the backend", func() bool { return s.tcp.len() == 1 })
			}
			c := newUAC(t, s.udpAddr())
			k := c.newCall()
			k.invite("")
			if !tc.ok {
				eventually(t, "the handshake refused", func() bool { return s.metrics.BackendTLSFailures.Load() > 0 })
				if n := s.tcp.len(); n != 0 {
					t.Errorf("%d connections kept to a backend whose certificate is not valid for %s", n, tc.sni)
				}
				return
			}
			c.recvResponse(180)
			ok := c.recvResponse(200)
			k.learn(ok)
			k.inDialog("ACK", 1, k.branch+"-ack")
			k.inDialog("BYE", 2, k.branch+"-bye")
			c.recvResponse(200)
			var got []string
			for len(got) < 3 {
				select {
				case m := <-be.got:
					got = append(got, m)
				case <-time.After(wait):
					t.Fatalf("backend got %v", got)
				}
			}
			if strings.Join(got, ",") != "INVITE,ACK,BYE" {
				t.Errorf("backend got %v", got)
			}
			if s.metrics.BackendTLSFailures.Load() != 0 {
				t.Errorf("backend_tls_failures %d", s.metrics.BackendTLSFailures.Load())
			}
		})
	}
	if _, err := ParseBackend(be.addr + ",transport=tls,ca=" + ca + ",sni=sip.test"); err != nil {
		t.Errorf("ParseBackend: %v", err)
	}
}

// TestWSControlFlood: Pings and keep-alives that arrive together are
// answered once (the Pong carries the last Ping's payload), so a flood of
// them costs a write per read rather than per frame; the answers precede
// those of the message after them.
func TestWSControlFlood(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, nil)
	c := dialWS(t, s.WSAddr(), nil)
	var burst bytes.Buffer
	for i := range 50 {
		_ = ws.WriteFrame(&burst, ws.MaskFrame(ws.NewPingFrame([]byte(fmt.Sprintf("p%02d", i)))))
		_ = ws.WriteFrame(&burst, ws.MaskFrame(ws.NewTextFrame([]byte("\r\n\r\n"))))
	}
	_ = ws.WriteFrame(&burst, ws.MaskFrame(ws.NewTextFrame([]byte(crlf(wsReq("OPTIONS", "WS", "flood@test", "z9hG4bK-cf", 1, "", "", ""))))))
	if _, err := c.conn.Write(burst.Bytes()); err != nil {
		t.Fatal(err)
	}
	pongs, crlfs, last := 0, 0, ""
	for {
		f, err := c.read()
		if err != nil {
			t.Fatal(err)
		}
		if f.Header.OpCode == ws.OpPong {
			pongs++
			last = string(f.Payload)
			continue
		}
		if string(f.Payload) == "\r\n" {
			crlfs++
			continue
		}
		if !strings.HasPrefix(string(f.Payload), "SIP/2.0 200") {
			t.Fatalf("unexpected frame %q", f.Payload)
		}
		break
	}
	if pongs < 1 || pongs > 5 || crlfs < 1 || crlfs > 5 || last != "p49" {
		t.Errorf("%d Pongs (last %q), %d CRLFs for 50 Pings and 50 keep-alives: want a few, the last Pong p49", pongs, last, crlfs)
	}
	if n := s.metrics.TCPKeepAlives.Load(); n != 50 {
		t.Errorf("tcp_keepalives %d, want 50", n)
	}
}

// connGauges is sluice_frontend_connections by transport, in order.
func connGauges(t *testing.T, s *Server) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		if f.GetName() != "sluice_frontend_connections" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "transport" {
					out = append(out, fmt.Sprintf("%s=%g", l.GetValue(), m.GetGauge().GetValue()))
				}
			}
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// TestTLSPartialRecordTimed: part of a TLS record between messages starts
// the message timeout, not the idle one: the session buffers the record
// (up to 16 KiB, outside the partial-message budget) until it is whole.
func TestTLSPartialRecordTimed(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, cli := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.TCPIdleTimeout = time.Hour
		c.TCPMessageTimeout = 300 * time.Millisecond
	})
	raw, err := net.Dial("tcp", s.TLSAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := tls.Client(raw, cli)
	tc := &tcpClient{t: t, conn: c}
	tc.write(strings.Replace(optionsTo(s, raw.LocalAddr(), "rec"), "Max-Forwards: 70", "Max-Forwards: 0", 1))
	tc.response(200)
	// A record header announcing 16 KiB, and 100 bytes of it.
	if _, err := raw.Write(append([]byte{0x17, 0x03, 0x03, 0x40, 0x00}, make([]byte, 100)...)); err != nil {
		t.Fatal(err)
	}
	if !closed(&tcpClient{t: t, conn: raw}) {
		t.Fatal("connection holding part of a record kept past the message timeout")
	}
	if n := s.metrics.TCPSlow.Load(); n != 1 {
		t.Errorf("tcp_slow_closed %d, want 1", n)
	}
}

// TestWSSFlowIncomingCall: a WSS client's REGISTER reaches the registrar
// with a Path whose flow token names its connection (listener WSS); an
// INVITE the registrar sends along it reaches the client in a WebSocket
// frame, the client's 200 goes back; once the client is gone, 430.
func TestWSSFlowIncomingCall(t *testing.T) {
	srv, cli := testTLS(t)
	s, reg := flowServer(t, func(c *Config) {
		c.WSSListen = "127.0.0.1:0"
		c.TLSConfig = srv
	})
	c := dialWS(t, s.WSSAddr(), cli)
	c.text("REGISTER sip:test SIP/2.0\nVia: SIP/2.0/WSS k3l2.invalid;branch=z9hG4bK-wreg\nMax-Forwards: 70\nFrom: <sip:alice@test>;tag=r1\nTo: <sip:alice@test>\nCall-ID: wreg@test\nCSeq: 1 REGISTER\nSupported: path, outbound\nContact: <sip:alice@k3l2.invalid;transport=ws;ob>;+sip.instance=\"<urn:uuid:2>\";reg-id=1\nExpires: 60\nContent-Length: 0\n\n")
	req := reg.register(t)
	c.response(200)
	p := pathOf(t, req)
	ref, ok := s.flowSign.decode(p.User)
	if !ok || ref.listener != uint8(kindWSS) || s.flows.lookup(ref, s.flowNode()) == nil {
		t.Fatalf("Path %s: want a flow token of the WSS listener naming the client's connection (%+v)", p.String(), ref)
	}
	reg.send(s, incomingInvite(reg, "sip:alice@k3l2.invalid;transport=ws", "<"+p.String()+">", "win-1@test"))
	var inv *gosip.Request
	for inv == nil {
		f, err := c.read()
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		if m, err := gosip.ParseMessage(f.Payload); err == nil {
			inv, _ = m.(*gosip.Request)
		}
	}
	if inv.Method != gosip.INVITE || inv.CallID().Value() != "win-1@test" || inv.Via().Transport != "WSS" {
		t.Fatalf("client got %s %s, top Via %s", inv.Method, inv.CallID().Value(), inv.Via().Value())
	}
	// Our Record-Routes: the client-facing one names the WSS listener
	// (its bound address by default), the backend-facing one
	// -sip-advertise.
	var rrs []string
	for _, h := range inv.GetHeaders("Record-Route") {
		rrs = append(rrs, rrShape(t, h.Value()))
	}
	if want := []string{"<sip:FLOW@" + s.WSSAddr().String() + ";lr;transport=wss;sl=TOKEN>", "<sip:" + s.adv.String() + ";lr;sl=TOKEN>"}; strings.Join(rrs, ",") != strings.Join(want, ",") {
		t.Errorf("Record-Routes to the client %v, want %v", rrs, want)
	}
	if v := inv.Via(); v.Host+":"+strconv.Itoa(v.Port) != s.WSSAddr().String() {
		t.Errorf("our Via %s: want the WSS listener's address", v.Value())
	}
	res := gosip.NewResponseFromRequest(inv, 200, "OK", nil)
	res.To().Params.Add("tag", "callee")
	c.text(res.String())
	reg.response(200)

	c.conn.Close()
	eventually(t, "flow removed", func() bool { return s.flows.Len() == 0 })
	reg.send(s, incomingInvite(reg, "sip:alice@k3l2.invalid;transport=ws", "<"+p.String()+">", "win-2@test"))
	reg.response(430)
}
