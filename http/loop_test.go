//go:build linux

package http

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	nethttp "net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
)

// Tests of the loop engine's own paths: framing, pipelining, back
// pressure, keep-alive reuse, hand-over to fasthttp and the immediate
// Critical abort. The rest of the suite runs on both engines (onEngines).

func loopRig(t *testing.T, o rigOpts) *rig {
	t.Helper()
	o.cfg.Engine = EngineLoop
	return newRig(t, o)
}

func TestLoopServesWithoutHandover(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 2})
	for range 10 {
		if rep := r.get("/", ""); rep.status != 200 {
			t.Fatalf("GET: %d %q", rep.status, rep.body)
		}
	}
	if rep := r.do("POST", "/form", "", strings.NewReader(strings.Repeat("p", 60<<10))); rep.status != 200 {
		t.Fatalf("POST 60 KiB: %d", rep.status)
	}
	var got int
	for _, be := range r.backends {
		be.mu.Lock()
		got += be.bodyLen
		be.mu.Unlock()
	}
	if got != 60<<10 {
		t.Errorf("backends got %d body bytes, want 61440", got)
	}
	if got := r.srv.Stats().HandedOver.Load(); got != 0 {
		t.Errorf("handed over %d connections, want 0", got)
	}
}

func TestLoopPipelinedInOrder(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 2})
	for _, be := range r.backends {
		be.handler = func(ctx *fasthttp.RequestCtx) { ctx.SetBody(ctx.Path()) }
	}
	rc := dialRaw(t, r.addr)
	var all strings.Builder
	for _, p := range []string{"/a", "/b", "/c", "/d"} {
		all.WriteString("GET " + p + " HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	rc.send(all.String())
	for _, want := range []string{"/a", "/b", "/c", "/d"} {
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != want {
			t.Fatalf("answer %d %q, want 200 %q", resp.StatusCode, body, want)
		}
	}
}

func TestLoopChunkedAnswerRelayed(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := range 3 {
				w.WriteString(strings.Repeat(string(rune('a'+i)), 1000))
				w.Flush()
			}
		})
	}
	rc := dialRaw(t, r.addr)
	for range 2 { // the second answer on the same connection shows the end was found
		rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := rc.read("GET")
		if resp.StatusCode != 200 || body != strings.Repeat("a", 1000)+strings.Repeat("b", 1000)+strings.Repeat("c", 1000) {
			t.Fatalf("answer %d, %d bytes", resp.StatusCode, len(body))
		}
		if len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
			t.Errorf("Transfer-Encoding %v, want chunked", resp.TransferEncoding)
		}
	}
}

// readHead reads a request head from a raw backend connection.
func readHead(c net.Conn, br *bufio.Reader) bool {
	req, err := nethttp.ReadRequest(br)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, req.Body)
	return true
}

func TestLoopCloseDelimitedAnswer(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
		if readHead(c, bufio.NewReader(c)) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end")
		}
	}})
	rc := dialRaw(t, r.addr)
	rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := rc.read("GET")
	if resp.StatusCode != 200 || body != "until the end" || !resp.Close {
		t.Errorf("answer %d %q close=%v, want 200 %q and Connection: close", resp.StatusCode, body, resp.Close, "until the end")
	}
}

func TestLoopInformationalAnswer(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
		br := bufio.NewReader(c)
		for readHead(c, br) {
			io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n")
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}})
	rc := dialRaw(t, r.addr)
	rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, _ := rc.read("GET"); resp.StatusCode != 103 || resp.Header.Get("Link") == "" {
		t.Fatalf("first answer %d %v, want 103 with Link", resp.StatusCode, resp.Header)
	}
	if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("final answer %d %q, want 200 ok", resp.StatusCode, body)
	}
}

