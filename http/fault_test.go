package http

import (
	"bufio"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// holeConn reads a request and never answers: the backend is hung. If
// clock is set it is moved on by took when the request arrives, as if the
// backend had held the request that long (so that the timeout lands that
// much later on the balancer's clock).
func holeConn(clock *atomic.Pointer[admission.ManualClock], took time.Duration) func(net.Conn) {
	return func(c net.Conn) {
		buf := make([]byte, 4096)
		if _, err := c.Read(buf); err != nil {
			return
		}
		if clk := clock.Load(); clk != nil {
			clk.Advance(took)
		}
		for {
			if _, err := c.Read(buf); err != nil {
				return // the balancer gave up and closed it, or the test ended
			}
		}
	}
}

// quiet waits until no request is outstanding on any backend and the
// goroutine count holds still for 100 ms, and returns that count; with
// max >= 0 it fails the test unless the count gets down to max.
func (r *rig) quiet(t *testing.T, max int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	last, since := -1, time.Now()
	for {
		var out int64
		for _, b := range r.pool.Backends() {
			out += b.Outstanding()
		}
		g := runtime.NumGoroutine()
		if g != last {
			last, since = g, time.Now()
		}
		if out == 0 && time.Since(since) >= 100*time.Millisecond && (max < 0 || g <= max) {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("left over: %d outstanding, %d goroutines (want at most %d)", out, g, max)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFaultHTTPBlackHole: backend b0 accepts and never answers. Each
// idempotent request it takes moves to b1 after the first-byte timeout,
// so every client gets 200; the timeouts are charged when they fire
// (each request here holds the backend 30 s on the balancer's clock,
// three times the 10 s cool-down), so after two of them b0 is ejected
// and later work never goes to it; a POST is never sent twice (504).
// Nothing piles up: no request outstanding, no goroutine left.
func TestFaultHTTPBlackHole(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		var clock atomic.Pointer[admission.ManualClock]
		var ejected atomic.Int32
		r := newRig(t, rigOpts{backends: 2, policy: "round-robin", raw: holeConn(&clock, 30*time.Second),
			cfg:     Config{BackendTimeout: 150 * time.Millisecond, StickyCookie: "-"},
			passive: lb.PassiveConfig{MaxFails: 2, Cooldown: 10 * time.Second, OnEject: func(*lb.Backend, lb.Result, int64) { ejected.Add(1) }}})
		clock.Store(r.clock)
		hole := r.pool.Backends()[0]
		for i := range 12 {
			if rep := r.get("/x", ""); rep.status != 200 || rep.body != "b1" {
				t.Fatalf("GET %d with a hung backend: %d %q, want 200 from b1", i, rep.status, rep.body)
			}
		}
		if s := hole.State(r.clock.Now()); s != lb.Down {
			t.Fatalf("hung backend is %v after its timeouts, want down (ejected)", s)
		}
		took := r.backends[0].hits.Load()
		if took != 2 || ejected.Load() != 1 {
			t.Errorf("hung backend took %d requests (ejections %d), want 2 (the ejection threshold) and 1", took, ejected.Load())
		}
		for range 10 {
			if rep := r.get("/y", ""); rep.status != 200 || rep.body != "b1" {
				t.Fatalf("GET while ejected: %d %q", rep.status, rep.body)
			}
		}
		if n := r.backends[0].hits.Load(); n != took {
			t.Errorf("new work went to the ejected backend: %d more requests", n-took)
		}
		// After the cool-down: on probation, one more timeout ejects it
		// again, and nothing grows with the timed-out requests.
		g0 := r.quiet(t, -1)
		for round := range 5 {
			r.clock.Advance(time.Minute)
			for range 4 {
				if rep := r.get("/z", ""); rep.status != 200 || rep.body != "b1" {
					t.Fatalf("GET after cool-down %d: %d %q", round, rep.status, rep.body)
				}
			}
		}
		if n := r.backends[0].hits.Load(); n != took+5 {
			t.Errorf("hung backend took %d requests in 5 cool-downs on probation, want 5", n-took)
		}
		r.quiet(t, g0+2)
	})
}

// TestFaultHTTPBlackHoleNotIdempotent: with the hung backend as the only
// one, a POST gets 504 after the first-byte timeout and reached it once;
// a GET has nowhere else to go and gets 504 too.
func TestFaultHTTPBlackHoleNotIdempotent(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		var clock atomic.Pointer[admission.ManualClock]
		r := newRig(t, rigOpts{backends: 1, raw: holeConn(&clock, 0), cfg: Config{BackendTimeout: 100 * time.Millisecond, StickyCookie: "-"}})
		if rep := r.do("POST", "/p", "", strings.NewReader("body")); rep.status != 504 {
			t.Errorf("POST to a hung backend: %d, want 504", rep.status)
		}
		if rep := r.get("/g", ""); rep.status != 504 {
			t.Errorf("GET to the only, hung backend: %d, want 504", rep.status)
		}
		if n := r.backends[0].hits.Load(); n != 2 {
			t.Errorf("hung backend got %d connections, want 2 (no request sent twice)", n)
		}
		// Ten more timed-out requests leave nothing behind.
		g0 := r.quiet(t, -1)
		for range 10 {
			if rep := r.get("/g", ""); rep.status != 504 {
				t.Fatalf("GET to the only, hung backend: %d, want 504", rep.status)
			}
		}
		r.quiet(t, g0+2)
	})
}

