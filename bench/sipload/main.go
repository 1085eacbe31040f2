// Command sipload is a SIP call generator over TCP that spreads its calls
// over many client connections, as thousands of phones registered over TCP
// each make a call now and then. SIPp cannot: its one-socket-per-call mode
// (-t tn) opens a connection for every call and, past -max_socket, sends on
// a socket it never connected. bench/sip-cpu.sh's curve mode uses it for
// the balancer's CPU per call against the number of client connections.
//
//	sipload -addr 127.0.0.1:15060 -conns 10000 -rate 2000 -calls 20000
//
// It opens -conns connections first (at most 64 connecting at once), prints
// `ready conns=N secs=S`, then starts -rate calls a second, each on the
// next connection in turn, until -calls were started. A call is SIPp's
// uac_rr.xml: INVITE with an SDP body; on the 200, an ACK and a BYE sent
// to the 200's Contact with the route set of its Record-Route (loose
// routing through the balancer); the call succeeds on the BYE's 200. A
// final answer over 299, a connection error, or no end within -timeout
// fails it. Once a second, and once at the end, it prints
// `stat EPOCH_SECONDS SUCCESSFUL FAILED` (cumulative), then
// `done ok=N failed=N`. It refuses any address that is not loopback, and
// every run is bounded by -calls and -timeout.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:5060", "the balancer's SIP TCP address (loopback only)")
	conns := flag.Int("conns", 10, "client connections; calls go over them in turn")
	rate := flag.Int("rate", 1000, "calls started per second")
	calls := flag.Int("calls", 10000, "calls to make in all")
	timeout := flag.Duration("timeout", 8*time.Second, "a call not ended this long after its INVITE fails")
	flag.Parse()
	ap, err := netip.ParseAddrPort(*addr)
	switch {
	case err != nil || !ap.Addr().IsLoopback():
		fail(fmt.Errorf("-addr %q: want a loopback ADDR:PORT", *addr))
	case *conns < 1 || *conns > 60000:
		fail(fmt.Errorf("-conns %d: want 1 to 60000", *conns))
	case *rate < 1 || *calls < 1:
		fail(fmt.Errorf("-rate %d -calls %d: want both above 0", *rate, *calls))
	case *timeout <= 0 || *timeout > time.Minute:
		fail(fmt.Errorf("-timeout %v: want (0, 1m]", *timeout))
	}
	g := &gen{addr: ap.String(), timeout: *timeout, calls: map[string]*call{}}
	t0 := time.Now()
	if err := g.dial(*conns); err != nil {
		fail(err)
	}
	fmt.Printf("ready conns=%d secs=%.1f\n", *conns, time.Since(t0).Seconds())
	g.run(*rate, *calls)
	fmt.Printf("done ok=%d failed=%d\n", g.ok.Load(), g.failed.Load())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "sipload:", err)
	os.Exit(1)
}

// call is one call under way.
type call struct {
	id      string
	c       *conn
	started time.Time
	bye     bool
}

// conn is one client connection; writes come from the pacer and from the
// connection's reader (the ACK and BYE), so they are serialised.
type conn struct {
	nc    net.Conn
	local string
	mu    sync.Mutex
}

func (c *conn) write(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.nc.Write(b)
	return err
}

type gen struct {
	addr    string
	timeout time.Duration
	conns   []*conn
	mu      sync.Mutex
	calls   map[string]*call
	ok      atomic.Int64
	failed  atomic.Int64
	tag     string
}

func (g *gen) dial(n int) error {
	g.tag = strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	g.conns = make([]*conn, n)
	sem := make(chan struct{}, 64)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	d := net.Dialer{Timeout: 5 * time.Second}
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			nc, err := d.DialContext(context.Background(), "tcp", g.addr)
			if err != nil {
				select {
				case errc <- fmt.Errorf("connection %d of %d: %w", i+1, n, err):
				default:
				}
				return
			}
			g.conns[i] = &conn{nc: nc, local: nc.LocalAddr().String()}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	for _, c := range g.conns {
		go g.read(c)
	}
	return nil
}

// run starts the calls at rate, prints the counts once a second, and
// returns when every call has ended or timed out.
func (g *gen) run(rate, total int) {
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	statAt := start.Add(time.Second)
	sent, next := 0, 0
	g.stat()
	for {
		now := <-tick.C
		due := min(total, int(float64(rate)*now.Sub(start).Seconds())+1)
		for ; sent < due; sent++ {
			c := g.conns[next]
			next = (next + 1) % len(g.conns)
			g.invite(c, sent, now)
		}
		if now.After(statAt) {
			statAt = statAt.Add(time.Second)
			g.expire(now)
			g.stat()
		}
		if sent == total {
			g.mu.Lock()
			left := len(g.calls)
			g.mu.Unlock()
			if left == 0 {
				g.stat()
				return
			}
		}
	}
}

func (g *gen) stat() {
	fmt.Printf("stat %.6f %d %d\n", float64(time.Now().UnixNano())/1e9, g.ok.Load(), g.failed.Load())
}

// expire fails the calls older than the timeout.
func (g *gen) expire(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, cl := range g.calls {
		if now.Sub(cl.started) > g.timeout {
			delete(g.calls, id)
			g.failed.Add(1)
		}
	}
}

