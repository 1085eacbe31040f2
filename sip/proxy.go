package sip

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// handleRequest classifies a parsed request and routes it: ACK, CANCEL,
// in-dialog (To-tag) and new work.
func (s *Server) handleRequest(req *gosip.Request, raw []byte, src source) {
	via, cid, cseq := req.Via(), req.CallID(), req.CSeq()
	if via == nil || cid == nil || cseq == nil {
		s.malformed(raw, src, "missing via, call-id or cseq")
		return
	}
	if req.To() == nil || header(req, "from", "f") == nil || cseq.MethodName != req.Method ||
		!strings.EqualFold(req.SipVersion, "SIP/2.0") || req.Recipient.Host == "" && req.Recipient.Raw() == "" {
		s.metrics.Malformed.Add(1)
		if req.Method != gosip.ACK {
			s.metrics.BadRequests.Add(1)
			s.replyLocal(req, src, 400, "Bad Request")
		}
		return
	}
	now := s.clock.Now()
	if req.Method == gosip.OPTIONS && s.isPing(req) {
		// A balancer's health ping is never forwarded: answered here, and
		// 482 when it is our own come back or one of our backends' (the
		// two of us would send each other's requests round in a loop).
		if s.viaIsOurs(via) || s.pool.Load().backendAt(src.addr) != nil {
			s.metrics.Loops.Add(1)
			s.replyLocal(req, src, 482, "Loop Detected", "Warning: 399 "+s.adv.String()+` "health ping would loop"`)
			return
		}
		s.answerOptions(req, src)
		return
	}
	// RFC 3261 §16.3 step 3; an OPTIONS that may go no further is for us.
	if mf := req.MaxForwards(); mf != nil && mf.Val() == 0 {
		switch req.Method {
		case gosip.OPTIONS:
			s.answerOptions(req, src)
		case gosip.ACK:
		default:
			s.metrics.TooManyHops.Add(1)
			s.replyLocal(req, src, 483, "Too Many Hops")
		}
		return
	}
	// RFC 3261 §16.3 step 4: we forwarded this very request before.
	if s.looped(req) {
		s.metrics.Loops.Add(1)
		if req.Method != gosip.ACK {
			s.replyLoop(req, src)
		}
		return
	}
	p := s.pool.Load()
	if s.flowRequest(req, src, p, now) {
		return // from a backend, over a client's flow (flowroute.go)
	}
	switch {
	case req.Method == gosip.ACK:
		s.handleAck(req, src, p, now)
	case req.Method == gosip.CANCEL:
		s.handleCancel(req, src, p, now)
	case toTag(req) != "":
		s.handleInDialog(req, src, p, now)
	default:
		s.handleNewWork(req, src, now)
	}
}

// header returns the first header with one of the given lowercase names.
func header(m interface{ GetHeader(string) gosip.Header }, names ...string) gosip.Header {
	for _, n := range names {
		if h := m.GetHeader(n); h != nil {
			return h
		}
	}
	return nil
}

// isOurs reports whether u addresses the balancer: the advertised
// address (or bound IP) and port of the UDP/TCP listener or of any TLS,
// WS or WSS listener, so our entries are recognised whichever listener
// they name.
func (s *Server) isOurs(u *gosip.Uri) bool {
	port := uriPort(u)
	h := strings.Trim(u.Host, "[]")
	var ip netip.Addr
	if h != "" && (h[0] >= '0' && h[0] <= '9' || strings.IndexByte(h, ':') >= 0) {
		ip, _ = netip.ParseAddr(h)
		ip = ip.Unmap()
	}
	for i := range s.edgeAdv {
		if s.edgeAdv[i].matches(h, ip, port) {
			return true
		}
	}
	return false
}

// viaIsOurs reports whether a Via names the balancer.
func (s *Server) viaIsOurs(v *gosip.ViaHeader) bool {
	u := gosip.Uri{Host: v.Host, Port: v.Port}
	return s.isOurs(&u)
}

// popOurRoutes removes the Route entries that name us from the top of the
// route set (one, or two with double record-routing) and returns the
// first token among them.
func (s *Server) popOurRoutes(req *gosip.Request) (token string, had bool) {
	token, _, had = s.popOurRoutesFlow(req)
	return token, had
}

