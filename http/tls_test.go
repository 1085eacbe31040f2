package http

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
)

// TestHTTPSServes: over HTTPS, on both engines, a Go client gets the
// certificate of the name it asked for (SNI), its keep-alive requests are
// answered (a large answer crosses many records), the backend sees
// X-Forwarded-Proto https and Forwarded proto=https, and requests the
// loop hands to fasthttp (a chunked body) are served over the same TLS
// connection.
func TestHTTPSServes(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, tls: true})
		big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320 KB: about 20 records
		r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/big" {
				ctx.SetBody(big)
				return
			}
			ctx.SetBodyString("b0 " + string(ctx.Method()) + " " + fmt.Sprint(len(ctx.Request.Body())))
		}
		for _, name := range []string{"a.example", "b.example"} {
			c, err := tls.Dial("tcp", r.addr, testTLS(t).client(name))
			if err != nil {
				t.Fatalf("SNI %s: %v", name, err)
			}
			if got := c.ConnectionState().PeerCertificates[0].DNSNames[0]; got != name {
				t.Errorf("SNI %s: certificate for %s", name, got)
			}
			c.Close()
		}
		for i := range 3 {
			rep := r.get("/x", "")
			if rep.status != 200 || rep.body != "b0 GET 0" {
				t.Fatalf("request %d: %d %q", i, rep.status, rep.body)
			}
		}
		h := r.backends[0].lastHeaders()
		if got := h["X-Forwarded-Proto"]; len(got) != 1 || got[0] != "https" {
			t.Errorf("X-Forwarded-Proto %q, want https", got)
		}
		if got := h["Forwarded"]; len(got) != 1 || !strings.Contains(got[0], ";proto=https") {
			t.Errorf("Forwarded %q, want proto=https", got)
		}
		rep := r.get("/big", "")
		if rep.status != 200 || rep.body != string(big) {
			t.Fatalf("large answer: %d, %d bytes, want 200 and %d bytes", rep.status, len(rep.body), len(big))
		}
		rep = r.do("POST", "/post", "", strings.NewReader(strings.Repeat("p", 40000)))
		if rep.status != 200 || rep.body != "b0 POST 40000" {
			t.Fatalf("POST: %d %q", rep.status, rep.body)
		}
		if engineOf(t) == EngineLoop {
			if n := r.srv.Stats().HandedOver.Load(); n != 0 {
				t.Errorf("%d connections handed over, want none: the loop serves HTTPS", n)
			}
		}
		// A chunked body: the loop hands the connection to fasthttp, which
		// goes on reading the same TLS connection.
		rc := dialRaw(t, r.addr)
		rc.send("GET /x HTTP/1.1\r\nHost: a.example\r\n\r\n")
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "b0 GET 0" {
			t.Fatalf("before the hand-over: %d %q", resp.StatusCode, body)
		}
		rc.send("POST /c HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
		if resp, body := rc.read("POST"); resp.StatusCode != 200 || body != "b0 POST 5" {
			t.Fatalf("chunked: %d %q", resp.StatusCode, body)
		}
		rc.send("GET /x HTTP/1.1\r\nHost: a.example\r\n\r\n")
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "b0 GET 0" {
			t.Fatalf("after the hand-over: %d %q", resp.StatusCode, body)
		}
		if engineOf(t) == EngineLoop {
			if n := r.srv.Stats().HandedOver.Load(); n != 1 {
				t.Errorf("%d connections handed over, want the chunked one", n)
			}
		}
	})
}

// TestHTTPSStickyCookieSecure: the sticky cookie is Secure for a client
// over TLS and not for a plain one.
func TestHTTPSStickyCookieSecure(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		for _, secure := range []bool{false, true} {
			r := newRig(t, rigOpts{backends: 1, tls: secure})
			rep := r.get("/", "")
			var sc string
			for _, v := range rep.header.Values("Set-Cookie") {
				if strings.HasPrefix(v, "SLUICE=") {
					sc = v
				}
			}
			if sc == "" {
				t.Fatalf("tls=%v: no sticky cookie in %v", secure, rep.header)
			}
			if got := strings.HasSuffix(sc, "; Secure"); got != secure {
				t.Errorf("tls=%v: Set-Cookie %q: Secure=%v, want %v", secure, sc, got, secure)
			}
		}
	})
}

