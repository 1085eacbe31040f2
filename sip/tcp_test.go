package sip

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	gosip "github.com/emiago/sipgo/sip"
)

// tcpClient is a test client on one TCP connection.
type tcpClient struct {
	t    *testing.T
	conn net.Conn
	buf  []byte
}

func dialTCP(t *testing.T, s *Server) *tcpClient {
	t.Helper()
	c, err := net.Dial("tcp", s.udpAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &tcpClient{t: t, conn: c}
}

func (c *tcpClient) write(s string) {
	c.t.Helper()
	s = strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\n", "\r\n")
	if _, err := c.conn.Write([]byte(s)); err != nil {
		c.t.Fatal(err)
	}
}

// next returns the next framed message, or nil and the read error.
func (c *tcpClient) next() (gosip.Message, error) {
	chunk := make([]byte, 4096)
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	for {
		if size, ok, err := frame(c.buf, 1<<20); err != nil {
			return nil, err
		} else if ok {
			m, err := gosip.ParseMessage(append([]byte(nil), c.buf[:size]...))
			c.buf = c.buf[size:]
			return m, err
		}
		n, err := c.conn.Read(chunk)
		c.buf = append(c.buf, chunk[:n]...)
		if err != nil {
			return nil, err
		}
	}
}

func (c *tcpClient) response(code int) *gosip.Response {
	c.t.Helper()
	for {
		m, err := c.next()
		if err != nil {
			c.t.Fatalf("waiting for %d: %v", code, err)
		}
		res, ok := m.(*gosip.Response)
		if !ok || res.StatusCode == 100 {
			continue
		}
		if res.StatusCode != code {
			c.t.Fatalf("got %d, want %d", res.StatusCode, code)
		}
		return res
	}
}

// TestTCPClientCall: a call from a TCP client to UDP backends, with the
// INVITE split across writes and ACK+BYE in one write. The transports
// differ, so we record-route twice (RFC 5658) and take both routes off.
func TestTCPClientCall(t *testing.T) {
	b1, b2 := newUAS(t, "b1"), newUAS(t, "b2")
	s := testServer(t, []*uas{b1, b2}, nil, nil)
	c := dialTCP(t, s)
	la := c.conn.LocalAddr().String()
	body := "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
	inv := fmt.Sprintf("INVITE sip:svc@%s SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-tcp-1\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=ta\r\nTo: <sip:svc@test>\r\nCall-ID: tcp-1@test\r\nCSeq: 1 INVITE\r\nContact: <sip:a@%s;transport=tcp>\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s", s.udpAddr(), la, la, len(body), body)
	// Split inside the start line, inside a header and inside the body.
	for _, part := range []string{inv[:7], inv[7:100], inv[100 : len(inv)-5], inv[len(inv)-5:]} {
		if _, err := c.conn.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // let each part arrive on its own
	}
	c.response(180)
	ok := c.response(200)
	rrs := ok.GetHeaders("Record-Route")
	if len(rrs) != 2 || !strings.Contains(rrs[1].Value(), "transport=tcp") {
		t.Fatalf("Record-Route %v: want two, the client-facing one with transport=tcp", rrs)
	}
	tag, _ := ok.To().Params.Get("tag")
	routes := "Route: " + rrs[1].Value() + "\r\nRoute: " + rrs[0].Value() + "\r\n"
	in := func(m string, cseq int, br string) string {
		return fmt.Sprintf("%s sip:svc@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=%s\r\nMax-Forwards: 70\r\n%sFrom: <sip:a@test>;tag=ta\r\nTo: <sip:svc@test>;tag=%s\r\nCall-ID: tcp-1@test\r\nCSeq: %d %s\r\nContent-Length: 0\r\n\r\n", m, la, br, routes, tag, cseq, m)
	}
	c.write(in("ACK", 1, "z9hG4bK-tcp-ack") + in("BYE", 2, "z9hG4bK-tcp-bye"))
	c.response(200)
	home := b1
	if b1.count(gosip.INVITE, "tcp-1@test") == 0 {
		home = b2
	}
	if home.count(gosip.ACK, "tcp-1@test") != 1 || home.count(gosip.BYE, "tcp-1@test") != 1 {
		t.Errorf("ACK/BYE did not reach the INVITE's backend")
	}
	bye := home.find(gosip.BYE, "tcp-1@test")[0].Req
	if r := bye.GetHeader("route"); r != nil {
		t.Errorf("our Route was not removed: %s", r.Value())
	}
}

// TestTCPBadFraming: a message without Content-Length on a stream gets 400
// and the connection is closed.
func TestTCPBadFraming(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := dialTCP(t, s)
	c.write(fmt.Sprintf("OPTIONS sip:x@example.com SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-nocl\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:x@example.com>\r\nCall-ID: nocl@test\r\nCSeq: 1 OPTIONS\r\n\r\n", c.conn.LocalAddr()))
	c.response(400)
	if _, err := c.next(); !errors.Is(err, io.EOF) {
		t.Errorf("connection not closed: %v", err)
	}
}

// TestTCPIdleClosed: a connection that sends nothing is closed after the
// idle timeout.
func TestTCPIdleClosed(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.TCPIdleTimeout = time.Second })
	c := dialTCP(t, s)
	if _, err := c.next(); !errors.Is(err, io.EOF) {
		t.Errorf("idle connection: %v, want EOF", err)
	}
	eventually(t, "connection table empty", func() bool { return s.tcp.len() == 0 })
}

