package http

import (
	"bufio"
	"net"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestHotPathAllocs: admitting, picking and rewriting a request and its
// answer (the pipeline's steps both engines take) allocate nothing once
// buffers are warm.
func TestHotPathAllocs(t *testing.T) {
	r := newRig(t, rigOpts{backends: 2, policy: "consistent-hash"})
	s := r.srv
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}, nil)
	raw := "GET /api/x HTTP/1.1\r\nHost: example.com\r\nUser-Agent: wrk\r\nX-Forwarded-For: 203.0.113.9\r\nKeep-Alive: 5\r\n\r\n"
	if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	ctx.Response.Header.Set("Content-Type", "text/plain")
	ctx.Response.SetBodyString("b1\n")
	h := &ctx.Request.Header
	now := r.clock.Now()
	var p plan
	var v reqView
	picked := true
	run := func() {
		ip := remoteAddr(&ctx)
		req, d := s.admit(&p, h, &v, now)
		picked = s.pick(&p, &ctx.Response, &req, d, h, ip)
		s.prepareRequest(h, ip, false)
		p.renew = true
		s.prepareResponse(&ctx.Response.Header, &p, ip)
		ctx.Response.Header.Del("Set-Cookie")
		h.Del(loopHeader) // each request arrives without this Server's mark
	}
	run()
	if !picked || p.b == nil {
		t.Fatal("the request was not admitted to a backend")
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Errorf("hot path allocates %v times per request, want 0", n)
	}
}

// BenchmarkPrepareRequest measures the header rewrite of a minimal request.
func BenchmarkPrepareRequest(b *testing.B) {
	b.ReportAllocs()
	var ctx fasthttp.RequestCtx
	ctx.Init(&fasthttp.Request{}, &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 5555}, nil)
	raw := "GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
	if err := ctx.Request.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		b.Fatal(err)
	}
	s := &Server{}
	ip := remoteAddr(&ctx)
	for b.Loop() {
		s.prepareRequest(&ctx.Request.Header, ip, false)
	}
}

func TestHeaderBits(t *testing.T) {
	for i, k := range hopByHop {
		if got := headerBit([]byte(k)); got != 1<<i {
			t.Errorf("headerBit(%q) = %b, want %b", k, got, 1<<i)
		}
		if got := headerBit([]byte(strings.ToLower(k))); got != 1<<i {
			t.Errorf("headerBit(lower %q) = %b, want %b", k, got, 1<<i)
		}
	}
	for _, k := range []string{"X-Forwarded-For", "Forwarded", "X-Forwarded-Proto"} {
		if headerBit([]byte(k)) == 0 || headerBit([]byte(k))&hHopByHop != 0 {
			t.Errorf("headerBit(%q) = %b", k, headerBit([]byte(k)))
		}
	}
	for _, k := range []string{"", "Host", "Content-Length", "Connectionx", "X-Forwarded-Fox"} {
		if got := headerBit([]byte(k)); got != 0 {
			t.Errorf("headerBit(%q) = %b, want 0", k, got)
		}
	}
}