// popOurRoutesFlow is popOurRoutes that also returns the flow token of
// the entries removed: the user part of the first that has one (our
// client-facing Record-Route, RFC 5658, or the Path we added to a
// REGISTER, RFC 3327; the backend-facing entry has none). Both entries of
// a double Record-Route are read and removed whichever way the request
// goes: from the client the client-facing one is on top, from the
// backend the backend-facing one.
func (s *Server) popOurRoutesFlow(req *gosip.Request) (token, flow string, had bool) {
	for {
		r := req.Route()
		if r == nil || !s.isOurs(&r.Address) {
			return token, flow, had
		}
		if token == "" {
			token, _ = r.Address.UriParams.Get(tokenParam)
		}
		if flow == "" {
			flow = r.Address.User
		}
		had = true
		req.RemoveHeader("Route")
	}
}

// peekOurFlow returns, without removing anything, the flow token of the
// Route entries naming us on top of the route set (as popOurRoutesFlow
// would) and whether there are any.
func (s *Server) peekOurFlow(req *gosip.Request) (flow string, had bool) {
	for _, h := range req.Headers() {
		r, ok := h.(*gosip.RouteHeader)
		if !ok {
			continue
		}
		if !s.isOurs(&r.Address) {
			break
		}
		had = true
		if flow == "" {
			flow = r.Address.User
		}
	}
	return flow, had
}

// verifyToken checks a Record-Route token against the request's Call-ID
// and returns the backend it names, with the dialog's pool ("" in a
// token issued before pools). The backend, named by id, is where the
// request goes; the pool is informative: a dialog never moves pool, and
// its backend is found by id whatever pools it is in now.
func (s *Server) verifyToken(token, callID string) (pool, id string, ok bool) {
	if token == "" {
		return "", "", false
	}
	pool, subj, _, ok := s.signer.VerifyPool(token, time.Now())
	if !ok {
		return "", "", false
	}
	id, ok = splitSubject(subj, callID)
	return pool, id, ok
}

// maxForwards caps the Max-Forwards of every request we send (RFC 3261
// §8.1.1.6 recommends 70), so a loop through elements that do not detect
// it ends after 70 hops whatever the client asked for.
const maxForwards = 70

// prepareForward applies the per-hop changes every forwarded request gets:
// Max-Forwards decremented and capped at 70 (set to 70 when missing) and
// the client's Via stamped with received and rport from the address the
// request really came from, whatever the client wrote there (RFC 3261
// §18.2.1, RFC 3581), so the relayed responses go back to the sender and
// nowhere else.
func (s *Server) prepareForward(req *gosip.Request, src source) {
	if mf := req.MaxForwards(); mf != nil {
		mf.Dec()
		if *mf > maxForwards {
			*mf = maxForwards
		}
	} else {
		m := gosip.MaxForwardsHeader(maxForwards)
		req.AppendHeader(&m)
	}
	v := req.Via()
	v.Params.Add("received", src.addr.Addr().String())
	v.Params.Add("rport", strconv.Itoa(int(src.addr.Port())))
	if req.ContentLength() == nil {
		cl := gosip.ContentLengthHeader(len(req.Body()))
		req.AppendHeader(&cl)
	}
}

// ourVia returns a Via naming the balancer for the given transport (UDP,
// TCP, TLS, WS, WSS): the address of that transport's listener.
func (s *Server) ourVia(branch string, tr string) *gosip.ViaHeader {
	p := make(gosip.HeaderParams, 1, 2)
	p[0] = gosip.HeaderKV{K: "branch", V: branch}
	a := s.advFor(tr)
	return &gosip.ViaHeader{ProtocolName: "SIP", ProtocolVersion: "2.0", Transport: tr, Host: a.host, Port: a.port, Params: p}
}

// ourRecordRoute returns a Record-Route naming the balancer with token,
// as a peer reaching us over transport tr (UDP, TCP, TLS, WS, WSS) does:
// the address of that transport's listener and its transport parameter;
// sips says the request is addressed to a sips: URI (setRouteAddress).
func (s *Server) ourRecordRoute(token string, tr string, sips bool) *gosip.RecordRouteHeader {
	rr := &gosip.RecordRouteHeader{Address: gosip.Uri{Scheme: "sip", UriParams: make(gosip.HeaderParams, 0, 3)}}
	rr.Address.UriParams = append(rr.Address.UriParams, gosip.HeaderKV{K: "lr"})
	s.setRouteAddress(&rr.Address, tr, sips)
	rr.Address.UriParams.Add(tokenParam, token)
	return rr
}