func TestLoopHeadAndNoContent(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/none":
			ctx.SetStatusCode(fasthttp.StatusNoContent)
		case "/same":
			ctx.SetStatusCode(fasthttp.StatusNotModified)
		default:
			ctx.SetBodyString("twelve bytes")
		}
	}
	rc := dialRaw(t, r.addr)
	for _, step := range []struct{ method, path string }{{"HEAD", "/"}, {"GET", "/none"}, {"GET", "/same"}, {"GET", "/"}} {
		rc.send(step.method + " " + step.path + " HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := rc.read(step.method)
		switch {
		case step.method == "HEAD" && (resp.StatusCode != 200 || resp.ContentLength != 12 || body != ""):
			t.Errorf("HEAD: %d length %d body %q, want 200, 12, no body", resp.StatusCode, resp.ContentLength, body)
		case step.path == "/none" && resp.StatusCode != 204:
			t.Errorf("204: got %d", resp.StatusCode)
		case step.path == "/same" && resp.StatusCode != 304:
			t.Errorf("304: got %d", resp.StatusCode)
		case step.method == "GET" && step.path == "/" && body != "twelve bytes":
			t.Errorf("GET after: %d %q", resp.StatusCode, body)
		}
	}
}

// TestLoopHandsOver: what the loop does not handle goes to the fasthttp
// server with the bytes already read, and is served there; heads the
// check refuses are answered by the loop itself.
func TestLoopHandsOver(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyString("got " + string(ctx.Request.Body()))
	}
	big := strings.Repeat("h", 20<<10)
	for _, tc := range []struct {
		name, raw string
		status    int
		body      string
		handed    uint64
	}{
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: x\r\n\r\n", 200, "got ", 1},
		{"chunked body", "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 200, "got hello", 1},
		{"Expect", "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi", 200, "got hi", 1},
		{"head over 16 KiB", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n", 431, "", 0},
		{"garbage", "GARBAGE\r\n\r\n", 400, "", 0},
	} {
		before := r.srv.Stats().HandedOver.Load()
		rc := dialRaw(t, r.addr)
		rc.send(tc.raw)
		resp, body := rc.read("GET")
		if resp.StatusCode == 100 {
			resp, body = rc.read("POST")
		}
		if resp.StatusCode != tc.status || (tc.body != "" && body != tc.body) {
			t.Errorf("%s: %d %q, want %d %q", tc.name, resp.StatusCode, body, tc.status, tc.body)
		}
		if got := r.srv.Stats().HandedOver.Load() - before; got != tc.handed {
			t.Errorf("%s: handed over %d, want %d", tc.name, got, tc.handed)
		}
	}
	// A head of 8 KiB stays on the loop.
	before := r.srv.Stats().HandedOver.Load()
	rc := dialRaw(t, r.addr)
	rc.send("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + big[:8<<10] + "\r\n\r\n")
	if resp, _ := rc.read("GET"); resp.StatusCode != 200 {
		t.Errorf("8 KiB head: %d", resp.StatusCode)
	}
	if got := r.srv.Stats().HandedOver.Load() - before; got != 0 {
		t.Errorf("8 KiB head handed over")
	}
}

// TestLoopSlowClient: an answer larger than every socket buffer reaches a
// client that reads slowly, whole; relaying waits for the client.
func TestLoopSlowClient(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	const size = 8 << 20
	pattern := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) { ctx.SetBody(pattern) }
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	rc := &rawConn{t: t, c: c, br: bufio.NewReaderSize(c, 1024)}
	for range 2 {
		rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := nethttp.ReadResponse(rc.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 0, size)
		buf := make([]byte, 1000)
		for {
			n, err := resp.Body.Read(buf)
			got = append(got, buf[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("after %d bytes: %v", len(got), err)
			}
		}
		if !bytes.Equal(got, pattern) {
			t.Fatalf("got %d bytes, want the %d-byte pattern", len(got), size)
		}
	}
}

// TestLoopStaleKeepAlive: a backend that closes each connection after one
// answer without saying so; GETs are sent again on a fresh connection and
// all succeed.
func TestLoopStaleKeepAlive(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
		if readHead(c, bufio.NewReader(c)) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}})
	for i := range 30 {
		if rep := r.get("/", ""); rep.status != 200 || rep.body != "ok" {
			t.Fatalf("GET %d: %d %q", i, rep.status, rep.body)
		}
	}
}

