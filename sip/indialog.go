package sip

import (
	"errors"
	"hash/maphash"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
)

// In-dialog requests are forwarded statelessly, but a client must never
// be left in silence when the dialog's backend dies mid-call: its own
// Timer F (32 s) would be the only answer. inDialogWatch remembers each
// in-dialog request (other than ACK) sent to a backend until a response
// with its branch comes back; a request without one after
// Config.InDialogTimeout gets our 408. A request for a backend that is
// already down gets 480 at once and is not sent (handleInDialog).
//
// An entry holds the 408 already built (a few hundred bytes) and lives
// for one round trip to the backend; the table is capped so a flood of
// in-dialog requests to a silent backend cannot grow it without bound
// (past the cap a request is forwarded unwatched, as before).
type inDialogWatch struct {
	mu      sync.Mutex
	entries map[string]watchEntry // by our branch
	n       atomic.Int64          // len(entries), read without the lock
}

type watchEntry struct {
	sent     int64  // monotonic ns
	deadline int64  // monotonic ns
	reply    []byte // the 408 to send at the deadline
	to       target
	raw      []byte // or the request as received, reply and to made from it (watchRaw)
	src      source
	method   gosip.RequestMethod
	backend  string
	lg       *inDialogLog // the access-log record under way; nil when not logging
	// logOnly: a forwarded CANCEL, watched only for its record (logging
	// on): no 408 of ours, no verdict on the backend, and only an answer
	// to a CANCEL ends it (its INVITE's answers share its branch).
	logOnly bool
}

// maxWatched caps the in-dialog requests awaiting an answer.
const maxWatched = 1 << 18

// watch records req, forwarded to backend (of pool, for the record) with
// our branch br at now; a retransmission keeps the first deadline.
func (s *Server) watch(req *gosip.Request, src source, br, backend, pool string, now int64) {
	s.addWatch(br, func() watchEntry {
		return watchEntry{
			sent:     now,
			deadline: now + int64(s.cfg.InDialogTimeout),
			reply:    s.buildReply(req, 408, "Request Timeout", "Warning: 399 "+s.adv.String()+` "backend did not answer"`),
			to:       s.replyTarget(req, src),
			method:   req.Method,
			backend:  backend,
			lg:       s.newInDialogLog(req, src, backend, pool, now),
		}
	})
}

// addWatch records the entry entry makes under br, made only when br is
// not watched yet and the table has room (a retransmission keeps the
// first deadline).
func (s *Server) addWatch(br string, entry func() watchEntry) {
	w := &s.watched
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, dup := w.entries[br]; dup {
		return
	}
	if w.entries == nil {
		w.entries = make(map[string]watchEntry)
	}
	if len(w.entries) >= maxWatched {
		return
	}
	w.n.Add(1)
	w.entries[br] = entry()
}

// watchRaw is watch for a request the fast path forwarded (fastreq.go):
// it keeps the request as received, and the 408 and where it goes are
// made from it at the deadline, as watch would have made them now (its
// access-log record is none: the fast path does not run with the log).
func (s *Server) watchRaw(raw []byte, src source, br, backend string, method gosip.RequestMethod, now int64) {
	s.addWatch(br, func() watchEntry {
		return watchEntry{
			sent:     now,
			deadline: now + int64(s.cfg.InDialogTimeout),
			raw:      raw,
			src:      src,
			method:   method,
			backend:  backend,
		}
	})
}

// watchCancel records a client's CANCEL forwarded to backend (of pool)
// with br, its INVITE's branch, at now, for its record only: when the
// access log takes no SIP records it does nothing. Without an answer
// within Timer F it is logged with no status.
func (s *Server) watchCancel(req *gosip.Request, src source, br, backend, pool string, now int64) {
	lg := s.newInDialogLog(req, src, backend, pool, now)
	if lg == nil {
		return
	}
	lg.rec.Class = accesslog.ClassNew // part of its INVITE's new work
	w := &s.watched
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, dup := w.entries[br]; dup || len(w.entries) >= maxWatched {
		return
	}
	if w.entries == nil {
		w.entries = make(map[string]watchEntry)
	}
	w.n.Add(1)
	w.entries[br] = watchEntry{sent: now, deadline: now + int64(timerF), method: req.Method, backend: backend, lg: lg, logOnly: true}
}

