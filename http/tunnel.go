package http

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http/httputil"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/lb"
)

// Upgrade pass-through (WebSocket). A client's request to switch
// protocols is forwarded only when it is a GET without a body whose one
// Upgrade token is in Config.Upgrades (websocket by default; h2c never):
// it keeps Upgrade and "Connection: upgrade" towards the backend, every
// other Upgrade is removed as a hop-by-hop header. The request is
// admitted as any other (affinity with a valid cookie, else new work) and
// goes on a backend connection of its own, dialled for it and never
// pooled. The connection becomes a two-way byte tunnel only when the
// backend answers 101 with the Upgrade asked for; any other answer is
// relayed as HTTP on the client's keep-alive connection (the backend
// connection is closed after it), and a 101 that names another protocol
// is a bad answer (502, backend connection closed). A 101 is a success
// for passive health. Tunnel bytes are copied, never parsed.
//
// Tunnels are counted (Stats.Tunnels, TunnelsPending, TunnelsTotal,
// TunnelsRefused), bounded (Config.MaxTunnels, pending upgrades included:
// over it the request is answered 503 before a backend is contacted; and
// per source: a tunnel's backend connection counts under the source's
// MaxConns/8 for the tunnel's life, so one client cannot take a backend's
// every connection with idle tunnels),
// closed after Config.TunnelIdle without a byte either way, and
// back-pressured: each direction copies through one fixed window
// (tunnelWindow) and reads no more from its source until the window is
// written to the other side. A side that shuts down its writing half is
// passed on as a half-close (the other direction goes on); the tunnel
// ends when both directions have ended or either fails. On Shutdown
// tunnels get until the context is done, then are closed.
//
// On the fasthttp engine a tunnel runs on a goroutine pair over the
// hijacked client connection and a backend connection dialled for the
// upgrade request (runTunnel); on the loop engine it runs on the loop
// itself (loop_tunnel.go).

// tunnelWindow is what one direction of a tunnel buffers at most: a read
// from one side waits until the bytes before it are written to the other.
const tunnelWindow = 16 << 10

// errUpgradeMismatch: a 101 naming a protocol the client did not ask for.
var errUpgradeMismatch = errors.New("backend switched to a protocol the request did not ask for")

// psTunnelLimit is the Proxy-Status of an upgrade refused at MaxTunnels.
var psTunnelLimit = []byte(`sluice; error=connection_limit_reached; details="tunnels"`)

// tunnelRetry is the Retry-After of a 503 at the tunnel limit.
const tunnelRetry = 5 * time.Second

// parseUpgrades parses Config.Upgrades: a comma list of protocol names
// (tokens, lower-cased), or "none".
func parseUpgrades(s string) ([]string, error) {
	if strings.EqualFold(strings.TrimSpace(s), "none") {
		return nil, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "" {
			continue
		}
		for i := 0; i < len(f); i++ {
			if !tchar[f[i]] {
				return nil, fieldError("Upgrades", "%q: %q is not a protocol token (want a comma list such as websocket, or none)", s, f)
			}
		}
		if f == "h2c" {
			return nil, fieldError("Upgrades", "%q: h2c is never forwarded (HTTP/2 to backends is not spoken; a client wanting HTTP/2 uses TLS with ALPN h2)", s)
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fieldError("Upgrades", "%q: want a comma list of protocols such as websocket, or none", s)
	}
	return out, nil
}

// upgradeAsked returns the Upgrade value of h when the request may be
// forwarded as an upgrade: an HTTP/1.1 GET with no body (bodyless), one Upgrade
// field holding one protocol token (with an optional /version) in the
// allow-list, and Connection naming upgrade. Anything else returns nil
// and the Upgrade is removed as today. The value returned views h.
func (s *Server) upgradeAsked(h *fasthttp.RequestHeader, bodyless bool) []byte {
	if len(s.upgrades) == 0 || !bodyless || !h.IsGet() || !h.IsHTTP11() {
		return nil
	}
	var up []byte
	n, conn := 0, false
	for k, v := range h.All() {
		switch {
		case bytes.EqualFold(k, []byte("Upgrade")):
			n++
			up = v
		case bytes.EqualFold(k, []byte("Connection")):
			conn = conn || hasToken(v, "upgrade")
		}
	}
	if n != 1 || !conn {
		return nil
	}
	p := bytes.TrimSpace(up)
	name, ver, _ := bytes.Cut(p, []byte("/"))
	if len(name) == 0 || !isToken(name) || (len(ver) > 0 && !isToken(ver)) {
		return nil
	}
	for _, a := range s.upgrades {
		if bytes.EqualFold(name, []byte(a)) {
			return p
		}
	}
	return nil
}

// isToken reports whether b is an RFC 9110 token.
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tchar[c] {
			return false
		}
	}
	return true
}

