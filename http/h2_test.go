package http

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	nethttp "net/http"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
)

// h2cListen serves h2c for r's server on a loopback port and returns it.
func h2cListen(t testing.TB, r *rig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go r.srv.ServeH2C(ln)
	return ln.Addr().String()
}

// tlsListen serves TLS for r's server on a loopback port with the tests'
// certificates (testTLS: a.example's for any name), offering ALPN h2 and
// http/1.1 and handing connections that negotiated h2 to serveH2, as the
// HTTPS listener does. It returns the address and the certificate pool a
// client trusts.
func tlsListen(t testing.TB, r *rig) (string, *x509.CertPool) {
	t.Helper()
	pki := testTLS(t)
	cfg := pki.server()
	cfg.NextProtos = []string{"h2", "http/1.1"}
	pool := pki.roots
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := c.(*tls.Conn)
				tc.SetDeadline(time.Now().Add(5 * time.Second))
				if err := tc.Handshake(); err != nil || tc.ConnectionState().NegotiatedProtocol != "h2" {
					tc.Close()
					return
				}
				tc.SetDeadline(time.Time{})
				r.srv.serveH2(tc)
			}()
		}
	}()
	return ln.Addr().String(), pool
}

// h2cClient is an HTTP/2 client speaking h2c with prior knowledge.
func h2cClient(t testing.TB) *nethttp.Client {
	tr := &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &nethttp.Client{Transport: tr, Timeout: 10 * time.Second}
}

// h2TLSClient is an HTTP/2 client over TLS trusting pool.
func h2TLSClient(t testing.TB, pool *x509.CertPool) *nethttp.Client {
	tr := &http2.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "a.example"}}
	t.Cleanup(tr.CloseIdleConnections)
	return &nethttp.Client{Transport: tr, Timeout: 10 * time.Second}
}

func h2Do(t testing.TB, c *nethttp.Client, method, url, cookie string, body io.Reader) reply {
	t.Helper()
	req, err := nethttp.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, url, err)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("%s %s: answered in %s", method, url, resp.Proto)
	}
	return reply{status: resp.StatusCode, body: string(b), header: resp.Header}
}

// h2Targets runs f against an h2c client and a TLS (ALPN h2) client of r.
func h2Targets(t *testing.T, r *rig, f func(t *testing.T, c *nethttp.Client, base string)) {
	t.Run("h2c", func(t *testing.T) { f(t, h2cClient(t), "http://"+h2cListen(t, r)) })
	t.Run("tls", func(t *testing.T) {
		addr, pool := tlsListen(t, r)
		_, port, _ := net.SplitHostPort(addr)
		f(t, h2TLSClient(t, pool), "https://localhost:"+port)
	})
}

