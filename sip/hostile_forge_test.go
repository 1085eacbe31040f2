package sip

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// The hostile tests of SLUICE-2026-002: each case sends an attacker's bytes
// over real loopback sockets to a real Server and asserts the safe
// behaviour. Absence of a message is never waited for: a client's own
// OPTIONS ping to the balancer (answered by the same reader goroutine, in
// arrival order) marks the point by which everything sent before it was
// handled, and the counters are read after it.

// eventLog collects the events a Server emits.
type eventLog struct {
	mu sync.Mutex
	ev []admission.Event
}

func (l *eventLog) sink(e admission.Event) {
	l.mu.Lock()
	l.ev = append(l.ev, e)
	l.mu.Unlock()
}

func (l *eventLog) find(kind admission.EventKind, sub string) []admission.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []admission.Event
	for _, e := range l.ev {
		if e.Kind == kind && strings.Contains(e.Message, sub) {
			out = append(out, e)
		}
	}
	return out
}

// forgeServer is testServer with backends given as addresses and an event
// log.
func forgeServer(t *testing.T, backends []netip.AddrPort, rules []string, mut func(*Config)) (*Server, *eventLog) {
	t.Helper()
	log := &eventLog{}
	return startServer(t, serverOpts{backends: backends, rules: rules, mut: mut, events: log.sink}), log
}

// rawUAS is a backend whose answers the test writes itself.
type rawUAS struct {
	conn *net.UDPConn
	addr netip.AddrPort
	done chan struct{}
}

func newRawUAS(t *testing.T, answer func(u *rawUAS, req *gosip.Request, from netip.AddrPort)) *rawUAS {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUAS{conn: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), done: make(chan struct{})}
	go func() {
		defer close(u.done)
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			m, err := gosip.ParseMessage(append([]byte(nil), buf[:n]...))
			if req, ok := m.(*gosip.Request); err == nil && ok {
				answer(u, req, from)
			}
		}
	}()
	t.Cleanup(func() {
		c.Close()
		<-u.done
	})
	return u
}

func (u *rawUAS) respond(req *gosip.Request, to netip.AddrPort, code int, reason string, mut func(*gosip.Response)) {
	res := gosip.NewResponseFromRequest(req, code, reason, nil)
	if code > 100 {
		res.To().Params.Add("tag", "raw")
	}
	if mut != nil {
		mut(res)
	}
	_, _ = u.conn.WriteToUDPAddrPort([]byte(res.String()), to)
}

// listenUDP opens a socket for a victim or an attacker.
func listenUDP(t *testing.T) (*net.UDPConn, netip.AddrPort) {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// quiet reports whether nothing is waiting on c. The caller made sure by
// a ping that anything sluice was going to send had been sent.
func quiet(c *net.UDPConn) bool {
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	buf := make([]byte, 65536)
	_, _, err := c.ReadFromUDPAddrPort(buf)
	return err != nil
}

// inviteFrom is an INVITE with the given top Via value.
func inviteFrom(lbAddr netip.AddrPort, via, callID, extra string) string {
	return fmt.Sprintf("INVITE sip:service@%s SIP/2.0\r\nVia: %s\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=f-%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\n%sContent-Length: 0\r\n\r\n",
		lbAddr, via, callID, callID, extra)
}

// finals keeps the final status codes of codes.
func finals(codes []int) []int {
	var out []int
	for _, c := range codes {
		if c >= 200 {
			out = append(out, c)
		}
	}
	return out
}

// sync sends a ping and returns the status codes of everything c got
// before its answer.
func (c *uac) sync(t *testing.T, tag string) []int {
	t.Helper()
	c.ping(tag)
	return c.untilPing(t, tag)
}

// preFixBranch is the branch sluice gave a forwarded request before the
// fix: FNV-1a of the client's branch, sent-by and the backend id, all of
// which a client knows.
func preFixBranch(clientBranch, host string, port int, backendID string) string {
	h := fnv64(fnvOffset, clientBranch+"|"+strings.ToLower(host)+":"+strconv.Itoa(port))
	h = fnv64(h^0xff, backendID)
	return proxyBranchPrefix + fmt.Sprintf("%016x", h)
}

func TestHostileForge(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"1 forged 503 drains no backend", hostileForged503},
		{"1 Retry-After capped, back-off is an event and a metric", hostileRetryAfterCap},
		{"2 no relay of forged responses", hostileReflector},
		{"7 received and rport always from the source", hostileViaRedirect},
		{"9 CANCEL only from the INVITE's source", hostileThirdPartyCancel},
		{"6 CANCEL without transaction answered 481", hostileCancelNoTxn},
		{"3 two nodes pointed at each other", hostileLoopTwoNodes},
		{"3 backend is our own listener", hostileLoopSelf},
		{"3 Max-Forwards capped at 70", hostileMaxForwardsCap},
		{"8 quoted comma in Via", hostileQuotedVia},
		{"8 too large for a datagram with our Via", hostileTooLargeAfterVia},
		{"8 in-dialog request too large with our Via", hostileTooLargeInDialog},
		{"8 TCP client whose Via says UDP", hostileTCPViaUDP},
		{"8 control characters in the head", hostileNUL},
		{"8 response with another CSeq method", hostileCSeqMismatch},
	} {
		t.Run(tc.name, tc.run)
	}
}

