package http

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	nethttp "net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// backend is an in-process fasthttp server on loopback that answers with
// its name and records what it received.
type backend struct {
	name string
	ln   net.Listener
	srv  *fasthttp.Server
	hits atomic.Int64

	mu      sync.Mutex
	headers map[string][]string // of the last request
	bodyLen int

	handler func(ctx *fasthttp.RequestCtx) // optional override
}

func startBackend(t testing.TB, name string) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	be := &backend{name: name, ln: ln}
	be.srv = &fasthttp.Server{Handler: be.serve, MaxRequestBodySize: 64 << 20, ReadBufferSize: 32 << 10}
	go be.srv.Serve(ln)
	t.Cleanup(func() { be.srv.Shutdown() })
	return be
}

func (be *backend) serve(ctx *fasthttp.RequestCtx) {
	be.hits.Add(1)
	hs := map[string][]string{}
	for k, v := range ctx.Request.Header.All() {
		hs[string(k)] = append(hs[string(k)], string(v))
	}
	n := len(ctx.Request.Body())
	be.mu.Lock()
	be.headers, be.bodyLen = hs, n
	be.mu.Unlock()
	if be.handler != nil {
		be.handler(ctx)
		return
	}
	ctx.Response.Header.Set("X-Backend", be.name)
	ctx.SetBodyString(be.name)
}

func (be *backend) lastHeaders() map[string][]string {
	be.mu.Lock()
	defer be.mu.Unlock()
	return be.headers
}

func (be *backend) addr() string { return be.ln.Addr().String() }

// stop closes the backend: connections to its port are refused.
func (be *backend) stop() {
	if be.srv != nil {
		be.srv.Shutdown()
	}
	be.ln.Close()
}

// startRawBackend serves each connection with serve, for answers a
// fasthttp server would not give (close-delimited bodies, 1xx, garbage).
func startRawBackend(t testing.TB, name string, serve func(net.Conn)) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	be := &backend{name: name, ln: ln}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			be.hits.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return be
}

type fakeMem struct{ used atomic.Int64 }

func (f *fakeMem) ReadMemory() (int64, int64) { return f.used.Load(), 1000 }

type rig struct {
	t        testing.TB
	backends []*backend
	pool     *lb.Pool
	ctrl     *admission.Controller
	mem      *admission.Memory
	memUsed  *fakeMem
	clock    *admission.ManualClock
	signer   *lb.Signer
	srv      *Server
	addr     string
	scheme   string // http, or https for a rig serving HTTPS (rigOpts.tls)
	client   *nethttp.Client
}

// suiteVariant is one way the suite runs every onEngines test: a
// connection engine, and for the loop engine with or without its
// io_uring batching (Config.IOURing, on by default in sluice's flags).
type suiteVariant struct {
	name   string // the subtest's name
	engine string
	ring   bool
}

// suiteVariants are the variants the suite runs on (onEngines): the loop
// engine plain and with its ring (where the kernel gives one), and
// fasthttp; fasthttp alone where the loop is not supported.
// SLUICE_TEST_HTTP_ENGINE=loop, loop-uring or fasthttp keeps the variants
// of that name or engine.
var suiteVariants = func() []suiteVariant {
	all := []suiteVariant{{name: EngineFastHTTP, engine: EngineFastHTTP}}
	if loopSupported {
		all = []suiteVariant{{name: EngineLoop, engine: EngineLoop}}
		if r, err := newRing(8); err == nil {
			r.Close()
			all = append(all, suiteVariant{name: EngineLoop + "-uring", engine: EngineLoop, ring: true})
		}
		all = append(all, suiteVariant{name: EngineFastHTTP, engine: EngineFastHTTP})
	}
	if only := os.Getenv("SLUICE_TEST_HTTP_ENGINE"); only != "" {
		var kept []suiteVariant
		for _, v := range all {
			if v.name == only || v.engine == only {
				kept = append(kept, v)
			}
		}
		if len(kept) == 0 {
			kept = []suiteVariant{{name: only, engine: only}}
		}
		return kept
	}
	return all
}()

// suiteIOURing turns Config.IOURing on in every rig:
// SLUICE_TEST_HTTP_IO_URING=1 runs the suite with the loop engine's
// batched reads and writes (the fasthttp engine ignores the option),
// every one of them through the ring, single ones included.
var suiteIOURing = func() bool {
	on := os.Getenv("SLUICE_TEST_HTTP_IO_URING") == "1"
	if on {
		ringMinBatch = 1
	}
	return on
}()

