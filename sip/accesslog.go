package sip

import (
	"strings"
	"time"

	gosip "github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/accesslog"
)

// The SIP access log: one accesslog.SIPRecord per transaction the
// balancer forwarded or answered, handed to Deps.AccessLog when the
// transaction ends (its final answer went to the client, or it ended
// without one).
//
//   - new work (txn): from the request to the final answer, with the
//     backends it failed over from, the time to the first provisional and
//     to the final answer, and who produced the final status (a backend's
//     answer relayed, or sluice's own 408/487/500/503/513);
//   - in-dialog requests (affinity): from the request to the backend's
//     final answer, or to sluice's own 408/480/503;
//   - everything sluice answers itself without forwarding it (refusals
//     by admission, no route, 400, 403, 481, 482, 483, the OPTIONS it
//     answers): one record with the Warning's text as the reason.
//
// With no logger (or a logger that takes no SIP records) nothing here
// runs: a transaction carries a nil *txnLog and the message path
// allocates nothing more than without the log.

// txnLog is what a new-work transaction keeps for its record; allocated
// only while the access log takes SIP records. Guarded by txnTable.mu.
type txnLog struct {
	start       time.Time // wall clock at arrival
	delayed     bool      // waited in an ARM delay queue
	provisional int64     // monotonic ns of the first provisional answer from a backend; 0: none
	failovers   int
	tried       [accesslog.MaxRetries]string // backends tried before the current one
	// backend, when set, answered instead of the current one (an earlier
	// attempt's 2xx).
	backend string
	logged  bool
}

// logging reports whether SIP records are wanted.
func (s *Server) logging() bool { return s.alog.Enabled(accesslog.SIP) }

// newTxnLog starts the record of a new-work transaction when logging.
func (s *Server) newTxnLog(delayed bool) *txnLog {
	if !s.logging() {
		return nil
	}
	return &txnLog{start: time.Now(), delayed: delayed}
}

// noteAttemptLocked records that t moves from its current backend to
// another one (a failover). The caller holds txnTable.mu.
func (t *txn) noteAttemptLocked() {
	if t.lg == nil || t.cur == nil {
		return
	}
	if t.lg.failovers < len(t.lg.tried) {
		t.lg.tried[t.lg.failovers] = t.cur.id
	}
	t.lg.failovers++
}

// noteProvisionalLocked records the first provisional answer of a backend.
func (t *txn) noteProvisionalLocked(now int64) {
	if t.lg != nil && t.lg.provisional == 0 {
		t.lg.provisional = now
	}
}

// logTxnLocked hands t's record to the access log, once: status is the
// final answer the client got (0: none), by who produced it, refused
// whether sluice refused it (admission, no backend) rather than ending
// it after admitting it, reason why sluice answered itself (refusals,
// timeouts). The backend is the one t went to last. The caller holds
// txnTable.mu.
func (s *Server) logTxnLocked(t *txn, now int64, status int, by accesslog.Producer, refused bool, reason string) {
	if t.lg == nil || t.lg.logged {
		return
	}
	t.lg.logged = true
	var r accesslog.SIPRecord
	s.fillRecord(&r, t.req, t.src)
	r.Start = t.lg.start
	r.Pool = t.poolName
	if t.cur != nil {
		r.Backend = t.cur.id
	}
	if t.lg.backend != "" {
		r.Backend = t.lg.backend
	}
	r.Status, r.StatusFrom = status, by
	r.Class = accesslog.ClassNew
	switch {
	case refused:
		r.Decision = accesslog.Refused
	case t.lg.delayed:
		r.Decision = accesslog.Delayed
	}
	r.Reason = reason
	r.Failovers = t.lg.failovers
	r.FailoverBackends = t.lg.tried
	if t.lg.provisional != 0 {
		r.Provisional = time.Duration(t.lg.provisional - t.created)
	}
	r.Final = time.Duration(now - t.created)
	s.alog.LogSIP(&r)
}