// hostileForged503: an attacker who knows a transaction's branch (the
// real one, or the predictable one of earlier releases) answers it 503
// Retry-After 3600 from its own address. No backend drains; the 503 is
// dropped and counted; the victim's call goes on.
func hostileForged503(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(modeRing)
	b2.mode.Store(modeRing)
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	victim := newUAC(t, s.udpAddr())
	k := victim.newCall()
	k.invite("")
	victim.recvResponse(180)
	var seen []seenReq
	for _, b := range []*uas{b1, b2} {
		seen = append(seen, b.find(gosip.INVITE, k.callID)...)
	}
	if len(seen) != 1 {
		t.Fatalf("INVITE reached %d backends", len(seen))
	}
	realBranch := seen[0].Branch
	atk := newUAC(t, s.udpAddr())
	forge := func(branch string) {
		atk.send(fmt.Sprintf("SIP/2.0 503 Service Unavailable\r\nVia: SIP/2.0/UDP %s;branch=%s\r\nVia: SIP/2.0/UDP %s;branch=%s;rport=%d;received=127.0.0.1\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>;tag=x\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nRetry-After: 3600\r\nContent-Length: 0\r\n\r\n",
			s.adv, branch, victim.addr, k.branch, victim.addr.Port(), k.callID, k.callID))
	}
	forge(realBranch)
	for _, id := range []string{"b1", "b2"} {
		forge(preFixBranch(k.branch, "127.0.0.1", int(victim.addr.Port()), id))
	}
	atk.sync(t, "f503")
	for _, b := range s.Backends() {
		if b.Draining || !b.Up {
			t.Errorf("backend %s draining=%v up=%v after forged 503s", b.ID, b.Draining, b.Up)
		}
	}
	if s.metrics.Backend503.Load() != 0 || s.metrics.Backoffs.Load() != 0 {
		t.Errorf("forged 503 taken: backend_503 %d, backoffs %d", s.metrics.Backend503.Load(), s.metrics.Backoffs.Load())
	}
	if s.metrics.ForgedResponses.Load() != 3 {
		t.Errorf("forged_responses = %d, want 3", s.metrics.ForgedResponses.Load())
	}
	if b1.count(gosip.INVITE, k.callID)+b2.count(gosip.INVITE, k.callID) != 1 {
		t.Error("the victim's INVITE was moved to another backend")
	}
	if codes := finals(victim.sync(t, "v503")); len(codes) != 0 {
		t.Errorf("victim got %v from the forgery", codes)
	}
	// A new call is still taken.
	k2 := victim.newCall()
	k2.invite("")
	victim.recvResponse(180)
}

// hostileRetryAfterCap: a real backend's 503 Retry-After 86399 keeps it
// from new work for lb.MaxAvoid at most; the back-off is counted and
// emitted as an event.
func hostileRetryAfterCap(t *testing.T) {
	be := newRawUAS(t, func(u *rawUAS, req *gosip.Request, from netip.AddrPort) {
		switch req.Method {
		case gosip.INVITE:
			u.respond(req, from, 503, "Service Unavailable", func(r *gosip.Response) { r.AppendHeader(gosip.NewHeader("Retry-After", "86399")) })
		case gosip.OPTIONS:
			u.respond(req, from, 200, "OK", nil)
		}
	})
	s, events := forgeServer(t, []netip.AddrPort{be.addr}, nil, nil)
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	before := s.clock.Now()
	k.invite("")
	c.recvResponse(500) // the only backend refused it
	b := s.pool.Load().list[0]
	if d := time.Duration(b.lb.BusyUntil() - before); d <= 0 || d > lb.MaxAvoid+time.Second {
		t.Errorf("backend kept from new work for %s after Retry-After: 86399, want at most %s", d, lb.MaxAvoid)
	}
	if s.metrics.Backoffs.Load() != 1 {
		t.Errorf("backend_backoffs = %d, want 1", s.metrics.Backoffs.Load())
	}
	if ev := events.find(admission.EventBackendState, "503"); len(ev) != 1 || ev[0].Subject != "sip b1" {
		t.Errorf("back-off events: %+v, want one for sip b1", ev)
	}
}

