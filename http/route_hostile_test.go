package http

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// Hostile inputs against routing: what a client sends (its path's
// spelling, a cookie, a header twice) never reaches a pool the routes do
// not give its request.

// rfc3986Path is how a server that neither cuts ";parameters" nor reads
// '\' as '/' (nginx, Apache, Go's net/http, Node, Caddy) reads a
// request target's path for its own location matching: the query cut off,
// then only RFC 3986 §5.2.4 dot-segment removal, with "..;" and "a\.."
// ordinary segment text.
func rfc3986Path(target string) string {
	p, _, _ := strings.Cut(target, "?")
	var out []string
	segs := strings.Split(p, "/")[1:]
	for i, s := range segs {
		switch s {
		case ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, s)
			continue
		}
		if i == len(segs)-1 {
			out = append(out, "")
		}
	}
	return "/" + strings.Join(out, "/")
}

// TestRoutedPathIsBackendPath: the path a route matched is the path the
// pool's backend serves. Routes match the normal form matchPath makes
// (';' parameters cut, '\' read as '/', dot-segments removed after both),
// while a request routed without strip= is forwarded as the client
// spelled it, and most servers (nginx, Apache, Go, Node, Caddy) read that
// spelling without sluice's normalization. With no default pool the
// routes are an allowlist: here only /api/ of the API servers is
// published, and a spelling whose raw path is elsewhere (their /internal/
// location) is refused 400 ambiguous path. A spelling both readings put
// under /api/ (a ;jsessionid= parameter) goes untouched.
func TestRoutedPathIsBackendPath(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, pools: [][]string{{"api"}},
			routes: []string{"pool=api,path=/api/"}})
		pathRecorder(r)
		if got := rawRoundTrip(t, r.addr, "GET /internal/x HTTP/1.1\r\nHost: www.example.com\r\n\r\n"); !strings.HasPrefix(got, "404\n") {
			t.Fatalf("GET /internal/x: %q, want 404 (no route, no default pool)", got)
		}
		for _, tc := range []struct{ target, want string }{
			{"/internal/x/..;/..;/api/y", "400"},     // ';' cut before dot-segments: "..;" is ".." to the route
			{"/internal/x/..%3B/..%3B/api/y", "400"}, // the same, the ';' encoded
			{`/internal/x\..\..\api/y`, "400"},       // '\' is '/' to the route only
			{"/internal/x%5C..%5C..%5Capi/y", "400"}, // the same, encoded
			{"/api;x/internal", "400"},               // the route sees /api/internal; the backend /api;x/internal
			{"/%61pi/y", "400"},                      // decoded /api/y; raw elsewhere
			{"/api/y", "b0 /api/y"},                  // in normal form, as the route saw it
			{"/api/a;jsessionid=1?q=1", "b0 /api/a;jsessionid=1?q=1"},
			{"/api//y", "b0 /api//y"},
			{"/api/x/../y", "b0 /api/x/../y"},
			{"/api/x/../../internal", "400"}, // raw under /api/, normalized /internal: ambiguous
			{"/internal/a;b", "404"},         // both readings outside /api/: no route
		} {
			got := rawRoundTrip(t, r.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
			status, body := splitRaw(got)
			switch tc.want {
			case "400":
				if status != "400" || !strings.Contains(got, `Proxy-Status: sluice; error=http_request_error; details="ambiguous path"`) {
					t.Errorf("GET %s: %q, want 400 ambiguous path", tc.target, got)
				}
			case "404":
				if status != "404" {
					t.Errorf("GET %s: %q, want 404", tc.target, got)
				}
			default:
				if status != "200" || body != tc.want {
					t.Errorf("GET %s: %s %q, want 200 %q", tc.target, status, body, tc.want)
				}
			}
			if status == "200" {
				_, sent, _ := strings.Cut(body, " ")
				if read := rfc3986Path(sent); !strings.HasPrefix(read, "/api/") {
					t.Errorf("GET %s: routed to pool api (path=/api/), whose backend got %q and serves it as %s", tc.target, sent, read)
				}
			}
		}
	})
}

