//go:build linux

package sip

import (
	"bytes"
	"net"
	"net/netip"
	"regexp"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"
)

// callKinds names the messages of one record-routed call as SIPp's
// uac_rr and uas_rr scenarios exchange them through the balancer, in the
// order BenchmarkCall feeds them to handleDatagram.
var callKinds = [...]string{"INVITE", "180", "200", "ACK", "BYE", "200BYE"}

// callHarness plays the client and the backend of BenchmarkCall: two UDP
// sockets, and buffers it builds each message in without allocating, so
// the allocations the benchmark reports are the balancer's.
type callHarness struct {
	s        *Server
	cli, be  *net.UDPConn
	cliSrc   source
	beSrc    source
	in, out  []byte // a received datagram; the message built from it
	rrLine   []byte // the Record-Route line the client got with the 200
	contact  []byte // the backend's Contact URI
	inviteFw []byte // the INVITE as the backend got it
	byeFw    []byte // the BYE as the backend got it
	num      []byte
	record   func(who string, p []byte) // when not nil, gets every datagram read but a 100
}

func newCallHarness(b testing.TB) *callHarness {
	be, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	cli, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close(); cli.Close() })
	for _, c := range []*net.UDPConn{be, cli} {
		_ = c.SetReadBuffer(4 << 20)
		_ = c.SetReadDeadline(time.Now().Add(time.Hour))
	}
	beAddr := be.LocalAddr().(*net.UDPAddr).AddrPort()
	s := startServer(b, serverOpts{backends: []netip.AddrPort{beAddr}})
	s.SetDialogStore(&discardDialogs{})
	h := &callHarness{s: s, cli: cli, be: be,
		cliSrc: source{addr: cli.LocalAddr().(*net.UDPAddr).AddrPort()},
		beSrc:  source{addr: beAddr},
		in:     make([]byte, 65536), out: make([]byte, 0, 4096),
		contact: []byte("sip:127.0.0.1:" + strconv.Itoa(int(beAddr.Port())))}
	return h
}

// read returns the next datagram on c.
func (h *callHarness) read(b testing.TB, c *net.UDPConn) []byte {
	n, _, err := c.ReadFromUDPAddrPort(h.in)
	if err != nil {
		b.Fatal(err)
	}
	if h.record != nil && !bytes.HasPrefix(h.in[:n], []byte("SIP/2.0 100 ")) {
		who := "client"
		if c == h.be {
			who = "backend"
		}
		h.record(who, h.in[:n])
	}
	return h.in[:n]
}

// readStatus reads datagrams on c until one starts with status.
func (h *callHarness) readStatus(b testing.TB, c *net.UDPConn, status string) []byte {
	for {
		p := h.read(b, c)
		if bytes.HasPrefix(p, []byte(status)) {
			return p
		}
	}
}

// lines calls f with each header line of the message head in p.
func lines(p []byte, f func(line []byte)) {
	end := bytes.Index(p, []byte("\r\n\r\n"))
	if end < 0 {
		end = len(p)
	}
	head := p[:end]
	i := bytes.Index(head, []byte("\r\n"))
	if i < 0 {
		return
	}
	head = head[i+2:]
	for len(head) > 0 {
		j := bytes.Index(head, []byte("\r\n"))
		if j < 0 {
			j = len(head)
			f(head)
			return
		}
		f(head[:j])
		head = head[j+2:]
	}
}

func hasName(line []byte, name string) bool {
	return len(line) > len(name) && line[len(name)] == ':' && bytes.EqualFold(line[:len(name)], []byte(name))
}

// response builds, in h.out, the backend's answer to the request req as
// uas_rr writes it: its Vias (joined on one line, as SIPp's [last_Via:]
// does), From, To (with toTag added when not empty), Call-ID, CSeq and
// Record-Route, then a Contact and body (Content-Length padded as SIPp's
// [len] writes it).
func (h *callHarness) response(req []byte, status, toTag string, body string) []byte {
	h.out = append(h.out[:0], status...)
	h.out = append(h.out, "\r\nVia: "...)
	n := 0
	lines(req, func(l []byte) {
		if hasName(l, "Via") {
			if n > 0 {
				h.out = append(h.out, ", "...)
			}
			h.out = append(h.out, bytes.TrimLeft(l[len("Via:"):], " ")...)
			n++
		}
	})
	h.out = append(h.out, "\r\n"...)
	lines(req, func(l []byte) {
		switch {
		case hasName(l, "From"), hasName(l, "Call-ID"), hasName(l, "CSeq"), hasName(l, "Record-Route"):
			h.out = append(h.out, l...)
			h.out = append(h.out, "\r\n"...)
		case hasName(l, "To"):
			h.out = append(h.out, l...)
			if toTag != "" {
				h.out = append(h.out, ";tag="...)
				h.out = append(h.out, toTag...)
			}
			h.out = append(h.out, "\r\n"...)
		}
	})
	h.out = append(h.out, "Contact: <"...)
	h.out = append(h.out, h.contact...)
	h.out = append(h.out, ";transport=UDP>\r\nContent-Type: application/sdp\r\nContent-Length: "...)
	for w := len(strconv.Itoa(len(body))); w < 5; w++ {
		h.out = append(h.out, ' ') // SIPp writes [len] as %5d
	}
	h.out = strconv.AppendInt(h.out, int64(len(body)), 10)
	h.out = append(h.out, "\r\n\r\n"...)
	h.out = append(h.out, body...)
	return h.out
}