// TestHTTPSCurl: curl over HTTPS with SNI for two names and a name no
// certificate has (the first certificate answers it), on both engines.
func TestHTTPSCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, tls: true})
		_, port, _ := net.SplitHostPort(r.addr)
		ca := testTLS(t).caFile(t)
		for _, tc := range []struct {
			name, subject string
			ok            bool
		}{
			{"a.example", "CN=a.example", true},
			{"b.example", "CN=b.example", true},
			{"c.example", "CN=a.example", false}, // the default certificate, which is not c.example's
		} {
			out, err := exec.Command(curl, "-sS", "-v", "--max-time", "10", "--cacert", ca,
				"--resolve", tc.name+":"+port+":127.0.0.1", "https://"+tc.name+":"+port+"/curl").CombinedOutput()
			if (err == nil) != tc.ok {
				t.Errorf("curl %s: err %v, want ok=%v\n%s", tc.name, err, tc.ok, out)
				continue
			}
			if !strings.Contains(string(out), "subject: "+tc.subject) {
				t.Errorf("curl %s: want certificate subject %s\n%s", tc.name, tc.subject, out)
			}
			if tc.ok && !strings.HasSuffix(string(out), "b0") {
				t.Errorf("curl %s: want the backend's answer b0\n%s", tc.name, out)
			}
		}
		// -k: the wrong name still gets served with the default certificate.
		out, err := exec.Command(curl, "-sS", "-k", "--max-time", "10", "--resolve", "c.example:"+port+":127.0.0.1", "https://c.example:"+port+"/").CombinedOutput()
		if err != nil || string(out) != "b0" {
			t.Errorf("curl -k c.example: %v %q", err, out)
		}
	})
}

// countingGate is a HandshakeGate admitting max handshakes in flight.
type countingGate struct {
	max      int64
	inFlight atomic.Int64
	acquired atomic.Int64
	refused  atomic.Int64
}

func (g *countingGate) Acquire(int64) bool {
	if g.inFlight.Add(1) > g.max {
		g.inFlight.Add(-1)
		g.refused.Add(1)
		return false
	}
	g.acquired.Add(1)
	return true
}

func (g *countingGate) Release() {
	if g.inFlight.Add(-1) < 0 {
		panic("handshake gate released more than acquired")
	}
}

// eventually fails t unless cond comes to hold (waitFor: within 20 s):
// for what a goroutine of the server makes true soon, not for timing.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !waitFor(cond) {
		t.Fatalf("waited for %s", what)
	}
}

// clientHello returns the first bytes a TLS client sends: its ClientHello
// record, captured from a handshake with nobody.
func clientHello(t *testing.T) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, testTLS(t).client("a.example")).Handshake()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// TestHTTPSSlowHandshakeClosed: a client that sends its ClientHello one
// byte at a time is closed at the handshake timeout (short here), counted
// as a failed handshake, and never takes a place in the handshake gate:
// the place is asked for once the hello is whole.
func TestHTTPSSlowHandshakeClosed(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		gate := &countingGate{max: 2}
		r := newRig(t, rigOpts{backends: 1, tls: true, cfg: Config{Handshakes: gate, HandshakeTimeout: 300 * time.Millisecond}})
		hello := clientHello(t)
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		closed := false
		for i := 0; i < len(hello)-1 && !closed; i++ { // never the last byte: the hello stays unfinished
			if _, err := c.Write(hello[i : i+1]); err != nil {
				closed = true
				break
			}
			c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			var one [1]byte
			_, err := c.Read(one[:])
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				closed = true // EOF or reset: the server closed it
			}
		}
		if !closed {
			t.Fatalf("the stalled handshake was not closed after %d bytes", len(hello)-1)
		}
		eventually(t, "the gate released", func() bool { return gate.inFlight.Load() == 0 })
		if gate.acquired.Load() != 0 || r.srv.Stats().HandshakeFailed.Load() != 1 {
			t.Errorf("acquired %d, failed %d: want 0 and 1", gate.acquired.Load(), r.srv.Stats().HandshakeFailed.Load())
		}
		if rep := r.get("/", ""); rep.status != 200 {
			t.Errorf("after: %d", rep.status)
		}
	})
}

