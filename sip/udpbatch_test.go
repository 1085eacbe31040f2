//go:build linux

package sip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// tryRecv returns the next datagram waiting on c without waiting, or nil.
func tryRecv(t *testing.T, c *net.UDPConn) []byte {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65536)
	n := -1
	if err := rc.Read(func(fd uintptr) bool {
		k, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
		if err == nil {
			n = k
		}
		return true // never wait
	}); err != nil {
		t.Fatal(err)
	}
	if n < 0 {
		return nil
	}
	return buf[:n]
}

// drain returns every datagram waiting on c, without waiting.
func drain(t *testing.T, c *net.UDPConn) []string {
	t.Helper()
	var got []string
	for {
		p := tryRecv(t, c)
		if p == nil {
			return got
		}
		got = append(got, string(p))
	}
}

// TestUDPOutOrder: datagrams queued in a batch leave only at its end
// (or when a send needs its result at once, sendNow, which sends what was
// queued before it first), and each destination gets its datagrams in the
// order they were produced, IPv4 and IPv6 peers, on IPv4, dual-stack and
// IPv6 sockets.
func TestUDPOutOrder(t *testing.T) { forUDPOutKinds(t, testUDPOutOrder) }

func testUDPOutOrder(t *testing.T, raw bool) {
	for _, tc := range []struct {
		name   string
		listen string
		peers  [2]string
	}{
		{"ipv4", "127.0.0.1:0", [2]string{"127.0.0.1", "127.0.0.1"}},
		{"dual-stack socket, ipv4 and ipv6 peers", "[::]:0", [2]string{"127.0.0.1", "::1"}},
		{"ipv6", "[::1]:0", [2]string{"::1", "::1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(tc.listen)))
			if err != nil {
				t.Skipf("no %s socket here: %v", tc.listen, err)
			}
			defer ln.Close()
			var peers [2]*net.UDPConn
			var dst [2]netip.AddrPort
			for i, p := range tc.peers {
				c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(p), 0)))
				if err != nil {
					t.Skipf("no %s peer here: %v", p, err)
				}
				defer c.Close()
				_ = c.SetReadBuffer(1 << 20)
				peers[i], dst[i] = c, c.LocalAddr().(*net.UDPAddr).AddrPort()
			}
			s := &Server{}
			o := testUDPOut(ln, raw)
			var sent atomic.Uint64
			// The golden vector: what each step queues (q) or sends at once
			// (now), and what each peer holds after the step.
			steps := []struct {
				op    string
				peer  int
				msg   string
				holds [2][]string
			}{
				{"q", 0, "a1", [2][]string{nil, nil}},
				{"q", 1, "b1", [2][]string{nil, nil}},
				{"q", 0, "a2", [2][]string{nil, nil}},
				{"now", 1, "b2", [2][]string{{"a1", "a2"}, {"b1", "b2"}}},
				{"q", 1, "b3", [2][]string{nil, nil}},
				{"q", 0, "a3", [2][]string{nil, nil}},
				{"q", 1, "b4", [2][]string{nil, nil}},
				{"end", 0, "", [2][]string{{"a3"}, {"b3", "b4"}}},
			}
			o.begin()
			for i, st := range steps {
				switch st.op {
				case "q":
					if !o.queue(s, []byte(st.msg), dst[st.peer], &sent, nil) {
						t.Fatalf("step %d: not queued in an open batch", i)
					}
				case "now":
					handled, err := o.sendNow(s, []byte(st.msg), dst[st.peer])
					if !handled || err != nil {
						t.Fatalf("step %d: sendNow = %v, %v", i, handled, err)
					}
				case "end":
					o.end(s)
				}
				for p := range peers {
					if got := drain(t, peers[p]); strings.Join(got, ",") != strings.Join(st.holds[p], ",") {
						t.Fatalf("step %d (%s %s): peer %d holds %q, want %q", i, st.op, st.msg, p, got, st.holds[p])
					}
				}
			}
			if sent.Load() != 6 {
				t.Errorf("counted %d datagrams sent, want 6 (the queued ones)", sent.Load())
			}
			// Closed: a send is not queued, the caller sends it.
			if o.queue(s, []byte("x"), dst[0], nil, nil) {
				t.Error("queued with no batch open")
			}
			if handled, _ := o.sendNow(s, []byte("x"), dst[0]); handled {
				t.Error("sendNow handled a send with no batch open")
			}
		})
	}
}

