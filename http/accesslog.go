package http

// The HTTP access log and request ids: both engines gather one request's
// record in a reqLog as the request goes (beginLog after admission, the
// decision, the backend's timings, the answer) and hand it to the
// accesslog.Logger at its end (endLog), which copies it into its ring
// without blocking or allocating. Request ids are taken from trusted
// clients or made here, sent to the backend and written in the answers
// sluice makes itself.

import (
	"bytes"
	"crypto/tls"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
)

// noAnswer is reqLog.status for a request that got no answer: logged as
// status 499 when its client left (statusClientClosed), else 0.
const noAnswer = -1

// statusClientClosed is the status logged for a request whose client
// left before any answer was sent (while its body came, it waited in a
// delay queue or for the backend): nginx's 499 "client closed request",
// which no answer carries.
const statusClientClosed = 499

// maxRequestID is the longest X-Request-ID taken from a trusted client;
// a longer one (or one with bytes outside visible ASCII) is replaced.
const maxRequestID = 128

// reqLog is one request's access-log record as it is gathered. An engine
// keeps one per request in flight (the loop in the exchange, the fasthttp
// engine from a pool); its buffers stay warm across requests.
type reqLog struct {
	rec   accesslog.HTTPRecord
	buf   []byte // the request's strings the record views
	rid   [maxRequestID]byte
	ridN  int
	start int64 // admission clock: the request head began (or was read, when the engine cannot tell)
	head  int64 // the head was read whole
	// decided is when the delay ended; connect and first when the
	// backend connection was ready and the answer's first byte came.
	decided, connect, first int64
	admitted                int64 // admission decided (a delay's wait is from here)
	delayed                 bool
	rule                    string       // the ARM rule that delayed the request
	refused                 bool         // pick answered instead of a backend
	local                   bool         // the answer is one sluice made
	began                   bool         // beginLog filled it
	answered                bool         // fasthttp: the answer is the backend's (or no answer)
	streamed                bool         // fasthttp: a streamed body's Close logs it
	tunnel                  bool         // fasthttp: switched to a tunnel, logged when it ends
	tunDone                 bool         // loop: the tunnel ended with both sides' EOF
	tunIn, tunOut           int64        // loop: tunnel bytes client to backend, backend to client
	body                    *backendBody // HTTP/2: the streamed body, read when the stream ends
	skip                    bool         // logged already, or not logged here (an upgrade: its tunnel)
	madeTrace               bool         // rec's trace context is sluice's (Deps.Tracer), sent to the backend
	status                  int          // the answer's status
	end                     accesslog.End
	out, headOut            int64 // bytes written to the client; of which heads (loop)
	reason                  [160]byte
	reasonN                 int
}

// logging reports whether requests are logged (or traced).
func (s *Server) logging() bool { return s.alog.Enabled(accesslog.HTTP) }