// setRouteAddress is setOurAddress for one of our Record-Route entries.
// In a request addressed to a sips: URI, an entry its peer reaches over
// TLS is a sips: URI (RFC 3261 §16.6 step 4) without the transport=tls
// parameter RFC 5630 §3.1.3 deprecates: sips: already means TLS, and a
// UA that builds its route set from a sip: entry may take the dialog off
// TLS, or refuse a sips: dialog whose route set is not sips:. Any other
// entry (UDP, TCP, WebSocket, or a sip: request over TLS) is a sip: URI
// with its transport parameter.
func (s *Server) setRouteAddress(u *gosip.Uri, tr string, sips bool) {
	s.setOurAddress(u, tr)
	u.Scheme = "sip"
	if sips && strings.EqualFold(tr, "TLS") {
		u.Scheme = "sips"
		u.UriParams.Remove("transport")
	}
}

// setOurAddress points u at the listener of transport tr: its advertised
// host and port, and tr as u's transport parameter (none for UDP, the
// default of a sip: URI with an address).
func (s *Server) setOurAddress(u *gosip.Uri, tr string) {
	a := s.advFor(tr)
	u.Host, u.Port = a.host, a.port
	u.UriParams.Remove("transport")
	if strings.EqualFold(tr, "UDP") {
		return
	}
	// Right after lr when lr leads, as the first attempt wrote it.
	kv := gosip.HeaderKV{K: "transport", V: strings.ToLower(tr)}
	if len(u.UriParams) > 0 && u.UriParams[0].K == "lr" {
		u.UriParams = slices.Insert(u.UriParams, 1, kv)
		return
	}
	u.UriParams = append(u.UriParams, kv)
}

// forwardStateless sends req to dst with our Via, keeping no state.
func (s *Server) forwardStateless(req *gosip.Request, src source, dst target) {
	_ = s.forwardStatelessBranch(req, src, dst, s.branchOf(req, src, dst), nil)
}

// branchOf is our branch for req from src sent to dst.
func (s *Server) branchOf(req *gosip.Request, src source, dst target) string {
	k := clientTxnOf(req, src)
	return s.branches.branch(&k, loopHash(req), dst)
}

// forwardStatelessBranch sends req to dst with our Via of branch br. A
// UDP send queued in a read batch returns nil and, when it fails at the
// batch's end, calls onErr (if not nil) with the error.
func (s *Server) forwardStatelessBranch(req *gosip.Request, src source, dst target, br string, onErr func(error)) error {
	s.prepareForward(req, src)
	req.PrependHeader(s.ourVia(br, s.viaTransport(dst)))
	if err := s.postMsgOr(req, dst, &s.metrics.Forwarded, onErr); err != nil {
		s.log.Debug("sip forward", "err", err, "call_id", req.CallID().Value())
		return err
	}
	return nil
}

// forwardInDialog sends an in-dialog request to the dialog's backend b.
// The client always gets an answer: a backend that is down gets no
// request and the client 480 at once; a send that fails gets 503; any
// other request but ACK is watched and answered 408 if b stays silent
// for -sip-in-dialog-timeout (inDialogWatch). pool is the dialog's, for
// the access log.
func (s *Server) forwardInDialog(req *gosip.Request, src source, b *backend, pool string, now int64) {
	ack := req.Method == gosip.ACK
	if !b.lb.AcceptsAffinity(now) {
		if !ack {
			s.metrics.InDialogBackendDown.Add(1)
			extra := []string{"Warning: 399 " + s.adv.String() + ` "backend down"`, "Retry-After: " + strconv.Itoa(s.jitter(s.cfg.BusyDefault))}
			s.replyUnlogged(req, src, 480, "Temporarily Unavailable", extra...)
			s.logLocalIn(req, src, pool, 480, "Temporarily Unavailable", extra)
		}
		return
	}
	if s.sipsDowngrade(req, b.transport()) {
		s.refuseSips(req, src, b.transport())
		return
	}
	dst := target{addr: b.addr, tcp: b.tcp, dial: true}
	br := s.branchOf(req, src, dst)
	dst.client = src.addr
	if !ack {
		s.watch(req, src, br, b.id, pool, now)
	}
	var onErr func(error)
	if !ack && !dst.tcp && s.udpOut != nil && s.udpOut.open.Load() {
		onErr = func(err error) { s.inDialogSendFailed(req, src, br, err) }
	}
	if err := s.forwardStatelessBranch(req, src, dst, br, onErr); err != nil && !ack {
		s.inDialogSendFailed(req, src, br, err)
	}
}

