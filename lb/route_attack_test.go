package lb

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Hostile inputs against route tables. Each test states the property a
// route table must keep; a failure is a finding.

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

// longPath is a path of about n bytes that no route of staticRegexTable
// matches: a client sends up to the 16 KiB head limit.
func longPath(n int) []byte { return []byte("/" + strings.Repeat("a", n)) }

// TestAttackRegexRouteCostBounded: the work Match does for one request
// does not grow with the length of a path the client chooses. Go's
// regexp has no DFA: past a few KiB of input it runs its NFA, at tens of
// ns per byte and per state, for every regex route still a candidate, in
// order, until one matches. With one route ~.*/t0\.(css|js) a 16 KB path
// costs about 200 times a 100-byte one (0.4 ms against 2 µs on the
// development machine; 100 such routes: 55 ms a request, so a few dozen
// requests a second fill a core). The bound asserted is loose (20 times)
// and compares two runs of the same code on the same machine, so load
// moves both sides alike.
func TestAttackRegexRouteCostBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("measures Match twice")
	}
	tab := staticRegexTable(t, 1)
	// Each side is timed over a fixed number of calls, the fastest of
	// three rounds (a few tens of milliseconds in all).
	cost := func(path []byte, calls int) float64 {
		in := RouteInput{Host: []byte("www.example.com"), Path: path}
		best := 0.0
		for range 3 {
			start := time.Now()
			for range calls {
				tab.Match(&in)
			}
			if ns := float64(time.Since(start).Nanoseconds()) / float64(calls); best == 0 || ns < best {
				best = ns
			}
		}
		return best
	}
	short, long := cost(longPath(100), 5000), cost(longPath(16000), 40)
	if long > 20*short {
		t.Errorf("Match with one regex route: %.0f ns for a 100-byte path, %.0f ns for a 16,000-byte one (%.0f times): the client's path length multiplies the cost of every regex route", short, long, long/short)
	}
}

// BenchmarkAttackRegexLongPath: the cost of Match for regex routes of
// the static-file kind against a path that matches none, by number of
// routes and path length.
func BenchmarkAttackRegexLongPath(b *testing.B) {
	for _, n := range []int{1, 10, 100} {
		tab := staticRegexTable(b, n)
		for _, l := range []int{100, 16000} {
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

// TestAttackIPv6HostSpellings: a route to a bracketed IPv6 host takes
// every spelling of that address a client may send (RFC 4291 allows
// several; backends parse the address, they do not compare text).
func TestAttackIPv6HostSpellings(t *testing.T) {
	tab := mustTable(t, "http", "pool=v6,host=[2001:db8::1]")
	for _, host := range []string{
		"[2001:db8::1]",
		"[2001:DB8::1]:8080",
		"[2001:db8:0:0::1]",
		"[2001:0db8::0001]",
		"[2001:db8:0:0:0:0:0:1]",
	} {
		in := RouteInput{Host: []byte(host), Path: []byte("/")}
		if got := tab.Match(&in); got != 0 {
			t.Errorf("Host %s: route %d, want 0 (host=[2001:db8::1])", host, got)
		}
	}
}

// TestAttackRouteUnmatchablePath: a path prefix or strip that is not in
// the normal form the front end matches requests in (no empty segments,
// dot-segments, ";parameters", '\' or percent-encoding: requests are
// matched decoded) can never match any request, so every request meant
// for its pool silently goes to the default pool (or 404). Such a route
// should be refused at start-up, naming the key and the value, as an ARM
// rule's path is warned about (http's unmatchable).
func TestAttackRouteUnmatchablePath(t *testing.T) {
	for _, s := range []string{
		"pool=x,path=/api//v1/",
		"pool=x,path=/api/./v1/",
		"pool=x,path=/api/../v1/",
		"pool=x,path=/%7Euser/",
		"pool=x,path=/caf%C3%A9/",
		"pool=x,path=/app;v=1/",
		`pool=x,path=/a\b/`,
		"pool=x,strip=/st%61tic",
	} {
		if r, err := ParseRouteSpec("http", s); err == nil {
			t.Errorf("ParseRouteSpec(%q) = %v, nil; want an error: the path can match no request", s, r)
		}
	}
}
