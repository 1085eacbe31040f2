package sip

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/proxyproto"
)

// TestProxyProtocolIn: a TCP connection from a balancer starts with a
// PROXY header; the backend sees the client it names in the client's Via
// (received, rport), and the answers go back over the connection. From a
// source not in -proxy-protocol-from a header closes the connection, as
// does a balancer's connection without one; both are counted.
func TestProxyProtocolIn(t *testing.T) {
	src := netip.MustParseAddrPort("203.0.113.7:40000")
	v2 := string(proxyproto.AppendV2(nil, src, netip.MustParseAddrPort("127.0.0.1:5060")))
	v1 := string(proxyproto.AppendV1(nil, src, netip.MustParseAddrPort("127.0.0.1:5060")))
	local := string(proxyproto.AppendV2(nil, netip.AddrPort{}, netip.AddrPort{}))
	for _, tc := range []struct {
		name     string
		from     string
		pre      []string
		received string // the client Via's received at the backend; "" when refused
		rport    string
		reason   string
	}{
		{name: "v2", from: "127.0.0.0/8", pre: []string{v2}, received: "203.0.113.7", rport: "40000"},
		{name: "v1 in pieces", from: "127.0.0.1/32", pre: []string{v1[:4], v1[4:]}, received: "203.0.113.7", rport: "40000"},
		{name: "local", from: "127.0.0.0/8", pre: []string{local}, received: "127.0.0.1"},
		{name: "missing", from: "127.0.0.0/8", reason: proxyproto.ReasonMissing},
		{name: "malformed", from: "127.0.0.0/8", pre: []string{"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n"}, reason: proxyproto.ReasonMalformed},
		{name: "forged v1", from: "10.0.0.0/8", pre: []string{v1}, reason: proxyproto.ReasonUntrusted},
		{name: "forged v2", from: "10.0.0.0/8", pre: []string{v2}, reason: proxyproto.ReasonUntrusted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b1 := newUAS(t, "b1")
			s := testServer(t, []*uas{b1}, nil, func(c *Config) {
				c.ProxyFrom = []netip.Prefix{netip.MustParsePrefix(tc.from)}
			})
			c := dialTCP(t, s)
			for _, p := range tc.pre {
				if _, err := c.conn.Write([]byte(p)); err != nil {
					t.Fatal(err)
				}
			}
			la := c.conn.LocalAddr().String()
			callID := "pp-" + strings.ReplaceAll(tc.name, " ", "-") + "@test"
			c.write(fmt.Sprintf("INVITE sip:svc@%s SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-pp-1;rport\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=ta\r\nTo: <sip:svc@test>\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:a@%s;transport=tcp>\r\nContent-Length: 0\r\n\r\n", s.udpAddr(), la, callID, la))
			if tc.reason != "" {
				if m, err := c.next(); err == nil {
					t.Fatalf("got %v, want the connection closed", m)
				} else if err != io.EOF && !strings.Contains(err.Error(), "reset") {
					t.Fatalf("read: %v, want EOF", err)
				}
				eventually(t, "the refusal counted", func() bool { return s.metrics.ProxyRejected.Get(tc.reason) == 1 })
				if n := b1.count(gosip.INVITE, callID); n != 0 {
					t.Fatalf("backend got %d INVITEs", n)
				}
				return
			}
			c.response(180)
			c.response(200)
			got := b1.find(gosip.INVITE, callID)
			if len(got) != 1 {
				t.Fatalf("backend got %d INVITEs", len(got))
			}
			vias := got[0].Req.GetHeaders("Via")
			var client *gosip.ViaHeader
			for _, h := range vias {
				if v, ok := h.(*gosip.ViaHeader); ok {
					if br, _ := v.Params.Get("branch"); br == "z9hG4bK-pp-1" {
						client = v
					}
				}
			}
			if client == nil {
				t.Fatalf("client Via missing: %v", vias)
			}
			if r, _ := client.Params.Get("received"); r != tc.received {
				t.Errorf("Via received %q, want %q (%s)", r, tc.received, client.Value())
			}
			if tc.rport != "" {
				if r, _ := client.Params.Get("rport"); r != tc.rport {
					t.Errorf("Via rport %q, want %q", r, tc.rport)
				}
			}
		})
	}
}
