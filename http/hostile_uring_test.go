//go:build linux

package http

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	nethttp "net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// earlyHintsSwitch is a backend's answer to an upgrade request: an
// interim 103, then the switch, in one write.
const earlyHintsSwitch = "HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n" +
	"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"

// unreadOn waits, on the loop's goroutine, until the socket fd has bytes
// the loop has not read, so that the loop's next round finds them.
func unreadOn(fd int) bool {
	for range 5000 {
		if n, err := unix.IoctlGetInt(fd, unix.SIOCINQ); err == nil && n > 0 {
			return true
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// tunnelClient returns the loop's client connection that is a tunnel, or
// with tun false the one whose request is at a backend.
func tunnelClient(l *evloop, tun bool) *cconn {
	for _, o := range l.fds {
		if c := o.c; c != nil && c.fd >= 0 && c.busy && c.x.bc != nil && c.tun == tun {
			return c
		}
	}
	return nil
}

// readSwitch reads the 103 and the 101 a client gets for earlyHintsSwitch.
func readSwitch(t *testing.T, br *bufio.Reader) {
	t.Helper()
	for _, want := range []int{103, 101} {
		resp, err := nethttp.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("answer: %v %v, want %d", resp, err, want)
		}
	}
}

// TestHostileURingEarlyHintsThenSwitch: a backend answers an upgrade
// with 103 then 101 in one write, and the client's first tunnel bytes
// arrive in the same round. With the ring the 103 waits in c.out for the
// round's batch, so the client's own event (EPOLLIN|EPOLLOUT) flushes it
// and the relay it resumes switches the connection to a tunnel; the rest
// of that event (the client's readable edge) must be handled as the
// tunnel's, or the client's bytes wait unread for an edge that never
// comes (edge-triggered) and the tunnel hangs. The same bytes without
// the ring: the backend gets the client's bytes and echoes them.
func TestHostileURingEarlyHintsThenSwitch(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "uring"}[on], func(t *testing.T) {
			if on {
				requireRing(t)
			}
			gotReq, release := make(chan struct{}), make(chan struct{})
			be := startRawBackend(t, "hints", func(c net.Conn) {
				br := bufio.NewReader(c)
				if _, err := nethttp.ReadRequest(br); err != nil {
					return
				}
				close(gotReq)
				<-release
				io.WriteString(c, earlyHintsSwitch)
				io.Copy(c, br) // echo the tunnel
			})
			srv, addr := tunRig(t, Config{Engine: EngineLoop, IOURing: on, Loops: 1}, plainBackend(t, be.addr()))
			rc := dialRaw(t, addr)
			rc.send("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			<-gotReq
			l := srv.loops.Load().loops[0]
			entered, ready := make(chan struct{}), make(chan bool, 1)
			l.post(func() {
				// The backend's answer and the client's bytes both arrive
				// while the loop is here: its next round has both events.
				c := tunnelClient(l, false)
				if c == nil {
					close(entered)
					ready <- false
					return
				}
				close(entered)
				close(release)
				ready <- unreadOn(c.x.bc.fd) && unreadOn(c.fd)
			})
			<-entered
			rc.send("hello")
			if !<-ready {
				t.Fatal("the exchange or its bytes were not where the test puts them")
			}
			rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
			readSwitch(t, rc.br)
			got := make([]byte, 5)
			if _, err := io.ReadFull(rc.br, got); err != nil || string(got) != "hello" {
				t.Fatalf("the tunnel's echo: %q (%v), want \"hello\": the client's first bytes were never read", got, err)
			}
		})
	}
}

