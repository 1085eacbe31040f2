package sip

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// wait bounds every receive in these tests: a liveness bound, generous
// enough for the race detector; no test asserts how fast anything is.
const wait = 5 * time.Second

// testKey is the affinity key of test servers.
var testKey = []byte("0123456789abcdef0123456789abcdef")

// testServer starts a Server on 127.0.0.1 with the given backends.
func testServer(t testing.TB, backends []*uas, rules []string, mut func(*Config), mem ...*admission.Memory) *Server {
	t.Helper()
	o := serverOpts{backends: uasAddrs(backends), rules: rules, mut: mut}
	if len(mem) > 0 {
		o.mem = mem[0]
	}
	return startServer(t, o)
}

// testServerSigner is testServer with the given affinity token signer.
func testServerSigner(t testing.TB, signer Signer, backends []*uas, rules []string, mut func(*Config), mem ...*admission.Memory) *Server {
	t.Helper()
	o := serverOpts{backends: uasAddrs(backends), rules: rules, mut: mut, signer: signer}
	if len(mem) > 0 {
		o.mem = mem[0]
	}
	return startServer(t, o)
}

// serverOpts is what a test server is built from; testServer and its
// variants fill in the parts they need.
type serverOpts struct {
	backends []netip.AddrPort // b1, b2, ... over UDP
	rules    []string         // ARM rules
	mut      func(*Config)
	mem      *admission.Memory
	signer   Signer                 // nil: an lb.Signer with testKey
	clock    *admission.ManualClock // nil: the monotonic clock, admission ticking every 10 ms
	events   admission.EventSink
	alog     *accesslog.Logger
	log      *slog.Logger // nil: discarded
}

func uasAddrs(backends []*uas) []netip.AddrPort {
	addrs := make([]netip.AddrPort, len(backends))
	for i, b := range backends {
		addrs[i] = b.addr
	}
	return addrs
}

