package lb

import (
	"fmt"
	"testing"
)

// benchRoutes builds n routes of proto, a mix of the conditions operators
// write most: HTTP host, wildcard host, path prefix and host+path; SIP
// domain, user prefix, domain+user and method+user.
func benchRoutes(b *testing.B, proto string, n int) *RouteTable {
	var specs []string
	for i := range n {
		var s string
		switch proto {
		case "http":
			switch i % 4 {
			case 0:
				s = fmt.Sprintf("pool=p%d,host=svc%d.example.com", i, i)
			case 1:
				s = fmt.Sprintf("pool=p%d,path=/svc%d/", i, i)
			case 2:
				s = fmt.Sprintf("pool=p%d,host=*.t%d.example.com", i, i)
			case 3:
				s = fmt.Sprintf("pool=p%d,host=app.example.com,path=/app%d/,method=GET", i, i)
			}
		case "sip":
			switch i % 4 {
			case 0:
				s = fmt.Sprintf("pool=p%d,domain=d%d.voice.example", i, i)
			case 1:
				s = fmt.Sprintf("pool=p%d,user=+44%d", i, 1000+i)
			case 2:
				s = fmt.Sprintf("pool=p%d,domain=voice.example,user=+1%d", i, 1000+i)
			case 3:
				s = fmt.Sprintf("pool=p%d,method=INVITE,user=+33%d", i, 1000+i)
			}
		}
		specs = append(specs, s)
	}
	return mustTable(b, proto, specs...)
}

// BenchmarkRouteMatch: route selection at 1, 10, 100 and 1,000 routes,
// for a request that takes the last route and for one that matches
// nothing (every route ruled out).
func BenchmarkRouteMatch(b *testing.B) {
	for _, proto := range []string{"http", "sip"} {
		for _, n := range []int{1, 10, 100, 1000} {
			tab := benchRoutes(b, proto, n)
			last := n - 1
			var hit, miss RouteInput
			switch proto {
			case "http":
				hit = RouteInput{Host: []byte(fmt.Sprintf("svc%d.example.com:8080", last)), Path: []byte("/index.html"), Method: []byte("GET")}
				switch last % 4 {
				case 1:
					hit = RouteInput{Host: []byte("www.example.com"), Path: []byte(fmt.Sprintf("/svc%d/x/y.css", last)), Method: []byte("GET")}
				case 3:
					hit = RouteInput{Host: []byte("App.Example.com"), Path: []byte(fmt.Sprintf("/app%d/api/v1/users", last)), Method: []byte("HEAD")}
				}
				miss = RouteInput{Host: []byte("www.example.org"), Path: []byte("/nothing/here/index.html"), Method: []byte("GET")}
			case "sip":
				hit = RouteInput{Host: []byte(fmt.Sprintf("d%d.voice.example", last)), Path: []byte("alice"), Method: []byte("INVITE")}
				switch last % 4 {
				case 1:
					hit = RouteInput{Host: []byte("x.example"), Path: []byte(fmt.Sprintf("+44%d79460000", 1000+last)), Method: []byte("INVITE")}
				case 3:
					hit = RouteInput{Host: []byte("x.example"), Path: []byte(fmt.Sprintf("+33%d000", 1000+last)), Method: []byte("INVITE")}
				}
				miss = RouteInput{Host: []byte("other.example"), Path: []byte("+4930123456"), Method: []byte("OPTIONS")}
			}
			if got := tab.Match(&hit); got != last {
				b.Fatalf("%s %d routes: hit input matches %d (%v), want %d", proto, n, got, specAt(tab, got), last)
			}
			if got := tab.Match(&miss); got != -1 {
				b.Fatalf("%s %d routes: miss input matches %d (%v)", proto, n, got, specAt(tab, got))
			}
			for _, c := range []struct {
				name string
				in   *RouteInput
			}{{"last", &hit}, {"none", &miss}} {
				b.Run(fmt.Sprintf("%s/routes=%d/%s", proto, n, c.name), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						tab.Match(c.in)
					}
				})
			}
		}
	}
}
