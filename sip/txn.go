package sip

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// Transaction states of new work.
const (
	stWaiting    = iota // delayed by an ARM rule, nothing sent yet
	stCalling           // sent to a backend, no answer yet
	stProceeding        // a provisional answer came back
	stCompleted         // a non-2xx final answer went to the client; waiting for its ACK
	stSwitching         // one goroutine is moving it to the next backend
)

// RFC 3261 timers.
const (
	timerT1 = 500 * time.Millisecond
	timerT2 = 4 * time.Second
	// timerC bounds an INVITE after its last provisional answer.
	timerC = 3 * time.Minute
	// timerF bounds a non-INVITE request (64·T1).
	timerF = 32 * time.Second
	// completedLinger keeps a completed INVITE for its ACK (Timer D).
	completedLinger = 32 * time.Second
	// trying100 is when we answer 100 Trying for an INVITE nobody answered.
	trying100 = 200 * time.Millisecond
)

// txn is one request of new work forwarded transaction-statefully, so a
// backend's 503 or silence moves it to the next backend. It lives from the
// request until the final answer (plus the ACK wait of a non-2xx INVITE
// answer); affinity traffic and responses never create one. All fields are
// guarded by txnTable.mu.
type txn struct {
	ckey     string
	ctxn     clientTxn // the client transaction ckey is the key of
	loop     uint64    // loopHash of req
	req      *gosip.Request
	invite   bool
	callID   string
	dkey     uint64 // dialog table key of an INVITE (Call-ID + From-tag)
	dforeign bool   // the dialog table entry of dkey is another dialog's: leave it alone
	src      source
	state    int
	canceled bool

	cur      *backend
	branch   string
	branches []string
	tried    lb.Set
	// poolName is the pool the route chose: every attempt is picked in
	// the pool of that name of the generation in force. lbPool is the
	// lb.Pool tried counts positions of.
	poolName string
	lbPool   *lb.Pool
	wire     []byte // the request as last sent to cur
	via      *gosip.ViaHeader
	rrs      []*gosip.RecordRouteHeader
	path     bool // our Path is on the REGISTER (flowPath)

	created   int64
	sentAt    int64
	nextRetx  int64
	retxEvery int64
	deadline  int64 // silence failover (calling) or Timer C (proceeding)
	expires   int64 // completed: when the ACK wait ends
	sent100   bool
	lastFinal []byte // the final answer given to the client, for its retransmissions
	tooLarge  bool   // answered 513: the request with our headers is too large for a datagram
	answered  bool   // an earlier attempt's 2xx ended it (earlierAttemptAnsweredLocked): send no more
	prepared  bool
	acquired  bool    // cur counts this attempt as outstanding
	local     bool    // we gave the final answer ourselves (500, 487, 503)
	lg        *txnLog // the access-log record under way; nil when not logging
}

// settleLocked ends the current attempt's outstanding count on its backend
// with result r (lb passive health and least-outstanding selection). The
// caller holds txnTable.mu.
func (t *txn) settleLocked(now int64, r lb.Result) {
	if t.acquired && t.cur != nil {
		t.cur.lb.Release(now, r)
	}
	t.acquired = false
}

// txnTable indexes live transactions by client key and by our branch.
type txnTable struct {
	mu       sync.Mutex
	byClient map[string]*txn
	byBranch map[string]*txn
	accepted acceptedSet // branches of INVITEs answered 2xx (accepted.go)
}

func (tt *txnTable) init() {
	tt.byClient = map[string]*txn{}
	tt.byBranch = map[string]*txn{}
}

// Len returns the number of live transactions.
func (tt *txnTable) Len() int {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return len(tt.byClient)
}

func (tt *txnTable) create(s *Server, ckey string, req *gosip.Request, src source, pool string, now int64, waiting bool) *txn {
	t := &txn{ckey: ckey, poolName: pool, ctxn: clientTxnOf(req, src), loop: loopHash(req), req: req, invite: req.Method == gosip.INVITE, callID: req.CallID().Value(), src: src, created: now,
		lg: s.newTxnLog(waiting)}
	if t.invite {
		t.dkey = s.dialogs.key(t.callID, tagParam(header(req, "from", "f").Value()))
	}
	t.state = stSwitching // the creator sends it
	if waiting {
		t.state = stWaiting
	}
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if tt.byClient[ckey] != nil {
		return nil
	}
	tt.byClient[ckey] = t
	return t
}