// inDialogSendFailed answers the client of an in-dialog request whose
// send to its backend failed (at once, or at the end of the read batch
// that queued it).
func (s *Server) inDialogSendFailed(req *gosip.Request, src source, br string, err error) {
	s.unwatch(br)
	if errors.Is(err, errTooLarge) {
		s.replyTooLarge(req, src)
		return
	}
	if errors.Is(err, errProxyConnsFull) {
		s.reply(req, src, 503, "Service Unavailable", proxyFullHeaders(s)...)
		return
	}
	s.reply(req, src, 503, "Service Unavailable", "Warning: 399 "+s.adv.String()+` "backend unreachable"`, "Retry-After: "+strconv.Itoa(s.jitter(s.cfg.BusyDefault)))
}

// handleAck routes an ACK: absorbed if it acknowledges our own final
// response, to the INVITE's backend if it acknowledges a relayed non-2xx
// answer, else as an in-dialog request (the ACK of a 2xx).
func (s *Server) handleAck(req *gosip.Request, src source, p *backendSet, now int64) {
	tag := toTag(req)
	ckey := clientTxnOf(req, src).key()
	if strings.HasPrefix(tag, localTagPrefix) {
		s.txns.dropClient(ckey)
		s.metrics.AbsorbedACKs.Add(1)
		return
	}
	if t := s.txns.takeCompleted(ckey); t != nil {
		// The ACK of a non-2xx answer is hop-by-hop, but as we relayed the
		// answer we pass the ACK on with the INVITE's branch, as a
		// stateless proxy would (RFC 3261 §16.11).
		s.popOurRoutes(req)
		s.prepareForward(req, src)
		req.PrependHeader(s.ourVia(t.branch, t.cur.transport()))
		s.postMsg(req, target{addr: t.cur.addr, tcp: t.cur.tcp, dial: true, client: src.addr}, &s.metrics.Forwarded)
		return
	}
	if tag == "" {
		s.metrics.Malformed.Add(1)
		return
	}
	s.handleInDialog(req, src, p, now)
}

// handleCancel sends a CANCEL to the backend of its INVITE. Only the
// client that sent the INVITE can cancel it: the transaction key holds the
// address and transport the INVITE came from.
func (s *Server) handleCancel(req *gosip.Request, src source, p *backendSet, now int64) {
	ckey := clientTxnOf(req, src).key()
	s.popOurRoutes(req)
	if t, b, branch, answered := s.txns.cancel(ckey); t != nil {
		if answered {
			// The INVITE is still waiting for admission: nothing was sent
			// upstream, so we answer both ourselves.
			s.reply(req, src, 200, "OK")
			s.finishLocal(t, 487, "Request Terminated", nil)
			return
		}
		if b == nil {
			s.reply(req, src, 200, "OK")
			return
		}
		s.prepareForward(req, src)
		req.PrependHeader(s.ourVia(branch, b.transport()))
		s.watchCancel(req, src, branch, b.id, t.poolName, now)
		if err := s.sendMsg(req, target{addr: b.addr, tcp: b.tcp, dial: true, client: src.addr}); err == nil {
			s.metrics.Forwarded.Add(1)
		} else {
			s.unwatch(branch)
		}
		return
	}
	// No transaction of this client: nothing we sent to cancel, or not
	// this sender's to cancel. Answered here (RFC 3261 §16.10), so a
	// CANCEL never reaches a backend without an INVITE of ours there.
	s.metrics.UnknownCancels.Add(1)
	s.replyLocal(req, src, 481, "Call/Transaction Does Not Exist")
}

