package sip

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// dialTCPFrom is dialTCP from the loopback address ip (127.0.0.2 and up are
// other sources on Linux).
func dialTCPFrom(t *testing.T, s *Server, ip string) *tcpClient {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", s.udpAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &tcpClient{t: t, conn: c}
}

// tcpInvite is a complete INVITE from c.
func tcpInvite(s *Server, c *tcpClient, callID string) string {
	la := c.conn.LocalAddr().String()
	body := "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
	return fmt.Sprintf("INVITE sip:svc@%s SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-%s\r\nMax-Forwards: 70\r\nFrom: <sip:a@test>;tag=ta\r\nTo: <sip:svc@test>\r\nCall-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:a@%s;transport=tcp>\r\nContent-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s", s.udpAddr(), la, callID, callID, la, len(body), body)
}

// localOptions is an OPTIONS the balancer answers itself (Max-Forwards 0),
// with a body of n bytes.
func localOptions(s *Server, c *tcpClient, branch string, n int) string {
	m := strings.Replace(optionsTo(s, c.conn.LocalAddr(), branch), "Max-Forwards: 70", "Max-Forwards: 0", 1)
	return strings.Replace(m, "Content-Length: 0\r\n\r\n", fmt.Sprintf("Content-Length: %d\r\n\r\n", n), 1) + strings.Repeat("b", n)
}

// closed reports whether the server closed c: a read ends with EOF or a
// reset within the wait bound (nothing is sent to c meanwhile).
func closed(c *tcpClient) bool {
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	_, err := c.conn.Read(make([]byte, 64))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// Finding: one host could open every slot of -sip-tcp-max-conns and every
// other client's connection was reset. Past -sip-tcp-max-conns-per-source
// its connections are closed at once, and another source's call goes
// through.
func TestTCPPerSourceCap(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) {
		c.TCPMaxConns = 6
		c.TCPMaxConnsPerSource = 4
	})
	var hog []*tcpClient
	for range 10 {
		hog = append(hog, dialTCP(t, s))
	}
	eventually(t, "six connections refused by the per-source cap", func() bool { return s.metrics.TCPRefusedSource.Load() == 6 })
	if got := s.tcp.sourceCount(netip.MustParseAddr("127.0.0.1")); got != 4 {
		t.Errorf("connections of 127.0.0.1 = %d, want 4", got)
	}
	for i, c := range hog[4:] {
		if !closed(c) {
			t.Errorf("connection %d over the source's cap is open", 4+i)
		}
	}
	other := dialTCPFrom(t, s, "127.0.0.2")
	other.write(tcpInvite(s, other, "source-2@test"))
	other.response(180)
	other.response(200)
	if got := s.metrics.TCPEvicted.Load(); got != 0 {
		t.Errorf("%d connections evicted, want 0: the table had room", got)
	}
	if got := s.tcp.sourceCount(netip.MustParseAddr("127.0.0.2")); got != 1 {
		t.Errorf("connections of 127.0.0.2 = %d, want 1", got)
	}
}

