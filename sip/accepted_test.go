package sip

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

func TestAcceptedSetGenerations(t *testing.T) {
	var a acceptedSet
	const L = int64(acceptedLinger)
	a.addLocked([]string{"x"}, 0)
	for _, tc := range []struct {
		br   string
		now  int64
		want bool
	}{
		{"x", 0, true}, {"y", 0, false}, {"x", L - 1, true},
	} {
		if got := a.hasLocked(tc.br, tc.now); got != tc.want {
			t.Errorf("has(%s) at %d = %v, want %v", tc.br, tc.now, got, tc.want)
		}
	}
	a.addLocked([]string{"y"}, L) // x moves to the older generation
	if !a.hasLocked("x", L+1) || !a.hasLocked("y", L+1) {
		t.Error("after one swap both generations are kept")
	}
	a.addLocked([]string{"z"}, 2*L) // x is forgotten
	if a.hasLocked("x", 2*L) || !a.hasLocked("y", 2*L) || !a.hasLocked("z", 2*L) {
		t.Error("after two swaps the oldest generation is gone")
	}
	if a.hasLocked("z", 4*L) || a.lenLocked() != 0 {
		t.Error("nothing is kept two lingers after the last addition")
	}
}

// TestLateProvisionalAfter2xxNotRelayed: a backend's 180 that comes after
// its 200 (a late or retransmitted provisional answer) is not relayed once
// the INVITE has its 2xx; a retransmitted 200 still is. Relayed, the 180
// reached the client after its BYE was sent, and SIPp aborted the call.
func TestLateProvisionalAfter2xxNotRelayed(t *testing.T) {
	be, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	s := startServer(t, serverOpts{backends: []netip.AddrPort{be.LocalAddr().(*net.UDPAddr).AddrPort()}})
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")

	// The backend reads the INVITE and answers 180, then 200.
	buf := make([]byte, 65536)
	be.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, from, err := be.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	m, err := gosip.ParseMessage(append([]byte(nil), buf[:n]...))
	if err != nil {
		t.Fatal(err)
	}
	inv := m.(*gosip.Request)
	answer := func(code int, reason string) {
		t.Helper()
		res := gosip.NewResponseFromRequest(inv, code, reason, nil)
		res.To().Params.Add("tag", "be")
		res.AppendHeader(&gosip.ContactHeader{Address: gosip.Uri{Scheme: "sip", Host: "127.0.0.1", Port: int(be.LocalAddr().(*net.UDPAddr).Port)}})
		if _, err := be.WriteToUDPAddrPort([]byte(res.String()), from); err != nil {
			t.Fatal(err)
		}
	}
	answer(180, "Ringing")
	answer(200, "OK")
	c.recvResponseTo(gosip.INVITE, 180)
	c.recvResponseTo(gosip.INVITE, 200)

	// Late: another 180, then the 200 again.
	answer(180, "Ringing")
	answer(200, "OK")
	codes := c.sync(t, fmt.Sprintf("late-%d", k.cseq))
	if slices.Contains(codes, 180) {
		t.Errorf("a 180 after the 200 was relayed to the client: %v", codes)
	}
	if !slices.Contains(codes, 200) {
		t.Errorf("the backend's retransmitted 200 was not relayed: %v", codes)
	}
}

// rawBackend is a UDP backend the test answers by hand.
type rawBackend struct {
	t    *testing.T
	conn *net.UDPConn
}

func newRawBackend(t *testing.T) *rawBackend {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawBackend{t: t, conn: c}
}

func (b *rawBackend) addr() netip.AddrPort { return b.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// read returns the next request of method (others are skipped).
func (b *rawBackend) read(method gosip.RequestMethod) (*gosip.Request, netip.AddrPort) {
	b.t.Helper()
	buf := make([]byte, 65536)
	b.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		n, from, err := b.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			b.t.Fatalf("backend: no %s: %v", method, err)
		}
		m, err := gosip.ParseMessage(append([]byte(nil), buf[:n]...))
		if err != nil {
			continue
		}
		if req, ok := m.(*gosip.Request); ok && req.Method == method {
			return req, from
		}
	}
}

func (b *rawBackend) answer(req *gosip.Request, to netip.AddrPort, code int, reason string) {
	b.t.Helper()
	res := gosip.NewResponseFromRequest(req, code, reason, nil)
	if code > 100 {
		res.To().Params.Add("tag", "be"+strconv.Itoa(int(b.addr().Port())))
	}
	res.AppendHeader(&gosip.ContactHeader{Address: gosip.Uri{Scheme: "sip", Host: "127.0.0.1", Port: int(b.addr().Port())}})
	if _, err := b.conn.WriteToUDPAddrPort([]byte(res.String()), to); err != nil {
		b.t.Fatal(err)
	}
}

