package http

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"sync/atomic"
	"testing"
	"time"
)

// FuzzServeRaw sends arbitrary bytes to the front end, on each engine,
// over a real loopback connection: whatever they are, the server answers
// or closes the connection without crashing, keeps serving the next
// client, and everything that reaches the backend is a request it frames
// one way only.
func FuzzServeRaw(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GARBAGE\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nCookie: SLUICE=AQAAAAB\r\nConnection: close, X-A\r\nX-A: 1\r\n\r\n",
		"GET /\xff HTTP/1.0\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	// The backend reads what reaches it with Go's strict parser: a request
	// it cannot frame, or one framed two ways, was relayed differently
	// from how sluice framed it (the smuggling class of bugs).
	var bad atomic.Pointer[string]
	backend := func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := nethttp.ReadRequest(br)
			if err != nil {
				var ne net.Error // timeouts and resets of an idle pooled connection
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &ne) {
					msg := "a request the backend cannot frame: " + err.Error()
					bad.CompareAndSwap(nil, &msg)
				}
				return
			}
			if len(req.Header.Values("Content-Length")) > 1 || req.Header.Get("Content-Length") != "" && len(req.TransferEncoding) > 0 {
				msg := fmt.Sprintf("a request framed two ways: %v", req.Header)
				bad.CompareAndSwap(nil, &msg)
			}
			if _, err := io.Copy(io.Discard, req.Body); err != nil {
				return // the client went away mid-body: sluice closed this connection
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	}
	var rigs []*rig
	for _, v := range suiteVariants {
		rigs = append(rigs, newRig(f, rigOpts{backends: 1, raw: backend, cfg: Config{Engine: v.engine, IOURing: v.ring}}))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, r := range rigs {
			serveRawOnce(t, r.addr, raw)
			if m := bad.Load(); m != nil {
				t.Fatalf("after client bytes %q: %s", raw, *m)
			}
		}
	})
}

// serveRawOnce sends raw to the front end at addr, reads what comes back,
// then asserts that a well-formed request on a new connection is served.
func serveRawOnce(t *testing.T, addr string, raw []byte) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(2 * time.Second))
	c.Write(raw)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	if resp, err := nethttp.ReadResponse(bufio.NewReader(c), nil); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	c.Close()
	// The server still answers a well-formed request.
	c2, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("after %q: %v", raw, err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c2, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := nethttp.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after %q the server does not serve: %v", raw, err)
	}
}