// TestHostileURingTunnelQueuedFlush: a connection queued for the round's
// batch of writes (its answer's 103 deferred) can become a tunnel before
// the batch is made (its own EPOLLOUT flushed the 103, the relay it
// resumed switched, and the tunnel's bytes then left some in c.out on
// EAGAIN, with the backend still readable). Its queued entry must be
// written as a tunnel's (tunFlushClient): the HTTP flush resumes relay
// on the tunnel's backend connection, which reads the tunnel's bytes as
// an answer's body, ends the exchange, closes the backend connection and
// drops those bytes.
func TestHostileURingTunnelQueuedFlush(t *testing.T) {
	requireRing(t)
	defer func(n int) { ringMinBatch = n }(ringMinBatch)
	ringMinBatch = 1 // the round has one write: through the ring all the same
	send := make(chan struct{})
	be := startRawBackend(t, "tun", func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := nethttp.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		<-send
		io.WriteString(c, "DATA")
		io.Copy(c, br)
	})
	srv, addr := tunRig(t, Config{Engine: EngineLoop, IOURing: true, Loops: 1}, plainBackend(t, be.addr()))
	rc := dialRaw(t, addr)
	rc.send("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if resp, err := nethttp.ReadResponse(rc.br, nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("switch: %v %v", resp, err)
	}
	l := srv.loops.Load().loops[0]
	done := make(chan bool, 1)
	l.post(func() {
		c := tunnelClient(l, true)
		if c == nil {
			done <- false
			return
		}
		close(send)
		ok := unreadOn(c.x.bc.fd) // the backend's next bytes, unread
		// What the round leaves: the queued entry, bytes a tunnel write
		// did not get out, the backend readable.
		c.out, c.o = append(c.out[:0], "queued"...), 0
		c.x.bc.rready = true
		l.toFlush = append(l.toFlush, c)
		done <- ok
	})
	if !<-done {
		t.Fatal("no tunnel, or the backend's bytes did not arrive")
	}
	got := make([]byte, len("queuedDATA"))
	if _, err := io.ReadFull(rc.br, got); err != nil || string(got) != "queuedDATA" {
		t.Fatalf("client got %q (%v), want \"queuedDATA\": the tunnel's bytes were read as an answer", got, err)
	}
	rc.send("ping")
	got = got[:4]
	if _, err := io.ReadFull(rc.br, got); err != nil || string(got) != "ping" {
		t.Fatalf("tunnel after the flush: %q (%v), want the echo \"ping\"", got, err)
	}
}