// TestH2Forwards: streams reach the backends as HTTP/1.1 requests with
// the rewriting HTTP/1.1 requests get, bodies below and above the stream
// threshold (with and without a declared length) arrive whole, and answers
// come back with their length and without hop-by-hop fields.
func TestH2Forwards(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB, over the 1 MiB threshold
		r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
			ctx.Response.Header.Set("X-Proto", string(ctx.Request.Header.Protocol()))
			ctx.Response.Header.Set("X-Len", strconv.Itoa(len(ctx.Request.Body())))
			ctx.Response.Header.Set("Keep-Alive", "timeout=5")
			switch string(ctx.Path()) {
			case "/big":
				ctx.SetBody(big) // over -http-response-buffer: streamed
			case "/chunked":
				ctx.SetBodyStream(bytes.NewReader(big), -1)
			default:
				ctx.SetBodyString("b0")
			}
		}
		h2Targets(t, r, func(t *testing.T, c *nethttp.Client, base string) {
			rep := h2Do(t, c, "GET", base+"/a?q=1", "", nil)
			if rep.status != 200 || rep.body != "b0" || rep.header.Get("X-Proto") != "HTTP/1.1" {
				t.Fatalf("GET: %d %q %v", rep.status, rep.body, rep.header)
			}
			for _, k := range []string{"Connection", "Keep-Alive", "Transfer-Encoding"} {
				if v, ok := rep.header[k]; ok {
					t.Errorf("answer carries %s: %q", k, v)
				}
			}
			if rep.header.Get("Content-Length") != "2" {
				t.Errorf("Content-Length %q, want 2", rep.header.Get("Content-Length"))
			}
			hs := r.backends[0].lastHeaders()
			host := strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")
			if got := hs["Host"]; len(got) != 1 || got[0] != host {
				t.Errorf("backend Host %q, want %q", got, host)
			}
			if got := hs["X-Forwarded-For"]; len(got) != 1 || got[0] != "127.0.0.1" {
				t.Errorf("backend X-Forwarded-For %q", got)
			}
			for _, tc := range []struct {
				name string
				body func() io.Reader // a bytes.Reader gives a Content-Length; others none
				n    int
			}{
				{"small", func() io.Reader { return bytes.NewReader(big[:1000]) }, 1000},
				{"small undeclared", func() io.Reader { return io.MultiReader(bytes.NewReader(big[:1000])) }, 1000},
				{"large", func() io.Reader { return bytes.NewReader(big) }, len(big)},
				{"large undeclared", func() io.Reader { return io.MultiReader(bytes.NewReader(big)) }, len(big)},
			} {
				rep := h2Do(t, c, "POST", base+"/up", "", tc.body())
				if rep.status != 200 || rep.header.Get("X-Len") != strconv.Itoa(tc.n) {
					t.Errorf("POST %s: %d, backend got %s bytes, want %d", tc.name, rep.status, rep.header.Get("X-Len"), tc.n)
				}
			}
			for _, path := range []string{"/big", "/chunked"} {
				rep := h2Do(t, c, "GET", base+path, "", nil)
				if rep.status != 200 || rep.body != string(big) {
					t.Errorf("GET %s: %d, %d bytes, want %d", path, rep.status, len(rep.body), len(big))
				}
				if path == "/big" && rep.header.Get("Content-Length") != strconv.Itoa(len(big)) {
					t.Errorf("GET %s: Content-Length %q", path, rep.header.Get("Content-Length"))
				}
			}
		})
		if n := r.srv.Stats().H2.Streams.Load(); n != 2*7 {
			t.Errorf("streams counted %d, want 14", n)
		}
		if n := r.srv.Stats().H2.Conns.Load(); n != 2 {
			t.Errorf("connections counted %d, want 2", n)
		}
	})
}

// TestH2Curl: curl's HTTP/2 with prior knowledge on the h2c listener and
// over TLS with ALPN.
func TestH2Curl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl")
	}
	if out, _ := exec.Command("curl", "--version").Output(); !strings.Contains(string(out), "HTTP2") {
		t.Skip("curl without HTTP/2")
	}
	r := newRig(t, rigOpts{backends: 1})
	h2c := h2cListen(t, r)
	tlsAddr, _ := tlsListen(t, r)
	_, port, _ := net.SplitHostPort(tlsAddr)
	for _, args := range [][]string{
		{"--http2-prior-knowledge", "http://" + h2c + "/x"},
		{"--http2", "-k", "--resolve", "localhost:" + port + ":127.0.0.1", "https://localhost:" + port + "/x"},
	} {
		cmd := exec.Command("curl", append([]string{"-s", "-i", "--max-time", "10"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
		if !strings.HasPrefix(string(out), "HTTP/2 200") || !strings.HasSuffix(string(out), "\r\n\r\nb0") || !strings.Contains(string(out), "set-cookie: SLUICE=") {
			t.Errorf("curl %v:\n%s", args, out)
		}
	}
}

// TestH2StickyPerStream: on one connection, streams with the sticky
// cookie stay on its backend; streams without it are new work each,
// spread by the policy.
func TestH2StickyPerStream(t *testing.T) {
	r := newRig(t, rigOpts{backends: 3})
	c, base := h2cClient(t), "http://"+h2cListen(t, r)
	first := h2Do(t, c, "GET", base+"/", "", nil)
	cookie := stickyFrom(t, first)
	var wg sync.WaitGroup
	var mu sync.Mutex
	pinned, fresh := map[string]int{}, map[string]int{}
	for range 30 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			rep := h2Do(t, c, "GET", base+"/", cookie, nil)
			mu.Lock()
			pinned[rep.body]++
			mu.Unlock()
		}()
		go func() {
			defer wg.Done()
			rep := h2Do(t, c, "GET", base+"/", "", nil)
			mu.Lock()
			fresh[rep.body]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if len(pinned) != 1 || pinned[first.body] != 30 {
		t.Errorf("streams with the cookie of %s went to %v", first.body, pinned)
	}
	if len(fresh) != 3 {
		t.Errorf("streams without a cookie went to %v, want all 3 backends", fresh)
	}
	if n := r.srv.Stats().H2.Conns.Load(); n != 1 {
		t.Errorf("%d connections, want the streams on 1", n)
	}
}

// TestH2ARMCountsStreams: each stream is one request to an ARM rule; with
// the clock still, a rule of 3 a second admits 3 streams of 5 on one
// connection and refuses 2 with 429.
func TestH2ARMCountsStreams(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, arm: []string{"name=api,limit=3/s,action=reject"}})
		c, base := h2cClient(t), "http://"+h2cListen(t, r)
		counts := map[int]int{}
		for range 5 {
			rep := h2Do(t, c, "GET", base+"/", "", nil)
			counts[rep.status]++
			if rep.status == 429 && !strings.Contains(rep.header.Get("Proxy-Status"), `details="arm rule api"`) {
				t.Errorf("429 Proxy-Status %q", rep.header.Get("Proxy-Status"))
			}
		}
		if counts[200] != 3 || counts[429] != 2 {
			t.Errorf("statuses %v, want 3×200 2×429", counts)
		}
	})
}

