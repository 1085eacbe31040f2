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

// flowTestKey is the flow MAC key of the golden vectors.
var flowTestKey = []byte("flow-token-golden-key-0123456789")

// TestFlowTokenGolden pins the token format: the same key and flow give
// the same text on every build, and it decodes back to the flow.
func TestFlowTokenGolden(t *testing.T) {
	f := newFlowSignerKey(flowTestKey)
	for _, tc := range []struct {
		ref  flowRef
		want string
	}{
		{flowRef{node: 1, listener: 0, gen: 1, conn: 1}, "010000000100000000010000000000000001b63e4b9fa0a9128e1ed57bdc"},
		{flowRef{node: 0xdeadbeef, listener: 3, gen: 0x01020304, conn: 1 << 40}, "01deadbeef030102030400000100000000005b9e8238f78edc04c0f29baa"},
		{flowRef{node: 0xffffffff, listener: 255, gen: 0xffffffff, conn: ^uint64(0)}, "01ffffffffffffffffffffffffffffffffff77d2f2cbe2ef1ab71277de95"},
	} {
		got := f.encode(tc.ref)
		if got != tc.want {
			t.Errorf("encode(%+v) = %s, want %s", tc.ref, got, tc.want)
		}
		if len(got) != flowTokenLen {
			t.Errorf("len %d, want %d", len(got), flowTokenLen)
		}
		r, ok := f.decode(tc.want)
		if !ok || r != tc.ref {
			t.Errorf("decode(%s) = %+v %v, want %+v", tc.want, r, ok, tc.ref)
		}
		if ok := containsCSeq(got); ok {
			t.Errorf("%s spells cseq", got)
		}
	}
}

// TestFlowTokenRefused: anything but a token this key made is refused.
func TestFlowTokenRefused(t *testing.T) {
	f := newFlowSignerKey(flowTestKey)
	good := f.encode(flowRef{node: 7, listener: 1, gen: 9, conn: 42})
	flip := func(s string, i int) string {
		b := []byte(s)
		if b[i] == '0' {
			b[i] = '1'
		} else {
			b[i] = '0'
		}
		return string(b)
	}
	// A token of version 2 with a correct MAC: still refused.
	var body [flowTokenBody]byte
	flowRef{node: 7, listener: 1, gen: 9, conn: 42}.body(&body)
	body[0] = 2
	var sum [32]byte
	f.mac(body[:], &sum)
	v2 := fmt.Sprintf("%x%x", body[:], sum[:flowTokenMACLen])
	for _, tc := range []struct {
		name, tok string
	}{
		{"empty", ""},
		{"short", good[:len(good)-2]},
		{"long", good + "00"},
		{"huge", strings.Repeat("0", 1<<16)},
		{"node changed", flip(good, 3)},
		{"listener changed", flip(good, 11)},
		{"conn changed", flip(good, 35)},
		{"mac changed", flip(good, len(good)-1)},
		{"not hex", "zz" + good[2:]},
		{"other key", newFlowSignerKey([]byte("another-key-another-key-another-")).encode(flowRef{node: 7, listener: 1, gen: 9, conn: 42})},
		{"version 2", v2},
	} {
		if r, ok := f.decode(tc.tok); ok {
			t.Errorf("%s: %q decoded to %+v", tc.name, tc.tok, r)
		}
	}
	if _, ok := f.decode(strings.ToUpper(good)); !ok {
		t.Errorf("upper case hex of a good token refused (a hop may fold case)")
	}
}

// TestFlowTableLookup: a flow is found only with its node, generation,
// listener and id, and not after it is removed.
func TestFlowTableLookup(t *testing.T) {
	var ft flowTable
	ft.init()
	c := &tcpConn{fid: ft.newID(), remote: netip.MustParseAddrPort("192.0.2.1:5060")}
	ft.add(c)
	ok := flowRef{node: 5, listener: listenerMain, gen: ft.gen, conn: c.fid}
	if ft.lookup(ok, 5) != c {
		t.Fatal("registered flow not found")
	}
	for name, r := range map[string]flowRef{
		"other listener":   {node: 5, listener: 1, gen: ft.gen, conn: c.fid},
		"other generation": {node: 5, listener: listenerMain, gen: ft.gen + 1, conn: c.fid},
		"other id":         {node: 5, listener: listenerMain, gen: ft.gen, conn: c.fid + 1},
	} {
		if ft.lookup(r, 5) != nil {
			t.Errorf("%s: found", name)
		}
	}
	if ft.lookup(ok, 6) != nil {
		t.Error("another node's flow found")
	}
	if ft.Len() != 1 {
		t.Errorf("Len %d", ft.Len())
	}
	ft.remove(c)
	if ft.lookup(ok, 5) != nil || ft.Len() != 0 {
		t.Error("removed flow still found")
	}
	if d := ft.newID(); d == c.fid {
		t.Error("id reused")
	}
}