// startServer builds, starts and (at cleanup) stops a server on a free
// loopback port.
func startServer(t testing.TB, o serverOpts) *Server {
	t.Helper()
	signer := o.signer
	if signer == nil {
		lbs, err := lb.NewSigner(testKey)
		if err != nil {
			t.Fatal(err)
		}
		signer = lbs
	}
	var rcs []admission.RuleConfig
	for _, r := range o.rules {
		rc, err := admission.ParseRule(r)
		if err != nil {
			t.Fatal(err)
		}
		rcs = append(rcs, rc)
	}
	var clock admission.Clock = admission.MonoClock{}
	if o.clock != nil {
		clock = o.clock
	}
	adm, err := admission.NewController(admission.ControllerConfig{Rules: rcs}, o.mem, clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Listen: "127.0.0.1:0", FailoverTimeout: 300 * time.Millisecond, UDPFastPath: true}
	for i, a := range o.backends {
		cfg.Backends = append(cfg.Backends, BackendConfig{ID: fmt.Sprintf("b%d", i+1), Addr: a.String(), Transport: "udp", Weight: 1})
	}
	if o.mut != nil {
		o.mut(&cfg)
	}
	deps := Deps{Admission: adm, Signer: signer, Events: o.events, AccessLog: o.alog}
	if o.clock != nil {
		deps.Clock = o.clock
	}
	log := o.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s, err := New(cfg, deps, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	stopAdm := func() {}
	if o.clock == nil {
		adc, adcCancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { adm.Run(adc, clock, 10*time.Millisecond); close(done) }()
		stopAdm = func() { adcCancel(); <-done }
	}
	t.Cleanup(func() {
		stopAdm()
		cancel()
		s.Close()
	})
	return s
}

func (s *Server) udpAddr() netip.AddrPort {
	return s.udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

// uas modes: how a fake backend answers an INVITE.
const (
	modeAnswer = iota // 180 then 200
	modeBusy          // 486
	mode503           // 503 Retry-After: 30
	modeSilent        // nothing
	modeRing          // 180 only; CANCEL gets 200 + 487
)

// seenReq is what a fake backend recorded of one request.
type seenReq struct {
	Method gosip.RequestMethod
	CallID string
	Branch string
	Raw    string
	Req    *gosip.Request
}

// uas is a fake SIP backend on a UDP socket, answering with sipgo-built
// responses. It records every request it gets.
type uas struct {
	t        testing.TB
	conn     *net.UDPConn
	addr     netip.AddrPort
	mode     atomic.Int32
	name     string
	drop     atomic.Bool  // do not record requests (load tests)
	pingCode atomic.Int32 // answer to OPTIONS; 0 is 200
	noPings  atomic.Bool  // ignore OPTIONS, as SIPp scenario answerers do
	noINFO   atomic.Bool  // ignore INFO (a request it drops as junk)

	mu   sync.Mutex
	seen []seenReq
	done chan struct{}
}

func newUAS(t testing.TB, name string) *uas {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadBuffer(4 << 20)
	u := &uas{t: t, conn: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), name: name, done: make(chan struct{})}
	go u.serve()
	t.Cleanup(func() {
		c.Close()
		<-u.done
	})
	return u
}

func (u *uas) serve() {
	defer close(u.done)
	buf := make([]byte, 65536)
	for {
		n, from, err := u.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		msg, err := gosip.ParseMessage(append([]byte(nil), buf[:n]...))
		if err != nil {
			continue
		}
		req, ok := msg.(*gosip.Request)
		if !ok {
			continue
		}
		br, _ := req.Via().Params.Get("branch")
		sr := seenReq{Method: req.Method, CallID: req.CallID().Value(), Branch: br, Raw: string(buf[:n]), Req: req}
		if !u.drop.Load() {
			u.mu.Lock()
			u.seen = append(u.seen, sr)
			u.mu.Unlock()
		}
		u.answer(req, from)
	}
}

func (u *uas) respond(req *gosip.Request, to netip.AddrPort, code int, reason string, extra ...gosip.Header) {
	res := gosip.NewResponseFromRequest(req, code, reason, nil)
	if to := res.To(); to != nil && code > 100 {
		if tag, _ := req.To().Params.Get("tag"); tag == "" {
			to.Params.Add("tag", "uas-"+u.name) // the same for every answer
		}
	}
	if code >= 200 && code < 300 || code > 100 && code < 200 {
		res.AppendHeader(&gosip.ContactHeader{Address: gosip.Uri{Scheme: "sip", Host: "127.0.0.1", Port: int(u.addr.Port())}})
	}
	for _, h := range extra {
		res.AppendHeader(h)
	}
	if _, err := u.conn.WriteToUDPAddrPort([]byte(res.String()), to); err != nil {
		return
	}
}

func (u *uas) answer(req *gosip.Request, from netip.AddrPort) {
	switch req.Method {
	case gosip.ACK:
		return
	case gosip.INVITE:
		if _, ok := req.To().Params.Get("tag"); ok { // re-INVITE
			u.respond(req, from, 200, "OK")
			return
		}
		switch u.mode.Load() {
		case modeAnswer:
			u.respond(req, from, 180, "Ringing")
			u.respond(req, from, 200, "OK")
		case modeBusy:
			u.respond(req, from, 486, "Busy Here")
		case mode503:
			u.respond(req, from, 503, "Service Unavailable", gosip.NewHeader("Retry-After", "30"))
		case modeRing:
			u.respond(req, from, 180, "Ringing")
		}
	case gosip.CANCEL:
		if u.mode.Load() == modeSilent {
			return
		}
		u.respond(req, from, 200, "OK")
		// 487 for the INVITE with the same branch.
		u.mu.Lock()
		var inv *gosip.Request
		br, _ := req.Via().Params.Get("branch")
		for _, s := range u.seen {
			if s.Method == gosip.INVITE && s.Branch == br {
				inv = s.Req
			}
		}
		u.mu.Unlock()
		if inv != nil {
			u.respond(inv, from, 487, "Request Terminated")
		}
	default:
		if u.mode.Load() == modeSilent {
			return
		}
		if req.Method == gosip.OPTIONS && u.noPings.Load() || req.Method == gosip.INFO && u.noINFO.Load() {
			return
		}
		if req.Method == gosip.OPTIONS && u.pingCode.Load() == 503 {
			u.respond(req, from, 503, "Service Unavailable", gosip.NewHeader("Retry-After", "60"))
			return
		}
		u.respond(req, from, 200, "OK")
	}
}

// count returns how many requests of method the backend saw for callID
// ("" for any Call-ID).
func (u *uas) count(method gosip.RequestMethod, callID string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, s := range u.seen {
		if s.Method == method && (callID == "" || s.CallID == callID) {
			n++
		}
	}
	return n
}

func (u *uas) find(method gosip.RequestMethod, callID string) []seenReq {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []seenReq
	for _, s := range u.seen {
		if s.Method == method && s.CallID == callID {
			out = append(out, s)
		}
	}
	return out
}

// uac is a test client on a UDP socket.
type uac struct {
	t    testing.TB
	conn *net.UDPConn
	addr netip.AddrPort
	lb   netip.AddrPort
	seq  atomic.Uint64
}

func newUAC(t testing.TB, lbAddr netip.AddrPort) *uac {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadBuffer(4 << 20)
	t.Cleanup(func() { c.Close() })
	return &uac{t: t, conn: c, addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), lb: lbAddr}
}

func (c *uac) send(msg string) {
	c.t.Helper()
	msg = strings.ReplaceAll(msg, "\r\n", "\n")
	msg = strings.ReplaceAll(msg, "\n", "\r\n")
	if _, err := c.conn.WriteToUDPAddrPort([]byte(msg), c.lb); err != nil {
		c.t.Fatal(err)
	}
}