func (tt *txnTable) removeLocked(t *txn) {
	t.settleLocked(0, lb.Abandoned)
	if tt.byClient[t.ckey] == t {
		delete(tt.byClient, t.ckey)
	}
	for _, b := range t.branches {
		if tt.byBranch[b] == t {
			delete(tt.byBranch, b)
		}
	}
}

func (tt *txnTable) remove(t *txn) {
	tt.mu.Lock()
	tt.removeLocked(t)
	tt.mu.Unlock()
}

// dropClient forgets the transaction of ckey (its ACK came).
func (tt *txnTable) dropClient(ckey string) {
	tt.mu.Lock()
	if t := tt.byClient[ckey]; t != nil && t.state == stCompleted {
		tt.removeLocked(t)
	}
	tt.mu.Unlock()
}

// takeCompleted removes and returns the INVITE transaction of ckey if it
// is waiting for the ACK of a relayed non-2xx answer.
func (tt *txnTable) takeCompleted(ckey string) *txn {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t := tt.byClient[ckey]
	if t == nil || t.state != stCompleted || t.cur == nil || t.local {
		return nil
	}
	tt.removeLocked(t)
	return t
}

// hasCompleted reports whether takeCompleted would return a transaction
// for ckey, taking nothing.
func (tt *txnTable) hasCompleted(ckey string) bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t := tt.byClient[ckey]
	return t != nil && t.state == stCompleted && t.cur != nil && !t.local
}

// cancel marks the INVITE of ckey canceled. It returns the transaction,
// the backend and branch to send the CANCEL to (none when there is nothing
// upstream to cancel: the caller answers the CANCEL itself), and whether
// the INVITE was still waiting for admission (then the caller answers the
// INVITE with 487 too).
func (tt *txnTable) cancel(ckey string) (t *txn, b *backend, branch string, waiting bool) {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	t = tt.byClient[ckey]
	if t == nil || !t.invite {
		return nil, nil, "", false
	}
	if t.state == stCompleted {
		return t, nil, "", false
	}
	t.canceled = true
	switch t.state {
	case stWaiting:
		tt.removeLocked(t)
		return t, nil, "", true
	case stSwitching:
		// Between backends: the attempt in progress sees canceled and
		// answers 487; the CANCEL itself is answered here.
		return t, nil, "", false
	}
	return t, t.cur, t.branch, false
}

// release moves a delayed transaction on; false if it was canceled.
func (tt *txnTable) release(t *txn) bool {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	if t.canceled || tt.byClient[t.ckey] != t {
		return false
	}
	t.state = stSwitching
	return true
}

// retransmission handles a request retransmitted by the client while its
// transaction is live, and reports whether it was one.
func (tt *txnTable) retransmission(s *Server, ckey string, req *gosip.Request, src source) bool {
	tt.mu.Lock()
	t := tt.byClient[ckey]
	if t == nil || t.req.Method != req.Method {
		tt.mu.Unlock()
		return false
	}
	state, final, invite := t.state, t.lastFinal, t.invite
	tt.mu.Unlock()
	s.metrics.Retransmissions.Add(1)
	switch {
	case state == stCompleted && final != nil:
		s.post(final, s.replyTarget(req, src), nil)
	case invite && (state == stCalling || state == stWaiting):
		// Our own timers retransmit upstream; a 100 stops the client's.
		// Once a provisional answer went out, a late 100 would be out of
		// order: say nothing.
		s.send100(t)
	}
	return true
}

