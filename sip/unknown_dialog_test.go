package sip

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/admission"
)

// manualServer is testServer on a clock that moves only when the test
// moves it, so a rate rule's budget is exact.
func manualServer(t *testing.T, backends []*uas, rules []string, mut func(*Config)) (*Server, *admission.ManualClock) {
	t.Helper()
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	return startServer(t, serverOpts{backends: uasAddrs(backends), rules: rules, mut: mut, clock: clock}), clock
}

// strayInDialog sends n requests of method that look in-dialog (To-tag,
// no Route) with a fresh Call-ID each, and returns the answers by status
// code once n arrived (ACK: none expected, returns at once).
func strayInDialog(t *testing.T, c *uac, method string, n int) map[int]int {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("stray-%d-%d-%d@x", c.addr.Port(), c.seq.Add(1), i)
		c.send(fmt.Sprintf("%s sip:svc@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:a@x>;tag=f%d\r\nTo: <sip:b@x>;tag=t%d\r\nCall-ID: %s\r\nCSeq: 2 %s\r\nContent-Length: 0\r\n\r\n",
			method, c.addr, id, i, i, id, method))
	}
	got := map[int]int{}
	if method == "ACK" {
		return got
	}
	for total := 0; total < n; total++ {
		m := c.recv()
		if m == nil {
			t.Fatalf("%d of %d answers to stray %s, then silence: %v", total, n, method, got)
		}
		if res, ok := m.(*gosip.Response); ok {
			got[res.StatusCode]++
		}
	}
	return got
}

// A request that looks in-dialog but names no dialog sluice knows (no
// token, not in the dialog table) was affinity, admitted past every
// guard: a flood of BYEs with made-up tags and fresh Call-IDs all reached
// the backend whatever the ARM rules said. Under the default new-work it
// counts against the rules like new work; reject answers 481; hash keeps
// the old behaviour.
func TestUnknownDialogIsNotAffinity(t *testing.T) {
	const flood = 300
	rule := []string{"name=sip-all,proto=sip,limit=50/s,action=reject"}
	for _, tc := range []struct {
		policy  string
		reached int         // BYEs the backend got
		answers map[int]int // what the client got
	}{
		{UnknownDialogNewWork, 50, map[int]int{200: 50, 503: flood - 50}},
		{UnknownDialogReject, 0, map[int]int{481: flood}},
		{UnknownDialogHash, flood, map[int]int{200: flood}},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			u := newUAS(t, "b1")
			s, _ := manualServer(t, []*uas{u}, rule, func(c *Config) {
				c.UnknownDialog = tc.policy
				c.UnknownDialogSourceRate = 0 // the rule alone
			})
			s.localRate.Store(0) // 300 answers of our own to one source, on a clock that stands still
			c := newUAC(t, s.udpAddr())
			got := strayInDialog(t, c, "BYE", flood)
			if fmt.Sprint(got) != fmt.Sprint(tc.answers) {
				t.Errorf("answers %v, want %v", got, tc.answers)
			}
			if n := u.count(gosip.BYE, ""); n != tc.reached {
				t.Errorf("backend got %d of %d stray BYEs, want %d", n, flood, tc.reached)
			}
		})
	}
}

// A 481 of an unknown dialog under reject looked like the backend's own
// (a BYE after a restart that lost its dialog, say): the operator could
// not tell who answered. It carries a Warning naming the policy when the
// answer fits in what the client sent.
func TestUnknownDialogRejectWarning(t *testing.T) {
	u := newUAS(t, "b1")
	s, _ := manualServer(t, []*uas{u}, nil, func(c *Config) { c.UnknownDialog = UnknownDialogReject })
	c := newUAC(t, s.udpAddr())
	id := "warn-1@x"
	c.send(fmt.Sprintf("BYE sip:svc@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:a@x>;tag=f1\r\nTo: <sip:b@x>;tag=t1\r\nCall-ID: %s\r\nCSeq: 2 BYE\r\nUser-Agent: a phone that sends a header or two like every phone does\r\nContent-Length: 0\r\n\r\n",
		c.addr, id, id))
	res := c.recvResponse(481)
	w := res.GetHeader("Warning")
	if w == nil || w.Value() != `399 `+s.adv.String()+` "unknown dialog (-sip-unknown-dialog reject)"` {
		t.Errorf("481 Warning %v, want one naming -sip-unknown-dialog reject", w)
	}
}

// An ACK of an unknown dialog has no answer: under reject it is dropped,
// under new-work it is metered (over the rule: dropped too).
func TestUnknownDialogACK(t *testing.T) {
	for _, tc := range []struct {
		policy  string
		reached int
	}{{UnknownDialogReject, 0}, {UnknownDialogNewWork, 5}} {
		t.Run(tc.policy, func(t *testing.T) {
			u := newUAS(t, "b1")
			s, _ := manualServer(t, []*uas{u}, []string{"name=acks,proto=sip,method=ACK,limit=5/s,action=reject"}, func(c *Config) {
				c.UnknownDialog = tc.policy
				c.UnknownDialogSourceRate = 0
			})
			c := newUAC(t, s.udpAddr())
			strayInDialog(t, c, "ACK", 20)
			// An INVITE (not under the rule) after them: the backend reads
			// in order, so once it answered, every ACK sent reached it.
			c.newCall().invite("")
			c.recvResponse(180)
			if n := u.count(gosip.ACK, ""); n != tc.reached {
				t.Errorf("backend got %d of 20 stray ACKs, want %d", n, tc.reached)
			}
			if tc.policy == UnknownDialogReject && s.metrics.UnknownDialogRejected.Load() != 20 {
				t.Errorf("rejected %d, want 20", s.metrics.UnknownDialogRejected.Load())
			}
		})
	}
}