// TestHTTPSHandshakeFlood: with 2 handshakes allowed in flight, a flood
// of connections that send a ClientHello and never finish their handshake
// holds 2 places and is refused the rest, while an established client keeps being served; when
// the flood goes, new clients get their handshake.
func TestHTTPSHandshakeFlood(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		gate := &countingGate{max: 2}
		r := newRig(t, rigOpts{backends: 1, tls: true, cfg: Config{Handshakes: gate}})
		est := dialRaw(t, r.addr) // established before the flood
		get := func(when string) {
			t.Helper()
			est.send("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n")
			if resp, body := est.read("GET"); resp.StatusCode != 200 || body != "b0" {
				t.Fatalf("%s: %d %q", when, resp.StatusCode, body)
			}
		}
		get("before the flood")
		var flood []net.Conn
		hello := clientHello(t)
		for range 10 {
			c, err := net.Dial("tcp", r.addr)
			if err != nil {
				t.Fatal(err)
			}
			flood = append(flood, c)
			c.Write(hello) // and never a word more
		}
		eventually(t, "8 of 10 refused", func() bool { return r.srv.Stats().HandshakeRefused.Load() == 8 })
		if gate.inFlight.Load() != 2 {
			t.Errorf("in flight %d, want 2", gate.inFlight.Load())
		}
		for i := range 20 {
			get(fmt.Sprintf("during the flood, request %d", i))
		}
		for _, c := range flood {
			c.Close()
		}
		eventually(t, "the gate released", func() bool { return gate.inFlight.Load() == 0 })
		c, err := tls.Dial("tcp", r.addr, testTLS(t).client("a.example"))
		if err != nil {
			t.Fatalf("after the flood: %v", err)
		}
		c.Close()
		get("after the flood")
	})
}

// TestHTTPSRedirect: with -https-redirect the plain listener answers 308
// to the same host and target over HTTPS, on the HTTPS listener's port;
// a Host that could name another authority gets 400.
func TestHTTPSRedirect(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, cfg: Config{HTTPSRedirect: true, TLSListen: "127.0.0.1:8443", TLSConfig: testTLS(t).server()}})
		for _, tc := range []struct{ req, status, location string }{
			{"GET /a/b?c=d HTTP/1.1\r\nHost: www.example:8080\r\n\r\n", "308", "https://www.example:8443/a/b?c=d"},
			{"POST /form HTTP/1.1\r\nHost: WWW.example\r\nContent-Length: 2\r\n\r\nok", "308", "https://WWW.example:8443/form"},
			{"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", "308", "https://[::1]:8443/"},
			{"GET http://other.example/p HTTP/1.1\r\nHost: other.example\r\n\r\n", "308", "https://other.example:8443/p"},
			{"GET / HTTP/1.1\r\nHost: evil.example@good.example\r\n\r\n", "400", ""},
			{"GET / HTTP/1.1\r\nHost: \r\n\r\n", "400", ""},
		} {
			rc := dialRaw(t, r.addr)
			rc.send(tc.req)
			resp, _ := rc.read(strings.Fields(tc.req)[0])
			if fmt.Sprint(resp.StatusCode) != tc.status || resp.Header.Get("Location") != tc.location {
				t.Errorf("%q: %d %q, want %s %q", tc.req, resp.StatusCode, resp.Header.Get("Location"), tc.status, tc.location)
			}
		}
		if n := r.backends[0].hits.Load(); n != 0 {
			t.Errorf("the backend got %d requests, want none", n)
		}
	})
}