// h2Raw is a client connection writing raw HTTP/2 frames.
type h2Raw struct {
	t   testing.TB
	c   net.Conn
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

func dialH2Raw(t testing.TB, addr string, dial func(string) (net.Conn, error)) *h2Raw {
	t.Helper()
	if dial == nil {
		dial = func(a string) (net.Conn, error) { return net.Dial("tcp", a) }
	}
	c, err := dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &h2Raw{t: t, c: c}
	h.fr = http2.NewFramer(c, c)
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.enc = hpack.NewEncoder(&h.hb)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return h
}

// block HPACK-encodes fields given as name, value pairs.
func (h *h2Raw) block(kv ...string) []byte {
	h.hb.Reset()
	for i := 0; i+1 < len(kv); i += 2 {
		h.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return bytes.Clone(h.hb.Bytes())
}

// answer reads frames until stream id is answered: its status, or
// "rst" for RST_STREAM, "goaway" for GOAWAY, "closed" when the
// connection ends.
func (h *h2Raw) answer(id uint32) string {
	h.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			return "closed"
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				h.fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == id {
				return f.PseudoValue("status")
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				return "rst"
			}
		case *http2.GoAwayFrame:
			return "goaway " + f.ErrCode.String()
		}
	}
}

// TestH2HeadRules: a stream's head is held to the HTTP/1.1 request-head
// rules after its pseudo-headers become the request line and Host, and to
// what HTTP/2 makes malformed. Nothing refused reaches a backend, and the
// connection goes on serving.
func TestH2HeadRules(t *testing.T) {
	r := newRig(t, rigOpts{backends: 1})
	addr := h2cListen(t, r)
	base := []string{":method", "GET", ":scheme", "http", ":path", "/", ":authority", "a.example"}
	with := func(kv ...string) []string { return append(append([]string(nil), base...), kv...) }
	for _, tc := range []struct {
		name   string
		fields []string
		body   string // DATA after HEADERS; "" ends the stream with HEADERS
		want   string
	}{
		{"plain", base, "", "200"},
		{"host agrees", with("host", "a.example"), "", "200"},
		{"host differs", with("host", "b.example"), "", "rst"},
		{"no authority", []string{":method", "GET", ":scheme", "http", ":path", "/"}, "", "400"},
		{"authority with userinfo", []string{":method", "GET", ":scheme", "http", ":path", "/", ":authority", "u@a.example"}, "", "rst"},
		{"authority malformed", []string{":method", "GET", ":scheme", "http", ":path", "/", ":authority", "a.example:99999999"}, "", "400"},
		{"fragment in path", []string{":method", "GET", ":scheme", "http", ":path", "/a#b", ":authority", "a.example"}, "", "400"},
		{"non-ASCII path", []string{":method", "GET", ":scheme", "http", ":path", "/\xff", ":authority", "a.example"}, "", "400"},
		{"asterisk GET", []string{":method", "GET", ":scheme", "http", ":path", "*", ":authority", "a.example"}, "", "400"},
		{"CONNECT", []string{":method", "CONNECT", ":authority", "a.example:443"}, "", "501"},
		{"content-length without body", with("content-length", "5"), "", "400"},
		{"content-length twice", with("content-length", "2", "content-length", "2"), "ab", "400"},
		// x/net/http2 resets the stream when its DATA arrives before
		// checkHead's 400 is written.
		{"content-length malformed", with("content-length", "+2"), "ab", "400|rst"},
		{"body as declared", with("content-length", "2"), "ab", "200"},
		{"body longer than declared", with("content-length", "1"), "ab", "rst"},
		{"connection field", with("connection", "close"), "", "400"},
		{"transfer-encoding", with("transfer-encoding", "chunked"), "", "400"},
		{"upgrade h2c", with("upgrade", "h2c"), "", "400"},
		{"te other than trailers", with("te", "gzip"), "", "400"},
		{"uppercase name", with("X-A", "1"), "", "rst"},
		{"CR in value", with("x-a", "1\r\nx-b: 2"), "", "rst"},
		{"space in method", []string{":method", "G T", ":scheme", "http", ":path", "/", ":authority", "a.example"}, "", "400"},
		{"too many fields", with(manyFields(250)...), "", "431"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits := r.backends[0].hits.Load()
			h := dialH2Raw(t, addr, nil)
			blk := h.block(tc.fields...)
			if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk, EndHeaders: true, EndStream: tc.body == ""}); err != nil {
				t.Fatal(err)
			}
			if tc.body != "" {
				h.fr.WriteData(1, true, []byte(tc.body))
			}
			if got := h.answer(1); !slices.Contains(strings.Split(tc.want, "|"), got) {
				t.Errorf("answer %q, want %q", got, tc.want)
			}
			if tc.want != "200" && r.backends[0].hits.Load() != hits {
				t.Errorf("a refused stream reached the backend")
			}
			// The connection still serves.
			h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: h.block(base...), EndHeaders: true, EndStream: true})
			if got := h.answer(3); got != "200" {
				t.Errorf("next stream: %q, want 200", got)
			}
		})
	}
}