// One source's flood of unknown-dialog requests takes at most its share
// (-sip-unknown-dialog-source-rate) of the rule's budget; another source
// still gets through.
func TestUnknownDialogSourceShare(t *testing.T) {
	for _, tc := range []struct {
		rate         int
		floodReached int
		otherOK      int
	}{{20, 20, 10}, {0, 50, 0}} {
		t.Run(fmt.Sprint("rate=", tc.rate), func(t *testing.T) {
			u := newUAS(t, "b1")
			s, _ := manualServer(t, []*uas{u}, []string{"name=sip-all,proto=sip,limit=50/s,action=reject"}, func(c *Config) {
				c.UnknownDialogSourceRate = tc.rate
			})
			s.localRate.Store(0) // 80 answers of our own to one source, on a clock that stands still
			flooder := newUAC(t, s.udpAddr())
			got := strayInDialog(t, flooder, "BYE", 100)
			if got[200] != tc.floodReached {
				t.Errorf("flooder: %v, want %d answered by the backend", got, tc.floodReached)
			}
			// A second source address (127.0.0.2 is loopback too).
			other := newUACAt(t, s.udpAddr(), "127.0.0.2")
			got = strayInDialog(t, other, "BYE", 10)
			if got[200] != tc.otherOK {
				t.Errorf("other source: %v, want %d answered by the backend", got, tc.otherOK)
			}
		})
	}
}

// A dialog the table knows, and one whose request carries our token, stay
// affinity: admitted when the rule is spent by unknown ones.
func TestKnownDialogPassesSpentRule(t *testing.T) {
	u := newUAS(t, "b1")
	s, _ := manualServer(t, []*uas{u}, []string{"name=sip-all,proto=sip,limit=10/s,action=reject"}, func(c *Config) {
		c.UnknownDialogSourceRate = 0
	})
	c := newUAC(t, s.udpAddr())
	withRoute := c.newCall()
	withRoute.invite("")
	withRoute.c.recvResponse(180)
	withRoute.learn(c.recvResponse(200))
	withRoute.inDialog("ACK", 1, withRoute.branch+"-ack")
	noRoute := c.newCall()
	noRoute.invite("")
	c.recvResponse(180)
	noRoute.learn(c.recvResponse(200))
	noRoute.route = nil // a UA that ignores Record-Route
	noRoute.inDialog("ACK", 1, noRoute.branch+"-ack")
	got := strayInDialog(t, c, "BYE", 20)
	if got[200] != 8 || got[503] != 12 {
		t.Fatalf("stray BYEs: %v, want 8 admitted (10 less the two INVITEs) and 12 refused", got)
	}
	for _, k := range []*call{withRoute, noRoute} {
		k.inDialog("BYE", 2, k.branch+"-bye")
		c.recvResponseTo(gosip.BYE, 200)
	}
}

// newUACAt is newUAC bound to another loopback address, a second source.
func newUACAt(t testing.TB, lbAddr netip.AddrPort, ip string) *uac {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(ip)})
	if err != nil {
		t.Skipf("cannot bind %s: %v", ip, err)
	}
	t.Cleanup(func() { c.Close() })
	return &uac{t: t, conn: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), lb: lbAddr}
}

// The per-source table: a cap per address and second, an IPv6 source
// counted by its /64, other sources apart.
func TestSourceShareTable(t *testing.T) {
	var sh sourceShare
	sec := int64(time.Hour)
	a := netip.MustParseAddr("192.0.2.1")
	for i := range 5 {
		if !sh.allow(a, sec, 5) {
			t.Fatalf("request %d of 5 refused", i+1)
		}
	}
	if sh.allow(a, sec, 5) {
		t.Error("sixth request in one second allowed")
	}
	// Another source, in another slot (two in one slot share a cap).
	other := netip.MustParseAddr("192.0.2.2")
	for sh.slot(other) == sh.slot(a) {
		other = other.Next()
	}
	if !sh.allow(netip.AddrFrom16(other.As16()), sec, 5) { // as ::ffff:a.b.c.d
		t.Error("another source refused")
	}
	if !sh.allow(a, sec+int64(time.Second), 5) {
		t.Error("next second refused")
	}
	v6 := netip.MustParseAddr("2001:db8::1")
	for range 5 {
		sh.allow(v6, sec, 5)
	}
	if sh.allow(netip.MustParseAddr("2001:db8::ffff:1"), sec, 5) {
		t.Error("another address of the same /64 has a cap of its own")
	}
	other6 := netip.MustParseAddr("2001:db8:0:1::1")
	for sh.slot(other6) == sh.slot(v6) || sh.slot(other6) == sh.slot(a) {
		other6 = netip.AddrFrom16([16]byte(append(other6.AsSlice()[:7:7], other6.AsSlice()[7]+1, 0, 0, 0, 0, 0, 0, 0, 1)))
	}
	if !sh.allow(other6, sec, 5) {
		t.Error("another /64 refused")
	}
	if !sh.allow(a, sec, 0) {
		t.Error("rate 0 (no cap) refused")
	}
}
