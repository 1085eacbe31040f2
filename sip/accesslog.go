package sip

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// toTag is the To-tag of the backend's final answer, for the line of
	// an INVITE (its request has none): set just before the line is made.
	toTag string
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
	if r.ToTag == "" && t.lg.toTag != "" {
		r.ToTag = clip(t.lg.toTag, maxLogTag) // the dialog's, from the answer
	}
	t.lg.toTag = ""
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
//
// What a client wrote is cut to a bound (clip): a record holds at most
// about a kilobyte of the request whatever its size, so the records
// waiting for the writer and the dialogs waiting for their summary hold
// a bounded amount of memory. With -access-log-mask-user the
// Request-URI's user part is masked before the cut.
func (s *Server) fillRecord(r *accesslog.SIPRecord, req *gosip.Request, src source) {
	r.Method = clip(string(req.Method), maxLogMethod)
	uri := req.Recipient.String()
	if s.alog.MasksUser() {
		// Masked before it is cut: cut first, a user part longer than
		// the bound would lose its '@' and be logged as it is.
		uri = accesslog.MaskUser(uri)
	}
	r.RURI = clip(uri, maxLogURI)
	if cid := req.CallID(); cid != nil {
		r.CallID = clip(cid.Value(), maxLogCallID)
	}
	if f := header(req, "from", "f"); f != nil {
		r.FromTag = clip(tagParam(f.Value()), maxLogTag)
	}
	r.ToTag = clip(toTag(req), maxLogTag)
	if c := req.CSeq(); c != nil {
		r.CSeq = c.SeqNo
	}
	r.Transport = logTransport(src)
	r.Source = src.addr
	if h := req.GetHeader("traceparent"); h != nil {
		r.TraceID, r.ParentSpan, r.TraceFlags, r.HasTrace = accesslog.ParseTraceparent(h.Value())
	}
}

// Bounds of what a record keeps of a request's fields, in bytes.
const (
	maxLogMethod = 32
	maxLogURI    = 512
	maxLogCallID = 256
	maxLogTag    = 128
)

// clip returns s, or a copy of its first n bytes when it is longer.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.Clone(s[:n])
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
	s.logLocalIn(req, src, "", code, phrase, extra)
}

// logLocalIn is logLocal for a request whose pool is known.
func (s *Server) logLocalIn(req *gosip.Request, src source, pool string, code int, phrase string, extra []string) {
	if !s.logging() || req.Method == gosip.ACK {
		return
	}
	why := ""
	if code >= 300 {
		if why = warningText(extra); why == "" {
			why = strings.ToLower(phrase)
		}
	}
	s.logAnswer(req, src, false, pool, code, why)
}

