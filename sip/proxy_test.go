package sip

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// TestCallsAcrossBackends: INVITE/180/200/ACK/BYE through the proxy to two
// backends; the ACK, a re-INVITE and the BYE of each call reach the
// backend of its INVITE, and both backends get calls: with the UDP
// socket read in batches (the default) and one datagram a call
// (-sip-udp-batch 1), each with net's sendto and the raw one
// (-sip-udp-raw-send), and with the sends of a read batch queued
// (-sip-udp-send-batch).
func TestCallsAcrossBackends(t *testing.T) {
	for _, tc := range []struct {
		batch     int
		raw, send bool
	}{{16, false, false}, {16, true, false}, {1, false, false}, {1, true, false}, {16, false, true}, {16, true, true}} {
		t.Run(fmt.Sprintf("udp-batch-%d-raw-send-%v-send-batch-%v", tc.batch, tc.raw, tc.send), func(t *testing.T) {
			s := callsAcrossBackends(t, func(c *Config) { c.UDPBatch, c.UDPRawSend, c.UDPSendBatch = tc.batch, tc.raw, tc.send })
			if tc.send != (s.udpOut != nil) {
				t.Errorf("-sip-udp-send-batch %v: send queue %v", tc.send, s.udpOut != nil)
			}
			if !tc.raw && s.udpRaw != nil {
				t.Error("raw sendto in use without -sip-udp-raw-send")
			}
			if tc.raw && s.udpRaw == nil && runtime.GOOS == "linux" {
				t.Error("-sip-udp-raw-send on Linux: raw sendto not in use")
			}
		})
	}
}

func callsAcrossBackends(t *testing.T, mut func(*Config)) *Server {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, nil, mut)
	c := newUAC(t, s.udpAddr())
	const calls = 40
	for i := 0; i < calls; i++ {
		k := c.newCall()
		k.invite("")
		if r := c.recvResponse(180); r.GetHeader("record-route") == nil {
			t.Fatal("180 lost the Record-Route")
		}
		ok := c.recvResponse(200)
		k.learn(ok)
		if len(k.route) != 1 || !strings.Contains(k.route[0], ";lr") || !strings.Contains(k.route[0], tokenParam+"=") {
			t.Fatalf("route set %q: want one loose route with a token", k.route)
		}
		k.inDialog("ACK", 1, k.branch+"-ack")
		k.inDialog("INVITE", 2, k.branch+"-re")
		c.recvResponse(200)
		k.inDialog("ACK", 2, k.branch+"-reack")
		k.inDialog("BYE", 3, k.branch+"-bye")
		c.recvResponse(200)
		home, other := b1, b2
		if b1.count(gosip.INVITE, k.callID) == 0 {
			home, other = b2, b1
		}
		eventually(t, "ACKs", func() bool { return home.count(gosip.ACK, k.callID) == 2 })
		if got := home.count(gosip.INVITE, k.callID); got != 2 {
			t.Errorf("call %d: home backend got %d INVITEs, want 2 (initial and re-INVITE)", i, got)
		}
		if got := home.count(gosip.BYE, k.callID); got != 1 {
			t.Errorf("call %d: home backend got %d BYEs, want 1", i, got)
		}
		if n := other.count(gosip.INVITE, k.callID) + other.count(gosip.BYE, k.callID) + other.count(gosip.ACK, k.callID); n != 0 {
			t.Errorf("call %d: other backend got %d requests of the call", i, n)
		}
	}
	if b1.count(gosip.INVITE, "") == 0 || b2.count(gosip.INVITE, "") == 0 {
		t.Errorf("calls per backend: b1 %d, b2 %d; want both used", b1.count(gosip.INVITE, "")/2, b2.count(gosip.INVITE, "")/2)
	}
	if n := s.txns.Len(); n != 0 {
		t.Errorf("%d transactions left after all calls ended", n)
	}
	for _, b := range s.pool.Load().list {
		if n := b.lb.Outstanding(); n != 0 {
			t.Errorf("backend %s: %d outstanding after all calls ended", b.id, n)
		}
	}
	return s
}