// beginLog starts g for the request whose head is h, admitted (or not)
// into p: the request id (taken from a trusted client, else made), and,
// when requests are logged, the request's own fields. start is when its
// head began and now when admission decided, on the engine's clock (the
// timings are differences of it); wall is start on the wall clock. conn
// is the client's TLS connection (nil: plain), for the version and SNI.
func (s *Server) beginLog(g *reqLog, p *plan, h *fasthttp.RequestHeader, client netip.AddrPort, conn net.Conn, wall time.Time, start, now int64) {
	buf := g.buf[:0]
	// Cleared in place: a composite literal with fields set is built on
	// the stack (1 KB) and copied, and on a new goroutine (an HTTP/2
	// stream's) that frame made the stack grow, a copy per stream.
	*g = reqLog{}
	g.buf, g.start, g.head, g.decided, g.admitted, g.began = buf, start, now, now, now, true
	if s.cfg.RequestID {
		s.takeRequestID(g, h, client.Addr())
	}
	if !s.logging() {
		return
	}
	r := &g.rec
	r.Start, r.Client = wall, client
	if s.isTrusted(client.Addr()) {
		r.Forwarded = s.forwardedClient(h)
	}
	uri := h.RequestURI()
	path, query := uri, []byte(nil)
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		path, query = uri[:i], uri[i+1:]
	}
	// One buffer, offsets first: it may grow while being filled.
	var offs [8][2]int
	for i, b := range [...][]byte{h.Method(), h.Host(), path, query, h.UserAgent(), h.Referer(), g.rid[:g.ridN]} {
		offs[i][0] = len(buf)
		buf = append(buf, b...)
		offs[i][1] = len(buf)
	}
	if gc, ok := conn.(*gateConn); ok {
		conn = gc.Conn
	}
	if tc, ok := conn.(*tls.Conn); ok {
		st := tc.ConnectionState()
		r.TLSVersion = st.Version
		offs[7][0] = len(buf)
		buf = append(buf, st.ServerName...)
		offs[7][1] = len(buf)
	}
	g.buf = buf
	at := func(i int) []byte {
		if offs[i][0] == offs[i][1] {
			return nil
		}
		return buf[offs[i][0]:offs[i][1]:offs[i][1]]
	}
	r.Method, r.Host, r.Path, r.Query, r.UserAgent, r.Referer, r.RequestID, r.SNI = at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7)
	if h.IsHTTP11() {
		r.Proto = "HTTP/1.1"
	} else {
		r.Proto = "HTTP/1.0"
	}
	if tp := h.Peek("traceparent"); len(tp) > 0 {
		r.TraceID, r.ParentSpan, r.TraceFlags, r.HasTrace = accesslog.ParseTraceparentBytes(tp)
	}
	if !r.HasTrace && s.trace != nil {
		// Spans are exported: the request's span is the root of a new
		// trace, logged, and the backend's parent (setRequestID).
		var sampled bool
		r.TraceID, r.ParentSpan, sampled = s.trace.StartTrace()
		r.TraceFlags, r.HasTrace, g.madeTrace = 0, true, true
		if sampled {
			r.TraceFlags = 1
		}
	}
	r.BytesIn = int64(max(h.ContentLength(), 0))
}

// forwardedClient is the client a trusted proxy names (the request came
// from one): the rightmost address of X-Forwarded-For (every line of it,
// in order) that is not itself a trusted proxy, as nginx's real_ip with
// real_ip_recursive on takes it; the leftmost when all are trusted.
// Without X-Forwarded-For, Forwarded's for= parameters are read the same
// way. Each proxy appends the address it took the request from, so
// everything left of the first untrusted address (reading from the right)
// is what that untrusted client chose to write; the leftmost address,
// which an attacker sends ahead of a real proxy's, is never the answer
// while an untrusted one follows it. An entry that is no address (garbage,
// "unknown", an obfuscated Forwarded node) ends the walk there: the answer
// is the trusted address right of it, none when it is the rightmost. The
// result is invalid when no address qualifies. It allocates nothing.
func (s *Server) forwardedClient(h *fasthttp.RequestHeader) netip.Addr {
	var xff, fwd fwdWalk
	for k, v := range h.All() {
		switch {
		case len(k) == len("X-Forwarded-For") && bytes.EqualFold(k, []byte("X-Forwarded-For")):
			xff.seen = true
			walkList(v, false, s.isTrusted, &xff)
		case !xff.seen && len(k) == len("Forwarded") && bytes.EqualFold(k, []byte("Forwarded")):
			fwd.seen = true
			walkList(v, true, s.isTrusted, &fwd)
		}
	}
	if xff.seen {
		return xff.res
	}
	return fwd.res
}

// fwdWalk is the state of reading a forwarding list left to right with
// the outcome of nginx's right-to-left walk: res is the answer for the
// entries read so far; until fixed (at the start, and after an entry that
// is no address) the next trusted address becomes it. seen: the header
// came.
type fwdWalk struct {
	res         netip.Addr
	fixed, seen bool
}

