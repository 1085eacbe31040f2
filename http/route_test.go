package http

import (
	"bufio"
	"fmt"
	"net"
	nethttp "net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// generation builds the generation o describes over r's backends, with
// its routes.
func (r *rig) generation(o rigOpts) *lb.Generation {
	r.t.Helper()
	g, err := lb.NewGeneration(r.genConfig(o))
	if err != nil {
		r.t.Fatal(err)
	}
	return g
}

func (r *rig) genConfig(o rigOpts) lb.GenConfig {
	r.t.Helper()
	cfg := lb.GenConfig{Proto: "http", Policy: o.policy, Passive: o.passive, Clock: r.clock}
	for i, be := range r.backends {
		spec := lb.BackendSpec{ID: be.name, Addr: be.addr()}
		if i < len(o.pools) {
			spec.Pools = o.pools[i]
		}
		cfg.Backends = append(cfg.Backends, spec)
	}
	for _, s := range o.routes {
		cfg.Routes = append(cfg.Routes, mustRoute(r.t, s))
	}
	for _, s := range o.poolSpecs {
		ps, err := lb.ParsePoolSpec("http", s)
		if err != nil {
			r.t.Fatal(err)
		}
		cfg.Pools = append(cfg.Pools, ps)
	}
	if o.mopRate > 0 {
		cfg.MOP = func(spec lb.BackendSpec) (*admission.MOP, error) {
			return admission.NewMOP(admission.MOPConfig{Name: spec.ID, InitialRate: o.mopRate, MinRate: o.mopRate, Burst: time.Nanosecond})
		}
	}
	return cfg
}

func mustRoute(t testing.TB, s string) lb.RouteSpec {
	t.Helper()
	r, err := lb.ParseRouteSpec("http", s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// sitePools is the example of the README: api by host, static by path
// prefix (stripped), the rest to the default pool; two backends each.
var sitePools = rigOpts{
	backends: 6,
	pools:    [][]string{{"api"}, {"api"}, {"static"}, {"static"}, nil, nil},
	routes:   []string{"pool=api,host=api.example.com", "pool=static,path=/static/,strip=/static"},
}

// poolOfBackend names the pool of each backend of sitePools.
var poolOfBackend = map[string]string{"b0": "api", "b1": "api", "b2": "static", "b3": "static", "b4": "default", "b5": "default"}

// pathRecorder makes each backend answer with its name and the target it
// got, as "name target".
func pathRecorder(r *rig) {
	for _, be := range r.backends {
		name := be.name
		be.handler = func(ctx *fasthttp.RequestCtx) {
			ctx.SetBodyString(name + " " + string(ctx.Request.Header.RequestURI()))
		}
	}
}

// TestRoutesReachTheirPools: with api by host, static by path (strip
// /static) and a default pool, every request reaches a backend of its
// pool, the static pool's get the path without the prefix (query kept),
// and the route hit counters count them.
func TestRoutesReachTheirPools(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, sitePools)
		pathRecorder(r)
		cases := []struct {
			host, target, pool, sent string
		}{
			{"api.example.com", "/v1/items?x=1", "api", "/v1/items?x=1"},
			{"API.Example.COM:8080", "/static/a.css", "api", "/static/a.css"}, // host route first: no strip
			{"api.example.com.", "/", "api", "/"},
			{"www.example.com", "/static/a.css?v=2", "static", "/a.css?v=2"},
			{"www.example.com", "/static/", "static", "/"},
			{"www.example.com", "/static/img/x.png", "static", "/img/x.png"},
			{"www.example.com", "/static", "default", "/static"}, // the route's prefix is /static/
			{"www.example.com", "/staticfile", "default", "/staticfile"},
			{"www.example.com", "/", "default", "/"},
			{"other.example", "/api/v1", "default", "/api/v1"},
		}
		for round := range 2 { // both backends of each pool
			for _, tc := range cases {
				raw := "GET " + tc.target + " HTTP/1.1\r\nHost: " + tc.host + "\r\n\r\n"
				got := rawRoundTrip(t, r.addr, raw)
				status, body := splitRaw(got)
				name, sent, _ := strings.Cut(body, " ")
				if status != "200" || poolOfBackend[name] != tc.pool || sent != tc.sent {
					t.Errorf("round %d: GET %s Host %s: %s %q, want a backend of %s that got %s", round, tc.target, tc.host, status, body, tc.pool, tc.sent)
				}
			}
		}
		tab := r.srv.backends.Load().routes
		if tab.Hits(0) != 6 || tab.Hits(1) != 6 {
			t.Errorf("route hits %d, %d; want 6, 6", tab.Hits(0), tab.Hits(1))
		}
	})
}