// TestForwardedRequestShape: our Via on top with an RFC 3261 branch,
// Max-Forwards decremented, Record-Route with lr and a token, body intact.
func TestForwardedRequestShape(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("X-Custom: keep me\r\n")
	c.recvResponse(180)
	c.recvResponse(200)
	got := b1.find(gosip.INVITE, k.callID)
	if len(got) != 1 {
		t.Fatalf("backend got %d INVITEs", len(got))
	}
	req := got[0].Req
	vias := req.GetHeaders("Via")
	if len(vias) != 2 {
		t.Fatalf("got %d Vias, want 2", len(vias))
	}
	top := req.Via()
	if br, _ := top.Params.Get("branch"); !strings.HasPrefix(br, "z9hG4bK") || top.Host != "127.0.0.1" || top.Port != int(s.udpAddr().Port()) {
		t.Errorf("top Via %q: want ours with a z9hG4bK branch", top.Value())
	}
	if mf := req.MaxForwards(); mf == nil || mf.Val() != 69 {
		t.Errorf("Max-Forwards %v, want 69", mf)
	}
	rr := req.GetHeader("record-route")
	if rr == nil || !strings.Contains(rr.Value(), ";lr") {
		t.Fatalf("Record-Route %v", rr)
	}
	if h := req.GetHeader("x-custom"); h == nil || h.Value() != "keep me" {
		t.Errorf("unknown header lost: %v", h)
	}
	if !strings.Contains(string(req.Body()), "m=audio 4000 RTP/AVP 0") {
		t.Errorf("body changed: %q", req.Body())
	}
}

// TestCancelReachesInviteBackend: CANCEL goes to the INVITE's backend with
// the INVITE's branch; the 487 comes back and its ACK reaches the backend.
func TestCancelReachesInviteBackend(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(modeRing)
	b2.mode.Store(modeRing)
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	c := newUAC(t, s.udpAddr())
	for i := 0; i < 6; i++ {
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		c.send(fmt.Sprintf("CANCEL sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n",
			c.lb, c.addr, k.branch, k.callID, k.callID))
		// 200 for the CANCEL and 487 for the INVITE, in either order.
		codes := map[int]bool{}
		var r487 *gosip.Response
		for len(codes) < 2 {
			m := c.recv()
			if m == nil {
				t.Fatalf("call %d: missing answers, got %v", i, codes)
			}
			if res, ok := m.(*gosip.Response); ok && res.StatusCode >= 200 {
				codes[res.StatusCode] = true
				if res.StatusCode == 487 {
					r487 = res
				}
			}
		}
		if !codes[200] || !codes[487] {
			t.Fatalf("call %d: got %v, want 200 and 487", i, codes)
		}
		tag, _ := r487.To().Params.Get("tag")
		c.send(fmt.Sprintf("ACK sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>;tag=%s\r\nCall-ID: %s\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n",
			c.lb, c.addr, k.branch, k.callID, tag, k.callID))
		home := b1
		if b1.count(gosip.INVITE, k.callID) == 0 {
			home = b2
		}
		eventually(t, "ACK at the INVITE's backend", func() bool { return home.count(gosip.ACK, k.callID) == 1 })
		inv, cancel, ack := home.find(gosip.INVITE, k.callID)[0], home.find(gosip.CANCEL, k.callID), home.find(gosip.ACK, k.callID)
		if len(cancel) != 1 || cancel[0].Branch != inv.Branch || ack[0].Branch != inv.Branch {
			t.Errorf("call %d: CANCEL %v / ACK branch %s, want the INVITE's %s", i, cancel, ack[0].Branch, inv.Branch)
		}
	}
}