// rigVariant maps the *testing.T of an onEngines subtest to its variant.
var rigVariant sync.Map

// onEngines runs f as one subtest per suite variant (t.Run("loop"),
// "loop-uring", "fasthttp"); a rig built in it serves with that engine
// (and ring) unless its Config names an engine.
func onEngines(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	for _, v := range suiteVariants {
		t.Run(v.name, func(t *testing.T) {
			rigVariant.Store(t, v)
			defer rigVariant.Delete(t)
			f(t)
		})
	}
}

// engineOf returns the engine of t's onEngines subtest, "" (the platform
// default) outside one.
func engineOf(t testing.TB) string {
	if v, ok := rigVariant.Load(t); ok {
		return v.(suiteVariant).engine
	}
	return ""
}

type rigOpts struct {
	backends int
	policy   string
	arm      []string
	mopRate  float64 // 0: no MOP
	cfg      Config
	passive  lb.PassiveConfig
	raw      func(net.Conn) // backend 0 is a raw TCP server running this per connection
	logger   *slog.Logger   // nil: discarded
	// pools, when set, serves a generation instead of one pool: backend i
	// is in pools[i] (none: the default pool), with the -http-pool specs
	// poolSpecs and the -http-route specs routes.
	pools     [][]string
	poolSpecs []string
	routes    []string
	// tls serves HTTPS only (ServeTLS) with a test certificate
	// (testTLS) unless cfg.TLSConfig is set; addr is the HTTPS address.
	tls bool
	// setup, when set, is called with the server before it serves.
	setup func(*Server)
	// alog is the access log the server writes to (Deps.AccessLog).
	alog *accesslog.Logger
	// proxy is the PROXY protocol version written to every backend (0: none).
	proxy uint8
}

func newRig(t testing.TB, o rigOpts) *rig {
	t.Helper()
	if o.backends == 0 {
		o.backends = 2
	}
	r := &rig{t: t, clock: &admission.ManualClock{}, memUsed: &fakeMem{}}
	r.clock.Set(int64(time.Hour))
	var bs []*lb.Backend
	for i := range o.backends {
		var be *backend
		if i == 0 && o.raw != nil {
			be = startRawBackend(t, "b0", o.raw)
		} else {
			be = startBackend(t, fmt.Sprintf("b%d", i))
		}
		r.backends = append(r.backends, be)
		var mop *admission.MOP
		if o.mopRate > 0 {
			var err error
			mop, err = admission.NewMOP(admission.MOPConfig{Name: be.name, InitialRate: o.mopRate, MinRate: o.mopRate, Burst: time.Nanosecond})
			if err != nil {
				t.Fatal(err)
			}
		}
		b, err := lb.NewBackend(lb.BackendConfig{ID: be.name, Addr: be.addr(), Proto: "http", MOP: mop, Proxy: o.proxy})
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	var err error
	r.pool, err = lb.NewPool(lb.PoolConfig{Policy: o.policy, Passive: o.passive}, bs)
	if err != nil {
		t.Fatal(err)
	}
	r.mem, err = admission.NewMemory(admission.MemoryConfig{Limit: 1000}, r.memUsed, nil)
	if err != nil {
		t.Fatal(err)
	}
	var rules []admission.RuleConfig
	for _, a := range o.arm {
		rc, err := admission.ParseRule(a)
		if err != nil {
			t.Fatal(err)
		}
		rules = append(rules, rc)
	}
	r.ctrl, err = admission.NewController(admission.ControllerConfig{Rules: rules}, r.mem, r.clock.Now())
	if err != nil {
		t.Fatal(err)
	}
	r.signer, err = lb.NewSigner([]byte("test key test key test key 32by"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := o.cfg
	cfg.Clock = r.clock
	if o.tls && cfg.TLSConfig == nil {
		cfg.TLSConfig = testTLS(t).server()
	}
	if suiteIOURing {
		cfg.IOURing = true
	}
	if cfg.Engine == "" {
		cfg.Engine = engineOf(t)
		if v, ok := rigVariant.Load(t); ok && v.(suiteVariant).ring {
			cfg.IOURing = true
		}
	}
	deps := Deps{Pool: r.pool, Admission: r.ctrl, Signer: r.signer, AccessLog: o.alog}
	if o.pools != nil {
		deps.Generation = r.generation(o)
	}
	r.srv, err = New(cfg, deps, o.logger)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	if o.setup != nil {
		o.setup(r.srv)
	}
	r.scheme = "http"
	var clientTLS *tls.Config
	if o.tls {
		r.scheme = "https"
		clientTLS = testTLS(t).client("a.example")
		tlsClients.Store(r.addr, clientTLS)
		t.Cleanup(func() { tlsClients.Delete(r.addr) })
		go r.srv.ServeTLS(ln)
	} else {
		go r.srv.Serve(ln)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.srv.Shutdown(ctx)
	})
	r.client = &nethttp.Client{
		Timeout:   10 * time.Second,
		Transport: &nethttp.Transport{MaxIdleConnsPerHost: 16, TLSClientConfig: clientTLS},
	}
	t.Cleanup(r.client.CloseIdleConnections)
	return r
}

// setMemory moves the node memory state by faking used memory (limit 1000;
// thresholds 0.70, 0.80, 0.90).
func (r *rig) setMemory(used int64) admission.MemState {
	r.memUsed.used.Store(used)
	return r.mem.Sample()
}

type reply struct {
	status int
	body   string
	header nethttp.Header
}

func (r *rig) do(method, path, cookie string, body io.Reader) reply {
	r.t.Helper()
	req, err := nethttp.NewRequest(method, r.scheme+"://"+r.addr+path, body)
	if err != nil {
		r.t.Fatal(err)
	}
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	return reply{status: resp.StatusCode, body: string(b), header: resp.Header}
}

func (r *rig) get(path, cookie string) reply { return r.do("GET", path, cookie, nil) }

// stickyCookie returns "SLUICE=token" from a reply's Set-Cookie.
func stickyFrom(t *testing.T, rep reply) string {
	t.Helper()
	for _, sc := range rep.header.Values("Set-Cookie") {
		if strings.HasPrefix(sc, "SLUICE=") {
			v, _, _ := strings.Cut(sc, ";")
			return v
		}
	}
	t.Fatalf("no SLUICE cookie in %v", rep.header)
	return ""
}

func TestRoundRobinSpreads(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 3})
		counts := map[string]int{}
		for range 90 {
			rep := r.get("/", "")
			if rep.status != 200 {
				t.Fatalf("status %d: %s", rep.status, rep.body)
			}
			counts[rep.body]++
		}
		for _, be := range r.backends {
			if counts[be.name] != 30 {
				t.Errorf("counts = %v, want 30 each", counts)
				break
			}
		}
	})
}