// TestUDPOutBounded: a batch whose queue reaches udpOutMaxMsgs datagrams
// (or udpOutMaxBytes) sends them at once, in order, so what one batch
// produces never piles up.
func TestUDPOutBounded(t *testing.T) { forUDPOutKinds(t, testUDPOutBounded) }

func testUDPOutBounded(t *testing.T, raw bool) {
	ln, peer := udpPair(t)
	dst := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	s := &Server{}
	o := testUDPOut(ln, raw)
	o.begin()
	for i := range udpOutMaxMsgs - 1 {
		o.queue(s, []byte(fmt.Sprint(i)), dst, nil, nil)
	}
	if got := drain(t, peer); len(got) != 0 {
		t.Fatalf("%d datagrams left before the bound", len(got))
	}
	o.queue(s, []byte(fmt.Sprint(udpOutMaxMsgs-1)), dst, nil, nil)
	got := drain(t, peer)
	if len(got) != udpOutMaxMsgs {
		t.Fatalf("%d datagrams left at the bound, want %d", len(got), udpOutMaxMsgs)
	}
	for i, g := range got {
		if g != fmt.Sprint(i) {
			t.Fatalf("datagram %d is %q", i, g)
		}
	}
	big := make([]byte, maxDatagram)
	for range udpOutMaxBytes/maxDatagram + 1 {
		o.queue(s, big, dst, nil, nil)
	}
	if len(o.q) != 0 || len(o.arena) != 0 {
		t.Errorf("queue at the byte bound holds %d datagrams, %d bytes: want it sent", len(o.q), len(o.arena))
	}
	o.end(s)
}