// hasToken reports whether the comma list v holds tok (any case).
func hasToken(v []byte, tok string) bool {
	for f := range bytes.SplitSeq(v, []byte(",")) {
		if bytes.EqualFold(bytes.TrimSpace(f), []byte(tok)) {
			return true
		}
	}
	return false
}

// setUpgrade puts the upgrade back on a request head prepareRequest
// stripped of its hop-by-hop headers.
func setUpgrade(h *fasthttp.RequestHeader, proto []byte) {
	h.SetBytesV("Upgrade", proto)
	h.Set("Connection", "upgrade")
}

// switchOK reports whether a 101 answer h switches to proto, the Upgrade
// the request asked for: its Upgrade must name the same protocol.
func switchOK(h *fasthttp.ResponseHeader, proto []byte) bool {
	got := bytes.TrimSpace(h.Peek("Upgrade"))
	name, _, _ := bytes.Cut(proto, []byte("/"))
	gname, _, _ := bytes.Cut(got, []byte("/"))
	return len(gname) > 0 && bytes.EqualFold(name, gname)
}

// switchHead returns the 101 head relayed to the client: the backend's,
// hop-by-hop headers removed (prepareResponse), Upgrade and Connection
// put back.
func (s *Server) switchHead(dst []byte, h *fasthttp.ResponseHeader, p *plan, proto []byte, ip netip.Addr) []byte {
	s.prepareResponse(h, p, ip)
	h.SetBytesV("Upgrade", proto)
	h.Set("Connection", "upgrade")
	h.SetNoDefaultContentType(true)
	return h.AppendBytes(dst)
}

// tunnelSet is the server's tunnels: counted against MaxTunnels (pending
// upgrades included), and those open, for Shutdown to close.
type tunnelSet struct {
	mu   sync.Mutex
	live map[*tunnel]struct{}
	done chan struct{} // closed when live empties during a drain; nil otherwise
}