func TestCookiePins(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 3})
		first := r.get("/", "")
		cookie := stickyFrom(t, first)
		sc := first.header.Get("Set-Cookie")
		for _, attr := range []string{"Path=/", "Max-Age=3600", "HttpOnly", "SameSite=Lax"} {
			if !strings.Contains(sc, attr) {
				t.Errorf("Set-Cookie %q lacks %s", sc, attr)
			}
		}
		for i := range 30 {
			rep := r.get("/", cookie)
			if rep.body != first.body {
				t.Fatalf("request %d with cookie went to %s, pinned to %s", i, rep.body, first.body)
			}
			if rep.header.Get("Set-Cookie") != "" {
				t.Fatalf("fresh cookie renewed: %q", rep.header.Get("Set-Cookie"))
			}
		}
	})
}

// TestStickyAlwaysAdmitted: while ARM and then MOP refuse all new work,
// every sticky request succeeds.
func TestStickyAlwaysAdmitted(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, mopRate: 1, arm: []string{"name=api,limit=1/min,action=reject"}})
		first := r.get("/", "")
		if first.status != 200 {
			t.Fatalf("first request: %d %s", first.status, first.body)
		}
		cookie := stickyFrom(t, first)

		// ARM has used its 1/min; both MOPs are at their rate with the clock
		// standing still.
		var refused, stickyOK int
		for i := range 100 {
			if rep := r.get("/", ""); rep.status == 429 {
				refused++
				if rep.header.Get("Retry-After") == "" || !strings.Contains(rep.header.Get("Proxy-Status"), `error=http_request_denied; details="arm rule api"`) {
					t.Fatalf("ARM refusal headers: %v", rep.header)
				}
			}
			if rep := r.get("/x", cookie); rep.status == 200 && rep.body == first.body {
				stickyOK++
			} else {
				t.Fatalf("sticky request %d: %d %s", i, rep.status, rep.body)
			}
		}
		if refused != 100 || stickyOK != 100 {
			t.Errorf("new work refused %d/100, sticky ok %d/100; want 100 and 100", refused, stickyOK)
		}

	})
}

