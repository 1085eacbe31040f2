package sip

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	gosip "github.com/emiago/sipgo/sip"
)

// TestSetRouteAddress: golden forms of our Record-Route entries. An entry
// reached over TLS in a request to a sips: URI is sips: without a
// transport parameter (RFC 3261 §16.6 step 4, RFC 5630 §3.1.3); every
// other entry is sip: with its transport (none for UDP), and an entry
// rewritten for another attempt's transport takes that attempt's form.
func TestSetRouteAddress(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, _ := edgeServer(t, []*uas{b1}, func(c *Config) {
		c.TLSAdvertise, c.WSSAdvertise = "tls.edge.test:5061", "wss.edge.test:443"
	})
	udp := s.adv.String()
	for _, tc := range []struct {
		tr   string
		sips bool
		want string
	}{
		{"TLS", true, "<sips:tls.edge.test:5061;lr;sl=TOKEN>"},
		{"TLS", false, "<sip:tls.edge.test:5061;lr;transport=tls;sl=TOKEN>"},
		{"UDP", true, "<sip:" + udp + ";lr;sl=TOKEN>"},
		{"UDP", false, "<sip:" + udp + ";lr;sl=TOKEN>"},
		{"TCP", true, "<sip:" + udp + ";lr;transport=tcp;sl=TOKEN>"},
		{"WSS", true, "<sip:wss.edge.test:443;lr;transport=wss;sl=TOKEN>"},
	} {
		t.Run(fmt.Sprintf("%s-sips-%v", tc.tr, tc.sips), func(t *testing.T) {
			rr := s.ourRecordRoute("tok", tc.tr, tc.sips)
			if got := rrShape(t, rr.Value()); got != tc.want {
				t.Errorf("new entry %s, want %s", got, tc.want)
			}
			// An entry first made for another transport and sips-ness,
			// rewritten for this one (a failover), reads the same.
			other := s.ourRecordRoute("tok", "TLS", !tc.sips)
			if tc.tr == "TLS" {
				other = s.ourRecordRoute("tok", "UDP", !tc.sips)
			}
			s.setRouteAddress(&other.Address, tc.tr, tc.sips)
			if got := rrShape(t, other.Value()); got != tc.want {
				t.Errorf("rewritten entry %s, want %s", got, tc.want)
			}
		})
	}
}