func manyFields(n int) []string {
	var kv []string
	for i := range n {
		kv = append(kv, "x-f"+strconv.Itoa(i), "1")
	}
	return kv
}

// floodRig is a server whose backend holds requests for /hold until the
// test ends, with an h2c listener; sndbuf > 0 sets the send buffer of its
// connections (SO_SNDBUF, inherited from the listening socket), so that a
// client that does not read blocks sluice's writes at once.
func floodRig(t *testing.T, sndbuf int) (*rig, string) {
	release := make(chan struct{})
	r := newRig(t, rigOpts{backends: 1, cfg: Config{BackendTimeout: time.Minute}})
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/hold" {
			<-release
		}
		ctx.SetBodyString("b0")
	}
	t.Cleanup(func() { close(release) })
	if sndbuf == 0 {
		return r, h2cListen(t, r)
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, sndbuf) })
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go r.srv.ServeH2C(ln)
	return r, ln.Addr().String()
}

// heapNow is the live heap after a collection.
func heapNow() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// floodEnds checks what every flood test asks after its flood: another
// client is served, and the heap grew by less than 32 MiB.
func floodEnds(t *testing.T, base string, heapBefore uint64) {
	t.Helper()
	if rep := h2Do(t, h2cClient(t), "GET", base+"/", "", nil); rep.status != 200 {
		t.Errorf("another client during the flood: %d", rep.status)
	}
	if after := heapNow(); after > heapBefore+32<<20 {
		t.Errorf("heap grew from %d to %d bytes", heapBefore, after)
	}
}

