package http

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
)

// logged is a record as a test sees it: the byte fields as strings.
type logged struct {
	accesslog.HTTPRecord
	method, path, query, reason, rid, sni string
	line                                  string
}

// captureSink keeps every record the logger hands it, with its JSON line.
type captureSink struct {
	ch chan logged
}

func (c *captureSink) WantHTTP(*accesslog.HTTPRecord) bool   { return true }
func (c *captureSink) WantSIP(*accesslog.SIPRecord) bool     { return false }
func (c *captureSink) WriteSIP(*accesslog.SIPRecord, []byte) {}
func (c *captureSink) WriteHTTP(r *accesslog.HTTPRecord, line []byte) {
	l := logged{HTTPRecord: *r, method: string(r.Method), path: string(r.Path), query: string(r.Query),
		reason: string(r.Reason), rid: string(r.RequestID), sni: string(r.SNI), line: string(line)}
	l.Method, l.Path, l.Query, l.Reason, l.RequestID, l.Host, l.UserAgent, l.Referer, l.SNI = nil, nil, nil, nil, nil, nil, nil, nil, nil
	c.ch <- l
}

// next waits for the next record (the writer is asynchronous; the wait is
// for delivery, nothing is asserted on time).
func (c *captureSink) next(t *testing.T) logged {
	t.Helper()
	select {
	case l := <-c.ch:
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no access log record")
		return logged{}
	}
}

func logRig(t *testing.T, o rigOpts) (*rig, *captureSink) {
	t.Helper()
	sink := &captureSink{ch: make(chan logged, 64)}
	l, err := accesslog.New(accesslog.Options{Dest: t.TempDir() + "/access.log", Sample: accesslog.DefaultSample, Sinks: []accesslog.Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	o.alog = l
	o.cfg.RequestID = true
	return newRig(t, o), sink
}

var hexID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestAccessLogAdmitted: one record per request with what the issue
// lists; the request id the backend got is the record's; traceparent
// and tracestate reach the backend unchanged and the trace is logged.
func TestAccessLogAdmitted(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r, sink := logRig(t, rigOpts{backends: 1})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		c.Write([]byte("GET /cart?id=7 HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: t/1\r\nX-Request-ID: planted\r\nX-Request-ID: planted2\r\ntraceparent: " + tp + "\r\ntracestate: k=v\r\n\r\n"))
		var resp fasthttp.Response
		if err := resp.Read(bufio.NewReader(c)); err != nil || resp.StatusCode() != 200 {
			t.Fatal(err, resp.StatusCode())
		}
		l := sink.next(t)
		if l.method != "GET" || l.path != "/cart" || l.query != "id=7" || l.Status != 200 || l.Backend != "b0" ||
			l.Decision != accesslog.Admitted || l.Class != accesslog.ClassNew || l.End != accesslog.EndComplete ||
			l.Pool != "default" || l.BytesOut != 2 || l.Proto != "HTTP/1.1" || l.Retries != 0 {
			t.Errorf("record %+v", l)
		}
		if !hexID.MatchString(l.rid) {
			t.Errorf("request id %q: want 32 hex digits made here (the client is not trusted)", l.rid)
		}
		hs := r.backends[0].lastHeaders()
		if got := hs["X-Request-Id"]; len(got) != 1 || got[0] != l.rid {
			t.Errorf("backend got X-Request-ID %q, the log says %q", got, l.rid)
		}
		if hs["Traceparent"][0] != tp || hs["Tracestate"][0] != "k=v" {
			t.Errorf("trace context at the backend: %v %v", hs["Traceparent"], hs["Tracestate"])
		}
		if !l.HasTrace || accesslog.FormatTraceparent(l.TraceID, l.ParentSpan, l.TraceFlags) != tp {
			t.Errorf("trace in the record: %v %x %x", l.HasTrace, l.TraceID, l.ParentSpan)
		}
		if l.Total < l.FirstByte || l.FirstByte < l.Connect || l.Client.Addr() != netip.MustParseAddr("127.0.0.1") || int(l.Client.Port()) != c.LocalAddr().(*net.TCPAddr).Port {
			t.Errorf("timings or client: %+v", l.HTTPRecord)
		}
		if !strings.Contains(l.line, `"request_id":"`+l.rid+`"`) || strings.Contains(l.line, "id=7") {
			t.Errorf("line %s: want the request id and no query (-access-log-query off)", l.line)
		}
	})
}