// handleInDialog routes a request with a To-tag. With our Route on top, the
// token in it names the backend: always admitted. A missing or forged
// token gets 403. Without our Route (a UA that ignores Record-Route), the
// dialog table, else the Call-ID hash, picks the backend, and only a
// dialog the table knows is affinity (admitTokenless). A token naming a
// backend a reload removed still routes to that backend's last address.
func (s *Server) handleInDialog(req *gosip.Request, src source, p *backendSet, now int64) {
	callID := req.CallID().Value()
	token, had := s.popOurRoutes(req)
	fromBackend := p.backendFrom(src) != nil
	if !fromBackend && s.plantedAlias(req, src) {
		s.refusePlantedAlias(req, src)
		return
	}
	if had {
		pool, id, ok := s.verifyToken(token, callID)
		if !ok {
			s.metrics.ForgedTokens.Add(1)
			if req.Method != gosip.ACK {
				s.replyLocal(req, src, 403, "Forbidden", "Warning: 399 "+s.adv.String()+` "invalid affinity token"`)
			}
			return
		}
		s.admitAffinity(now, req.Method, pool)
		if fromBackend {
			s.forwardDownstream(req, src)
			return
		}
		b, removed := p.dialogBackend(id)
		if b == nil {
			if req.Method != gosip.ACK {
				s.reply(req, src, 480, "Temporarily Unavailable", "Warning: 399 "+s.adv.String()+` "backend gone"`)
			}
			return
		}
		s.metrics.Affinity.Add(1)
		if removed {
			s.metrics.AffinityGone.Add(1)
		}
		if pool == "" && len(b.spec.Pools) > 0 {
			pool = b.spec.Pools[0] // a token from before pools
		}
		s.forwardInDialog(req, src, b, pool, now)
		return
	}
	if fromBackend {
		s.admitAffinity(now, req.Method, "")
		s.forwardDownstream(req, src)
		return
	}
	b, pool, fromTable, why := s.dialogRoute(req, p, now, true)
	switch why {
	case routeNone:
		s.noRoute(req, src)
		return
	case routeTooLong:
		s.uriTooLong(req, src)
		return
	case routeNoBackend:
		// Metered as new work, refused as new work is when no backend
		// of its pool takes new work: a made-up To-tag is no way onto
		// a drained pool. The per-source share comes first, as in
		// admitTokenless.
		if !dialogCreating(req.Method) && s.overUnknownShare(req, src, now) {
			return
		}
		s.refuse(req, src, admission.Decision{Verdict: admission.Refuse, Pool: pool, RetryAfter: s.cfg.BusyDefault})
		return
	}
	if !s.admitTokenless(req, src, b, pool, fromTable, now) {
		return
	}
	if fromTable {
		s.metrics.DialogRouted.Add(1)
	} else {
		s.metrics.CallIDFallback.Add(1)
	}
	s.forwardInDialog(req, src, b, pool, now)
}

// Why dialogRoute found no backend.
const (
	routeOK        = iota
	routeNone      // no route matches and there is no pool "default": the no-route answer
	routeTooLong   // the Request-URI user is too long to route (414)
	routeNoBackend // metered as new work, but no backend of its pool takes new work (503)
)

// dialogRoute picks the backend of a request that belongs to a dialog but
// carries no token of ours: the one the dialog table recorded for its
// INVITE (fromTable true), else the Call-ID hash's current choice in the
// dialog's pool, which is the INVITE's backend only if the INVITE was not
// moved off it. A miss is counted and logged at debug level. refresh
// extends the entry's idle deadline (in-dialog requests do, a stateless
// CANCEL does not).
//
// pool is the dialog's pool: the table's (also when its backend is gone:
// a dialog never moves pool, and routes are not consulted), else b's
// first pool (an entry from before pools). A dialog the table does not
// know at all proves nothing, whatever -sip-unknown-dialog admits: it is
// routed as new work is (so a made-up To-tag is no way into a pool the
// routes would not give), and b is nil with why routeNone when no route
// matches and there is no pool "default", routeTooLong when its
// Request-URI user is too long to route. When it is metered as new work
// (-sip-unknown-dialog new-work, or a method that can create a dialog,
// whatever the policy) it takes only a backend that takes new work: why
// is routeNoBackend (b nil, pool set) when none of its pool does. A
// dialog the table knows keeps its pool's Call-ID hash home
// (lb.Pool.Home), which may be a backend taking no new work: its calls
// end where they began.
func (s *Server) dialogRoute(req *gosip.Request, p *backendSet, now int64, refresh bool) (b *backend, pool string, fromTable bool, why int) {
	callID := req.CallID().Value()
	var from string
	if f := header(req, "from", "f"); f != nil {
		from = tagParam(f.Value())
	}
	to := toTag(req)
	op := dialogPeek
	if refresh {
		op = dialogRefresh
	}
	poolName, id, ok := s.dialogs.lookupIn(callID, from, to, now, op)
	if ok {
		if b, _ := p.dialogBackend(id); b != nil {
			if poolName == "" && len(b.spec.Pools) > 0 {
				poolName = b.spec.Pools[0]
			}
			return b, poolName, true, routeOK
		}
	}
	s.metrics.DialogMisses.Add(1)
	if s.log.Enabled(s.ctx, slog.LevelDebug) {
		s.log.Debug("sip dialog table miss: routed by call-id hash", "method", string(req.Method), "call_id", callID,
			"from_tag", from, "to_tag", to, "recorded_backend", id)
	}
	var home *lb.Pool
	switch {
	case ok && poolName != "":
		home = p.gen.Pool(poolName)
	case !ok:
		var in lb.RouteInput
		if p.routes != nil && !fillRouteInput(&in, req, p.routeHeaders) {
			return nil, "", false, routeTooLong
		}
		if home, _ = p.route(&in); home == nil {
			return nil, "", false, routeNone
		}
		if s.cfg.UnknownDialog == UnknownDialogNewWork || dialogCreating(req.Method) {
			// Metered as new work (a method that can create a dialog
			// always is, admitTokenless): a backend that takes new
			// work, by the Call-ID hash, or none.
			lbb := home.Home(now, lb.Hash(callID))
			if !lbb.AcceptsNew(now) {
				return nil, home.Name(), false, routeNoBackend
			}
			return p.of(lbb), home.Name(), false, routeOK
		}
	}
	if home == nil {
		home = p.homePool
	}
	return p.homeOf(home, lb.Hash(callID), now), home.Name(), false, routeOK
}

