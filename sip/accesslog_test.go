package sip

import (
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files")

// lineSink collects the SIP access-log lines as the logger writes them.
type lineSink struct{ lines chan string }

func (k *lineSink) WantHTTP(*accesslog.HTTPRecord) bool { return false }
func (k *lineSink) WantSIP(*accesslog.SIPRecord) bool   { return true }
func (k *lineSink) WriteHTTP(*accesslog.HTTPRecord, []byte) {
}
func (k *lineSink) WriteSIP(_ *accesslog.SIPRecord, line []byte) {
	k.lines <- string(line)
}

// next returns the next n lines written.
func (k *lineSink) next(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for range n {
		select {
		case l := <-k.lines:
			out = append(out, l)
		case <-time.After(wait):
			t.Fatalf("%d access-log lines, want %d: %q", len(out), n, out)
		}
	}
	return out
}

// none checks that no further line was written once the server is idle.
func (k *lineSink) none(t *testing.T) {
	t.Helper()
	select {
	case l := <-k.lines:
		t.Errorf("unexpected access-log line %s", l)
	default:
	}
}

// newLineLog is a JSON access log to a file of t's, whose lines k gets.
func newLineLog(t *testing.T, mask bool) (*accesslog.Logger, *lineSink) {
	t.Helper()
	k := &lineSink{lines: make(chan string, 256)}
	l, err := accesslog.New(accesslog.Options{Dest: filepath.Join(t.TempDir(), "sip.log"), Format: accesslog.JSON,
		Sample: accesslog.DefaultSample, MaskUser: mask, Sinks: []accesslog.Sink{k}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, k
}

var (
	reTime = regexp.MustCompile(`"time":"[^"]*"`)
	rePort = regexp.MustCompile(`127\.0\.0\.1:\d+`)
)

// normalize takes what changes from run to run out of a line: the wall
// time and the loopback ports.
func normalize(line string) string {
	line = reTime.ReplaceAllString(line, `"time":"T"`)
	return rePort.ReplaceAllString(line, "127.0.0.1:P")
}

// TestAccessLogSIPGolden: the access-log line of each SIP outcome, on a
// clock that moves only when the test moves it (so the timings are
// exact): forwarded and answered 200, the BYE of that call and its dialog
// summary (-sip-access-log-dialogs), a failover
// off a backend's 503, every backend failing (500), no backend left
// (503), a refusal by an ARM rule, Timer C (sluice's 408 after a
// provisional answer), a sips: request with no TLS backend (480), an
// INVITE CANCELed at its backend (487, and the CANCEL's own 200) and a request without route
// (404).
func TestAccessLogSIPGolden(t *testing.T) {
	var got []string
	add := func(name string, lines []string) {
		for _, l := range lines {
			got = append(got, name+": "+normalize(l))
		}
	}
	rr := func(c *Config) { c.Policy = "round-robin" }
	newClock := func() *admission.ManualClock {
		c := &admission.ManualClock{}
		c.Set(int64(time.Hour))
		return c
	}

	t.Run("forwarded", func(t *testing.T) {
		l, k := newLineLog(t, false)
		b1 := newUAS(t, "b1")
		clock := newClock()
		dialogs := func(c *Config) { rr(c); c.AccessLogDialogs = true }
		s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), mut: dialogs, clock: clock, alog: l})
		c := newUAC(t, s.udpAddr())
		kc := c.namedCall("fwd@test")
		kc.invite("traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n")
		c.recvResponse(180)
		kc.learn(c.recvResponse(200))
		add("forwarded", k.next(t, 1))
		kc.inDialog("ACK", 1, kc.branch+"-ack")
		clock.Advance(95 * time.Second)
		kc.inDialog("BYE", 2, kc.branch+"-bye")
		c.recvResponse(200)
		add("forwarded bye, dialog summary", k.next(t, 2))
		k.none(t)
	})

	t.Run("dialog summaries", func(t *testing.T) {
		l, k := newLineLog(t, false)
		b1 := newUAS(t, "b1")
		clock := newClock()
		dialogs := func(c *Config) { rr(c); c.AccessLogDialogs = true; c.DialogTTL = time.Hour }
		s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), mut: dialogs, clock: clock, alog: l})
		c := newUAC(t, s.udpAddr())
		// The callee hangs up: its BYE comes from the backend, the
		// client answers it.
		kc := c.namedCall("callee@test")
		kc.establish()
		k.next(t, 1) // the INVITE's
		clock.Advance(30 * time.Second)
		bye := "BYE sip:alice@" + c.addr.String() + " SIP/2.0\r\nVia: SIP/2.0/UDP " + b1.addr.String() + ";branch=z9hG4bK-cbye;rport\r\nRoute: " + kc.route[0] +
			"\r\nMax-Forwards: 70\r\nFrom: <sip:service@test>;tag=uas-b1\r\nTo: <sip:alice@test>;tag=acallee@test\r\nCall-ID: callee@test\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n"
		if _, err := b1.conn.WriteToUDPAddrPort([]byte(bye), s.udpAddr()); err != nil {
			t.Fatal(err)
		}
		req := c.recvRequest()
		c.send(gosip.NewResponseFromRequest(req, 200, "OK", nil).String())
		add("callee hangs up", k.next(t, 1))
		// A dialog whose BYE never passes: summarised -sip-dialog-ttl
		// after its 2xx, without a BYE side.
		c.namedCall("nobye@test").establish()
		k.next(t, 1)
		clock.Advance(2 * time.Hour)
		add("no bye", k.next(t, 1))
		k.none(t)
	})

	t.Run("failover", func(t *testing.T) {
		l, k := newLineLog(t, true)
		b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
		b1.mode.Store(mode503)
		s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1, b2}), mut: rr, clock: newClock(), alog: l})
		c := newUAC(t, s.udpAddr())
		kc := c.namedCall("failover@test")
		kc.invite("")
		c.recvResponse(180)
		c.recvResponse(200)
		add("failover (masked)", k.next(t, 1))
	})

	t.Run("all failed, then none left", func(t *testing.T) {
		l, k := newLineLog(t, false)
		b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
		b1.mode.Store(mode503)
		b2.mode.Store(mode503)
		s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1, b2}), mut: rr, clock: newClock(), alog: l})
		c := newUAC(t, s.udpAddr())
		c.namedCall("allfailed@test").invite("")
		c.recvResponse(500)
		add("all failed", k.next(t, 1))
		c.namedCall("noneleft@test").invite("")
		c.recvResponse(503)
		add("no backend", k.next(t, 1))
	})

	t.Run("refused by rule", func(t *testing.T) {
		l, k := newLineLog(t, false)
		b1 := newUAS(t, "b1")
		s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), mut: rr, clock: newClock(), alog: l,
			rules: []string{"name=invites,proto=sip,method=INVITE,limit=1/s,action=reject"}})
		c := newUAC(t, s.udpAddr())
		c.namedCall("first@test").invite("")
		c.recvResponse(180)
		c.recvResponse(200)
		k.next(t, 1)
		c.namedCall("refused@test").invite("")
		c.recvResponse(503)
		add("refused", k.next(t, 1))
	})

	t.Run("timer C", func(t *testing.T) {
		l, k := newLineLog(t, false)
		b1 := newUAS(t, "b1")
		b1.mode.Store(modeRing)
		clock := newClock()
		s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), mut: rr, clock: clock, alog: l})
		c := newUAC(t, s.udpAddr())
		c.namedCall("ring@test").invite("")
		c.recvResponse(180)
		clock.Advance(timerC)
		c.recvResponse(408)
		add("timeout", k.next(t, 1))
	})

	t.Run("canceled", func(t *testing.T) {
		l, k := newLineLog(t, false)
		b1 := newUAS(t, "b1")
		b1.mode.Store(modeRing)
		clock := newClock()
		s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), mut: rr, clock: clock, alog: l})
		c := newUAC(t, s.udpAddr())
		kc := c.namedCall("cancel@test")
		kc.invite("")
		c.recvResponse(180)
		clock.Advance(1500 * time.Millisecond)
		c.send(strings.NewReplacer("INVITE", "CANCEL").Replace(
			"INVITE sip:service@" + c.lb.String() + " SIP/2.0\r\nVia: SIP/2.0/UDP " + c.addr.String() + ";branch=" + kc.branch + ";rport\r\nMax-Forwards: 70\r\nFrom: <sip:alice@test>;tag=acancel@test\r\nTo: <sip:service@test>\r\nCall-ID: cancel@test\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"))
		c.recvResponseTo(gosip.INVITE, 487)
		// The INVITE's 487 and the CANCEL's own 200 from the backend, in
		// whichever order the two answers were handled.
		lines := k.next(t, 2)
		for i := range lines {
			lines[i] = normalize(lines[i])
		}
		slices.Sort(lines)
		add("canceled, its cancel", lines)
	})

	t.Run("local answers", func(t *testing.T) {
		l, k := newLineLog(t, false)
		b1 := newUAS(t, "b1")
		s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), mut: rr, clock: newClock(), alog: l})
		c := newUAC(t, s.udpAddr())
		c.send("INVITE sips:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP " + c.addr.String() + ";branch=z9hG4bK-sips;rport\r\nMax-Forwards: 70\r\nFrom: <sips:alice@test>;tag=s1\r\nTo: <sips:bob@example.com>\r\nCall-ID: sips@test\r\nCSeq: 7 INVITE\r\nContact: <sips:alice@test>\r\nContent-Length: 0\r\n\r\n")
		c.recvResponse(480)
		add("sips", k.next(t, 1))
		c.send("BYE sip:service@" + c.lb.String() + " SIP/2.0\r\nVia: SIP/2.0/UDP " + c.addr.String() + ";branch=z9hG4bK-zero;rport\r\nMax-Forwards: 0\r\nFrom: <sip:alice@test>;tag=z1\r\nTo: <sip:service@test>;tag=z2\r\nCall-ID: zero@test\r\nCSeq: 9 BYE\r\nUser-Agent: a test that needs room for the answer\r\nContent-Length: 0\r\n\r\n")
		c.recvResponse(483)
		add("too many hops", k.next(t, 1))
		// Stripped below the size of its answer: none sent (UDP answers
		// are never larger than their request), the line says so.
		c.send("CANCEL sip:s@h SIP/2.0\r\nv: SIP/2.0/UDP " + c.addr.String() + ";branch=z9hG4bK-s\r\nf: <sip:a@t>;tag=1\r\nt: <sip:b@t>\r\ni: shed@test\r\nCSeq: 9 CANCEL\r\n\r\n")
		add("not answered", k.next(t, 1))
	})

	golden := filepath.Join("testdata", "accesslog.golden")
	text := strings.Join(got, "\n") + "\n"
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if text != string(want) {
		t.Errorf("access-log lines differ from %s (run with -update to accept):\n%s", golden, diffLines(string(want), text))
	}
}