// TestRedirectHost: the Host values a redirect takes, and those it
// refuses.
func TestRedirectHost(t *testing.T) {
	for _, tc := range []struct{ in, host string }{
		{"example.com", "example.com"},
		{"example.com:8080", "example.com"},
		{"a-b_c.example", "a-b_c.example"},
		{"192.0.2.1:80", "192.0.2.1"},
		{"[2001:db8::1]:443", "[2001:db8::1]"},
		{"[2001:db8::1]", "[2001:db8::1]"},
		{"", ""},
		{"user@example.com", ""},
		{"example.com/evil", ""},
		{`example.com\evil`, ""},
		{"example.com:80x", ""},
		{"example.com:123456", ""},
		{".example.com", ""},
		{"[::1]x", ""},
		{"[]", ""},
		{"[g::1]", ""},
		{"exa mple", ""},
		{strings.Repeat("a", 256), ""},
	} {
		host, ok := redirectHost([]byte(tc.in))
		if ok != (tc.host != "") || string(host) != tc.host {
			t.Errorf("redirectHost(%q) = %q %v, want %q", tc.in, host, ok, tc.host)
		}
	}
}

// readAnswer reads one HTTP answer from br.
func readAnswer(br *bufio.Reader) (int, string, error) {
	resp, err := nethttp.ReadResponse(br, nil)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), err
}

// BenchmarkTLSKeepAlive is one keep-alive GET through the front end to an
// in-process backend, per engine, over plain HTTP and over HTTPS (TLS
// 1.3, the handshake done before the timer): what the record layer costs
// a request, in time and allocations. Client, front end and backend share
// the benchmark's CPUs: compare the rows with each other.
func BenchmarkTLSKeepAlive(b *testing.B) {
	for _, engine := range []string{EngineLoop, EngineFastHTTP} {
		for _, secure := range []bool{false, true} {
			name := engine + "/plain"
			if secure {
				name = engine + "/tls"
			}
			b.Run(name, func(b *testing.B) {
				r := newRig(b, rigOpts{backends: 1, tls: secure, cfg: Config{Engine: engine, StickyCookie: "-"}})
				c, err := dialTest(r.addr, 5*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				br := bufio.NewReader(c)
				req := []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				var resp fasthttp.Response
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.Write(req); err != nil {
						b.Fatal(err)
					}
					if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
						b.Fatal(err, resp.StatusCode())
					}
				}
			})
		}
	}
}

// TestHTTPSShutdownEndsHandshakes: Shutdown does not wait for handshakes
// under way (here one that would last the default 10 s): they are ended,
// their places in the gate given back, and the established clients'
// connections closed.
func TestHTTPSShutdownEndsHandshakes(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		gate := &countingGate{max: 4}
		r := newRig(t, rigOpts{backends: 1, tls: true, cfg: Config{Handshakes: gate}})
		est := dialRaw(t, r.addr)
		est.send("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n")
		if resp, _ := est.read("GET"); resp.StatusCode != 200 {
			t.Fatalf("established: %d", resp.StatusCode)
		}
		stalled, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer stalled.Close()
		stalled.Write(clientHello(t))
		eventually(t, "the stalled handshake in the gate", func() bool { return gate.acquired.Load() == 2 })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.srv.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v (it waited for the handshake)", err)
		}
		if n := gate.inFlight.Load(); n != 0 {
			t.Errorf("%d handshakes in flight after Shutdown", n)
		}
		stalled.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, stalled); isTimeout(err) { // the server's first flight, then the end
			t.Errorf("the stalled connection after Shutdown: %v, want it closed", err)
		}
		est.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := est.c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("the established connection after Shutdown: %v, want it closed", err)
		}
	})
}

