package http

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/internal/benchcpu"
)

// BenchmarkCurveAdmitPick is the per-request decision of the pipeline
// without I/O (admit: route, affinity, ARM rules; pick: the pool's
// backend) on a parsed request, as the routes grow (1, 100 and 1,000
// path routes, the request taking the last) and as the ARM rules grow
// (0, 1, 10 and 100, all matching). The clock is injected: one
// microsecond per request.
func BenchmarkCurveAdmitPick(b *testing.B) {
	type point struct {
		series, path, want string
		n                  int
		rig                func(int) rigOpts
	}
	var points []point
	for _, n := range []int{1, 100, 1000} {
		points = append(points, point{"routes", fmt.Sprintf("/svc/%d/x", n-1), fmt.Sprintf("b%d", (n-1)%2), n, curveRoutesRig})
	}
	for _, n := range []int{0, 1, 10, 100} {
		points = append(points, point{"arm-rules", "/x", "", n, curveRulesRig})
	}
	for _, c := range points {
		b.Run(fmt.Sprintf("%s/n=%d", c.series, c.n), func(b *testing.B) {
			r := newRig(b, c.rig(c.n))
			s := r.srv
			var ctx fasthttp.RequestCtx
			ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}, nil)
			raw := "GET " + c.path + " HTTP/1.1\r\nHost: www.example.com\r\nUser-Agent: curve\r\n\r\n"
			if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
				b.Fatal(err)
			}
			h := &ctx.Request.Header
			var p plan
			var v reqView
			now := r.clock.Now()
			b.ReportAllocs()
			cpu0, ops := benchcpu.Now(), 0
			for b.Loop() {
				ops++
				now += int64(time.Microsecond)
				p = plan{}
				req, d := s.admit(&p, h, &v, now)
				if !s.pick(&p, &ctx.Response, &req, d, h, remoteAddr(&ctx)) {
					b.Fatal("refused")
				}
			}
			benchcpu.Report(b, cpu0, ops)
			if c.want != "" && p.b.ID() != c.want {
				b.Fatalf("picked %s, want %s", p.b.ID(), c.want)
			}
			if got := len(r.ctrl.Rules()); c.series == "arm-rules" && got != c.n {
				b.Fatalf("%d rules in force, want %d", got, c.n)
			}
		})
	}
}

// curveRoutesRig is n path routes alternating between pools p0 (backend
// b0) and p1 (b1), and a default pool (b2): the last route, /svc/<n-1>/,
// is the one the benchmark's request takes.
func curveRoutesRig(n int) rigOpts {
	o := rigOpts{backends: 3, cfg: Config{StickyCookie: "-", Engine: EngineLoop},
		pools: [][]string{{"p0"}, {"p1"}, nil}}
	for i := range n {
		o.routes = append(o.routes, fmt.Sprintf("pool=p%d,path=/svc/%d/", i%2, i))
	}
	return o
}

// curveRulesRig is one pool of two backends and n ARM rules that all
// match every request and never limit it.
func curveRulesRig(n int) rigOpts {
	o := rigOpts{backends: 2, cfg: Config{StickyCookie: "-", Engine: EngineLoop}}
	for i := range n {
		o.arm = append(o.arm, fmt.Sprintf("name=r%d,method=GET,limit=1000000000/s,action=reject", i))
	}
	return o
}

// BenchmarkCurveRoundTrip is a whole request through the loop engine on
// one keep-alive connection (client to balancer to backend and back, in
// process) as the routes grow (1 and 1,000 path routes, the request
// taking the last) and as the ARM rules grow (0 and 100, all matching):
// how much of a request each table's growth is.
func BenchmarkCurveRoundTrip(b *testing.B) {
	for _, c := range []struct {
		series string
		n      int
		rig    func(int) rigOpts
		path   string
		want   string
	}{
		{"routes", 1, curveRoutesRig, "/svc/0/x", "b0"},
		{"routes", 1000, curveRoutesRig, "/svc/999/x", "b1"},
		{"arm-rules", 0, curveRulesRig, "/x", ""},
		{"arm-rules", 100, curveRulesRig, "/x", ""},
	} {
		b.Run(fmt.Sprintf("%s/n=%d", c.series, c.n), func(b *testing.B) {
			r := newRig(b, c.rig(c.n))
			if c.series == "arm-rules" && len(r.ctrl.Rules()) != c.n {
				b.Fatalf("%d rules in force, want %d", len(r.ctrl.Rules()), c.n)
			}
			conn, err := net.Dial("tcp", r.addr)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			req := []byte("GET " + c.path + " HTTP/1.1\r\nHost: x\r\n\r\n")
			var resp fasthttp.Response
			b.ReportAllocs()
			cpu0, ops := benchcpu.Now(), 0
			for b.Loop() {
				ops++
				if _, err := conn.Write(req); err != nil {
					b.Fatal(err)
				}
				if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
					b.Fatal(err, resp.StatusCode())
				}
			}
			benchcpu.Report(b, cpu0, ops)
			if c.want != "" && string(resp.Body()) != c.want {
				b.Fatalf("answered by %s, want %s", resp.Body(), c.want)
			}
		})
	}
}
