package http

import (
	"bufio"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
)

// TestAccessLogAbortMidBody: a client that closes while its request body
// is still coming is logged as that request (method, path, request id,
// the body bytes that came), client_abort with nginx's 499, not as a
// malformed request with empty fields, nor as a malformed body. A body
// the loop buffers, one it hands to the fasthttp engine (above 64 KiB),
// one streamed to the backend as it comes (above -http-stream-threshold)
// and a chunked one, on both engines; a close and a reset.
func TestAccessLogAbortMidBody(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			length int
			sent   int
			reset  bool
		}{
			{"buffered", 1000, 100, false},
			{"buffered reset", 1000, 100, true},
			{"handed over", 100000, 1000, false},
			{"streamed past the threshold", 3 << 20, 200 << 10, false},
			{"chunked", -1, 16, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r, sink := logRig(t, rigOpts{backends: 1})
				c, err := net.Dial("tcp", r.addr)
				if err != nil {
					t.Fatal(err)
				}
				framing, body := "Content-Length: "+strconv.Itoa(tc.length), strings.Repeat("b", tc.sent)
				if tc.length < 0 {
					framing, body = "Transfer-Encoding: chunked", strconv.FormatInt(int64(tc.sent), 16)+"\r\n"+body+"\r\n"
				}
				c.Write([]byte("POST /abortbody?q=1 HTTP/1.1\r\nHost: x\r\nUser-Agent: t/1\r\n" + framing + "\r\n\r\n" + body))
				if tc.reset {
					c.(*net.TCPConn).SetLinger(0)
				}
				c.Close()
				l := sink.next(t)
				if l.method != "POST" || l.path != "/abortbody" || !hexID.MatchString(l.rid) || l.End != accesslog.EndClientAbort ||
					l.Status != 499 || l.Decision != accesslog.Admitted || l.BytesOut != 0 {
					t.Errorf("record %+v method %q path %q rid %q", l.HTTPRecord, l.method, l.path, l.rid)
				}
				if !tc.reset && l.BytesIn != int64(tc.sent) {
					t.Errorf("bytes_in %d, want the %d body bytes that came", l.BytesIn, tc.sent)
				}
				if !strings.Contains(l.line, `"status":499`) || !strings.Contains(l.line, `"end":"client_abort"`) || strings.Contains(l.line, "malformed") {
					t.Errorf("line %s", l.line)
				}
				if n := r.backends[0].hits.Load(); n != 0 {
					t.Errorf("backend answered %d requests, want none", n)
				}
			})
		}
	})
}

// TestAccessLogAbortWaitingForBackend: a client that closes while its
// request waits for the backend's answer is logged client_abort, 499,
// with the request's fields, when it closes (the loop engine, which sees
// the close; the fasthttp engine notices only when it writes the answer).
func TestAccessLogAbortWaitingForBackend(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		if engineOf(t) == EngineFastHTTP {
			t.Skip("the fasthttp engine learns of the close only when it writes the answer")
		}
		stop := make(chan struct{})
		defer close(stop)
		got := make(chan struct{}, 1)
		r, sink := logRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
			defer c.Close()
			var h fasthttp.RequestHeader
			if h.Read(bufio.NewReader(c)) != nil {
				return
			}
			got <- struct{}{}
			<-stop // never answers
		}})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET /slowabort HTTP/1.1\r\nHost: x\r\n\r\n"))
		<-got
		r.clock.Advance(halfCloseGrace) // a FIN now is the client giving up, no half-close
		c.Close()
		l := sink.next(t)
		if l.method != "GET" || l.path != "/slowabort" || !hexID.MatchString(l.rid) || l.End != accesslog.EndClientAbort ||
			l.Status != 499 || l.Backend != "b0" || l.Connect == 0 || l.Total < l.Connect {
			t.Errorf("record %+v", l.HTTPRecord)
		}
	})
}

// TestHalfCloseRightAfterRequestAnswered: a plain client that shuts its
// side down right after its request (within halfCloseGrace; the test's
// clock does not move) still gets its answer while the backend works,
// and the line says complete.
func TestHalfCloseRightAfterRequestAnswered(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		release := make(chan struct{})
		got := make(chan struct{}, 1)
		r, sink := logRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
			defer c.Close()
			var h fasthttp.RequestHeader
			if h.Read(bufio.NewReader(c)) != nil {
				return
			}
			got <- struct{}{}
			<-release
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		}})
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET /half HTTP/1.1\r\nHost: x\r\n\r\n"))
		<-got // the request waits for the backend
		c.(*net.TCPConn).CloseWrite()
		close(release)
		var resp fasthttp.Response
		if err := resp.Read(bufio.NewReader(c)); err != nil || resp.StatusCode() != 200 || string(resp.Body()) != "ok" {
			t.Fatalf("answer %v %d %q: want the backend's", err, resp.StatusCode(), resp.Body())
		}
		if l := sink.next(t); l.End != accesslog.EndComplete || l.Status != 200 {
			t.Errorf("record %+v", l.HTTPRecord)
		}
	})
}