// add takes the next entry: a, or invalid for an entry that is no address.
func (w *fwdWalk) add(a netip.Addr, trusted func(netip.Addr) bool) {
	switch {
	case !a.IsValid():
		w.res, w.fixed = netip.Addr{}, false
	case !trusted(a):
		w.res, w.fixed = a, true
	case !w.fixed:
		w.res, w.fixed = a, true
	}
}

// walkList feeds the entries of one X-Forwarded-For line (forwarded
// false: comma-separated addresses) or one Forwarded line (RFC 7239:
// comma-separated elements of ';'-separated pairs, values tokens or
// quoted strings; an element's address is its for= value) to w. Empty
// entries are skipped, as nginx skips them.
func walkList(v []byte, forwarded bool, trusted func(netip.Addr) bool, w *fwdWalk) {
	for len(v) > 0 {
		var el []byte
		el, v = cutOutsideQuotes(v, ',')
		el = bytes.TrimSpace(el)
		if len(el) == 0 {
			continue
		}
		if !forwarded {
			w.add(parseHostPort(el), trusted)
			continue
		}
		var a netip.Addr
		for len(el) > 0 {
			var pair []byte
			pair, el = cutOutsideQuotes(el, ';')
			pair = bytes.TrimSpace(pair)
			if len(pair) > 4 && pair[3] == '=' && bytes.EqualFold(pair[:3], []byte("for")) {
				val := bytes.TrimSpace(pair[4:])
				if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
					val = val[1 : len(val)-1]
				}
				a = parseHostPort(val)
				break
			}
		}
		w.add(a, trusted)
	}
}

// cutOutsideQuotes splits v at the first sep outside a quoted string.
func cutOutsideQuotes(v []byte, sep byte) (before, after []byte) {
	quoted := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"':
			quoted = !quoted
		case c == '\\' && quoted:
			i++
		case c == sep && !quoted:
			return v[:i], v[i+1:]
		}
	}
	return v, nil
}

// parseHostPort parses an address as forwarding headers write it: "IPv4",
// "IPv4:port", "IPv6", "[IPv6]" or "[IPv6]:port"; invalid for anything
// else (names, "unknown", zones, a port that is no number).
func parseHostPort(v []byte) netip.Addr {
	if len(v) == 0 || bytes.IndexByte(v, '%') >= 0 {
		return netip.Addr{}
	}
	var port []byte
	if v[0] == '[' {
		i := bytes.IndexByte(v, ']')
		if i < 0 {
			return netip.Addr{}
		}
		v, port = v[1:i], v[i+1:]
		if len(port) > 0 {
			if port[0] != ':' {
				return netip.Addr{}
			}
			port = port[1:]
			if len(port) == 0 {
				return netip.Addr{}
			}
		}
	} else if i := bytes.IndexByte(v, ':'); i >= 0 && bytes.IndexByte(v[i+1:], ':') < 0 {
		v, port = v[:i], v[i+1:]
		if len(port) == 0 {
			return netip.Addr{}
		}
	}
	if len(port) > 5 {
		return netip.Addr{}
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return netip.Addr{}
		}
	}
	a, err := netip.ParseAddr(b2s(v))
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}

// takeRequestID sets g's request id: a trusted client's X-Request-ID
// (visible ASCII, at most maxRequestID bytes), else 32 hex digits made
// here. An id from anyone else is replaced: a client may not plant ids in
// the backend's logs.
func (s *Server) takeRequestID(g *reqLog, h *fasthttp.RequestHeader, ip netip.Addr) {
	if v := h.Peek("X-Request-ID"); len(v) > 0 && len(v) <= maxRequestID && visibleASCII(v) && s.isTrusted(ip) {
		g.ridN = copy(g.rid[:], v)
		return
	}
	var raw [16]byte
	a, b := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		raw[i], raw[8+i] = byte(a>>(8*i)), byte(b>>(8*i))
	}
	g.ridN = len(accesslog.AppendHex(g.rid[:0], raw[:]))
}