// rawSetCookie returns "NAME=VALUE" of the Set-Cookie of name in a
// rawRoundTrip text, "" when there is none.
func rawSetCookie(raw, name string) string {
	for _, line := range strings.Split(raw, "\r\n") {
		if v, ok := strings.CutPrefix(line, "Set-Cookie: "+name+"="); ok {
			v, _, _ = strings.Cut(v, ";")
			return name + "=" + v
		}
	}
	return ""
}

// TestForeignPoolCookieFollowsRoutes: a sticky cookie obtained from one
// pool does not carry requests that the routes send to another pool (or
// to the default pool) into its pool: a client that once reached the
// admin pool (host=admin.internal) cannot send other hosts and paths
// there as affinity (no ARM budget, no MOP). HAProxy's use_backend picks
// the backend first and reads the cookie inside it only.
func TestForeignPoolCookieFollowsRoutes(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 3, pools: [][]string{{"admin"}, {"api"}, nil},
			routes: []string{"pool=admin,host=admin.internal", "pool=api,path=/api/"}})
		pathRecorder(r)
		got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: admin.internal\r\n\r\n")
		cookie := rawSetCookie(got, "SLUICE")
		if _, body := splitRaw(got); !strings.HasPrefix(body, "b0 ") || cookie == "" {
			t.Fatalf("admin.internal: %q, want b0 with a sticky cookie", got)
		}
		for _, tc := range []struct{ host, target, want string }{
			{"www.example.com", "/api/users", "b1"},
			{"www.example.com", "/", "b2"},
			{"anything.example", "/wp-admin/", "b2"},
		} {
			got := rawRoundTrip(t, r.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: "+tc.host+"\r\nCookie: "+cookie+"\r\n\r\n")
			if _, body := splitRaw(got); !strings.HasPrefix(body, tc.want+" ") {
				t.Errorf("GET %s Host %s with the admin pool's cookie: went to %q, want %s (the routes' pool)", tc.target, tc.host, body, tc.want)
			}
		}
	})
}

// TestPoollessTokenStaysInRoutedPool: a token without a pool (version 2:
// every cookie a front end without pools issues, that is every cookie of
// the release before pools) pins its backend only when the routed pool
// has it: after an upgrade that moves a backend into a restricted pool,
// an old cookie for it does not reach it with another host or path.
func TestPoollessTokenStaysInRoutedPool(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"admin"}, nil},
			routes: []string{"pool=admin,header=X-Gateway-Auth:ok"}})
		pathRecorder(r)
		old := "SLUICE=" + r.signer.Token("b0", time.Now().Add(time.Hour))
		got := rawRoundTrip(t, r.addr, "GET /admin/users HTTP/1.1\r\nHost: www.example.com\r\nCookie: "+old+"\r\n\r\n")
		if _, body := splitRaw(got); !strings.HasPrefix(body, "b1 ") {
			t.Errorf("pool-less token naming b0 (pool admin), request routed to default: went to %q, want b1", body)
		}
	})
}

// TestDuplicateRouteHeader: a header a route tests, sent twice, is
// refused 400 (as a second Host is): a route and the backend could read
// different lines (the first, the last, the two joined), and a front
// proxy that appends its own line after a client's forged one would leave
// the client's to choose the pool. A header no route tests may repeat.
func TestDuplicateRouteHeader(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"gold"}, nil},
			routes: []string{"pool=gold,header=X-Tenant:gold"}})
		for _, tc := range []struct{ head, want string }{
			{"X-Tenant: gold\r\nX-Tenant: bronze\r\n", "400"},
			{"X-Tenant: bronze\r\nX-Tenant: gold\r\n", "400"},
			{"X-Tenant: gold\r\nx-tenant: gold\r\n", "400"},
			{"X-Tenant: gold\r\n", "b0"},
			{"X-Tenant: bronze\r\n", "b1"},
			{"", "b1"},
			{"X-Tenant: gold\r\nX-Other: 1\r\nX-Other: 2\r\n", "b0"},
		} {
			got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: a.example\r\n"+tc.head+"\r\n")
			status, body := splitRaw(got)
			if tc.want == "400" {
				if status != "400" || !strings.Contains(got, `Proxy-Status: sluice; error=http_request_error; details="duplicate routed header"`) || !strings.Contains(got, "Cache-Control: no-store") {
					t.Errorf("%q: %q, want 400 duplicate routed header", tc.head, got)
				}
			} else if status != "200" || body != tc.want {
				t.Errorf("%q: %s %q, want %s", tc.head, status, body, tc.want)
			}
		}
		if n := r.srv.Stats().BadRequest.Load(); n != 3 {
			t.Errorf("BadRequest = %d, want 3", n)
		}
	})
}