// TestH2RapidReset: streams opened and reset at once (CVE-2023-44487)
// cost a backend nothing once their handlers are busy: with h2MaxStreams
// requests held at the backend and reset by the client, the streams that
// follow wait for a handler, and past 4×h2MaxStreams waiting the client
// gets GOAWAY ENHANCE_YOUR_CALM; none of them reaches the backend.
func TestH2RapidReset(t *testing.T) {
	r, addr := floodRig(t, 0)
	before := heapNow()
	h := dialH2Raw(t, addr, nil)
	blk := h.block(":method", "GET", ":scheme", "http", ":path", "/hold", ":authority", "a.example")
	for i := range h2MaxStreams {
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: blk, EndHeaders: true, EndStream: true}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; r.backends[0].hits.Load() < h2MaxStreams; i++ {
		if i > 5000 {
			t.Fatalf("%d of %d requests reached the backend", r.backends[0].hits.Load(), h2MaxStreams)
		}
		time.Sleep(time.Millisecond)
	}
	for i := range h2MaxStreams {
		h.fr.WriteRSTStream(uint32(2*i+1), http2.ErrCodeCancel)
	}
	done := make(chan string, 1)
	go func() {
		h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			f, err := h.fr.ReadFrame()
			if err != nil {
				done <- "closed"
				return
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				done <- g.ErrCode.String()
				return
			}
		}
	}()
	sent := 0
	for i := h2MaxStreams; i < 20*h2MaxStreams; i++ {
		id := uint32(2*i + 1)
		if h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: blk, EndHeaders: true, EndStream: true}) != nil ||
			h.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			break
		}
		sent++
	}
	if got := <-done; got != "ENHANCE_YOUR_CALM" {
		t.Errorf("after %d more reset streams: %s, want GOAWAY ENHANCE_YOUR_CALM", sent, got)
	}
	if n := r.backends[0].hits.Load(); n != h2MaxStreams {
		t.Errorf("%d requests reached the backend, want the %d held", n, h2MaxStreams)
	}
	if r.srv.Stats().H2.Errors.Load() == 0 {
		t.Error("the flood was not counted in the HTTP/2 errors")
	}
	floodEnds(t, "http://"+addr, before)
}

// TestH2ResetBeforeForward: a stream reset before its request left for a
// backend is not forwarded (the cheap half of a Rapid Reset): a burst
// of streams each reset at once leaves the connection serving and sends
// at most h2MaxStreams requests on (those whose handlers ran before
// their reset was read).
func TestH2ResetBeforeForward(t *testing.T) {
	r, addr := floodRig(t, 0)
	h := dialH2Raw(t, addr, nil)
	blk := h.block(":method", "GET", ":scheme", "http", ":path", "/hold", ":authority", "a.example")
	for i := range 2000 {
		id := uint32(2*i + 1)
		h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: blk, EndHeaders: true, EndStream: true})
		h.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	}
	// Frames are taken in order: the PING's answer comes after the
	// streams before it were dealt with.
	h.fr.WritePing(false, [8]byte{7})
	h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading: %v", err)
		}
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
			break
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			t.Logf("GOAWAY %s", g.ErrCode) // handlers that ran before their reset pile up: also a pass
			break
		}
	}
	if n := r.backends[0].hits.Load(); n > h2MaxStreams {
		t.Errorf("%d reset streams reached the backend, want at most %d", n, h2MaxStreams)
	}
	t.Logf("%d of 2000 reset streams reached the backend", r.backends[0].hits.Load())
}

// TestH2ContinuationFlood: a header block that never ends (HEADERS
// without END_HEADERS, then CONTINUATION after CONTINUATION,
// CVE-2023-45288) is cut off once it passes the header list limit: the
// connection is closed long before the 4 MiB the client tries to send.
func TestH2ContinuationFlood(t *testing.T) {
	r, addr := floodRig(t, 0)
	before := heapNow()
	h := dialH2Raw(t, addr, nil)
	kv := []string{":method", "GET", ":scheme", "http", ":path", "/", ":authority", "a.example"}
	for i := range 4000 {
		kv = append(kv, "x-pad-"+strconv.Itoa(i), strings.Repeat("a", 1000))
	}
	blk := h.block(kv...)
	const chunk = 4 << 10
	err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk[:chunk], EndHeaders: false, EndStream: true})
	sent := chunk
	for off := chunk; err == nil && off+chunk < len(blk); off += chunk {
		err = h.fr.WriteContinuation(1, false, blk[off:off+chunk])
		sent += chunk
	}
	if got := h.answer(1); got != "goaway PROTOCOL_ERROR" && got != "closed" {
		t.Errorf("after %d bytes of one header block (%v): %s, want the connection ended", sent, err, got)
	}
	if r.backends[0].hits.Load() != 0 {
		t.Error("the header block reached a backend")
	}
	floodEnds(t, "http://"+addr, before)
}

// smallRcvbuf dials with a 4 KiB receive buffer: a client that does not
// read fills it at once.
func smallRcvbuf(a string) (net.Conn, error) {
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return serr
	}}
	return d.Dial("tcp", a)
}