// TestRequestIDFromTrustedProxy: a trusted proxy's X-Request-ID is kept.
func TestRequestIDFromTrustedProxy(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r, sink := logRig(t, rigOpts{backends: 1, cfg: Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nX-Request-ID: edge-42\r\nX-Forwarded-For: 203.0.113.9, 10.0.0.1\r\n\r\n"))
		var resp fasthttp.Response
		if err := resp.Read(bufio.NewReader(c)); err != nil {
			t.Fatal(err)
		}
		l := sink.next(t)
		if l.rid != "edge-42" || r.backends[0].lastHeaders()["X-Request-Id"][0] != "edge-42" {
			t.Errorf("request id %q, backend %v: want edge-42 kept", l.rid, r.backends[0].lastHeaders()["X-Request-Id"])
		}
		if l.Forwarded != netip.MustParseAddr("10.0.0.1") {
			t.Errorf("forwarded_for %v: want 10.0.0.1, the rightmost untrusted address", l.Forwarded)
		}
	})
}

// TestAccessLogRefusals: each guard's refusal is logged refused with its
// reason, and the answer carries the logged request id.
func TestAccessLogRefusals(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		t.Run("memory", func(t *testing.T) {
			r, sink := logRig(t, rigOpts{backends: 1})
			r.setMemory(850)
			rep := r.get("/", "")
			l := sink.next(t)
			if rep.status != 429 || l.Status != 429 || l.Decision != accesslog.Refused || l.reason != "memory state lower" || l.End != accesslog.EndRefused || l.Backend != "" {
				t.Errorf("%d; record %+v reason %q", rep.status, l.HTTPRecord, l.reason)
			}
			if rep.header.Get("X-Request-ID") != l.rid || l.rid == "" {
				t.Errorf("answer's X-Request-ID %q, log's %q", rep.header.Get("X-Request-ID"), l.rid)
			}
		})
		t.Run("arm", func(t *testing.T) {
			r, sink := logRig(t, rigOpts{backends: 1, arm: []string{"name=burst,limit=1/s,action=reject"}})
			r.get("/", "")
			sink.next(t)
			rep := r.get("/", "")
			l := sink.next(t)
			if rep.status != 429 || l.Decision != accesslog.Refused || !strings.Contains(l.reason, "arm rule burst") {
				t.Errorf("%d; record %+v reason %q", rep.status, l.HTTPRecord, l.reason)
			}
		})
		t.Run("mop", func(t *testing.T) {
			r, sink := logRig(t, rigOpts{backends: 1, mopRate: 1})
			r.get("/", "")
			sink.next(t)
			rep := r.get("/", "")
			l := sink.next(t)
			if rep.status != 503 || l.Decision != accesslog.Refused || !strings.Contains(l.reason, "mop") {
				t.Errorf("%d; record %+v reason %q", rep.status, l.HTTPRecord, l.reason)
			}
		})
	})
}

