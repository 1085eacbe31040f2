package sip

import (
	"fmt"
	"io"
	"sync/atomic"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// Metrics are the SIP front end's counters, all monotonic since start.
// Fields are atomics: read them with Load; do not copy a Metrics.
type Metrics struct {
	Requests  atomic.Uint64 // parsed requests received
	Responses atomic.Uint64 // parsed responses received

	Forwarded      atomic.Uint64 // requests sent upstream or downstream
	NewWork        atomic.Uint64 // new work forwarded (attempts, failovers included)
	Affinity       atomic.Uint64 // in-dialog requests routed by a valid token
	AffinityGone   atomic.Uint64 // of those, to a backend SetBackends removed
	CallIDFallback atomic.Uint64 // in-dialog requests without our Route, routed by Call-ID hash
	DialogRouted   atomic.Uint64 // in-dialog requests without our Route, routed by the dialog table
	DialogMisses   atomic.Uint64 // in-dialog requests without our Route not in the dialog table
	DialogsFull    atomic.Uint64 // INVITEs not recorded in the dialog table: it was full
	Relayed        atomic.Uint64 // responses relayed

	Refused    atomic.Uint64                       // new work refused by the balancer (503)
	RefusedBy  [admission.NumReasons]atomic.Uint64 // by admission.Reason (none, memory, arm, mop, draining)
	Delayed    atomic.Uint64                       // new work held in an ARM delay queue
	Failovers  atomic.Uint64                       // new work moved to another backend
	AllFailed  atomic.Uint64                       // new work answered 500: every backend failed
	Timeouts   atomic.Uint64                       // attempts that got no answer in time
	Terminated atomic.Uint64                       // new work ended with 503 in memory state Critical

	Backend503   atomic.Uint64 // 503 answers from backends (absorbed, never relayed)
	ForgedTokens atomic.Uint64 // in-dialog requests with our Route and a bad token (403)
	TooManyHops  atomic.Uint64 // 483 answers

	Malformed        atomic.Uint64 // unparsable or invalid messages
	BadRequests      atomic.Uint64 // 400 answers
	MalformedDropped atomic.Uint64 // malformed messages that could not be answered
	Oversize         atomic.Uint64 // datagrams over -sip-max-message or too big to send
	StrayResponses   atomic.Uint64 // responses whose top Via is not ours

	LocalReplies    atomic.Uint64 // responses the balancer generated
	OptionsAnswered atomic.Uint64 // OPTIONS to the balancer answered 200
	AbsorbedACKs    atomic.Uint64 // ACKs of our own final answers
	Retransmissions atomic.Uint64 // client retransmissions absorbed
	Retransmitted   atomic.Uint64 // our retransmissions to UDP backends

	SendErrors atomic.Uint64 // failed writes
	TCPRefused atomic.Uint64 // TCP connections over -sip-tcp-max-conns
	TCPSlow    atomic.Uint64 // TCP connections closed: message not complete within -sip-tcp-message-timeout
	TCPStalled atomic.Uint64 // TCP connections closed: peer did not read what we sent
	Panics     atomic.Uint64 // recovered handler panics (bugs)

	PingsSent   atomic.Uint64 // OPTIONS health pings
	PingsFailed atomic.Uint64 // pings without an answer in time
}

// Metrics returns the server's counters.
func (s *Server) Metrics() *Metrics { return &s.metrics }

// BackendStatus is a point-in-time view of one backend.
type BackendStatus struct {
	ID          string
	Addr        string
	Transport   string
	Weight      int
	Up          bool  // not down (health checks, passive ejection)
	Draining    bool  // up but taking no new work (503 Retry-After, operator drain)
	Outstanding int64 // new-work transactions waiting for a final answer
	Requests    uint64
	Failures    uint64
}

// Pool returns the lb pool of the SIP backends (for /status and persisting
// their MOP state). SetBackends replaces it: call Pool again rather than
// keeping it.
func (s *Server) Pool() *lb.Pool { return s.pool.Load().lb }

// Backends returns the state of every backend.
func (s *Server) Backends() []BackendStatus {
	now := s.clock.Now()
	p := s.pool.Load()
	out := make([]BackendStatus, 0, len(p.list))
	for _, b := range p.list {
		st := b.lb.Status(now)
		out = append(out, BackendStatus{
			ID: b.id, Addr: b.addr.String(), Transport: b.transport(), Weight: b.lb.Weight(),
			Up: st.State != lb.Down, Draining: st.State == lb.Draining,
			Outstanding: st.Outstanding, Requests: st.Requests, Failures: st.Failures,
		})
	}
	return out
}

// WritePrometheus writes the counters in the Prometheus text format.
func (s *Server) WritePrometheus(w io.Writer) {
	m := &s.metrics
	c := func(name, help string, v uint64) {
		fmt.Fprintf(w, "# HELP sluice_sip_%s %s\n# TYPE sluice_sip_%s counter\nsluice_sip_%s %d\n", name, help, name, name, v)
	}
	c("requests_total", "SIP requests received.", m.Requests.Load())
	c("responses_total", "SIP responses received.", m.Responses.Load())
	c("forwarded_total", "SIP requests forwarded.", m.Forwarded.Load())
	c("new_work_total", "New-work attempts forwarded to backends.", m.NewWork.Load())
	c("affinity_total", "In-dialog requests routed by a valid token.", m.Affinity.Load())
	c("affinity_removed_total", "In-dialog requests routed by a valid token to a backend removed by a reload.", m.AffinityGone.Load())
	c("callid_fallback_total", "In-dialog requests without our Route, routed by Call-ID hash.", m.CallIDFallback.Load())
	c("dialog_routed_total", "In-dialog requests without our Route, routed by the dialog table.", m.DialogRouted.Load())
	c("dialog_misses_total", "In-dialog requests without our Route not found in the dialog table.", m.DialogMisses.Load())
	c("dialog_full_total", "Dialogs not recorded because the dialog table was full.", m.DialogsFull.Load())
	c("relayed_total", "SIP responses relayed.", m.Relayed.Load())
	fmt.Fprintf(w, "# HELP sluice_sip_refused_total New work refused with 503 by the balancer.\n# TYPE sluice_sip_refused_total counter\n")
	for r := range m.RefusedBy {
		name := admission.Reason(r).String()
		if name == "" {
			name = "no_backend"
		}
		fmt.Fprintf(w, "sluice_sip_refused_total{reason=%q} %d\n", name, m.RefusedBy[r].Load())
	}
	c("delayed_total", "New work held in an ARM delay queue.", m.Delayed.Load())
	c("failovers_total", "New work moved to another backend.", m.Failovers.Load())
	c("all_failed_total", "New work answered 500 because every backend failed.", m.AllFailed.Load())
	c("timeouts_total", "Attempts without an answer in time.", m.Timeouts.Load())
	c("terminated_total", "New work ended in memory state Critical.", m.Terminated.Load())
	c("backend_503_total", "503 answers from backends (absorbed).", m.Backend503.Load())
	c("forged_tokens_total", "In-dialog requests with an invalid token.", m.ForgedTokens.Load())
	c("too_many_hops_total", "483 answers.", m.TooManyHops.Load())
	c("malformed_total", "Malformed messages.", m.Malformed.Load())
	c("bad_requests_total", "400 answers.", m.BadRequests.Load())
	c("malformed_dropped_total", "Malformed messages dropped unanswered.", m.MalformedDropped.Load())
	c("oversize_total", "Oversize datagrams.", m.Oversize.Load())
	c("stray_responses_total", "Responses not for us.", m.StrayResponses.Load())
	c("send_errors_total", "Failed writes.", m.SendErrors.Load())
	c("tcp_refused_total", "TCP connections refused over -sip-tcp-max-conns.", m.TCPRefused.Load())
	c("tcp_slow_closed_total", "TCP connections closed because a message was not complete within -sip-tcp-message-timeout.", m.TCPSlow.Load())
	c("tcp_stalled_closed_total", "TCP connections closed because the peer did not read what was sent to it.", m.TCPStalled.Load())
	c("pings_failed_total", "Unanswered OPTIONS health pings.", m.PingsFailed.Load())
	fmt.Fprintf(w, "# HELP sluice_sip_transactions Live new-work transactions.\n# TYPE sluice_sip_transactions gauge\nsluice_sip_transactions %d\n", s.txns.Len())
	fmt.Fprintf(w, "# HELP sluice_sip_dialogs Entries of the dialog table.\n# TYPE sluice_sip_dialogs gauge\nsluice_sip_dialogs %d\n", s.dialogs.Len())
	fmt.Fprintf(w, "# HELP sluice_sip_dialogs_bytes Heap of the dialog table (entries times the measured entry size).\n# TYPE sluice_sip_dialogs_bytes gauge\nsluice_sip_dialogs_bytes %d\n", s.dialogs.Bytes())
	fmt.Fprintf(w, "# HELP sluice_sip_tcp_connections Open TCP connections.\n# TYPE sluice_sip_tcp_connections gauge\nsluice_sip_tcp_connections %d\n", s.tcp.len())
	fmt.Fprintf(w, "# HELP sluice_sip_backend_up Backend health (1 up).\n# TYPE sluice_sip_backend_up gauge\n")
	for _, b := range s.Backends() {
		up := 0
		if b.Up {
			up = 1
		}
		fmt.Fprintf(w, "sluice_sip_backend_up{backend=%q} %d\n", b.ID, up)
	}
}