// TestNoRoute404NotCacheable: the 404 sluice makes when no route takes a
// request must not be stored by a shared cache in front: 404 is
// heuristically cacheable (RFC 9110 §15.1, RFC 9111 §4.2.2), and a
// request that misses the routes by an input the cache does not key on (a
// header route, a method) would then poison the URL for everyone.
func TestNoRoute404NotCacheable(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, pools: [][]string{{"app"}},
			routes: []string{"pool=app,header=X-App:1"}})
		got := rawRoundTrip(t, r.addr, "GET /index.html HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
		if !strings.HasPrefix(got, "404\n") {
			t.Fatalf("no route: %q, want 404", got)
		}
		if !strings.Contains(got, "Cache-Control: no-store\r\n") {
			t.Errorf("no-route 404 without Cache-Control: no-store (heuristically cacheable): %q", got)
		}
	})
}

// TestCookieKeepsRouteAllowlist: with no default pool the routes are an
// allowlist (no route: 404). The sticky cookie (on by default) any client
// gets from one allowed request does not carry other requests, whatever
// their path or host, to that pool's backend: publishing only /api/ of
// the API servers publishes nothing else of them.
func TestCookieKeepsRouteAllowlist(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, pools: [][]string{{"api"}},
			routes: []string{"pool=api,path=/api/"}})
		pathRecorder(r)
		got := rawRoundTrip(t, r.addr, "GET /api/anything HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
		cookie := rawSetCookie(got, "SLUICE")
		if status, _ := splitRaw(got); status != "200" || cookie == "" {
			t.Fatalf("GET /api/anything: %q, want 200 with a sticky cookie", got)
		}
		for _, target := range []string{"/internal/admin", "/actuator/env", "/"} {
			got := rawRoundTrip(t, r.addr, "GET "+target+" HTTP/1.1\r\nHost: www.example.com\r\nCookie: "+cookie+"\r\n\r\n")
			if status, body := splitRaw(got); status != "404" {
				t.Errorf("GET %s with the cookie of GET /api/anything: %s %q, want 404 (no route, no default pool)", target, status, body)
			}
		}
	})
}

// TestLearnedSessionKeepsRouteAllowlist: the same as
// TestCookieKeepsRouteAllowlist with the sticky cookie off and
// application sessions learned (-http-sticky-app-cookie JSESSIONID): the
// session id an allowed request got carries no other path to its pool,
// and keeps its backend on the paths the routes give that pool.
func TestLearnedSessionKeepsRouteAllowlist(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"api"}, {"api"}},
			routes: []string{"pool=api,path=/api/"},
			cfg:    Config{AppCookie: "JSESSIONID", StickyCookie: "-"}})
		for _, be := range r.backends {
			be.handler = func(ctx *fasthttp.RequestCtx) {
				if len(ctx.Request.Header.Cookie("JSESSIONID")) == 0 {
					ctx.Response.Header.Add("Set-Cookie", "JSESSIONID=sess-"+be.name+"; Path=/; HttpOnly")
				}
				ctx.SetBodyString(be.name)
			}
		}
		got := rawRoundTrip(t, r.addr, "GET /api/login HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
		status, first := splitRaw(got)
		if status != "200" || rawSetCookie(got, "JSESSIONID") != "JSESSIONID=sess-"+first {
			t.Fatalf("GET /api/login: %q, want 200 with a session", got)
		}
		for i := range 4 {
			got := rawRoundTrip(t, r.addr, "GET /api/x HTTP/1.1\r\nHost: www.example.com\r\nCookie: JSESSIONID=sess-"+first+"\r\n\r\n")
			if _, body := splitRaw(got); body != first {
				t.Fatalf("GET /api/x %d with the session: went to %q, want %s (its backend)", i, body, first)
			}
		}
		got = rawRoundTrip(t, r.addr, "GET /internal/admin HTTP/1.1\r\nHost: www.example.com\r\nCookie: JSESSIONID=sess-"+first+"\r\n\r\n")
		if status, body := splitRaw(got); status != "404" {
			t.Errorf("GET /internal/admin with the session of /api/login: %s %q, want 404 (no route, no default pool)", status, body)
		}
	})
}