// udpPair returns an IPv4 loopback socket and a peer socket.
func udpPair(t *testing.T) (*net.UDPConn, *net.UDPConn) {
	t.Helper()
	var cs [2]*net.UDPConn
	for i := range cs {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadBuffer(4 << 20)
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs[0], cs[1]
}

// fakeBatch is a batchWriter with sendmmsg's contract: it sends messages
// in order up to one that fails; it returns the error only when that one
// is the first (else the count so far, and the next call reports it).
type fakeBatch struct {
	fail  map[string]error // payload -> its error
	sent  []string
	calls int
}

func (f *fakeBatch) WriteBatch(ms []ipv4.Message, _ int) (int, error) {
	f.calls++
	for i, m := range ms {
		p := string(m.Buffers[0])
		if err := f.fail[p]; err != nil {
			if i == 0 {
				return 0, err
			}
			return i, nil
		}
		f.sent = append(f.sent, p)
	}
	return len(ms), nil
}

// TestUDPOutErrors: each datagram of a batch gets its own result: the
// ones that fail go to their failure handler (after the batch, with their
// own error) and count as send errors, the others leave in order and
// count as sent, whichever position the failures hold.
func TestUDPOutErrors(t *testing.T) {
	eperm, enet := syscall.EPERM, syscall.ENETUNREACH
	for _, tc := range []struct {
		name  string
		msgs  []string
		fail  map[string]error
		sent  string // golden: what left, in order
		errs  string // golden: handler calls, in order
		calls int    // WriteBatch calls
	}{
		{"none fails", []string{"1", "2", "3"}, nil, "1,2,3", "", 1},
		{"first", []string{"1", "2", "3"}, map[string]error{"1": eperm}, "2,3", "1:" + eperm.Error(), 2},
		{"middle", []string{"1", "2", "3"}, map[string]error{"2": enet}, "1,3", "2:" + enet.Error(), 3},
		{"last", []string{"1", "2", "3"}, map[string]error{"3": eperm}, "1,2", "3:" + eperm.Error(), 2},
		{"two", []string{"1", "2", "3", "4"}, map[string]error{"2": eperm, "3": enet}, "1,4", "2:" + eperm.Error() + ";3:" + enet.Error(), 4},
		{"all", []string{"1", "2"}, map[string]error{"1": eperm, "2": eperm}, "", "1:" + eperm.Error() + ";2:" + eperm.Error(), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeBatch{fail: tc.fail}
			o := &udpOut{w: f}
			s := &Server{}
			var ok atomic.Uint64
			var errs []string
			dst := netip.MustParseAddrPort("127.0.0.1:5060")
			o.begin()
			for _, m := range tc.msgs {
				o.queue(s, []byte(m), dst, &ok, func(err error) {
					if !errors.Is(err, tc.fail[m]) || !strings.Contains(err.Error(), dst.String()) {
						t.Errorf("%s: error %v, want one naming %s and wrapping %v", m, err, dst, tc.fail[m])
					}
					errs = append(errs, m+":"+errors.Unwrap(err).Error())
				})
			}
			if len(f.sent) != 0 || len(errs) != 0 {
				t.Fatal("sent before the batch's end")
			}
			o.end(s)
			if got := strings.Join(f.sent, ","); got != tc.sent {
				t.Errorf("sent %q, want %q", got, tc.sent)
			}
			if got := strings.Join(errs, ";"); got != tc.errs {
				t.Errorf("failure handlers %q, want %q", got, tc.errs)
			}
			if f.calls != tc.calls {
				t.Errorf("%d sendmmsg calls, want %d", f.calls, tc.calls)
			}
			if n := len(tc.msgs) - len(tc.fail); ok.Load() != uint64(n) {
				t.Errorf("counted %d sent, want %d", ok.Load(), n)
			}
			if s.metrics.SendErrors.Load() != uint64(len(tc.fail)) {
				t.Errorf("SendErrors %d, want %d", s.metrics.SendErrors.Load(), len(tc.fail))
			}
		})
	}
}

// TestUDPOutKernelError: a datagram the kernel refuses in the middle of a
// batch (an IPv6 destination on an IPv4 socket) fails alone, and the
// datagrams after it still leave.
func TestUDPOutKernelError(t *testing.T) { forUDPOutKinds(t, testUDPOutKernelError) }

func testUDPOutKernelError(t *testing.T, raw bool) {
	ln, peer := udpPair(t)
	dst := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	s := &Server{}
	o := testUDPOut(ln, raw)
	var failed []error
	onErr := func(err error) { failed = append(failed, err) }
	o.begin()
	o.queue(s, []byte("1"), dst, nil, onErr)
	o.queue(s, []byte("v6"), netip.MustParseAddrPort("[::1]:9"), nil, onErr)
	o.queue(s, []byte("2"), dst, nil, onErr)
	o.end(s)
	if got := strings.Join(drain(t, peer), ","); got != "1,2" {
		t.Errorf("peer got %q, want 1,2", got)
	}
	if len(failed) != 1 || !strings.Contains(failed[0].Error(), "[::1]:9") {
		t.Errorf("failures %v, want one for [::1]:9", failed)
	}
}

// TestPostAtOnce: with no read batch open (a batch of one datagram, or a
// send from a timer between batches) a posted datagram has left when post
// returns.
func TestPostAtOnce(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.UDPSendBatch = true })
	if s.udpOut == nil {
		t.Fatal("-sip-udp-send-batch: no send queue")
	}
	_, peer := udpPair(t)
	var ok atomic.Uint64
	s.post([]byte("now"), target{addr: peer.LocalAddr().(*net.UDPAddr).AddrPort()}, &ok)
	if got := tryRecv(t, peer); string(got) != "now" {
		t.Fatalf("peer holds %q after post, want the datagram", got)
	}
	if ok.Load() != 1 {
		t.Errorf("counted %d, want 1", ok.Load())
	}
}