func (g *gen) end(id string, ok bool) {
	g.mu.Lock()
	_, live := g.calls[id]
	delete(g.calls, id)
	g.mu.Unlock()
	if !live {
		return
	}
	if ok {
		g.ok.Add(1)
	} else {
		g.failed.Add(1)
	}
}

const sdp = "v=0\r\no=user1 53655765 2353687637 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"

func (g *gen) invite(c *conn, n int, now time.Time) {
	id := fmt.Sprintf("%d-%s@127.0.0.1", n, g.tag)
	cl := &call{id: id, c: c, started: now}
	g.mu.Lock()
	g.calls[id] = cl
	g.mu.Unlock()
	msg := fmt.Sprintf("INVITE sip:service@%s SIP/2.0\r\n"+
		"Via: SIP/2.0/TCP %s;branch=z9hG4bK-%s-%d-0;rport\r\n"+
		"From: sipp <sip:sipp@%s>;tag=%sT%d\r\n"+
		"To: service <sip:service@%s>\r\n"+
		"Call-ID: %s\r\nCSeq: 1 INVITE\r\nContact: <sip:sipp@%s;transport=tcp>\r\nMax-Forwards: 70\r\nSubject: Performance Test\r\n"+
		"Content-Type: application/sdp\r\nContent-Length: %d\r\n\r\n%s",
		g.addr, c.local, g.tag, n, c.local, g.tag, n, g.addr, id, c.local, len(sdp), sdp)
	if err := c.write([]byte(msg)); err != nil {
		g.end(id, false)
	}
}

// read takes the answers on one connection until it closes; a closed
// connection fails its calls (they time out).
func (g *gen) read(c *conn) {
	br := bufio.NewReaderSize(c.nc, 16<<10)
	for {
		m, err := readMessage(br)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				fmt.Fprintln(os.Stderr, "sipload: read:", err)
			}
			return
		}
		g.answer(c, m)
	}
}

// message is what a call needs of an answer.
type message struct {
	status  int
	method  string // CSeq's
	callID  string
	from    string
	to      string
	contact string
	rr      []string
}

func (g *gen) answer(c *conn, m message) {
	if m.status < 200 {
		return
	}
	g.mu.Lock()
	cl := g.calls[m.callID]
	g.mu.Unlock()
	if cl == nil {
		return
	}
	switch {
	case m.status >= 300:
		g.end(m.callID, false)
	case m.method == "BYE":
		g.end(m.callID, true)
	case m.method == "INVITE" && !cl.bye:
		cl.bye = true
		target := m.contact
		if target == "" {
			target = "sip:service@" + g.addr
		}
		var routes strings.Builder
		for i := len(m.rr) - 1; i >= 0; i-- {
			routes.WriteString("Route: " + m.rr[i] + "\r\n")
		}
		var b bytes.Buffer
		for _, meth := range []string{"ACK", "BYE"} {
			cseq := 1
			if meth == "BYE" {
				cseq = 2
			}
			fmt.Fprintf(&b, "%s %s SIP/2.0\r\nVia: SIP/2.0/TCP %s;branch=z9hG4bK-%s-%s-%d;rport\r\nFrom: %s\r\nTo: %s\r\nCall-ID: %s\r\n%sCSeq: %d %s\r\nContact: <sip:sipp@%s;transport=tcp>\r\nMax-Forwards: 70\r\nSubject: Performance Test\r\nContent-Length: 0\r\n\r\n",
				meth, target, c.local, g.tag, strings.ReplaceAll(m.callID, "@", "-"), cseq, m.from, m.to, m.callID, routes.String(), cseq, meth, c.local)
		}
		if err := c.write(b.Bytes()); err != nil {
			g.end(m.callID, false)
		}
	}
}

// readMessage reads one SIP message: the head up to its empty line, then
// Content-Length bytes of body (skipped). Requests are read and ignored
// (status 0).
func readMessage(br *bufio.Reader) (message, error) {
	var m message
	first := true
	length := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return m, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if first {
			if len(line) == 0 {
				continue // keep-alive CRLF
			}
			first = false
			if bytes.HasPrefix(line, []byte("SIP/2.0 ")) && len(line) >= 11 {
				m.status, _ = strconv.Atoi(string(line[8:11]))
			}
			continue
		}
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		v := string(bytes.TrimSpace(value))
		switch strings.ToLower(string(bytes.TrimSpace(name))) {
		case "call-id", "i":
			m.callID = v
		case "cseq":
			if _, meth, ok := strings.Cut(v, " "); ok {
				m.method = strings.TrimSpace(meth)
			}
		case "from", "f":
			m.from = v
		case "to", "t":
			m.to = v
		case "contact", "m":
			m.contact = uriOf(v)
		case "record-route":
			for r := range strings.SplitSeq(v, ",") {
				m.rr = append(m.rr, strings.TrimSpace(r))
			}
		case "content-length", "l":
			length, _ = strconv.Atoi(v)
		}
	}
	if length > 0 {
		if _, err := br.Discard(length); err != nil {
			return m, err
		}
	}
	return m, nil
}

// uriOf is the URI of a name-addr or addr-spec value.
func uriOf(v string) string {
	if i := strings.IndexByte(v, '<'); i >= 0 {
		if j := strings.IndexByte(v[i:], '>'); j > 0 {
			return v[i+1 : i+j]
		}
	}
	if i := strings.IndexByte(v, ';'); i >= 0 {
		return v[:i]
	}
	return v
}