// attempt sends t to the next backend that takes new work and whose MOP
// admits it. When none is left it answers the client: 503 from the
// balancer when no backend was tried (all down, draining or at their MOP
// rate), 500 when every backend tried failed (RFC 3261 §16.7: a backend's
// 503 is never passed on).
func (s *Server) attempt(t *txn, now int64, failover bool) {
	key := lb.Hash(t.callID)
	var mopRetry time.Duration
	mopRefused := false
	for {
		s.txns.mu.Lock()
		if t.answered {
			// A backend we had moved away from answered 2xx meanwhile.
			s.txns.mu.Unlock()
			return
		}
		if t.canceled {
			// CANCELed while between backends: the INVITE ends here.
			s.txns.mu.Unlock()
			s.finishLocal(t, 487, "Request Terminated", nil)
			return
		}
		set := s.pool.Load()
		pool := set.gen.Pool(t.poolName)
		if t.lbPool != pool {
			// First attempt, or the backends were replaced since the
			// last one: tried was counted in another pool's order. A
			// pool the new generation no longer has leaves no backend.
			t.tried = remapTried(t.lbPool, pool, t.tried)
			t.lbPool = pool
		}
		var b *backend
		out, retry := lb.NoBackend, time.Duration(0)
		if pool != nil {
			var lbb *lb.Backend
			lbb, out, retry = pool.PickTried(now, key, &t.tried)
			b = set.of(lbb)
		}
		s.txns.mu.Unlock()
		if out == lb.MOPRefused && (!mopRefused || retry < mopRetry) {
			mopRetry, mopRefused = retry, true
		}
		if b == nil {
			break
		}
		if s.sipsDowngrade(t.req, b.transport()) {
			continue // a sips: request goes to TLS backends only
		}
		if s.send(t, b, now, failover) {
			if failover && !t.tooLarge {
				s.metrics.Failovers.Add(1)
			}
			return
		}
	}
	switch {
	case !failover && mopRefused:
		s.txns.remove(t)
		ar := admission.Request{Class: admission.NewWork, Proto: "sip", Method: string(t.req.Method), Pool: t.poolName}
		s.refuseFor(t.req, t.src, s.adm.RefuseMOPFor(&ar, mopRetry), t)
	case !failover:
		s.txns.remove(t)
		s.refuseFor(t.req, t.src, admission.Decision{Verdict: admission.Refuse, RetryAfter: s.cfg.BusyDefault, Pool: t.poolName}, t)
	default:
		s.metrics.AllFailed.Add(1)
		s.finishLocal(t, 500, "Server Internal Error", []string{"Warning: 399 " + s.adv.String() + ` "no backend could take the request"`})
	}
}

