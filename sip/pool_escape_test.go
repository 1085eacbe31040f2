package sip

import (
	"fmt"
	"net/netip"
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

// TestLocalRepliesNoLargerThanRequests: the answers the balancer builds
// itself to requests it does not forward (no route, 400, 403, 481, the
// OPTIONS it answers) go to the source address of a datagram, which
// anyone may spoof; so none is larger than its request. Each request is
// sent alone, then a ping (an OPTIONS for the balancer) whose answer ends
// what it brought back: the bytes of the answers to the request are at
// most the request's, and a request written as UAs write them gets its
// answer (without its Warning or Allow list when they do not fit). A
// request stripped to less than its answer, compact headers and no
// Max-Forwards (the review's 118 bytes that brought back 229), gets none.
func TestLocalRepliesNoLargerThanRequests(t *testing.T) {
	ldn := newUAS(t, "ldn")
	s := poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london"}, []string{"pool=london,user=+4420"}, nil, nil)
	s.localRate.Store(0) // the share is TestLocalReplyShare's
	c := newUAC(t, s.udpAddr())
	const ua = "Max-Forwards: 70\r\nUser-Agent: softphone 4.2\r\nContent-Length: 0\r\n\r\n"
	tests := []struct {
		name string
		req  string // {client}: the client's address, {lb}: the balancer's
		want int    // the code answered, 0: none
	}{
		{"no route, stripped, compact", "MESSAGE sip:1@x SIP/2.0\r\nv: SIP/2.0/UDP a;branch=z9hG4bK1\r\nf: <sip:a@b>;tag=1\r\nt: <sip:1@x>\r\ni: c1\r\nCSeq: 1 MESSAGE\r\n\r\n", 0},
		{"no route, as UAs send", "MESSAGE sip:1@x SIP/2.0\r\nVia: SIP/2.0/UDP {client};branch=z9hG4bK2;rport\r\nFrom: <sip:a@b.example>;tag=1\r\nTo: <sip:1@x>\r\nCall-ID: c2\r\nCSeq: 1 MESSAGE\r\n" + ua, 404},
		{"OPTIONS Max-Forwards 0, stripped", "OPTIONS sip:1@x SIP/2.0\r\nv: SIP/2.0/UDP a;branch=z9hG4bK3\r\nf: <sip:a@b>;tag=1\r\nt: <sip:1@x>\r\ni: c3\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 0\r\n\r\n", 0},
		{"OPTIONS Max-Forwards 0, as UAs send", "OPTIONS sip:1@x SIP/2.0\r\nVia: SIP/2.0/UDP {client};branch=z9hG4bK4;rport\r\nFrom: <sip:a@b.example>;tag=1\r\nTo: <sip:1@x>\r\nCall-ID: c4\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 0\r\nUser-Agent: softphone 4.2\r\nContent-Length: 0\r\n\r\n", 200},
		{"OPTIONS with a health-ping branch", "OPTIONS sip:{lb} SIP/2.0\r\nVia: SIP/2.0/UDP {client};branch=" + pingBranchPrefix + "x5;rport\r\nFrom: <sip:a@b.example>;tag=1\r\nTo: <sip:{lb}>\r\nCall-ID: c5\r\nCSeq: 1 OPTIONS\r\n" + ua, 200},
		{"CANCEL of nothing", "CANCEL sip:+442079460000@voice.example SIP/2.0\r\nVia: SIP/2.0/UDP {client};branch=z9hG4bK6;rport\r\nFrom: <sip:a@b.example>;tag=1\r\nTo: <sip:+442079460000@voice.example>\r\nCall-ID: c6\r\nCSeq: 1 CANCEL\r\n" + ua, 481},
		{"forged token", "BYE sip:+442079460000@voice.example SIP/2.0\r\nVia: SIP/2.0/UDP {client};branch=z9hG4bK7;rport\r\nRoute: <sip:{lb};lr;sl=forged>\r\nFrom: <sip:a@b.example>;tag=1\r\nTo: <sip:x@voice.example>;tag=2\r\nCall-ID: c7\r\nCSeq: 2 BYE\r\n" + ua, 403},
		{"two Froms", "MESSAGE sip:+4420@x SIP/2.0\r\nVia: SIP/2.0/UDP {client};branch=z9hG4bK8;rport\r\nFrom: <sip:a@b.example>;tag=1\r\nf: <sip:a@c.example>;tag=1\r\nTo: <sip:1@x>\r\nCall-ID: c8\r\nCSeq: 1 MESSAGE\r\n" + ua, 400},
		{"unparsable (quoted Via), stripped", "MESSAGE sip:1@x SIP/2.0\r\nv: SIP/2.0/UDP a;branch=z9hG4bK9;x=\"q\"\r\nf: <sip:a@b>;tag=1\r\nt: <sip:1@x>\r\ni: c9\r\nCSeq: 1 MESSAGE\r\n\r\n", 0},
		{"unparsable (quoted Via), as UAs send", "MESSAGE sip:1@x SIP/2.0\r\nVia: SIP/2.0/UDP {client};branch=z9hG4bK10;x=\"q\"\r\nFrom: <sip:a@b.example>;tag=1\r\nTo: <sip:1@x>\r\nCall-ID: c10\r\nCSeq: 1 MESSAGE\r\n" + ua, 400},
	}
	buf := make([]byte, 65536)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := strings.NewReplacer("{client}", c.addr.String(), "{lb}", s.udpAddr().String()).Replace(tc.req)
			c.send(req)
			tag := fmt.Sprint("lr", i)
			c.ping(tag)
			out, code := 0, 0
			for {
				_ = c.conn.SetReadDeadline(timeNowPlusWait())
				n, _, err := c.conn.ReadFromUDPAddrPort(buf)
				if err != nil {
					t.Fatalf("no answer to the ping: %v", err)
				}
				if strings.Contains(string(buf[:n]), "ping-"+tag+"@test") {
					break
				}
				out += n
				_, _ = fmt.Sscanf(string(buf[:n]), "SIP/2.0 %d ", &code)
			}
			if out > len(req) {
				t.Errorf("%d bytes answered to a request of %d", out, len(req))
			}
			if code != tc.want {
				t.Errorf("answered %d, want %d (0: none)", code, tc.want)
			}
		})
	}
	if s.metrics.LocalRepliesShed.Load() == 0 {
		t.Error("local_replies_shed counts nothing")
	}
}