// splitRaw splits rawRoundTrip's text into the status and the body.
func splitRaw(s string) (status, body string) {
	status, rest, _ := strings.Cut(s, "\n")
	if i := strings.Index(rest, "\r\n\n"); i >= 0 {
		body = rest[i+3:]
	}
	return status, body
}

// TestNoRouteNoDefault404: with no default pool, a request no route
// takes is answered 404 with Proxy-Status destination_not_found, counted,
// and reaches no backend.
func TestNoRouteNoDefault404(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"api"}, {"static"}},
			routes: []string{"pool=api,host=api.example.com", "pool=static,path=/static/"}})
		got := rawRoundTrip(t, r.addr, "GET /x HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
		if !strings.HasPrefix(got, "404\n") || !strings.Contains(got, "Proxy-Status: sluice; error=destination_not_found\r\n") {
			t.Errorf("no route: %q, want 404 with Proxy-Status destination_not_found", got)
		}
		if n := r.srv.Stats().NoRoute.Load(); n != 1 {
			t.Errorf("NoRoute = %d, want 1", n)
		}
		if n := r.backends[0].hits.Load() + r.backends[1].hits.Load(); n != 0 {
			t.Errorf("backends got %d requests", n)
		}
		if got := rawRoundTrip(t, r.addr, "GET /static/x HTTP/1.1\r\nHost: www.example.com\r\n\r\n"); !strings.HasPrefix(got, "200\n") || !strings.HasSuffix(got, "b1") {
			t.Errorf("routed request: %q", got)
		}
	})
}

// TestRouteSpellings: a host or path that an ARM rule matches in any
// spelling (case, port, trailing dots; percent-encoding, dot-segments,
// empty segments, parameters, backslashes) is routed as the rule matches
// it when its raw path (as received) selects the same route: the routes
// and the rules read one normal form (matchHost, matchPath). A spelling
// whose raw path selects another route (or none) is refused 400
// ambiguous path: the backend, reading the raw path, would serve a path
// its route does not give it.
func TestRouteSpellings(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 3, pools: [][]string{{"api"}, {"shop"}, nil},
			routes: []string{"pool=api,path=/api/", "pool=shop,host=shop.example"}})
		want := map[string]string{"api": "b0", "shop": "b1", "": "b2"}
		ambiguous := 0
		for _, tc := range ruleSpellings {
			method := "GET"
			if tc.target == "*" {
				method = "OPTIONS"
			}
			// The route the raw path selects, by plain string operations.
			rawPath := tc.target
			if rest, ok := strings.CutPrefix(rawPath, "http://"); ok {
				rawPath = rest[strings.IndexByte(rest, '/'):]
			}
			rawPath, _, _ = strings.Cut(rawPath, "?")
			rawRule := ""
			switch {
			case strings.HasPrefix(rawPath, "/api/"):
				rawRule = "api"
			case tc.wantHost == "shop.example":
				rawRule = "shop"
			}
			raw := method + " " + tc.target + " HTTP/1.1\r\nHost: " + tc.host + "\r\n\r\n"
			got := rawRoundTrip(t, r.addr, raw)
			status, body := splitRaw(got)
			if rawRule != tc.rule && rawPath != "*" {
				ambiguous++
				if status != "400" || !strings.Contains(got, `Proxy-Status: sluice; error=http_request_error; details="ambiguous path"`) || !strings.Contains(got, "Cache-Control: no-store") {
					t.Errorf("%s %s Host %s: %q, want 400 ambiguous path (raw path: route %q, normalized: route %q)", method, tc.target, tc.host, got, rawRule, tc.rule)
				}
				continue
			}
			if status != "200" || body != want[tc.rule] {
				t.Errorf("%s %s Host %s: %s %q, want %s (rule %q)", method, tc.target, tc.host, status, body, want[tc.rule], tc.rule)
			}
		}
		if ambiguous < 10 {
			t.Errorf("%d ambiguous spellings: the table should hold many", ambiguous)
		}
	})
}