// isTimeout reports whether err is a timeout.
func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestHTTPSConcurrentClients: many keep-alive clients at once, over TLS
// 1.2 and 1.3, each request answered with its own body, on both engines
// (run with -race: the loops, the handshake goroutines and the clients).
func TestHTTPSConcurrentClients(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, tls: true, cfg: Config{Loops: 2}})
		for _, be := range r.backends {
			be.handler = func(ctx *fasthttp.RequestCtx) { ctx.SetBody(ctx.Path()) }
		}
		errs := make(chan error, 16)
		for i := range 16 {
			go func() {
				cfg := testTLS(t).client("b.example")
				if i%2 == 0 {
					cfg.MaxVersion = tls.VersionTLS12
				}
				c, err := tls.Dial("tcp", r.addr, cfg)
				if err != nil {
					errs <- err
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				br := bufio.NewReader(c)
				for j := range 20 {
					path := fmt.Sprintf("/c%d/r%d", i, j)
					fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: b.example\r\n\r\n", path)
					code, body, err := readAnswer(br)
					if err != nil || code != 200 || body != path {
						errs <- fmt.Errorf("client %d request %d: %d %q %v", i, j, code, body, err)
						return
					}
				}
				errs <- nil
			}()
		}
		for range 16 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	})
}

// TestHTTPSALPNh2: a client that negotiates h2 on the HTTPS listener is
// served HTTP/2 (h2.go) through the same pipeline; one that asks for
// http/1.1 is served as ever.
func TestHTTPSALPNh2(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		cfg := testTLS(t).server()
		cfg.NextProtos = []string{"h2", "http/1.1"}
		r := newRig(t, rigOpts{backends: 1, tls: true, cfg: Config{TLSConfig: cfg}})
		cc := testTLS(t).client("a.example")
		cc.NextProtos = []string{"h2"}
		tr := &http2.Transport{TLSClientConfig: cc, DialTLSContext: func(ctx context.Context, network, _ string, cfg *tls.Config) (net.Conn, error) {
			return (&tls.Dialer{Config: cfg}).DialContext(ctx, network, r.addr)
		}}
		defer tr.CloseIdleConnections()
		cl := &nethttp.Client{Transport: tr, Timeout: 10 * time.Second}
		res, err := cl.Get("https://a.example/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.ProtoMajor != 2 || res.StatusCode != 200 || string(body) != "b0" {
			t.Errorf("h2 over TLS: %s %d %q, want HTTP/2 200 \"b0\"", res.Proto, res.StatusCode, body)
		}
		if got := res.Header.Get("Set-Cookie"); got != "" && !strings.Contains(got, "Secure") {
			t.Errorf("sticky cookie over h2+TLS without Secure: %q", got)
		}

		cc = testTLS(t).client("a.example")
		cc.NextProtos = []string{"http/1.1"}
		c, err := tls.Dial("tcp", r.addr, cc)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: a.example\r\n\r\n")
		if code, body, err := readAnswer(bufio.NewReader(c)); err != nil || code != 200 || body != "b0" {
			t.Errorf("http/1.1: %d %q %v", code, body, err)
		}
		c.Close()
	})
}

// TestHTTPSPlainHTTPAnswered400: plain HTTP sent to the HTTPS listener gets
// a 400 that says the port speaks HTTPS, and the connection is closed;
// the listener keeps serving TLS clients.
func TestHTTPSPlainHTTPAnswered400(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, tls: true})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: example.test\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("read: %v (got %q)", err, got)
		}
		if !strings.HasPrefix(string(got), "HTTP/1.1 400 Bad Request\r\n") || !strings.HasSuffix(string(got), "\r\n\r\nThis port speaks HTTPS: use https:// to reach it\n") {
			t.Fatalf("plain HTTP to the HTTPS port got %q, want a 400 naming HTTPS", got)
		}
		resp, err := nethttp.ReadResponse(bufio.NewReader(strings.NewReader(string(got))), nil)
		if err != nil {
			t.Fatalf("the 400 does not parse: %v", err)
		}
		if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 400 || int64(len(body)) != resp.ContentLength {
			t.Errorf("status %d, body %d bytes of Content-Length %d", resp.StatusCode, len(body), resp.ContentLength)
		}
		if rep := r.get("/", ""); rep.status != 200 {
			t.Errorf("a TLS client after it: %d", rep.status)
		}
	})
}