// TestBatchFailover: new work whose send to its backend fails when the
// read batch's queue is sent fails over to the next backend (the failure
// handler runs attempt as a send that failed at once does), and an
// in-dialog request whose send fails gets 503 "backend unreachable".
// Datagrams are handed to the server as its reader does, inside an open
// batch.
func TestBatchFailover(t *testing.T) {
	good := newUAS(t, "good")
	// The first backend is IPv6 on an IPv4 socket: every send to it fails
	// in the kernel.
	bad := netip.MustParseAddrPort("[::1]:9")
	s := startServer(t, serverOpts{backends: []netip.AddrPort{bad, good.addr}, mut: func(c *Config) {
		c.UDPSendBatch = true
		c.Policy = "round-robin"
		// Silence must not move the calls on within the test's wait:
		// only the failure handler may.
		c.FailoverTimeout = time.Hour
	}})
	c := newUAC(t, s.udpAddr())
	inBatch := func(msg string) {
		msg = strings.ReplaceAll(strings.ReplaceAll(msg, "\r\n", "\n"), "\n", "\r\n")
		s.udpOut.begin()
		s.udpDatagram([]byte(msg), c.addr)
		s.udpOut.end(s)
	}
	const calls = 4 // round robin: at least one starts on the bad backend
	for range calls {
		k := c.newCall()
		body := "v=0\r\n"
		inBatch(fmt.Sprintf("INVITE sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:alice@%s>\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
			c.lb, c.addr, k.branch, k.callID, k.callID, c.addr, len(body), body))
		c.recvResponse(180)
		k.learn(c.recvResponse(200))
		if good.count(gosip.INVITE, k.callID) != 1 {
			t.Fatalf("call %s: the good backend got %d INVITEs", k.callID, good.count(gosip.INVITE, k.callID))
		}
	}
	if s.metrics.SendErrors.Load() == 0 {
		t.Fatal("no send to the bad backend failed: the failover path was not taken")
	}
	if s.metrics.NewWork.Load() < calls {
		t.Errorf("NewWork %d, want at least %d", s.metrics.NewWork.Load(), calls)
	}

	// In-dialog: a BYE whose token names the bad backend, on a server
	// that sent it nothing yet (so it is not down by traffic).
	s2 := startServer(t, serverOpts{backends: []netip.AddrPort{bad, good.addr}, mut: func(c *Config) { c.UDPSendBatch = true }})
	c2 := newUAC(t, s2.udpAddr())
	k := c2.newCall()
	rr := s2.ourRecordRoute(s2.routeToken("default", tokenSubject("b1", k.callID), time.Now().Add(time.Hour)), "UDP", false)
	k.route, k.toTag, k.target = []string{rr.Value()}, "b-tag", "sip:bob@127.0.0.1"
	routes := "Route: " + rr.Value() + "\r\n"
	s2.udpOut.begin()
	s2.udpDatagram([]byte(fmt.Sprintf("BYE %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s-bye;rport\r\nMax-Forwards: 70\r\n%sFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>;tag=%s\r\nCall-ID: %s\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n",
		k.target, c2.addr, k.branch, routes, k.callID, k.toTag, k.callID)), c2.addr)
	s2.udpOut.end(s2)
	res := c2.recvResponse(503)
	if w := res.GetHeader("warning"); w == nil || !strings.Contains(w.Value(), "backend unreachable") {
		t.Errorf("503 to the BYE has Warning %v, want backend unreachable", w)
	}
}

// sendEvents records commits and sends in the order they happen.
type sendEvents struct {
	ev   []string
	ok   bool // what CommitDialogs answers
	fail map[string]bool
}

func (l *sendEvents) WriteDialogs([]StoredDialog, []uint64) {}