// TestStripSpellings: a stripped route sends the path without its prefix
// however the client spelled it, as long as the raw path is under the
// prefix too; a spelling that is not the normal form goes as the normal
// form, encoded where a path needs it. A spelling whose raw path is not
// under the prefix is refused (ambiguous path).
func TestStripSpellings(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"static"}, nil},
			routes: []string{"pool=static,path=/static/,strip=/static"}})
		pathRecorder(r)
		for _, tc := range []struct{ target, want string }{
			{"/static/a.css", "b0 /a.css"},
			{"/static/a.css?q=/static/", "b0 /a.css?q=/static/"},
			{"/static//a.css", "b0 /a.css"},
			{"/static/%61/../a%20b.css", "b0 /a%20b.css"},
			{"/API/../static/a.css", "400"}, // the raw path is not under /static/: ambiguous
			{"/%73tatic/a%20b.css", "400"},
			{"/static%2Fa.css", "400"},
			{"/static/x/..", "b0 /"},
			{"/static/%3Bx?y", "b0 /?y"},  // a ';' starts parameters, cut as routes and rules cut them
			{"/x/../api", "b1 /x/../api"}, // not stripped: the default pool gets it as sent
		} {
			got := rawRoundTrip(t, r.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: a.example\r\n\r\n")
			if status, body := splitRaw(got); tc.want == "400" && status != "400" || tc.want != "400" && (status != "200" || body != tc.want) {
				t.Errorf("GET %s: %s %q, want %q", tc.target, status, body, tc.want)
			}
		}
	})
}

// TestStripTarget: the target a strip= writes, without a server.
func TestStripTarget(t *testing.T) {
	for _, tc := range []struct{ target, strip, want string }{
		{"/static/a.css", "/static", "/a.css"},
		{"/static", "/static", "/"},
		{"/static?x", "/static", "/?x"},
		{"/staticfile", "/static", "/staticfile"},
		{"/other/static/a", "/static", "/other/static/a"},
		{"/static/a%2Fb", "/static", "/a/b"},
		{"/static/a%25b", "/static", "/a%25b"},
		{"/static/%E2%82%AC", "/static", "/%E2%82%AC"},
	} {
		var h fasthttp.RequestHeader
		h.SetMethod("GET")
		h.SetRequestURI(tc.target)
		h.SetHost("a")
		var v reqView
		v.fill(&h, true)
		if t := v.stripTarget(&h, tc.strip); t != nil {
			h.SetRequestURIBytes(t)
		}
		if got := string(h.RequestURI()); got != tc.want {
			t.Errorf("strip %s from %s: %q, want %q", tc.strip, tc.target, got, tc.want)
		}
	}
}

// cookieClient is a client with a cookie jar, as a browser keeps one.
func cookieClient(t *testing.T) *nethttp.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &nethttp.Client{Jar: jar, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func getWith(t *testing.T, c *nethttp.Client, addr, host, path string) string {
	t.Helper()
	req, err := nethttp.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	fmt.Fprint(&sb, resp.StatusCode, " ")
	buf := make([]byte, 256)
	n, _ := resp.Body.Read(buf)
	sb.Write(buf[:n])
	return sb.String()
}

// TestStickyPerPoolOnOneHost: a browser that keeps cookies, on one host
// with the default pool and a pool routed by path, stays on one backend of
// each pool and never sees a request of one pool go to the other: the
// static pool's cookie has Path=/static/, so its session does not ride
// along to the default pool's paths, and the default pool's session never
// overrides the route to static.
func TestStickyPerPoolOnOneHost(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, sitePools)
		c := cookieClient(t)
		seen := map[string]map[string]bool{}
		for i := range 12 {
			for _, tc := range []struct{ path, pool string }{{"/", "default"}, {"/static/x", "static"}, {"/p", "default"}} {
				got := getWith(t, c, r.addr, "www.example.com", tc.path)
				name := strings.TrimPrefix(got, "200 ")
				if poolOfBackend[name] != tc.pool {
					t.Fatalf("request %d to %s: %q, want a backend of %s", i, tc.path, got, tc.pool)
				}
				if seen[tc.pool] == nil {
					seen[tc.pool] = map[string]bool{}
				}
				seen[tc.pool][name] = true
			}
		}
		for pool, names := range seen {
			if len(names) != 1 {
				t.Errorf("pool %s: the session went to %v, want one backend", pool, names)
			}
		}
		u, _ := url.Parse("http://www.example.com/static/x") // the jar keeps cookies by Host
		if cs := c.Jar.Cookies(u); len(cs) != 2 {
			t.Errorf("the client holds %d cookies for /static/x (%v), want 2 (the default pool's and the static pool's)", len(cs), cs)
		}
	})
}