// regStub is a registrar on UDP for these tests: it answers REGISTER and
// OPTIONS with 200 and hands every other message to the test.
type regStub struct {
	t    *testing.T
	conn *net.UDPConn
	addr netip.AddrPort
	regs chan *gosip.Request
	msgs chan gosip.Message
}

func newRegStub(t *testing.T) *regStub {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	r := &regStub{t: t, conn: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), regs: make(chan *gosip.Request, 16), msgs: make(chan gosip.Message, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			m, err := gosip.ParseMessage(append([]byte(nil), buf[:n]...))
			if err != nil {
				continue
			}
			if req, ok := m.(*gosip.Request); ok && (req.Method == gosip.REGISTER || req.Method == gosip.OPTIONS) {
				res := gosip.NewResponseFromRequest(req, 200, "OK", nil)
				if req.Method == gosip.REGISTER {
					for _, h := range req.GetHeaders("Path") {
						res.AppendHeader(gosip.NewHeader("Path", h.Value()))
					}
					r.regs <- req
				}
				_, _ = c.WriteToUDPAddrPort([]byte(res.String()), from)
				continue
			}
			select {
			case r.msgs <- m:
			default:
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return r
}

// send writes msg (LF or CRLF lines) to the balancer.
func (r *regStub) send(s *Server, msg string) {
	r.t.Helper()
	msg = strings.ReplaceAll(strings.ReplaceAll(msg, "\r\n", "\n"), "\n", "\r\n")
	if _, err := r.conn.WriteToUDPAddrPort([]byte(msg), s.udpAddr()); err != nil {
		r.t.Fatal(err)
	}
}

// response waits for a response with code.
func (r *regStub) response(code int) *gosip.Response {
	r.t.Helper()
	for {
		select {
		case m := <-r.msgs:
			res, ok := m.(*gosip.Response)
			if !ok || res.StatusCode == 100 {
				continue
			}
			if res.StatusCode != code {
				r.t.Fatalf("registrar got %d %s, want %d", res.StatusCode, res.Reason, code)
			}
			return res
		case <-time.After(wait):
			r.t.Fatalf("registrar: no %d", code)
			return nil
		}
	}
}

func (r *regStub) register(t *testing.T) *gosip.Request {
	t.Helper()
	select {
	case req := <-r.regs:
		return req
	case <-time.After(wait):
		t.Fatal("no REGISTER at the registrar")
		return nil
	}
}

// flowServer starts a balancer whose one backend is a registrar stub.
func flowServer(t *testing.T, mut func(*Config)) (*Server, *regStub) {
	t.Helper()
	reg := newRegStub(t)
	s := startServer(t, serverOpts{backends: []netip.AddrPort{reg.addr}, mut: mut})
	return s, reg
}

// registerTCP sends a REGISTER from c and returns it as the registrar got it.
func registerTCP(t *testing.T, s *Server, c *tcpClient, reg *regStub, user string) *gosip.Request {
	t.Helper()
	la := c.conn.LocalAddr().String()
	c.write(fmt.Sprintf("REGISTER sip:%s SIP/2.0\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-reg-%s\nMax-Forwards: 70\nFrom: <sip:%s@test>;tag=r1\nTo: <sip:%s@test>\nCall-ID: reg-%s@test\nCSeq: 1 REGISTER\nSupported: path, outbound\nContact: <sip:%s@%s;transport=tcp;ob>;expires=60;+sip.instance=\"<urn:uuid:1>\";reg-id=1\nExpires: 60\nContent-Length: 0\n\n",
		s.udpAddr(), la, user, user, user, user, user, la))
	req := reg.register(t)
	c.response(200)
	return req
}

// pathOf returns the URI of the REGISTER's top Path.
func pathOf(t *testing.T, req *gosip.Request) gosip.Uri {
	t.Helper()
	h := req.GetHeader("Path")
	if h == nil {
		t.Fatalf("REGISTER without Path:\n%s", req)
	}
	var u gosip.Uri
	if err := gosip.ParseUri(strings.Trim(h.Value(), "<>"), &u); err != nil {
		t.Fatalf("Path %q: %v", h.Value(), err)
	}
	return u
}

// incomingInvite is a request from the registrar towards user, with
// route as its Route header value ("" for none) and ruri as its
// Request-URI.
func incomingInvite(reg *regStub, ruri, route, callID string) string {
	r := ""
	if route != "" {
		r = "Route: " + route + "\n"
	}
	return fmt.Sprintf("INVITE %s SIP/2.0\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-in-%s\nMax-Forwards: 70\n%sFrom: <sip:caller@test>;tag=c1\nTo: <sip:alice@test>\nCall-ID: %s\nCSeq: 1 INVITE\nContact: <sip:caller@%s>\nContent-Length: 0\n\n",
		ruri, reg.addr, callID, r, callID, reg.addr)
}

// nextRequest returns the next request c receives.
func nextRequest(t *testing.T, c *tcpClient) *gosip.Request {
	t.Helper()
	for {
		m, err := c.next()
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		if req, ok := m.(*gosip.Request); ok {
			return req
		}
	}
}

// answer writes a response to req on c.
func answer(t *testing.T, c *tcpClient, req *gosip.Request, code int, reason string) {
	t.Helper()
	res := gosip.NewResponseFromRequest(req, code, reason, nil)
	res.To().Params.Add("tag", "callee")
	if _, err := c.conn.Write([]byte(res.String())); err != nil {
		t.Fatal(err)
	}
}

// TestFlowPathIncomingCall: a REGISTER from a TCP client reaches the
// registrar with a Path naming us and carrying a valid flow token for
// the client's connection; an INVITE the registrar sends along that Path
// reaches the client on that connection, with our two Record-Routes,
// and the client's answer goes back to the registrar; a BYE from the
// client comes back to the registrar through the route set. After the
// client disconnects, the same Path gets 430; a tampered token 403.
func TestFlowPathIncomingCall(t *testing.T) {
	s, reg := flowServer(t, nil)
	c := dialTCP(t, s)
	req := registerTCP(t, s, c, reg, "alice")
	p := pathOf(t, req)
	if !s.isOurs(&p) || !p.UriParams.Has("lr") || !p.UriParams.Has("ob") || p.UriParams.Has("transport") {
		t.Errorf("Path %s: want our address, lr, ob, and UDP (the registrar's transport)", p.String())
	}
	ref, ok := s.flowSign.decode(p.User)
	if !ok {
		t.Fatalf("Path user %q is no valid flow token", p.User)
	}
	if ref.node != s.flowNode() || ref.gen != s.flows.gen || ref.listener != listenerMain || s.flows.lookup(ref, s.flowNode()) == nil {
		t.Fatalf("flow token names %+v, not the client's connection", ref)
	}
	if v := req.GetHeader("Via"); v == nil || !strings.HasPrefix(v.Value(), "SIP/2.0/UDP") {
		t.Errorf("top Via %v: want ours on top", v)
	}
	route := "<" + p.String() + ">"

	// Incoming call along the Path: reaches the client's connection.
	reg.send(s, incomingInvite(reg, "sip:alice@10.9.9.9:5060;transport=tcp", route, "in-1@test"))
	inv := nextRequest(t, c)
	if inv.Method != gosip.INVITE || inv.CallID().Value() != "in-1@test" {
		t.Fatalf("client got %s %s", inv.Method, inv.CallID().Value())
	}
	if r := inv.GetHeader("Route"); r != nil {
		t.Errorf("our Route reached the client: %s", r.Value())
	}
	if v := inv.Via(); v.Transport != "TCP" || !strings.HasPrefix(v.Params.GetOr("branch", ""), proxyBranchPrefix) {
		t.Errorf("top Via %s: want ours over TCP", v.Value())
	}
	rrs := inv.GetHeaders("Record-Route")
	if len(rrs) != 2 {
		t.Fatalf("Record-Route %v: want two (client-facing on top, then backend-facing)", rrs)
	}
	var cf, bf gosip.Uri
	_ = gosip.ParseUri(strings.Trim(rrs[0].Value(), "<>"), &cf)
	_ = gosip.ParseUri(strings.Trim(rrs[1].Value(), "<>"), &bf)
	if cf.User != p.User || cf.UriParams.GetOr("transport", "") != "tcp" || bf.User != "" || bf.UriParams.Has("transport") {
		t.Errorf("Record-Route %v: client-facing with the flow token and transport=tcp, backend-facing without either", rrs)
	}
	answer(t, c, inv, 200, "OK")
	reg.response(200)

	// The client hangs up: its BYE, with the route set, reaches the registrar.
	la := c.conn.LocalAddr().String()
	c.write(fmt.Sprintf("BYE sip:caller@%s SIP/2.0\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-cbye\nMax-Forwards: 70\nRoute: %s\nRoute: %s\nFrom: <sip:alice@test>;tag=callee\nTo: <sip:caller@test>;tag=c1\nCall-ID: in-1@test\nCSeq: 1 BYE\nContent-Length: 0\n\n",
		reg.addr, la, rrs[0].Value(), rrs[1].Value()))
	select {
	case m := <-reg.msgs:
		bye, ok := m.(*gosip.Request)
		if !ok || bye.Method != gosip.BYE || bye.GetHeader("Route") != nil {
			t.Fatalf("registrar got %v, want the BYE without our Routes", m)
		}
	case <-time.After(wait):
		t.Fatal("client's BYE did not reach the registrar")
	}

	// A tampered token: 403, nothing reaches the client.
	bad := p
	bad.User = p.User[:10] + strings.Map(func(r rune) rune {
		if r == 'a' {
			return 'b'
		}
		return 'a'
	}, p.User[10:11]) + p.User[11:]
	reg.send(s, incomingInvite(reg, "sip:alice@10.9.9.9", "<"+bad.String()+">", "in-2@test"))
	reg.response(403)
	if s.metrics.ForgedFlows.Load() != 1 {
		t.Errorf("forged_flow_tokens %d", s.metrics.ForgedFlows.Load())
	}

	// The client goes away: 430 Flow Failed.
	c.conn.Close()
	eventually(t, "flow removed", func() bool { return s.flows.Len() == 0 })
	reg.send(s, incomingInvite(reg, "sip:alice@10.9.9.9", route, "in-3@test"))
	reg.response(430)
	if s.metrics.FlowFailed.Load() != 1 || s.metrics.FlowRouted.Load() != 1 {
		t.Errorf("flow_failed %d flow_routed %d", s.metrics.FlowFailed.Load(), s.metrics.FlowRouted.Load())
	}
}

// TestFlowRouteOnlyFromBackends: a client that holds another client's
// flow token cannot reach that client through us: its request goes to
// a backend like any other.
func TestFlowRouteOnlyFromBackends(t *testing.T) {
	s, reg := flowServer(t, nil)
	victim := dialTCP(t, s)
	p := pathOf(t, registerTCP(t, s, victim, reg, "victim"))
	u := newUAC(t, s.udpAddr())
	u.send(strings.Replace(incomingInvite(reg, "sip:victim@10.9.9.9", "<"+p.String()+">", "abuse@test"),
		"Via: SIP/2.0/UDP "+reg.addr.String(), "Via: SIP/2.0/UDP "+u.addr.String(), 1))
	select {
	case m := <-reg.msgs:
		req, ok := m.(*gosip.Request)
		if !ok || req.CallID().Value() != "abuse@test" {
			t.Fatalf("registrar got %v", m)
		}
	case <-time.After(wait):
		t.Fatal("the client's INVITE did not go to the backend")
	}
	_ = victim.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if m, err := victim.next(); err == nil {
		t.Fatalf("victim got %v", m)
	}
	if s.metrics.FlowRouted.Load() != 0 {
		t.Errorf("flow_routed %d", s.metrics.FlowRouted.Load())
	}
}

// TestFlowDoubleRecordRouteUDPClientTCPBackend: a UDP client's INVITE to
// a TCP backend gets the backend-facing entry (transport=tcp) on top and
// the client-facing one (UDP) below, without a flow token (UDP has no
// connection to name).
func TestFlowDoubleRecordRouteUDPClientTCPBackend(t *testing.T) {
	be := newTCPUAS(t)
	s := testServer(t, nil, nil, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "tcp1", Addr: be.addr, Transport: "tcp", Weight: 1}}
	})
	eventually(t, "connection to the backend", func() bool { return s.tcp.len() == 1 })
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")
	ok := c.awaitResponse(gosip.INVITE, 200, 200)
	rrs := ok.GetHeaders("Record-Route")
	if len(rrs) != 2 {
		t.Fatalf("Record-Route %v: want two", rrs)
	}
	var bf, cf gosip.Uri
	_ = gosip.ParseUri(strings.Trim(rrs[0].Value(), "<>"), &bf)
	_ = gosip.ParseUri(strings.Trim(rrs[1].Value(), "<>"), &cf)
	if bf.UriParams.GetOr("transport", "") != "tcp" || cf.UriParams.Has("transport") || cf.User != "" || bf.User != "" {
		t.Errorf("Record-Route %v: backend-facing transport=tcp on top, client-facing UDP below, no flow token", rrs)
	}
}