// insertDialog records that the INVITE of dialog key, sent by another
// node, went to backend id of pool.
func (s *Server) insertDialog(key uint64, pool, id string, now int64) {
	switch s.dialogs.claimIn(key, pool, id, 0, now) {
	case dialogFull:
		s.metrics.DialogsFull.Add(1)
	case dialogRefused:
		s.metrics.DialogReplaceRefused.Add(1)
	}
}

// claimDialog records that the INVITE of t went to backend id of pool. It reports
// false when the entry belongs to another dialog (a confirmed one, or one
// whose INVITE came from another source), which t must then neither
// confirm nor remove: an initial INVITE that reuses a victim's Call-ID and
// From-tag would otherwise move or delete the victim's entry.
func (s *Server) claimDialog(t *txn, pool, id string, now int64) bool {
	switch s.dialogs.claimIn(t.dkey, pool, id, s.dialogs.sourceTag(t.src), now) {
	case dialogFull:
		s.metrics.DialogsFull.Add(1)
	case dialogRefused:
		s.metrics.DialogReplaceRefused.Add(1)
		if s.log.Enabled(s.ctx, slog.LevelDebug) {
			s.log.Debug("sip initial INVITE for a dialog the table holds for another: not recorded",
				"call_id", t.callID, "source", t.src.addr.String(), "backend", id)
		}
		return false
	}
	return true
}

// admitAffinity counts an in-dialog request of pool ("" when unknown:
// a request from a backend, a token from before pools) as affinity.
func (s *Server) admitAffinity(now int64, m gosip.RequestMethod, pool string) {
	ar := admission.Request{Class: admission.Affinity, Proto: "sip", Method: string(m), Pool: pool}
	s.adm.Decide(now, &ar, nil)
}

// forwardDownstream sends a request from a backend towards the client: to
// the next Route, else to the Request-URI (RFC 3261 §16.6 step 6).
func (s *Server) forwardDownstream(req *gosip.Request, src source) {
	u := &req.Recipient
	if r := req.Route(); r != nil {
		u = &r.Address
	}
	tcp := false
	if tp, ok := u.UriParams.Get("transport"); ok && strings.EqualFold(tp, "tcp") {
		tcp = true
	}
	if tr := transportName(tcp); s.sipsDowngrade(req, tr) {
		s.refuseSips(req, src, tr)
		return
	}
	ip, err := netip.ParseAddr(strings.Trim(u.Host, "[]"))
	if err != nil {
		// A host name: resolve off the reader goroutine.
		host, port := u.Host, uriPort(u)
		go func() {
			ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
			defer cancel()
			ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
			if err != nil || len(ips) == 0 {
				s.metrics.SendErrors.Add(1)
				return
			}
			s.forwardStateless(req, src, target{addr: netip.AddrPortFrom(ips[0].Unmap(), uint16(port)), tcp: tcp, dial: true})
		}()
		return
	}
	s.forwardStateless(req, src, target{addr: netip.AddrPortFrom(ip.Unmap(), uint16(uriPort(u))), tcp: tcp, dial: true})
}