// TestStickyKeepsPoolAcrossRouteChange: a sticky session stays in its
// pool and on its backend when a new generation routes its requests to
// another pool; new work follows the new routes; a cookie whose pool is
// gone is new work, routed; a cookie issued before pools (no pool in the
// token) keeps its backend when the routed pool has it.
func TestStickyKeepsPoolAcrossRouteChange(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		o := rigOpts{backends: 4, pools: [][]string{{"blue"}, {"blue"}, {"green"}, {"green"}},
			routes: []string{"pool=blue,host=app.example"}}
		r := newRig(t, o)
		get := func(cookie string) reply {
			t.Helper()
			req, _ := nethttp.NewRequest("GET", "http://"+r.addr+"/", nil)
			req.Host = "app.example"
			if cookie != "" {
				req.Header.Set("Cookie", cookie)
			}
			resp, err := r.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var sb strings.Builder
			buf := make([]byte, 64)
			n, _ := resp.Body.Read(buf)
			sb.Write(buf[:n])
			return reply{status: resp.StatusCode, body: sb.String(), header: resp.Header}
		}
		first := get("")
		cookie := stickyFrom(t, first)
		if first.body != "b0" && first.body != "b1" {
			t.Fatalf("first request went to %s, want blue", first.body)
		}
		// The same backends, the route now to green.
		o.routes = []string{"pool=green,host=app.example"}
		if err := r.srv.SetGeneration(r.generation(o)); err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			if rep := get(cookie); rep.status != 200 || rep.body != first.body {
				t.Fatalf("sticky request %d after the route change: %d %q, want %s", i, rep.status, rep.body, first.body)
			}
		}
		for i := range 4 {
			if rep := get(""); rep.body != "b2" && rep.body != "b3" {
				t.Fatalf("new work %d after the route change went to %q, want green", i, rep.body)
			}
		}
		// blue is gone: its cookie is new work, routed to green.
		o.pools = [][]string{{"red"}, {"red"}, {"green"}, {"green"}}
		if err := r.srv.SetGeneration(r.generation(o)); err != nil {
			t.Fatal(err)
		}
		rep := get(cookie)
		if rep.body != "b2" && rep.body != "b3" {
			t.Fatalf("a cookie of a pool that is gone went to %q, want green (routed)", rep.body)
		}
		if c := stickyFrom(t, rep); c == cookie {
			t.Error("the request of a gone pool was not re-pinned")
		}
		// A token without a pool keeps its backend when the routed pool
		// has it; one naming a backend of another pool is new work.
		old := "SLUICE=" + r.signer.Token("b3", time.Now().Add(time.Hour))
		for i := range 4 {
			if rep := get(old); rep.body != "b3" {
				t.Fatalf("pool-less token of b3 (green, routed), request %d: went to %q, want b3", i, rep.body)
			}
		}
		other := "SLUICE=" + r.signer.Token("b1", time.Now().Add(time.Hour))
		if rep := get(other); rep.body != "b2" && rep.body != "b3" {
			t.Fatalf("pool-less token of b1 (red, not routed): went to %q, want green (routed)", rep.body)
		}
	})
}

