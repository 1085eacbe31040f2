// Command wsload is a SIP over WebSocket (RFC 7118) load client for the
// edge benchmark (bench/sip-edge.sh), against any WS or WSS SIP edge
// (sluice, Kamailio) on loopback.
//
//	wsload -mode calls -url wss://127.0.0.1:4481/ -conns 20 -rate 200 -calls 2000
//
// places calls at a fixed rate over a few connections, as browsers behind
// one edge would: INVITE, wait for the 200, then ACK and BYE along the
// route set the 200's Record-Routes give (RFC 3261 §12.1.2), and wait for
// the BYE's 200. A call succeeds when both 200s come within -timeout; any
// other final answer, a closed connection or silence fails it. It prints
// one line, `calls=N ok=N failed=N ...`, and exits 1 when a call failed.
//
//	wsload -mode idle -url wss://127.0.0.1:4481/ -conns 10000 -hold 10m
//
// opens -conns connections (at most -open-rate a second), each upgraded
// with the subprotocol sip, sends one OPTIONS with Max-Forwards 0 on each
// (the edge answers it itself) and then stays silent, prints `ready open=N
// failed=N` once they are all tried, and holds them until -hold passes or
// it gets SIGTERM or SIGINT: what the edge keeps per idle connection is
// then measured from outside.
//
// It refuses any address that is not loopback.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
)

func main() {
	mode := flag.String("mode", "calls", "calls (a call load) or idle (connections held open)")
	rawURL := flag.String("url", "ws://127.0.0.1:8081/", "ws:// or wss:// URL of the SIP edge (loopback only)")
	conns := flag.Int("conns", 20, "connections (calls: the calls are spread over them; idle: how many to hold)")
	rate := flag.Int("rate", 100, "calls: calls started per second")
	calls := flag.Int("calls", 1000, "calls: how many")
	timeout := flag.Duration("timeout", 8*time.Second, "calls: most time for each of the call's two answers")
	openRate := flag.Int("open-rate", 1000, "connections opened per second at most")
	hold := flag.Duration("hold", 10*time.Minute, "idle: how long to hold the connections (at most 1h)")
	flag.Parse()
	u, err := url.Parse(*rawURL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") {
		fail("-url %q: want ws://HOST:PORT/PATH or wss://HOST:PORT/PATH", *rawURL)
	}
	ap, err := netip.ParseAddrPort(u.Host)
	if err != nil || !ap.Addr().IsLoopback() {
		fail("-url %q: want a loopback IP:PORT as the host", *rawURL)
	}
	switch {
	case *mode != "calls" && *mode != "idle":
		fail("-mode %q: want calls or idle", *mode)
	case *conns < 1 || *conns > 100000:
		fail("-conns %d: want 1 to 100000", *conns)
	case *rate < 1 || *rate > 100000:
		fail("-rate %d: want 1 to 100000 calls/s", *rate)
	case *calls < 1 || *calls > 10000000:
		fail("-calls %d: want 1 to 10000000", *calls)
	case *timeout <= 0 || *timeout > time.Minute:
		fail("-timeout %v: want more than 0, at most 1m", *timeout)
	case *openRate < 1:
		fail("-open-rate %d: want at least 1 a second", *openRate)
	case *hold <= 0 || *hold > time.Hour:
		fail("-hold %v: want more than 0, at most 1h", *hold)
	}
	d := ws.Dialer{Protocols: []string{"sip"}, Timeout: 10 * time.Second,
		TLSConfig: &tls.Config{InsecureSkipVerify: true}} // the bench's self-signed certificate
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *mode == "idle" {
		os.Exit(idle(ctx, d, *rawURL, *conns, *openRate, *hold))
	}
	os.Exit(load(ctx, d, *rawURL, u.Scheme, *conns, *rate, *calls, *openRate, *timeout))
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "wsload: "+format+"\n", a...)
	os.Exit(2)
}

// maxOpening bounds the connections being opened at once: an edge that
// takes handshakes more slowly than -open-rate (a capped CPU share) then
// sets the pace, instead of a pile of waiting handshakes that time out.
const maxOpening = 32