// send forwards t to b: our Via with this attempt's branch and, for
// dialog-creating requests, Record-Route with a token naming b. It
// reports false when the send failed at once (the caller tries the next
// backend); a UDP send queued in a read batch that fails at the batch's
// end goes on in forwardFailed. failover is the caller's (attempt).
func (s *Server) send(t *txn, b *backend, now int64, failover bool) bool {
	req := t.req
	branch := s.branches.branch(&t.ctxn, t.loop, target{addr: b.addr, tcp: b.tcp})
	s.txns.mu.Lock()
	if t.canceled || t.answered {
		s.txns.mu.Unlock()
		return false
	}
	flow := t.src.flow()
	if !t.prepared {
		s.prepareForward(req, t.src)
		if flow != nil && s.cfg.ContactAlias && (req.Method == gosip.REGISTER || req.Method == gosip.INVITE) {
			s.aliasContact(req, flow, b.transport())
		}
		t.via = s.ourVia(branch, b.transport())
		req.PrependHeader(t.via)
		t.prepared = true
	}
	t.via.Params.Add("branch", branch)
	t.via.Transport = b.transport()
	// A failover to another transport is sent by another listener.
	a := s.advFor(b.transport())
	t.via.Host, t.via.Port = a.host, a.port
	if req.Method == gosip.REGISTER && flow != nil {
		// RFC 3327: the registrar sends this client's incoming requests
		// back through us, to this connection (flowPath).
		s.flowPath(t, flow, b.transport())
	}
	if recordRoutes(req.Method) {
		token := s.routeToken(t.poolName, tokenSubject(b.id, t.callID), time.Now().Add(s.cfg.TokenTTL))
		sips := isSips(req)
		ctr := "UDP" // the client's transport
		if t.src.conn != nil {
			ctr = "TCP"
		}
		if t.rrs == nil {
			// One Record-Route, or two when the client's transport differs
			// from the backend's or the client came on a flow (RFC 5658
			// double record-routing), so each side reaches us over its
			// own: the client-facing one with the client's transport and
			// the flow token, the backend-facing one with the backend's.
			// The backend-facing one is on top; both go above every other
			// header, as Kamailio does, which keeps them first among the
			// Record-Routes (§16.6 step 4).
			t.rrs = append(t.rrs, s.ourRecordRoute(token, b.transport(), sips))
			if flow != nil || ctr != b.transport() {
				cf := s.ourRecordRoute(token, ctr, sips)
				if flow != nil {
					cf = s.flowRecordRoute(token, flow, sips)
				}
				t.rrs = append(t.rrs, cf)
			}
			req.PrependHeader(asHeaders(t.rrs)...)
			// Keep our Via on top.
			req.RemoveHeader("Via")
			req.PrependHeader(t.via)
		} else if len(t.rrs) == 1 && ctr != b.transport() {
			// A failover to a backend of another transport than the
			// first (UDP to TLS, say): the one entry, which the client
			// reads too, cannot name both; the client-facing one goes
			// below it. Ours are on top, below our Via.
			t.rrs = append(t.rrs, s.ourRecordRoute(token, ctr, sips))
			req.RemoveHeader("Via")
			req.RemoveHeader("Record-Route")
			req.PrependHeader(asHeaders(t.rrs)...)
			req.PrependHeader(t.via)
		}
		for _, rr := range t.rrs {
			rr.Address.UriParams.Add(tokenParam, token)
		}
		// The backend-facing entry names the listener and transport of
		// this attempt's backend (a failover may change them).
		s.setRouteAddress(&t.rrs[0].Address, b.transport(), sips)
	}
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	req.StringWrite(buf)
	wire := append([]byte(nil), buf.Bytes()...)
	bufPool.Put(buf)
	if !b.tcp && len(wire) > maxDatagram {
		// Our Via and Record-Route made it too large for UDP: no backend
		// over UDP would get it, and it is the request's fault, not the
		// backend's (RFC 3261 §21.4.11).
		t.tooLarge = true
		s.metrics.TooLarge.Add(1)
		p, dst := s.finishLocalLocked(t, 513, "Message Too Large", nil)
		s.txns.mu.Unlock()
		s.post(p, dst, nil)
		return true
	}
	t.settleLocked(now, lb.Abandoned)
	t.noteAttemptLocked()
	t.cur, t.branch, t.wire = b, branch, wire
	t.acquired = true
	b.lb.Acquire()
	t.branches = append(t.branches, branch)
	t.state = stCalling
	t.sentAt = now
	t.retxEvery = int64(timerT1)
	t.nextRetx = now + t.retxEvery
	t.deadline = now + int64(s.cfg.FailoverTimeout)
	s.txns.byBranch[branch] = t
	s.txns.mu.Unlock()
	if t.invite {
		// Before the INVITE leaves, so an ACK or BYE racing its 2xx (read
		// by another goroutine) finds the dialog's backend. A later
		// attempt moves it.
		if !t.dforeign && !s.claimDialog(t, t.poolName, b.id, now) {
			t.dforeign = true
		}
		if !t.dforeign {
			s.shareDialog(DialogInsert, t.req, "", t.poolName, b.id)
		}
	}
	dst := target{addr: b.addr, tcp: b.tcp, client: t.src.addr}
	var onErr func(error)
	if !b.tcp && s.udpOut != nil && s.udpOut.open.Load() {
		onErr = func(err error) { s.forwardFailed(t, b, branch, failover, err) }
	}
	if err := s.postOr(wire, dst, nil, onErr); err != nil {
		s.log.Debug("sip forward new work", "err", err, "upstream", b.id)
		s.txns.mu.Lock()
		delete(s.txns.byBranch, branch)
		if errors.Is(err, errProxyConnsFull) {
			// Not the backend's fault: this client (or every client) has
			// all the connections to it that it may have.
			t.settleLocked(now, lb.Abandoned)
			p, dst := s.finishLocalLocked(t, 503, "Service Unavailable", proxyFullHeaders(s))
			s.txns.mu.Unlock()
			s.post(p, dst, nil)
			return true
		}
		t.settleLocked(now, lb.ConnectError)
		s.txns.mu.Unlock()
		return false
	}
	s.metrics.Forwarded.Add(1)
	s.metrics.NewWork.Add(1)
	s.pool.Load().countSent(t.poolName, b.id)
	return true
}