func visibleASCII(v []byte) bool {
	for _, c := range v {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// setRequestID writes the request id into the head sent to the backend,
// replacing every line of it the client sent (a second line would
// otherwise reach the backend beside sluice's). When sluice started the
// request's trace (Deps.Tracer: the client sent no valid traceparent), it
// writes that traceparent too, with the request's span as parent and the
// sampled flag as decided, replacing the client's invalid one and its
// tracestate (W3C Trace Context: a tracestate without a valid traceparent
// is discarded).
func (g *reqLog) setRequestID(h *fasthttp.RequestHeader) {
	if g == nil {
		return
	}
	if g.ridN > 0 {
		h.Del("X-Request-ID")
		h.SetBytesV("X-Request-ID", g.rid[:g.ridN])
	}
	if g.madeTrace {
		h.Del("traceparent")
		h.Del("tracestate")
		var b [55]byte
		h.SetBytesV("traceparent", appendTraceparent(b[:0], &g.rec))
	}
}

// appendTraceparent appends r's trace context as a W3C traceparent
// (version 00) to b.
func appendTraceparent(b []byte, r *accesslog.HTTPRecord) []byte {
	b = append(b, "00-"...)
	b = accesslog.AppendHex(b, r.TraceID[:])
	b = append(b, '-')
	b = accesslog.AppendHex(b, r.ParentSpan[:])
	b = append(b, '-', '0', '0'+r.TraceFlags&1)
	return b
}

// decide records the admission decision d (before waitDelay) and the
// time the request left a delay.
func (s *Server) markDelayed(g *reqLog, d admission.Decision) {
	if g == nil {
		return
	}
	g.delayed = true
	if rules := s.ctrl.Rules(); d.Rule >= 0 && int(d.Rule) < len(rules) {
		g.rule = rules[d.Rule].Name()
	}
}

// localAnswer marks resp, an answer sluice made, as the request's: it
// carries the request id, and its Proxy-Status details are the reason.
func (g *reqLog) localAnswer(resp *fasthttp.Response) {
	g.local = true
	if g.ridN > 0 {
		resp.Header.SetBytesV("X-Request-ID", g.rid[:g.ridN])
	}
	ps := resp.Header.Peek("Proxy-Status")
	if i := bytes.Index(ps, []byte(`details="`)); i >= 0 {
		d := ps[i+len(`details="`):]
		if j := bytes.IndexByte(d, '"'); j >= 0 {
			d = d[:j]
		}
		g.reasonN = copy(g.reason[:], d)
	} else if i := bytes.Index(ps, []byte("error=")); i >= 0 {
		g.reasonN = copy(g.reason[:], ps[i+len("error="):])
	}
}

// endLog finishes g for p with the answer's status and body bytes and
// now (the engine's clock), and hands it to the logger, once.
func (s *Server) endLog(g *reqLog, p *plan, status int, bodyOut int64, now int64) {
	if !g.began || g.skip || !s.logging() {
		return
	}
	g.skip = true
	if status == noAnswer {
		bodyOut = 0 // what was written went nowhere
	}
	if status == noAnswer || status == 0 {
		status = 0
		if g.end == accesslog.EndClientAbort {
			status = statusClientClosed
		}
	}
	r := &g.rec
	r.Status, r.BytesOut = status, bodyOut
	if p.ref != nil {
		r.Pool = p.ref.name
	}
	if p.route > 0 && p.set != nil && p.route <= len(p.set.routeIDs) {
		r.Route = p.set.routeIDs[p.route-1]
	}
	if p.b != nil {
		r.Backend = p.b.ID()
	}
	if p.prev != nil {
		r.Retries, r.RetryBackends[0] = 1, p.prev.ID()
	}
	r.Class = accesslog.ClassNew
	if p.class == admission.Affinity && p.prev == nil {
		r.Class = accesslog.ClassAffinity
	}
	end := g.end
	switch {
	case g.local && (g.refused || status != 502 && status != 504):
		r.Decision = accesslog.Refused
		if end == accesslog.EndComplete {
			end = accesslog.EndRefused
		}
	case g.delayed:
		r.Decision = accesslog.Delayed
	}
	if g.local && end == accesslog.EndComplete {
		switch status {
		case 504:
			end = accesslog.EndTimeout
		case 502:
			end = accesslog.EndBackendReset
		}
	}
	r.End = end
	r.Reason = g.reason[:g.reasonN]
	if r.Decision == accesslog.Delayed && g.rule != "" && g.reasonN == 0 {
		n := copy(g.reason[:], "arm rule ")
		n += copy(g.reason[n:], g.rule)
		r.Reason = g.reason[:n]
	}
	since := func(t int64) (d time.Duration) {
		if t <= 0 || t < g.start {
			return 0
		}
		return time.Duration(t - g.start)
	}
	r.HeadRead = since(g.head)
	if g.delayed {
		r.AdmissionWait = time.Duration(max(g.decided-g.admitted, 0))
	}
	r.Connect, r.FirstByte, r.Total = since(g.connect), since(g.first), since(now)
	s.alog.LogHTTP(r)
}

// endOf is how an exchange that failed after its answer began ended.
func endOf(err error) accesslog.End {
	if errors.Is(err, fasthttp.ErrTimeout) {
		return accesslog.EndTimeout
	}
	return accesslog.EndBackendReset
}

// reqLogPool holds the fasthttp engine's records: one per request in
// flight, its buffers kept warm.
var reqLogPool = sync.Pool{New: func() any { return new(reqLog) }}

// clientAddrPort is the fasthttp client's address and port.
func clientAddrPort(ctx *fasthttp.RequestCtx) netip.AddrPort {
	if a, ok := ctx.RemoteAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPortFrom(remoteAddr(ctx), 0)
}

// abortedCritical records new work ended by memory state Critical on the
// fasthttp engine: its 503 went out through fasthttp's timeout answer,
// and ctx.Response is the abandoned exchange's, not to be read.
func (g *reqLog) abortedCritical() {
	if g == nil {
		return
	}
	g.answered, g.local, g.status = true, true, 503
	g.reasonN = copy(g.reason[:], "memory state critical")
}

// headTimes is when the fasthttp engine's request began and when its head
// was whole, on the server's clock, as the gate saw them (for a connection
// the loop handed over, its first head from the hand-over); now, now where
// the gate did not time it.
func headTimes(ctx *fasthttp.RequestCtx, now int64) (start, head int64) {
	if gc, ok := ctx.Conn().(*gateConn); ok && gc.lastHead != 0 && gc.lastBegin <= gc.lastHead && gc.lastHead <= now {
		return gc.lastBegin, gc.lastHead
	}
	return now, now
}

// endFastLog ends the fasthttp engine's record of a request when its
// handler returns: the answer in ctx.Response is sluice's own unless the
// backend's was relayed; a streamed answer is logged when its body ends.
func (s *Server) endFastLog(ctx *fasthttp.RequestCtx, g *reqLog, p *plan) {
	if g.streamed {
		g.status = ctx.Response.StatusCode()
		return // backendBody.Close logs it and puts g back
	}
	if g.tunnel {
		return // the tunnel's end logs it and puts g back
	}
	if !g.answered {
		g.localAnswer(&ctx.Response)
	}
	if g.status == 0 {
		g.status = ctx.Response.StatusCode()
	}
	if !ctx.Request.IsBodyStream() && g.rec.BytesIn == 0 {
		g.rec.BytesIn = int64(len(ctx.Request.Body()))
	}
	s.endLog(g, p, g.status, int64(len(ctx.Response.Body())), s.clock.Now())
	reqLogPool.Put(g)
}

// endH2Log ends an HTTP/2 stream's record once its answer was written
// (or the stream ended); a streamed answer's is ended by its body's Close,
// which comes after (the deferred CloseBodyStream).
func (s *Server) endH2Log(ctx *fasthttp.RequestCtx, g *reqLog, p *plan) {
	if g.status == 0 && ctx.LastTimeoutErrorResponse() == nil {
		g.status = ctx.Response.StatusCode()
	}
	var out int64
	switch b := g.body; {
	case b != nil:
		out = b.got
		switch {
		case b.eof:
		case b.failed:
			g.end = b.failEnd
		default:
			g.end = accesslog.EndClientAbort
		}
	case ctx.LastTimeoutErrorResponse() == nil:
		out = int64(len(ctx.Response.Body()))
	}
	s.endLog(g, p, g.status, out, s.clock.Now())
	reqLogPool.Put(g)
}

// endTunnelLog ends the record of an upgrade request whose backend
// switched protocols, when its tunnel ends: status 101, in and out the
// bytes the tunnel carried from the client and to it, end how it ended
// (complete when both sides closed in turn), now the end on the engine's
// clock (t_total is the request's whole life, tunnel included).
func (s *Server) endTunnelLog(g *reqLog, p *plan, in, out int64, end accesslog.End, now int64) {
	if !g.began || g.skip || !s.logging() {
		return
	}
	g.end, g.answered = end, true
	g.rec.BytesIn = in
	s.endLog(g, p, fasthttp.StatusSwitchingProtocols, out, now)
}

// logHeadRefused logs a request whose head sluice refused before reading
// it as a request (400, 414, 431, 501, 505): only the client, the status
// and the reason are known. Rare and not on the hot path: it may allocate.
func (s *Server) logHeadRefused(client netip.AddrPort, start time.Time, total time.Duration, status int, reason string) {
	if !s.logging() {
		return
	}
	r := &accesslog.HTTPRecord{
		Start: start, Client: client, Status: status, Decision: accesslog.Refused,
		Reason: []byte(reason), End: accesslog.EndRefused, Total: total,
	}
	s.alog.LogHTTP(r)
}

// inFlight maps a fasthttp engine request being sent to a backend to its
// record, so that the backend transport (which sees only the request) can
// time the connection and the answer's first byte. Only requests that
// are logged are in it. A shard's lock also orders the transport's
// writes before the record is ended: once forget returns, no exchange
// (not even one abandoned by memory state Critical) writes the record.
type inFlight struct {
	shards [16]inFlightShard
}

type inFlightShard struct {
	mu sync.Mutex
	m  map[*fasthttp.Request]*reqLog
	_  [48]byte // a cache line each
}

var fastInFlight inFlight

func (f *inFlight) shard(req *fasthttp.Request) *inFlightShard {
	return &f.shards[(uintptr(unsafe.Pointer(req))>>7)%uintptr(len(f.shards))]
}

// track registers g as req's record until forget.
func (f *inFlight) track(req *fasthttp.Request, g *reqLog) {
	sh := f.shard(req)
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[*fasthttp.Request]*reqLog)
	}
	sh.m[req] = g
	sh.mu.Unlock()
}

// forget ends req's registration.
func (f *inFlight) forget(req *fasthttp.Request) {
	sh := f.shard(req)
	sh.mu.Lock()
	delete(sh.m, req)
	sh.mu.Unlock()
}

// mark sets the connect (first false) or first-byte time of req's record,
// if it has one, to now.
func (f *inFlight) mark(req *fasthttp.Request, first bool, now int64) {
	sh := f.shard(req)
	sh.mu.Lock()
	if g := sh.m[req]; g != nil {
		if first {
			g.first = now
		} else {
			g.connect = now
		}
	}
	sh.mu.Unlock()
}

// markExchange is the backend transport's hook: the connection for req is
// ready (first false) or the answer's first byte came (first true).
func (s *Server) markExchange(req *fasthttp.Request, first bool) {
	if s == nil || !s.logging() {
		return
	}
	fastInFlight.mark(req, first, s.clock.Now())
}