// TestStickyAlwaysAdmittedUnderMOP: while every backend's MOP refuses new
// work, every sticky request succeeds.
func TestStickyAlwaysAdmittedUnderMOP(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, mopRate: 1})
		first := r.get("/", "")
		cookie := stickyFrom(t, first)
		statuses := map[int]int{}
		for i := range 100 {
			rep := r.get("/", "")
			statuses[rep.status]++
			if rep.status == 503 && (rep.header.Get("Retry-After") == "" || !strings.Contains(rep.header.Get("Proxy-Status"), "connection_limit_reached")) {
				t.Fatalf("MOP refusal headers: %v", rep.header)
			}
			if rep := r.get("/", cookie); rep.status != 200 || rep.body != first.body {
				t.Fatalf("sticky request %d: %d %s", i, rep.status, rep.body)
			}
		}
		// Each MOP admits one at 1/s on a frozen clock: the first request took
		// one backend's, the next new request the other's, the rest are refused.
		if statuses[200] != 1 || statuses[503] != 99 {
			t.Errorf("new work statuses = %v, want 1x200 and 99x503", statuses)
		}
	})
}

func TestMOPRefusesEveryCandidate(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, mopRate: 1})
		got := map[int]int{}
		for range 10 {
			rep := r.get("/", "")
			got[rep.status]++
			if rep.status == 503 && (rep.header.Get("Retry-After") == "" || !strings.Contains(rep.header.Get("Proxy-Status"), "connection_limit_reached")) {
				t.Fatalf("503 headers: %v", rep.header)
			}
		}
		// One admission per backend's MOP (frozen clock): the second request
		// goes to the other backend, not refused.
		if got[200] != 2 || got[503] != 8 {
			t.Errorf("statuses = %v, want 2x200 and 8x503", got)
		}
	})
}

func TestForgedCookieIsNewWork(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, arm: []string{"name=api,limit=1/min,action=reject"}})
		cookie := stickyFrom(t, r.get("/", ""))
		tok := strings.TrimPrefix(cookie, "SLUICE=")
		other, _ := lb.NewSigner([]byte("some other key, also 32 bytes!!"))
		forgedTok := other.Token("b0", time.Now().Add(time.Hour))
		expired := r.signer.Token("b0", time.Now().Add(-time.Second))
		tampered := []byte(tok)
		tampered[len(tampered)/2] ^= 1
		for name, c := range map[string]string{
			"other key":   "SLUICE=" + forgedTok,
			"expired":     "SLUICE=" + expired,
			"tampered":    "SLUICE=" + string(tampered),
			"garbage":     "SLUICE=;;;garbage",
			"unknown id":  "SLUICE=" + r.signer.Token("nope", time.Now().Add(time.Hour)),
			"truncated":   "SLUICE=" + tok[:len(tok)-2],
			"plain value": "SLUICE=b0",
		} {
			if rep := r.get("/", c); rep.status != 429 {
				t.Errorf("%s cookie: status %d, want 429 (treated as new work)", name, rep.status)
			}
		}
		if rep := r.get("/", cookie); rep.status != 200 {
			t.Errorf("genuine cookie: status %d, want 200", rep.status)
		}
	})
}

func TestKilledBackendFailover(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, passive: lb.PassiveConfig{MaxFails: 1, Cooldown: time.Minute}})
		h, err := lb.NewHealthChecker(lb.HealthConfig{Interval: time.Second, Fall: 1, Rise: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range r.pool.Backends() {
			h.Add(b, lb.TCPProber{})
		}
		// Pin two clients, one to each backend.
		c0 := stickyFrom(t, r.get("/", ""))
		c1 := stickyFrom(t, r.get("/", ""))
		pinnedTo := map[string]string{c0: r.get("/", c0).body, c1: r.get("/", c1).body}
		victim := r.backends[0]
		var victimCookie, survivorCookie string
		for c, name := range pinnedTo {
			if name == victim.name {
				victimCookie = c
			} else {
				survivorCookie = c
			}
		}
		if victimCookie == "" || survivorCookie == "" {
			t.Fatalf("pins = %v, want one client per backend", pinnedTo)
		}
		victim.stop()

		// Idempotent request from the victim's client: the dial is refused,
		// the request is retried on the survivor and re-pinned there.
		rep := r.get("/", victimCookie)
		if rep.status != 200 || rep.body == victim.name {
			t.Fatalf("GET after kill: %d %s", rep.status, rep.body)
		}
		repinned := stickyFrom(t, rep)

		// One probe round (one health interval) marks it down.
		h.ProbeAll(context.Background())
		if s := r.pool.Backends()[0].State(r.clock.Now()); s != lb.Down {
			t.Fatalf("victim state after a probe = %v, want down", s)
		}
		// Non-idempotent request with the old cookie: re-pinned as new work.
		rep = r.do("POST", "/", victimCookie, strings.NewReader("x"))
		if rep.status != 200 || rep.body == victim.name {
			t.Fatalf("POST with stale pin: %d %s", rep.status, rep.body)
		}
		stickyFrom(t, rep)
		for range 10 {
			if rep := r.get("/", repinned); rep.status != 200 || rep.body == victim.name {
				t.Fatalf("re-pinned client: %d %s", rep.status, rep.body)
			}
			if rep := r.get("/", survivorCookie); rep.status != 200 || rep.body == victim.name {
				t.Fatalf("survivor's client: %d %s", rep.status, rep.body)
			}
			if rep := r.get("/", ""); rep.status != 200 || rep.body == victim.name {
				t.Fatalf("new client: %d %s", rep.status, rep.body)
			}
		}
	})
}