// dial opens n connections at most openRate a second, and returns those
// that upgraded with the subprotocol sip (and, with greet, answered its
// OPTIONS) and how many did not.
func dial(ctx context.Context, d ws.Dialer, url string, n, openRate int, greet bool) ([]net.Conn, int) {
	var (
		mu     sync.Mutex
		cs     []net.Conn
		failed int
		wg     sync.WaitGroup
	)
	sem := make(chan struct{}, maxOpening)
	tick := time.NewTicker(time.Second / time.Duration(openRate))
	defer tick.Stop()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		<-tick.C
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, _, hs, err := d.Dial(ctx, url)
			if err == nil && hs.Protocol == "sip" && greet {
				err = options(c, i)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil || hs.Protocol != "sip" {
				failed++
				if c != nil {
					c.Close()
				}
				if failed <= 3 {
					fmt.Fprintf(os.Stderr, "wsload: connection refused: %v (subprotocol %q)\n", err, hs.Protocol)
				}
				return
			}
			cs = append(cs, c)
		})
	}
	wg.Wait()
	return cs, failed
}

// options sends one OPTIONS with Max-Forwards 0 on c and waits for its
// answer: the edge answers it itself (sluice 200, Kamailio 483), so the
// connection has carried a SIP message, as a browser's REGISTER would,
// and is past the edge's bound on the wait for a first message (sluice's
// -sip-tcp-first-message-timeout closes connections that never send one).
func options(c net.Conn, i int) error {
	id := fmt.Sprintf("idle-%d@wsload", i)
	msg := fmt.Sprintf("OPTIONS sip:edge.invalid SIP/2.0\r\nVia: SIP/2.0/WSS i%d.invalid;branch=z9hG4bKidle%d\r\nMax-Forwards: 0\r\nFrom: <sip:wsload@edge.test>;tag=i%d\r\nTo: <sip:edge.invalid>\r\nCall-ID: %s\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n", i, i, i, id)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(time.Time{})
	if err := wsutil.WriteClientText(c, []byte(msg)); err != nil {
		return err
	}
	for {
		p, _, err := wsutil.ReadServerData(c)
		if err != nil {
			return err
		}
		if r, ok := parseResponse(p); ok && r.callID == id && r.code >= 200 {
			return nil
		}
	}
}