func (l *sendEvents) CommitDialogs(put []StoredDialog) bool {
	keys := make([]string, len(put))
	for i, r := range put {
		keys[i] = fmt.Sprint(r.Key)
	}
	l.ev = append(l.ev, "commit "+strings.Join(keys, ","))
	return l.ok
}

func (l *sendEvents) WriteBatch(ms []ipv4.Message, _ int) (int, error) {
	var ps []string
	for _, m := range ms {
		ps = append(ps, string(m.Buffers[0]))
	}
	l.ev = append(l.ev, "send "+strings.Join(ps, ","))
	return len(ms), nil
}

// TestUDPOutHeld2xx: the first 2xx of dialogs confirmed in one read batch
// share one CommitDialogs, made before any datagram of the queue leaves
// (at the batch's end, or earlier when a send needs its result at once),
// and then leave in their place in the queue; a commit that fails still
// sends them, counted unsafe.
func TestUDPOutHeld2xx(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ok    bool
		steps []string // q:P queues P, h:K:P holds P for record K, now:P sends P at once
		want  string   // golden: the events, in order
	}{
		{"two in a batch", true, []string{"q:100", "h:1:200a", "q:x", "h:2:200b"}, "commit 1,2|send 100,200a,x,200b"},
		{"sendNow commits first", true, []string{"h:1:200a", "now:y", "h:2:200b"}, "commit 1|send 200a,y|commit 2|send 200b"},
		{"none held", true, []string{"q:100", "q:180"}, "send 100,180"},
		{"store down", false, []string{"h:1:200a"}, "commit 1|send 200a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &sendEvents{ok: tc.ok}
			s := &Server{}
			gc := &dialogCommit{c: l}
			o := &udpOut{w: l}
			dst := netip.MustParseAddrPort("127.0.0.1:5060")
			held := 0
			o.begin()
			for _, st := range tc.steps {
				f := strings.SplitN(st, ":", 3)
				switch f[0] {
				case "q":
					o.queue(s, []byte(f[1]), dst, nil, nil)
				case "h":
					var k uint64
					fmt.Sscan(f[1], &k)
					if !o.queueHeld(s, gc, StoredDialog{Key: k}, []byte(f[2]), dst) {
						t.Fatal("not held in an open batch")
					}
					held++
				case "now":
					o.sendNow(s, []byte(f[1]), dst)
				}
			}
			o.end(s)
			if got := strings.Join(l.ev, "|"); got != tc.want {
				t.Errorf("events %q, want %q", got, tc.want)
			}
			if s.metrics.DialogStoreHeld.Load() != uint64(held) || s.metrics.Relayed.Load() != uint64(held) {
				t.Errorf("held %d relayed %d, want %d", s.metrics.DialogStoreHeld.Load(), s.metrics.Relayed.Load(), held)
			}
			unsafe := uint64(0)
			if !tc.ok {
				unsafe = uint64(held)
			}
			if s.metrics.DialogStoreUnsafe.Load() != unsafe {
				t.Errorf("unsafe %d, want %d", s.metrics.DialogStoreUnsafe.Load(), unsafe)
			}
			if o.queueHeld(s, gc, StoredDialog{Key: 9}, []byte("late"), dst) {
				t.Error("held with no batch open")
			}
		})
	}
}

// forUDPOutKinds runs test with each writer of a send queue: net's
// (x/net's WriteBatch) and the raw sendmmsg that raw sends use.
func forUDPOutKinds(t *testing.T, test func(t *testing.T, raw bool)) {
	for _, raw := range []bool{false, true} {
		t.Run(map[bool]string{false: "net", true: "raw"}[raw], func(t *testing.T) {
			test(t, raw)
		})
	}
}

// testUDPOut is the send queue of ln with the writer raw names.
func testUDPOut(ln *net.UDPConn, raw bool) *udpOut {
	if raw {
		return newUDPOut(ln, newUDPRaw(ln))
	}
	return newUDPOut(ln, nil)
}