// flood writes frames frames made by one (1,000 at a time) to c within
// 20 s, and returns how many it wrote and the first write error.
func flood(c net.Conn, frames int, one func(*http2.Framer)) (int, error) {
	var batch bytes.Buffer
	bf := http2.NewFramer(&batch, nil)
	for range 1000 {
		one(bf)
	}
	c.SetWriteDeadline(time.Now().Add(20 * time.Second))
	sent := 0
	for sent < frames {
		if _, err := c.Write(batch.Bytes()); err != nil {
			return sent, err
		}
		sent += 1000
	}
	return sent, nil
}

// TestH2SettingsFlood: SETTINGS frames from a client that never reads
// their acknowledgements (CVE-2019-9515) queue nothing: x/net/http2 owes
// one acknowledgement however many frames came, so the flood costs CPU
// and no memory, and other clients are served while it runs.
func TestH2SettingsFlood(t *testing.T) {
	_, addr := floodRig(t, 4096)
	before := heapNow()
	h := dialH2Raw(t, addr, smallRcvbuf)
	errc := make(chan error, 1)
	go func() {
		_, err := flood(h.c, 200_000, func(f *http2.Framer) {
			f.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 16})
		})
		errc <- err
	}()
	floodEnds(t, "http://"+addr, before)
	if err := <-errc; err != nil {
		t.Errorf("flood: %v", err)
	}
	floodEnds(t, "http://"+addr, before)
}

// TestH2PingFlood: PING frames from a client that never reads the
// answers (CVE-2019-9512): once more than 10,000 answers wait to be sent,
// the connection is closed.
func TestH2PingFlood(t *testing.T) {
	r, addr := floodRig(t, 4096)
	before := heapNow()
	h := dialH2Raw(t, addr, smallRcvbuf)
	sent, err := flood(h.c, 2_000_000, func(f *http2.Framer) { f.WritePing(false, [8]byte{1}) })
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%d PING frames written, none answered, connection still open (%v)", sent, err)
	}
	t.Logf("closed after %d frames: %v", sent, err)
	_ = r
	floodEnds(t, "http://"+addr, before)
}

// TestH2Shutdown: Shutdown sends GOAWAY and lets a stream under way
// finish.
func TestH2Shutdown(t *testing.T) {
	r, addr := floodRig(t, 0)
	h := dialH2Raw(t, addr, nil)
	h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h.block(":method", "GET", ":scheme", "http", ":path", "/", ":authority", "a"), EndHeaders: true, EndStream: true})
	if got := h.answer(1); got != "200" {
		t.Fatalf("before shutdown: %s", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go r.srv.Shutdown(ctx)
	if got := h.answer(99); !strings.HasPrefix(got, "goaway") {
		t.Errorf("on shutdown: %s, want GOAWAY", got)
	}
}

// BenchmarkH2RoundTrip: one keep-alive HTTP/2 (h2c) connection, a GET
// stream at a time, end to end in process.
func BenchmarkH2RoundTrip(b *testing.B) {
	r := newRig(b, rigOpts{backends: 1, cfg: Config{StickyCookie: "-"}})
	c, url := h2cClient(b), "http://"+h2cListen(b, r)+"/"
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := c.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// TestH2AddsNothing: an answer without Date or Content-Type gets neither
// (x/net/http2 would add a Date and sniff a type), as on HTTP/1.1.
func TestH2AddsNothing(t *testing.T) {
	r := newRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := nethttp.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 14\r\nConnection: keep-alive\r\n\r\n<html>x</html>")
		}
	}})
	rep := h2Do(t, h2cClient(t), "GET", "http://"+h2cListen(t, r)+"/", "", nil)
	if rep.status != 200 || rep.body != "<html>x</html>" {
		t.Fatalf("%d %q", rep.status, rep.body)
	}
	for _, k := range []string{"Date", "Content-Type", "Connection"} {
		if v, ok := rep.header[k]; ok {
			t.Errorf("answer carries %s: %q", k, v)
		}
	}
}