// hostileReflector: a "200 OK" from anywhere with our Via on top (any
// branch with our prefix) and a victim in the second Via is relayed to
// nobody.
func hostileReflector(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	vconn, vaddr := listenUDP(t)
	atk := newUAC(t, s.udpAddr())
	body := strings.Repeat("x", 1000)
	for i, br := range []string{
		proxyBranchPrefix + "0123456789abcdef",
		proxyBranchPrefix + "u" + strings.Repeat("0", branchLoopLen+branchMACLen),
		preFixBranch("z9hG4bK-v", vaddr.Addr().String(), int(vaddr.Port()), "down"),
	} {
		atk.send(fmt.Sprintf("SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP %s;branch=%s\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-v;received=%s;rport=%d\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:b@test>;tag=b\r\nCall-ID: refl-%d@test\r\nCSeq: 1 INVITE\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s",
			s.adv, br, vaddr, vaddr.Addr(), vaddr.Port(), i, len(body), body))
	}
	atk.sync(t, "refl")
	if n := s.metrics.Relayed.Load(); n != 0 {
		t.Errorf("%d forged responses relayed", n)
	}
	if !quiet(vconn) {
		t.Error("the victim received a relayed response")
	}
}

// hostileViaRedirect: a client that writes received and rport naming
// someone else in its own Via still gets the answers itself.
func hostileViaRedirect(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	vconn, vaddr := listenUDP(t)
	atk := newUAC(t, s.udpAddr())
	atk.send(inviteFrom(s.udpAddr(), fmt.Sprintf("SIP/2.0/UDP %s;branch=z9hG4bK-redir;received=%s;rport=%d", atk.addr, vaddr.Addr(), vaddr.Port()), "redir@test", ""))
	atk.recvResponse(180)
	atk.recvResponse(200)
	if !quiet(vconn) {
		t.Error("the address named in the client's Via received its answers")
	}
	inv := b1.find(gosip.INVITE, "redir@test")
	if len(inv) == 0 {
		t.Fatal("INVITE not forwarded")
	}
	var v *gosip.ViaHeader
	for _, h := range inv[0].Req.GetHeaders("Via") {
		if vh := h.(*gosip.ViaHeader); strings.Contains(vh.Params.String(), "z9hG4bK-redir") {
			v = vh
		}
	}
	rcv, _ := v.Params.Get("received")
	rp, _ := v.Params.Get("rport")
	if rcv != atk.addr.Addr().String() || rp != strconv.Itoa(int(atk.addr.Port())) {
		t.Errorf("client Via sent on with received=%s rport=%s, want %s", rcv, rp, atk.addr)
	}
}

// hostileThirdPartyCancel: a CANCEL copying another client's Via branch
// and sent-by, from another address, cancels nothing.
func hostileThirdPartyCancel(t *testing.T) {
	b1 := newUAS(t, "b1")
	b1.mode.Store(modeRing)
	s := testServer(t, []*uas{b1}, nil, nil)
	victim := newUAC(t, s.udpAddr())
	k := victim.newCall()
	k.invite("")
	victim.recvResponse(180)
	atk := newUAC(t, s.udpAddr())
	atk.send(fmt.Sprintf("CANCEL sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n",
		s.udpAddr(), victim.addr, k.branch, k.callID, k.callID))
	atk.recvResponse(481)
	if codes := finals(victim.sync(t, "tpc")); len(codes) != 0 {
		t.Errorf("victim got %v after a third party's CANCEL", codes)
	}
	if n := b1.count(gosip.CANCEL, k.callID); n != 0 {
		t.Errorf("backend got %d CANCELs from a third party", n)
	}
	// The victim's own CANCEL works.
	victim.send(fmt.Sprintf("CANCEL sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n",
		s.udpAddr(), victim.addr, k.branch, k.callID, k.callID))
	victim.recvResponseTo(gosip.CANCEL, 200)
	victim.recvResponseTo(gosip.INVITE, 487)
}

