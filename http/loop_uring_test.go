//go:build linux

package http

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	nethttp "net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/internal/uring"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
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
// clients and backends and its first reads of a round go through its
// ring, and what the clients get is
// what they get without it: sequential and pipelined requests, a body
// upstream, an answer larger than a socket takes at once. Without the
// option the ring is not used.
func TestLoopIOURingWrites(t *testing.T) {
	requireRing(t)
	big := strings.Repeat("z", 3<<20)
	defer func(n int) { ringMinBatch = n }(ringMinBatch)
	ringMinBatch = 1 // the requests come one at a time: through the ring all the same
	for _, on := range []bool{true, false} {
		name := map[bool]string{true: "on", false: "off"}[on]
		t.Run(name, func(t *testing.T) {
			if !on && suiteIOURing {
				t.Skip("SLUICE_TEST_HTTP_IO_URING=1 turns the ring on in every rig")
			}
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
			e := r.srv.loops.Load()
			sends, recvs := e.uringSends.Load(), e.uringRecvs.Load()
			// Each of the 16 requests is a send to its client, and on a
			// reused backend connection one to the backend; the answers
			// and the requests on idle connections are reads.
			if on && (sends < 28 || recvs < 16) {
				t.Errorf("with the ring: %d sends and %d reads through it, want at least 28 and 16", sends, recvs)
			}
			t.Logf("%d sends, %d reads through the ring", sends, recvs)
			// The same, and how many loops have a ring, as metrics.
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(r.srv.Collector())
			rings := 0
			if on {
				rings = len(e.loops)
			}
			want := fmt.Sprintf(`
# HELP sluice_http_io_uring_loops Event loops of the loop engine that batch their plain socket reads and writes on an io_uring now (-http-io-uring); 0: none does (the option off, the kernel refused it, or io_uring_enter failed).
# TYPE sluice_http_io_uring_loops gauge
sluice_http_io_uring_loops %d
# HELP sluice_http_io_uring_ops_total Socket operations the loop engine made through its io_uring rings, by op (send, recv).
# TYPE sluice_http_io_uring_ops_total counter
sluice_http_io_uring_ops_total{op="recv"} %d
sluice_http_io_uring_ops_total{op="send"} %d
`, rings, e.uringRecvs.Load(), e.uringSends.Load())
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_http_io_uring_loops", "sluice_http_io_uring_ops_total"); err != nil {
				t.Error(err)
			}
			if !on && sends+recvs != 0 {
				t.Errorf("without the ring: %d sends and %d reads through it, want none", sends, recvs)
			}
		})
	}
}

// TestLoopIOURingFallsBack: where io_uring cannot be set up the loop
// says so once, naming the flag, and serves with plain writes.
func TestLoopIOURingFallsBack(t *testing.T) {
	defer func(f func(uint32) (*uring.Ring, error)) { newRing = f }(newRing)
	newRing = func(uint32) (*uring.Ring, error) {
		return nil, fmt.Errorf("uring: io_uring_setup: %w", unix.EPERM) // as uring.New wraps it
	}
	buf := &syncWriter{w: &bytes.Buffer{}}
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{IOURing: true, Loops: 2}, logger: slog.New(slog.NewTextHandler(buf, nil))})
	for range 3 {
		if rep := r.get("/", ""); rep.status != 200 {
			t.Fatalf("GET: %d %q", rep.status, rep.body)
		}
	}
	out := buf.String()
	if strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "-http-io-uring=false") || !strings.Contains(out, "operation not permitted") ||
		!strings.Contains(out, "kernel.io_uring_disabled") {
		t.Errorf("log, want one WARN naming -http-io-uring and the error:\n%s", out)
	}
	if got := r.srv.loops.Load().uringSends.Load(); got != 0 {
		t.Errorf("%d sends through a ring that could not be set up", got)
	}
	if !strings.Contains(out, "io_uring_loops=0") {
		t.Errorf("the serving line does not say no loop has a ring:\n%s", out)
	}
}