// takeTunnel counts an upgrade request about to be sent, unless
// MaxTunnels are open or pending.
func (s *Server) takeTunnel() bool {
	st := &s.stats
	for {
		n := st.TunnelsPending.Load()
		if n+st.Tunnels.Load() >= int64(s.cfg.MaxTunnels) {
			st.TunnelsRefused.Add(1)
			return false
		}
		if st.TunnelsPending.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// tunnel is one open tunnel: two connections copied into each other.
type tunnel struct {
	s        *Server
	client   net.Conn
	backend  net.Conn
	last     atomic.Int64 // unix ns of the last byte either way
	once     sync.Once
	idleShut atomic.Bool
	// For the access log: the bytes each way (each written by its own
	// direction, read once both have ended) and how the tunnel ended
	// (accesslog.End+1 of the first failure; 0 when none).
	in, out int64
	ended   atomic.Uint32
}

// fail records how the tunnel ended, if nothing did before: side is the
// connection that failed (the client or the backend), or nil for idle.
func (t *tunnel) fail(side net.Conn) {
	end := accesslog.EndTimeout
	switch side {
	case t.client:
		end = accesslog.EndClientAbort
	case t.backend:
		end = accesslog.EndBackendReset
	}
	t.ended.CompareAndSwap(0, uint32(end)+1)
}

// close closes both sides, once.
func (t *tunnel) close() {
	t.once.Do(func() {
		t.client.Close()
		t.backend.Close()
	})
}

// runTunnel copies client and backend into each other until both
// directions end, then closes both and uncounts the tunnel. cr and br
// are the sides' readers (holding bytes already read past the heads).
// It returns the bytes carried from the client and to it, and how the
// tunnel ended.
func (s *Server) runTunnel(client net.Conn, cr io.Reader, backend net.Conn, br io.Reader) (in, out int64, end accesslog.End) {
	t := &tunnel{s: s, client: client, backend: backend}
	t.last.Store(time.Now().UnixNano())
	ts := &s.tunnels
	ts.mu.Lock()
	if ts.live == nil {
		ts.live = map[*tunnel]struct{}{}
	}
	ts.live[t] = struct{}{}
	draining := s.shut.Load()
	ts.mu.Unlock()
	if draining && s.tunnelsForced.Load() {
		t.close()
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.copy(backend, client, cr)
	}()
	t.copy(client, backend, br)
	wg.Wait()
	t.close()
	ts.mu.Lock()
	delete(ts.live, t)
	if ts.done != nil && len(ts.live) == 0 {
		close(ts.done)
		ts.done = nil
	}
	ts.mu.Unlock()
	s.stats.Tunnels.Add(-1)
	if e := t.ended.Load(); e != 0 {
		end = accesslog.End(e - 1)
	}
	return t.in, t.out, end
}

// copy moves bytes from src (read through r) to dst through one window
// until src ends (passed on as a half-close of dst's writing side) or
// either side fails (the tunnel is closed). A read that waits longer
// than TunnelIdle ends the tunnel unless the other direction moved bytes
// meanwhile.
func (t *tunnel) copy(dst, src net.Conn, r io.Reader) {
	idle := t.s.cfg.TunnelIdle
	buf := make([]byte, tunnelWindow)
	for {
		src.SetReadDeadline(time.Now().Add(idle))
		n, err := r.Read(buf)
		if n > 0 {
			t.last.Store(time.Now().UnixNano())
			dst.SetWriteDeadline(time.Now().Add(idle))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				t.fail(dst)
				t.close()
				return
			}
			if dst == t.backend {
				t.in += int64(n)
			} else {
				t.out += int64(n)
			}
			t.last.Store(time.Now().UnixNano())
		}
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if since := time.Since(time.Unix(0, t.last.Load())); since < idle {
				continue // the other direction is busy: the tunnel is not idle
			}
			t.idleShut.Store(true)
			t.fail(nil)
			t.close()
			return
		}
		if err == io.EOF {
			if closeWrite(dst) == nil {
				return // half-close passed on; the other direction goes on
			}
			t.fail(dst)
		} else if !errors.Is(err, net.ErrClosed) {
			t.fail(src)
		}
		t.close()
		return
	}
}

// closeWrite shuts down the writing side of c (TCP FIN, or TLS
// close_notify), looking through the front end's connection wrappers.
func closeWrite(c net.Conn) error {
	for {
		switch x := c.(type) {
		case *gateConn:
			c = x.Conn
		case *hijacked:
			c = x.Conn
		case *slotConn:
			c = x.Conn
		case interface{ CloseWrite() error }:
			return x.CloseWrite()
		default:
			return errors.ErrUnsupported
		}
	}
}

// drainTunnels waits for the open tunnels to end until ctx is done, then
// closes those left.
func (s *Server) drainTunnels(ctx context.Context) {
	ts := &s.tunnels
	ts.mu.Lock()
	if len(ts.live) == 0 {
		ts.mu.Unlock()
		return
	}
	done := make(chan struct{})
	ts.done = done
	ts.mu.Unlock()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	s.tunnelsForced.Store(true)
	ts.mu.Lock()
	for t := range ts.live {
		t.close()
	}
	ts.mu.Unlock()
}

// dialTLS dials a backend connection, under -http-backend-max-conns, and
// does the TLS handshake when cfg is set, within ConnectTimeout. A
// failed handshake is a dial error (the request was not sent; it may
// move to another backend).
func (s *Server) dialTLS(addr string, cfg *tls.Config) (net.Conn, error) {
	return s.dialWith(addr, cfg, nil)
}

// dialWith is dialTLS writing pre (a PROXY header) first, before TLS.
func (s *Server) dialWith(addr string, cfg *tls.Config, pre []byte) (net.Conn, error) {
	c, err := s.dialBackend(addr)
	if err == nil && len(pre) > 0 {
		c.SetWriteDeadline(time.Now().Add(s.cfg.ConnectTimeout))
		if _, err = c.Write(pre); err != nil {
			c.Close()
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
		}
		c.SetWriteDeadline(time.Time{})
	}
	if err != nil || cfg == nil {
		return c, err
	}
	tc := tls.Client(c, cfg)
	tc.SetDeadline(time.Now().Add(s.cfg.ConnectTimeout))
	if err := tc.Handshake(); err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: nil, Err: err}
	}
	tc.SetDeadline(time.Time{})
	return tc, nil
}