// TestAckForBusy: the ACK of a 486 reaches the INVITE's backend with the
// INVITE's branch.
func TestAckForBusy(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(modeBusy)
	b2.mode.Store(modeBusy)
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	c := newUAC(t, s.udpAddr())
	for i := 0; i < 6; i++ {
		k := c.newCall()
		k.invite("")
		res := c.recvResponse(486)
		tag, _ := res.To().Params.Get("tag")
		c.send(fmt.Sprintf("ACK sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>;tag=%s\r\nCall-ID: %s\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n",
			c.lb, c.addr, k.branch, k.callID, tag, k.callID))
		home, other := b1, b2
		if b1.count(gosip.INVITE, k.callID) == 0 {
			home, other = b2, b1
		}
		eventually(t, "ACK at the INVITE's backend", func() bool { return home.count(gosip.ACK, k.callID) == 1 })
		if home.find(gosip.ACK, k.callID)[0].Branch != home.find(gosip.INVITE, k.callID)[0].Branch {
			t.Errorf("call %d: ACK branch differs from the INVITE's", i)
		}
		if other.count(gosip.ACK, k.callID) != 0 {
			t.Errorf("call %d: ACK went to the other backend", i)
		}
	}
	eventually(t, "no transactions", func() bool { return s.txns.Len() == 0 })
}

// TestOverloadInDialogPasses: while new INVITEs are refused with 503 (an
// ARM rule), every BYE of the established calls gets through.
func TestOverloadInDialogPasses(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, []string{"name=inv,proto=sip,method=INVITE,limit=10/min,action=reject"}, nil)
	c := newUAC(t, s.udpAddr())
	var est []*call
	for i := 0; i < 10; i++ {
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		k.inDialog("ACK", 1, k.branch+"-ack")
		est = append(est, k)
	}
	refused := 0
	for i := 0; i < 30; i++ {
		k := c.newCall()
		k.invite("")
		res := c.recvResponse(503)
		ra := res.GetHeader("retry-after")
		w := res.GetHeader("warning")
		if ra == nil || w == nil || !strings.Contains(w.Value(), "arm rule inv") {
			t.Fatalf("503 without Retry-After or Warning naming the rule: %v / %v", ra, w)
		}
		tag, _ := res.To().Params.Get("tag")
		if !strings.HasPrefix(tag, localTagPrefix) {
			t.Fatalf("503 To-tag %q is not ours", tag)
		}
		refused++
	}
	for _, k := range est {
		k.inDialog("BYE", 2, k.branch+"-bye")
		c.recvResponse(200)
	}
	if got := s.metrics.Refused.Load(); got != uint64(refused) {
		t.Errorf("refused %d, metrics say %d", refused, got)
	}
	if n := b1.count(gosip.BYE, "") + b2.count(gosip.BYE, ""); n != len(est) {
		t.Errorf("backends got %d BYEs, want %d", n, len(est))
	}
}

// TestForgedTokenNoPass: our Route with a bad token gets 403, whatever the
// method; a valid token copied from another call too; and a made-up To-tag
// without our Route does not carry an INVITE past admission.
func TestForgedTokenNoPass(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, []string{"name=inv,proto=sip,method=INVITE,limit=1/min,action=reject"}, nil)
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.complete()
	goodRoute := k.route

	bad := c.newCall()
	bad.toTag = "made-up"
	bad.target = "sip:service@" + b1.addr.String()
	for _, route := range []string{
		"<sip:" + s.udpAddr().String() + ";lr;sl=AAAAforged>",
		"<sip:" + s.udpAddr().String() + ";lr>",
		goodRoute[0], // valid, but for another Call-ID
	} {
		for _, m := range []string{"INVITE", "BYE", "SUBSCRIBE"} {
			bad.route = []string{route}
			bad.inDialog(m, 5, fmt.Sprintf("z9hG4bK-forged-%d", c.seq.Add(1)))
			c.recvResponse(403)
		}
	}
	// No Route at all: the INVITE is new work in disguise and the rule
	// (already used up by the first call) refuses it.
	bad.route = nil
	bad.inDialog("INVITE", 6, "z9hG4bK-madeup-1")
	c.recvResponse(503)
	if b1.count(gosip.INVITE, bad.callID)+b1.count(gosip.BYE, bad.callID)+b1.count(gosip.SUBSCRIBE, bad.callID) != 0 {
		t.Error("a forged request reached the backend")
	}
	if s.metrics.ForgedTokens.Load() != 9 {
		t.Errorf("forged tokens counted %d, want 9", s.metrics.ForgedTokens.Load())
	}
}