// idle holds n connections open and silent until hold passes or ctx ends.
func idle(ctx context.Context, d ws.Dialer, url string, n, openRate int, hold time.Duration) int {
	cs, failed := dial(ctx, d, url, n, openRate, true)
	fmt.Printf("ready open=%d failed=%d\n", len(cs), failed)
	// Read (and drop) what the edge sends, so its pings are answered by
	// the kernel's buffers rather than piling up; a connection the edge
	// closes is counted.
	var closed atomic.Int64
	for _, c := range cs {
		go func() {
			for {
				if _, _, err := wsutil.ReadServerData(c); err != nil {
					closed.Add(1)
					return
				}
			}
		}()
	}
	select {
	case <-ctx.Done():
	case <-time.After(hold):
	}
	fmt.Printf("done open=%d closed_by_edge=%d\n", len(cs), closed.Load())
	for _, c := range cs {
		c.Close()
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// conn is one WebSocket connection of the call load: writes under a lock,
// one reader handing each response to the call it belongs to.
type conn struct {
	c     net.Conn
	wmu   sync.Mutex
	mu    sync.Mutex
	calls map[string]chan *response // by Call-ID
}

func (k *conn) send(msg string) error {
	k.wmu.Lock()
	defer k.wmu.Unlock()
	_ = k.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	return wsutil.WriteClientText(k.c, []byte(msg))
}

func (k *conn) read() {
	defer func() {
		k.mu.Lock()
		for id, ch := range k.calls {
			close(ch)
			delete(k.calls, id)
		}
		k.calls = nil
		k.mu.Unlock()
	}()
	for {
		p, _, err := wsutil.ReadServerData(k.c)
		if err != nil {
			return
		}
		r, ok := parseResponse(p)
		if !ok {
			continue // a request or a keep-alive: not ours to answer here
		}
		k.mu.Lock()
		ch := k.calls[r.callID]
		k.mu.Unlock()
		if ch != nil {
			select {
			case ch <- r:
			default:
			}
		}
	}
}

// register gives the call callID a channel for its responses; false when
// the connection is gone.
func (k *conn) register(callID string) (chan *response, bool) {
	ch := make(chan *response, 8)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.calls == nil {
		return nil, false
	}
	k.calls[callID] = ch
	return ch, true
}

func (k *conn) done(callID string) {
	k.mu.Lock()
	delete(k.calls, callID)
	k.mu.Unlock()
}

// load places calls calls at rate a second over n connections.
func load(ctx context.Context, d ws.Dialer, url, scheme string, n, rate, calls, openRate int, timeout time.Duration) int {
	cs, failedConns := dial(ctx, d, url, n, openRate, false)
	if len(cs) == 0 {
		fmt.Printf("calls=%d ok=0 failed=%d conns_failed=%d\n", calls, calls, failedConns)
		return 1
	}
	ks := make([]*conn, len(cs))
	for i, c := range cs {
		ks[i] = &conn{c: c, calls: make(map[string]chan *response)}
		go ks[i].read()
	}
	defer func() {
		for _, k := range ks {
			k.c.Close()
		}
	}()
	tr := "WS"
	if scheme == "wss" {
		tr = "WSS"
	}
	var ok, failed atomic.Int64
	var lmu sync.Mutex
	lat := make([]time.Duration, 0, calls)
	var reasons sync.Map
	var wg sync.WaitGroup
	start := time.Now()
	tag := strconv.FormatInt(start.UnixNano()%1e9, 36)
	for i := 0; i < calls && ctx.Err() == nil; i++ {
		if w := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); w > 0 {
			time.Sleep(w)
		}
		k := ks[i%len(ks)]
		wg.Go(func() {
			t0 := time.Now()
			why := call(k, tr, tag, i, timeout)
			if why != "" {
				failed.Add(1)
				v, _ := reasons.LoadOrStore(why, new(atomic.Int64))
				v.(*atomic.Int64).Add(1)
				return
			}
			ok.Add(1)
			lmu.Lock()
			lat = append(lat, time.Since(t0))
			lmu.Unlock()
		})
	}
	sent := time.Since(start)
	wg.Wait()
	slices.Sort(lat)
	pct := func(p float64) string {
		if len(lat) == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", float64(lat[int(p*float64(len(lat)-1))])/1e6)
	}
	var why []string
	reasons.Range(func(k, v any) bool {
		why = append(why, fmt.Sprintf("%s:%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	slices.Sort(why)
	fmt.Printf("calls=%d ok=%d failed=%d conns=%d conns_failed=%d offered_cps=%.0f call_p50_ms=%s call_p99_ms=%s reasons=%s\n",
		calls, ok.Load(), failed.Load(), len(ks), failedConns, float64(calls)/sent.Seconds(), pct(0.5), pct(0.99), strings.Join(why, ","))
	if failed.Load() > 0 || int(ok.Load()) != calls {
		return 1
	}
	return 0
}

// call runs one call on k and returns "" or why it failed.
func call(k *conn, tr, tag string, i int, timeout time.Duration) string {
	id := fmt.Sprintf("%s-%d@wsload", tag, i)
	ch, ok := k.register(id)
	if !ok {
		return "conn_closed"
	}
	defer k.done(id)
	host := "w" + strconv.Itoa(i) + ".invalid"
	if err := k.send(request("INVITE", "sip:service@edge.test", tr, host, id, 1, "", nil)); err != nil {
		return "send"
	}
	ok200, why := await(ch, "INVITE", timeout)
	if why != "" {
		return "invite_" + why
	}
	target := ok200.contact
	if target == "" {
		return "no_contact"
	}
	routes := routeSet(ok200.recordRoutes)
	if err := k.send(request("ACK", target, tr, host, id, 1, ok200.toTag, routes)); err != nil {
		return "send"
	}
	if err := k.send(request("BYE", target, tr, host, id, 2, ok200.toTag, routes)); err != nil {
		return "send"
	}
	if _, why := await(ch, "BYE", timeout); why != "" {
		return "bye_" + why
	}
	return ""
}

// await returns the 2xx to method, or why there is none: a final answer
// of another class, the connection closing, or timeout passing.
func await(ch chan *response, method string, timeout time.Duration) (*response, string) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				return nil, "conn_closed"
			}
			if r.method != method || r.code < 200 {
				continue
			}
			if r.code >= 300 {
				return nil, strconv.Itoa(r.code)
			}
			return r, ""
		case <-t.C:
			return nil, "timeout"
		}
	}
}

// request is a request of the call as a browser (JsSIP) writes it: Via
// with the transport and an .invalid host, Contact at that host with
// transport=ws, the route set as Route headers.
func request(method, ruri, tr, host, callID string, cseq int, toTag string, routes []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s SIP/2.0\r\nVia: SIP/2.0/%s %s;branch=z9hG4bK%s-%d-%s\r\nMax-Forwards: 70\r\n", method, ruri, tr, host,
		strings.NewReplacer("@", "-", ".", "-").Replace(callID), cseq, strings.ToLower(method))
	for _, r := range routes {
		b.WriteString("Route: " + r + "\r\n")
	}
	to := "<sip:service@edge.test>"
	if toTag != "" {
		to += ";tag=" + toTag
	}
	fmt.Fprintf(&b, "From: <sip:wsload@edge.test>;tag=wl%d\r\nTo: %s\r\nCall-ID: %s\r\nCSeq: %d %s\r\nContact: <sip:wsload@%s;transport=ws>\r\nContent-Length: 0\r\n\r\n",
		cseq, to, callID, cseq, method, host)
	return b.String()
}