// TestH2CriticalAbortsStream: new work in flight on a stream when the
// memory state turns Critical is answered 503 at once; a sticky stream on
// the same connection runs to its answer.
func TestH2CriticalAbortsStream(t *testing.T) {
	r := newRig(t, rigOpts{backends: 1})
	c, base := h2cClient(t), "http://"+h2cListen(t, r)
	cookie := stickyFrom(t, h2Do(t, c, "GET", base+"/", "", nil))
	if st := r.setMemory(750); st != admission.Low {
		t.Fatalf("state %v, want low", st)
	}
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		entered <- struct{}{}
		<-release
		ctx.SetBodyString("late")
	}
	newWork, sticky := make(chan reply, 1), make(chan reply, 1)
	go func() { newWork <- h2Do(t, c, "GET", base+"/new", "", nil) }()
	<-entered
	go func() { sticky <- h2Do(t, c, "GET", base+"/sticky", cookie, nil) }()
	<-entered
	if st := r.setMemory(950); st != admission.Critical {
		t.Fatalf("state %v, want critical", st)
	}
	rep := <-newWork // answered before the backend is released
	close(release)
	if rep.status != 503 || !strings.Contains(rep.header.Get("Proxy-Status"), "memory state critical") {
		t.Errorf("in-flight new work: %d %v %q, want 503 memory state critical", rep.status, rep.header, rep.body)
	}
	if rep := <-sticky; rep.status != 200 || rep.body != "late" {
		t.Errorf("in-flight affinity: %d %q, want 200 late", rep.status, rep.body)
	}
	if got := r.srv.Stats().Aborted.Load(); got != 1 {
		t.Errorf("aborted = %d, want 1", got)
	}
}

// TestH2DelayedStreamReset: a stream reset while its request waits in an
// ARM delay queue leaves the queue at once and is never forwarded.
func TestH2DelayedStreamReset(t *testing.T) {
	r := newRig(t, rigOpts{backends: 1, arm: []string{"name=slow,limit=1/s,action=delay,queue=10,wait=1m"}})
	addr := h2cListen(t, r)
	if rep := h2Do(t, h2cClient(t), "GET", "http://"+addr+"/", "", nil); rep.status != 200 {
		t.Fatalf("first: %d", rep.status)
	}
	hits := r.backends[0].hits.Load()
	h := dialH2Raw(t, addr, nil)
	h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h.block(":method", "GET", ":scheme", "http", ":path", "/", ":authority", "a"), EndHeaders: true, EndStream: true})
	for i := 0; r.ctrl.Rules()[0].Status().Queued == 0; i++ {
		if i > 5000 {
			t.Fatal("stream never queued")
		}
		time.Sleep(time.Millisecond)
	}
	h.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	for i := 0; r.srv.Stats().DelayAbandoned.Load() == 0; i++ {
		if i > 5000 {
			t.Fatal("reset stream never left the queue")
		}
		time.Sleep(time.Millisecond)
	}
	r.clock.Advance(2 * time.Second)
	r.ctrl.Advance(r.clock.Now())
	if q := r.ctrl.Rules()[0].Status().Queued; q != 0 {
		t.Errorf("%d still queued", q)
	}
	if n := r.backends[0].hits.Load(); n != hits {
		t.Errorf("the reset stream was forwarded")
	}
}

// TestH2NotOnHTTP1Listener: the HTTP/1.1 listener speaks no HTTP/2: the
// client preface is refused as an HTTP/1.1 head (505, closed), and an
// Upgrade: h2c is never honoured (no 101; the backend sees no Upgrade).
func TestH2NotOnHTTP1Listener(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		if got := rawRoundTrip(t, r.addr, http2.ClientPreface); !strings.HasPrefix(got, "505\nConnection: close\r\n") {
			t.Errorf("preface answered %q, want 505 and close", got)
		}
		got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")
		if !strings.HasPrefix(got, "200\n") {
			t.Errorf("Upgrade: h2c answered %q, want 200 in HTTP/1.1", got)
		}
		for k := range r.backends[0].lastHeaders() {
			if strings.EqualFold(k, "Upgrade") || strings.EqualFold(k, "HTTP2-Settings") {
				t.Errorf("backend got %s", k)
			}
		}
		if n := r.srv.Stats().H2.Conns.Load(); n != 0 {
			t.Errorf("%d HTTP/2 connections on the HTTP/1.1 listener", n)
		}
	})
}