// hostileCancelNoTxn: CANCELs for calls that do not exist are answered
// 481 and never reach a backend, under an ARM rule or not.
func hostileCancelNoTxn(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, []string{"name=all,proto=sip,limit=10/s,action=reject"}, nil)
	s.localRate.Store(0) // 50 answers of our own and the pings, within a second
	atk := newUAC(t, s.udpAddr())
	const n = 50
	for i := range n {
		atk.send(fmt.Sprintf("CANCEL sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-nc%d;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=x%d\r\nTo: <sip:service@test>\r\nCall-ID: nc-%d@test\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n",
			s.udpAddr(), atk.addr, i, i, i))
	}
	codes := atk.sync(t, "nc")
	if len(codes) != n {
		t.Fatalf("%d answers to %d CANCELs: %v", len(codes), n, codes)
	}
	for _, c := range codes {
		if c != 481 {
			t.Fatalf("answers %v, want 481 each", codes)
		}
	}
	if got := b1.count(gosip.CANCEL, ""); got != 0 {
		t.Errorf("backend got %d CANCELs for unknown calls", got)
	}
}

// hostileLoopTwoNodes: two balancers, each the other's backend. An INVITE
// with Max-Forwards 1000 comes back to the first, which answers 482; it
// travels back along the loop to the client. Each node handles it a
// bounded number of times. With health checks on, the pings between them
// mark both backends down.
func hostileLoopTwoNodes(t *testing.T) {
	placeholder := newUAS(t, "placeholder")
	a := testServer(t, []*uas{placeholder}, nil, func(c *Config) { c.HealthInterval = 0 })
	b, _ := forgeServer(t, []netip.AddrPort{a.udpAddr()}, nil, func(c *Config) { c.HealthInterval = 0 })
	if err := a.SetBackends([]BackendConfig{{ID: "node-b", Addr: b.udpAddr().String()}}, nil); err != nil {
		t.Fatal(err)
	}
	c := newUAC(t, a.udpAddr())
	c.send(strings.Replace(inviteFrom(a.udpAddr(), fmt.Sprintf("SIP/2.0/UDP %s;branch=z9hG4bK-loop2;rport", c.addr), "loop2@test", ""), "Max-Forwards: 70", "Max-Forwards: 1000", 1))
	c.recvResponseTo(gosip.INVITE, 482)
	if codes := finals(c.sync(t, "loop2")); len(codes) != 0 {
		t.Errorf("after 482 the client got %v", codes)
	}
	// Each node sent the INVITE on once (a retransmission on Timer A, on a
	// slow machine, is not new work); a saw it come back.
	if na, nb := a.metrics.NewWork.Load(), b.metrics.NewWork.Load(); na != 1 || nb != 1 {
		t.Errorf("INVITE sent on %d times by a and %d by b, want once each", na, nb)
	}
	if a.metrics.Loops.Load() == 0 || b.metrics.Loops.Load() != 0 {
		t.Errorf("loops detected: a %d, b %d; want a only", a.metrics.Loops.Load(), b.metrics.Loops.Load())
	}
	t.Logf("messages handled: a %d, b %d", a.metrics.Requests.Load()+a.metrics.Responses.Load(), b.metrics.Requests.Load()+b.metrics.Responses.Load())

	// With health checks on, each node's ping to the other is answered
	// 482 (it comes from one of the answerer's backends), never forwarded:
	// both backends go down and the loop takes no more work.
	health := func(c *Config) {
		c.HealthInterval, c.HealthTimeout, c.HealthRise, c.HealthFall = 200*time.Millisecond, 150*time.Millisecond, 1, 1
	}
	ha := testServer(t, []*uas{placeholder}, nil, health)
	hb, _ := forgeServer(t, []netip.AddrPort{ha.udpAddr()}, nil, health)
	if err := ha.SetBackends([]BackendConfig{{ID: "node-b", Addr: hb.udpAddr().String()}}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both nodes mark the other down", func() bool {
		ba, bb := ha.Backends(), hb.Backends()
		return len(ba) == 1 && ba[0].ID == "node-b" && !ba[0].Up && len(bb) == 1 && !bb[0].Up
	})
	if ha.metrics.Forwarded.Load() != 0 || hb.metrics.Forwarded.Load() != 0 {
		t.Errorf("health pings forwarded: %d and %d requests", ha.metrics.Forwarded.Load(), hb.metrics.Forwarded.Load())
	}
	// Down because each answered the other's ping 482, not because a ping
	// went unanswered on a slow machine.
	eventually(t, "each node answers the other's ping 482", func() bool {
		return ha.metrics.Loops.Load() > 0 && hb.metrics.Loops.Load() > 0
	})
}