// answered forgets the request whose response carries our branch br, and
// records that the backend at src answered: real traffic shows it alive,
// which overrules failing OPTIONS pings (lb.Backend.Served) and ends a
// run of unanswered in-dialog requests. method is the answer's CSeq
// method. With nothing watched (most responses answer new work) it takes
// no lock.
func (s *Server) answered(br string, src source, code int, method gosip.RequestMethod) {
	if b := s.pool.Load().backendAt(src.addr); b != nil {
		b.lb.Served(s.clock.Now())
		if b.unanswered.Load() != 0 {
			b.unanswered.Store(0)
		}
	}
	w := &s.watched
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	e, ok := w.entries[br]
	if !ok || e.logOnly && method != e.method {
		w.mu.Unlock()
		return
	}
	if e.lg != nil && code < 200 {
		// Logged at its final answer: the entry stays for it, without a
		// 408 of ours now that the backend answered (as without the log),
		// until Timer F.
		now := s.clock.Now()
		if !e.lg.provisional {
			e.lg.provisional = true
			e.lg.rec.Provisional = time.Duration(now - e.lg.sent)
			e.deadline = now + int64(timerF)
			w.entries[br] = e
		}
		w.mu.Unlock()
		return
	}
	delete(w.entries, br)
	w.n.Add(-1)
	w.mu.Unlock()
	if e.lg != nil {
		s.finishInDialog(e.lg, s.clock.Now(), code, accesslog.ByBackend, "")
	}
}

// forget drops the watch on br.
func (s *Server) forget(br string) {
	w := &s.watched
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	if _, ok := w.entries[br]; ok {
		delete(w.entries, br)
		w.n.Add(-1)
	}
	w.mu.Unlock()
}

// unwatch forgets br after a send that failed and was answered at once.
func (s *Server) unwatch(br string) { s.forget(br) }

// dialRefused takes a backend whose TCP connection was refused out for
// twice -sip-in-dialog-timeout: nothing listens there, which is proof from
// the traffic itself, so its in-dialog requests get 480 at once meanwhile
// instead of waiting for our 408. The requests already queued for the
// connection still get the 408 (its first timeout), then the verdict holds
// for one more. Other dial errors (a timeout, no route) prove less and are
// left to the in-dialog watch.
func (s *Server) dialRefused(a netip.AddrPort, err error) {
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return
	}
	b := s.pool.Load().backendAt(a)
	if b == nil {
		return
	}
	now := s.clock.Now()
	if b.lb.AcceptsAffinity(now) {
		s.log.Warn("sip backend refused a connection: out", "backend", b.id, "for", 2*s.cfg.InDialogTimeout)
		if s.events != nil {
			s.events(admission.Event{Time: time.Now(), Kind: admission.EventBackendState, Subject: "sip " + b.id,
				Message: "backend " + b.id + " out: connection refused; its in-dialog requests get 480 for " + (2 * s.cfg.InDialogTimeout).String()})
		}
	}
	b.lb.Eject(now, 2*s.cfg.InDialogTimeout)
}

// unansweredDead is how many in-dialog requests in a row a backend may
// leave unanswered past -sip-in-dialog-timeout, with no answer to anything
// (OPTIONS pings included) since each was sent, before traffic counts it
// dead: its in-dialog requests then get 480 at once for
// -sip-in-dialog-timeout (then one more is tried), and it gets no new work
// meanwhile. One lost request is not enough, and requests a live backend
// chooses not to answer (a client's junk) never count: it answered
// something else since.
const unansweredDead = 3

// unansweredBy charges one in-dialog request, sent at sent and left
// unanswered, to the backend with id.
func (s *Server) unansweredBy(id string, sent, now int64) {
	b, _ := s.pool.Load().dialogBackend(id)
	if b == nil {
		return
	}
	if b.lb.AnsweredSince(sent) {
		b.unanswered.Store(0)
		return
	}
	if b.unanswered.Add(1) < unansweredDead {
		return
	}
	if b.lb.AcceptsAffinity(now) {
		s.log.Warn("sip backend left in-dialog requests unanswered: out for the in-dialog timeout", "backend", id,
			"unanswered", b.unanswered.Load(), "for", s.cfg.InDialogTimeout)
		if s.events != nil {
			s.events(admission.Event{Time: time.Now(), Kind: admission.EventBackendState, Subject: "sip " + id,
				Message: "backend " + id + " out: " + strconv.Itoa(int(b.unanswered.Load())) + " in-dialog requests in a row unanswered; its in-dialog requests get 480 for " + s.cfg.InDialogTimeout.String()})
		}
	}
	b.lb.Eject(now, s.cfg.InDialogTimeout)
}