func TestConnectFailureNonIdempotent502(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		r.backends[0].stop()
		rep := r.do("POST", "/", "", strings.NewReader("x"))
		if rep.status != 502 || !strings.Contains(rep.header.Get("Proxy-Status"), "connection_refused") {
			t.Errorf("POST to a dead backend: %d %v, want 502 connection_refused", rep.status, rep.header)
		}
		// All down per the health check: 503 with Retry-After.
		r.pool.Backends()[0].SetProbeDown(true)
		rep = r.get("/", "")
		if rep.status != 503 || rep.header.Get("Retry-After") == "" || !strings.Contains(rep.header.Get("Proxy-Status"), "destination_unavailable") {
			t.Errorf("no backend up: %d %v, want 503 destination_unavailable with Retry-After", rep.status, rep.header)
		}
	})
}

func TestTimeout504(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, cfg: Config{BackendTimeout: 100 * time.Millisecond}})
		release := make(chan struct{})
		defer close(release)
		r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
			select {
			case <-release:
			case <-time.After(5 * time.Second):
			}
		}
		rep := r.get("/", "")
		if rep.status != 504 || !strings.Contains(rep.header.Get("Proxy-Status"), "http_response_timeout") {
			t.Errorf("slow backend: %d %v, want 504 http_response_timeout", rep.status, rep.header)
		}
	})
}

func rawRoundTrip(t *testing.T, addr, raw string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := nethttp.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading answer to %q: %v", raw, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d\n", resp.StatusCode)
	if resp.Close {
		sb.WriteString("Connection: close\r\n")
	}
	resp.Header.Write(&sb)
	sb.WriteString("\n")
	sb.Write(body)
	return sb.String()
}

func TestMalformedRequests400(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		for _, raw := range []string{
			"GARBAGE\r\n\r\n",
			"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
			"GET / HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n",
			"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
			"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
		} {
			got := rawRoundTrip(t, r.addr, raw)
			if !strings.HasPrefix(got, "400\n") {
				t.Errorf("%q answered %q, want 400", raw, got)
			}
			if rep := r.get("/", ""); rep.status != 200 {
				t.Fatalf("after %q the server answers %d", raw, rep.status)
			}
		}
	})
}

