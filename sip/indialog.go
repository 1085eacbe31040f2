package sip

import (
	"sync"
	"sync/atomic"

	gosip "github.com/emiago/sipgo/sip"
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
	deadline int64  // monotonic ns
	reply    []byte // the 408 to send at the deadline
	to       target
	method   gosip.RequestMethod
	backend  string
}

// maxWatched caps the in-dialog requests awaiting an answer.
const maxWatched = 1 << 18

// watch records req, forwarded to backend with our branch br at now; a
// retransmission keeps the first deadline.
func (s *Server) watch(req *gosip.Request, src source, br, backend string, now int64) {
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
	w.entries[br] = watchEntry{
		deadline: now + int64(s.cfg.InDialogTimeout),
		reply:    s.buildReply(req, 408, "Request Timeout", "Warning: 399 "+s.adv.String()+` "backend did not answer"`),
		to:       s.replyTarget(req, src),
		method:   req.Method,
		backend:  backend,
	}
}

// answered forgets the request whose response carries our branch br. With
// nothing watched (most responses answer new work) it takes no lock.
func (s *Server) answered(br string) {
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
func (s *Server) unwatch(br string) { s.answered(br) }

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
		if err := s.sendBytes(e.reply, e.to); err == nil {
			s.metrics.LocalReplies.Add(1)
		}
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
