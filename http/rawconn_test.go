package http

import (
	"bufio"
	"io"
	"net"
	nethttp "net/http"
	"testing"
	"time"
)

// rawConn is a client connection that reads answers one by one.
type rawConn struct {
	t  testing.TB
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t testing.TB, addr string) *rawConn {
	t.Helper()
	c, err := dialTest(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) send(raw string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, raw); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads one answer; method is the request's (HEAD answers have no body).
func (rc *rawConn) read(method string) (*nethttp.Response, string) {
	rc.t.Helper()
	resp, err := nethttp.ReadResponse(rc.br, &nethttp.Request{Method: method})
	if err != nil {
		rc.t.Fatalf("reading answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		rc.t.Fatalf("reading body: %v", err)
	}
	return resp, string(b)
}