// TestAccessLogRetriedAndTimeout: a request moved off a dead backend names
// both; a backend that does not answer in time ends as a timeout.
func TestAccessLogRetriedAndTimeout(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		t.Run("retried", func(t *testing.T) {
			r, sink := logRig(t, rigOpts{backends: 2})
			r.backends[0].stop()
			// Round robin: one of two requests goes to b0 first.
			var l logged
			for range 2 {
				if rep := r.get("/", ""); rep.status != 200 {
					t.Fatalf("status %d", rep.status)
				}
				if l = sink.next(t); l.Retries == 1 {
					break
				}
			}
			if l.Retries != 1 || l.RetryBackends[0] != "b0" || l.Backend != "b1" || l.End != accesslog.EndComplete {
				t.Errorf("record %+v", l.HTTPRecord)
			}
		})
		t.Run("timeout", func(t *testing.T) {
			r, sink := logRig(t, rigOpts{backends: 1, cfg: Config{BackendTimeout: 100 * time.Millisecond, RequestID: true}})
			release := make(chan struct{})
			defer close(release)
			r.backends[0].handler = func(ctx *fasthttp.RequestCtx) { <-release }
			rep := r.do("POST", "/", "", strings.NewReader("x"))
			l := sink.next(t)
			if rep.status != 504 || l.End != accesslog.EndTimeout || l.Decision != accesslog.Admitted || l.Backend != "b0" {
				t.Errorf("%d; record %+v", rep.status, l.HTTPRecord)
			}
		})
	})
}

// TestAccessLogDelayed: a request released from an ARM delay is logged
// delayed with the rule and its wait.
func TestAccessLogDelayed(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r, sink := logRig(t, rigOpts{backends: 1, arm: []string{"name=slow,limit=1/s,action=delay,queue=10,wait=1m"}})
		r.get("/", "")
		sink.next(t)
		delayed := make(chan reply, 1)
		go func() { delayed <- r.get("/", "") }()
		for i := 0; r.ctrl.Rules()[0].Status().Queued == 0; i++ {
			if i > 5000 {
				t.Fatal("request never queued")
			}
			time.Sleep(time.Millisecond)
		}
		r.clock.Advance(1100 * time.Millisecond)
		r.ctrl.Advance(r.clock.Now())
		<-delayed
		l := sink.next(t)
		if l.Decision != accesslog.Delayed || l.reason != "arm rule slow" || l.Status != 200 {
			t.Errorf("record %+v reason %q", l.HTTPRecord, l.reason)
		}
	})
}

// TestAccessLogHotPathAllocs: a request's record (its request id made,
// written into the head, the record filled and handed to the logger)
// allocates nothing once buffers are warm.
func TestAccessLogHotPathAllocs(t *testing.T) {
	l, err := accesslog.New(accesslog.Options{Dest: t.TempDir() + "/a.log", Sample: accesslog.DefaultSample})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	r := newRig(t, rigOpts{backends: 2, alog: l, cfg: Config{RequestID: true}})
	s := r.srv
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}, nil)
	raw := "GET /api/x?q=1 HTTP/1.1\r\nHost: example.com\r\nUser-Agent: wrk\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\r\n"
	if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	h := &ctx.Request.Header
	now := r.clock.Now()
	var p plan
	var v reqView
	var g reqLog
	run := func() {
		req, d := s.admit(&p, h, &v, now)
		s.beginLog(&g, &p, h, clientAddrPort(&ctx), nil, s.wall(now), now, now)
		if !s.pick(&p, &ctx.Response, &req, d, h, remoteAddr(&ctx)) {
			t.Fatal("not picked")
		}
		g.setRequestID(h)
		g.localAnswer(&ctx.Response)
		s.endLog(&g, &p, 200, 10, now+1000)
	}
	run()
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("logging a request allocates %v times, want 0", n)
	}
	// With spans exported, a request without traceparent gets one made.
	s.trace = &fixedTraces{}
	fresh := func() {
		h.Del("traceparent") // the one the last run wrote
		run()
	}
	fresh()
	if n := testing.AllocsPerRun(200, fresh); n != 0 {
		t.Errorf("logging a request whose trace sluice starts allocates %v times, want 0", n)
	}
	if tp := string(h.Peek("traceparent")); !g.madeTrace || len(tp) != 55 {
		t.Errorf("traceparent %q made %v", tp, g.madeTrace)
	}
}