// TestH2CriticalAbortsUpload: an upload streamed to a backend when the
// memory state turns Critical is answered 503, and the server goes on.
// The abandoned exchange, stalled writing to the backend, may read the
// stream's body again after the handler returned, when x/net's
// ResponseController panics if used (h2Body.end); the race detector
// watches that path whenever the run takes it.
func TestH2CriticalAbortsUpload(t *testing.T) {
	release := make(chan struct{})
	headRead := make(chan struct{}, 1)
	r := newRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
		c.(*net.TCPConn).SetReadBuffer(4096) // the upload stalls at once
		br := bufio.NewReader(c)
		req, err := nethttp.ReadRequest(br)
		if err != nil {
			return
		}
		headRead <- struct{}{}
		<-release
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate")
	}})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	if st := r.setMemory(750); st != admission.Low {
		t.Fatalf("state %v, want low", st)
	}
	c, base := h2cClient(t), "http://"+h2cListen(t, r)
	body := bytes.Repeat([]byte("x"), 16<<20) // more than the socket buffers hold
	done := make(chan reply, 1)
	go func() { done <- h2Do(t, c, "POST", base+"/up", "", bytes.NewReader(body)) }()
	<-headRead
	if st := r.setMemory(950); st != admission.Critical {
		t.Fatalf("state %v, want critical", st)
	}
	rep := <-done
	if rep.status != 503 || !strings.Contains(rep.header.Get("Proxy-Status"), "memory state critical") {
		t.Errorf("in-flight upload: %d %q, want 503 memory state critical", rep.status, rep.body)
	}
	close(release) // the abandoned exchange reads the rest of the body now
	r.setMemory(100)
	if rep := h2Do(t, c, "GET", base+"/", "", nil); rep.status != 200 && rep.status != 502 {
		t.Errorf("after the abort: %d", rep.status)
	}
}

// TestH2CListenerAnswersHTTP1: an HTTP/1.1 request on the h2c listener
// (an operator's curl, a health check) gets a 505 that says what the port
// speaks, and the connection is closed; prior-knowledge HTTP/2 on the
// same listener is served.
func TestH2CListenerAnswersHTTP1(t *testing.T) {
	r := newRig(t, rigOpts{backends: 1})
	addr := h2cListen(t, r)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
	resp, err := nethttp.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("HTTP/1.1 on the h2c port: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 505 || !strings.Contains(string(body), "HTTP/2 with prior knowledge only") || !resp.Close {
		t.Fatalf("HTTP/1.1 on the h2c port: %d %q close=%v", resp.StatusCode, body, resp.Close)
	}
	rep := h2Do(t, h2cClient(t), "GET", "http://"+addr+"/x", "", nil)
	if rep.status != 200 {
		t.Fatalf("HTTP/2 after: %+v", rep)
	}
}

// TestCheckH2CPreface: the preface whole or cut short is HTTP/2's to
// judge (its bytes read again); anything else is answered 505.
func TestCheckH2CPreface(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"preface", h2cPreface + "\x00\x00\x00\x04", true},
		{"preface cut short", h2cPreface[:10], true},
		{"nothing", "", true},
		{"HTTP/1.1", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", false},
		{"one wrong byte", "PRI * HTTP/2.1\r\n\r\nSM\r\n\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			go func() {
				io.WriteString(b, tc.in)
				b.Close()
			}()
			c, ok := checkH2CPreface(a, 5*time.Second)
			if ok != tc.ok {
				t.Fatalf("ok %v, want %v", ok, tc.ok)
			}
			if ok {
				got, _ := io.ReadAll(c)
				if !strings.HasPrefix(tc.in, string(got)) || len(got) < min(len(tc.in), len(h2cPreface)) {
					t.Fatalf("read again %q from %q", got, tc.in)
				}
			}
		})
	}
}

// TestH2StalledBodyLogged: a stream whose body stalls is refused at
// -http-client-timeout and has its access-log line, like an HTTP/1.1
// request refused before it was forwarded: HTTP/2.0, 400, refused, the
// body bytes that came (not the declared length). Such streams had no
// line at all.
func TestH2StalledBodyLogged(t *testing.T) {
	r, sink := logRig(t, rigOpts{backends: 1, cfg: Config{ClientReadTimeout: 200 * time.Millisecond}})
	base := "http://" + h2cListen(t, r)
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write(make([]byte, 10)) // 10 of the 100 bytes declared, then nothing
	req, err := nethttp.NewRequest("POST", base+"/stall", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 100
	resp, err := h2cClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("stalled body: %d, want 400", resp.StatusCode)
	}
	l := sink.next(t)
	if l.Proto != "HTTP/2.0" || l.Status != 400 || l.Decision != accesslog.Refused || l.path != "/stall" || l.method != "POST" || l.BytesIn != 10 {
		t.Fatalf("record: proto %q status %d decision %v %s %s bytes_in %d", l.Proto, l.Status, l.Decision, l.method, l.path, l.BytesIn)
	}
}