// expireWatched answers 408 to every watched request past its deadline.
func (s *Server) expireWatched(now int64) {
	w := &s.watched
	if w.n.Load() == 0 {
		return
	}
	var due []watchEntry
	w.mu.Lock()
	for br, e := range w.entries {
		if now >= e.deadline {
			due = append(due, e)
			delete(w.entries, br)
			w.n.Add(-1)
		}
	}
	w.mu.Unlock()
	for _, e := range due {
		if e.logOnly {
			s.finishInDialog(e.lg, now, 0, accesslog.ByBackend, "no final answer")
			continue
		}
		if e.lg != nil && e.lg.provisional {
			// Answered provisionally, then nothing: no 408 of ours
			// (none without the log either), only its record.
			s.finishInDialog(e.lg, now, 0, accesslog.ByBackend, "no final answer")
			continue
		}
		if e.lg != nil {
			s.finishInDialog(e.lg, now, 408, accesslog.BySluice, "backend did not answer")
		}
		// The verdict first: the client's next request, sent on our
		// 408, must find it. Not when our own socket dropped datagrams
		// since it was sent: the answer may have been one of them.
		if s.ownDropsSince(e.sent) {
			s.metrics.TimeoutsOwnDrops.Add(1)
		} else {
			s.unansweredBy(e.backend, e.sent, now)
		}
		if e.reply == nil && e.raw != nil {
			req := s.parseRaw(e.raw)
			if req == nil {
				continue
			}
			e.reply = s.buildReply(req, 408, "Request Timeout", "Warning: 399 "+s.adv.String()+` "backend did not answer"`)
			e.to = s.replyTarget(req, e.src)
		}
		s.post(e.reply, e.to, &s.metrics.LocalReplies)
		s.metrics.InDialogUnanswered.Add(1)
		s.log.Warn("sip in-dialog request unanswered by its backend: 408 sent to the client", "backend", e.backend, "method", string(e.method))
	}
}

// watchedLen is the number of in-dialog requests awaiting an answer.
func (s *Server) watchedLen() int {
	s.watched.mu.Lock()
	defer s.watched.mu.Unlock()
	return len(s.watched.entries)
}

// Policies for a request that looks in-dialog (it has a To-tag) but
// proves nothing: no token of ours and no entry in the dialog table (the
// local one, which the cluster's dialog events also fill). Config field
// UnknownDialog, flag -sip-unknown-dialog.
const (
	// UnknownDialogNewWork routes it by the Call-ID hash but admits it
	// like new work: memory state, the ARM rules that match its method,
	// the MOP of its backend, and first a per-source share
	// (-sip-unknown-dialog-source-rate). The default.
	UnknownDialogNewWork = "new-work"
	// UnknownDialogReject answers 481 Call/Transaction Does Not Exist
	// (an ACK, which has no answer, is dropped).
	UnknownDialogReject = "reject"
	// UnknownDialogHash forwards it by the Call-ID hash as affinity,
	// admitted past every guard: the behaviour before the policy existed.
	UnknownDialogHash = "hash"
)

// UnknownDialogPolicies lists the values of Config.UnknownDialog.
var UnknownDialogPolicies = []string{UnknownDialogNewWork, UnknownDialogReject, UnknownDialogHash}