// forwardUpgrade is the fasthttp engine's forward for an upgrade request
// (proto is its Upgrade): a backend connection of its own, then either a
// tunnel (101 with the same Upgrade) or the answer relayed as HTTP.
//
// lg is the request's access-log record (nil when not logged): an answer
// relayed as HTTP is logged as any other; a switch, when its tunnel ends.
func (s *Server) forwardUpgrade(ctx *fasthttp.RequestCtx, p *plan, v *reqView, proto []byte, lg *reqLog) {
	h := &ctx.Request.Header
	ip := remoteAddr(ctx)
	if !s.takeTunnel() {
		s.writeRefusal(&ctx.Response, fasthttp.StatusServiceUnavailable, tunnelRetry, psTunnelLimit, "tunnels at their limit")
		return
	}
	pending := true
	defer func() {
		if pending {
			s.stats.TunnelsPending.Add(-1)
		}
	}()
	proto = bytes.Clone(proto) // prepareRequest rewrites the head it views
	s.prepareRequest(h, ip, p.secure)
	if p.strip != "" {
		if t := v.stripTarget(h, p.strip); t != nil {
			ctx.Request.SetRequestURIBytes(t)
		}
	}
	setUpgrade(h, proto)
	if !s.held.take(ip) {
		s.stats.SourceLimited.Add(1)
		s.writeRefusal(&ctx.Response, fasthttp.StatusServiceUnavailable, connRetry, psSourceLimit, "backend connections for this client at their limit")
		return
	}
	held := true
	defer func() {
		if held {
			s.held.release(ip)
		}
	}()
	var conn net.Conn
	var br *bufio.Reader
	var resp fasthttp.ResponseHeader
	for {
		p.acquireBackend()
		var err error
		conn, br, err = s.upgradeExchange(&ctx.Request, p.b, &resp, proto, proxyHeaderOf(ctx, p.b))
		if err == nil {
			break
		}
		p.releaseBackend(s.clock.Now(), result(err, 0))
		if p.mayRetry() && notSent(err) {
			switch s.retryElsewhere(p, &ctx.Response, h, v, ip) {
			case retrySend:
				continue
			case retryRefused:
				return
			}
		}
		s.writeFailure(&ctx.Response, err)
		return
	}
	st := resp.StatusCode()
	if st == fasthttp.StatusSwitchingProtocols {
		// A switch is a success for passive health; the tunnel is not an
		// outstanding request of the backend.
		p.releaseBackend(s.clock.Now(), lb.OK)
		if s.endedByCritical(p) {
			conn.Close()
			s.writeAborted(&ctx.Response)
			return
		}
		head := s.switchHead(nil, &resp, p, proto, ip)
		pending = false
		s.stats.TunnelsPending.Add(-1)
		s.stats.Tunnels.Add(1)
		s.stats.TunnelsTotal.Add(1)
		g, _ := ctx.Conn().(*gateConn)
		if g != nil {
			g.tunnel.Store(true) // from here the client's bytes are not HTTP
		}
		ctx.HijackSetNoResponse(true)
		// The source's count of backend connections (MaxConns/8) goes on
		// for the tunnel's life, which holds its backend connection.
		held = false
		var tp plan
		if lg != nil && s.logging() {
			lg.tunnel, tp = true, *p
		} else {
			lg = nil
		}
		ctx.Hijack(func(c net.Conn) {
			defer s.held.release(ip)
			c.SetWriteDeadline(time.Now().Add(s.cfg.ClientReadTimeout))
			if _, err := c.Write(head); err != nil {
				conn.Close()
				s.stats.Tunnels.Add(-1)
				if lg != nil {
					s.endTunnelLog(lg, &tp, 0, 0, accesslog.EndClientAbort, s.clock.Now())
					reqLogPool.Put(lg)
				}
				return
			}
			// Reads go through c, which holds what fasthttp buffered;
			// half-closes and deadlines reach the socket through g.
			client := net.Conn(c)
			if g != nil {
				client = &hijacked{Conn: g, r: c}
			}
			in, out, end := s.runTunnel(client, c, conn, br)
			if lg != nil {
				s.endTunnelLog(lg, &tp, in, out, end, s.clock.Now())
				reqLogPool.Put(lg)
			}
		})
		return
	}
	// Any other answer stays HTTP on the client's connection; the backend
	// connection is closed once its body is relayed.
	p.releaseBackend(s.clock.Now(), result(nil, st))
	if s.endedByCritical(p) {
		conn.Close()
		s.writeAborted(&ctx.Response)
		return
	}
	resp.CopyTo(&ctx.Response.Header)
	cl := resp.ContentLength()
	body := &backendBody{conn: conn, timeout: s.cfg.BackendTimeout, br: br, want: int64(cl)}
	body.finish = func(bool) { conn.Close() }
	switch {
	case st == fasthttp.StatusNoContent || st == fasthttp.StatusNotModified:
		body.r = bytes.NewReader(nil)
		body.want = 0
		cl = 0
	case cl >= 0:
		body.r = io.LimitReader(br, int64(cl))
	case cl == -1:
		body.r = httputil.NewChunkedReader(br)
	default:
		body.r = br
	}
	s.prepareResponse(&ctx.Response.Header, p, ip)
	ctx.Response.SetBodyStream(body, cl)
	body.held, body.src, held = &s.held, ip, false
	if lg != nil {
		// Logged when the relayed body ends.
		lg.answered, lg.streamed = true, true
		body.log, body.s, body.plan = lg, s, *p
	}
}

