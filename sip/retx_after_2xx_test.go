package sip

import (
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// TestInviteRetransmittedAfter2xx: a client's retransmission of its INVITE
// that crossed the 2xx (its transaction ended with the 2xx) is absorbed,
// not sent again as new work. Before the fix round-robin sent it to the
// other backend, which set up a second call, and the dialog table then
// sent the client's token-less ACK and BYE there.
func TestInviteRetransmittedAfter2xx(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, nil, func(c *Config) { c.Policy = "round-robin" })
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")
	c.recvResponse(180)
	k.learn(c.recvResponse(200))
	home, other := whereInvite(t, k, b1, b2)
	k.invite("") // the same INVITE again: it crossed the 200
	time.Sleep(200 * time.Millisecond)
	if n, m := home.count(gosip.INVITE, k.callID), other.count(gosip.INVITE, k.callID); n != 1 || m != 0 {
		t.Fatalf("INVITEs at the call's backend %d, at the other %d; want 1 and 0", n, m)
	}
	if got := s.metrics.Retransmissions.Load(); got != 1 {
		t.Errorf("retransmissions %d, want 1", got)
	}
	k.tokenless(s.udpAddr().String())
	k.inDialog("ACK", 1, k.branch+"-ack")
	k.inDialog("BYE", 2, k.branch+"-bye")
	c.recvResponseTo(gosip.BYE, 200)
	if n := home.count(gosip.BYE, k.callID); n != 1 {
		t.Errorf("BYE at the call's backend %d times, want 1", n)
	}
	// Another call from the same client is new work as usual.
	k2 := c.newCall()
	k2.invite("")
	c.recvResponse(180)
	c.recvResponse(200)
}