// TestARMPoolBudgets: an ARM rule with pool= is that pool's budget: it
// refuses the requests of its pool once used up, naming the rule and the
// pool in Proxy-Status, and leaves the other pool alone (injected clock).
func TestARMPoolBudgets(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		o := sitePools
		o.arm = []string{"name=api-burst,pool=api,limit=3/min,action=reject", "name=static-cap,pool=static,limit=5/min,action=reject"}
		o.cfg = Config{StickyCookie: "-"}
		r := newRig(t, o)
		count := func(host, path string, n int) (ok, refused int) {
			for range n {
				got := rawRoundTrip(t, r.addr, "GET "+path+" HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
				switch {
				case strings.HasPrefix(got, "200\n"):
					ok++
				case strings.HasPrefix(got, "429\n"):
					refused++
					pool := "api"
					rule := "api-burst"
					if host != "api.example.com" {
						pool, rule = "static", "static-cap"
					}
					if want := `Proxy-Status: sluice; error=http_request_denied; details="arm rule ` + rule + ` pool ` + pool + `"`; !strings.Contains(got, want) {
						t.Errorf("refusal %q, want %s", got, want)
					}
					if !strings.Contains(got, "Cache-Control: no-store\r\n") {
						t.Errorf("refusal %q without Cache-Control: no-store", got)
					}
				default:
					t.Fatalf("GET %s Host %s: %q", path, host, got)
				}
			}
			return ok, refused
		}
		if ok, ref := count("api.example.com", "/", 5); ok != 3 || ref != 2 {
			t.Errorf("api: %d served, %d refused; want 3, 2", ok, ref)
		}
		if ok, ref := count("www.example.com", "/static/x", 7); ok != 5 || ref != 2 {
			t.Errorf("static: %d served, %d refused; want 5, 2", ok, ref)
		}
		if ok, ref := count("www.example.com", "/", 10); ok != 10 || ref != 0 {
			t.Errorf("default: %d served, %d refused; want 10, 0", ok, ref)
		}
		set := r.srv.backends.Load()
		if n := set.byName["api"].stats.Refused[admission.ReasonARM].Load(); n != 2 {
			t.Errorf("api pool refusals counted %d, want 2", n)
		}
		// A minute later the budgets are back.
		r.clock.Advance(61 * time.Second)
		if ok, _ := count("api.example.com", "/", 3); ok != 3 {
			t.Errorf("api after a minute: %d served, want 3", ok)
		}
	})
}

// TestRetryStaysInPool: a GET whose backend refuses the connection is
// sent once more to another backend of the same pool, never to another
// pool.
func TestRetryStaysInPool(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 4, pools: [][]string{{"api"}, {"api"}, nil, nil}, policy: "round-robin",
			routes: []string{"pool=api,host=api.example.com"}, cfg: Config{StickyCookie: "-"}})
		r.backends[0].stop()
		for i := range 6 {
			got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
			if status, body := splitRaw(got); status != "200" || body != "b1" {
				t.Fatalf("request %d: %s %q, want b1 (the other api backend)", i, status, body)
			}
		}
	})
}

// TestPoolHashKey: a pool's hash-key= is the key its consistent-hash
// policy reads, and a bad one is refused by SetGeneration.
func TestPoolHashKey(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		o := rigOpts{backends: 4, pools: [][]string{{"api"}, {"api"}, {"api"}, {"api"}}, policy: "consistent-hash",
			poolSpecs: []string{"name=api,policy=consistent-hash,hash-key=header:X-User"},
			routes:    []string{"pool=api"}, cfg: Config{StickyCookie: "-"}}
		r := newRig(t, o)
		for _, user := range []string{"alice", "bob", "carol"} {
			var first string
			for i := range 5 {
				got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: a\r\nX-User: "+user+"\r\n\r\n")
				_, body := splitRaw(got)
				if i == 0 {
					first = body
				} else if body != first {
					t.Fatalf("user %s went to %s then %s", user, first, body)
				}
			}
		}
		// Connection may not name the pool's hash header.
		if got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: a\r\nX-User: a\r\nConnection: x-user\r\n\r\n"); !strings.HasPrefix(got, "400\n") {
			t.Errorf("Connection naming the pool's hash header: %.40q, want 400", got)
		}
	})
}

// TestRouteHeaderConnectionRefused: Connection may not name a header a
// route tests (removing it would route on a header the backend never
// sees).
func TestRouteHeaderConnectionRefused(t *testing.T) {
	r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"beta"}, nil}, routes: []string{"pool=beta,header=X-Channel:beta"}})
	if got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: a\r\nX-Channel: beta\r\n\r\n"); !strings.HasSuffix(got, "b0") {
		t.Errorf("header route: %q", got)
	}
	if got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: a\r\nX-Channel: beta\r\nConnection: X-Channel\r\n\r\n"); !strings.HasPrefix(got, "400\n") {
		t.Errorf("Connection naming the route's header: %.40q, want 400", got)
	}
}