func TestLoopBadAnswer502(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
		if readHead(c, bufio.NewReader(c)) {
			io.WriteString(c, "SPDY/9 banana\r\n\r\n")
		}
	}})
	rep := r.get("/", "")
	if rep.status != 502 || !strings.Contains(rep.header.Get("Proxy-Status"), "http_protocol_error") {
		t.Errorf("garbage answer: %d %q, want 502 http_protocol_error", rep.status, rep.header.Get("Proxy-Status"))
	}
}

// TestLoopLargeAnswerOnce: the loop relays any answer as it arrives, so
// a large answer is requested once (the fasthttp engine sends it twice).
func TestLoopLargeAnswerOnce(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{ResponseBuffer: 1 << 10}})
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(strings.Repeat("z", 300<<10)) }
	if rep := r.get("/big", ""); rep.status != 200 || len(rep.body) != 300<<10 {
		t.Fatalf("big: %d, %d bytes", rep.status, len(rep.body))
	}
	if got := r.backends[0].hits.Load(); got != 1 {
		t.Errorf("backend saw the GET %d times, want 1", got)
	}
}

// TestLoopCriticalAbortsNormalWork: on the loop, new work admitted while
// the state was Normal is ended with 503 as soon as the state turns
// Critical, without waiting for its backend.
func TestLoopCriticalAbortsNormalWork(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		entered <- struct{}{}
		<-release
		ctx.SetBodyString("late")
	}
	done := make(chan reply, 1)
	go func() {
		resp, err := r.client.Get("http://" + r.addr + "/new")
		if err != nil {
			done <- reply{}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- reply{status: resp.StatusCode, body: string(b), header: resp.Header}
	}()
	<-entered
	if st := r.setMemory(950); st != admission.Critical {
		t.Fatalf("state %v, want critical", st)
	}
	rep := <-done // answered while the backend still holds the request
	if rep.status != 503 || !strings.Contains(rep.header.Get("Proxy-Status"), "memory state critical") || rep.header.Get("Retry-After") == "" {
		t.Errorf("in-flight new work: %d %v, want 503 memory state critical", rep.status, rep.header)
	}
	if got := r.srv.Stats().Aborted.Load(); got != 1 {
		t.Errorf("aborted = %d, want 1", got)
	}
	once.Do(func() { close(release) })
}

// TestLoopShutdownFinishesInFlight: Shutdown refuses new connections, lets
// the request under way finish (with Connection: close) and returns.
func TestLoopShutdownFinishesInFlight(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		entered <- struct{}{}
		<-release
		ctx.SetBodyString("finished")
	}
	rc := dialRaw(t, r.addr)
	rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	<-entered
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- r.srv.Shutdown(ctx)
	}()
	// New connections are refused once the loops let go of the listener.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.addr, time.Second)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("still accepting connections during shutdown")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	resp, body := rc.read("GET")
	if resp.StatusCode != 200 || body != "finished" || !resp.Close {
		t.Errorf("in-flight answer: %d %q close=%v, want 200 finished with Connection: close", resp.StatusCode, body, resp.Close)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestLoopBufferLimits: a request head grows the client buffer up to
// 16 KiB, an answer head the backend buffer up to 64 KiB; a body over
// -http-stream-threshold goes to fasthttp, which streams it.
func TestLoopBufferLimits(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{StreamThreshold: 4 << 10}})
	big := strings.Repeat("v", 40<<10)
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		if ctx.IsGet() {
			ctx.Response.Header.Set("X-Large", big)
		}
		ctx.SetBodyString("body")
	}
	rc := dialRaw(t, r.addr)
	rc.send("GET / HTTP/1.1\r\nHost: x\r\nX-Mid: " + strings.Repeat("m", 10<<10) + "\r\n\r\n")
	resp, body := rc.read("GET")
	if resp.StatusCode != 200 || body != "body" || resp.Header.Get("X-Large") != big {
		t.Fatalf("answer with a 40 KiB head: %d %q, X-Large %d bytes", resp.StatusCode, body, len(resp.Header.Get("X-Large")))
	}
	if got := r.srv.Stats().HandedOver.Load(); got != 0 {
		t.Fatalf("a 10 KiB request head was handed over")
	}
	if rep := r.do("POST", "/", "", strings.NewReader(strings.Repeat("p", 3<<10))); rep.status != 200 {
		t.Fatalf("POST 3 KiB: %d", rep.status)
	}
	if got := r.srv.Stats().HandedOver.Load(); got != 0 {
		t.Fatalf("a body under the threshold was handed over")
	}
	if rep := r.do("POST", "/", "", strings.NewReader(strings.Repeat("p", 5<<10))); rep.status != 200 {
		t.Fatalf("POST 5 KiB: %d", rep.status)
	}
	if got := r.srv.Stats().HandedOver.Load(); got != 1 {
		t.Errorf("a body over -http-stream-threshold: handed over %d, want 1", got)
	}
	r.backends[0].mu.Lock()
	got := r.backends[0].bodyLen
	r.backends[0].mu.Unlock()
	if got != 5<<10 {
		t.Errorf("backend got %d body bytes, want %d", got, 5<<10)
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(ents)
}