// TestPopOurRoutesBothWays: both entries of a double Record-Route are read
// and removed in either order, the flow token found in either place, and
// the next hop's Route stays.
func TestPopOurRoutesBothWays(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	adv := s.adv.String()
	cf := "<sip:FLOWTOK@" + adv + ";lr;sl=TOK;transport=tcp>"
	bf := "<sip:" + adv + ";lr;sl=TOK>"
	next := "<sip:next.example;lr>"
	for _, tc := range []struct {
		name   string
		routes []string
		flow   string
	}{
		{"from the client", []string{cf, bf, next}, "FLOWTOK"},
		{"from the backend", []string{bf, cf, next}, "FLOWTOK"},
		{"one entry", []string{bf, next}, ""},
		{"path entry only", []string{"<sip:FLOWTOK@" + adv + ";lr;ob>"}, "FLOWTOK"},
	} {
		msg := "BYE sip:x@test SIP/2.0\r\nVia: SIP/2.0/UDP 192.0.2.1:5060;branch=z9hG4bK-p\r\n"
		for _, r := range tc.routes {
			msg += "Route: " + r + "\r\n"
		}
		msg += "From: <sip:a@test>;tag=1\r\nTo: <sip:b@test>;tag=2\r\nCall-ID: pop@test\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n"
		m, err := s.parser.ParseSIP([]byte(msg))
		if err != nil {
			t.Fatal(err)
		}
		req := m.(*gosip.Request)
		peek, had := s.peekOurFlow(req)
		if !had || peek != tc.flow {
			t.Errorf("%s: peek %q %v, want %q", tc.name, peek, had, tc.flow)
		}
		tok, flow, had := s.popOurRoutesFlow(req)
		wantTok := "TOK"
		if tc.name == "path entry only" {
			wantTok = ""
		}
		if !had || flow != tc.flow || tok != wantTok {
			t.Errorf("%s: popped token %q flow %q had %v", tc.name, tok, flow, had)
		}
		left := req.GetHeaders("Route")
		wantLeft := 0
		if tc.routes[len(tc.routes)-1] == next {
			wantLeft = 1
		}
		if len(left) != wantLeft || wantLeft == 1 && !strings.Contains(left[0].Value(), "next.example") {
			t.Errorf("%s: routes left %v", tc.name, left)
		}
	}
}

