package http

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
)

// TestAccessLogBackendTimings: on the fasthttp engine the record's
// backend connect and first-byte times are measured where they happen,
// not when the exchange returns. The (manual) clock moves 1.1 s while the
// request waits in an ARM delay (before it connects), 10 ms while the
// backend holds the request (between connect and first byte) and 20 ms
// while the answer's body is held (between first byte and the end). The
// loop engine times on its own I/O clock, which a test cannot move.
func TestAccessLogBackendTimings(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		if engineOf(t) != "fasthttp" {
			t.Skip("the loop engine's timings are on its I/O clock")
		}
		more := make(chan struct{})
		var n atomic.Int32
		var r *rig
		r, sink := logRig(t, rigOpts{backends: 1, arm: []string{"name=slow,limit=1/s,action=delay,queue=10,wait=1m"}, raw: func(c net.Conn) {
			defer c.Close()
			var h fasthttp.RequestHeader
			if h.Read(bufio.NewReader(c)) != nil {
				return
			}
			if n.Add(1) == 1 {
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"))
				return
			}
			r.clock.Advance(10 * time.Millisecond) // connected, no answer yet
			c.Write([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"))
			<-more
			c.Write([]byte("0\r\n\r\n"))
		}})
		r.get("/", "") // takes the rule's token: the next request waits
		sink.next(t)
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("GET /t HTTP/1.1\r\nHost: x\r\n\r\n"))
		for i := 0; r.ctrl.Rules()[0].Status().Queued == 0; i++ {
			if i > 5000 {
				t.Fatal("request never queued")
			}
			time.Sleep(time.Millisecond)
		}
		r.clock.Advance(1100 * time.Millisecond)
		r.ctrl.Advance(r.clock.Now())
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(line, "hello") {
				break // the answer began: its first byte was timed
			}
		}
		r.clock.Advance(20 * time.Millisecond)
		close(more)
		l := sink.next(t)
		if l.Status != 200 || l.End != accesslog.EndComplete || l.Decision != accesslog.Delayed {
			t.Fatalf("record %+v", l.HTTPRecord)
		}
		if l.AdmissionWait != 1100*time.Millisecond || l.Connect != 1100*time.Millisecond ||
			l.FirstByte != 1110*time.Millisecond || l.Total != 1130*time.Millisecond {
			t.Errorf("wait %v connect %v first byte %v total %v: want 1.1 s, 1.1 s, 1.11 s, 1.13 s", l.AdmissionWait, l.Connect, l.FirstByte, l.Total)
		}
	})
}

// TestGateHeadTimes: the fasthttp engine's head timing is the gate's: from
// the first bytes of a head to the head whole. net.Pipe makes each write
// return only once the gate has read it, so the clock moves between two
// reads of one head.
func TestGateHeadTimes(t *testing.T) {
	sink := &captureSink{ch: make(chan logged, 4)}
	l, err := accesslog.New(accesslog.Options{Dest: t.TempDir() + "/access.log", Sample: accesslog.DefaultSample, Sinks: []accesslog.Sink{sink}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	clock := &admission.ManualClock{}
	clock.Set(int64(time.Hour))
	s := &Server{clock: clock, alog: l}
	s.denyNames.Store(new([]string))
	client, server := net.Pipe()
	defer client.Close()
	g := s.gate(server, nil)
	got := make(chan string, 1)
	go func() {
		var buf []byte
		p := make([]byte, 64)
		for {
			n, err := g.Read(p)
			buf = append(buf, p[:n]...)
			if err != nil || strings.HasSuffix(string(buf), "\r\n\r\n") {
				got <- string(buf)
				return
			}
		}
	}()
	client.Write([]byte("GET / HTTP/1.1\r\n"))
	client.Write([]byte("H")) // returns once the gate has looked at the first part
	clock.Advance(7 * time.Millisecond)
	client.Write([]byte("ost: x\r\n\r\n"))
	if h := <-got; h != "GET / HTTP/1.1\r\nHost: x\r\n\r\n" {
		t.Fatalf("passed on %q", h)
	}
	if g.lastBegin != int64(time.Hour) || g.lastHead-g.lastBegin != int64(7*time.Millisecond) {
		t.Errorf("head began %d, whole %d: want %d and 7 ms later", g.lastBegin, g.lastHead, int64(time.Hour))
	}
}

// TestAccessLogTunnel: an upgrade the backend switches is logged once,
// when its tunnel ends: status 101, the tunnel's bytes each way, the
// backend, and how it ended (both sides closed in turn, or the backend
// reset it).
func TestAccessLogTunnel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reset bool // the backend resets the connection instead of closing it
		end   accesslog.End
	}{
		{"complete", false, accesslog.EndComplete},
		{"backend_reset", true, accesslog.EndBackendReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onEngines(t, func(t *testing.T) {
				r, sink := logRig(t, rigOpts{backends: 1, raw: func(c net.Conn) {
					defer c.Close()
					br := bufio.NewReader(c)
					var h fasthttp.RequestHeader
					if h.Read(br) != nil {
						return
					}
					c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhi")) // tunnel bytes right behind the head
					p := make([]byte, 5)
					if _, err := io.ReadFull(br, p); err != nil {
						return
					}
					c.Write(append(p, "xyz"...))
					if tc.reset {
						c.(*net.TCPConn).SetLinger(0) // Close sends RST
						return
					}
					io.Copy(io.Discard, br) // until the client's half-close
				}})
				c, err := net.Dial("tcp", r.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.Write([]byte("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
				br := bufio.NewReader(c)
				var resp fasthttp.ResponseHeader
				if err := resp.Read(br); err != nil || resp.StatusCode() != 101 {
					t.Fatalf("switch: %v %d", err, resp.StatusCode())
				}
				c.Write([]byte("ping!"))
				got := make([]byte, 10)
				if _, err := io.ReadFull(br, got); err != nil || string(got) != "hiping!xyz" {
					t.Fatalf("tunnel read %q %v", got, err)
				}
				if !tc.reset {
					c.(*net.TCPConn).CloseWrite()
				}
				io.Copy(io.Discard, br) // until sluice closes the tunnel
				l := sink.next(t)
				if l.Status != 101 || l.Backend != "b0" || l.BytesIn != 5 || l.BytesOut != 10 || l.End != tc.end ||
					l.Decision != accesslog.Admitted || l.path != "/ws" || l.rid == "" {
					t.Errorf("record %+v path %q: want 101 from b0, 5 bytes in, 10 out, end %v", l.HTTPRecord, l.path, tc.end)
				}
				select {
				case extra := <-sink.ch:
					t.Errorf("a second record for one tunnel: %+v", extra.HTTPRecord)
				default:
				}
			})
		})
	}
}