// diffLines lists the lines of got that want does not have and back.
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			b.WriteString("- " + wl + "\n+ " + gl + "\n")
		}
	}
	return b.String()
}

// TestAccessLogRecordBounded: whatever sizes a client writes, a record
// keeps at most the bounds of each field (clip), in copies.
func TestAccessLogRecordBounded(t *testing.T) {
	long := strings.Repeat("x", 5000)
	m, err := newParser().ParseSIP([]byte("INVITE sip:" + long + "@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-b\r\nFrom: <sip:a@test>;tag=" + long +
		"\r\nTo: <sip:b@test>;tag=" + long + "\r\nCall-ID: " + long + "\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	req := m.(*gosip.Request)
	s := &Server{}
	var r accesslog.SIPRecord
	s.fillRecord(&r, req, source{addr: netip.MustParseAddrPort("192.0.2.1:5060")})
	for _, c := range []struct {
		name string
		v    string
		max  int
	}{{"ruri", r.RURI, maxLogURI}, {"call_id", r.CallID, maxLogCallID}, {"from_tag", r.FromTag, maxLogTag}, {"to_tag", r.ToTag, maxLogTag}} {
		if len(c.v) != c.max {
			t.Errorf("%s: %d bytes, want %d (cut)", c.name, len(c.v), c.max)
		}
	}
	short := parseRequest(t, "OPTIONS sip:a@example.com SIP/2.0\r\nFrom: <sip:a@test>;tag=f\r\nTo: <sip:b@test>\r\nCSeq: 1 OPTIONS\r\n")
	s.fillRecord(&r, short, source{addr: netip.MustParseAddrPort("192.0.2.1:5060")})
	if r.RURI != "sip:a@example.com" || r.CallID != "ri@test" || r.FromTag != "f" || r.ToTag != "" || r.Transport != "udp" || r.Method != "OPTIONS" {
		t.Errorf("record %+v", r)
	}
}

// TestAccessLogMaskUserBeforeCut: with -access-log-mask-user the user
// part of the Request-URI is masked whatever it holds (parameters, a
// password) and whatever its length: masked first, then cut to the bound.
func TestAccessLogMaskUserBeforeCut(t *testing.T) {
	l, _ := newLineLog(t, true)
	s := &Server{alog: l}
	long := strings.Repeat("9", 600)
	for _, c := range []struct{ ruri, want string }{
		{"sip:+358-555-1234567;postd=pp22@foo.com;user=phone", "sip:*@foo.com;user=phone"},
		{"sip:alice;x=y@127.0.0.1", "sip:*@127.0.0.1"},
		{"sip:" + long + "@example.com", "sip:*@example.com"},
		{"sip:" + long + ";p=" + long + "@example.com", "sip:*@example.com"},
		{"sip:example.com;transport=tcp", "sip:example.com;transport=tcp"},
	} {
		m, err := newParser().ParseSIP([]byte("OPTIONS " + c.ruri + " SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-b\r\nFrom: <sip:a@test>;tag=f\r\n" +
			"To: <sip:b@test>\r\nCall-ID: m@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"))
		if err != nil {
			t.Fatal(err)
		}
		var r accesslog.SIPRecord
		s.fillRecord(&r, m.(*gosip.Request), source{addr: netip.MustParseAddrPort("192.0.2.1:5060")})
		if r.RURI != c.want {
			t.Errorf("%.60q...: logged %.80q, want %q", c.ruri, r.RURI, c.want)
		}
	}
}

// TestAccessLogForwardedCancel: a forwarded CANCEL's record waits for the
// backend's answer to the CANCEL (the INVITE's answers, on the same
// branch, do not end it), and one never answered is logged after Timer F
// with no status, without a 408 of sluice's or a verdict on the backend.
func TestAccessLogForwardedCancel(t *testing.T) {
	l, k := newLineLog(t, false)
	b1 := newUAS(t, "b1")
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	s := startServer(t, serverOpts{backends: uasAddrs([]*uas{b1}), clock: clock, alog: l})
	msg, err := gosip.ParseMessage([]byte("CANCEL sip:bob@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK-c1\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=a\r\nTo: <sip:b@test>\r\nCall-ID: c@test\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	req := msg.(*gosip.Request)
	client := source{addr: netip.MustParseAddrPort("127.0.0.1:9")}
	backend := source{addr: b1.addr}

	s.watchCancel(req, client, "z9hG4bK-ours1", "b1", "london", clock.Now())
	s.answered("z9hG4bK-ours1", backend, 487, gosip.INVITE) // the INVITE's answer
	clock.Advance(2 * time.Millisecond)
	s.answered("z9hG4bK-ours1", backend, 200, gosip.CANCEL)
	got := normalize(k.next(t, 1)[0])
	for _, want := range []string{`"method":"CANCEL"`, `"pool":"london"`, `"backend":"b1"`, `"status":200`, `"status_from":"backend"`, `"class":"new"`, `"t_final_ms":2.000`} {
		if !strings.Contains(got, want) {
			t.Errorf("answered CANCEL: %s: want %s", got, want)
		}
	}

	replies, unanswered := s.metrics.LocalReplies.Load(), s.metrics.InDialogUnanswered.Load()
	s.watchCancel(req, client, "z9hG4bK-ours2", "b1", "london", clock.Now())
	clock.Advance(timerF)
	s.expireWatched(clock.Now())
	got = normalize(k.next(t, 1)[0])
	for _, want := range []string{`"method":"CANCEL"`, `"status":0`, `"reason":"no final answer"`} {
		if !strings.Contains(got, want) {
			t.Errorf("unanswered CANCEL: %s: want %s", got, want)
		}
	}
	if s.metrics.LocalReplies.Load() != replies || s.metrics.InDialogUnanswered.Load() != unanswered {
		t.Errorf("an unanswered CANCEL got a reply of sluice's or counted against its backend")
	}
	if s.watchedLen() != 0 {
		t.Errorf("%d watched left", s.watchedLen())
	}
}
