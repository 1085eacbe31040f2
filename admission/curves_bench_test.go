package admission

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicelb/sluice/internal/benchcpu"
)

// curveRule is rule i of a set every request in BenchmarkCurveRules falls
// under: the shapes operators write (protocol, method, host, path prefix,
// pool) in turn, none of them ever limiting.
func curveRule(i int, hit bool) RuleConfig {
	host, prefix, pool := "api.example.com", "/api/", "api"
	if !hit {
		host, prefix, pool = fmt.Sprintf("h%d.example.com", i), fmt.Sprintf("/p%d/", i), fmt.Sprintf("p%d", i)
	}
	m := [...]Match{
		{Proto: "http", Method: "GET"},
		{Host: host},
		{Proto: "http", PathPrefix: prefix},
		{Pool: pool},
		{Method: "get", Host: host, PathPrefix: prefix},
	}[i%5]
	if !hit && m.Host == "" && m.PathPrefix == "" && m.Pool == "" {
		m.Method = "POST"
	}
	return RuleConfig{Name: fmt.Sprintf("r%d", i), Match: m, Limit: 1<<31 - 1, Unit: time.Hour}
}

// BenchmarkCurveRules is Controller.Decide, what a front end calls for
// each request of new work, as the ARM rule set grows: 0, 1, 10 and 100
// rules that all match the request (each meter counts it: the set is
// walked to the end) and, for comparison, that all miss it. The clock is
// injected: one microsecond per request.
func BenchmarkCurveRules(b *testing.B) {
	for _, hit := range []bool{true, false} {
		series := "all-match"
		if !hit {
			series = "none-match"
		}
		for _, n := range []int{0, 1, 10, 100} {
			b.Run(fmt.Sprintf("%s/n=%d", series, n), func(b *testing.B) {
				rules := make([]RuleConfig, n)
				for i := range rules {
					rules[i] = curveRule(i, hit)
				}
				c, err := NewController(ControllerConfig{Rules: rules}, nil, 0)
				if err != nil {
					b.Fatal(err)
				}
				r := &Request{Proto: "http", Method: "HEAD", Host: "api.example.com", Path: "/api/v1/users", Pool: "api"}
				for i := range rules {
					if got := rules[i].Match.Matches(r); got != hit {
						b.Fatalf("rule %d (%+v) matches: %v, want %v", i, rules[i].Match, got, hit)
					}
				}
				now := int64(time.Hour)
				b.ReportAllocs()
				cpu0, ops := benchcpu.Now(), 0
				for b.Loop() {
					ops++
					now += int64(time.Microsecond)
					if d := c.Decide(now, r, nil); d.Verdict != Admit {
						b.Fatalf("verdict %v by rule %d", d.Verdict, d.Rule)
					}
				}
				benchcpu.Report(b, cpu0, ops)
			})
		}
	}
}