// admitTokenless decides an in-dialog request without a token of ours,
// routed to b in pool (the dialog's: an ARM rule with pool= meters it);
// known is true when the dialog table recorded its dialog.
// It answers (or drops) the request itself and returns false when the
// request is not to be forwarded.
//
// Only a known dialog is affinity. A method that can create a dialog goes
// through admission whatever the table says (a To-tag we did not sign
// proves nothing). For the rest, an unknown dialog is handled by
// Config.UnknownDialog: a made-up To-tag and a fresh Call-ID per request
// must not be a way past ARM and MOP.
func (s *Server) admitTokenless(req *gosip.Request, src source, b *backend, pool string, known bool, now int64) bool {
	creating := dialogCreating(req.Method)
	if !creating {
		switch {
		case known:
			s.admitAffinity(now, req.Method, pool)
			return true
		case s.cfg.UnknownDialog == UnknownDialogHash:
			s.admitAffinity(now, req.Method, pool)
			return true
		case s.cfg.UnknownDialog == UnknownDialogReject:
			s.metrics.UnknownDialogRejected.Add(1)
			if req.Method != gosip.ACK {
				s.replyLocal(req, src, 481, "Call/Transaction Does Not Exist", "Warning: 399 "+s.adv.String()+` "unknown dialog (-sip-unknown-dialog reject)"`)
			}
			return false
		}
		if s.overUnknownShare(req, src, now) {
			return false
		}
		s.metrics.UnknownDialogMetered.Add(1)
	}
	ar := admission.Request{Class: admission.NewWork, Proto: "sip", Method: string(req.Method), Pool: pool}
	d := s.adm.Decide(now, &ar, b.lb.MOP())
	if d.Verdict == admission.Delay {
		// No state is kept for in-dialog requests: a delay is a refusal.
		d.Wait.Cancel()
		d = s.adm.Resume(now, &ar, d, b.lb.MOP())
	}
	if d.Verdict != admission.Admit {
		s.refuse(req, src, d)
		return false
	}
	return true
}

// overUnknownShare counts a request of an unknown dialog against its
// source's share (-sip-unknown-dialog-source-rate) and, past it, answers
// it 503 (an ACK is dropped) and reports true. With the policy new-work
// only.
func (s *Server) overUnknownShare(req *gosip.Request, src source, now int64) bool {
	if s.cfg.UnknownDialog != UnknownDialogNewWork || s.unknownShare.allow(src.addr.Addr(), now, s.cfg.UnknownDialogSourceRate) {
		return false
	}
	s.metrics.UnknownDialogSourceLimited.Add(1)
	s.metrics.Refused.Add(1)
	if req.Method != gosip.ACK {
		s.replyLocal(req, src, 503, "Service Unavailable",
			"Retry-After: "+strconv.Itoa(s.jitter(time.Second)),
			"Warning: 399 "+s.adv.String()+` "overload: unknown dialog, per-source share"`)
	}
	return true
}

// sourceShare caps, per source IP address (an IPv6 one by its /64), the
// in-dialog requests of unknown dialogs admitted per second, before they
// reach the ARM rules: one source's flood spends at most its share of a
// rule's budget, and the rest stays for everybody else's requests. Sources are counted in a fixed
// table of slots by a keyed hash of the address (a random key per
// process, so nobody can aim at another source's slot); two sources that
// share a slot share one cap. It takes no lock and allocates nothing.
type sourceShare struct {
	once  sync.Once
	seed  maphash.Seed
	slots [sourceSlots]atomic.Uint64 // second (high 32 bits) | count (low 32)
}

// sourceSlots is the size of the per-source table (32 KiB).
const sourceSlots = 4096

// slot is the table index of source ip.
func (sh *sourceShare) slot(ip netip.Addr) uint64 {
	sh.once.Do(func() { sh.seed = maphash.MakeSeed() })
	ip = ip.Unmap()
	a := ip.As16()
	if ip.Is6() {
		clear(a[8:]) // an IPv6 source is its /64: one host holds the whole prefix
	}
	return maphash.Bytes(sh.seed, a[:]) % sourceSlots
}

// allow counts one request from ip at now and reports whether it is within
// rate per second (rate 0: no cap).
func (sh *sourceShare) allow(ip netip.Addr, now int64, rate int) bool {
	if rate <= 0 {
		return true
	}
	slot := &sh.slots[sh.slot(ip)]
	sec := uint64(uint32(now / int64(time.Second)))
	for {
		cur := slot.Load()
		next := sec<<32 | 1
		if cur>>32 == sec {
			n := cur & 0xffffffff
			if n >= uint64(rate) {
				return false
			}
			next = cur + 1
		}
		if slot.CompareAndSwap(cur, next) {
			return true
		}
	}
}