// Finding: a 4-byte CRLFCRLF keep-alive renewed the 5-minute idle timeout,
// so a connection that never sent a message held its slot for ever. It must
// complete a message within -sip-tcp-first-message-timeout of its accept,
// keep-alives or not; after a message, keep-alives keep it (RFC 5626).
func TestTCPKeepAliveOnlyClosed(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) {
		c.TCPIdleTimeout = time.Minute
		c.TCPFirstMessageTimeout = 300 * time.Millisecond
	})
	// keepAlive sends a keep-alive and reads its answer.
	keepAlive := func(c *tcpClient) error {
		if _, err := c.conn.Write([]byte("\r\n\r\n")); err != nil {
			return err
		}
		_ = c.conn.SetReadDeadline(time.Now().Add(wait))
		pong := make([]byte, 2)
		if _, err := io.ReadFull(c.conn, pong); err != nil {
			return err
		}
		if string(pong) != "\r\n" {
			return fmt.Errorf("keep-alive answer %q", pong)
		}
		return nil
	}
	c := dialTCP(t, s)
	start := time.Now()
	sent := 0
	var err error
	for ; sent < 250 && time.Since(start) < wait; sent++ { // a keep-alive every 20 ms until the close
		if err = keepAlive(c); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err == nil {
		t.Fatalf("connection that only sent keep-alives still open after %d of them over %v (first-message timeout 300ms)", sent, time.Since(start).Round(time.Millisecond))
	}
	eventually(t, "the close counted", func() bool { return s.metrics.TCPFirstMessage.Load() == 1 })
	// A connection that sent a message lives on keep-alives past the
	// first-message deadline: 45 of them 20 ms apart, three times it.
	c2 := dialTCP(t, s)
	c2.write(optionsTo(s, c2.conn.LocalAddr(), "greets"))
	c2.response(200)
	for i := range 45 {
		if err := keepAlive(c2); err != nil {
			t.Fatalf("keep-alive %d after a message: %v", i, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := s.metrics.TCPFirstMessage.Load(); got != 1 {
		t.Errorf("tcp first message closed = %d, want 1", got)
	}
}

// Finding: with the table full (-sip-tcp-max-conns) every new connection
// was closed, however idle the ones holding the slots. Now the least
// recently active idle one goes; one with a message half received or
// answers queued is not idle; only when none is idle is the new one closed.
func TestTCPTableFullEvictsIdle(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) {
		c.TCPMaxConns = 3
		c.TCPMessageTimeout = time.Minute
	})
	s.tcp.mu.Lock()
	s.tcp.touchEvery = 0 // every message moves its connection to the back
	s.tcp.mu.Unlock()
	c1, c2, c3 := dialTCP(t, s), dialTCP(t, s), dialTCP(t, s)
	for i, c := range []*tcpClient{c1, c2, c3, c1} { // order of activity: c2, c3, c1
		c.write(localOptions(s, c, fmt.Sprintf("full-%d", i), 0))
		c.response(200)
	}
	// c2 has half a message in: not idle.
	half := localOptions(s, c2, "half", 100)
	c2.write(half[:len(half)-50])
	eventually(t, "c2's partial message buffered", func() bool { return s.tcp.budget.held() > 0 })
	c4 := dialTCP(t, s)
	c4.write(localOptions(s, c4, "new", 0))
	c4.response(200)
	if !closed(c3) {
		t.Fatal("c3, the least recently active idle connection, is open")
	}
	if got := s.metrics.TCPEvicted.Load(); got != 1 {
		t.Errorf("tcp evicted = %d, want 1", got)
	}
	c2.write(half[len(half)-50:])
	c2.response(200)
	c1.write(localOptions(s, c1, "still", 0))
	c1.response(200)
	// Every connection busy with a message: the new one is closed.
	for i, c := range []*tcpClient{c1, c2, c4} {
		m := localOptions(s, c, fmt.Sprintf("busy-%d", i), 100)
		c.write(m[:len(m)-50])
	}
	eventually(t, "three partial messages buffered", func() bool { return s.tcp.budget.held() == 3*tcpReadSize })
	c5 := dialTCP(t, s)
	if !closed(c5) {
		t.Error("new connection open with every slot busy")
	}
	if got := s.metrics.TCPRefused.Load(); got != 1 {
		t.Errorf("tcp refused = %d, want 1", got)
	}
	if got := s.tcp.len(); got != 3 {
		t.Errorf("%d connections, want 3", got)
	}
}

// gauge is the value of a gauge family of the collector.
func gauge(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not exported", name)
	return 0
}

// Finding: 5,000 connections each holding 65 KB of an unfinished message
// took the RSS from 79 MB to 945 MB. Partial messages now share one budget
// (-sip-tcp-partial-budget): a buffer grows to what its message needs once
// the head tells (not by doubling), and past the budget the connection
// holding the most goes, the oldest among equals.
func TestTCPPartialBudget(t *testing.T) {
	b1 := newUAS(t, "b1")
	const budget = 2 * 65536
	s := testServer(t, []*uas{b1}, nil, func(c *Config) {
		c.TCPPartialBudget = budget
		c.TCPMessageTimeout = time.Minute
	})
	type partial struct {
		c    *tcpClient
		rest string
		size int
	}
	var want int
	start := func(name string, body int) *partial {
		c := dialTCP(t, s)
		m := localOptions(s, c, name, body)
		cut := len(m) - body/2
		c.write(m[:cut])
		return &partial{c: c, rest: m[cut:], size: len(m)}
	}
	held := func(n int, what string) {
		t.Helper()
		eventually(t, what, func() bool { return s.tcp.budget.held() == int64(n) })
		if g := gauge(t, s, "sluice_frontend_partial_bytes"); g != float64(n) || g > budget {
			t.Fatalf("sluice_frontend_partial_bytes = %v, want %d (budget %d)", g, n, budget)
		}
	}
	// The oldest partial message is a small one: it is not the one to go.
	small := []*partial{start("small-0", 10000)}
	want += small[0].size
	held(want, "the small message's exact size reserved")
	big1 := start("big1", 60000)
	want += big1.size
	held(want, "the large message's exact size reserved")
	for i := 1; i < 4; i++ {
		p := start(fmt.Sprintf("small-%d", i), 10000)
		small = append(small, p)
		want += p.size
		held(want, "the small messages reserved")
	}
	big2 := start("big2", 60000) // over the budget: big1 holds as much and is older
	if !closed(big1.c) {
		t.Fatal("big1, the oldest of the largest partial messages, is open")
	}
	want += big2.size - big1.size
	held(want, "big1's reservation released, big2's taken")
	if got := s.metrics.TCPPartialShed.Load(); got != 1 {
		t.Errorf("tcp partial shed = %d, want 1", got)
	}
	for _, p := range append(small, big2) {
		p.c.write(p.rest)
		p.c.response(200)
	}
	held(0, "every reservation released")
	if s.tcp.budget.peak.Load() > budget {
		t.Errorf("partial bytes peaked at %d, over the budget %d", s.tcp.budget.peak.Load(), budget)
	}
}

// The framer finds the same messages as frame whatever the read sizes,
// without searching a head's bytes twice.
func TestFramerAcrossReads(t *testing.T) {
	msgs := "OPTIONS sip:x SIP/2.0\r\nl: 5\r\nVia: x\r\n\r\nhello" + "ACK sip:x SIP/2.0\r\nContent-Length: 0\r\n\r\n"
	for step := 1; step <= len(msgs); step++ {
		var f framer
		var got []int
		buf := []byte{}
		for i := 0; i < len(msgs); i += step {
			buf = append(buf, msgs[i:min(i+step, len(msgs))]...)
			for {
				n, ok, err := f.next(buf, 1024)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if !ok {
					break
				}
				got = append(got, n)
				buf = buf[n:]
			}
		}
		if fmt.Sprint(got) != "[44 40]" || len(buf) != 0 {
			t.Fatalf("step %d: sizes %v, %d bytes left; want [44 40]", step, got, len(buf))
		}
	}
}

// readCap grows a buffer to its message's size once known, else doubles,
// never past the limit + 1.
func TestReadCap(t *testing.T) {
	for _, c := range []struct{ len, cap, size, want int }{
		{0, 2048, 0, 2048},
		{1600, 2048, 0, 4096},
		{1600, 2048, 30000, 30000},
		{1600, 2048, 1700, 2048},
		{65300, 65536, 0, 65536},
		{40600, 40960, 0, 65536},
	} {
		if got := readCap(make([]byte, c.len, c.cap), c.size, 65535); got != c.want {
			t.Errorf("readCap(len %d, cap %d, size %d) = %d, want %d", c.len, c.cap, c.size, got, c.want)
		}
	}
}

// A connection waiting between messages holds no read buffer (it had 2 KiB
// each, 20 MB for the default 10,000): it waits for bytes without one and
// gives its buffer back once what it read is handled. One with half a
// message keeps its buffer until the message is complete.
func TestTCPWaitingConnectionsHoldNoBuffer(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	var cs []*tcpClient
	for i := range 20 {
		c := dialTCP(t, s)
		cs = append(cs, c)
		c.write(localOptions(s, c, fmt.Sprintf("wait-%d", i), 0))
		c.response(200)
	}
	eventually(t, "no waiting connection holding a buffer", func() bool { return s.tcp.readBufs.Load() == 0 })
	m := localOptions(s, cs[0], "half", 100)
	cs[0].write(m[:len(m)-50])
	eventually(t, "the connection with half a message holding its buffer", func() bool { return s.tcp.readBufs.Load() == 1 })
	if g := gauge(t, s, "sluice_frontend_read_buffers"); g != 1 {
		t.Errorf("sluice_frontend_read_buffers = %v, want 1", g)
	}
	cs[0].write(m[len(m)-50:])
	cs[0].response(200)
	eventually(t, "the buffer given back", func() bool { return s.tcp.readBufs.Load() == 0 })
	for i, c := range cs[1:] { // every connection still served
		c.write(localOptions(s, c, fmt.Sprintf("again-%d", i), 0))
		c.response(200)
	}
}

// A connection sluice dials to a client (a request from a backend going
// downstream to a Contact the client chose) shares the partial-message
// budget: the client at the other end controls what it sends back.
func TestTCPDialledClientInBudget(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.TCPMessageTimeout = time.Minute })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	head := "NOTIFY sip:x@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1;branch=z9hG4bK-d\r\nCall-ID: d@test\r\nCSeq: 1 NOTIFY\r\nContent-Length: 30000\r\n\r\n"
	sent := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_, _ = c.Write([]byte(head + strings.Repeat("b", 100)))
		sent <- c
	}()
	s.dialAsync(ln.Addr().(*net.TCPAddr).AddrPort(), nil)
	var c net.Conn
	select {
	case c = <-sent:
	case <-time.After(wait):
		t.Fatal("no connection dialled")
	}
	defer c.Close()
	eventually(t, "the partial message's size reserved", func() bool { return s.tcp.budget.held() == int64(len(head)+30000) })
}

