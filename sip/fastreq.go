package sip

import (
	"bytes"
	"net/netip"
	"strconv"

	gosip "github.com/emiago/sipgo/sip"
)

// The in-dialog fast path: a client's ACK or BYE over UDP carrying our
// Route with an affinity token (the record-routed call's in-dialog
// requests) is forwarded to the backend the token names without sipgo's
// parse and re-serialisation. scanInDialog finds what the forward needs
// (Request-URI, Vias, Routes, Max-Forwards, Call-ID, tags, CSeq,
// Content-Length) and declines whatever it is not certain sipgo reads the
// same way and writes back as the same bytes (the rules of fastresp.go),
// and fastInDialog declines every case but the plain one: no Route but
// ours, a token that verifies, its backend taking affinity over UDP, no
// transaction waiting for this ACK, no access log, no Via of ours (a
// loop), not from a backend, no Contact alias. Declined, the message
// takes the sipgo path from the start, nothing done. The bytes out are
// what handleInDialog's popOurRoutes, prepareForward and our Via make of
// it; FuzzFastInDialog holds the two to the same bytes.

// routeScan is one Route line as scanInDialog found it.
type routeScan struct {
	lineStart, lineEnd int
	host               []byte
	port               int
	token              []byte // the sl parameter's value
	hasToken           bool
	transport          bool // a transport parameter: left to the slow path
}

// reqScan is what scanInDialog finds in a request.
type reqScan struct {
	method     []byte
	uri        []byte // the Request-URI as received (in the form sipgo writes)
	lineEnd    int    // the end of the request line, its CRLF included
	cseqMethod []byte
	seq        uint32
	callID     []byte
	fromVal    []byte
	toTag      []byte
	via        viaScan // the top Via
	viaVal     [2]int  // the top Via's value: start, end of host[:port]
	viaEnd     int     // the end of the top Via's value
	ourVia     bool    // a Via with a branch of ours below or on top
	routes     [2]routeScan
	nroute     int
	mf         int
	hasMF      bool
	mfVal      [2]int // the Max-Forwards value
	alias      bool   // a Contact that may hold an alias= of ours
	headEnd    int    // where the empty line ending the head starts
	headLen    int
	// The To value, as in respScan.
	toValStart, toValEnd int
	toDisplay            []byte
	toRest               []byte
}