// hostileLoopSelf: a backend that is the balancer's own listener. The
// INVITE gets 482; with health checks on, the backend is marked down
// because our own ping comes back to us.
func hostileLoopSelf(t *testing.T) {
	placeholder := newUAS(t, "placeholder")
	s := testServer(t, []*uas{placeholder}, nil, func(c *Config) { c.HealthInterval = 0 })
	if err := s.SetBackends([]BackendConfig{{ID: "self", Addr: s.udpAddr().String()}}, nil); err != nil {
		t.Fatal(err)
	}
	c := newUAC(t, s.udpAddr())
	c.send(inviteFrom(s.udpAddr(), fmt.Sprintf("SIP/2.0/UDP %s;branch=z9hG4bK-self;rport", c.addr), "self@test", ""))
	c.recvResponseTo(gosip.INVITE, 482)
	if n := s.metrics.NewWork.Load(); n != 1 || s.metrics.Loops.Load() == 0 {
		t.Errorf("the INVITE was sent on %d times (want once) and %d loops detected", n, s.metrics.Loops.Load())
	}

	h := testServer(t, []*uas{placeholder}, nil, func(c *Config) {
		c.HealthInterval, c.HealthTimeout, c.HealthRise, c.HealthFall = 200*time.Millisecond, 150*time.Millisecond, 1, 1
	})
	if err := h.SetBackends([]BackendConfig{{ID: "self", Addr: h.udpAddr().String()}}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "our own listener marked down by its health ping", func() bool {
		bs := h.Backends()
		return len(bs) == 1 && bs[0].ID == "self" && !bs[0].Up
	})
	eventually(t, "our own ping answered 482 by ourselves", func() bool { return h.metrics.Loops.Load() > 0 })
}

// hostileMaxForwardsCap: Max-Forwards 1000 reaches the backend as 70.
func hostileMaxForwardsCap(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	c.send(strings.Replace(inviteFrom(s.udpAddr(), fmt.Sprintf("SIP/2.0/UDP %s;branch=z9hG4bK-mf;rport", c.addr), "mf@test", ""), "Max-Forwards: 70", "Max-Forwards: 1000", 1))
	c.recvResponse(180)
	c.recvResponse(200)
	inv := b1.find(gosip.INVITE, "mf@test")
	if len(inv) == 0 {
		t.Fatal("INVITE not forwarded")
	}
	if mf := inv[0].Req.MaxForwards(); mf == nil || mf.Val() != maxForwards {
		t.Errorf("backend got Max-Forwards %v, want %d", mf, maxForwards)
	}
}

// hostileQuotedVia: a quoted comma in a Via is refused, not split into
// two Vias with our received inside the quote.
func hostileQuotedVia(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	c.send(inviteFrom(s.udpAddr(), fmt.Sprintf(`SIP/2.0/UDP %s;branch=z9hG4bK-q;x="a,SIP/2.0/UDP 127.0.0.9:9"`, c.addr), "quoted@test", ""))
	if codes := c.sync(t, "quoted"); len(codes) != 1 || codes[0] != 400 {
		t.Errorf("got %v, want [400]", codes)
	}
	if n := b1.count(gosip.INVITE, "quoted@test"); n != 0 {
		t.Errorf("backend got %d INVITEs with a quoted comma in Via", n)
	}
}

// hostileTooLargeAfterVia: a request that fits a datagram only without
// our Via and Record-Route is answered 513, and no backend is blamed.
func hostileTooLargeAfterVia(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	_ = c.conn.SetWriteBuffer(1 << 20)
	head := inviteFrom(s.udpAddr(), fmt.Sprintf("SIP/2.0/UDP %s;branch=z9hG4bK-big;rport", c.addr), "big@test", "Content-Type: text/plain\r\n")
	head = strings.TrimSuffix(head, "Content-Length: 0\r\n\r\n")
	size := maxDatagram - 40 - len(head) - len("Content-Length: 00000\r\n\r\n")
	c.send(fmt.Sprintf("%sContent-Length: %05d\r\n\r\n%s", head, size, strings.Repeat("b", size)))
	c.recvResponse(513)
	if n := b1.count(gosip.INVITE, "big@test"); n != 0 {
		t.Errorf("backend got %d INVITEs", n)
	}
	for _, b := range s.Backends() {
		if b.Draining || !b.Up {
			t.Errorf("backend %s blamed for a request too large", b.ID)
		}
	}
}

