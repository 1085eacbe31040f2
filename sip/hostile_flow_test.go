package sip

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// TestHostileFlowFromBackendAddressOverTCP: a client that connects over
// TCP from the very address:port a UDP backend listens on (TCP and UDP
// ports are separate, so anyone on the backend's host can bind it; off
// host, the address is spoofable for UDP towards a TCP backend likewise)
// is not that backend: a request it sends with another client's Path
// must not be sent over that client's flow. Backends are known by
// address and transport: a connection is never a UDP backend.
func TestHostileFlowFromBackendAddressOverTCP(t *testing.T) {
	s, reg := flowServer(t, nil)
	victim := dialTCP(t, s)
	p := pathOf(t, registerTCP(t, s, victim, reg, "victim"))

	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: reg.addr.Addr().AsSlice(), Port: int(reg.addr.Port())}}
	ac, err := d.Dial("tcp", s.udpAddr().String())
	if err != nil {
		t.Skipf("cannot bind TCP %s: %v", reg.addr, err)
	}
	t.Cleanup(func() { ac.Close() })
	attacker := &tcpClient{t: t, conn: ac}
	attacker.write(strings.Replace(incomingInvite(reg, "sip:victim@10.9.9.9", "<"+p.String()+">", "forged-from-backend@test"),
		"Via: SIP/2.0/UDP", "Via: SIP/2.0/TCP", 1))

	_ = victim.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if m, err := victim.next(); err == nil {
		t.Fatalf("a TCP client at the UDP backend's address reached another client's flow:\n%v", m)
	}
	if n := s.metrics.FlowRouted.Load(); n != 0 {
		t.Errorf("flow_routed %d, want 0", n)
	}
}

// registerTCPContact sends a REGISTER from c with the Contact value given
// and returns it as the registrar got it, nil when it did not get there
// (the client's answer is then the code returned).
func registerTCPContact(t *testing.T, s *Server, c *tcpClient, reg *regStub, user, contact string) (*gosip.Request, int) {
	t.Helper()
	la := c.conn.LocalAddr().String()
	c.write(fmt.Sprintf("REGISTER sip:%s SIP/2.0\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-reg-%s\nMax-Forwards: 70\nFrom: <sip:%s@test>;tag=r1\nTo: <sip:%s@test>\nCall-ID: reg-%s@test\nCSeq: 1 REGISTER\nContact: %s\nExpires: 60\nContent-Length: 0\n\n",
		s.udpAddr(), la, user, user, user, user, contact))
	for {
		m, err := c.next()
		if err != nil {
			t.Fatalf("registering %s: %v", user, err)
		}
		res, ok := m.(*gosip.Response)
		if !ok || res.StatusCode < 200 {
			continue
		}
		if res.StatusCode != 200 {
			return nil, res.StatusCode
		}
		return reg.register(t), 200
	}
}