func TestHopByHopAndForwarded(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		for _, trusted := range []bool{false, true} {
			t.Run(fmt.Sprint("trusted=", trusted), func(t *testing.T) {
				var cfg Config
				if trusted {
					cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
				}
				r := newRig(t, rigOpts{backends: 1, cfg: cfg})
				be := r.backends[0]
				be.handler = func(ctx *fasthttp.RequestCtx) {
					ctx.Response.Header.Set("Keep-Alive", "timeout=5")
					ctx.Response.Header.Set("Connection", "X-Backend-Secret")
					ctx.Response.Header.Set("X-Backend-Secret", "1")
					ctx.Response.Header.Set("Proxy-Authenticate", "Basic")
					ctx.Response.Header.Set("Upgrade", "h2c")
					ctx.Response.Header.Set("X-Kept", "yes")
					ctx.SetBodyString("ok")
				}
				got := rawRoundTrip(t, r.addr, "GET /p HTTP/1.1\r\nHost: example.com\r\n"+
					"Connection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 300\r\n"+
					"Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nTE: trailers\r\n"+
					"Upgrade: websocket\r\nX-Forwarded-For: 203.0.113.9\r\nForwarded: for=203.0.113.9\r\n"+
					"X-Forwarded-Proto: https\r\nX-Kept: 1\r\n\r\n")
				if !strings.HasPrefix(got, "200\n") {
					t.Fatalf("answer %q", got)
				}
				for _, h := range []string{"Keep-Alive", "X-Backend-Secret", "Proxy-Authenticate", "Upgrade"} {
					if strings.Contains(got, h+":") {
						t.Errorf("response carries hop-by-hop %s: %q", h, got)
					}
				}
				if !strings.Contains(got, "X-Kept: yes") {
					t.Errorf("end-to-end response header lost: %q", got)
				}
				hs := be.lastHeaders()
				for _, h := range []string{"Connection", "X-Secret", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Te", "Upgrade", "Transfer-Encoding", "Trailer"} {
					if v, ok := hs[h]; ok {
						t.Errorf("backend received hop-by-hop %s: %v", h, v)
					}
				}
				if hs["X-Kept"] == nil {
					t.Error("end-to-end request header lost")
				}
				wantXFF, wantFwd, wantProto := "127.0.0.1", `for=127.0.0.1;proto=http;host="example.com"`, "http"
				if trusted {
					wantXFF = "203.0.113.9, 127.0.0.1"
					wantFwd = "for=203.0.113.9, " + wantFwd
					wantProto = "https"
				}
				if got := strings.Join(hs["X-Forwarded-For"], "|"); got != wantXFF {
					t.Errorf("X-Forwarded-For = %q, want %q", got, wantXFF)
				}
				if got := strings.Join(hs["Forwarded"], "|"); got != wantFwd {
					t.Errorf("Forwarded = %q, want %q", got, wantFwd)
				}
				if got := strings.Join(hs["X-Forwarded-Proto"], "|"); got != wantProto {
					t.Errorf("X-Forwarded-Proto = %q, want %q", got, wantProto)
				}
			})
		}
	})
}

func TestConnectionCloseHonoured(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		if !strings.Contains(got, "Connection: close") {
			t.Errorf("client asked to close; answer %q lacks Connection: close", got)
		}
	})
}

func TestMemoryStatesRefuse(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		cookie := stickyFrom(t, r.get("/", ""))
		if st := r.setMemory(850); st != admission.Lower {
			t.Fatalf("state %v, want lower", st)
		}
		rep := r.get("/", "")
		if rep.status != 429 || rep.header.Get("Retry-After") != "5" || !strings.Contains(rep.header.Get("Proxy-Status"), "memory state lower") {
			t.Errorf("new work in Lower: %d %v", rep.status, rep.header)
		}
		if rep := r.get("/", cookie); rep.status != 200 {
			t.Errorf("affinity in Lower: %d", rep.status)
		}
		if st := r.setMemory(950); st != admission.Critical {
			t.Fatalf("state %v, want critical", st)
		}
		if rep := r.get("/", ""); rep.status != 429 || rep.header.Get("Retry-After") == "" {
			t.Errorf("new work in Critical: %d %v", rep.status, rep.header)
		}
		if rep := r.get("/", cookie); rep.status != 200 {
			t.Errorf("affinity in Critical: %d", rep.status)
		}
	})
}

// TestCriticalAbortsInFlight: new work in flight when memory turns Critical
// gets 503 at once; affinity in flight completes.
func TestCriticalAbortsInFlight(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1})
		cookie := stickyFrom(t, r.get("/", ""))
		if st := r.setMemory(750); st != admission.Low {
			t.Fatalf("state %v, want low", st)
		}
		entered := make(chan struct{}, 2)
		release := make(chan struct{})
		r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
			entered <- struct{}{}
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			ctx.SetBodyString("late")
		}
		newWork := make(chan reply, 1)
		go func() {
			// Connection: close makes the handler touch the response after
			// the abort, which must not race with the abandoned exchange.
			req, _ := nethttp.NewRequest("GET", "http://"+r.addr+"/new", nil)
			req.Close = true
			resp, err := r.client.Do(req)
			if err != nil {
				newWork <- reply{}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			newWork <- reply{status: resp.StatusCode, body: string(b), header: resp.Header}
		}()
		<-entered
		sticky := make(chan reply, 1)
		go func() { sticky <- r.get("/sticky", cookie) }()
		<-entered
		if st := r.setMemory(950); st != admission.Critical {
			t.Fatalf("state %v, want critical", st)
		}
		rep := <-newWork // answered before the backend is released
		if rep.status != 503 || rep.header.Get("Retry-After") == "" || !strings.Contains(rep.header.Get("Proxy-Status"), "memory state critical") {
			t.Errorf("in-flight new work: %d %v %q, want 503 memory state critical", rep.status, rep.header, rep.body)
		}
		close(release)
		if rep := <-sticky; rep.status != 200 || rep.body != "late" {
			t.Errorf("in-flight affinity: %d %q, want 200 late", rep.status, rep.body)
		}
		if got := r.srv.Stats().Aborted.Load(); got != 1 {
			t.Errorf("aborted = %d, want 1", got)
		}
	})
}

