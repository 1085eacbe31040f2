//go:build linux

package http

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/internal/uring"
)

// requireRing skips where the kernel refuses io_uring: -http-io-uring
// falls back there (TestLoopIOURingFallsBack), there is no ring to test.
func requireRing(t *testing.T) {
	t.Helper()
	r, err := uring.New(1)
	if err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	r.Close()
}

// TestLoopIOURingWrites: with Config.IOURing the loop's writes to plain
// clients and backends go through its ring, and what the clients get is
// what they get without it: sequential and pipelined requests, a body
// upstream, an answer larger than a socket takes at once. Without the
// option the ring is not used.
func TestLoopIOURingWrites(t *testing.T) {
	requireRing(t)
	big := strings.Repeat("z", 3<<20)
	for _, on := range []bool{true, false} {
		name := map[bool]string{true: "on", false: "off"}[on]
		t.Run(name, func(t *testing.T) {
			r := loopRig(t, rigOpts{backends: 2, cfg: Config{IOURing: on}})
			for _, be := range r.backends {
				be.handler = func(ctx *fasthttp.RequestCtx) {
					switch p := string(ctx.Path()); p {
					case "/big":
						ctx.SetBodyString(big)
					case "/echo":
						ctx.SetBody(ctx.PostBody())
					default:
						ctx.SetBodyString(p)
					}
				}
			}
			for i := range 10 {
				if rep := r.get("/n", ""); rep.status != 200 || rep.body != "/n" {
					t.Fatalf("GET %d: %d %q", i, rep.status, rep.body)
				}
			}
			post := strings.Repeat("p", 40<<10)
			if rep := r.do("POST", "/echo", "", strings.NewReader(post)); rep.status != 200 || rep.body != post {
				t.Fatalf("POST 40 KiB: %d, %d bytes back", rep.status, len(rep.body))
			}
			if rep := r.get("/big", ""); rep.status != 200 || rep.body != big {
				t.Fatalf("GET /big: %d, %d bytes", rep.status, len(rep.body))
			}
			rc := dialRaw(t, r.addr)
			var all bytes.Buffer
			paths := []string{"/a", "/b", "/c", "/d"}
			for _, p := range paths {
				all.WriteString("GET " + p + " HTTP/1.1\r\nHost: x\r\n\r\n")
			}
			rc.send(all.String())
			for _, want := range paths {
				if resp, body := rc.read("GET"); resp.StatusCode != 200 || body != want {
					t.Fatalf("pipelined: %d %q, want 200 %q", resp.StatusCode, body, want)
				}
			}
			sends := r.srv.loops.Load().uringSends.Load()
			// Each of the 16 requests is one send to its backend and at
			// least one to its client.
			if on && sends < 32 {
				t.Errorf("with the ring: %d sends through it, want at least 32", sends)
			}
			if !on && sends != 0 {
				t.Errorf("without the ring: %d sends through it, want 0", sends)
			}
		})
	}
}

// TestLoopIOURingFallsBack: where io_uring cannot be set up the loop
// says so once, naming the flag, and serves with plain writes.
func TestLoopIOURingFallsBack(t *testing.T) {
	defer func(f func(uint32) (*uring.Ring, error)) { newRing = f }(newRing)
	newRing = func(uint32) (*uring.Ring, error) {
		return nil, errors.New("uring: io_uring_setup: operation not permitted")
	}
	buf := &syncWriter{w: &bytes.Buffer{}}
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{IOURing: true, Loops: 2}, logger: slog.New(slog.NewTextHandler(buf, nil))})
	for range 3 {
		if rep := r.get("/", ""); rep.status != 200 {
			t.Fatalf("GET: %d %q", rep.status, rep.body)
		}
	}
	out := buf.String()
	if strings.Count(out, "-http-io-uring") != 1 || !strings.Contains(out, "level=WARN") || !strings.Contains(out, "operation not permitted") {
		t.Errorf("log, want one WARN naming -http-io-uring and the error:\n%s", out)
	}
	if got := r.srv.loops.Load().uringSends.Load(); got != 0 {
		t.Errorf("%d sends through a ring that could not be set up", got)
	}
}
