package lb

import (
	"fmt"
	"strings"
	"testing"
)

// Hostile inputs against route tables: what a client chooses must not
// make a route table slow, and what an operator writes must be able to
// match.

// staticRegexTable is n routes of the kind operators write for static
// files (nginx's location ~* \.(css|js)$): a regular expression without
// a literal prefix, which every request is a candidate for.
func staticRegexTable(tb testing.TB, n int) *RouteTable {
	var specs []string
	for i := range n {
		specs = append(specs, fmt.Sprintf(`pool=p%d,path=~.*/t%d\.(css|js)`, i, i))
	}
	return mustTable(tb, "http", specs...)
}

// longPath is a path of n bytes that no route of staticRegexTable
// matches.
func longPath(n int) []byte { return []byte("/" + strings.Repeat("a", n-1)) }

// TestRegexRouteInputLimit: a regular expression is run on at most
// MaxRouteRegexInput bytes: a longer path does not match a regex route
// (whatever the expression), so the cost of a request stays bounded by
// the limit, not by the path a client chooses; a prefix route still
// matches it. HasRegex tells the front end to refuse such paths first.
func TestRegexRouteInputLimit(t *testing.T) {
	tab := mustTable(t, "http", "pool=re,path=~/a.*", "pool=pre,path=/a")
	if !tab.HasRegex() {
		t.Error("HasRegex() = false for a table with path=~")
	}
	if mustTable(t, "http", "pool=a,path=/a").HasRegex() || (*RouteTable)(nil).HasRegex() {
		t.Error("HasRegex() = true for a table without regex routes")
	}
	for _, tc := range []struct {
		n    int
		want int
	}{
		{2, 0},
		{100, 0},
		{MaxRouteRegexInput, 0},
		{MaxRouteRegexInput + 1, 1}, // the regex route is skipped, the prefix route takes it
		{16000, 1},
	} {
		in := RouteInput{Path: longPath(tc.n)}
		if got := tab.Match(&in); got != tc.want {
			t.Errorf("a %d-byte path: route %d, want %d", tc.n, got, tc.want)
		}
	}
}

// TestRegexRouteCount: a table holds at most MaxRegexRoutes regex routes
// (each one costs every request that reaches it); prefix routes are not
// counted.
func TestRegexRouteCount(t *testing.T) {
	build := func(nregex int) error {
		var routes []RouteSpec
		for i := range nregex {
			routes = append(routes, mustRoute(t, "http", fmt.Sprintf(`pool=p,path=~/r%d/.*`, i)))
		}
		for i := range 100 {
			routes = append(routes, mustRoute(t, "http", fmt.Sprintf("pool=p,path=/p%d/", i)))
		}
		_, err := NewRouteTable("http", routes)
		return err
	}
	if err := build(MaxRegexRoutes); err != nil {
		t.Errorf("%d regex routes: %v", MaxRegexRoutes, err)
	}
	err := build(MaxRegexRoutes + 1)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d", MaxRegexRoutes)) || !strings.Contains(err.Error(), "route 65") {
		t.Errorf("%d regex routes: %v, want an error naming route 65 and the limit", MaxRegexRoutes+1, err)
	}
}

func mustRoute(t testing.TB, proto, s string) RouteSpec {
	t.Helper()
	r, err := ParseRouteSpec(proto, s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// BenchmarkRegexLongPath: the cost of Match for regex routes of the
// static-file kind against a path that matches none, by number of routes
// and path length: past MaxRouteRegexInput it no longer grows.
func BenchmarkRegexLongPath(b *testing.B) {
	for _, n := range []int{1, 10, MaxRegexRoutes} {
		tab := staticRegexTable(b, n)
		for _, l := range []int{100, MaxRouteRegexInput, 16000} {
			in := RouteInput{Host: []byte("www.example.com"), Path: longPath(l)}
			b.Run(fmt.Sprintf("routes=%d/path=%d", n, l), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if tab.Match(&in) != -1 {
						b.Fatal("matched")
					}
				}
			})
		}
	}
}