// The activity order follows messages: a connection that sent a message
// after the others moves behind them (at most once per touchEvery, on the
// table's clock, here a manual one), so the table's eviction spares it.
func TestTCPEvictionFollowsActivity(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) { c.TCPMaxConns = 3 })
	var clock atomic.Int64
	clock.Store(int64(time.Hour))
	s.tcp.mu.Lock()
	s.tcp.now = clock.Load
	s.tcp.mu.Unlock()
	c1, c2, c3 := dialTCP(t, s), dialTCP(t, s), dialTCP(t, s)
	send := func(c *tcpClient, branch string) {
		t.Helper()
		c.write(localOptions(s, c, branch, 0))
		c.response(200)
	}
	for i, c := range []*tcpClient{c1, c2, c3} { // order: c1, c2, c3
		send(c, fmt.Sprintf("act-%d", i))
	}
	send(c1, "act-again") // within touchEvery of its last move: stays in front
	clock.Add(int64(2 * lruTouchEvery))
	send(c1, "act-later") // now it moves behind c2 and c3
	c4 := dialTCP(t, s)
	send(c4, "act-new")
	if !closed(c2) {
		t.Fatal("c2, the least recently active, is open")
	}
	send(c1, "act-kept")
	send(c3, "act-kept3")
	if got := s.metrics.TCPEvicted.Load(); got != 1 {
		t.Errorf("tcp evicted = %d, want 1", got)
	}
}

