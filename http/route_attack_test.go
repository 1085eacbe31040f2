package http

import (
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// Hostile inputs against routing. Each test states the property a
// routed front end must keep; a failure is a finding.

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

// TestAttackRoutedPathIsBackendPath: the path a route matched is the path
// the pool's backend serves. Routes match the normal form matchPath makes
// (';' parameters cut, '\' read as '/', dot-segments removed after both),
// but a request routed without strip= is forwarded as the client spelled
// it. A backend that reads the target as most servers do (no parameter
// cutting, '\' an ordinary byte: nginx, Apache, Go, Node, Caddy) then
// serves a path its pool's route does not cover. With no default pool the
// routes are an allowlist (anything else is 404): here only /api/ of the
// API servers is published, and their /internal/ location is reachable
// from outside.
func TestAttackRoutedPathIsBackendPath(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, pools: [][]string{{"api"}},
			routes: []string{"pool=api,path=/api/"}})
		pathRecorder(r)
		if got := rawRoundTrip(t, r.addr, "GET /internal/x HTTP/1.1\r\nHost: www.example.com\r\n\r\n"); !strings.HasPrefix(got, "404\n") {
			t.Fatalf("GET /internal/x: %q, want 404 (no route, no default pool)", got)
		}
		for _, target := range []string{
			"/internal/x/..;/..;/api/y",     // ';' cut before dot-segments: "..;" is ".." to the route
			"/internal/x/..%3B/..%3B/api/y", // the same, the ';' encoded
			`/internal/x\..\..\api/y`,       // '\' is '/' to the route only
			"/internal/x%5C..%5C..%5Capi/y", // the same, encoded
			"/api;x/internal",               // the route sees /api/internal; the backend /api;x/internal
			"/api/y",                        // control: in normal form, as the route saw it
		} {
			got := rawRoundTrip(t, r.addr, "GET "+target+" HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
			status, body := splitRaw(got)
			name, sent, _ := strings.Cut(body, " ")
			if status != "200" || name != "b0" {
				continue // refused: nothing published that should not be
			}
			if read := rfc3986Path(sent); !strings.HasPrefix(read, "/api/") {
				t.Errorf("GET %s: routed to pool api (path=/api/), whose backend got %q and serves it as %s", target, sent, read)
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

// TestAttackForeignPoolCookieOverridesRoutes: a sticky cookie obtained
// from one pool does not carry requests that the routes send to another
// pool (or to the default pool) into its pool. Today a pin of any pool
// but default overrides every route: a client that once reached the
// admin pool (host=admin.internal; the same holds for a pool chosen by a
// header a front proxy sets) sends any host and path there, and the
// admin backends get requests no route gives them, as affinity (no ARM
// budget, no MOP). HAProxy's use_backend picks the backend first and
// reads the cookie inside it only.
func TestAttackForeignPoolCookieOverridesRoutes(t *testing.T) {
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

// TestAttackPoollessTokenReachesUnroutedPool: a token without a pool
// (version 2: every cookie a front end without pools issues, that is
// every cookie of the release before pools) pins its backend by id in
// whatever pool holds it, including a pool no route sends this request to:
// after an upgrade that moves a backend into a restricted pool, any
// client's old cookie for it still reaches it with any host and path.
func TestAttackPoollessTokenReachesUnroutedPool(t *testing.T) {
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

// TestAttackDuplicateRouteHeader: a header a route tests, sent twice,
// is routed on its first line only while the backend gets both lines
// (and many read the last, or the two joined): the route and the backend
// disagree on the value. A front proxy that appends its own line after a
// client's forged one leaves the client's to choose the pool. Such a
// request should be refused (as a second Host is) or not match.
func TestAttackDuplicateRouteHeader(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, pools: [][]string{{"gold"}, nil},
			routes: []string{"pool=gold,header=X-Tenant:gold"}})
		got := rawRoundTrip(t, r.addr, "GET / HTTP/1.1\r\nHost: a.example\r\nX-Tenant: gold\r\nX-Tenant: bronze\r\n\r\n")
		if status, body := splitRaw(got); status == "200" && body == "b0" {
			t.Errorf("X-Tenant twice (gold, bronze): routed to pool gold on the first line; want 400 or no match")
		}
	})
}

// TestAttackNoRoute404NotCacheable: the 404 sluice makes when no route
// takes a request must not be stored by a shared cache in front: 404 is
// heuristically cacheable (RFC 9110 §15.1, RFC 9111 §4.2.2), and a
// request that misses the routes by an input the cache does not key on (a
// header route, a method) would then poison the URL for everyone.
func TestAttackNoRoute404NotCacheable(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, pools: [][]string{{"app"}},
			routes: []string{"pool=app,header=X-App:1"}})
		got := rawRoundTrip(t, r.addr, "GET /index.html HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
		if !strings.HasPrefix(got, "404\n") {
			t.Fatalf("no route: %q, want 404", got)
		}
		if !strings.Contains(got, "Cache-Control: no-store") && !strings.Contains(got, "Cache-Control: private") {
			t.Errorf("no-route 404 without Cache-Control: no-store (heuristically cacheable): %q", got)
		}
	})
}

// TestAttackCookieBypassesRouteAllowlist: with no default pool the routes
// are an allowlist (no route: 404). The sticky cookie (on by default) any
// client gets from one allowed request then carries every other request,
// whatever its path or host, to that pool's backend as affinity: no
// route, no ARM budget, no MOP. Publishing only /api/ of the API servers
// publishes all of them to anyone who first asks for /api/.
func TestAttackCookieBypassesRouteAllowlist(t *testing.T) {
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

// TestAttackLearnedSessionBypassesRouteAllowlist: the same as
// TestAttackCookieBypassesRouteAllowlist with the sticky cookie off and
// application sessions learned (-http-sticky-app-cookie JSESSIONID): the
// session id an allowed request got carries any other path to its pool.
func TestAttackLearnedSessionBypassesRouteAllowlist(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, pools: [][]string{{"api"}},
			routes: []string{"pool=api,path=/api/"},
			cfg:    Config{AppCookie: "JSESSIONID", StickyCookie: "-"}})
		be := r.backends[0]
		be.handler = func(ctx *fasthttp.RequestCtx) {
			if len(ctx.Request.Header.Cookie("JSESSIONID")) == 0 {
				ctx.Response.Header.Add("Set-Cookie", "JSESSIONID=sess-1; Path=/; HttpOnly")
			}
			ctx.SetBodyString(be.name + " " + string(ctx.Request.Header.RequestURI()))
		}
		got := rawRoundTrip(t, r.addr, "GET /api/login HTTP/1.1\r\nHost: www.example.com\r\n\r\n")
		if status, _ := splitRaw(got); status != "200" || rawSetCookie(got, "JSESSIONID") == "" {
			t.Fatalf("GET /api/login: %q, want 200 with a session", got)
		}
		got = rawRoundTrip(t, r.addr, "GET /internal/admin HTTP/1.1\r\nHost: www.example.com\r\nCookie: JSESSIONID=sess-1\r\n\r\n")
		if status, body := splitRaw(got); status != "404" {
			t.Errorf("GET /internal/admin with the session of /api/login: %s %q, want 404 (no route, no default pool)", status, body)
		}
	})
}
