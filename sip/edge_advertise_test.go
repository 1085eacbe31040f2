package sip

import (
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	gosip "github.com/emiago/sipgo/sip"
)

// rrShape is a Record-Route or Path value with its flow token (user
// part) written FLOW and its affinity token (sl=) written TOKEN, so
// golden values can name the rest exactly.
func rrShape(t *testing.T, v string) string {
	t.Helper()
	var u gosip.Uri
	if err := gosip.ParseUri(strings.Trim(v, "<>"), &u); err != nil {
		t.Fatalf("route %q: %v", v, err)
	}
	if u.User != "" {
		u.User = "FLOW"
	}
	if _, ok := u.UriParams.Get(tokenParam); ok {
		u.UriParams.Add(tokenParam, "TOKEN")
	}
	return "<" + u.String() + ">"
}

// routeSet is the Route headers a UAC sends in-dialog after a 2xx with
// these Record-Routes (reversed, RFC 3261 §12.1.2).
func routeSet(rrs []gosip.Header) string {
	routes := ""
	for i := len(rrs) - 1; i >= 0; i-- {
		routes += "Route: " + rrs[i].Value() + "\r\n"
	}
	return routes
}

// TestEdgeAdvertiseRecordRoute: the client-facing Record-Route of a TLS,
// WS or WSS client names that listener's advertised address and
// transport (the -sip-*-advertise value, or by default its bound
// address), never -sip-advertise; the backend-facing one names
// -sip-advertise; the client's in-dialog requests with these routes are
// recognised as ours and reach the backend.
func TestEdgeAdvertiseRecordRoute(t *testing.T) {
	for _, tc := range []struct {
		name string
		tr   string
		adv  bool // set -sip-*-advertise
		want string
	}{
		{"tls-advertised", "TLS", true, "<sip:FLOW@tls.edge.test:5061;lr;transport=tls;sl=TOKEN>"},
		{"ws-advertised", "WS", true, "<sip:FLOW@ws.edge.test:8080;lr;transport=ws;sl=TOKEN>"},
		{"wss-advertised", "WSS", true, "<sip:FLOW@wss.edge.test:443;lr;transport=wss;sl=TOKEN>"},
		{"tls-bound", "TLS", false, "<sip:FLOW@127.0.0.1:PORT;lr;transport=tls;sl=TOKEN>"},
		{"ws-bound", "WS", false, "<sip:FLOW@127.0.0.1:PORT;lr;transport=ws;sl=TOKEN>"},
		{"wss-bound", "WSS", false, "<sip:FLOW@127.0.0.1:PORT;lr;transport=wss;sl=TOKEN>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b1 := newUAS(t, "b1")
			s, cli := edgeServer(t, []*uas{b1}, func(c *Config) {
				if tc.adv {
					c.TLSAdvertise, c.WSAdvertise, c.WSSAdvertise = "tls.edge.test:5061", "ws.edge.test:8080", "wss.edge.test:443"
				}
			})
			id := "adv-" + tc.name + "@test"
			var send func(string)
			var response func(int) *gosip.Response
			var ln net.Addr
			switch tc.tr {
			case "TLS":
				c := dialTLS(t, s, cli)
				send, response, ln = func(m string) { c.write(m) }, c.response, s.TLSAddr()
			case "WS":
				c := dialWS(t, s.WSAddr(), nil)
				send, response, ln = func(m string) { c.text(m) }, c.response, s.WSAddr()
			default:
				c := dialWS(t, s.WSSAddr(), cli)
				send, response, ln = func(m string) { c.text(m) }, c.response, s.WSSAddr()
			}
			want := strings.Replace(tc.want, "PORT", strconv.Itoa(ln.(*net.TCPAddr).Port), 1)
			send(wsReq("INVITE", tc.tr, id, "z9hG4bK-adv-inv", 1, "", "", testSDP))
			response(180)
			ok := response(200)
			rrs := ok.GetHeaders("Record-Route")
			if len(rrs) != 2 {
				t.Fatalf("Record-Routes %v: want two", rrs)
			}
			if got, back := rrShape(t, rrs[0].Value()), "<sip:"+s.adv.String()+";lr;sl=TOKEN>"; got != back {
				t.Errorf("backend-facing %s, want %s", got, back)
			}
			if got := rrShape(t, rrs[1].Value()); got != want {
				t.Errorf("client-facing %s, want %s", got, want)
			}
			tag, _ := ok.To().Params.Get("tag")
			routes := routeSet(rrs)
			send(wsReq("ACK", tc.tr, id, "z9hG4bK-adv-ack", 1, tag, routes, ""))
			send(wsReq("BYE", tc.tr, id, "z9hG4bK-adv-bye", 2, tag, routes, ""))
			response(200)
			eventually(t, "ACK and BYE at the backend", func() bool {
				return b1.count(gosip.ACK, id) == 1 && b1.count(gosip.BYE, id) == 1
			})
			if bye := b1.find(gosip.BYE, id)[0].Req; bye.Route() != nil {
				t.Errorf("BYE reached the backend with our Route %s: not recognised as ours", bye.Route().Value())
			}
		})
	}
}