// hostileTooLargeInDialog: the same for an in-dialog request, forwarded
// without state: 513, not 503.
func hostileTooLargeInDialog(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	_ = c.conn.SetWriteBuffer(1 << 20)
	k := c.newCall()
	k.invite("")
	c.recvResponse(180)
	k.learn(c.recvResponse(200))
	// Without our Route (a UA that ignores Record-Route): nothing of the
	// request is taken off, so our Via makes it larger.
	head := fmt.Sprintf("INFO %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s-info;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>;tag=%s\r\nCall-ID: %s\r\nCSeq: 2 INFO\r\nContent-Type: text/plain\r\n",
		k.target, c.addr, k.branch, k.callID, k.toTag, k.callID)
	size := maxDatagram - 40 - len(head) - len("Content-Length: 00000\r\n\r\n")
	c.send(fmt.Sprintf("%sContent-Length: %05d\r\n\r\n%s", head, size, strings.Repeat("b", size)))
	c.recvResponseTo(gosip.INFO, 513)
	if n := b1.count(gosip.INFO, k.callID); n != 0 {
		t.Errorf("backend got %d INFOs", n)
	}
}

// hostileTCPViaUDP: the answers to a request that came over TCP go back on
// its connection, whatever transport its Via names.
func hostileTCPViaUDP(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := dialTCP(t, s)
	c.write(inviteFrom(s.udpAddr(), "SIP/2.0/UDP "+c.conn.LocalAddr().String()+";branch=z9hG4bK-tv", "tcpvia@test", ""))
	c.response(180)
	c.response(200)
}

// hostileNUL: NUL bytes in a header, the Call-ID or the Request-URI get
// 400 and are not forwarded.
func hostileNUL(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	good := func(id string) string {
		return inviteFrom(s.udpAddr(), fmt.Sprintf("SIP/2.0/UDP %s;branch=z9hG4bK-%s;rport", c.addr, id), id+"@test", "X-Note: hello\r\n")
	}
	for _, m := range []string{
		strings.Replace(good("nul1"), "X-Note: hello", "X-Note: hel\x00lo", 1),
		strings.Replace(good("nul2"), "Call-ID: nul2@test", "Call-ID: nul2\x00x@test", 1),
		strings.Replace(good("nul3"), "INVITE sip:service@", "INVITE sip:serv\x00ice@", 1),
		strings.Replace(good("nul4"), "X-Note: hello", "X-Note: hel\x01lo", 1),
	} {
		c.send(m)
	}
	codes := c.sync(t, "nul")
	if len(codes) != 4 {
		t.Errorf("got %v, want four 400", codes)
	}
	for _, code := range codes {
		if code != 400 {
			t.Errorf("got %v, want four 400", codes)
			break
		}
	}
	if n := b1.count(gosip.INVITE, ""); n != 0 {
		t.Errorf("backend got %d INVITEs with control characters", n)
	}
}

// hostileCSeqMismatch: a backend answer carrying the INVITE's branch but
// another CSeq method is not relayed.
func hostileCSeqMismatch(t *testing.T) {
	be := newRawUAS(t, func(u *rawUAS, req *gosip.Request, from netip.AddrPort) {
		if req.Method != gosip.INVITE {
			u.respond(req, from, 200, "OK", nil)
			return
		}
		u.respond(req, from, 180, "Ringing", nil)
		u.respond(req, from, 200, "OK", func(r *gosip.Response) {
			r.CSeq().MethodName = gosip.BYE
		})
	})
	s, _ := forgeServer(t, []netip.AddrPort{be.addr}, nil, nil)
	c := newUAC(t, s.udpAddr())
	c.send(inviteFrom(s.udpAddr(), fmt.Sprintf("SIP/2.0/UDP %s;branch=z9hG4bK-cs;rport", c.addr), "cseq@test", ""))
	c.recvResponse(180)
	if codes := finals(c.sync(t, "cseq")); len(codes) != 0 {
		t.Errorf("got %v after the 180, want no final answer", codes)
	}
}