// TestRoutedHotPathAllocs: routing a request (host, path, method and a
// header) and admitting it allocate nothing once warm, with 100 routes.
func TestRoutedHotPathAllocs(t *testing.T) {
	r := newRig(t, manyRoutes(100))
	s := r.srv
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}, nil)
	raw := "GET /svc/99/x?q=1 HTTP/1.1\r\nHost: WWW.Example.com:8080\r\nX-Tenant: t1\r\n\r\n"
	if err := ctx.Request.Read(bufioReader(raw)); err != nil {
		t.Fatal(err)
	}
	h := &ctx.Request.Header
	var p plan
	var v reqView
	now := r.clock.Now()
	run := func() {
		req, d := s.admit(&p, h, &v, now)
		if !s.pick(&p, &ctx.Response, &req, d, h, remoteAddr(&ctx)) {
			t.Fatal("refused")
		}
	}
	run()
	if p.ref.name != "p99" {
		t.Fatalf("routed to %s, want p99", p.ref.name)
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("routing and admitting allocate %v times per request, want 0", n)
	}
}

// manyRoutes is n path routes (and a default pool), each to its own
// pool of one backend, the last one matching /svc/<n-1>/.
func manyRoutes(n int) rigOpts {
	o := rigOpts{backends: n + 1, cfg: Config{StickyCookie: "-"}}
	for i := range n {
		o.pools = append(o.pools, []string{fmt.Sprintf("p%d", i)})
		o.routes = append(o.routes, fmt.Sprintf("pool=p%d,path=/svc/%d/", i, i))
	}
	o.pools = append(o.pools, nil)
	return o
}

func bufioReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }

// BenchmarkRoutedRoundTrip is BenchmarkRoundTrip through a route table
// of 1 and 100 path routes (the request takes the last one), per engine:
// what routing adds to a request end to end.
func BenchmarkRoutedRoundTrip(b *testing.B) {
	for _, n := range []int{1, 100} {
		for _, engine := range []string{EngineLoop, EngineFastHTTP} {
			b.Run(fmt.Sprintf("routes=%d/%s", n, engine), func(b *testing.B) {
				o := manyRoutes(n)
				o.cfg.Engine = engine
				r := newRig(b, o)
				c, err := net.Dial("tcp", r.addr)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				br := bufio.NewReader(c)
				req := []byte(fmt.Sprintf("GET /svc/%d/x HTTP/1.1\r\nHost: x\r\n\r\n", n-1))
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
				if want := fmt.Sprintf("b%d", n-1); string(resp.Body()) != want {
					b.Fatalf("answered by %s, want %s", resp.Body(), want)
				}
			})
		}
	}
}

