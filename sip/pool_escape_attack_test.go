package sip

import (
	"fmt"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// TestAttackUnknownDialogHashIgnoresRoutes: under -sip-unknown-dialog
// hash a request with a made-up To-tag (no token, a dialog nobody knows)
// is admitted as affinity and sent to the pool "default", else the first
// pool, whatever the routes say: a BYE whose Request-URI the routes give
// to paris reaches london, and one no route matches (new work would get
// 404: there is no pool default) reaches london too. hash keeps the
// former admission, but nothing obliges it to ignore the routes: it
// should pick the pool as new work does and answer 404 where new work
// would.
func TestAttackUnknownDialogHashIgnoresRoutes(t *testing.T) {
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

// TestAttackUnknownDialogReachesDrainedPool: a request with a made-up
// To-tag is metered as new work under -sip-unknown-dialog new-work
// (SLUICE-2026-009), but it is sent to the pool's Call-ID hash home
// (lb.Pool.Home), which falls back to a backend that takes no new work
// when none does: with every backend of london drained (sluice ctl
// drain-pool london), anyone can still put "new work" on them, 20/s per
// source address, while genuine INVITEs to london are refused. New work
// of a drained pool should be refused (503, no backend available), as the
// INVITE is.
func TestAttackUnknownDialogReachesDrainedPool(t *testing.T) {
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
		c.awaitResponse(gosip.INFO, 503, 200)
	}
	if n := ldn.count(gosip.INFO, ""); n != 0 {
		t.Errorf("the drained london backend got %d requests of unknown dialogs metered as new work, want 0", n)
	}
}