// TestFlowContactAlias: with -sip-contact-alias a TCP client's REGISTER
// reaches the registrar with its Contact pointing at us and a signed
// alias; a request to that Contact reaches the client with its own
// Request-URI back; a forged alias gets 403.
func TestFlowContactAlias(t *testing.T) {
	s, reg := flowServer(t, func(c *Config) { c.ContactAlias = true })
	c := dialTCP(t, s)
	la := c.conn.LocalAddr().String()
	req := registerTCP(t, s, c, reg, "bob")
	h := req.GetHeader("Contact")
	if h == nil {
		t.Fatal("no Contact")
	}
	var ct gosip.ContactHeader
	if _, err := gosip.ParseAddressValue(h.Value(), &ct.Address, &ct.Params); err != nil {
		t.Fatal(err)
	}
	if !s.isOurs(&ct.Address) || ct.Address.User != "bob" || ct.Address.UriParams.GetOr(aliasHostParam, "") != la ||
		ct.Address.UriParams.GetOr(aliasTransportParam, "") != "tcp" || ct.Address.UriParams.Has("transport") ||
		ct.Params.GetOr("expires", "") != "60" || ct.Params.GetOr("reg-id", "") != "1" {
		t.Fatalf("Contact %s: want bob at our address with the alias, the client's host and transport in parameters, header parameters kept", h.Value())
	}
	tok := ct.Address.UriParams.GetOr(aliasParam, "")
	if _, ok := s.flowSign.decode(tok); !ok {
		t.Fatalf("alias %q is no valid flow token", tok)
	}
	if s.metrics.ContactAlias.Load() != 1 {
		t.Errorf("contact_aliases %d", s.metrics.ContactAlias.Load())
	}

	// The registrar (no Path support assumed) sends to the Contact.
	reg.send(s, incomingInvite(reg, ct.Address.String(), "", "alias-1@test"))
	inv := nextRequest(t, c)
	if inv.CallID().Value() != "alias-1@test" {
		t.Fatalf("client got %s", inv.CallID().Value())
	}
	if got, want := inv.Recipient.String(), "sip:bob@"+la+";transport=tcp"; got != want {
		t.Errorf("Request-URI %s, want %s", got, want)
	}
	answer(t, c, inv, 486, "Busy Here")
	reg.response(486)

	// A forged alias: 403.
	forged := ct.Address
	forged.UriParams = forged.UriParams.Clone()
	forged.UriParams.Add(aliasParam, tok[:len(tok)-1]+map[bool]string{true: "1", false: "0"}[tok[len(tok)-1] == '0'])
	reg.send(s, incomingInvite(reg, forged.String(), "", "alias-2@test"))
	reg.response(403)
	// No alias value at all: 403 too.
	forged.UriParams.Add(aliasParam, "")
	reg.send(s, incomingInvite(reg, forged.String(), "", "alias-3@test"))
	reg.response(403)
	if s.metrics.ForgedFlows.Load() != 2 {
		t.Errorf("forged_flow_tokens %d, want 2", s.metrics.ForgedFlows.Load())
	}
}