// fillRecord fills what every record takes from the request: method,
// Request-URI, Call-ID, tags, CSeq, transport and source, and the trace
// context of a traceparent header.
func (s *Server) fillRecord(r *accesslog.SIPRecord, req *gosip.Request, src source) {
	r.Method = string(req.Method)
	r.RURI = req.Recipient.String()
	if cid := req.CallID(); cid != nil {
		r.CallID = cid.Value()
	}
	if f := header(req, "from", "f"); f != nil {
		r.FromTag = tagParam(f.Value())
	}
	r.ToTag = toTag(req)
	if c := req.CSeq(); c != nil {
		r.CSeq = c.SeqNo
	}
	r.Transport = logTransport(src)
	r.Source = src.addr
	if h := req.GetHeader("traceparent"); h != nil {
		r.TraceID, r.ParentSpan, r.TraceFlags, r.HasTrace = accesslog.ParseTraceparent(h.Value())
	}
}

// logTransport is the transport the request came on, in lower case.
func logTransport(src source) string {
	if src.conn == nil {
		return "udp"
	}
	switch src.conn.kind.String() {
	case "TCP":
		return "tcp"
	case "TLS":
		return "tls"
	case "WS":
		return "ws"
	case "WSS":
		return "wss"
	}
	return strings.ToLower(src.conn.kind.String())
}

// logLocal records an answer sluice gave itself to a request it did not
// forward and keeps no transaction for: no route, a malformed or forged
// request, the OPTIONS it answers, a CANCEL it answers, an in-dialog
// request whose backend is down. extra are the answer's header lines: the
// Warning's text is the reason of an error status, else its reason
// phrase.
func (s *Server) logLocal(req *gosip.Request, src source, code int, phrase string, extra []string) {
	if !s.logging() || req.Method == gosip.ACK {
		return
	}
	why := ""
	if code >= 300 {
		if why = warningText(extra); why == "" {
			why = strings.ToLower(phrase)
		}
	}
	s.logAnswer(req, src, false, "", code, why)
}

// logRefusal records new work refused without a transaction (admission,
// no backend, a drained pool), of pool ("" when none was chosen), for the
// reason what (the refusal's Warning text). It counts as new work
// whatever its To-tag says.
func (s *Server) logRefusal(req *gosip.Request, src source, pool, what string) {
	if !s.logging() || req.Method == gosip.ACK {
		return
	}
	s.logAnswer(req, src, true, pool, 503, what)
}

func (s *Server) logAnswer(req *gosip.Request, src source, refusal bool, pool string, code int, why string) {
	var r accesslog.SIPRecord
	s.fillRecord(&r, req, src)
	r.Start = time.Now()
	r.Pool = pool
	r.Status, r.StatusFrom = code, accesslog.BySluice
	r.Class = accesslog.ClassNew
	if r.ToTag != "" && !refusal {
		r.Class = accesslog.ClassAffinity
	}
	if code >= 300 {
		r.Decision = accesslog.Refused
		r.Reason = why
	}
	s.alog.LogSIP(&r)
}

// warningText is the quoted text of the first Warning header line in
// extra ("" when none).
func warningText(extra []string) string {
	for _, e := range extra {
		if !strings.HasPrefix(e, "Warning:") {
			continue
		}
		i := strings.IndexByte(e, '"')
		j := strings.LastIndexByte(e, '"')
		if i >= 0 && j > i {
			return e[i+1 : j]
		}
	}
	return ""
}

// inDialogLog is what a watched in-dialog request keeps for its record;
// allocated only while the access log takes SIP records.
type inDialogLog struct {
	rec  accesslog.SIPRecord
	sent int64 // monotonic ns the request was forwarded
	// provisional: a provisional answer came; the entry now waits only
	// for the final answer to log it (no 408 of ours any more).
	provisional bool
}

// newInDialogLog starts the record of an in-dialog request forwarded to
// backend b.
func (s *Server) newInDialogLog(req *gosip.Request, src source, backend string, now int64) *inDialogLog {
	if !s.logging() {
		return nil
	}
	l := &inDialogLog{sent: now}
	s.fillRecord(&l.rec, req, src)
	l.rec.Start = time.Now()
	l.rec.Backend = backend
	l.rec.Class = accesslog.ClassAffinity
	return l
}

// finish logs an in-dialog record with its final status.
func (s *Server) finishInDialog(l *inDialogLog, now int64, status int, by accesslog.Producer, reason string) {
	l.rec.Status, l.rec.StatusFrom = status, by
	l.rec.Reason = reason
	l.rec.Final = time.Duration(now - l.sent)
	if status >= 300 && by == accesslog.BySluice {
		l.rec.Decision = accesslog.Refused
	}
	s.alog.LogSIP(&l.rec)
}