// forwardFailed handles the failure of a send of t to b with branch that
// was queued in a read batch and failed when the batch was sent: as a send
// that fails at once in send, the attempt ends with a connection error on
// b and the next backend is tried (attempt with the same failover), unless
// t moved on meanwhile.
func (s *Server) forwardFailed(t *txn, b *backend, branch string, failover bool, err error) {
	s.log.Debug("sip forward new work", "err", err, "upstream", b.id)
	now := s.clock.Now()
	s.txns.mu.Lock()
	if s.txns.byBranch[branch] == t {
		delete(s.txns.byBranch, branch)
	}
	if t.branch != branch || t.cur != b || t.state != stCalling || t.answered {
		s.txns.mu.Unlock()
		return
	}
	t.settleLocked(now, lb.ConnectError)
	t.state = stSwitching
	s.txns.mu.Unlock()
	s.attempt(t, now, failover)
}

func asHeaders(rrs []*gosip.RecordRouteHeader) []gosip.Header {
	hs := make([]gosip.Header, len(rrs))
	for i, rr := range rrs {
		hs[i] = rr
	}
	return hs
}

// txnResponse handles a response to an attempt of t. Our Via is already
// removed; next is where the client gets it.
func (s *Server) txnResponse(t *txn, branch string, r *inResponse, next target, src source) {
	code := r.code
	now := s.clock.Now()
	s.txns.mu.Lock()
	if t.invite && code >= 200 && code < 300 && !t.local && !t.answered &&
		(branch != t.branch && (t.state == stCalling || t.state == stProceeding) || t.state == stSwitching) {
		s.earlierAttemptAnsweredLocked(t, r.full(s), next, src, now) // unlocks
		return
	}
	if branch != t.branch || t.state == stCompleted || t.state == stSwitching {
		// An answer from an attempt we moved away from (or are moving away
		// from), or a retransmitted final answer.
		completed := branch == t.branch && t.state == stCompleted && !t.local
		s.txns.mu.Unlock()
		switch {
		case completed || code >= 200 && code < 300:
			s.relayIn(r, next)
		case code >= 300 && t.invite:
			s.ackUpstream(t, r.full(s), branch, src)
		}
		return
	}
	cur := t.cur
	switch {
	case code < 200:
		t.noteProvisionalLocked(now)
		if t.state == stCalling {
			t.state = stProceeding
		}
		if t.invite {
			t.deadline = now + int64(timerC)
		} else {
			t.deadline = t.sentAt + int64(timerF)
		}
		sent100 := t.sent100
		if code == 100 {
			t.sent100 = true
		}
		s.txns.mu.Unlock()
		if code == 100 {
			// 100 is hop-by-hop (RFC 3261 §16.7 step 5): answer our own.
			if !sent100 {
				s.send100(t)
			}
			return
		}
		s.relayIn(r, next)
	case code == 503:
		canceled := t.canceled
		t.state = stSwitching
		t.settleLocked(now, lb.ServerError)
		s.txns.mu.Unlock()
		s.metrics.Backend503.Add(1)
		s.drainBackend(cur.lb, now, s.retryAfter(r.full(s)), "answered 503")
		if t.invite {
			s.ackUpstream(t, r.full(s), branch, src)
		}
		if canceled {
			s.finishLocal(t, 487, "Request Terminated", nil)
			return
		}
		s.attempt(t, now, true)
	default:
		if code >= 500 {
			t.settleLocked(now, lb.ServerError)
		} else {
			t.settleLocked(now, lb.OK)
		}
		if s.observe != nil {
			s.observe(time.Duration(now - t.created))
		}
		if t.lg != nil {
			t.lg.toTag = r.toTag
		}
		s.logTxnLocked(t, now, code, accesslog.ByBackend, false, "")
		first := false // the first 2xx of t's dialog: relayed once its record is safe
		if t.invite && code >= 300 {
			if !t.dforeign {
				s.dialogs.remove(t.dkey) // no dialog
				s.shareDialog(DialogRemove, t.req, "", "", "")
			}
			t.state = stCompleted
			t.expires = now + int64(completedLinger)
			b := bufPool.Get().(*bytes.Buffer)
			b.Reset()
			r.StringWrite(b)
			t.lastFinal = append([]byte(nil), b.Bytes()...)
			bufPool.Put(b)
			s.txns.mu.Unlock()
		} else {
			if t.invite && !t.dforeign {
				first = s.dialogs.confirm(t.dkey, r.toTag)
				s.shareDialog(DialogConfirm, t.req, r.toTag, "", "")
			}
			if t.invite {
				s.txns.accepted.addLocked(t.branches, now)
				s.dialogUpLocked(t, cur.id, r.toTag, now)
			}
			s.txns.removeLocked(t)
			s.txns.mu.Unlock()
		}
		if !first || !s.relayConfirmed(t.dkey, r, next, now) {
			s.relayIn(r, next)
		}
	}
}