// TestIsOursEveryListener: an entry naming any listener's advertised or
// bound address (and its port) is ours; another port or host is not.
func TestIsOursEveryListener(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.TLSAdvertise, c.WSSAdvertise = "tls.edge.test:5061", "[2001:db8::5]:443"
	})
	wsPort := s.WSAddr().(*net.TCPAddr).Port
	tlsPort := s.TLSAddr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		uri  string
		ours bool
	}{
		{"sip:" + s.adv.String() + ";lr", true},
		{"sip:TLS.edge.test:5061;transport=tls;lr", true},
		{"sip:127.0.0.1:" + strconv.Itoa(tlsPort) + ";transport=tls;lr", true}, // the TLS listener's bound address
		{"sip:127.0.0.1:" + strconv.Itoa(wsPort) + ";transport=ws;lr", true},
		{"sip:[2001:db8::5]:443;transport=wss;lr", true},
		{"sip:tls.edge.test:5062;transport=tls;lr", false},
		{"sip:other.test:5061;transport=tls;lr", false},
		{"sip:[2001:db8::6]:443;transport=wss;lr", false},
		{"sip:127.0.0.2:" + strconv.Itoa(wsPort) + ";lr", false},
	} {
		var u gosip.Uri
		if err := gosip.ParseUri(tc.uri, &u); err != nil {
			t.Fatal(err)
		}
		if got := s.isOurs(&u); got != tc.ours {
			t.Errorf("isOurs(%s) = %v, want %v", tc.uri, got, tc.ours)
		}
	}
}

// tlsBackend is a SIP backend reached over TLS (transport=tls) and the
// CA file that verifies it.
func tlsBackend(t *testing.T, srv *tls.Config) (*tcpUAS, string) {
	t.Helper()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificates[0].Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	if err != nil {
		t.Fatal(err)
	}
	return newTCPUASOn(t, ln), ca
}