// logShed records a request sluice would have answered itself (as
// logLocal) but did not: its answer to a UDP source was over the source's
// share or larger than the request (replyLocal). No status was sent;
// the reason says what it would have been and why it was not.
func (s *Server) logShed(req *gosip.Request, src source, code int, phrase string, extra []string, why string) {
	if !s.logging() || req.Method == gosip.ACK {
		return
	}
	what := warningText(extra)
	if what == "" {
		what = strings.ToLower(phrase)
	}
	s.logAnswer(req, src, false, "", 0, what+" ("+strconv.Itoa(code)+" not sent: "+why+")")
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
	if code >= 300 || code == 0 {
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
// backend of pool (the dialog's: its token's or the dialog table's).
func (s *Server) newInDialogLog(req *gosip.Request, src source, backend, pool string, now int64) *inDialogLog {
	if !s.logging() {
		return nil
	}
	l := &inDialogLog{sent: now}
	s.fillRecord(&l.rec, req, src)
	l.rec.Start = time.Now()
	l.rec.Backend = backend
	l.rec.Pool = pool
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

// Dialog summaries (Config.AccessLogDialogs, -sip-access-log-dialogs):
// one record of kind accesslog.SIPDialogEnd per dialog set up through
// this node, when the final answer to its BYE passes (whichever side hung
// up) or, without a BYE, when it has been idle for -sip-dialog-ttl, like
// Kamailio's acc CDRs. They are kept apart from the dialog table, only
// while the summaries are on, and at most maxDialogLogs at once (past it
// a dialog gets no summary; counted in dialogLogsFull).

// maxDialogLogs bounds the dialogs awaiting their summary (a few hundred
// bytes each).
const maxDialogLogs = 1 << 17

// dialogLog is a dialog awaiting its summary.
type dialogLog struct {
	rec  accesslog.SIPRecord // the INVITE's, with the 2xx's To-tag
	up   int64               // monotonic ns of the 2xx
	last int64               // monotonic ns of the last BYE seen (0: none), for the idle sweep
}

// dialogLogs holds the dialogs awaiting their summary, by Call-ID and
// both tags.
type dialogLogs struct {
	mu      sync.Mutex
	m       map[string]*dialogLog
	swept   int64 // monotonic ns of the last idle sweep
	full    atomic.Uint64
	pending atomic.Int64 // len(m), read without the lock
}

func dialogLogKey(callID, a, b string) string {
	if a > b {
		a, b = b, a
	}
	return callID + "\x00" + a + "\x00" + b
}

// dialogUpLocked records that t's INVITE was answered 2xx by backend
// (with To-tag toTag) at now: its summary comes at the dialog's end. The
// caller holds txnTable.mu.
func (s *Server) dialogUpLocked(t *txn, backend, toTag string, now int64) {
	if !s.cfg.AccessLogDialogs || t.lg == nil || toTag == "" {
		return
	}
	d := &dialogLog{up: now}
	s.fillRecord(&d.rec, t.req, t.src)
	// Copies: kept for the dialog's life, they must not hold the
	// message they were parsed from.
	d.rec.Method = strings.Clone(d.rec.Method)
	d.rec.CallID = strings.Clone(d.rec.CallID)
	d.rec.FromTag = strings.Clone(d.rec.FromTag)
	d.rec.ToTag = strings.Clone(clip(toTag, maxLogTag))
	d.rec.Kind = accesslog.SIPDialogEnd
	d.rec.Start = t.lg.start
	d.rec.Pool = t.poolName
	d.rec.Backend = backend
	d.rec.Class = accesslog.ClassAffinity
	dl := &s.dialogLogs
	key := dialogLogKey(d.rec.CallID, d.rec.FromTag, d.rec.ToTag)
	dl.mu.Lock()
	defer dl.mu.Unlock()
	if dl.m == nil {
		dl.m = map[string]*dialogLog{}
	}
	if _, ok := dl.m[key]; !ok && len(dl.m) >= maxDialogLogs {
		dl.full.Add(1)
		return
	}
	if _, ok := dl.m[key]; !ok {
		dl.pending.Add(1)
	}
	dl.m[key] = d
}

// dialogEnded logs the summary of the dialog whose BYE got the final
// answer res from src: the BYE came from the caller when the answer comes
// from a backend, else from the callee.
func (s *Server) dialogEnded(res *gosip.Response, src source, now int64) {
	dl := &s.dialogLogs
	if dl.pending.Load() == 0 {
		return
	}
	var from string
	if f := header(res, "from", "f"); f != nil {
		from = tagParam(f.Value())
	}
	key := dialogLogKey(clip(res.CallID().Value(), maxLogCallID), clip(from, maxLogTag), clip(toTag(res), maxLogTag))
	dl.mu.Lock()
	d := dl.m[key]
	if d != nil {
		delete(dl.m, key)
		dl.pending.Add(-1)
	}
	dl.mu.Unlock()
	if d == nil {
		return
	}
	d.rec.ByeSide = "callee"
	if s.pool.Load().backendAt(src.addr) != nil {
		d.rec.ByeSide = "caller"
	}
	d.rec.Status, d.rec.StatusFrom = res.StatusCode, accesslog.ByBackend
	if c := res.CSeq(); c != nil {
		d.rec.CSeq = c.SeqNo
	}
	d.rec.Method = "BYE"
	d.rec.Duration = time.Duration(now - d.up)
	s.alog.LogSIP(&d.rec)
}

// sweepDialogLogs logs, without a BYE side, the summaries of dialogs
// idle for -sip-dialog-ttl since their 2xx (their BYE never passed here:
// lost, or sent elsewhere). It scans at most once a minute.
func (s *Server) sweepDialogLogs(now int64) {
	dl := &s.dialogLogs
	if dl.pending.Load() == 0 || now-dl.swept < int64(time.Minute) {
		return
	}
	dl.swept = now
	var due []*dialogLog
	dl.mu.Lock()
	for k, d := range dl.m {
		if now-d.up >= int64(s.cfg.DialogTTL) {
			due = append(due, d)
			delete(dl.m, k)
			dl.pending.Add(-1)
		}
	}
	dl.mu.Unlock()
	for _, d := range due {
		d.rec.Method = "BYE"
		d.rec.Duration = time.Duration(now - d.up)
		d.rec.Reason = "no bye"
		s.alog.LogSIP(&d.rec)
	}
}