// TestFaultHTTPBadBackends: a backend that resets connections and one
// that answers garbage. Idempotent requests move to the good backend and
// succeed; the bad one is ejected after MaxFails.
func TestFaultHTTPBadBackends(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(net.Conn)
	}{
		{"reset", func(c net.Conn) {
			bufio.NewReader(c).ReadString('\n')
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // RST, not FIN
			}
		}},
		{"garbage", func(c net.Conn) {
			bufio.NewReader(c).ReadString('\n')
			c.Write([]byte("HELLO THERE\r\n\x00\x01\x02\r\n\r\n"))
		}},
		{"closes", func(c net.Conn) {
			bufio.NewReader(c).ReadString('\n')
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onEngines(t, func(t *testing.T) {
				r := newRig(t, rigOpts{backends: 2, policy: "round-robin", raw: tc.serve, cfg: Config{StickyCookie: "-"},
					passive: lb.PassiveConfig{MaxFails: 3, Cooldown: time.Minute}})
				for i := range 12 {
					if rep := r.get("/x", ""); rep.status != 200 || rep.body != "b1" {
						t.Fatalf("GET %d: %d %q, want 200 from b1", i, rep.status, rep.body)
					}
				}
				if s := r.pool.Backends()[0].State(r.clock.Now()); s != lb.Down {
					t.Errorf("bad backend is %v, want down (ejected)", s)
				}
				if n := r.backends[0].hits.Load(); n < 3 || n > 6 {
					// 3 failures eject; a stale keep-alive retry may add one each.
					t.Errorf("bad backend took %d connections, want 3 to 6", n)
				}
				// More rounds after the cool-down (probation: one failure
				// ejects again) leave nothing behind.
				g0 := r.quiet(t, -1)
				for range 5 {
					r.clock.Advance(2 * time.Minute)
					for range 4 {
						if rep := r.get("/x", ""); rep.status != 200 || rep.body != "b1" {
							t.Fatalf("GET on probation: %d %q", rep.status, rep.body)
						}
					}
				}
				r.quiet(t, g0+2)
			})
		})
	}
}

// TestFaultHTTP503RetryAfter: a backend answering 503 with Retry-After
// gets no new work for that long (the 503 itself is relayed), its sticky
// client still reaches it, and it takes new work again after it.
func TestFaultHTTP503RetryAfter(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2, policy: "round-robin"})
		var busy atomic.Bool
		busy.Store(true)
		r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
			if busy.Load() {
				ctx.Response.Header.Set("Retry-After", "30")
				ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
				ctx.SetBodyString("busy")
				return
			}
			ctx.SetBodyString("b0")
		}
		var pin string
		for i := 0; pin == ""; i++ {
			rep := r.get("/", "")
			if rep.status == 503 {
				if rep.header.Get("Retry-After") != "30" {
					t.Fatalf("the backend's 503 relayed without its Retry-After: %v", rep.header)
				}
				pin = stickyFrom(t, rep)
			}
			if i > 4 {
				t.Fatal("round robin never reached b0")
			}
		}
		hits := r.backends[0].hits.Load()
		for range 10 {
			if rep := r.get("/", ""); rep.status != 200 || rep.body != "b1" {
				t.Fatalf("new work while b0 asked for 30 s off: %d %q", rep.status, rep.body)
			}
		}
		if r.backends[0].hits.Load() != hits {
			t.Fatal("new work reached b0 within its Retry-After")
		}
		busy.Store(false)
		if rep := r.get("/", pin); rep.body != "b0" {
			t.Errorf("sticky client of b0 within its Retry-After: %d %q, want b0", rep.status, rep.body)
		}
		r.clock.Advance(31 * time.Second)
		seen := map[string]int{}
		for range 4 {
			seen[r.get("/", "").body]++
		}
		if seen["b0"] == 0 {
			t.Errorf("b0 got no new work after its Retry-After: %v", seen)
		}
	})
}

// TestFaultParseRetryAfter: seconds and HTTP dates, and what is refused.
func TestFaultParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"30", 30 * time.Second, true},
		{"0", 0, false},
		{"", 0, false},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"99999999999", 0, false},
		{"Fri, 02 Jan 2026 03:05:05 GMT", time.Minute, true},
		{"Fri, 02 Jan 2026 03:04:00 GMT", 0, false}, // past
		{"soon", 0, false},
	} {
		got, ok := parseRetryAfter([]byte(tc.in), now)
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