// TestPinHonouredByPastTables: a pin to a pool other than the routed one
// is honoured while one of the last maxPastTables route tables the server
// served (besides the current one) sent the request to that pool: a
// session stays in its pool across a few route changes, a reload that
// keeps the routes does not age it, and it never reaches its pool with a
// request no kept table gave that pool.
func TestPinHonouredByPastTables(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		o := rigOpts{backends: 2, pools: [][]string{{"blue"}, {"green"}},
			routes: []string{"pool=blue,host=app.example"}}
		r := newRig(t, o)
		get := func(host, cookie string) (string, string) {
			t.Helper()
			return splitRaw(rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: "+host+"\r\nCookie: "+cookie+"\r\n\r\n"))
		}
		cookie := "SLUICE=" + r.signer.PoolToken("blue", "b0", time.Now().Add(time.Hour))
		if _, body := get("app.example", cookie); body != "b0" {
			t.Fatalf("blue cookie before any change: %q, want b0", body)
		}
		setRoutes := func(routes ...string) {
			t.Helper()
			o.routes = routes
			if err := r.srv.SetGeneration(r.generation(o)); err != nil {
				t.Fatal(err)
			}
		}
		// The same routes again, many times: not a change.
		for range 2 * maxPastTables {
			setRoutes("pool=blue,host=app.example")
		}
		// maxPastTables changes, each a different table sending
		// app.example to green: the first table (blue) is still kept.
		for i := range maxPastTables {
			setRoutes("pool=green,host=app.example", fmt.Sprintf("pool=green,host=other%d.example", i))
			if _, body := get("app.example", cookie); body != "b0" {
				t.Fatalf("after %d route changes: the blue session went to %q, want b0 (its pool)", i+1, body)
			}
			if status, _ := get("www.example.com", cookie); status != "404" {
				t.Fatalf("after %d route changes: a host no table routes, with the blue cookie: %s, want 404", i+1, status)
			}
		}
		if _, body := get("app.example", "SLUICE="+r.signer.PoolToken("green", "b1", time.Now().Add(time.Hour))); body != "b1" {
			t.Fatalf("green cookie: %q, want b1", body)
		}
		// One more: the blue table is forgotten, the session follows the
		// routes.
		setRoutes("pool=green,host=app.example")
		if _, body := get("app.example", cookie); body != "b1" {
			t.Fatalf("after %d route changes: the blue session went to %q, want b1 (routed)", maxPastTables+1, body)
		}
	})
}

// TestRegexRoutePathLimit: with a regex route in the table, a path a
// regex would test longer than lb.MaxRouteRegexInput bytes (normalized,
// or raw when it differs) is answered 414 before any route is tried: the
// cost of regex routes does not grow with the path a client chooses. A
// table without regex routes takes long paths.
func TestRegexRoutePathLimit(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"css"}, nil},
			routes: []string{`pool=css,path=~.*\.css`}})
		css := func(n int) string { return "/" + strings.Repeat("a", n-len("/.css")) + ".css" }
		for _, tc := range []struct{ target, want string }{
			{css(100), "b0"},
			{css(lb.MaxRouteRegexInput), "b0"},
			{css(lb.MaxRouteRegexInput + 1), "414"},
			{"/" + strings.Repeat("b", 8000), "414"},
			{"/" + strings.Repeat("./", lb.MaxRouteRegexInput/2) + "a.css", "414"}, // short normalized, long raw
			{css(lb.MaxRouteRegexInput) + "?" + strings.Repeat("q", 2000), "b0"},   // the query is not tested
			{"/x", "b1"},
		} {
			got := rawRoundTrip(t, r.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: a.example\r\n\r\n")
			status, body := splitRaw(got)
			if tc.want == "414" {
				if status != "414" || !strings.Contains(got, `Proxy-Status: sluice; error=http_request_error; details="path too long for regex routes"`) || !strings.Contains(got, "Cache-Control: no-store") {
					t.Errorf("GET %d-byte target: %.200q, want 414", len(tc.target), got)
				}
			} else if status != "200" || body != tc.want {
				t.Errorf("GET %d-byte target: %s %q, want %s", len(tc.target), status, body, tc.want)
			}
		}
		r2 := newRig(t, rigOpts{backends: 2, pools: [][]string{{"api"}, nil},
			routes: []string{"pool=api,path=/api/"}})
		for _, tc := range []struct{ target, want string }{
			{"/api/" + strings.Repeat("a", 8000), "b0"},
			{"/" + strings.Repeat("a", 8000), "b1"},
		} {
			got := rawRoundTrip(t, r2.addr, "GET "+tc.target+" HTTP/1.1\r\nHost: a.example\r\n\r\n")
			if status, body := splitRaw(got); status != "200" || body != tc.want {
				t.Errorf("no regex route, GET %d-byte target: %s %q, want %s", len(tc.target), status, body, tc.want)
			}
		}
	})
}

