package lb

import (
	"fmt"
	"testing"

	"github.com/sluicelb/sluice/internal/benchcpu"
)

// The BenchmarkCurve* functions measure how the cost of one piece of the
// request path grows with its size: one sub-benchmark per size, named
// SERIES/n=SIZE, which bench/curves.sh runs and bench/plot draws (CPU ns per
// operation against size, log x).

// curveBackends are the pool sizes of the cost curves: a pair, a rack, a fleet.
var curveBackends = []int{2, 50, 500}

// BenchmarkCurvePick is one pick (and its release) per policy in one pool
// of 2, 50 and 500 backends of weights 1, 2, 3, 1, 2, 3, ...
func BenchmarkCurvePick(b *testing.B) {
	for _, pol := range PolicyNames {
		for _, n := range curveBackends {
			b.Run(fmt.Sprintf("%s/n=%d", pol, n), func(b *testing.B) {
				w := make([]int, n)
				for i := range w {
					w[i] = i%3 + 1
				}
				p := newPool(b, pol, w...)
				seen := make([]bool, n)
				key := uint64(0)
				b.ReportAllocs()
				cpu0, ops := benchcpu.Now(), 0
				for b.Loop() {
					ops++
					key++
					be, out, _ := p.Pick(int64(key), key*0x9e3779b97f4a7c15, nil)
					if out != Picked {
						b.Fatal(out)
					}
					be.Acquire()
					be.Release(int64(key), OK)
					seen[be.Index()] = true
				}
				benchcpu.Report(b, cpu0, ops)
				if b.N >= 100*n {
					for i, s := range seen {
						if !s {
							b.Fatalf("backend %d of %d never picked in %d picks", i, n, b.N)
						}
					}
				}
			})
		}
	}
}

// curveRoutes are the route counts of the cost curves; regex routes stop at
// MaxRegexRoutes, the most a table takes.
var curveRoutes = []int{1, 100, 1000}

// curveRouteCase is one kind of route: the spec of route i and the input
// that only route last matches.
type curveRouteCase struct {
	name  string
	proto string
	spec  func(i int) string
	hit   func(last int) RouteInput
	sizes []int
}

var curveRouteCases = []curveRouteCase{
	{"http-host", "http",
		func(i int) string { return fmt.Sprintf("pool=p%d,host=svc%d.example.com", i, i) },
		func(l int) RouteInput {
			return RouteInput{Host: fmt.Appendf(nil, "Svc%d.example.com:443", l), Path: []byte("/index.html"), Method: []byte("GET")}
		}, curveRoutes},
	{"http-path-prefix", "http",
		func(i int) string { return fmt.Sprintf("pool=p%d,path=/svc%d/", i, i) },
		func(l int) RouteInput {
			return RouteInput{Host: []byte("www.example.com"), Path: fmt.Appendf(nil, "/svc%d/api/v1/users", l), Method: []byte("GET")}
		}, curveRoutes},
	{"http-regex", "http",
		func(i int) string { return fmt.Sprintf("pool=p%d,path=~/r%d/[0-9]+/item", i, i) },
		func(l int) RouteInput {
			return RouteInput{Host: []byte("www.example.com"), Path: fmt.Appendf(nil, "/r%d/12345/item", l), Method: []byte("GET")}
		}, []int{1, 10, MaxRegexRoutes}},
	{"sip-domain", "sip",
		func(i int) string { return fmt.Sprintf("pool=p%d,domain=d%d.voice.example", i, i) },
		func(l int) RouteInput {
			return RouteInput{Host: fmt.Appendf(nil, "d%d.voice.example", l), Path: []byte("alice"), Method: []byte("INVITE")}
		}, curveRoutes},
	{"sip-user-prefix", "sip",
		func(i int) string { return fmt.Sprintf("pool=p%d,user=+44%d", i, 1000+i) },
		func(l int) RouteInput {
			return RouteInput{Host: []byte("voice.example"), Path: fmt.Appendf(nil, "+44%d79460000", 1000+l), Method: []byte("INVITE")}
		}, curveRoutes},
}

// BenchmarkCurveRoute is route choice as the table grows, for a request
// only the last route takes: HTTP host, path prefix and path regex, SIP
// domain and user prefix.
func BenchmarkCurveRoute(b *testing.B) {
	for _, c := range curveRouteCases {
		for _, n := range c.sizes {
			specs := make([]string, n)
			for i := range specs {
				specs[i] = c.spec(i)
			}
			tab := mustTable(b, c.proto, specs...)
			in := c.hit(n - 1)
			if got := tab.Select(&in); got != n-1 {
				b.Fatalf("%s n=%d: input selects route %d, want %d", c.name, n, got, n-1)
			}
			b.Run(fmt.Sprintf("%s/n=%d", c.name, n), func(b *testing.B) {
				b.ReportAllocs()
				cpu0, ops := benchcpu.Now(), 0
				for b.Loop() {
					ops++
					tab.Select(&in)
				}
				benchcpu.Report(b, cpu0, ops)
			})
		}
	}
}