// TestFlowContactAliasOff: without -sip-contact-alias the Contact is
// passed on as the client wrote it.
func TestFlowContactAliasOff(t *testing.T) {
	s, reg := flowServer(t, nil)
	c := dialTCP(t, s)
	req := registerTCP(t, s, c, reg, "carol")
	if h := req.GetHeader("Contact"); h == nil || strings.Contains(h.Value(), aliasParam+"=") || !strings.Contains(h.Value(), c.conn.LocalAddr().String()) {
		t.Errorf("Contact %v rewritten", h)
	}
}

// TestSipsNotDowngraded: a sips: request is not sent to a UDP backend
// (480 with a Warning), unless -sip-allow-sips-downgrade.
func TestSipsNotDowngraded(t *testing.T) {
	for _, allow := range []bool{false, true} {
		b1 := newUAS(t, "b1")
		s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.AllowSipsDowngrade = allow })
		c := newUAC(t, s.udpAddr())
		c.send(fmt.Sprintf("OPTIONS sips:svc@example.com SIP/2.0\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-sips;rport\nMax-Forwards: 70\nFrom: <sips:a@example.com>;tag=1\nTo: <sips:svc@example.com>\nCall-ID: sips-%v@test\nCSeq: 1 OPTIONS\nUser-Agent: a user agent string long enough for our answer to fit\nContent-Length: 0\n\n", c.addr, allow))
		if !allow {
			res := c.recvResponse(480)
			if w := res.GetHeader("Warning"); w == nil || !strings.Contains(w.Value(), "sips") {
				t.Errorf("480 without a Warning naming sips: %v", w)
			}
			if b1.count(gosip.OPTIONS, fmt.Sprintf("sips-%v@test", allow)) != 0 || s.metrics.SipsRefused.Load() != 1 {
				t.Errorf("sips request reached the backend, or not counted")
			}
			continue
		}
		c.recvResponse(200)
		if b1.count(gosip.OPTIONS, fmt.Sprintf("sips-%v@test", allow)) != 1 {
			t.Errorf("allowed downgrade did not reach the backend")
		}
	}
}