const callSDP = "v=0\r\no=user1 53655765 2353687637 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"

// request builds, in h.out, the client's request of call n as uac_rr
// writes it; in-dialog requests (ACK, BYE) carry the route set and the
// backend's tag.
func (h *callHarness) request(method string, cseq int, n int) []byte {
	h.num = strconv.AppendInt(h.num[:0], int64(n), 10)
	o := h.out[:0]
	cp := strconv.Itoa(int(h.cliSrc.addr.Port()))
	_ = cp
	if method == "INVITE" {
		o = append(o, "INVITE sip:service@"...)
		o = append(o, h.s.udpAddr().String()...)
	} else {
		o = append(o, method...)
		o = append(o, ' ')
		o = append(o, h.contact...)
	}
	o = append(o, " SIP/2.0\r\nVia: SIP/2.0/UDP "...)
	o = h.cliSrc.addr.AppendTo(o)
	o = append(o, ";branch=z9hG4bK-4242-"...)
	o = append(o, h.num...)
	o = append(o, '-')
	o = strconv.AppendInt(o, int64(cseq), 10)
	o = append(o, method...)
	o = append(o, "\r\nFrom: sipp <sip:sipp@127.0.0.1>;tag=4242SIPpTag00"...)
	o = append(o, h.num...)
	o = append(o, "\r\nTo: service <sip:service@127.0.0.1>"...)
	if method != "INVITE" {
		o = append(o, ";tag=4243SIPpTag01"...)
		o = append(o, h.num...)
	}
	o = append(o, "\r\nCall-ID: "...)
	o = append(o, h.num...)
	o = append(o, "-4242@127.0.0.1\r\nCSeq: "...)
	o = strconv.AppendInt(o, int64(cseq), 10)
	o = append(o, ' ')
	o = append(o, method...)
	o = append(o, "\r\n"...)
	if method != "INVITE" {
		o = append(o, "Route:"...)
		o = append(o, h.rrLine[len("Record-Route:"):]...)
		o = append(o, "\r\n"...)
	}
	o = append(o, "Contact: sip:sipp@127.0.0.1\r\nMax-Forwards: 70\r\nSubject: Performance Test\r\n"...)
	if method == "INVITE" {
		o = append(o, "Content-Type: application/sdp\r\nContent-Length: "...)
		o = strconv.AppendInt(o, int64(len(callSDP)), 10)
		o = append(o, "\r\n\r\n"...)
		o = append(o, callSDP...)
	} else {
		o = append(o, "Content-Length: 0\r\n\r\n"...)
	}
	h.out = o
	return o
}

// call runs call n's messages through handleDatagram; before and after,
// when not nil, are called around each with its index in callKinds.
func (h *callHarness) call(b testing.TB, n int, before, after func(int)) {
	step := func(k int, p []byte, src source) {
		if before != nil {
			before(k)
		}
		h.s.handleDatagram(p, src)
		if after != nil {
			after(k)
		}
	}
	step(0, h.request("INVITE", 1, n), h.cliSrc)
	h.inviteFw = append(h.inviteFw[:0], h.read(b, h.be)...)
	tag := "4243SIPpTag01" + string(h.num)
	step(1, h.response(h.inviteFw, "SIP/2.0 180 Ringing", tag, ""), h.beSrc)
	step(2, h.response(h.inviteFw, "SIP/2.0 200 OK", tag, callSDP), h.beSrc)
	ok := h.readStatus(b, h.cli, "SIP/2.0 200")
	h.rrLine = h.rrLine[:0]
	lines(ok, func(l []byte) {
		if hasName(l, "Record-Route") {
			h.rrLine = append(h.rrLine, l...)
		}
	})
	if len(h.rrLine) == 0 {
		b.Fatalf("no Record-Route in the relayed 200:\n%s", ok)
	}
	if !bytes.HasPrefix(h.inviteFw, []byte("INVITE ")) {
		b.Fatalf("the backend got %q, not the INVITE", h.inviteFw)
	}
	step(3, h.request("ACK", 1, n), h.cliSrc)
	h.read(b, h.be)
	step(4, h.request("BYE", 2, n), h.cliSrc)
	h.byeFw = append(h.byeFw[:0], h.read(b, h.be)...)
	step(5, h.response(h.byeFw, "SIP/2.0 200 OK", "", ""), h.beSrc)
	h.readStatus(b, h.cli, "SIP/2.0 200")
}