// answerOptions answers an OPTIONS addressed to the balancer itself, so
// monitors can ping it.
func (s *Server) answerOptions(req *gosip.Request, src source) {
	s.metrics.OptionsAnswered.Add(1)
	s.replyLocal(req, src, 200, "OK", "Allow: INVITE, ACK, CANCEL, BYE, OPTIONS, REGISTER, SUBSCRIBE, NOTIFY, REFER, MESSAGE, INFO, PRACK, UPDATE, PUBLISH")
}

// handleNewWork admits, selects and forwards a request without To-tag,
// transaction-statefully so a backend's 503 or silence moves it on.
func (s *Server) handleNewWork(req *gosip.Request, src source, now int64) {
	if req.Method == gosip.OPTIONS && req.Route() == nil && s.isOurs(&req.Recipient) && req.Recipient.User == "" {
		s.answerOptions(req, src)
		return
	}
	ckey := clientTxnOf(req, src).key()
	if s.txns.retransmission(s, ckey, req, src) {
		return
	}
	if req.Method == gosip.INVITE && s.inviteAfter2xx(req, src, now) {
		return
	}
	if s.plantedAlias(req, src) && s.pool.Load().backendFrom(src) == nil {
		s.refusePlantedAlias(req, src)
		return
	}
	if isSips(req) && !s.cfg.AllowSipsDowngrade && !s.pool.Load().anyTLS() {
		// Every backend is reached over UDP or TCP: a sips: request
		// would leave TLS on its next hop (RFC 5630). With TLS backends
		// it goes to one of them only (attempt).
		s.refuseSips(req, src, "UDP or TCP")
		return
	}
	if s.adm.Draining() {
		s.metrics.Refused.Add(1)
		s.reply(req, src, 503, "Service Unavailable",
			"Retry-After: "+strconv.Itoa(s.jitter(s.cfg.BusyDefault)),
			"Warning: 399 "+s.adv.String()+` "draining"`)
		return
	}
	s.popOurRoutes(req) // a pre-loaded route to us; any token in it counts for nothing
	set := s.pool.Load()
	var in lb.RouteInput
	if set.routes != nil && !fillRouteInput(&in, req, set.routeHeaders) { // without routes, nothing reads it
		s.uriTooLong(req, src)
		return
	}
	p, route := set.route(&in)
	if p == nil {
		s.noRoute(req, src)
		return
	}
	pool := p.Name()
	if route < 0 {
		s.metrics.DefaultRouted.Add(1) // the table counts its routes' hits
	}
	ar := admission.Request{Class: admission.NewWork, Proto: "sip", Method: string(req.Method), Pool: pool}
	d := s.adm.Decide(now, &ar, nil)
	switch d.Verdict {
	case admission.Refuse:
		s.refuse(req, src, d)
		return
	case admission.Delay:
		t := s.txns.create(s, ckey, req, src, pool, now, true)
		if t == nil {
			d.Wait.Cancel()
			return
		}
		if req.Method == gosip.INVITE {
			s.send100(t)
		}
		s.metrics.Delayed.Add(1)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			d := s.adm.Wait(s.ctx, s.clock, &ar, d, nil)
			if !s.txns.release(t) {
				return // canceled meanwhile
			}
			if d.Verdict != admission.Admit {
				s.txns.remove(t)
				s.refuseFor(req, src, d, t)
				return
			}
			s.attempt(t, s.clock.Now(), false)
		}()
		return
	}
	t := s.txns.create(s, ckey, req, src, pool, now, false)
	if t == nil {
		return
	}
	s.attempt(t, now, false)
}

// inviteAfter2xx reports (and counts as a retransmission) an initial
// INVITE whose dialog the table holds as confirmed, set up by an INVITE
// from this same source: the client's retransmission of that INVITE, sent
// before its 2xx arrived. Its transaction ended with the 2xx, so it would
// otherwise be new work again, and under any policy but hash it could set
// up a second call on another backend. The backend's own 2xx
// retransmissions answer it.
func (s *Server) inviteAfter2xx(req *gosip.Request, src source, now int64) bool {
	var from string
	if f := header(req, "from", "f"); f != nil {
		from = tagParam(f.Value())
	}
	k := s.dialogs.key(req.CallID().Value(), from)
	if !s.dialogs.settledBy(k, s.dialogs.sourceTag(src), now) {
		return false
	}
	s.metrics.Retransmissions.Add(1)
	return true
}