// TestAccessLogClientAbort: a client that leaves while its answer streams
// is logged client_abort, with the status the backend gave.
func TestAccessLogClientAbort(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		stop := make(chan struct{})
		defer close(stop)
		r, sink := logRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
			defer c.Close()
			br := bufio.NewReader(c)
			var h fasthttp.RequestHeader
			if h.Read(br) != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"))
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				if _, err := c.Write([]byte("400\r\n" + strings.Repeat("x", 1024) + "\r\n")); err != nil {
					return
				}
			}
		}})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"))
		buf := make([]byte, 4096)
		var got []byte
		for !strings.Contains(string(got), "hello") {
			n, err := c.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, buf[:n]...)
		}
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		l := sink.next(t)
		if l.End != accesslog.EndClientAbort || l.Status != 200 || l.Backend != "b0" || l.path != "/stream" {
			t.Errorf("record %+v", l.HTTPRecord)
		}
	})
}

// TestAccessLogSampling: with new=0, admitted new work is not logged and
// refusals are (refused=1 by default).
func TestAccessLogSampling(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		path := t.TempDir() + "/a.log"
		l, err := accesslog.New(accesslog.Options{Dest: path, Sample: accesslog.Sample{Refused: 1, New: 0, Affinity: 0}})
		if err != nil {
			t.Fatal(err)
		}
		r := newRig(t, rigOpts{backends: 1, alog: l, cfg: Config{RequestID: true}})
		for range 3 {
			r.get("/ok", "")
		}
		r.setMemory(850)
		r.get("/no", "")
		// The answer goes out before the request is logged: stop the
		// server (its requests end) before counting.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.srv.Shutdown(ctx)
		l.Close()
		st := l.Stats()
		b, _ := os.ReadFile(path)
		if st.Logged[accesslog.HTTP] != 1 || st.Written[accesslog.HTTP] != 1 || !strings.Contains(string(b), `"path":"/no"`) || strings.Count(string(b), "\n") != 1 {
			t.Errorf("stats %+v, file %s: want the one refusal logged", st, b)
		}
	})
}

// TestAccessLogTLS: over HTTPS the record has the TLS version and the
// server name the client asked for.
func TestAccessLogTLS(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r, sink := logRig(t, rigOpts{backends: 1, tls: true})
		if rep := r.get("/", ""); rep.status != 200 {
			t.Fatalf("status %d", rep.status)
		}
		l := sink.next(t)
		if l.TLSVersion != 0x0304 || string(l.sni) != "a.example" {
			t.Errorf("tls %#x sni %q, want TLS 1.3 and a.example", l.TLSVersion, l.sni)
		}
	})
}

// TestAccessLogHeadRefused: a head sluice refuses (here a request
// smuggling attempt: Content-Length and Transfer-Encoding) is logged with
// its status and reason.
func TestAccessLogHeadRefused(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r, sink := logRig(t, rigOpts{backends: 1})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"))
		var resp fasthttp.Response
		if err := resp.Read(bufio.NewReader(c)); err != nil {
			t.Fatal(err)
		}
		l := sink.next(t)
		if l.Status != resp.StatusCode() || l.Status != 400 || l.Decision != accesslog.Refused || l.End != accesslog.EndRefused || l.reason == "" {
			t.Errorf("answer %d; record %+v reason %q", resp.StatusCode(), l.HTTPRecord, l.reason)
		}
	})
}

// TestAccessLogAbandonedDelay: a client that leaves while its request
// waits in an ARM delay queue is logged delayed, client_abort, status 499.
func TestAccessLogAbandonedDelay(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r, sink := logRig(t, rigOpts{backends: 1, arm: []string{"name=slow,limit=1/s,action=delay,queue=10,wait=1m"}})
		r.get("/", "")
		sink.next(t)
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET /queued HTTP/1.1\r\nHost: x\r\n\r\n"))
		for i := 0; r.ctrl.Rules()[0].Status().Queued == 0; i++ {
			if i > 5000 {
				t.Fatal("request never queued")
			}
			time.Sleep(time.Millisecond)
		}
		c.Close()
		l := sink.next(t)
		if l.path != "/queued" || l.Decision != accesslog.Delayed || l.End != accesslog.EndClientAbort || l.Status != 499 || l.reason != "arm rule slow" {
			t.Errorf("record %+v reason %q", l.HTTPRecord, l.reason)
		}
	})
}