// FuzzFramerChunks: fed in chunks of any size, the framer finds the same
// messages and the same framing error as frame on the whole stream.
func FuzzFramerChunks(f *testing.F) {
	f.Add([]byte("OPTIONS sip:x SIP/2.0\r\nl: 5\r\n\r\nhelloACK x SIP/2.0\r\nContent-Length: 0\r\n\r\n"), uint8(1))
	f.Add([]byte("A\r\n\r\r\n\r\nl: 2\r\n\r\nab"), uint8(3))
	f.Add([]byte("INVITE x\r\nContent-Length: 70000\r\n\r\n"), uint8(7))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		const limit = 1024
		chunk := int(step%64) + 1
		var want []int
		var wantErr bool
		for rest := data; ; {
			n, ok, err := frame(rest, limit)
			if err != nil {
				wantErr = true
				break
			}
			if !ok {
				break
			}
			want = append(want, n)
			rest = rest[n:]
		}
		var got []int
		var gotErr bool
		var fr framer
		var buf []byte
	feed:
		for i := 0; i < len(data); i += chunk {
			buf = append(buf, data[i:min(i+chunk, len(data))]...)
			for {
				n, ok, err := fr.next(buf, limit)
				if err != nil {
					gotErr = true
					break feed
				}
				if !ok {
					break
				}
				got = append(got, n)
				buf = buf[n:]
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || gotErr != wantErr {
			t.Fatalf("chunks of %d: %v (error %v), whole: %v (error %v)", chunk, got, gotErr, want, wantErr)
		}
	})
}