// TestMaxForwards: Max-Forwards 0 gets 483; OPTIONS with Max-Forwards 0
// or addressed to the balancer gets 200 from it.
func TestMaxForwards(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := newUAC(t, s.udpAddr())
	c.send(fmt.Sprintf("INVITE sip:svc@example.com SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-mf0\r\nMax-Forwards: 0\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:svc@example.com>\r\nCall-ID: mf0@test\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n", c.addr))
	c.recvResponse(483)
	c.send(fmt.Sprintf("OPTIONS sip:svc@example.com SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-mf0o\r\nMax-Forwards: 0\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:svc@example.com>\r\nCall-ID: mf0o@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n", c.addr))
	c.recvResponse(200)
	c.send(fmt.Sprintf("OPTIONS sip:%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=z9hG4bK-ping\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:%s>\r\nCall-ID: ping@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n", s.udpAddr(), c.addr, s.udpAddr()))
	c.recvResponse(200)
	if n := len(b1.seen); n != 0 {
		t.Errorf("backend got %d requests", n)
	}
}

// TestFailover503: a backend answering 503 is skipped and drained; the call
// completes on the other backend and the client never sees the 503. When
// every backend answers 503 the client gets 500.
func TestFailover503(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(mode503)
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	c := newUAC(t, s.udpAddr())
	// Calls until one was first sent to b1 (the hash decides), then ten
	// more: b1 drains after its 503 and sees none of them.
	extra := -1
	for i := 0; extra < 10; i++ {
		if i == 64 {
			t.Fatal("b1 was never tried")
		}
		k := c.newCall()
		k.complete()
		if b2.count(gosip.BYE, k.callID) != 1 {
			t.Fatalf("call %d did not complete on b2", i)
		}
		if extra >= 0 || b1.count(gosip.INVITE, "") > 0 {
			extra++
		}
	}
	if got := b1.count(gosip.INVITE, ""); got != 1 {
		t.Errorf("b1 got %d INVITEs; after its first 503 it should drain", got)
	}
	eventually(t, "ACK of the 503", func() bool { return b1.count(gosip.ACK, "") == 1 })
	for _, b := range s.pool.Load().list {
		if n := b.lb.Outstanding(); n != 0 {
			t.Errorf("backend %s: %d outstanding", b.id, n)
		}
	}
	if st := s.pool.Load().list[0].lb.Status(s.clock.Now()); st.Failures != 1 {
		t.Errorf("b1 failures %d, want 1 (its 503)", st.Failures)
	}
	if s.metrics.Failovers.Load() != 1 || s.metrics.Backend503.Load() != 1 {
		t.Errorf("failovers %d, backend 503s %d; want 1 and 1", s.metrics.Failovers.Load(), s.metrics.Backend503.Load())
	}

	b3, b4 := newUAS(t, "b3"), newUAS(t, "b4")
	b3.mode.Store(mode503)
	b4.mode.Store(mode503)
	s2 := testServer(t, []*uas{b3, b4}, nil, nil)
	c2 := newUAC(t, s2.udpAddr())
	k := c2.newCall()
	k.invite("")
	c2.recvResponse(500)
	// Both now drain: the next INVITE is refused by the balancer itself.
	k = c2.newCall()
	k.invite("")
	res := c2.recvResponse(503)
	if res.GetHeader("retry-after") == nil {
		t.Error("balancer 503 without Retry-After")
	}
	// While every backend drains, an in-dialog request without our Route
	// of a dialog nobody knows (the INVITE failed) is metered as new work
	// (-sip-unknown-dialog new-work) and refused as new work is: no
	// backend takes new work.
	k.toTag, k.target, k.route = "uas-b3", "sip:service@"+s2.udpAddr().String(), nil
	k.inDialog("BYE", 2, k.branch+"-bye")
	if w := c2.recvResponse(503).GetHeader("warning"); w == nil || !strings.Contains(w.Value(), "no backend available") {
		t.Errorf("503 Warning %v, want no backend available", w)
	}
	if n := b3.count(gosip.BYE, "") + b4.count(gosip.BYE, ""); n != 0 {
		t.Errorf("%d BYEs of an unknown dialog reached backends taking no new work", n)
	}
}