// TestEarlierAttemptAnswersAfterFailover: b1 is silent until the INVITE
// moved on to b2, then answers 200. The call is b1's: the client gets that
// 200, b2's attempt is CANCELed, nothing of b2's attempt (180, 487, the
// CANCEL's 200) reaches the client, a retransmitted INVITE gets no 100
// Trying, and the dialog table names b1. Before, the transaction stayed
// live for b2: the client's retransmissions got 100 Trying after its 200
// (SIPp aborts such a call) and b2 could set up a second call.
func TestEarlierAttemptAnswersAfterFailover(t *testing.T) {
	b1, b2 := newRawBackend(t), newRawBackend(t)
	s := startServer(t, serverOpts{backends: []netip.AddrPort{b1.addr(), b2.addr()}, mut: func(c *Config) {
		c.Policy = "round-robin"
		c.HealthInterval = 0
	}})
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")
	inv1, from1 := b1.read(gosip.INVITE) // b1 says nothing: after FailoverTimeout the INVITE moves
	inv2, from2 := b2.read(gosip.INVITE)
	b1.answer(inv1, from1, 200, "OK")
	res := c.recvResponseTo(gosip.INVITE, 200)
	if tag, _ := res.To().Params.Get("tag"); tag != "be"+strconv.Itoa(int(b1.addr().Port())) {
		t.Fatalf("the client got the 200 of %q, want b1's", tag)
	}
	cancel, _ := b2.read(gosip.CANCEL)
	if br, _ := cancel.Via().Params.Get("branch"); br != func() string { b, _ := inv2.Via().Params.Get("branch"); return b }() {
		t.Errorf("CANCEL branch %q is not b2's INVITE's", br)
	}
	b2.answer(inv2, from2, 180, "Ringing")
	b2.answer(cancel, from2, 200, "OK")
	b2.answer(inv2, from2, 487, "Request Terminated")
	k.invite("") // the client's retransmission, crossing its 200
	codes := c.sync(t, "earlier-attempt")
	if len(codes) != 0 {
		t.Errorf("after b1's 200 the client got %v, want nothing", codes)
	}
	if id, ok := s.dialogs.peek(k.callID, "a"+k.callID, "", s.clock.Now()); !ok || id != "b1" {
		t.Errorf("the dialog table names %q (%v), want b1", id, ok)
	}
	if n := s.metrics.EarlierAttemptAnswered.Load(); n != 1 {
		t.Errorf("earlier_attempt_answered %d, want 1", n)
	}
}

// TestEarlierAttemptAnswersWhileSwitching: the 2xx of the attempt we are
// leaving arrives after the failover decided to move on but before the
// next attempt is sent (stSwitching). The transaction ends with that 2xx:
// the next attempt is not sent, so no second call is set up on another
// backend and the dialog entry is not taken back from the answered call
// (under load it was, and outlived the call by an hour).
func TestEarlierAttemptAnswersWhileSwitching(t *testing.T) {
	b1, b2 := newRawBackend(t), newRawBackend(t)
	s := startServer(t, serverOpts{backends: []netip.AddrPort{b1.addr(), b2.addr()}, mut: func(c *Config) {
		c.Policy = "round-robin"
		c.HealthInterval = 0
		c.FailoverTimeout = time.Hour // the test moves the transaction itself
	}})
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")
	inv1, from1 := b1.read(gosip.INVITE)
	// What the failover timer does before it picks the next backend.
	s.txns.mu.Lock()
	var tx *txn
	for _, x := range s.txns.byClient {
		tx = x
	}
	tx.state = stSwitching
	s.txns.mu.Unlock()
	b1.answer(inv1, from1, 200, "OK")
	c.recvResponseTo(gosip.INVITE, 200)
	sent := s.metrics.NewWork.Load()
	s.attempt(tx, s.clock.Now(), true) // the failover goes on: it must send nothing
	if n := s.metrics.NewWork.Load(); n != sent {
		t.Errorf("the INVITE was sent again after its 2xx (%d attempts, want %d)", n, sent)
	}
	if n := s.txns.Len(); n != 0 {
		t.Errorf("%d transactions left, want 0", n)
	}
	if id, ok := s.dialogs.peek(k.callID, "a"+k.callID, "", s.clock.Now()); !ok || id != "b1" {
		t.Errorf("the dialog table names %q (%v), want b1", id, ok)
	}
}