// TestLoopNoFDLeak: clients that finish, vanish mid-request, send garbage
// or get handed over leave no descriptor behind once the server lets go
// of them (the loop owns raw descriptors, so nothing else would close
// them).
func TestLoopNoFDLeak(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 2, cfg: Config{ClientIdle: time.Second, BackendIdle: time.Second}})
	slow := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(slow) }) })
	for _, be := range r.backends {
		be.handler = func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/slow" {
				<-slow
			}
			ctx.SetBodyString("ok")
		}
	}
	r.get("/", "") // warm: backend connections and the handoff server exist
	r.client.CloseIdleConnections()
	base := openFDs(t)
	for i := range 200 {
		rc := dialRaw(t, r.addr)
		switch i % 4 {
		case 0: // a whole exchange, then the client closes
			rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			rc.read("GET")
		case 1: // gone while its request is at the backend
			rc.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
		case 2: // half a request
			rc.send("GET / HTTP/1.1\r\nHo")
		case 3: // handed over, answered 400
			rc.send("GARBAGE\r\n\r\n")
			rc.read("GET")
		}
		rc.c.Close()
	}
	once.Do(func() { close(slow) })
	// The server closes what the clients left, and then its idle backend
	// connections, within the idle timeouts (1s) plus a tick; wait for
	// that, bounded.
	deadline := time.Now().Add(15 * time.Second)
	for {
		n := openFDs(t)
		if n <= base+4 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open, %d before 200 clients came and went", n, base)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FuzzLoopBackendAnswer has a backend answer with arbitrary bytes: the
// client gets an answer (relayed, or 502/504) or a closed connection, and
// the loop keeps serving.
func FuzzLoopBackendAnswer(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"HTTP/1.1 200 OK\r\n\r\nuntil close",
		"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",
		"garbage",
	} {
		f.Add([]byte(seed))
	}
	var answer atomic.Pointer[[]byte]
	r := newRig(f, rigOpts{backends: 1, cfg: Config{Engine: EngineLoop, BackendTimeout: time.Second}, raw: func(c net.Conn) {
		br := bufio.NewReader(c)
		for readHead(c, br) {
			if p := answer.Load(); p != nil {
				c.Write(*p)
			}
			if tc, ok := c.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
		}
	}})
	f.Fuzz(func(t *testing.T, raw []byte) {
		answer.Store(&raw)
		got, err := getClose(t, r.addr)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("answer %q: no answer and no close from the front end", raw)
		}
		checkRelayedAnswer(t, raw, got)
		// The loop still serves: a request it answers itself.
		ok := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		answer.Store(&ok)
		rc := dialRaw(t, r.addr)
		rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("after answer %q the front end answers %d %q", raw, resp.StatusCode, body)
		}
	})
}