// TestTCPManyConnections: many clients at once are served; past the limit
// a new connection takes the place of the least recently active idle one,
// which is closed and counted.
func TestTCPManyConnections(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.TCPMaxConns = 100 })
	var cs []*tcpClient
	for i := 0; i < 100; i++ {
		cs = append(cs, dialTCP(t, s))
	}
	for i, c := range cs { // one after the other: cs[0] is the least recently active
		c.write(fmt.Sprintf("OPTIONS sip:%s SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-many-%d\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=1\r\nTo: <sip:x@test>\r\nCall-ID: many-%d@test\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n", s.udpAddr(), c.conn.LocalAddr(), i, i))
		c.response(200)
	}
	extra := dialTCP(t, s)
	extra.write(optionsTo(s, extra.conn.LocalAddr(), "extra"))
	extra.response(200)
	if _, err := cs[0].next(); !errors.Is(err, io.EOF) {
		t.Errorf("least recently active connection: %v, want EOF", err)
	}
	if got := s.metrics.TCPEvicted.Load(); got != 1 {
		t.Errorf("tcp evicted = %d, want 1", got)
	}
}

// tcpUAS is a fake backend on TCP: it answers INVITE with 180 and 200 and
// everything else but ACK with 200, on the connection the request came on.
type tcpUAS struct {
	ln    net.Listener
	addr  string
	got   chan string // methods received
	done  chan struct{}
	reqs  []*gosip.Request // requests received, under mu
	mu    sync.Mutex
	conns []net.Conn
}

// find returns the requests of method and Call-ID the backend got.
func (u *tcpUAS) find(m gosip.RequestMethod, callID string) []*gosip.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []*gosip.Request
	for _, r := range u.reqs {
		if r.Method == m && r.CallID().Value() == callID {
			out = append(out, r)
		}
	}
	return out
}

// dropConns closes every connection the backend has accepted.
func (u *tcpUAS) dropConns() {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.conns {
		c.Close()
	}
	u.conns = nil
}

func newTCPUAS(t *testing.T) *tcpUAS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return newTCPUASOn(t, ln)
}

// newTCPUAS is a tcpUAS on ln (a TLS listener, say).
func newTCPUASOn(t *testing.T, ln net.Listener) *tcpUAS {
	t.Helper()
	u := &tcpUAS{ln: ln, addr: ln.Addr().String(), got: make(chan string, 100), done: make(chan struct{})}
	go func() {
		defer close(u.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				u.dropConns()
				return
			}
			u.mu.Lock()
			u.conns = append(u.conns, c)
			u.mu.Unlock()
			go u.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-u.done
	})
	return u
}

func (u *tcpUAS) serve(c net.Conn) {
	var buf []byte
	chunk := make([]byte, 4096)
	for {
		n, err := c.Read(chunk)
		if err != nil {
			return
		}
		buf = append(buf, chunk[:n]...)
		for {
			size, ok, ferr := frame(buf, 1<<20)
			if ferr != nil || !ok {
				break
			}
			m, perr := gosip.ParseMessage(append([]byte(nil), buf[:size]...))
			buf = buf[size:]
			req, isReq := m.(*gosip.Request)
			if perr != nil || !isReq {
				continue
			}
			u.mu.Lock()
			u.reqs = append(u.reqs, req)
			u.mu.Unlock()
			u.got <- string(req.Method)
			answer := func(code int, reason string) {
				res := gosip.NewResponseFromRequest(req, code, reason, nil)
				if code > 100 {
					res.To().Params.Add("tag", "tcpuas")
					res.AppendHeader(&gosip.ContactHeader{Address: gosip.Uri{Scheme: "sip", Host: "127.0.0.1", UriParams: gosip.HeaderParams{{K: "transport", V: "tcp"}}}})
				}
				_, _ = c.Write([]byte(res.String()))
			}
			switch req.Method {
			case gosip.ACK:
			case gosip.INVITE:
				answer(180, "Ringing")
				answer(200, "OK")
			default:
				answer(200, "OK")
			}
		}
	}
}

// TestTCPBackend: a UDP client's call to a backend reached over TCP
// (transport=tcp), with double record-routing.
func TestTCPBackend(t *testing.T) {
	be := newTCPUAS(t)
	s := testServer(t, nil, nil, func(c *Config) {
		c.Backends = []BackendConfig{{ID: "tcp1", Addr: be.addr, Transport: "tcp", Weight: 1}}
	})
	eventually(t, "connection to the backend", func() bool { return s.tcp.len() == 1 })
	c := newUAC(t, s.udpAddr())
	k := c.newCall()
	k.invite("")
	c.recvResponse(180)
	ok := c.recvResponse(200)
	k.learn(ok)
	if len(k.route) != 2 {
		t.Fatalf("route set %v: want two entries (double record-route)", k.route)
	}
	k.inDialog("ACK", 1, k.branch+"-ack")
	// The backend drops its connection: the BYE waits for a new one.
	eventually(t, "INVITE and ACK at the backend", func() bool { return len(be.got) >= 2 })
	be.dropConns()
	eventually(t, "our side to notice", func() bool { return s.tcp.len() == 0 })
	k.inDialog("BYE", 2, k.branch+"-bye")
	c.recvResponse(200)
	var got []string
	for len(got) < 3 {
		select {
		case m := <-be.got:
			got = append(got, m)
		case <-time.After(wait):
			t.Fatalf("backend got %v", got)
		}
	}
	if strings.Join(got, ",") != "INVITE,ACK,BYE" {
		t.Errorf("backend got %v", got)
	}
}