// response is what a call needs of an answer.
type response struct {
	code         int
	method       string // of its CSeq
	callID       string
	toTag        string
	contact      string   // the URI of the first Contact, without <>
	recordRoutes []string // every Record-Route entry, in order, with <>
}

// parseResponse reads the parts of a SIP response a call needs; false
// for anything else (a request, a keep-alive, garbage).
func parseResponse(p []byte) (*response, bool) {
	s := string(p)
	if i := strings.Index(s, "\r\n\r\n"); i >= 0 {
		s = s[:i]
	}
	lines := strings.Split(s, "\r\n")
	f := strings.SplitN(lines[0], " ", 3)
	if len(f) < 2 || f[0] != "SIP/2.0" {
		return nil, false
	}
	code, err := strconv.Atoi(f[1])
	if err != nil || code < 100 || code > 699 {
		return nil, false
	}
	r := &response{code: code}
	for _, l := range lines[1:] {
		name, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.ToLower(strings.TrimSpace(name)) {
		case "call-id", "i":
			r.callID = v
		case "cseq":
			if _, m, ok := strings.Cut(v, " "); ok {
				r.method = strings.TrimSpace(m)
			}
		case "to", "t":
			if _, params, ok := strings.Cut(afterAngle(v), ";"); ok {
				for _, kv := range strings.Split(params, ";") {
					if t, ok := strings.CutPrefix(strings.TrimSpace(kv), "tag="); ok {
						r.toTag = t
					}
				}
			}
		case "contact", "m":
			if r.contact == "" {
				r.contact = uriOf(v)
			}
		case "record-route":
			r.recordRoutes = append(r.recordRoutes, splitEntries(v)...)
		}
	}
	if r.callID == "" || r.method == "" {
		return nil, false
	}
	return r, true
}

// afterAngle is v from its closing '>' on, or v when it has none.
func afterAngle(v string) string {
	if i := strings.IndexByte(v, '>'); i >= 0 {
		return v[i+1:]
	}
	return v
}

// uriOf is the URI of a name-addr (between < and >) or of an addr-spec
// (up to its first ';').
func uriOf(v string) string {
	if i := strings.IndexByte(v, '<'); i >= 0 {
		if j := strings.IndexByte(v[i:], '>'); j > 0 {
			return v[i+1 : i+j]
		}
	}
	u, _, _ := strings.Cut(v, ";")
	return strings.TrimSpace(u)
}

// splitEntries splits a header value of comma-separated name-addrs,
// keeping commas inside <>.
func splitEntries(v string) []string {
	var out []string
	depth, from := 0, 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '<':
			depth++
		case '>':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(v[from:i]))
				from = i + 1
			}
		}
	}
	if e := strings.TrimSpace(v[from:]); e != "" {
		out = append(out, e)
	}
	return out
}

// routeSet is the Route entries a UAC sends in-dialog: the Record-Route
// entries of the 2xx, reversed (RFC 3261 §12.1.2).
func routeSet(rrs []string) []string {
	out := slices.Clone(rrs)
	slices.Reverse(out)
	return out
}