// upgradeExchange dials b (with pre, its PROXY header, and its TLS), writes req and reads the final
// answer head into resp (1xx other than 101 skipped, at most
// maxInformational). On error the connection is closed.
func (s *Server) upgradeExchange(req *fasthttp.Request, b *lb.Backend, resp *fasthttp.ResponseHeader, proto []byte, pre []byte) (net.Conn, *bufio.Reader, error) {
	conn, err := s.dialWith(b.Addr(), b.TLS(), pre)
	if err != nil {
		return nil, nil, err
	}
	conn.SetWriteDeadline(deadline(s.cfg.BackendTimeout))
	bw := bufio.NewWriterSize(conn, 4<<10)
	if err = req.Header.Write(bw); err == nil {
		err = bw.Flush()
	}
	if err != nil {
		conn.Close()
		return nil, nil, asTimeout(err)
	}
	conn.SetWriteDeadline(time.Time{})
	conn.SetReadDeadline(deadline(s.cfg.BackendTimeout))
	br := bufio.NewReaderSize(conn, 16<<10)
	resp.SetNoDefaultContentType(true)
	err = readAnswerHead(resp, br)
	for n := 0; err == nil; n++ {
		st := resp.StatusCode()
		if st == fasthttp.StatusSwitchingProtocols {
			if !switchOK(resp, proto) {
				err = errUpgradeMismatch
			}
			break
		}
		if st >= 200 {
			break
		}
		if n == maxInformational {
			err = errInformational
			break
		}
		err = readAnswerHead(resp, br)
	}
	if err != nil {
		conn.Close()
		return nil, nil, asTimeout(err)
	}
	conn.SetReadDeadline(time.Time{})
	return conn, br, nil
}

// hijacked is a hijacked client connection: reads from r (fasthttp's
// buffered reader first), everything else on the gate's connection.
type hijacked struct {
	net.Conn
	r io.Reader
}

func (h *hijacked) Read(p []byte) (int, error) { return h.r.Read(p) }

// TunnelStatus is the front end's tunnels as /status shows them.
type TunnelStatus struct {
	Open     int64    `json:"open"`     // tunnels open now
	Pending  int64    `json:"pending"`  // upgrade requests awaiting their answer
	Max      int      `json:"max"`      // -http-max-tunnels, open and pending together
	Total    uint64   `json:"total"`    // tunnels opened since start
	Refused  uint64   `json:"refused"`  // upgrade requests answered 503 at Max
	Upgrades []string `json:"upgrades"` // -http-upgrade: the protocols forwarded
	Idle     string   `json:"idle"`     // -http-tunnel-idle
}

// TunnelStatus returns the tunnels' counts and limits now.
func (s *Server) TunnelStatus() TunnelStatus {
	st := &s.stats
	up := s.upgrades
	if up == nil {
		up = []string{}
	}
	return TunnelStatus{
		Open: st.Tunnels.Load(), Pending: st.TunnelsPending.Load(), Max: s.cfg.MaxTunnels,
		Total: st.TunnelsTotal.Load(), Refused: st.TunnelsRefused.Load(),
		Upgrades: up, Idle: s.cfg.TunnelIdle.String(),
	}
}