func TestARMDelayReleases(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, arm: []string{"name=slow,limit=1/s,action=delay,queue=10,wait=1m"}})
		if rep := r.get("/", ""); rep.status != 200 {
			t.Fatalf("first: %d", rep.status)
		}
		delayed := make(chan reply, 1)
		go func() { delayed <- r.get("/", "") }()
		// Wait for the request to be queued, then move a second on.
		for i := 0; r.ctrl.Rules()[0].Status().Queued == 0; i++ {
			if i > 5000 {
				t.Fatal("request never queued")
			}
			time.Sleep(time.Millisecond)
		}
		select {
		case rep := <-delayed:
			t.Fatalf("delayed request answered before release: %d", rep.status)
		default:
		}
		r.clock.Advance(1100 * time.Millisecond)
		r.ctrl.Advance(r.clock.Now())
		if rep := <-delayed; rep.status != 200 {
			t.Errorf("released request: %d %s", rep.status, rep.body)
		}
	})
}

func TestAppCookieLearned(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, cfg: Config{AppCookie: "JSESSIONID", StickyCookie: "-"}})
		for _, be := range r.backends {
			be.handler = func(ctx *fasthttp.RequestCtx) {
				if len(ctx.Request.Header.Cookie("JSESSIONID")) == 0 {
					ctx.Response.Header.Add("Set-Cookie", "JSESSIONID=sess-"+be.name+"; Path=/; HttpOnly")
				}
				ctx.SetBodyString(be.name)
			}
		}
		first := r.get("/", "")
		if first.header.Get("Set-Cookie") == "" {
			t.Fatal("backend cookie not passed through")
		}
		for range 10 {
			if rep := r.get("/", "JSESSIONID=sess-"+first.body); rep.body != first.body {
				t.Fatalf("session pinned to %s went to %s", first.body, rep.body)
			}
		}
		if n := r.srv.sessions.len(); n != 1 {
			t.Errorf("session table holds %d, want 1", n)
		}
		// An unknown session id is new work.
		seen := map[string]bool{}
		for range 4 {
			seen[r.get("/", "JSESSIONID=unknown").body] = true
		}
		if len(seen) != 2 {
			t.Errorf("unknown session ids went to %v, want both backends", seen)
		}
	})
}

func TestStreamsLargeBodies(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, cfg: Config{StreamThreshold: 64 << 10}})
		const up, down = 2 << 20, 4 << 20
		r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
			ctx.SetBodyStream(strings.NewReader(strings.Repeat("d", down)), down)
		}
		rep := r.do("POST", "/upload", "", strings.NewReader(strings.Repeat("u", up)))
		if rep.status != 200 || len(rep.body) != down {
			t.Fatalf("status %d, body %d bytes, want 200 and %d", rep.status, len(rep.body), down)
		}
		r.backends[0].mu.Lock()
		got := r.backends[0].bodyLen
		r.backends[0].mu.Unlock()
		if got != up {
			t.Errorf("backend received %d bytes, want %d", got, up)
		}
	})
}

func TestConsistentHashBySource(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 3, policy: "consistent-hash", cfg: Config{StickyCookie: "-"}})
		first := r.get("/", "").body
		for range 20 {
			if b := r.get("/", "").body; b != first {
				t.Fatalf("same source went to %s and %s", first, b)
			}
		}
	})
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{HashKey: "body"}, "http: HashKey: "},
		{Config{StickyCookie: "a b"}, "http: StickyCookie: "},
		{Config{AppCookie: "x;y"}, "http: AppCookie: "},
		{Config{StickyTTL: time.Millisecond}, "http: StickyTTL: "},
	} {
		tc.cfg.setDefaults()
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := ParseTrustedProxies("10.0.0.0/8, 192.168.1.1,::1"); err != nil {
		t.Error(err)
	}
	if _, err := ParseTrustedProxies("10.0.0.0/33"); err == nil || !strings.Contains(err.Error(), "http: TrustedProxies: ") {
		t.Errorf("bad CIDR error = %v", err)
	}
}