// idleExchange makes a keep-alive connection idle (one request answered,
// so its next read is one the ring's batch makes), then writes raw in two
// pieces (split 0: one), shuts the write side and returns each answer as
// "status close body", until the server closes.
func idleExchange(t *testing.T, addr string, raw []byte, split int) []string {
	t.Helper()
	rc := dialRaw(t, addr)
	rc.send("GET /warm HTTP/1.1\r\nHost: x\r\n\r\n")
	rc.read("GET")
	rc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if split > 0 {
		rc.c.Write(raw[:split])
	}
	rc.c.Write(raw[split:])
	closeWrite(rc.c)
	var out []string
	for {
		resp, err := nethttp.ReadResponse(rc.br, nil)
		if err != nil {
			return out
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out = append(out, fmt.Sprintf("%d %v %q", resp.StatusCode, resp.Close, b))
	}
}

// TestHostileURingSmugglingSameAsPlain: every request-smuggling spelling
// of smuggleCases, sent on an idle keep-alive connection whole and in two
// pieces, gives with the ring's batched reads and writes (every one
// through the ring) what it gives without: the same answers to the
// client and the same requests at the backend.
func TestHostileURingSmugglingSameAsPlain(t *testing.T) {
	requireRing(t)
	if suiteIOURing {
		t.Skip("SLUICE_TEST_HTTP_IO_URING=1 turns the ring on in every rig: no plain side to compare with")
	}
	defer func(n int) { ringMinBatch = n }(ringMinBatch)
	ringMinBatch = 1
	run := func(on bool) map[string]string {
		r, rec := smuggleRig(t, EngineLoop, Config{StickyCookie: "-", IOURing: on, Loops: 1})
		got := map[string]string{}
		for _, tc := range smuggleCases {
			for _, split := range []int{0, len(tc.raw) / 2} {
				m := rec.mark()
				answers := idleExchange(t, r.addr, []byte(tc.raw), split)
				var reqs []string
				for _, s := range rec.since(m) {
					if !s.incomplete {
						reqs = append(reqs, fmt.Sprintf("%s %s %s %q %s", s.method, s.target, s.host, s.body, s.bad))
					}
				}
				// The Host of a request without one is the listener's address: each rig's own.
				got[fmt.Sprintf("%s/split%d", tc.name, split)] = strings.ReplaceAll(fmt.Sprintf("answers %q\nbackend %q", answers, reqs), r.addr, "LISTENER")
			}
		}
		if on && r.srv.loops.Load().uringRecvs.Load() == 0 {
			t.Error("no read went through the ring")
		}
		return got
	}
	plain, ring := run(false), run(true)
	for k, want := range plain {
		if ring[k] != want {
			t.Errorf("%s:\nwith the ring    %s\nwithout the ring %s", k, ring[k], want)
		}
	}
}

// TestHostileURingEnterFails: io_uring_enter fails for a round's batch
// (here the ring's descriptor number is made to name another file, the
// EOPNOTSUPP a ring in a bad state gives). The loop gives the ring up
// with one WARN, the batch's writes, none taken, go the plain way, each
// client gets its bytes once, and the loop serves on without the ring.
func TestHostileURingEnterFails(t *testing.T) {
	requireRing(t)
	buf := &syncWriter{w: &bytes.Buffer{}}
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{IOURing: true, Loops: 1}, logger: slog.New(slog.NewTextHandler(buf, nil))})
	a, b := dialRaw(t, r.addr), dialRaw(t, r.addr)
	for _, rc := range []*rawConn{a, b} {
		rc.send("GET /warm HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, _ := rc.read("GET"); resp.StatusCode != 200 {
			t.Fatalf("warm-up: %d", resp.StatusCode)
		}
	}
	e := r.srv.loops.Load()
	l := e.loops[0]
	done := make(chan error, 1)
	l.post(func() {
		if l.ring == nil {
			done <- errors.New("the loop has no ring")
			return
		}
		ringFD := int(reflect.ValueOf(l.ring).Elem().FieldByName("fd").Int())
		null, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- err
			return
		}
		err = unix.Dup3(null, ringFD, unix.O_CLOEXEC)
		unix.Close(null)
		if err != nil {
			done <- err
			return
		}
		q := 0
		for _, o := range l.fds {
			if c := o.c; c != nil && c.fd >= 0 && !c.busy {
				l.writeRaw(c, uringPayload(c.port, 100))
				q++
			}
		}
		if q != 2 || len(l.toFlush) != 2 {
			done <- fmt.Errorf("%d clients, %d writes queued, want 2 and 2", q, len(l.toFlush))
			return
		}
		done <- nil
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, rc := range []*rawConn{a, b} {
		want := uringPayload(uint16(rc.c.LocalAddr().(*net.TCPAddr).Port), 100)
		got := make([]byte, len(want))
		if _, err := io.ReadFull(rc.br, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("client: %q (%v), want %q", got, err, want)
		}
	}
	hasRing := make(chan bool)
	l.post(func() { hasRing <- l.ring != nil })
	if <-hasRing {
		t.Fatal("the loop kept a ring whose io_uring_enter failed")
	}
	sends := e.uringSends.Load()
	for _, rc := range []*rawConn{a, b} {
		rc.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp, body := rc.read("GET"); resp.StatusCode != 200 || strings.Contains(body, "P") {
			t.Fatalf("after the ring was given up: %d %q", resp.StatusCode, body)
		}
	}
	if got := e.uringSends.Load(); got != sends {
		t.Errorf("%d sends through a ring given up", got-sends)
	}
	if out := buf.String(); strings.Count(out, "io_uring_enter failed") != 1 {
		t.Errorf("log, want one WARN that io_uring_enter failed:\n%s", out)
	}
}

