package http

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http2"
)

// TestHostileH2BodiesHeld: an HTTP/1.1 connection holds at most one
// request body of up to -http-stream-threshold (1 MiB) in memory before
// admission; an HTTP/2 connection runs h2MaxStreams (100) handlers at
// once, and each reads its stream's body whole up to the threshold
// before the request is admitted, granting flow-control window as it
// reads. One connection that opens 100 uploads and never ends them so
// makes sluice hold 100 MiB (and a source's connections, each as much):
// the per-source memory bound of HTTP/1.1 multiplied by 100. The bytes
// one HTTP/2 connection may make sluice hold before admission must stay
// near an HTTP/1.1 connection's.
func TestHostileH2BodiesHeld(t *testing.T) {
	// The backend answers every request 413 at once and closes: what a
	// stream streams to it costs sluice nothing, what sluice reads
	// before admission stays in its memory.
	r := newRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			l, err := br.ReadString('\n')
			if err != nil || l == "\r\n" {
				break
			}
		}
		io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	}})
	addr := h2cListen(t, r)
	heapBefore := heapNow()
	h := dialH2Raw(t, addr, nil)
	const (
		streams = h2MaxStreams
		perBody = 1<<20 - 1<<10 // under the threshold: held whole
		capSent = 48 << 20      // the test stops here
		bound   = 16 << 20      // what one connection may make sluice hold
	)
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	conn := int64(65535) // the connection's window before the server's updates
	credit := map[uint32]int64{}
	done := false
	go func() {
		for {
			f, err := h.fr.ReadFrame()
			mu.Lock()
			if err != nil {
				done = true
				cond.Broadcast()
				mu.Unlock()
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
						for id := range credit {
							credit[id] = int64(v)
						}
						credit[0] = int64(v) // initial window of streams to come
					}
				}
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					conn += int64(f.Increment)
				} else {
					credit[f.StreamID] += int64(f.Increment)
				}
			}
			cond.Broadcast()
			mu.Unlock()
		}
	}()
	h.c.SetWriteDeadline(time.Now().Add(20 * time.Second))
	mu.Lock()
	h.fr.WriteSettingsAck()
	init := credit[0]
	if init == 0 {
		init = 65535
	}
	sent := map[uint32]int64{}
	for i := range streams {
		id := uint32(2*i + 1)
		credit[id] += init
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true,
			BlockFragment: h.block(":method", "POST", ":scheme", "http", ":path", "/hold", ":authority", "a.example")}); err != nil {
			t.Fatal(err)
		}
	}
	chunk := make([]byte, 16<<10)
	total := int64(0)
	for total < capSent && !done {
		progress := false
		for i := range streams {
			id := uint32(2*i + 1)
			n := min(int64(len(chunk)), credit[id], conn, perBody-sent[id])
			if n <= 0 {
				continue
			}
			credit[id] -= n
			conn -= n
			sent[id] += n
			total += n
			mu.Unlock()
			err := h.fr.WriteData(id, false, chunk[:n])
			mu.Lock()
			if err != nil {
				done = true
				break
			}
			progress = true
		}
		if !progress {
			// Wait for window (or stop when the server grants no more).
			timer := time.AfterFunc(time.Second, func() { mu.Lock(); done = true; cond.Broadcast(); mu.Unlock() })
			cond.Wait()
			timer.Stop()
		}
	}
	mu.Unlock()
	if after := heapNow(); after > heapBefore+bound {
		t.Errorf("after %d MiB of unfinished uploads on one connection the heap grew from %d MiB to %d MiB, want less than %d MiB more",
			total>>20, heapBefore>>20, after>>20, bound>>20)
	}
	h.c.Close()
}

// TestH2BodyBudgetReturned: the budget a stream's body took goes back
// when the stream ends: one after another on one connection, bodies
// without a declared length under the threshold are all read whole
// (the backend sees a Content-Length, not chunks), and one over what is
// left of the budget is streamed.
func TestH2BodyBudgetReturned(t *testing.T) {
	r := newRig(t, rigOpts{backends: 1})
	r.backends[0].handler = func(ctx *fasthttp.RequestCtx) {
		fmt.Fprintf(ctx, "cl=%d len=%d", ctx.Request.Header.ContentLength(), len(ctx.Request.Body()))
	}
	base := "http://" + h2cListen(t, r)
	c := h2cClient(t)
	const size = 600 << 10 // more than half the threshold: two at once would not fit
	for i := range 4 {
		body := io.MultiReader(bytes.NewReader(make([]byte, size))) // no length known: none declared
		rep := h2Do(t, c, "POST", base+"/up", "", body)
		if want := fmt.Sprintf("cl=%d len=%d", size, size); rep.status != 200 || rep.body != want {
			t.Fatalf("upload %d: %d %q, want %q (read whole, the budget back after each)", i, rep.status, rep.body, want)
		}
	}
}

func TestReserveBodies(t *testing.T) {
	for _, tc := range []struct{ used, max, want, got, after int64 }{
		{0, 100, 40, 40, 40},
		{80, 100, 40, 20, 100},
		{100, 100, 1, 0, 100},
		{0, 100, 0, 0, 0},
		{120, 100, 5, 0, 120}, // never negative
	} {
		var u atomic.Int64
		u.Store(tc.used)
		if got := reserveBodies(&u, tc.max, tc.want); got != tc.got || u.Load() != tc.after {
			t.Errorf("reserveBodies(used %d, max %d, want %d) = %d, used %d; want %d, used %d", tc.used, tc.max, tc.want, got, u.Load(), tc.got, tc.after)
		}
	}
}