// TestIPv6HostSpellings: a route to a bracketed IPv6 host takes every
// spelling of that address a client may send (RFC 4291 §2.2; backends
// parse the address, they do not compare text), and no other address.
func TestIPv6HostSpellings(t *testing.T) {
	tab := mustTable(t, "http", "pool=v6,host=[2001:db8::1]", "pool=v4mapped,host=[::ffff:192.0.2.1]")
	for _, tc := range []struct {
		host string
		want int
	}{
		{"[2001:db8::1]", 0},
		{"[2001:DB8::1]:8080", 0},
		{"[2001:db8:0:0::1]", 0},
		{"[2001:0db8::0001]", 0},
		{"[2001:db8:0:0:0:0:0:1]", 0},
		{"[2001:db8::1].", 0},
		{"[2001:db8::2]", -1},
		{"[2001:db8::1%eth0]", -1}, // a zone is another address
		{"[2001:db8::1", -1},
		{"2001:db8::1", -1},
		{"[::FFFF:192.0.2.1]", 1},
		{"[::ffff:c000:201]", 1},
		{"192.0.2.1", -1},
	} {
		in := RouteInput{Host: []byte(tc.host), Path: []byte("/")}
		if got := tab.Match(&in); got != tc.want {
			t.Errorf("Host %s: route %d, want %d", tc.host, got, tc.want)
		}
	}
	in := RouteInput{Host: []byte("[2001:0DB8:0:0:0:0:0:0001]:443"), Path: []byte("/")}
	if n := testing.AllocsPerRun(100, func() { tab.Match(&in) }); n != 0 {
		t.Errorf("Match of a long IPv6 spelling: %.1f allocs, want 0", n)
	}
}

// TestRouteUnmatchablePath: a path prefix or strip that is not in the
// normal form the front end matches requests in (no empty or dot
// segments, no ";parameters", '\', '?', '#', percent-encoding or byte
// outside ASCII: requests are matched decoded) can never match a request:
// it is refused, naming the key, the value and the normal form. The last
// segment of a prefix may begin with a dot (/api/. is a prefix of
// /api/.well-known); a regex path is kept as written.
func TestRouteUnmatchablePath(t *testing.T) {
	for _, tc := range []struct{ spec, why string }{
		{"pool=x,path=/api//v1/", "empty segment"},
		{"pool=x,path=/api/./v1/", "a . segment"},
		{"pool=x,path=/api/../v1/", "a .. segment"},
		{"pool=x,path=/%7Euser/", "percent-escape"},
		{"pool=x,path=/caf%C3%A9/", "percent-escape"},
		{"pool=x,path=/café/", "outside ASCII"},
		{"pool=x,path=/app;v=1/", ";parameter"},
		{`pool=x,path=/a\b/`, `a \`},
		{"pool=x,path=/a?b", "a ?"},
		{"pool=x,path=/a#b", "a #"},
		{"pool=x,strip=/st%61tic", "percent-escape"},
		{"pool=x,strip=/a//b", "empty segment"},
	} {
		r, err := ParseRouteSpec("http", tc.spec)
		key, val, _ := strings.Cut(strings.TrimPrefix(tc.spec, "pool=x,"), "=")
		if err == nil {
			t.Errorf("ParseRouteSpec(%q) = %v, nil; want an error: the path can match no request", tc.spec, r)
			continue
		}
		for _, want := range []string{key + " " + fmt.Sprintf("%q", val), tc.why, "write the path in normal form"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("ParseRouteSpec(%q): %v; want it to say %q", tc.spec, err, want)
			}
		}
	}
	for _, s := range []string{
		"pool=x,path=/api/",
		"pool=x,path=/api/.",
		"pool=x,path=/api/..x",
		"pool=x,path=/",
		"pool=x,path=/a-b_c~d!$&'()*+=:@/",
		"pool=x,path=~/a//b;c%20",
		"pool=x,path=/static/,strip=/static",
	} {
		if _, err := ParseRouteSpec("http", s); err != nil {
			t.Errorf("ParseRouteSpec(%q): %v, want it accepted", s, err)
		}
	}
}