// TestRepinIsNewWork: an affinity request whose backend refuses connections
// is moved only as new work, so admission can still refuse it.
func TestRepinIsNewWork(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, arm: []string{"name=api,limit=1/min,action=reject"}})
		first := r.get("/", "")
		cookie := stickyFrom(t, first)
		for _, be := range r.backends {
			if be.name == first.body {
				be.stop()
			}
		}
		rep := r.get("/", cookie)
		if rep.status != 429 || !strings.Contains(rep.header.Get("Proxy-Status"), "arm rule api") {
			t.Errorf("re-pin while ARM refuses: %d %v, want 429 from the ARM rule", rep.status, rep.header)
		}
	})
}

// TestBackendConnLimit503: with every backend connection busy, the next
// request gets 503 with Retry-After, and the backend is not blamed.
func TestBackendConnLimit503(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, passive: lb.PassiveConfig{MaxFails: 1}, cfg: Config{MaxConns: 1, ConnWait: time.Millisecond}})
		entered := make(chan struct{}, 1)
		release := make(chan struct{})
		r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
			entered <- struct{}{}
			<-release
			ctx.SetBodyString("slow")
		}
		slow := make(chan reply, 1)
		go func() { slow <- r.get("/slow", "") }()
		<-entered
		rep := r.get("/", "")
		if rep.status != 503 || rep.header.Get("Retry-After") != "1" || !strings.Contains(rep.header.Get("Proxy-Status"), "connection_limit_reached") {
			t.Errorf("second request with the only connection busy: %d %v", rep.status, rep.header)
		}
		close(release)
		if rep := <-slow; rep.status != 200 {
			t.Errorf("slow request: %d", rep.status)
		}
		if s := r.pool.Backends()[0].State(r.clock.Now()); s != lb.Up {
			t.Errorf("backend state %v after our own connection limit, want up", s)
		}
	})
}

// TestHealth429Drains: a backend whose health check answers 429 ("send no
// new requests") gets no new work, while its sticky clients stay.
func TestHealth429Drains(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2})
		var busy atomic.Bool
		for _, be := range r.backends {
			be.handler = func(ctx *fasthttp.RequestCtx) {
				if string(ctx.Path()) == "/health" {
					if busy.Load() && be.name == "b0" {
						ctx.SetStatusCode(429)
					}
					return
				}
				ctx.SetBodyString(be.name)
			}
		}
		h, err := lb.NewHealthChecker(lb.HealthConfig{Interval: time.Second, Rise: 1, Fall: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range r.pool.Backends() {
			h.Add(b, lb.HTTPProber{Path: "/health"})
		}
		var cookie string
		for cookie == "" {
			if rep := r.get("/", ""); rep.body == "b0" {
				cookie = stickyFrom(t, rep)
			}
		}
		busy.Store(true)
		h.ProbeAll(context.Background())
		if s := r.pool.Lookup("b0").State(r.clock.Now()); s != lb.Draining {
			t.Fatalf("b0 state after a 429 health answer = %v, want draining", s)
		}
		for range 10 {
			if rep := r.get("/", ""); rep.body != "b1" {
				t.Fatalf("new work went to %s, want b1", rep.body)
			}
			if rep := r.get("/", cookie); rep.status != 200 || rep.body != "b0" {
				t.Fatalf("sticky client of the draining backend: %d %s", rep.status, rep.body)
			}
		}
		busy.Store(false)
		h.ProbeAll(context.Background())
		seen := map[string]bool{}
		for range 4 {
			seen[r.get("/", "").body] = true
		}
		if !seen["b0"] {
			t.Errorf("b0 got no new work after its health answer turned 200: %v", seen)
		}
	})
}

// TestApplication500DoesNotEject: an application's 500, which any client
// can provoke, is relayed and leaves the backend up; 503s from the
// backend count toward passive ejection.
func TestApplication500DoesNotEject(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, passive: lb.PassiveConfig{MaxFails: 3, Cooldown: time.Minute}, cfg: Config{StickyCookie: "-"}})
		r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
			switch string(ctx.Path()) {
			case "/boom":
				ctx.SetStatusCode(500)
			case "/busy":
				ctx.SetStatusCode(503)
			default:
				ctx.SetBodyString("ok")
			}
		}
		for i := range 6 {
			if rep := r.get("/boom", ""); rep.status != 500 {
				t.Fatalf("/boom %d: %d", i, rep.status)
			}
		}
		if rep := r.get("/", ""); rep.status != 200 {
			t.Fatalf("after six 500s: %d %q, want the backend still up", rep.status, rep.body)
		}
		for range 3 {
			r.get("/busy", "")
		}
		if rep := r.get("/", ""); rep.status != 503 || !strings.Contains(rep.body, "no backend") {
			t.Fatalf("after three 503s: %d %q, want the backend ejected", rep.status, rep.body)
		}
	})
}