// scanInDialog reports whether data is an ACK or BYE the fast path may
// take, and fills rq.
func scanInDialog(data []byte, rq *reqScan) bool {
	if len(data) > gosip.ParseMaxMessageLength || len(data) < 16 {
		return false
	}
	var method []byte
	switch {
	case bytes.HasPrefix(data, []byte("ACK ")):
		method = data[:3]
	case bytes.HasPrefix(data, []byte("BYE ")):
		method = data[:3]
	default:
		return false
	}
	i := 4
	us := i
	for i < len(data) && data[i] != ' ' && data[i] != '\r' {
		i++
	}
	uri := data[us:i]
	if !bytes.HasPrefix(uri, []byte("sip:")) || !scanURI(uri) {
		return false
	}
	if len(data)-i < 10 || string(data[i:i+10]) != " SIP/2.0\r\n" {
		return false
	}
	i += 10
	rq.method, rq.uri, rq.lineEnd = method, uri, i
	var have struct{ to, from, callID, cseq, cl bool }
	cl := -1
	nvia := 0
	rq.nroute, rq.hasMF, rq.ourVia, rq.alias = 0, false, false, false
	for {
		ls := i
		line, next, ok := headLine(data, i)
		if !ok {
			return false
		}
		i = next
		if len(line) == 0 {
			rq.headEnd = ls
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || colon+2 >= len(line) || line[colon+1] != ' ' {
			return false
		}
		name, val := line[:colon], line[colon+2:]
		for _, c := range name {
			if !isTokenChar(c) {
				return false
			}
		}
		if val[0] == ' ' || val[len(val)-1] == ' ' {
			return false
		}
		valStart := ls + colon + 2
		switch {
		case string(name) == "Via":
			nvia++
			if nvia > maxFastVias {
				return false
			}
			var v viaScan
			if !scanVia(val, &v) {
				return false
			}
			if len(v.branch) >= len(ourBranchPrefix) && string(v.branch[:len(ourBranchPrefix)]) == ourBranchPrefix {
				rq.ourVia = true
			}
			if nvia == 1 {
				v.lineStart, v.lineEnd = ls, i
				rq.via = v
				semi := bytes.IndexByte(val, ';')
				if semi < 0 {
					semi = len(val)
				}
				rq.viaVal = [2]int{valStart, valStart + semi}
				rq.viaEnd = valStart + len(val)
			}
		case string(name) == "Route":
			if rq.nroute == len(rq.routes) || !scanRoute(val, &rq.routes[rq.nroute]) {
				return false
			}
			rq.routes[rq.nroute].lineStart, rq.routes[rq.nroute].lineEnd = ls, i
			rq.nroute++
		case string(name) == "Max-Forwards":
			n, ok := scanDecimal(val, 1<<31)
			if rq.hasMF || !ok || n == 0 {
				return false
			}
			rq.hasMF, rq.mf, rq.mfVal = true, n, [2]int{valStart, valStart + len(val)}
		case string(name) == "To":
			var sc respScan
			if have.to || !scanTo(val, &sc) || len(sc.toTag) == 0 {
				return false
			}
			have.to = true
			rq.toTag, rq.toDisplay, rq.toRest = sc.toTag, sc.toDisplay, sc.toRest
			rq.toValStart, rq.toValEnd = valStart, valStart+len(val)
		case string(name) == "Call-ID":
			if have.callID || bytes.IndexByte(val, ' ') >= 0 {
				return false
			}
			have.callID = true
			rq.callID = val
		case string(name) == "CSeq":
			var sc respScan
			if have.cseq || !scanCSeq(val, &sc) {
				return false
			}
			have.cseq = true
			rq.seq, rq.cseqMethod = sc.seq, sc.method
		case string(name) == "Content-Length":
			n, ok := scanDecimal(val, 1<<31)
			if have.cl || !ok {
				return false
			}
			have.cl = true
			cl = n
		case headerNamed(string(name), "from"):
			if have.from {
				return false
			}
			have.from = true
			rq.fromVal = val
		case headerNamed(string(name), "contact"):
			if containsFold(val, aliasParam+"=") {
				rq.alias = true
			}
		default:
			if typedHeader(name) {
				return false
			}
		}
	}
	rq.headLen = i
	if nvia == 0 || !have.to || !have.callID || !have.cseq || !have.cl || !have.from || !bytes.Equal(rq.cseqMethod, rq.method) {
		return false
	}
	return len(data)-i == cl
}

// scanRoute reads one Route value: exactly "<URI>", a sip: URI with a
// port, in the form sipgo writes back.
func scanRoute(val []byte, r *routeScan) bool {
	if len(val) < 2 || val[0] != '<' || val[len(val)-1] != '>' {
		return false
	}
	u := val[1 : len(val)-1]
	if !bytes.HasPrefix(u, []byte("sip:")) || !scanURI(u) || bytes.IndexByte(u, '@') >= 0 {
		return false
	}
	u = u[4:]
	semi := bytes.IndexByte(u, ';')
	if semi < 0 {
		semi = len(u)
	}
	host, port, ok := scanHostPort(u[:semi])
	if !ok || port == 0 {
		return false
	}
	*r = routeScan{host: host, port: port}
	return scanParams(u[semi:], func(k, v []byte, hasV bool) {
		switch string(k) {
		case tokenParam:
			r.token, r.hasToken = v, true
		case "transport":
			r.transport = true
		}
	})
}

// appendInDialogWire appends to b the request in data as it is forwarded:
// the request line, ourVia (a whole "Via: ...\r\n" line), the headers in
// order without our Routes, the top Via with received and rport set,
// Max-Forwards one less and at most 70 (70 added at the end when there is
// none), the To value as sipgo writes it, then the body.
func (rq *reqScan) appendInDialogWire(b, data, ourVia []byte, src netip.AddrPort) []byte {
	b = append(b, data[:rq.lineEnd]...)
	b = append(b, ourVia...)
	// The edits, in the order of their place in data.
	type edit struct{ start, end, kind int }
	const (
		drop = iota
		via
		mf
		to
	)
	var es [5]edit
	n := 0
	for k := range rq.nroute {
		es[n] = edit{rq.routes[k].lineStart, rq.routes[k].lineEnd, drop}
		n++
	}
	es[n] = edit{rq.viaVal[0], rq.viaEnd, via}
	n++
	if rq.hasMF {
		es[n] = edit{rq.mfVal[0], rq.mfVal[1], mf}
		n++
	}
	es[n] = edit{rq.toValStart, rq.toValEnd, to}
	n++
	for i := 1; i < n; i++ {
		for j := i; j > 0 && es[j].start < es[j-1].start; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
	at := rq.lineEnd
	for _, e := range es[:n] {
		b = append(b, data[at:e.start]...)
		switch e.kind {
		case via:
			b = append(b, data[rq.viaVal[0]:rq.viaVal[1]]...)
			hadRcv, hadRport := false, false
			_ = scanParams(data[rq.viaVal[1]:rq.viaEnd], func(k, v []byte, hasV bool) {
				b = append(b, ';')
				b = append(b, k...)
				switch string(k) {
				case "received":
					hadRcv = true
					b = append(b, '=')
					b = src.Addr().AppendTo(b)
				case "rport":
					hadRport = true
					b = append(b, '=')
					b = strconv.AppendUint(b, uint64(src.Port()), 10)
				default:
					if hasV {
						b = append(b, '=')
						b = append(b, v...)
					}
				}
			})
			if !hadRcv {
				b = append(b, ";received="...)
				b = src.Addr().AppendTo(b)
			}
			if !hadRport {
				b = append(b, ";rport="...)
				b = strconv.AppendUint(b, uint64(src.Port()), 10)
			}
		case mf:
			b = strconv.AppendInt(b, int64(min(rq.mf-1, maxForwards)), 10)
		case to:
			if len(rq.toDisplay) > 0 {
				b = append(b, '"')
				b = append(b, rq.toDisplay...)
				b = append(b, '"', ' ')
			}
			b = append(b, rq.toRest...)
		}
		at = e.end
	}
	b = append(b, data[at:rq.headEnd]...)
	if !rq.hasMF {
		b = append(b, "Max-Forwards: 70\r\n"...)
	}
	return append(b, data[rq.headEnd:]...)
}

// fastInDialog forwards data from src as handleDatagram would if it is an
// in-dialog ACK or BYE the fast path takes; it reports false, having done
// nothing, for anything else.
func (s *Server) fastInDialog(data []byte, src source) bool {
	if src.conn != nil || s.noFastPath || s.logging() {
		return false
	}
	var rq reqScan
	if !scanInDialog(data, &rq) || rq.ourVia || rq.alias || rq.nroute == 0 {
		return false
	}
	p := s.pool.Load()
	if p == nil || p.backendFrom(src) != nil {
		return false
	}
	head := string(data[:rq.headLen])
	str := func(b []byte) string {
		if len(b) == 0 {
			return ""
		}
		off := cap(data) - cap(b) // b is a slice of data's head
		if off < 0 || off+len(b) > len(head) {
			return string(b) // not reached: every field is in the head
		}
		return head[off : off+len(b)]
	}
	var token string
	for k := range rq.nroute {
		r := &rq.routes[k]
		if r.transport || !s.isOurs(&gosip.Uri{Scheme: "sip", Host: str(r.host), Port: r.port}) {
			return false // popOurRoutes would stop at it, and it would go on
		}
		if token == "" && r.hasToken {
			token = str(r.token)
		}
	}
	callID := str(rq.callID)
	pool, id, ok := s.verifyToken(token, callID)
	if !ok {
		return false
	}
	b, removed := p.dialogBackend(id)
	now := s.clock.Now()
	if b == nil || b.tcp || !b.lb.AcceptsAffinity(now) {
		return false
	}
	ack := rq.method[0] == 'A'
	method := gosip.BYE
	if ack {
		method = gosip.ACK
	}
	k := clientTxnOfSentBy(str(rq.via.host), rq.via.port, str(rq.via.branch), src.addr, false, callID, rq.seq)
	toTag := str(rq.toTag)
	if ack {
		// handleAck: our own final answer's ACK, or the ACK of a relayed
		// non-2xx, is the slow path's.
		if len(toTag) >= len(localTagPrefix) && toTag[:len(localTagPrefix)] == localTagPrefix || s.txns.hasCompleted(k.key()) {
			return false
		}
	}
	// Decided: from here on, what handleRequest, handleInDialog and
	// forwardInDialog do, in their order.
	s.metrics.Requests.Add(1)
	s.metrics.FastPath.Add(1)
	s.admitAffinity(now, method, pool)
	s.metrics.Affinity.Add(1)
	if removed {
		s.metrics.AffinityGone.Add(1)
	}
	if pool == "" && len(b.spec.Pools) > 0 {
		pool = b.spec.Pools[0]
	}
	dst := target{addr: b.addr, dial: true}
	br := s.branches.branch(&k, loopHashOf(rq.uri, callID, true, tagParam(str(rq.fromVal)), toTag, rq.seq), dst)
	dst.client = src.addr
	var raw []byte // the request as received, for a 408 or 503 of ours
	var onErr func(error)
	if !ack {
		raw = append([]byte(nil), data...)
		s.watchRaw(raw, src, br, b.id, method, now)
		if s.udpOut != nil && s.udpOut.open.Load() {
			onErr = func(err error) {
				if req := s.forwardedRaw(raw, src, br, dst); req != nil {
					s.inDialogSendFailed(req, src, br, err)
				}
			}
		}
	}
	var vl [160]byte
	wb := wirePool.Get().(*[]byte)
	wire := rq.appendInDialogWire((*wb)[:0], data, s.appendOurVia(vl[:0], br, s.viaTransport(dst)), src.addr)
	err := s.postOr(wire, dst, &s.metrics.Forwarded, onErr)
	*wb = wire[:0]
	wirePool.Put(wb)
	if err != nil {
		s.log.Debug("sip forward", "err", err, "call_id", callID)
		if req := s.forwardedRaw(raw, src, br, dst); !ack && req != nil {
			s.inDialogSendFailed(req, src, br, err)
		}
	}
	return true
}

// viaPrefix is our Via line up to its branch value for a transport, as
// ourVia and sipgo write it, kept for the address it was made for.
type viaPrefix struct {
	tr   string
	hp   hostPort
	line []byte // "Via: SIP/2.0/UDP host:port;branch="
}

// appendOurVia appends to b the line of our Via with branch br for
// transport tr ("Via: ...\r\n"): the bytes ourVia(br, tr) writes.
func (s *Server) appendOurVia(b []byte, br, tr string) []byte {
	hp := s.advFor(tr)
	p := s.viaPfx.Load()
	if p == nil || p.tr != tr || p.hp != hp {
		var w bytes.Buffer
		s.ourVia("x", tr).StringWrite(&w)
		line := w.Bytes()
		p = &viaPrefix{tr: tr, hp: hp, line: line[:len(line)-1]}
		s.viaPfx.Store(p)
	}
	b = append(b, p.line...)
	b = append(b, br...)
	return append(b, "\r\n"...)
}

// parseRaw parses a request the fast path took, for an answer of ours to
// it: nil for none (raw nil), or, not reached, one sipgo refuses (the scan
// takes only what it parses).
func (s *Server) parseRaw(raw []byte) *gosip.Request {
	if raw == nil {
		return nil
	}
	m, err := s.parser.ParseSIP(raw)
	req, ok := m.(*gosip.Request)
	if err != nil || !ok {
		return nil
	}
	req.SetTransport("UDP")
	return req
}

// forwardedRaw is the request the fast path forwarded as sent to dst
// with our branch br, as handleInDialog's request is when its send fails:
// our Routes popped, prepareForward's changes, our Via on top (the
// answer of ours to it reads the client's Via with received and rport).
func (s *Server) forwardedRaw(raw []byte, src source, br string, dst target) *gosip.Request {
	req := s.parseRaw(raw)
	if req == nil {
		return nil
	}
	s.popOurRoutes(req)
	s.prepareForward(req, src)
	req.PrependHeader(s.ourVia(br, s.viaTransport(dst)))
	return req
}

// containsFold reports whether b holds the lower-case ASCII string sub in
// any case, without allocating.
func containsFold(b []byte, sub string) bool {
	for i := 0; i+len(sub) <= len(b); i++ {
		j := 0
		for j < len(sub) && b[i+j]|0x20 == sub[j] {
			j++
		}
		if j == len(sub) {
			return true
		}
	}
	return false
}