// TestLoopHeadRefused: sluice's own answer to HEAD carries no body, so the
// next answer on the connection is read right.
func TestLoopHeadRefused(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	r.setMemory(850) // Lower: new work refused
	rc := dialRaw(t, r.addr)
	rc.send("HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, body := rc.read("HEAD"); resp.StatusCode != 429 || body != "" {
		t.Fatalf("HEAD: %d %q, want 429 without body", resp.StatusCode, body)
	}
	if resp, body := rc.read("GET"); resp.StatusCode != 429 || body == "" {
		t.Fatalf("GET after HEAD: %d %q, want 429 with its text", resp.StatusCode, body)
	}
}

// BenchmarkRoundTrip is one keep-alive GET through the front end to an
// in-process backend, per engine, over loopback: client, front end and
// backend share the benchmark's CPUs, so compare the engines with each
// other, not with bench/http.sh.
func BenchmarkRoundTrip(b *testing.B) {
	// +accesslog: every request logged as JSON to a file (allocations
	// as without); +rid: with request ids too (the benchmark's backend
	// copies every header it gets into a map: 3 allocations more there,
	// none in sluice; TestAccessLogHotPathAllocs).
	for _, name := range []string{EngineLoop, EngineFastHTTP, EngineLoop + "+accesslog", EngineFastHTTP + "+accesslog", EngineLoop + "+accesslog+rid", EngineFastHTTP + "+accesslog+rid"} {
		b.Run(name, func(b *testing.B) {
			name, rid := strings.CutSuffix(name, "+rid")
			engine, withLog := strings.CutSuffix(name, "+accesslog")
			o := rigOpts{backends: 1, cfg: Config{Engine: engine}}
			if withLog {
				l, err := accesslog.New(accesslog.Options{Dest: b.TempDir() + "/access.log", Sample: accesslog.DefaultSample})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				o.alog, o.cfg.RequestID = l, rid
			}
			r := newRig(b, o)
			c, err := net.Dial("tcp", r.addr)
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

// TestLoopAmbiguousAnswerNotReused: an answer with both Transfer-Encoding
// and Content-Length is relayed chunked, and its backend connection is
// closed rather than trusted with the next request.
func TestLoopAmbiguousAnswerNotReused(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
		br := bufio.NewReader(c)
		for readHead(c, br) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\nok\r\n0\r\n\r\n")
		}
	}})
	for i := range 3 {
		if rep := r.get("/", ""); rep.status != 200 || rep.body != "ok" {
			t.Fatalf("GET %d: %d %q", i, rep.status, rep.body)
		}
	}
	if got := r.backends[0].hits.Load(); got != 3 {
		t.Fatalf("backend connections: %d, want 3 (none reused)", got)
	}
}

// TestLoopInformationalSameRead: 1xx answers and the final answer that
// arrive in one read are all relayed at once (the final answer once waited
// for a read event that never came, until the backend timeout).
func TestLoopInformationalSameRead(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{BackendTimeout: 20 * time.Second}, raw: func(c net.Conn) {
		br := bufio.NewReader(c)
		for readHead(c, br) {
			io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}})
	rc := dialRaw(t, r.addr)
	for i := range 5 {
		rc.c.SetDeadline(time.Now().Add(5 * time.Second))
		rc.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		for _, want := range []int{100, 103} {
			if resp, _ := rc.read("GET"); resp.StatusCode != want {
				t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
			}
		}
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d: final answer %d %q, want 200 ok", i, resp.StatusCode, body)
		}
	}
}

// getClose sends one GET with Connection: close to addr and returns all
// the front end wrote back before it closed (5 s at most).
func getClose(t *testing.T, addr string) ([]byte, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	return io.ReadAll(c)
}