// TestPastTablePinAllocs: honouring a pin by a route table served before
// (header and path routes, a path not in normal form) allocates no more
// than honouring a pin to the routed pool (the token's verification
// aside, nothing).
func TestPastTablePinAllocs(t *testing.T) {
	o := rigOpts{backends: 2, pools: [][]string{{"blue"}, {"green"}},
		routes: []string{"pool=blue,header=X-T:1,path=/a/"}}
	r := newRig(t, o)
	o.routes = []string{"pool=green,header=X-T:1,path=/a/", "pool=green,method=POST"}
	if err := r.srv.SetGeneration(r.generation(o)); err != nil {
		t.Fatal(err)
	}
	s := r.srv
	allocs := func(pool, id string) float64 {
		var ctx fasthttp.RequestCtx
		ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}, nil)
		cookie := "SLUICE=" + r.signer.PoolToken(pool, id, time.Now().Add(time.Hour))
		raw := "GET /a/x;v=1/../y?q=1 HTTP/1.1\r\nHost: www.example.com\r\nX-T: 1\r\nCookie: " + cookie + "\r\n\r\n"
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
		if p.b == nil || p.b.ID() != id || p.class != admission.Affinity {
			t.Fatalf("pin %s/%s went to %v (class %v), want it as affinity", pool, id, p.b, p.class)
		}
		return testing.AllocsPerRun(200, run)
	}
	routed, past := allocs("green", "b1"), allocs("blue", "b0")
	t.Logf("allocations: routed pool %v, past table %v", routed, past)
	if past > routed {
		t.Errorf("a pin honoured by a past table: %v allocations per request, a pin to the routed pool %v", past, routed)
	}
}

// TestPastTablesConsultedOnce: however many cookies naming other pools a
// request carries, each past route table is matched against it once (its
// answer is kept in the routedReq), so a head full of cookies cannot
// multiply the cost of routing (regex routes included).
func TestPastTablesConsultedOnce(t *testing.T) {
	o := rigOpts{backends: 2, pools: [][]string{{"blue"}, {"green"}}, routes: []string{"pool=blue,path=/a/"}}
	r := newRig(t, o)
	for i := range 3 {
		o.routes = []string{"pool=green,path=/a/", fmt.Sprintf("pool=green,host=h%d.example", i)}
		if err := r.srv.SetGeneration(r.generation(o)); err != nil {
			t.Fatal(err)
		}
	}
	set := r.srv.backends.Load()
	if len(set.tables) != 4 {
		t.Fatalf("%d route tables kept, want 4 (the current and 3 past)", len(set.tables))
	}
	var h fasthttp.RequestHeader
	h.SetMethod("GET")
	h.SetRequestURI("/a/x")
	h.SetHost("www.example.com")
	var v reqView
	v.fill(&h, true)
	rq := routedReq{h: &h, v: &v}
	if !set.sendsAny(&rq, "blue") || set.sendsAny(&rq, "red") {
		t.Fatal("the first table sends /a/x to blue, no table to red")
	}
	if rq.done != 0b111 || rq.dest != [maxPastTables]string{"green", "green", "blue", ""} {
		t.Fatalf("kept answers %03b %q, want 111 [green green blue]", rq.done, rq.dest)
	}
	rq.dest[0] = "kept"
	if !set.sendsAny(&rq, "kept") {
		t.Error("a past table was matched again instead of its kept answer used")
	}
}