// TestHostileContactAliasPlanted: a flow token is no secret from the
// parties of a call (it is in the Record-Route a callee sees, and in the
// aliased Contact). A client must not be able to plant another client's
// token as a Contact alias of its own (in a Contact the alias does not
// rewrite: several of them, sips:, or with -sip-contact-alias off, where
// no alias should be honoured at all) and so have the registrar send
// the requests for its address over the other client's connection.
func TestHostileContactAliasPlanted(t *testing.T) {
	for _, tc := range []struct {
		name    string
		alias   bool
		contact func(victimTok, sluice string) string
	}{
		{"alias off", false, func(tok, sl string) string { return "<sip:mallory@" + sl + ";sla=" + tok + ">" }},
		{"alias on, two contacts", true, func(tok, sl string) string {
			return "<sip:mallory@" + sl + ";sla=" + tok + ">, <sip:mallory@192.0.2.1>"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, reg := flowServer(t, func(c *Config) { c.ContactAlias = tc.alias })
			victim := dialTCP(t, s)
			// The victim's flow token, as any callee of the victim sees it
			// in the client-facing Record-Route.
			tok := pathOf(t, registerTCP(t, s, victim, reg, "victim")).User

			mallory := dialTCP(t, s)
			got, code := registerTCPContact(t, s, mallory, reg, "mallory", tc.contact(tok, s.udpAddr().String()))
			if got == nil {
				if code != 403 {
					t.Errorf("planted alias answered %d, want 403 or a Contact without it", code)
				}
				return
			}
			// The registrar calls mallory at the Contact it was given.
			var target string
			for _, h := range got.GetHeaders("Contact") {
				for _, v := range strings.Split(h.Value(), ",") {
					if strings.Contains(v, "sla=") {
						target = strings.Trim(strings.TrimSpace(v), "<>")
					}
				}
			}
			if target == "" {
				return // the planted alias did not reach the registrar
			}
			reg.send(s, incomingInvite(reg, target, "", "planted@test"))
			_ = victim.conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if m, err := victim.next(); err == nil {
				t.Fatalf("mallory's incoming call reached the victim's connection:\n%v", m)
			}
		})
	}
}

// TestHostileBackendFrom: what may speak as a backend (send over client
// flows, have requests forwarded downstream): a datagram from a UDP
// backend's address, a connection we dialled to a TCP or TLS backend.
// Not a datagram from a TCP backend's address (anyone may spoof a UDP
// source), not a connection from a UDP backend's address (anyone on the
// backend's host may bind the port for TCP, which the backend does not
// hold).
func TestHostileBackendFrom(t *testing.T) {
	reg := newRegStub(t)
	be := newTCPUAS(t)
	s := testServer(t, nil, nil, func(c *Config) {
		c.Backends = []BackendConfig{
			{ID: "udp1", Addr: reg.addr.String(), Transport: "udp", Weight: 1},
			{ID: "tcp1", Addr: be.addr, Transport: "tcp", Weight: 1},
		}
	})
	p := s.pool.Load()
	tcpAddr := netip.MustParseAddrPort(be.addr)
	accepted := &tcpConn{accepted: true, fid: 1}
	dialled := &tcpConn{}
	for _, tc := range []struct {
		name string
		src  source
		want string
	}{
		{"datagram from the UDP backend", source{addr: reg.addr}, "udp1"},
		{"accepted connection from the UDP backend's address", source{addr: reg.addr, conn: accepted}, ""},
		{"dialled connection to the TCP backend", source{addr: tcpAddr, conn: dialled}, "tcp1"},
		{"datagram from the TCP backend's address", source{addr: tcpAddr}, ""},
		// The backend's own port, which it holds: a backend that reuses
		// its listening port for the connections it opens.
		{"accepted connection from the TCP backend's address", source{addr: tcpAddr, conn: accepted}, "tcp1"},
	} {
		got := ""
		if b := p.backendFrom(tc.src); b != nil {
			got = b.id
		}
		if got != tc.want {
			t.Errorf("%s: backend %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestContactAliasOwnLetThrough: a client may send its own alias back
// (a binding copied from the registrar's answer, to remove it): only
// another flow's alias is refused.
func TestContactAliasOwnLetThrough(t *testing.T) {
	s, reg := flowServer(t, func(c *Config) { c.ContactAlias = true })
	c := dialTCP(t, s)
	got := registerTCP(t, s, c, reg, "bob")
	own := strings.Trim(got.GetHeader("Contact").Value(), "<>")
	if i := strings.Index(own, ">"); i >= 0 {
		own = own[:i]
	}
	if !strings.Contains(own, "sla=") {
		t.Fatalf("Contact %q not aliased", own)
	}
	req, code := registerTCPContact(t, s, c, reg, "bob2", "<"+own+">;expires=0, <sip:bob@192.0.2.1>;expires=0")
	if req == nil {
		t.Fatalf("the client's own alias sent back: %d, want it let through", code)
	}
}