// earlierAttemptAnsweredLocked handles a 2xx to an INVITE from an attempt
// that silence made us move away from, while the attempt after it is still
// under way: the call is set up on the backend that answered. The attempt
// under way is CANCELed (RFC 3261 §16.7 step 10), the dialog table names
// the backend that answered, and the transaction ends as one answered 2xx
// (its branches go to the accepted set, accepted.go). Left live, it kept
// sending 100 Trying to the client's retransmissions after the client had
// its 200 and had sent its BYE (SIPp aborts such a call), and the attempt
// under way could set up a second call. Called with txnTable.mu held; it
// unlocks it.
func (s *Server) earlierAttemptAnsweredLocked(t *txn, res *gosip.Response, next target, src source, now int64) {
	var cancel []byte
	var up target
	if t.cur != nil && t.state != stSwitching {
		// The attempt under way (in stSwitching the next one is not sent
		// yet, and t.cur is the attempt that answered).
		cancel = s.hopRequestLocked(t, "CANCEL", nil, t.branch)
		up = target{addr: t.cur.addr, tcp: t.cur.tcp}
	}
	if t.lg != nil {
		// The backend that answered, tried before the one under way.
		if b := s.pool.Load().byAddr[src.addr]; b != nil && t.cur != b {
			t.noteAttemptLocked()
			t.lg.backend = b.id
		}
		if t.lg != nil {
			t.lg.toTag = toTag(res)
		}
		s.logTxnLocked(t, now, res.StatusCode, accesslog.ByBackend, false, "")
		backend := t.lg.backend
		if backend == "" && t.cur != nil {
			backend = t.cur.id
		}
		s.dialogUpLocked(t, backend, toTag(res), now)
	}
	t.answered = true
	t.settleLocked(now, lb.Abandoned)
	s.txns.accepted.addLocked(t.branches, now)
	s.txns.removeLocked(t)
	s.txns.mu.Unlock()
	s.metrics.EarlierAttemptAnswered.Add(1)
	first := false
	if b := s.pool.Load().byAddr[src.addr]; b != nil && !t.dforeign && s.claimDialog(t, t.poolName, b.id, now) {
		s.shareDialog(DialogInsert, t.req, "", t.poolName, b.id)
		first = s.dialogs.confirm(t.dkey, toTag(res))
		s.shareDialog(DialogConfirm, t.req, toTag(res), "", "")
	}
	if s.observe != nil {
		s.observe(time.Duration(now - t.created))
	}
	if cancel != nil {
		s.post(cancel, up, nil)
	}
	if !first || !s.relayConfirmed(t.dkey, res, next, now) {
		s.relay(res, next)
	}
}

func indexAny(s, chars string) int {
	for i := 0; i < len(s); i++ {
		for j := 0; j < len(chars); j++ {
			if s[i] == chars[j] {
				return i
			}
		}
	}
	return -1
}

// relay sends a response on to dst.
func (s *Server) relay(res *gosip.Response, dst target) {
	s.postMsg(res, dst, &s.metrics.Relayed)
}

// ackUpstream acknowledges a non-2xx answer we do not pass on (RFC 3261
// §17.1.1.3): same branch and Request-URI as the INVITE, the answer's To.
func (s *Server) ackUpstream(t *txn, res *gosip.Response, branch string, src source) {
	b := s.pool.Load().backendAt(src.addr)
	if b == nil {
		return
	}
	s.txns.mu.Lock()
	p := s.hopRequestLocked(t, "ACK", res.To(), branch)
	s.txns.mu.Unlock()
	s.post(p, target{addr: b.addr, tcp: b.tcp}, nil)
}