// BenchmarkCall is the CPU of one whole record-routed call through
// handleDatagram over UDP, as SIPp's uac_rr and uas_rr make it: the
// INVITE (new work: admission, transaction, Record-Route with token), the
// backend's 180 and 200 (the dialog confirmed and written through), the
// client's ACK and BYE (token verified, our Route popped, our Via added)
// and the 200 to the BYE. ns/op and allocs/op are per call, harness
// included (its two sockets' reads and the messages it builds, which
// allocate nothing); cpu-ns/op is the process's CPU per call; ns/KIND and
// allocs/KIND are each message's own, measured around its handleDatagram
// (sends included, sluice's 100 Trying with the INVITE).
func BenchmarkCall(b *testing.B) {
	h := newCallHarness(b)
	h.call(b, -1, nil, nil) // a first call warms up the tables and pools
	var ns, allocs [len(callKinds)]int64
	sample := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	var t0 time.Time
	var a0 uint64
	before := func(int) {
		metrics.Read(sample)
		a0 = sample[0].Value.Uint64()
		t0 = time.Now()
	}
	after := func(k int) {
		d := time.Since(t0)
		metrics.Read(sample)
		ns[k] += int64(d)
		allocs[k] += int64(sample[0].Value.Uint64() - a0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := range b.N {
		h.call(b, i, before, after)
	}
	b.StopTimer()
	// The process's CPU (user and system, every thread, the harness's
	// reads included) per call: what bench/sip-cpu.sh counts of sluice,
	// less sensitive than ns/op to a machine shared with other work.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	for k, name := range callKinds {
		b.ReportMetric(float64(ns[k])/float64(b.N), "ns/"+name)
		b.ReportMetric(float64(allocs[k])/float64(b.N), "allocs/"+name)
	}
	if h.s.metrics.Affinity.Load() < uint64(2*b.N) {
		b.Fatalf("%d in-dialog requests forwarded by token for %d calls", h.s.metrics.Affinity.Load(), b.N)
	}
}

// TestFastPathCall runs the same call through two servers, one with the
// fast paths (fastresp.go, fastreq.go) and one without, and requires that
// the fast one took the 180, the 200s, the ACK and the BYE, and that the
// client and the backend got the same bytes from both: the end-to-end
// form of FuzzFastResponse and FuzzFastInDialog. What differs between two
// servers (their ports, branches and tokens) is masked.
func TestFastPathCall(t *testing.T) {
	run := func(fast bool) []string {
		var got []string
		h := newCallHarness(t)
		h.s.noFastPath = !fast
		mask := strings.NewReplacer(h.s.udpAddr().String(), "LB", h.beSrc.addr.String(), "BE",
			strconv.Itoa(int(h.beSrc.addr.Port())), "BEPORT", h.cliSrc.addr.String(), "CLI", strconv.Itoa(int(h.cliSrc.addr.Port())), "CLIPORT")
		h.record = func(who string, p []byte) {
			s := mask.Replace(string(p))
			s = branchRE.ReplaceAllString(s, "branch=z9hG4bKsl-X")
			s = tokenRE.ReplaceAllString(s, "sl=TOKEN")
			got = append(got, who+": "+s)
		}
		h.call(t, 7, nil, nil)
		if fast && h.s.metrics.FastPath.Load() != 5 {
			t.Errorf("fast path took %d messages of the call, want 5 (180, 200, ACK, BYE, 200)", h.s.metrics.FastPath.Load())
		}
		if !fast && h.s.metrics.FastPath.Load() != 0 {
			t.Errorf("fast path took %d messages with noFastPath", h.s.metrics.FastPath.Load())
		}
		return got
	}
	slow, fast := run(false), run(true)
	t.Logf("%d datagrams compared", len(slow))
	if len(slow) != len(fast) {
		t.Fatalf("%d datagrams through the slow path, %d through the fast one:\n%q\n%q", len(slow), len(fast), slow, fast)
	}
	for i := range slow {
		if slow[i] != fast[i] {
			t.Errorf("datagram %d differs:\nslow %q\nfast %q", i, slow[i], fast[i])
		}
	}
}

var (
	branchRE = regexp.MustCompile(`branch=z9hG4bKsl[0-9a-z]+`)
	tokenRE  = regexp.MustCompile(`sl=[^;>\r]+`)
)