// TestSipsRecordRoute: a call from a client over TLS through sluice. In a
// sips: dialog the client-facing Record-Route (the flow's) is a sips: URI
// naming the TLS listener, and so is the backend-facing one of a TLS
// backend; a sip: INVITE over the same TLS keeps sip:;transport=tls; a
// sips: INVITE allowed onto a UDP backend (-sip-allow-sips-downgrade)
// gets a sips: client-facing entry and a sip: backend-facing one. The
// client's ACK and BYE with the route set built from those entries are
// taken as ours and reach the backend without our Routes.
func TestSipsRecordRoute(t *testing.T) {
	for _, tc := range []struct {
		name        string
		scheme      string // of the Request-URI
		tlsBackend  bool
		wantBackend string // backend-facing entry; TLSPORT: the TLS listener's port
		wantClient  string
	}{
		{"sips-tls-backend", "sips", true, "<sips:127.0.0.1:TLSPORT;lr;sl=TOKEN>", "<sips:FLOW@127.0.0.1:TLSPORT;lr;sl=TOKEN>"},
		{"sip-tls-backend", "sip", true, "<sip:127.0.0.1:TLSPORT;lr;transport=tls;sl=TOKEN>", "<sip:FLOW@127.0.0.1:TLSPORT;lr;transport=tls;sl=TOKEN>"},
		{"sips-udp-backend-downgrade", "sips", false, "<sip:UDPADV;lr;sl=TOKEN>", "<sips:FLOW@127.0.0.1:TLSPORT;lr;sl=TOKEN>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := testTLS(t)
			var s *Server
			var reqs func(gosip.RequestMethod, string) int
			if tc.tlsBackend {
				be, ca := tlsBackend(t, srv)
				s, _ = edgeServer(t, nil, func(c *Config) {
					c.TLSConfig = srv
					c.Backends = []BackendConfig{{ID: "tls1", Addr: be.addr, Transport: "tls", CAFile: ca, SNI: "sip.test", Weight: 1}}
				})
				eventually(t, "connection to the backend", func() bool { return s.tcp.len() >= 1 })
				reqs = func(m gosip.RequestMethod, id string) int { return len(be.find(m, id)) }
			} else {
				b1 := newUAS(t, "b1")
				s, _ = edgeServer(t, []*uas{b1}, func(c *Config) {
					c.TLSConfig = srv
					c.AllowSipsDowngrade = true
				})
				reqs = func(m gosip.RequestMethod, id string) int { return b1.count(m, id) }
			}
			c := dialTLS(t, s, cli)
			la := c.conn.LocalAddr().String()
			id := "srr-" + tc.name + "@test"
			req := func(method string, cseq int, toTag, routes string) string {
				to := "<" + tc.scheme + ":svc@test>"
				if toTag != "" {
					to += ";tag=" + toTag
				}
				return fmt.Sprintf("%s %s:svc@test SIP/2.0\r\nVia: SIP/2.0/TLS %s;branch=z9hG4bK-srr-%s-%d\r\nMax-Forwards: 70\r\n%sFrom: <%s:a@test>;tag=ta\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContact: <%s:a@%s>\r\nContent-Length: 0\r\n\r\n",
					method, tc.scheme, la, method, cseq, routes, tc.scheme, to, id, cseq, method, tc.scheme, la)
			}
			c.write(req("INVITE", 1, "", ""))
			c.response(180)
			ok := c.response(200)
			rrs := ok.GetHeaders("Record-Route")
			if len(rrs) != 2 {
				t.Fatalf("Record-Routes %v: want two", rrs)
			}
			port := strconv.Itoa(s.TLSAddr().(*net.TCPAddr).Port)
			r := strings.NewReplacer("TLSPORT", port, "UDPADV", s.adv.String())
			if got, want := rrShape(t, rrs[0].Value()), r.Replace(tc.wantBackend); got != want {
				t.Errorf("backend-facing %s, want %s", got, want)
			}
			if got, want := rrShape(t, rrs[1].Value()), r.Replace(tc.wantClient); got != want {
				t.Errorf("client-facing %s, want %s", got, want)
			}
			tag, _ := ok.To().Params.Get("tag")
			routes := routeSet(rrs)
			c.write(req("ACK", 1, tag, routes))
			c.write(req("BYE", 2, tag, routes))
			c.response(200)
			eventually(t, "ACK and BYE at the backend", func() bool {
				return reqs(gosip.ACK, id) == 1 && reqs(gosip.BYE, id) == 1
			})
			if n := s.metrics.ForgedTokens.Load(); n != 0 {
				t.Errorf("forged_tokens %d: our sips: routes not taken as ours", n)
			}
		})
	}
}

// TestSipsRecordRouteTowardsFlow: an INVITE a registrar (a UDP backend)
// sends along the Path of a client registered over TLS reaches the client
// with our two Record-Routes, the client-facing one on top: a sips: URI
// naming the TLS listener when the INVITE is addressed to a sips: URI,
// sip:;transport=tls otherwise; the backend-facing one stays sip: (UDP).
func TestSipsRecordRouteTowardsFlow(t *testing.T) {
	srv, cli := testTLS(t)
	s, reg := flowServer(t, func(c *Config) {
		c.TLSListen, c.TLSConfig = "127.0.0.1:0", srv
	})
	c := dialTLS(t, s, cli)
	p := pathOf(t, registerTCP(t, s, c, reg, "erin"))
	route := "<" + p.String() + ">"
	port := strconv.Itoa(s.TLSAddr().(*net.TCPAddr).Port)
	back := "<sip:" + s.adv.String() + ";lr;sl=TOKEN>"
	for _, tc := range []struct {
		ruri, want string
	}{
		{"sips:erin@example.com", "<sips:FLOW@127.0.0.1:" + port + ";lr;sl=TOKEN>"},
		{"sip:erin@example.com", "<sip:FLOW@127.0.0.1:" + port + ";lr;transport=tls;sl=TOKEN>"},
	} {
		id := "srr-flow-" + tc.ruri + "@test"
		reg.send(s, incomingInvite(reg, tc.ruri, route, id))
		got := nextRequest(t, c)
		if got.CallID().Value() != id {
			t.Fatalf("client got %s of %s, want the INVITE of %s", got.Method, got.CallID().Value(), id)
		}
		rrs := got.GetHeaders("Record-Route")
		if len(rrs) != 2 {
			t.Fatalf("%s: Record-Routes %v, want two", tc.ruri, rrs)
		}
		if g := rrShape(t, rrs[0].Value()); g != tc.want {
			t.Errorf("%s: client-facing %s, want %s", tc.ruri, g, tc.want)
		}
		if g := rrShape(t, rrs[1].Value()); g != back {
			t.Errorf("%s: backend-facing %s, want %s", tc.ruri, g, back)
		}
		answer(t, c, got, 486, "Busy Here")
		reg.response(486)
	}
}