// hopRequestLocked builds an ACK or CANCEL of our own for t's INVITE as
// sent with branch (RFC 3261 §9.1, §17.1.1.3): its Request-URI, Route set,
// From, Call-ID and CSeq number; To from the answer for an ACK. The caller
// holds txnTable.mu.
func (s *Server) hopRequestLocked(t *txn, method string, to *gosip.ToHeader, branch string) []byte {
	req := t.req
	tr := "UDP"
	if t.cur != nil {
		tr = t.cur.transport()
	}
	var w bytes.Buffer
	w.WriteString(method)
	w.WriteByte(' ')
	req.Recipient.StringWrite(&w)
	w.WriteString(" SIP/2.0\r\n")
	s.ourVia(branch, tr).StringWrite(&w)
	w.WriteString("\r\nMax-Forwards: 70\r\n")
	for _, h := range req.Headers() {
		if _, ok := h.(*gosip.RouteHeader); ok {
			h.StringWrite(&w)
			w.WriteString("\r\n")
		}
	}
	if f := header(req, "from", "f"); f != nil {
		w.WriteString("From: ")
		w.WriteString(f.Value())
		w.WriteString("\r\n")
	}
	if to == nil {
		to = req.To()
	}
	if to != nil {
		to.StringWrite(&w)
		w.WriteString("\r\n")
	}
	w.WriteString("Call-ID: ")
	w.WriteString(t.callID)
	w.WriteString("\r\nCSeq: ")
	w.WriteString(strconv.FormatUint(uint64(req.CSeq().SeqNo), 10))
	w.WriteByte(' ')
	w.WriteString(method)
	w.WriteString("\r\nContent-Length: 0\r\n\r\n")
	return w.Bytes()
}

// finishLocal answers t's client with our own final response and ends t
// (kept for the ACK if it is an INVITE).
func (s *Server) finishLocal(t *txn, code int, reason string, extra []string) {
	s.txns.mu.Lock()
	p, dst := s.finishLocalLocked(t, code, reason, extra)
	s.txns.mu.Unlock()
	s.post(p, dst, nil)
}

// finishLocalLocked is finishLocal without the send; the caller holds
// txnTable.mu and sends p to dst.
func (s *Server) finishLocalLocked(t *txn, code int, reason string, extra []string) ([]byte, target) {
	p := s.buildReply(t.req, code, reason, extra...)
	dst := s.replyTarget(t.req, t.src)
	if t.lg != nil {
		why := warningText(extra)
		if why == "" {
			why = strings.ToLower(reason)
		}
		s.logTxnLocked(t, s.clock.Now(), code, accesslog.BySluice, false, why)
	}
	t.local = true
	if t.invite {
		if !t.dforeign {
			s.dialogs.remove(t.dkey) // our own final answer: no dialog
			s.shareDialog(DialogRemove, t.req, "", "", "")
		}
		t.settleLocked(0, lb.Abandoned)
		t.state = stCompleted
		t.expires = s.clock.Now() + int64(completedLinger)
		t.lastFinal = p
		if s.txns.byClient[t.ckey] == nil {
			s.txns.byClient[t.ckey] = t
		}
	} else {
		s.txns.removeLocked(t)
	}
	return p, dst
}

// send100 answers 100 Trying to an INVITE (RFC 3261 §16.2).
func (s *Server) send100(t *txn) {
	s.txns.mu.Lock()
	t.sent100 = true
	p := s.buildReply(t.req, 100, "Trying")
	dst := s.replyTarget(t.req, t.src)
	s.txns.mu.Unlock()
	s.post(p, dst, nil)
}