// TestRouteMetrics: the collector carries the route hits by route and
// pool, the requests no route took, and the refusals by pool and reason.
func TestRouteMetrics(t *testing.T) {
	r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"api"}, {"static"}},
		routes: []string{"pool=api,host=api.example.com", "pool=static,path=/static/"},
		arm:    []string{"name=api-burst,pool=api,limit=1/min,action=reject"}})
	for _, raw := range []string{
		"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", // refused by api-burst
		"GET /static/a HTTP/1.1\r\nHost: www.example.com\r\n\r\n",
		"GET /other HTTP/1.1\r\nHost: www.example.com\r\n\r\n", // 404
	} {
		rawRoundTrip(t, r.addr, raw)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.srv.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	for name, want := range map[string]float64{
		"sluice_http_route_hits_total{pool=api,route=pool=api,host=api.example.com}": 2,
		"sluice_http_route_hits_total{pool=static,route=pool=static,path=/static/}":  1,
		"sluice_http_no_route_total{}":                               1,
		"sluice_http_pool_refused_total{pool=api,reason=arm}":        1,
		"sluice_http_pool_refused_total{pool=static,reason=arm}":     0,
		"sluice_http_pool_refused_total{pool=api,reason=no_backend}": 0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
}

// TestSetGenerationErrors: a generation the front end cannot serve is
// refused and the one in use stays.
func TestSetGenerationErrors(t *testing.T) {
	o := rigOpts{backends: 2, pools: [][]string{{"api"}, nil}, routes: []string{"pool=api,host=api.example.com"}}
	r := newRig(t, o)
	before := r.srv.backends.Load()
	cfg := r.genConfig(o)
	cfg.Pools = []lb.PoolSpec{{Name: "api", HashKey: "bogus:x"}}
	if g, err := lb.NewGeneration(cfg); err == nil {
		if err := r.srv.SetGeneration(g); err == nil || !strings.Contains(err.Error(), `pool api: hash-key "bogus:x"`) {
			t.Errorf("SetGeneration with a bad hash key: %v", err)
		}
	}
	if err := r.srv.SetGeneration(nil); err == nil {
		t.Error("SetGeneration(nil) succeeded")
	}
	sip := r.genConfig(o)
	sip.Proto = "sip"
	if g, err := lb.NewGeneration(sip); err == nil {
		if err := r.srv.SetGeneration(g); err == nil {
			t.Error("SetGeneration of a sip generation succeeded")
		}
	}
	if r.srv.backends.Load() != before {
		t.Error("a refused generation replaced the one in use")
	}
	if r.srv.Generation() == nil || r.srv.Pool().Name() != lb.DefaultPool {
		t.Errorf("Generation() %v, Pool() %s", r.srv.Generation(), r.srv.Pool().Name())
	}
}

// TestProxyStatusDetails: refusals carry admission's Detail as a quoted
// string, escaped, without allocating.
func TestProxyStatusDetails(t *testing.T) {
	rc, err := admission.ParseRule(`name=a"b\c,pool=api,limit=1/min,action=reject`)
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := admission.NewController(admission.ControllerConfig{Rules: []admission.RuleConfig{rc}}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	req := admission.Request{Class: admission.NewWork, Proto: "http", Method: "GET", Pool: "api"}
	ctrl.Decide(1, &req, nil)
	d := ctrl.Decide(2, &req, nil)
	if d.Verdict != admission.Refuse {
		t.Fatalf("second request: %v, want a refusal", d.Verdict)
	}
	for _, tc := range []struct {
		d    admission.Decision
		want string
	}{
		{d, `sluice; error=http_request_denied; details="arm rule a\"b\\c pool api"`},
		{ctrl.RefuseMOPFor(&req, time.Second), `sluice; error=http_request_denied; details="mop pool api"`},
		{ctrl.RefuseMOPFor(&admission.Request{Proto: "http"}, time.Second), `sluice; error=http_request_denied; details="mop"`},
	} {
		var buf [320]byte
		if got := string(appendProxyStatus(buf[:0], "http_request_denied", tc.d)); got != tc.want {
			t.Errorf("got  %s\nwant %s", got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		var buf [320]byte
		appendProxyStatus(buf[:0], "http_request_denied", d)
	}); n != 0 {
		t.Errorf("appendProxyStatus allocates %v times", n)
	}
}

// A pool whose every backend that would take new work is drained by the
// operator is refused as drained, by name, and counted as draining; a
// pool with no backend up (none drained) is still "no backend up".
func TestPoolDrainedRefusal(t *testing.T) {
	r := newRig(t, rigOpts{backends: 3, pools: [][]string{{"api"}, {"static"}, {"static"}},
		routes: []string{"pool=api,path=/api/", "pool=static,path=/static/"}})
	g := r.srv.Generation()
	for _, b := range g.Pool("static").Backends() {
		b.Drain(true)
	}
	g.Pool("api").Backends()[0].Disable(true)
	for _, tc := range []struct{ path, want string }{
		{"/static/a", `sluice; error=destination_unavailable; details="pool static drained"`},
		{"/api/a", `sluice; error=destination_unavailable; details="no backend up"`},
	} {
		resp := rawRoundTrip(t, r.addr, "GET "+tc.path+" HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
		if !strings.HasPrefix(resp, "503") || !strings.Contains(resp, "Proxy-Status: "+tc.want+"\r\n") {
			t.Errorf("GET %s:\n%s\nwant 503 with Proxy-Status: %s", tc.path, resp, tc.want)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.srv.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = m.GetCounter().GetValue()
		}
	}
	for name, want := range map[string]float64{
		"sluice_http_pool_refused_total{pool=static,reason=draining}":   1,
		"sluice_http_pool_refused_total{pool=static,reason=no_backend}": 0,
		"sluice_http_pool_refused_total{pool=api,reason=no_backend}":    1,
		"sluice_http_pool_refused_total{pool=api,reason=draining}":      0,
	} {
		if v, ok := got[name]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
		}
	}
}