// TestTLSBackendEntries: a TLS backend is record-routed, Path'ed and
// reached by its Via at the TLS listener's advertised address with
// transport=tls; a sips: INVITE goes to it (TLS on every hop), and the
// same request to a pool of UDP backends gets 480.
func TestTLSBackendEntries(t *testing.T) {
	srv, cli := testTLS(t)
	be, ca := tlsBackend(t, srv)
	s := testServer(t, nil, nil, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "tls1", Addr: be.addr, Transport: "tls", CAFile: ca, SNI: "sip.test", Weight: 1}}
		c.TLSListen, c.WSSListen, c.TLSConfig = "127.0.0.1:0", "127.0.0.1:0", srv
		c.TLSAdvertise = "tls.edge.test:5061"
	})
	eventually(t, "connection to the backend", func() bool { return s.tcp.len() == 1 })

	// A UDP client's sips: INVITE: forwarded, two Record-Routes.
	c := newUAC(t, s.udpAddr())
	c.send(fmt.Sprintf("INVITE sips:svc@sip.test SIP/2.0\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-tb-1;rport\nMax-Forwards: 70\nFrom: <sips:a@test>;tag=ta\nTo: <sips:svc@test>\nCall-ID: tb-1@test\nCSeq: 1 INVITE\nContact: <sip:a@%s>\nContent-Length: 0\n\n", c.addr, c.addr))
	c.recvResponse(180)
	c.recvResponse(200)
	inv := be.find(gosip.INVITE, "tb-1@test")
	if len(inv) != 1 {
		t.Fatalf("backend got %d INVITEs", len(inv))
	}
	rrs := inv[0].GetHeaders("Record-Route")
	var got []string
	for _, h := range rrs {
		got = append(got, rrShape(t, h.Value()))
	}
	want := []string{"<sips:tls.edge.test:5061;lr;sl=TOKEN>", "<sip:" + s.adv.String() + ";lr;sl=TOKEN>"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Record-Routes at the backend %v, want %v", got, want)
	}
	if v := inv[0].Via(); v.Transport != "TLS" || v.Host != "tls.edge.test" || v.Port != 5061 {
		t.Errorf("our Via %s: want TLS at the TLS listener's address", v.Value())
	}

	// A WSS client's REGISTER: the Path names the TLS listener.
	w := dialWS(t, s.WSSAddr(), cli)
	w.text("REGISTER sip:test SIP/2.0\r\nVia: SIP/2.0/WSS k3l2.invalid;branch=z9hG4bK-tb-reg\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=r1\r\nTo: <sip:alice@test>\r\nCall-ID: tb-reg@test\r\nCSeq: 1 REGISTER\r\nContact: <sip:alice@k3l2.invalid;transport=ws;ob>\r\nExpires: 60\r\nContent-Length: 0\r\n\r\n")
	w.response(200)
	reg := be.find(gosip.REGISTER, "tb-reg@test")
	if len(reg) != 1 || reg[0].GetHeader("Path") == nil {
		t.Fatalf("backend got %d REGISTERs, or no Path", len(reg))
	}
	if got, want := rrShape(t, reg[0].GetHeader("Path").Value()), "<sip:FLOW@tls.edge.test:5061;lr;transport=tls;ob>"; got != want {
		t.Errorf("Path %s, want %s", got, want)
	}
}

// TestSipsNewWorkNeedsTLSBackend: a sips: INVITE with only UDP backends
// gets 480 and reaches none of them.
func TestSipsNewWorkNeedsTLSBackend(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	c.send(fmt.Sprintf("INVITE sips:svc@sip.test SIP/2.0\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-sn-1;rport\nMax-Forwards: 70\nFrom: <sips:a@test>;tag=ta\nTo: <sips:svc@test>\nCall-ID: sn-1@test\nCSeq: 1 INVITE\nContact: <sip:a@%s>\nUser-Agent: a user agent string long enough for our answer to fit\nContent-Length: 0\n\n", c.addr, c.addr))
	res := c.recvResponse(480)
	if w := res.GetHeader("Warning"); w == nil || !strings.Contains(w.Value(), "sips") {
		t.Errorf("480 without a Warning naming sips: %v", w)
	}
	if b1.count(gosip.INVITE, "sn-1@test") != 0 {
		t.Errorf("sips: INVITE reached a UDP backend")
	}
}