// TestLoopIOURingConcurrent: many clients at once on one loop, so that
// rounds carry several reads and writes (batched as in production, two or
// more per round): every client gets its own answers, in order.
func TestLoopIOURingConcurrent(t *testing.T) {
	requireRing(t)
	r := loopRig(t, rigOpts{backends: 2, cfg: Config{IOURing: true, Loops: 1}})
	for _, be := range r.backends {
		be.handler = func(ctx *fasthttp.RequestCtx) { ctx.SetBody(ctx.RequestURI()) }
	}
	const clients, each = 32, 20
	errs := make(chan error, clients)
	for i := range clients {
		rc := dialRaw(t, r.addr)
		go func() {
			errs <- func() error {
				for j := range each {
					want := fmt.Sprintf("/c%d/r%d", i, j)
					if _, err := io.WriteString(rc.c, "GET "+want+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
						return err
					}
					resp, err := nethttp.ReadResponse(rc.br, nil)
					if err != nil {
						return fmt.Errorf("client %d request %d: %v", i, j, err)
					}
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 || string(body) != want {
						return fmt.Errorf("client %d request %d: %d %q (%v), want 200 %q", i, j, resp.StatusCode, body, err, want)
					}
				}
				return nil
			}()
		}()
	}
	for range clients {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	e := r.srv.loops.Load()
	t.Logf("%d sends, %d reads through the ring", e.uringSends.Load(), e.uringRecvs.Load())
}

// TestLoopIOURingQueuedTwice: a client queued twice for one round's batch
// of writes (its answer's first bytes deferred, then written by its own
// EPOLLOUT, then more deferred) gets each byte once.
func TestLoopIOURingQueuedTwice(t *testing.T) {
	requireRing(t)
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{IOURing: true, Loops: 1}})
	rc := dialRaw(t, r.addr)
	rc.send("GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, _ := rc.read("GET"); resp.StatusCode != 200 {
		t.Fatalf("first GET: %d", resp.StatusCode)
	}
	l := r.srv.loops.Load().loops[0]
	done := make(chan int)
	l.post(func() {
		queued := 0
		for _, o := range l.fds {
			if c := o.c; c != nil && c.fd >= 0 && !c.busy {
				l.writeRaw(c, []byte("A")) // deferred: queued
				l.flushClient(c)           // as its EPOLLOUT would: written
				l.writeRaw(c, []byte("B")) // deferred: queued again
				queued = len(l.toFlush)
			}
		}
		done <- queued
	})
	if q := <-done; q != 2 {
		t.Fatalf("the client is queued %d times, want twice for this test", q)
	}
	rc.send("GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
	got := make([]byte, 2)
	if _, err := io.ReadFull(rc.br, got); err != nil || string(got) != "AB" {
		t.Fatalf("bytes before the answer: %q (%v), want \"AB\"", got, err)
	}
	if resp, _ := rc.read("GET"); resp.StatusCode != 200 {
		t.Fatalf("second GET after the bytes: %d", resp.StatusCode)
	}
}

// TestRingRefusal: the WARN's cause follows io_uring_setup's error, as
// uring.New wraps it.
func TestRingRefusal(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{unix.EINVAL, "kernel before 5.18"},
		{unix.ENOSYS, "has no io_uring"},
		{unix.EPERM, "kernel.io_uring_disabled"},
		{unix.EACCES, "kernel.io_uring_disabled"},
		{unix.ENOMEM, "memory"},
		{errors.New("something else"), "seccomp profile, sysctl kernel.io_uring_disabled, or a kernel before 5.18"},
	} {
		err := fmt.Errorf("uring: io_uring_setup: %w", c.err)
		if got := ringRefusal(err); !strings.Contains(got, c.want) {
			t.Errorf("ringRefusal(%v) = %q, want it to say %q", err, got, c.want)
		}
	}
}