// Accounting leaks nothing: after a churn of connections from two sources
// through a small table, a small budget and a per-source cap (evictions,
// refusals, shedding, partial and complete messages, closes from either
// side), every count is back to zero. A count that leaked would lock a
// source or the table out for good.
func TestTCPGuardAccountingChurn(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, func(c *Config) {
		c.TCPMaxConns = 12
		c.TCPMaxConnsPerSource = 8
		c.TCPPartialBudget = 2 * 65536
		c.TCPMessageTimeout = time.Minute
	})
	var open []net.Conn
	for i := range 300 {
		ip := "127.0.0.1"
		if i%3 == 0 {
			ip = "127.0.0.2"
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", s.udpAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
		_ = c.SetWriteDeadline(time.Now().Add(wait))
		m := strings.Replace(optionsTo(s, c.LocalAddr(), fmt.Sprintf("churn-%d", i)), "Max-Forwards: 70", "Max-Forwards: 0", 1)
		switch i % 4 {
		case 0: // a complete message
			_, _ = c.Write([]byte(m))
		case 1: // half of a large one
			big := strings.Replace(m, "Content-Length: 0", "Content-Length: 40000", 1) + strings.Repeat("b", 20000)
			_, _ = c.Write([]byte(big))
		case 2: // half of a small one
			_, _ = c.Write([]byte(m[:len(m)/2]))
		}
		if i%5 == 4 { // the client leaves
			c.Close()
			open = open[:len(open)-1]
		}
	}
	eventually(t, "the budget within its limit", func() bool { return s.tcp.budget.held() <= 2*65536 })
	for _, c := range open {
		c.Close()
	}
	eventually(t, "every connection gone", func() bool { return s.tcp.len() == 0 })
	s.tcp.mu.RLock()
	accepted, sources, front, back := s.tcp.accepted, len(s.tcp.sources), s.tcp.front, s.tcp.back
	s.tcp.mu.RUnlock()
	if accepted != 0 || sources != 0 || front != nil || back != nil {
		t.Errorf("after every close: accepted %d, sources %d, order front %v back %v; want none", accepted, sources, front != nil, back != nil)
	}
	eventually(t, "no partial bytes reserved", func() bool { return s.tcp.budget.held() == 0 })
	eventually(t, "no read buffer held", func() bool { return s.tcp.readBufs.Load() == 0 })
	s.tcp.budget.mu.Lock()
	holders := len(s.tcp.budget.holders)
	s.tcp.budget.mu.Unlock()
	if holders != 0 {
		t.Errorf("%d budget holders left", holders)
	}
	m := &s.metrics
	t.Logf("evicted %d, refused (full) %d, refused (source) %d, shed %d, peak partial bytes %d",
		m.TCPEvicted.Load(), m.TCPRefused.Load(), m.TCPRefusedSource.Load(), m.TCPPartialShed.Load(), s.tcp.budget.peak.Load())
	if m.TCPEvicted.Load() == 0 || m.TCPRefusedSource.Load()+m.TCPRefused.Load() == 0 || m.TCPPartialShed.Load() == 0 {
		t.Error("the churn did not exercise eviction, refusal and shedding")
	}
	// The table serves again.
	c := dialTCP(t, s)
	c.write(localOptions(s, c, "after-churn", 0))
	c.response(200)
}

// Finding: every 4-byte CRLFCRLF keep-alive was answered with a write of its
// own (and moved the rest of the buffer down), so a peer sending 64 KiB of
// them cost the balancer 16,384 writes: about 90 ms of CPU per 64 KiB, a
// core for 0.7 MB/s (BenchmarkTCPKeepAliveFlood). The answers of one read go
// out in one write now; each ping still gets its CRLF.
func TestTCPKeepAliveFloodCoalesced(t *testing.T) {
	b1 := newUAS(t, "b1")
	s := testServer(t, []*uas{b1}, nil, nil)
	c := dialTCP(t, s)
	const n = 16384
	go func() { _, _ = c.conn.Write([]byte(strings.Repeat("\r\n\r\n", n))) }()
	_ = c.conn.SetReadDeadline(time.Now().Add(wait))
	pongs := make([]byte, 2*n)
	if _, err := io.ReadFull(c.conn, pongs); err != nil {
		t.Fatalf("answers: %v", err)
	}
	if string(pongs) != strings.Repeat("\r\n", n) {
		t.Fatal("answers are not a CRLF each")
	}
	if got := s.metrics.TCPKeepAlives.Load(); got != n {
		t.Errorf("tcp keep-alives = %d, want %d", got, n)
	}
	// 64 KiB arrive in reads of up to 2 KiB: about 32 writes.
	if w := s.metrics.TCPKeepAliveWrites.Load(); w > n/16 {
		t.Errorf("%d writes for %d keep-alives, want at most %d", w, n, n/16)
	}
	// A message after keep-alives is served, its answer after theirs.
	c.write("\r\n\r\n" + localOptions(s, c, "after-pings", 0))
	pong := make([]byte, 2)
	if _, err := io.ReadFull(c.conn, pong); err != nil || string(pong) != "\r\n" {
		t.Fatalf("keep-alive answer %q, %v", pong, err)
	}
	c.response(200)
}
