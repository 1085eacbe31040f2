package sip

import (
	"fmt"
	"strings"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// TestUnknownDialogHashFollowsRoutes: under -sip-unknown-dialog hash a
// request with a made-up To-tag (no token, a dialog nobody knows) keeps
// the admission of affinity, but its pool is the one the routes give, as
// for new work: a BYE whose Request-URI the routes give to paris reaches
// paris, and one no route matches (there is no pool default) gets the
// no-route answer, 404.
func TestUnknownDialogHashFollowsRoutes(t *testing.T) {
	ldn := newUAS(t, "ldn")
	par := newUAS(t, "par")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london", par.addr.String() + ",id=par,pool=paris"},
		[]string{"pool=london,user=+4420", "pool=paris,user=+33"}, nil, func(c *Config) { c.UnknownDialog = UnknownDialogHash })
	c := newUAC(t, s.udpAddr())
	bye := func(user string) *call {
		k := c.newCall()
		c.send(fmt.Sprintf("BYE sip:%s@voice.example SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:m@a.example>;tag=a1\r\nTo: <sip:%s@voice.example>;tag=made-up\r\nCall-ID: %s\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n",
			user, c.addr, k.branch, user, k.callID))
		return k
	}
	k := bye("+331234")
	c.awaitResponse(gosip.BYE, 200, 200)
	if l, p := ldn.count(gosip.BYE, k.callID), par.count(gosip.BYE, k.callID); l != 0 || p != 1 {
		t.Errorf("BYE routed to paris by its Request-URI reached london %d, paris %d times; want paris once", l, p)
	}
	k = bye("+15550100")
	c.awaitResponse(gosip.BYE, 404, 200)
	if n := ldn.count(gosip.BYE, k.callID) + par.count(gosip.BYE, k.callID); n != 0 {
		t.Errorf("a BYE no route matches (no pool default) reached a backend %d times", n)
	}
}

// TestAttackNoRouteReflector: the answer to new work no route matches
// (no pool default) is built and sent to the source address for every
// request, without a per-source share, and is about twice the request's
// size (compact headers expanded, a To-tag, Warning and Server added).
// From a spoofed UDP source that is a reflector with amplification: here
// 200 requests of 118 bytes from one address bring back 200 answers of
// 229 bytes. Bytes sent back to one source should not exceed the bytes it
// sent (a per-source share of local answers, as the unknown-dialog share
// does for forwarding, or answers no larger than the request).
func TestAttackNoRouteReflector(t *testing.T) {
	ldn := newUAS(t, "ldn")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london"}, []string{"pool=london,user=+4420"}, nil, nil)
	c := newUAC(t, s.udpAddr())
	const n = 200
	in, out := 0, 0
	for i := range n {
		req := fmt.Sprintf("MESSAGE sip:1@x SIP/2.0\r\nv: SIP/2.0/UDP a;branch=z9hG4bK%d\r\nf: <sip:a@b>;tag=1\r\nt: <sip:1@x>\r\ni: c%d\r\nCSeq: 1 MESSAGE\r\n\r\n", i%10, i%10)
		in += len(req)
		c.send(req)
	}
	eventually(t, "every request handled", func() bool { return s.metrics.NoRoute.Load() == n })
	buf := make([]byte, 65536)
	_ = c.conn.SetReadDeadline(timeNowPlusWait())
	m, _, err := c.conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no answer at all: %v", err)
	}
	out = int(s.metrics.LocalReplies.Load()) * m
	t.Logf("%d requests, %d bytes in; %d answers of %d bytes, %d bytes out", n, in, s.metrics.LocalReplies.Load(), m, out)
	if out > in {
		t.Errorf("%d bytes sent back to one source for %d bytes received (amplification %.2f)", out, in, float64(out)/float64(in))
	}
}

func timeNowPlusWait() time.Time { return time.Now().Add(wait) }

// TestUnknownDialogRefusedOnDrainedPool: a request with a made-up To-tag
// is metered as new work under -sip-unknown-dialog new-work
// (SLUICE-2026-009), so with every backend of london drained (sluice ctl
// drain-pool london) it is refused as the INVITE is: 503, Warning "no
// backend available pool london", and nothing reaches the drained
// backend.
func TestUnknownDialogRefusedOnDrainedPool(t *testing.T) {
	ldn := newUAS(t, "ldn")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london"}, []string{"pool=london,user=+4420"}, nil, nil)
	for _, b := range s.Generation().Pool("london").Backends() {
		b.Drain(true)
	}
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.inviteTo("sip:+442079460000@voice.example", "a.example")
	c.awaitResponse(gosip.INVITE, 503, 200)
	for i := range 5 {
		k := c.newCall()
		c.send(fmt.Sprintf("INFO sip:+442079460000@voice.example SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:m@a.example>;tag=a1\r\nTo: <sip:x@voice.example>;tag=made-up-%d\r\nCall-ID: %s\r\nCSeq: 1 INFO\r\nContent-Length: 0\r\n\r\n",
			c.addr, k.branch, i, k.callID))
		r := c.awaitResponse(gosip.INFO, 503, 200)
		if w := r.GetHeader("warning"); w == nil || !strings.Contains(w.Value(), "no backend available pool london") {
			t.Errorf("503 with Warning %v, want one naming no backend available pool london", w)
		}
	}
	if n := ldn.count(gosip.INFO, ""); n != 0 {
		t.Errorf("the drained london backend got %d requests of unknown dialogs metered as new work, want 0", n)
	}
}