// checkRelayedAnswer fails t unless got, everything the client read on a
// Connection: close request after the backend answered raw, is at most
// one final answer (after any 1xx) that frames itself: never two
// Content-Length headers nor Content-Length with Transfer-Encoding, a
// Content-Length equal to the body that follows, and no byte after the
// answer (a second answer would reach whoever reads next).
func checkRelayedAnswer(t *testing.T, raw, got []byte) {
	t.Helper()
	if len(got) == 0 {
		return // closed without an answer
	}
	br := bufio.NewReader(bytes.NewReader(got))
	for {
		head, err := readRawHead(br)
		if err != nil {
			t.Fatalf("backend answer %q relayed as %q: %v", raw, got, err)
		}
		var cl, te int
		for _, line := range strings.Split(head, "\r\n")[1:] {
			name, _, _ := strings.Cut(line, ":")
			switch strings.ToLower(strings.TrimSpace(name)) {
			case "content-length":
				cl++
			case "transfer-encoding":
				te++
			}
		}
		if cl > 1 || cl > 0 && te > 0 {
			t.Fatalf("backend answer %q relayed with ambiguous framing (%d Content-Length, %d Transfer-Encoding):\n%q", raw, cl, te, got)
		}
		if f := strings.Fields(head); len(f) > 1 && len(f[1]) == 3 && f[1][0] == '1' && f[1] != "101" {
			continue // an interim answer; the final one follows
		}
		fr := bufio.NewReader(io.MultiReader(strings.NewReader(head), br))
		resp, err := nethttp.ReadResponse(fr, nil)
		if err != nil {
			t.Fatalf("backend answer %q relayed as %q: %v", raw, got, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			// A body cut short: the backend went away mid-answer, and the
			// client sees the answer end early, as it must.
			return
		}
		if resp.ContentLength >= 0 && int64(len(body)) != resp.ContentLength {
			t.Fatalf("backend answer %q relayed with Content-Length %d and %d bytes of body", raw, resp.ContentLength, len(body))
		}
		if rest, _ := io.ReadAll(fr); len(rest) != 0 && resp.ContentLength >= 0 {
			t.Fatalf("backend answer %q relayed with %d bytes after the answer: %q", raw, len(rest), rest)
		}
		return
	}
}

// readRawHead reads one answer head, through its blank line.
func readRawHead(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\r\n" || line == "\n" {
			return b.String(), nil
		}
	}
}