// TestEdgeAdvertiseConfig: bad -sip-*-advertise values and a TLS
// backend without a TLS listener are refused naming the field.
func TestEdgeAdvertiseConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mut   func(*Config)
		field string
	}{
		{"tls-advertise-without-listener", func(c *Config) { c.TLSAdvertise = "edge.test:5061" }, "TLSAdvertise"},
		{"ws-advertise-no-port", func(c *Config) { c.WSListen = ":8080"; c.WSAdvertise = "edge.test" }, "WSAdvertise"},
		{"wss-advertise-port-0", func(c *Config) {
			c.WSSListen, c.TLSConfig, c.WSSAdvertise = ":443", &tls.Config{}, "edge.test:0"
		}, "WSSAdvertise"},
		{"ws-advertise-no-host", func(c *Config) { c.WSListen = ":8080"; c.WSAdvertise = ":80" }, "WSAdvertise"},
		{"tls-backend-without-listener", func(c *Config) {
			c.Backends = []BackendConfig{{ID: "t1", Addr: "127.0.0.1:5061", Transport: "tls", Weight: 1}}
		}, "Backends"},
		{"ok", func(c *Config) {
			c.TLSListen, c.TLSConfig, c.TLSAdvertise = ":5061", &tls.Config{}, "[2001:db8::1]:5061"
			c.Backends = []BackendConfig{{ID: "t1", Addr: "127.0.0.1:5061", Transport: "tls", Weight: 1}}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Backends = []BackendConfig{{ID: "check", Addr: "127.0.0.1:5060"}}
			tc.mut(&c)
			c.setDefaults()
			err := c.Validate()
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

// TestFailoverToTLSBackendDoubleRecordRoute: a UDP client's INVITE that
// fails over from a UDP backend (503) to a TLS one reaches it with two
// Record-Routes, the backend-facing one at the TLS listener, the
// client-facing one over UDP (one entry cannot name both).
func TestFailoverToTLSBackendDoubleRecordRoute(t *testing.T) {
	srv, _ := testTLS(t)
	be, ca := tlsBackend(t, srv)
	b1 := newUAS(t, "b1")
	b1.mode.Store(mode503)
	s := testServer(t, []*uas{b1}, nil, func(c *Config) {
		c.Backends = append(c.Backends, BackendConfig{ID: "tls1", Addr: be.addr, Transport: "tls", CAFile: ca, SNI: "sip.test", Weight: 1})
		c.TLSListen, c.TLSConfig, c.TLSAdvertise = "127.0.0.1:0", srv, "tls.edge.test:5061"
	})
	eventually(t, "connection to the backend", func() bool { return s.tcp.len() == 1 })
	c := newUAC(t, s.udpAddr())
	// Calls until one was first sent to b1 (the hash decides).
	for i := 0; ; i++ {
		if i == 64 {
			t.Fatal("b1 was never tried")
		}
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		c.recvResponse(200)
		if b1.count(gosip.INVITE, k.callID) == 0 {
			continue
		}
		inv := be.find(gosip.INVITE, k.callID)
		if len(inv) != 1 {
			t.Fatalf("TLS backend got %d INVITEs of the call that failed over", len(inv))
		}
		var got []string
		for _, h := range inv[0].GetHeaders("Record-Route") {
			got = append(got, rrShape(t, h.Value()))
		}
		want := []string{"<sip:tls.edge.test:5061;lr;transport=tls;sl=TOKEN>", "<sip:" + s.adv.String() + ";lr;sl=TOKEN>"}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("Record-Routes after the failover %v, want %v", got, want)
		}
		if v := inv[0].Via(); v.Transport != "TLS" || v.Host != "tls.edge.test" {
			t.Errorf("top Via %s: want ours over TLS", v.Value())
		}
		return
	}
}

// BenchmarkIsOurs: recognising our entries with every edge listener
// open (four addresses to compare), for a Route naming the WSS listener
// by IP and one naming another host.
func BenchmarkIsOurs(b *testing.B) {
	b1 := newUAS(b, "b1")
	s, _ := edgeServer(b, []*uas{b1}, func(c *Config) { c.TLSAdvertise = "tls.edge.test:5061" })
	var ours, other gosip.Uri
	if err := gosip.ParseUri("sip:"+s.WSSAddr().String()+";transport=wss;lr", &ours); err != nil {
		b.Fatal(err)
	}
	if err := gosip.ParseUri("sip:proxy.example.com:5060;lr", &other); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if !s.isOurs(&ours) || s.isOurs(&other) {
			b.Fatal("isOurs")
		}
	}
}