// txnTimers runs retransmissions, silence failover, 100 Trying and expiry.
func (s *Server) txnTimers(now int64) {
	type action struct {
		t      *txn
		kind   int
		wire   []byte
		dst    target
		cancel []byte
		up     target
	}
	const (
		doRetx = iota
		doFailover
		doTimeout
	)
	var acts []action
	s.txns.mu.Lock()
	s.txns.accepted.expireLocked(now)
	for _, t := range s.txns.byClient {
		switch t.state {
		case stCalling:
			if now >= t.deadline {
				t.state = stSwitching
				t.settleLocked(now, s.timeoutResult(t.sentAt))
				acts = append(acts, action{t: t, kind: doFailover})
				continue
			}
			if t.invite && !t.sent100 && t.src.conn == nil && now-t.created >= int64(trying100) {
				// 100 Trying stops the client's retransmissions (RFC 3261
				// §16.2), so only UDP clients get it. It is sent under the
				// lock: a 180 relayed by the reader takes the lock first
				// or after, never overtakes it or is overtaken.
				t.sent100 = true
				s.post(s.buildReply(t.req, 100, "Trying"), s.replyTarget(t.req, t.src), nil)
			}
			if !t.cur.tcp && now >= t.nextRetx {
				t.retxEvery *= 2
				if !t.invite && t.retxEvery > int64(timerT2) {
					t.retxEvery = int64(timerT2)
				}
				t.nextRetx = now + t.retxEvery
				acts = append(acts, action{t: t, kind: doRetx, wire: t.wire, dst: target{addr: t.cur.addr}})
			}
		case stProceeding:
			if now >= t.deadline {
				// Timer C or F (RFC 3261 §16.8): cancel upstream, 408 to
				// the client.
				var cancel []byte
				if t.invite {
					cancel = s.hopRequestLocked(t, "CANCEL", nil, t.branch)
				}
				t.canceled = true
				p, dst := s.finishLocalLocked(t, 408, "Request Timeout", nil)
				acts = append(acts, action{t: t, kind: doTimeout, wire: p, dst: dst, cancel: cancel, up: target{addr: t.cur.addr, tcp: t.cur.tcp}})
			}
		case stCompleted:
			if now >= t.expires {
				s.txns.removeLocked(t)
			}
		}
	}
	s.txns.mu.Unlock()
	for _, a := range acts {
		switch a.kind {
		case doRetx:
			s.metrics.Retransmitted.Add(1)
			s.post(a.wire, a.dst, nil)
		case doFailover:
			s.metrics.Timeouts.Add(1)
			s.attempt(a.t, now, true)
		case doTimeout:
			s.metrics.Timeouts.Add(1)
			if a.cancel != nil {
				s.post(a.cancel, a.up, nil)
			}
			s.post(a.wire, a.dst, nil)
		}
	}
}

// abortNewWork ends (aborts, as HTTP says) every new-work transaction still without a final
// answer, as the memory state Critical demands (SPEC §3): the client gets
// 503 with Retry-After, and an INVITE already at a backend is CANCELed
// there (its 487 is then ACKed and absorbed). Affinity traffic is not
// touched: it has no transaction.
func (s *Server) abortNewWork(now int64) {
	var victims []*txn
	s.txns.mu.Lock()
	for _, t := range s.txns.byClient {
		if t.state != stCompleted && !t.local {
			victims = append(victims, t)
		}
	}
	s.txns.mu.Unlock()
	for _, t := range victims {
		s.txns.mu.Lock()
		if t.state == stCompleted || t.local || t.state == stSwitching {
			s.txns.mu.Unlock()
			continue
		}
		var cancel []byte
		var dst target
		if t.invite && t.cur != nil && (t.state == stCalling || t.state == stProceeding) {
			cancel = s.hopRequestLocked(t, "CANCEL", nil, t.branch)
			dst = target{addr: t.cur.addr, tcp: t.cur.tcp}
		}
		t.canceled = true
		// The transaction is ours to finish before the CANCEL leaves, so
		// the backend's 487 finds it completed and is absorbed.
		p, pdst := s.finishLocalLocked(t, 503, "Service Unavailable", []string{
			"Retry-After: " + strconv.Itoa(s.jitter(s.cfg.BusyDefault)),
			"Warning: 399 " + s.adv.String() + ` "overload: memory critical"`})
		s.txns.mu.Unlock()
		if cancel != nil {
			s.post(cancel, dst, nil)
		}
		s.metrics.Aborted.Add(1)
		s.post(p, pdst, nil)
	}
}