func TestStatusLineOK(t *testing.T) {
	for in, want := range map[string]bool{
		"HTTP/1.1 200 OK\r\n": true, "HTTP/1.1 204\r\n": true, "HTTP/1.0 599 x\r\n": true, "HTTP/1.1 103 Early\r\n": true,
		"HTTP/1.1 000 x\r\n": false, "HTTP/1.1 001 x\r\n": false, "HTTP/1.1 600 x\r\n": false, "HTTP/1.1 20 OK\r\n": false,
		"HTTP/1.1 2000 OK\r\n": false, "HTTP/1.1  200 OK\r\n": false, "HTTP/2.0 200 OK\r\n": false, "HTTP/1.1 2x0 OK\r\n": false,
		"HTTP/1.1 200": false, "": false,
	} {
		if got := statusLineOK([]byte(in)); got != want {
			t.Errorf("statusLineOK(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestBadStatusCodeIsBadAnswer: a backend's answer whose status is not
// three digits 100 to 599 is a bad answer (502) on both engines; fasthttp
// read "000" as 200 and "001" as an interim answer relayed as
// "HTTP/1.1 1".
func TestBadStatusCodeIsBadAnswer(t *testing.T) {
	for _, v := range suiteVariants {
		for _, answer := range []string{
			"HTTP/1.1 000 x\r\nContent-Length: 2\r\n\r\nok",
			"HTTP/1.1 001 x\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		} {
			t.Run(v.name+"/"+strings.Fields(answer)[1], func(t *testing.T) {
				r := newRig(t, rigOpts{backends: 1, cfg: Config{Engine: v.engine, IOURing: v.ring, BackendTimeout: time.Second}, raw: func(c net.Conn) {
					br := bufio.NewReader(c)
					for readHead(c, br) {
						io.WriteString(c, answer)
						if tc, ok := c.(*net.TCPConn); ok {
							tc.CloseWrite()
						}
					}
				}})
				got, _ := getClose(t, r.addr)
				if !bytes.HasPrefix(got, []byte("HTTP/1.1 502 ")) {
					t.Errorf("answer %q relayed as %q, want 502", answer, got)
				}
			})
		}
	}
}

// TestLoopHandOverWaitsForPendingAnswer: a client that reads an answer
// slowly and meanwhile sends its next request, one the loop hands over
// to fasthttp (HTTP/1.0), gets the whole first answer and then the
// second: a hand-over must never take the socket while an answer's tail
// waits in the loop's output buffer (clientIn does not parse then).
func TestLoopHandOverWaitsForPendingAnswer(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	const size = 4 << 20
	pattern := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/second" {
			ctx.SetBodyString("second")
			return
		}
		ctx.SetBody(pattern)
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	rc := &rawConn{t: t, c: c, br: bufio.NewReaderSize(c, 1024)}
	rc.send("GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := nethttp.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Read all but the last tail bytes slowly, then send the next request
	// while the loop holds the tail, and only then read on.
	// tail is about what the socket buffers (4 KiB at the client, some
	// tens at sluice) and the loop's output buffer (up to one 64 KiB
	// backend read) hold together once the backend's last bytes are read.
	const tail = 96 << 10
	got := make([]byte, 0, size)
	buf := make([]byte, 4096)
	for len(got) < size-tail {
		n, err := resp.Body.Read(buf[:min(len(buf), size-tail-len(got))])
		got = append(got, buf[:n]...)
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
	}
	time.Sleep(50 * time.Millisecond) // the loop reads the backend's last bytes meanwhile
	rc.send("GET /second HTTP/1.0\r\nHost: x\r\n\r\n")
	rest, err := io.ReadAll(resp.Body)
	got = append(got, rest...)
	if err != nil || !bytes.Equal(got, pattern) {
		t.Fatalf("first answer: %d bytes (%v), want the %d-byte pattern whole", len(got), err, size)
	}
	resp2, err := nethttp.ReadResponse(rc.br, nil)
	if err != nil {
		t.Fatalf("second answer: %v", err)
	}
	body, _ := io.ReadAll(resp2.Body)
	if resp2.StatusCode != 200 || string(body) != "second" {
		t.Fatalf("second answer %d %q", resp2.StatusCode, body)
	}
}

// TestLoopIdleConnHoldsNoReadBuffer: a keep-alive connection waiting for
// its next request holds no read buffer (the loop's pool has it back),
// and the next request on it is served as before.
func TestLoopIdleConnHoldsNoReadBuffer(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1})
	const n = 20
	conns := make([]*rawConn, n)
	for i := range conns {
		conns[i] = dialRaw(t, r.addr)
		conns[i].send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, _ := conns[i].read("GET"); resp.StatusCode != 200 {
			t.Fatalf("conn %d: %d", i, resp.StatusCode)
		}
	}
	// On each loop's goroutine: how many client connections hold a read
	// buffer.
	holding := func() (clients, buffers int) {
		for _, l := range r.srv.loops.Load().loops {
			done := make(chan [2]int)
			l.post(func() {
				var c, b int
				for _, o := range l.fds {
					if o.c != nil && o.c.fd >= 0 {
						c++
						if o.c.in != nil {
							b++
						}
					}
				}
				done <- [2]int{c, b}
			})
			got := <-done
			clients += got[0]
			buffers += got[1]
		}
		return clients, buffers
	}
	var clients, buffers int
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if clients, buffers = holding(); clients == n && buffers == 0 || time.Now().After(end) {
			break
		}
	}
	if clients != n || buffers != 0 {
		t.Fatalf("%d idle client connections, %d of them holding a read buffer; want %d and 0", clients, buffers, n)
	}
	for i, rc := range conns {
		rc.send("GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, _ := rc.read("GET"); resp.StatusCode != 200 {
			t.Fatalf("conn %d, second request: %d", i, resp.StatusCode)
		}
	}
}