func timeNowPlusWait() time.Time { return time.Now().Add(wait) }

// TestLocalReplyShare: a UDP source gets at most localReplySourceRate
// answers of our own per second (an IPv6 one per /64), counted in
// local_replies_shed past it; another source has its own share, a new
// second a new one, and a TCP peer (its address proven) has none.
func TestLocalReplyShare(t *testing.T) {
	b1 := newUAS(t, "b1")
	s, clock := manualServer(t, []*uas{b1}, nil, nil)
	a := source{addr: netip.MustParseAddrPort("192.0.2.1:5060")}
	b := source{addr: netip.MustParseAddrPort("192.0.2.2:5060")}
	v6a := source{addr: netip.MustParseAddrPort("[2001:db8::1]:5060")}
	v6b := source{addr: netip.MustParseAddrPort("[2001:db8::2]:5060")}
	count := func(src source, n int) (ok int) {
		for range n {
			if s.localAllowed(src) {
				ok++
			}
		}
		return ok
	}
	if got := count(a, 2*localReplySourceRate); got != localReplySourceRate {
		t.Errorf("source a: %d allowed of %d, want %d", got, 2*localReplySourceRate, localReplySourceRate)
	}
	if n := s.metrics.LocalRepliesShed.Load(); n != localReplySourceRate {
		t.Errorf("local_replies_shed %d, want %d", n, localReplySourceRate)
	}
	if got := count(b, localReplySourceRate); got != localReplySourceRate {
		t.Errorf("source b: %d allowed, want its own share %d", got, localReplySourceRate)
	}
	if got := count(v6a, localReplySourceRate) + count(v6b, localReplySourceRate); got != localReplySourceRate {
		t.Errorf("one /64: %d allowed, want one share %d", got, localReplySourceRate)
	}
	if got := count(source{addr: a.addr, conn: &tcpConn{}}, 10); got != 10 {
		t.Errorf("TCP peer: %d of 10 allowed, want all", got)
	}
	clock.Advance(time.Second)
	if got := count(a, 1); got != 1 {
		t.Error("source a: nothing allowed in the next second")
	}
}

// TestUnknownDialogRefusedOnDrainedPool: a request with a made-up To-tag
// is metered as new work under -sip-unknown-dialog new-work
// (SLUICE-2026-009), so with every backend of london drained (sluice ctl
// drain-pool london) it is refused as the INVITE is: 503, Warning "pool
// london drained" (the operator's drain named as such), and nothing
// reaches the drained backend.
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
		if w := r.GetHeader("warning"); w == nil || !strings.Contains(w.Value(), "pool london drained") {
			t.Errorf("503 with Warning %v, want one saying pool london drained", w)
		}
	}
	// A method that can create a dialog is metered as new work under
	// every policy: a made-up To-tag on it finds no drained backend
	// either, under hash too.
	s = poolServer(t, []string{ldn.addr.String() + ",id=ldn,pool=london"}, []string{"pool=london,user=+4420"}, nil,
		func(c *Config) { c.UnknownDialog = UnknownDialogHash })
	for _, b := range s.Generation().Pool("london").Backends() {
		b.Drain(true)
	}
	c = newUAC(t, s.udpAddr())
	k = c.newCall()
	c.send(fmt.Sprintf("INVITE sip:+442079460000@voice.example SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:m@a.example>;tag=a1\r\nTo: <sip:x@voice.example>;tag=made-up\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:m@a.example>\r\nContent-Length: 0\r\n\r\n",
		c.addr, k.branch, k.callID))
	c.awaitResponse(gosip.INVITE, 503, 200)
	if n := ldn.count(gosip.INVITE, ""); n != 0 {
		t.Errorf("the drained london backend got %d INVITEs, want 0", n)
	}
	if n := ldn.count(gosip.INFO, ""); n != 0 {
		t.Errorf("the drained london backend got %d requests of unknown dialogs metered as new work, want 0", n)
	}
}