// misbehave is a raw backend for TestHostileURingMisbehaving: by the
// request's path it answers right (/ok), with bytes past its
// Content-Length (/extra), before reading the body (/early: then it reads
// the body as the next request and closes), not at all (/close), or with
// a reset (/rst). An answer's body is the request's path.
func misbehave(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		req, err := nethttp.ReadRequest(br)
		if err != nil {
			return
		}
		p := req.URL.Path
		kind := strings.SplitN(p, "/", 3)[1]
		if kind != "early" {
			io.Copy(io.Discard, req.Body)
		}
		switch kind {
		case "close":
			return
		case "rst":
			c.(*net.TCPConn).SetLinger(0)
			return
		case "extra":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%sEXTRA-NOT-YOURS", len(p), p)
		default:
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(p), p)
		}
	}
}

// TestHostileURingMisbehaving: many clients at once on one loop, every
// read and write through the ring, against a backend that sends more
// than its Content-Length, answers before the request's body is read,
// closes or resets; meanwhile other clients pipeline requests and reset
// at once (their descriptors reused by new connections within rounds).
// Every answer a client reads is its own request's or a failure status,
// never bytes of another's, and the loop serves on.
func TestHostileURingMisbehaving(t *testing.T) {
	requireRing(t)
	defer func(n int) { ringMinBatch = n }(ringMinBatch)
	ringMinBatch = 1
	r := loopRig(t, rigOpts{backends: 1, raw: misbehave, cfg: Config{IOURing: true, Loops: 1}})
	kinds := []string{"ok", "extra", "early", "ok", "close", "rst", "ok"}
	const clients, each, resetters = 24, 21, 150
	errs := make(chan error, clients+1)
	go func() {
		for i := range resetters {
			c, err := dialTest(r.addr, 5*time.Second)
			if err != nil {
				errs <- err
				return
			}
			fmt.Fprintf(c, "GET /ok/reset%d/a HTTP/1.1\r\nHost: x\r\n\r\nGET /ok/reset%d/b HTTP/1.1\r\nHost: x\r\n\r\nGET /extra/reset%d/c HTTP/1.1\r\nHost: x\r\n\r\n", i, i, i)
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}
		errs <- nil
	}()
	body := strings.Repeat("b", 60<<10)
	for i := range clients {
		go func() {
			errs <- func() error {
				var rc *rawConn
				for j := range each {
					if rc == nil {
						rc = dialRaw(t, r.addr)
					}
					kind := kinds[(i+j)%len(kinds)]
					path := fmt.Sprintf("/%s/c%d/r%d", kind, i, j)
					var err error
					if kind == "early" {
						_, err = fmt.Fprintf(rc.c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
					} else {
						_, err = fmt.Fprintf(rc.c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
					}
					if err != nil {
						return fmt.Errorf("client %d request %d: %v", i, j, err)
					}
					resp, err := nethttp.ReadResponse(rc.br, nil)
					if err != nil {
						rc.c.Close()
						rc = nil // closed after a failure: a new connection
						continue
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					switch {
					case resp.StatusCode == 200 && string(b) != path:
						return fmt.Errorf("client %d request %s: 200 %q: not its answer", i, path, b)
					case resp.StatusCode != 200 && bytes.Contains(b, []byte("/c")):
						return fmt.Errorf("client %d request %s: %d %q: another's bytes", i, path, resp.StatusCode, b)
					case err != nil || resp.Close:
						rc.c.Close()
						rc = nil
					}
				}
				return nil
			}()
		}()
	}
	for range clients + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	rc := dialRaw(t, r.addr)
	rc.send("GET /ok/last HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, b := rc.read("GET"); resp.StatusCode != 200 || b != "/ok/last" {
		t.Fatalf("after: %d %q", resp.StatusCode, b)
	}
	e := r.srv.loops.Load()
	t.Logf("%d sends, %d reads through the ring", e.uringSends.Load(), e.uringRecvs.Load())
}