// jitter returns d in whole seconds plus up to half of it at random (at
// least one second), so refused clients do not come back in step.
func (s *Server) jitter(d time.Duration) int {
	sec := admission.RetryAfterSeconds(d)
	return sec + int(fastRand()%uint64(sec/2+1))
}

// refuse answers new work the balancer refuses itself: 503 with a jittered
// Retry-After and a Warning naming the limit (RFC 3261 §21.5.4, §20.43):
// "overload: " and the decision's Detail (its reason, rule and pool, as
// admission/README.md gives it), or "no backend available" with the pool
// when no guard refused but no backend took it ("pool NAME drained",
// counted as draining, when the operator drained it). It keeps no state. This
// is the one place a decision becomes SIP.
func (s *Server) refuse(req *gosip.Request, src source, d admission.Decision) {
	s.refuseFor(req, src, d, nil)
}

// refuseFor is refuse for the request of t (nil: a request without a
// transaction), whose access-log record it ends as refused.
func (s *Server) refuseFor(req *gosip.Request, src source, d admission.Decision, t *txn) {
	// No backend took it because the operator drained the pool: said and
	// counted as draining (lb.Pool.DrainedByOperator), not as a failure.
	set := s.pool.Load()
	drained := d.Reason == admission.ReasonNone && set != nil && set.gen.Pool(d.Pool) != nil && set.gen.Pool(d.Pool).DrainedByOperator(s.clock.Now())
	if drained {
		d.Reason = admission.ReasonDraining
	}
	s.metrics.Refused.Add(1)
	if int(d.Reason) < len(s.metrics.RefusedBy) {
		s.metrics.RefusedBy[d.Reason].Add(1)
	}
	if set != nil {
		set.countRefused(d)
	}
	if req.Method == gosip.ACK {
		return
	}
	what := "overload: " + d.Detail()
	if drained {
		what = "pool " + d.Pool + " drained"
	}
	if d.Reason == admission.ReasonNone {
		what = "overload: no backend available"
		if d.Pool != "" {
			what += " pool " + d.Pool
		}
	}
	if t != nil && t.lg != nil {
		s.txns.mu.Lock()
		s.logTxnLocked(t, s.clock.Now(), 503, accesslog.BySluice, true, what)
		s.txns.mu.Unlock()
	} else if t == nil {
		s.logRefusal(req, src, d.Pool, what)
	}
	s.replyUnlogged(req, src, 503, "Service Unavailable",
		"Retry-After: "+strconv.Itoa(s.jitter(d.RetryAfter)),
		"Warning: 399 "+s.adv.String()+` "`+what+`"`)
}

// noRoute answers new work that no route matches, in a generation without
// the pool "default": Config.NoRouteCode (404 Not Found unless set), with
// a Warning, counted (no_route). It keeps no state.
func (s *Server) noRoute(req *gosip.Request, src source) {
	s.metrics.NoRoute.Add(1)
	if req.Method == gosip.ACK {
		return
	}
	code := s.cfg.NoRouteCode
	s.replyLocal(req, src, code, reasonPhrase(code), "Warning: 399 "+s.adv.String()+` "no route"`)
}

// uriTooLong answers 414 Request-URI Too Long (RFC 3261 §21.4.12) to a
// request the routes cannot test: its Request-URI user is longer than
// lb.MaxRouteValueLen once unescaped and without visual separators
// (fillRouteInput). It is not routed on a truncated form. Counted
// (uri_too_long); it keeps no state.
func (s *Server) uriTooLong(req *gosip.Request, src source) {
	s.metrics.URITooLong.Add(1)
	if req.Method == gosip.ACK {
		return
	}
	s.replyLocal(req, src, 414, "Request-URI Too Long")
}

// reasonPhrase is RFC 3261's reason phrase of a final answer code we may
// send for want of a route, "No Route" for the others.
func reasonPhrase(code int) string {
	switch code {
	case 400:
		return "Bad Request"
	case 403:
		return "Forbidden"
	case 404:
		return "Not Found"
	case 410:
		return "Gone"
	case 416:
		return "Unsupported URI Scheme"
	case 480:
		return "Temporarily Unavailable"
	case 484:
		return "Address Incomplete"
	case 488:
		return "Not Acceptable Here"
	case 500:
		return "Server Internal Error"
	case 502:
		return "Bad Gateway"
	case 503:
		return "Service Unavailable"
	case 603:
		return "Decline"
	case 604:
		return "Does Not Exist Anywhere"
	}
	return "No Route"
}