// TestHTTPSReadPaths: the ways a request's records reach an HTTPS
// connection are all answered, on both engines: keep-alive requests one
// after another (each after the socket was read dry), two requests in one
// record, one head in two records, and a request followed by the client's
// FIN (its answer is sent before the connection closes).
func TestHTTPSReadPaths(t *testing.T) {
	const req = "GET /x HTTP/1.1\r\nHost: a.example\r\n\r\n"
	for _, tc := range []struct {
		name    string
		writes  []string // each one TLS write (one record)
		answers int
		fin     bool // the client shuts down its TCP side after writing
	}{
		{"keep-alive", []string{req}, 1, false},
		{"pipelined", []string{req + req}, 2, false},
		{"split head", []string{req[:10], req[10:]}, 1, false},
		{"then FIN", []string{req}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onEngines(t, func(t *testing.T) {
				r := newRig(t, rigOpts{backends: 1, tls: true})
				r.backends[0].handler = func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("b0 " + string(ctx.Path())) }
				raw, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer raw.Close()
				raw.SetDeadline(time.Now().Add(20 * time.Second))
				v, _ := tlsClients.Load(r.addr)
				c := tls.Client(raw, v.(*tls.Config))
				br := bufio.NewReader(c)
				rounds := 3
				if tc.fin {
					rounds = 1
				}
				for round := range rounds {
					for _, w := range tc.writes {
						if _, err := io.WriteString(c, w); err != nil {
							t.Fatal(err)
						}
					}
					if tc.fin {
						raw.(*net.TCPConn).CloseWrite()
					}
					for i := range tc.answers {
						resp, err := nethttp.ReadResponse(br, nil)
						if err != nil {
							t.Fatalf("round %d answer %d: %v", round, i, err)
						}
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 200 || string(b) != "b0 /x" {
							t.Fatalf("round %d answer %d: %d %q", round, i, resp.StatusCode, b)
						}
					}
				}
				if tc.fin {
					if n, err := br.Read(make([]byte, 1)); err == nil {
						t.Errorf("after the FIN: %d more bytes, want the connection closed", n)
					}
				}
			})
		})
	}
}

// TestHTTPSUnfinishedRecordTimesOut: a client that starts a TLS record
// and never finishes it is sending a request, not idling: it is closed at
// -http-client-timeout (ClientReadTimeout), as a client that sent half a
// request head is, not kept for -http-client-idle. (A record announcing
// 16 KiB and bringing 100 bytes held its connection and about 24 kB for
// the idle timeout, two minutes by default.)
func TestHTTPSUnfinishedRecordTimesOut(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, tls: true, cfg: Config{ClientReadTimeout: 200 * time.Millisecond, ClientIdle: time.Hour}})
		raw, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		v, _ := tlsClients.Load(r.addr)
		c := tls.Client(raw, v.(*tls.Config))
		if err := c.Handshake(); err != nil {
			t.Fatal(err)
		}
		// An application-data record header announcing 16 KiB, and 100
		// bytes of its body.
		rec := append([]byte{23, 3, 3, 0x40, 0x00}, make([]byte, 100)...)
		if _, err := raw.Write(rec); err != nil {
			t.Fatal(err)
		}
		raw.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 512)
		for {
			if _, err := raw.Read(buf); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatal("the connection is still open 10 s after an unfinished record (read timeout 200 ms)")
				}
				return // closed (EOF or reset): what is wanted
			}
		}
	})
}