// recv returns the next message, or nil after the wait bound.
func (c *uac) recv() gosip.Message {
	buf := make([]byte, 65536)
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	n, _, err := c.conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		return nil
	}
	m, err := gosip.ParseMessage(buf[:n])
	if err != nil {
		// A 400 echoing a malformed header of ours cannot be parsed: keep
		// its status line.
		var code int
		if _, serr := fmt.Sscanf(string(buf[:n]), "SIP/2.0 %d ", &code); serr == nil {
			return gosip.NewResponse(code, "unparsable")
		}
		c.t.Errorf("uac got unparsable message: %v\n%s", err, buf[:n])
		return nil
	}
	return m
}

// recvResponse waits for a response with the given code, skipping 100s.
func (c *uac) recvResponse(code int) *gosip.Response {
	c.t.Helper()
	for {
		m := c.recv()
		if m == nil {
			c.t.Fatalf("no %d response", code)
			return nil
		}
		res, ok := m.(*gosip.Response)
		if !ok {
			continue
		}
		if res.StatusCode == 100 && code != 100 {
			continue
		}
		if res.StatusCode != code {
			c.t.Fatalf("got %d %s, want %d", res.StatusCode, res.Reason, code)
		}
		return res
	}
}

// recvResponseTo is recvResponse for the answer to a request of method,
// skipping answers to other requests: on a loaded machine the balancer
// may retransmit an INVITE to its backend (Timer A) and relay the second
// 200 it gets back, which arrives while the test waits for a later answer.
func (c *uac) recvResponseTo(method gosip.RequestMethod, code int) *gosip.Response {
	c.t.Helper()
	return c.awaitResponse(method, code, 101)
}

// awaitResponse returns the next answer to a request of method with a
// status of at least min, skipping the others; any other code than code
// fails the test.
func (c *uac) awaitResponse(method gosip.RequestMethod, code, min int) *gosip.Response {
	c.t.Helper()
	for {
		m := c.recv()
		if m == nil {
			c.t.Fatalf("no %d response to %s", code, method)
			return nil
		}
		res, ok := m.(*gosip.Response)
		if !ok || res.StatusCode < min || res.CSeq() == nil || res.CSeq().MethodName != method {
			continue
		}
		if res.StatusCode != code {
			c.t.Fatalf("got %d %s to %s, want %d", res.StatusCode, res.Reason, method, code)
		}
		return res
	}
}

// call is one dialog from the client's side.
type call struct {
	c      *uac
	callID string
	branch string
	toTag  string
	route  []string // route set from the 200's Record-Route
	target string   // remote target (Contact)
	cseq   int
}

func (c *uac) newCall() *call {
	n := c.seq.Add(1)
	return &call{c: c, callID: fmt.Sprintf("call-%d-%d@test", c.addr.Port(), n), branch: fmt.Sprintf("z9hG4bK-%d-%d", c.addr.Port(), n), cseq: 1}
}

func (k *call) invite(extra string) {
	body := "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"
	k.c.send(fmt.Sprintf("INVITE sip:service@%s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>\r\nCall-ID: %s\r\nCSeq: %d INVITE\r\nContact: <sip:alice@%s>\r\n%sContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
		k.c.lb, k.c.addr, k.branch, k.callID, k.callID, k.cseq, k.c.addr, extra, len(body), body))
}

// learn takes the dialog state from a 2xx (RFC 3261 §12.1.2).
func (k *call) learn(res *gosip.Response) {
	k.toTag, _ = res.To().Params.Get("tag")
	k.route = nil
	for _, h := range res.GetHeaders("Record-Route") {
		k.route = append([]string{h.Value()}, k.route...)
	}
	if h := res.GetHeader("contact"); h != nil {
		k.target = strings.Trim(h.Value(), "<>")
	}
}

// inDialog sends an in-dialog request with the learned route set.
func (k *call) inDialog(method string, cseq int, branch string) {
	routes := ""
	for _, r := range k.route {
		routes += "Route: " + r + "\r\n"
	}
	k.c.send(fmt.Sprintf("%s %s SIP/2.0\r\nVia: SIP/2.0/UDP %s;branch=%s;rport\r\nMax-Forwards: 70\r\n%sFrom: <sip:alice@test>;tag=a%s\r\nTo: <sip:service@test>;tag=%s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContent-Length: 0\r\n\r\n",
		method, k.target, k.c.addr, branch, routes, k.callID, k.toTag, k.callID, cseq, method))
}

// complete runs INVITE/180/200/ACK/BYE/200 and reports the Call-ID.
func (k *call) complete() {
	k.c.t.Helper()
	k.invite("")
	k.c.recvResponse(180)
	ok := k.c.recvResponse(200)
	k.learn(ok)
	k.inDialog("ACK", 1, k.branch+"-ack")
	k.inDialog("BYE", 2, k.branch+"-bye")
	k.c.recvResponse(200)
}

// eventually polls cond until it holds or the wait bound passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