// TestFlowCancelAndSips: the registrar's CANCEL of an INVITE it sent over
// a flow reaches the client with the INVITE's branch (so the client
// matches it to the INVITE), and a sips: request is not sent over a TCP
// flow (480).
func TestFlowCancelAndSips(t *testing.T) {
	s, reg := flowServer(t, nil)
	c := dialTCP(t, s)
	p := pathOf(t, registerTCP(t, s, c, reg, "dave"))
	route := "<" + p.String() + ">"
	inv := incomingInvite(reg, "sip:dave@10.9.9.9", route, "cancel-1@test")
	reg.send(s, inv)
	got := nextRequest(t, c)
	cancel := strings.Replace(strings.Replace(inv, "INVITE sip:", "CANCEL sip:", 1), "CSeq: 1 INVITE", "CSeq: 1 CANCEL", 1)
	reg.send(s, cancel)
	gotC := nextRequest(t, c)
	if gotC.Method != gosip.CANCEL {
		t.Fatalf("client got %s, want CANCEL", gotC.Method)
	}
	if a, b := got.Via().Params.GetOr("branch", ""), gotC.Via().Params.GetOr("branch", ""); a != b || a == "" {
		t.Errorf("CANCEL branch %q, INVITE branch %q: want the same", b, a)
	}
	if gotC.GetHeader("Record-Route") != nil {
		t.Errorf("CANCEL record-routed")
	}

	reg.send(s, incomingInvite(reg, "sips:dave@example.com", route, "sips-flow@test"))
	reg.response(480)
	if s.metrics.SipsRefused.Load() != 1 {
		t.Errorf("sips_refused %d", s.metrics.SipsRefused.Load())
	}
}