// TestFailoverSilence: a silent backend loses the request to the next one
// after the failover timeout.
func TestFailoverSilence(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	b1.mode.Store(modeSilent)
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	c := newUAC(t, s.udpAddr())
	// Calls until two of them were first sent to the silent backend (the
	// hash decides which backend a Call-ID tries first).
	for i := 0; b1.count(gosip.INVITE, "") < 2; i++ {
		if i == 64 {
			t.Fatal("the silent backend was never tried")
		}
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		if b2.count(gosip.INVITE, k.callID) != 1 {
			t.Fatalf("call %d not on b2", i)
		}
		k.inDialog("ACK", 1, k.branch+"-ack")
		k.inDialog("BYE", 2, k.branch+"-bye")
		c.recvResponse(200)
		if b2.count(gosip.BYE, k.callID) != 1 {
			t.Fatalf("BYE of call %d not on b2", i)
		}
	}
	if s.metrics.Timeouts.Load() == 0 {
		t.Error("no timeout counted")
	}
}

// TestOrder: a 200 never overtakes its 180.
func TestOrder(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	c := newUAC(t, s.udpAddr())
	state := map[string]int{}
	// 200 calls in bursts of 25: a burst of 100 messages through each
	// socket stays well inside loopback's default socket buffer (208 KiB
	// when net.core.rmem_max is not raised), so a lost datagram on a
	// loaded machine is not mistaken for a reordering.
	for burst := 0; burst < 8; burst++ {
		for i := 0; i < 25; i++ {
			c.newCall().invite("")
		}
		for n := 0; n < 50; n++ {
			m := c.recv()
			if m == nil {
				t.Fatalf("burst %d: got %d of 50 responses", burst, n)
			}
			res := m.(*gosip.Response)
			id := res.CallID().Value()
			switch res.StatusCode {
			case 180:
				if state[id] != 0 {
					t.Fatalf("%s: 180 after %d", id, state[id])
				}
				state[id] = 180
			case 200:
				if state[id] != 180 {
					t.Fatalf("%s: 200 overtook its 180", id)
				}
				state[id] = 200
			case 100:
				n--
			}
		}
	}
}

// TestObserveForward: each new-work transaction reports its time to the
// final answer once.
func TestObserveForward(t *testing.T) {
	b1 := newUAS(t, "b1")
	signer, err := lb.NewSigner(testKey)
	if err != nil {
		t.Fatal(err)
	}
	adm, err := admission.NewController(admission.ControllerConfig{}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var observed atomic.Int64
	cfg := Config{Listen: "127.0.0.1:0", Backends: []BackendConfig{{ID: "b1", Addr: b1.addr.String(), Transport: "udp", Weight: 1}}}
	s, err := New(cfg, Deps{Admission: adm, Signer: signer, ObserveForward: func(d time.Duration) {
		if d >= 0 {
			observed.Add(1)
		}
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := newUAC(t, s.udpAddr())
	for range 3 {
		k := c.newCall()
		k.invite("")
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		k.inDialog("ACK", 1, k.branch+"-ack")
		k.inDialog("BYE", 2, k.branch+"-bye")
		c.recvResponse(200)
	}
	if got := observed.Load(); got != 3 {
		t.Errorf("observed %d forwards, want 3 (one per INVITE; in-dialog requests are stateless)", got)
	}
}