// BenchmarkFlowToken: making and checking one flow token (one HMAC each).
func BenchmarkFlowToken(b *testing.B) {
	f := newFlowSignerKey(flowTestKey)
	r := flowRef{node: 1, listener: 0, gen: 2, conn: 3}
	tok := f.encode(r)
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = f.encode(r)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := f.decode(tok); !ok {
				b.Fatal("refused")
			}
		}
	})
}

// TestFlowOtherNodeAndUDP: a valid token of another node, or of an
// earlier process of this one, gets 430 (the flow is not here), not 403;
// a REGISTER from a UDP client gets no Path (its address reaches it from
// any node).
func TestFlowOtherNodeAndUDP(t *testing.T) {
	s, reg := flowServer(t, nil)
	for name, r := range map[string]flowRef{
		"other node":    {node: s.flowNode() + 1, listener: listenerMain, gen: s.flows.gen, conn: 1},
		"earlier start": {node: s.flowNode(), listener: listenerMain, gen: s.flows.gen + 1, conn: 1},
	} {
		u := gosip.Uri{Scheme: "sip", User: s.flowSign.encode(r), Host: s.adv.host, Port: s.adv.port, UriParams: gosip.HeaderParams{{K: "lr"}}}
		reg.send(s, incomingInvite(reg, "sip:x@10.9.9.9", "<"+u.String()+">", "node-"+strings.ReplaceAll(name, " ", "-")+"@test"))
		reg.response(430)
	}
	if s.metrics.FlowFailed.Load() != 2 || s.metrics.ForgedFlows.Load() != 0 {
		t.Errorf("flow_failed %d forged_flow_tokens %d, want 2 and 0", s.metrics.FlowFailed.Load(), s.metrics.ForgedFlows.Load())
	}

	c := newUAC(t, s.udpAddr())
	c.send(fmt.Sprintf("REGISTER sip:%s SIP/2.0\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-ureg;rport\nMax-Forwards: 70\nFrom: <sip:eve@test>;tag=r1\nTo: <sip:eve@test>\nCall-ID: ureg@test\nCSeq: 1 REGISTER\nSupported: path\nContact: <sip:eve@%s>\nContent-Length: 0\n\n", s.udpAddr(), c.addr, c.addr))
	req := reg.register(t)
	if h := req.GetHeader("Path"); h != nil {
		t.Errorf("UDP client's REGISTER got Path %s", h.Value())
	}
	c.recvResponse(200)
}
