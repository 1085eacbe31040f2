package sip

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/proxyproto"
)

// Metrics are the SIP front end's counters, all monotonic since start.
// Fields are atomics: read them with Load; do not copy a Metrics.
type Metrics struct {
	Requests  atomic.Uint64 // parsed requests received
	Responses atomic.Uint64 // parsed responses received

	Forwarded      atomic.Uint64 // requests sent upstream or downstream
	NewWork        atomic.Uint64 // new work forwarded (attempts, failovers included)
	Affinity       atomic.Uint64 // in-dialog requests routed by a valid token
	AffinityGone   atomic.Uint64 // of those, to a backend a reload removed
	CallIDFallback atomic.Uint64 // in-dialog requests without our Route, routed by Call-ID hash
	DialogRouted   atomic.Uint64 // in-dialog requests without our Route, routed by the dialog table
	DialogMisses   atomic.Uint64 // in-dialog requests without our Route not in the dialog table
	DialogsFull    atomic.Uint64 // INVITEs not recorded in the dialog table: it was full
	// DialogStoreDropped counts dialog table changes not written to the
	// store: more were waiting than its queue holds (SetDialogStore).
	DialogStoreDropped atomic.Uint64
	// DialogStoreHeld counts dialog-establishing 2xx relayed after their
	// dialog's record was handed to the store (DialogCommitter), and
	// DialogStoreUnsafe those of them relayed although the store could not
	// take the record at once (down, or its socket full).
	DialogStoreHeld, DialogStoreUnsafe atomic.Uint64
	// DialogsLearned counts dialogs recorded from a 2xx to an INVITE
	// relayed without its transaction (learnDialog).
	DialogsLearned atomic.Uint64
	// OwnDrops counts datagrams the kernel dropped at the UDP socket's
	// receive queue (owndrops.go); TimeoutsOwnDrops the timeouts not
	// charged to a backend because of them.
	OwnDrops, TimeoutsOwnDrops atomic.Uint64
	// DialogsRestored counts dialogs RestoreDialogs put back in the table
	// (at start, from the store).
	DialogsRestored atomic.Uint64
	// DialogReplaceRefused counts initial INVITEs not recorded in the
	// dialog table: their Call-ID and From-tag name a confirmed dialog, or
	// one whose INVITE came from another source, which keeps its backend.
	DialogReplaceRefused atomic.Uint64
	Relayed              atomic.Uint64 // responses relayed
	FastPath             atomic.Uint64 // messages relayed without sipgo's parse (fastresp.go, fastreq.go)
	TokenRedraws         atomic.Uint64 // Record-Route tokens drawn again: they spelled "CSeq" (see routeToken)
	// EarlierAttemptAnswered counts INVITEs answered 2xx by a backend that
	// silence had made us move away from (earlierAttemptAnsweredLocked).
	EarlierAttemptAnswered atomic.Uint64

	NoRoute       atomic.Uint64 // new work no route matched, without a pool "default" (Config.NoRouteCode)
	URITooLong    atomic.Uint64 // requests answered 414: a Request-URI user too long to route (lb.MaxRouteValueLen)
	DefaultRouted atomic.Uint64 // new work no route matched, sent to the pool "default"

	Refused   atomic.Uint64                       // new work refused by the balancer (503)
	RefusedBy [admission.NumReasons]atomic.Uint64 // by admission.Reason (none, memory, arm, mop, draining)
	Delayed   atomic.Uint64                       // new work held in an ARM delay queue
	Failovers atomic.Uint64                       // new work moved to another backend
	AllFailed atomic.Uint64                       // new work answered 500: every backend failed
	Timeouts  atomic.Uint64                       // attempts that got no answer in time
	Aborted   atomic.Uint64                       // new work ended with 503 in memory state Critical (HTTP: aborted too)

	Backend503   atomic.Uint64 // 503 answers from backends (absorbed, never relayed)
	ForgedTokens atomic.Uint64 // in-dialog requests with our Route and a bad token (403)
	TooManyHops  atomic.Uint64 // 483 answers
	Backoffs     atomic.Uint64 // backends kept from new work by a 503 (answer or health ping), extensions included

	ForgedResponses atomic.Uint64 // responses with our Via whose branch was not made for where they came from (dropped)
	Loops           atomic.Uint64 // requests that came back to us (482), health pings from ourselves or our backends included
	UnknownCancels  atomic.Uint64 // CANCELs without a transaction of the same source (481)
	TooLarge        atomic.Uint64 // 513 answers: a request too large for -sip-max-message or, with our Via, for a datagram

	Malformed        atomic.Uint64 // unparsable or invalid messages
	BadRequests      atomic.Uint64 // 400 answers
	MalformedDropped atomic.Uint64 // malformed messages that could not be answered
	Oversize         atomic.Uint64 // datagrams over -sip-max-message or too big to send
	StrayResponses   atomic.Uint64 // responses whose top Via is not ours

	LocalReplies atomic.Uint64 // responses the balancer generated
	// LocalRepliesShed counts answers of our own not sent to a UDP
	// source: over its share (localReplySourceRate) or larger than its
	// request (replyLocal).
	LocalRepliesShed atomic.Uint64
	OptionsAnswered  atomic.Uint64 // OPTIONS to the balancer answered 200
	AbsorbedACKs     atomic.Uint64 // ACKs of our own final answers
	Retransmissions  atomic.Uint64 // client retransmissions absorbed
	Retransmitted    atomic.Uint64 // our retransmissions to UDP backends

	SendErrors atomic.Uint64 // failed writes
	TCPRefused atomic.Uint64 // TCP connections closed at once: -sip-tcp-max-conns reached, no idle one to close instead
	TCPSlow    atomic.Uint64 // TCP connections closed: message not complete within -sip-tcp-message-timeout
	TCPStalled atomic.Uint64 // TCP connections closed: peer did not read what we sent
	Panics     atomic.Uint64 // recovered handler panics (bugs)

	PingsSent   atomic.Uint64 // OPTIONS health pings
	PingsFailed atomic.Uint64 // pings without an answer in time

	InDialogUnanswered  atomic.Uint64 // in-dialog requests answered 408: their backend did not answer in -sip-in-dialog-timeout
	InDialogBackendDown atomic.Uint64 // in-dialog requests answered 480: their backend is down

	UnknownDialogMetered       atomic.Uint64 // requests of unknown dialogs sent to admission as new work (-sip-unknown-dialog new-work)
	UnknownDialogRejected      atomic.Uint64 // requests of unknown dialogs answered 481 or dropped (reject)
	UnknownDialogSourceLimited atomic.Uint64 // requests of unknown dialogs over their source's share (503)
	// ProxyRejected counts TCP and TLS connections closed for their PROXY
	// protocol header, by reason (proxyin.go).
	ProxyRejected proxyproto.Rejected
	// TCP exhaustion guards (tcpguard.go)
	TCPRefusedSource   atomic.Uint64 // TCP connections over -sip-tcp-max-conns-per-source
	TCPEvicted         atomic.Uint64 // idle TCP connections closed to make room for a new one
	TCPFirstMessage    atomic.Uint64 // TCP connections closed: no complete message within -sip-tcp-first-message-timeout
	TCPPartialShed     atomic.Uint64 // TCP connections closed: -sip-tcp-partial-budget exceeded
	TCPKeepAlives      atomic.Uint64 // CRLFCRLF keep-alives received on TCP
	TCPKeepAliveWrites atomic.Uint64 // writes of their answers (those of one read go in one)
	// Client flows (flows.go, flowroute.go)
	FlowRouted   atomic.Uint64 // requests from backends sent over a client flow (Route, Path or Contact alias)
	FlowFailed   atomic.Uint64 // requests for a client flow that is gone (430)
	ForgedFlows  atomic.Uint64 // requests from backends with a forged or invalid flow token or Contact alias (403)
	SipsRefused  atomic.Uint64 // sips: requests not forwarded over UDP or TCP (480)
	FlowPaths    atomic.Uint64 // Path headers added to REGISTERs from client flows
	ContactAlias atomic.Uint64 // Contacts rewritten to a signed alias (-sip-contact-alias)

	// TLS and WebSocket listeners (stream.go, ws.go)
	HandshakesRefused atomic.Uint64 // connections closed before a handshake: Config.Handshakes said no
	HandshakeTimeouts atomic.Uint64 // TLS/WebSocket handshakes not complete within -tls-handshake-timeout
	HandshakeFailures atomic.Uint64 // TLS/WebSocket handshakes failed otherwise (bad TLS, refused upgrade, closed)
	WSRefused         atomic.Uint64 // WebSocket upgrades refused (no sip subprotocol, Origin, path, malformed)
	WSTooBig          atomic.Uint64 // WebSocket connections closed 1009: a message over -sip-max-message
	WSProtocolErrors  atomic.Uint64 // WebSocket connections closed 1002: a frame RFC 6455 forbids
	// BackendTLSFailures counts TLS handshakes with transport=tls backends
	// that failed (certificate not valid for its name or not from its ca=,
	// no TLS there, timeout).
	BackendTLSFailures atomic.Uint64
	// BackendProxyConnsRefused counts requests refused 503 because their
	// PROXY-protocol backend, or their client's address, had every
	// per-client connection it may have (proxyout.go).
	BackendProxyConnsRefused atomic.Uint64
}

// Metrics returns the server's counters.
func (s *Server) Metrics() *Metrics { return &s.metrics }

// BackendStatus is a point-in-time view of one backend.
type BackendStatus struct {
	ID        string
	Addr      string
	Transport string
	Pools     []string // the pools it is a member of

	Weight      int
	Up          bool  // not down (health checks, passive ejection)
	Draining    bool  // up but taking no new work (503 Retry-After, operator drain)
	Outstanding int64 // new-work transactions waiting for a final answer
	Requests    uint64
	Failures    uint64
}

// Pool returns the pool "default" of the generation in force (else its
// first pool), nil before one: with backends from Config.Backends or
// SetBackends, every backend. Generation gives every pool.
// SetGeneration replaces it: call Pool again rather than keeping it.
func (s *Server) Pool() *lb.Pool {
	if set := s.pool.Load(); set != nil {
		return set.homePool
	}
	return nil
}

// Backends returns the state of every backend.
func (s *Server) Backends() []BackendStatus {
	now := s.clock.Now()
	p := s.pool.Load()
	out := make([]BackendStatus, 0, len(p.list))
	for _, b := range p.list {
		st := b.lb.Status(now)
		out = append(out, BackendStatus{
			ID: b.id, Addr: b.addr.String(), Transport: b.transport(), Pools: b.spec.Pools, Weight: b.lb.Weight(),
			Up: st.State != lb.Down, Draining: st.State == lb.Draining,
			Outstanding: st.Outstanding, Requests: st.Requests, Failures: st.Failures,
		})
	}
	return out
}

// eventsHelp is the help of sluice_frontend_events_total. Every front end
// writes the same text: Prometheus requires one help per family.
const eventsHelp = "Front end events, by protocol and event (the front end's README lists its events)."

var (
	descEvents       = prometheus.NewDesc("sluice_frontend_events_total", eventsHelp, []string{"event"}, prometheus.Labels{"protocol": "sip"})
	descTransactions = prometheus.NewDesc("sluice_frontend_transactions", "Live new-work transactions of the front end.", nil, prometheus.Labels{"protocol": "sip"})
	descConnections  = prometheus.NewDesc("sluice_frontend_connections", "Open client connections of the front end.", []string{"transport"}, prometheus.Labels{"protocol": "sip"})
	descDialogs      = prometheus.NewDesc("sluice_frontend_dialogs", "Entries of the front end's dialog table.", nil, prometheus.Labels{"protocol": "sip"})
	descDialogBytes  = prometheus.NewDesc("sluice_frontend_dialogs_bytes", "Heap of the front end's dialog table (entries times the measured entry size).", nil, prometheus.Labels{"protocol": "sip"})
	descReadBuffers  = prometheus.NewDesc("sluice_frontend_read_buffers", "Client connections holding a read buffer (one waiting between messages holds none).", []string{"transport"}, prometheus.Labels{"protocol": "sip"})
	descRouteHits    = prometheus.NewDesc("sluice_sip_route_hits_total", "SIP new work each route chose, by route (its canonical spec, e.g. pool=london,user=+4420; \"default\": no route matched and the pool default took it) and pool; a route that stays across a route change keeps its count.", []string{"route", "pool"}, nil)
	descNoRoute      = prometheus.NewDesc("sluice_sip_no_route_total", "SIP new work no route matched, answered -sip-no-route-code (404): there is no pool default.", nil, nil)
	descPoolRefused  = prometheus.NewDesc("sluice_sip_pool_refused_total", "SIP new work the front end refused, by the pool it was routed to and why: memory, arm, mop, draining (admission's guards) or no_backend (no backend of the pool took it).", []string{"pool", "reason"}, nil)
	descPoolSent     = prometheus.NewDesc("sluice_sip_pool_new_work_total", "SIP new work sent to a backend (attempts and failovers included), by pool and backend.", []string{"pool", "backend"}, nil)
	descPartialBytes = prometheus.NewDesc("sluice_frontend_partial_bytes", "Bytes buffered for client messages not yet complete (TCP), at most -sip-tcp-partial-budget.", []string{"transport"}, prometheus.Labels{"protocol": "sip"})
)

// descProxyConns is the gauge of the per-client connections to backends
// with proxy= (proxyout.go).
var descProxyConns = prometheus.NewDesc("sluice_frontend_backend_proxy_connections", "Connections to backends with proxy=v1|v2 opened for one client each (open or opening), at most 4096 per backend.", nil, prometheus.Labels{"protocol": "sip"})

var descProxyRejected = prometheus.NewDesc(proxyproto.MetricName, proxyproto.MetricHelp, []string{"reason"}, prometheus.Labels{"protocol": "sip"})

// Collector returns the front end's counters as a prometheus.Collector:
// sluice_frontend_events_total{protocol="sip",event} (one event per
// Metrics field, named as in the README), sluice_frontend_transactions,
// sluice_frontend_connections{transport}, sluice_frontend_dialogs and
// sluice_frontend_dialogs_bytes, and
// sluice_proxy_protocol_rejected_total{protocol="sip",reason}. It reads the counters at
// scrape time and adds nothing to the message path.
func (s *Server) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Server }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descEvents
	ch <- descTransactions
	ch <- descConnections
	ch <- descDialogs
	ch <- descDialogBytes
	ch <- descPartialBytes
	ch <- descReadBuffers
	ch <- descProxyRejected
	ch <- descProxyConns
	ch <- descRouteHits
	ch <- descNoRoute
	ch <- descPoolRefused
	ch <- descPoolSent
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := &c.s.metrics
	for _, e := range []struct {
		name string
		v    *atomic.Uint64
	}{
		{"requests", &m.Requests}, {"responses", &m.Responses}, {"forwarded", &m.Forwarded},
		{"new_work", &m.NewWork}, {"affinity", &m.Affinity}, {"affinity_removed", &m.AffinityGone},
		{"callid_fallback", &m.CallIDFallback}, {"dialog_routed", &m.DialogRouted}, {"dialog_misses", &m.DialogMisses},
		{"dialog_full", &m.DialogsFull}, {"dialog_store_dropped", &m.DialogStoreDropped}, {"dialog_store_held", &m.DialogStoreHeld}, {"dialog_store_unsafe", &m.DialogStoreUnsafe}, {"dialogs_learned", &m.DialogsLearned}, {"dialog_replace_refused", &m.DialogReplaceRefused}, {"relayed", &m.Relayed}, {"fast_path", &m.FastPath}, {"token_redraws", &m.TokenRedraws}, {"earlier_attempt_answered", &m.EarlierAttemptAnswered}, {"refused", &m.Refused},
		{"delayed", &m.Delayed}, {"failovers", &m.Failovers}, {"all_failed", &m.AllFailed},
		{"timeouts", &m.Timeouts}, {"aborted", &m.Aborted}, {"backend_503", &m.Backend503},
		{"backend_backoffs", &m.Backoffs}, {"forged_responses", &m.ForgedResponses}, {"loops", &m.Loops},
		{"unknown_cancels", &m.UnknownCancels}, {"too_large", &m.TooLarge},
		{"forged_tokens", &m.ForgedTokens}, {"too_many_hops", &m.TooManyHops}, {"malformed", &m.Malformed},
		{"bad_requests", &m.BadRequests}, {"malformed_dropped", &m.MalformedDropped}, {"oversize", &m.Oversize},
		{"stray_responses", &m.StrayResponses}, {"local_replies", &m.LocalReplies}, {"local_replies_shed", &m.LocalRepliesShed},
		{"options_answered", &m.OptionsAnswered}, {"absorbed_acks", &m.AbsorbedACKs},
		{"retransmissions", &m.Retransmissions}, {"retransmitted", &m.Retransmitted},
		{"send_errors", &m.SendErrors}, {"tcp_refused", &m.TCPRefused},
		{"tcp_refused_source", &m.TCPRefusedSource}, {"tcp_evicted", &m.TCPEvicted},
		{"tcp_first_message_closed", &m.TCPFirstMessage}, {"tcp_partial_shed", &m.TCPPartialShed},
		{"tcp_keepalives", &m.TCPKeepAlives}, {"tcp_keepalive_writes", &m.TCPKeepAliveWrites},
		{"tcp_slow_closed", &m.TCPSlow}, {"tcp_stalled_closed", &m.TCPStalled}, {"panics", &m.Panics},
		{"pings_sent", &m.PingsSent}, {"pings_failed", &m.PingsFailed},
		{"in_dialog_unanswered", &m.InDialogUnanswered}, {"in_dialog_backend_down", &m.InDialogBackendDown},
		{"unknown_dialog_metered", &m.UnknownDialogMetered}, {"unknown_dialog_rejected", &m.UnknownDialogRejected},
		{"unknown_dialog_source_limited", &m.UnknownDialogSourceLimited}, {"no_route", &m.NoRoute},
		{"uri_too_long", &m.URITooLong},
		{"flow_routed", &m.FlowRouted}, {"flow_failed", &m.FlowFailed}, {"forged_flow_tokens", &m.ForgedFlows},
		{"sips_refused", &m.SipsRefused}, {"flow_paths", &m.FlowPaths}, {"contact_aliases", &m.ContactAlias},
		{"handshakes_refused", &m.HandshakesRefused}, {"handshake_timeouts", &m.HandshakeTimeouts},
		{"handshake_failures", &m.HandshakeFailures}, {"ws_refused", &m.WSRefused},
		{"ws_too_big", &m.WSTooBig}, {"ws_protocol_errors", &m.WSProtocolErrors},
		{"backend_tls_failures", &m.BackendTLSFailures},
		{"backend_proxy_conns_refused", &m.BackendProxyConnsRefused},
		{"udp_own_drops", &m.OwnDrops}, {"timeouts_own_drops", &m.TimeoutsOwnDrops},
	} {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(e.v.Load()), e.name)
	}
	for r := range m.RefusedBy {
		name := admission.Reason(r).String()
		if name == "" {
			name = "no_backend"
		}
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(m.RefusedBy[r].Load()), "refused_"+name)
	}
	m.ProxyRejected.Each(func(reason string, n uint64) {
		ch <- prometheus.MustNewConstMetric(descProxyRejected, prometheus.CounterValue, float64(n), reason)
	})
	ch <- prometheus.MustNewConstMetric(descTransactions, prometheus.GaugeValue, float64(c.s.txns.Len()))
	for k := kindTCP; k <= kindWSS; k++ {
		ch <- prometheus.MustNewConstMetric(descConnections, prometheus.GaugeValue, float64(c.s.tcp.byKind[k].Load()), strings.ToLower(k.String()))
	}
	ch <- prometheus.MustNewConstMetric(descDialogs, prometheus.GaugeValue, float64(c.s.dialogs.Len()))
	ch <- prometheus.MustNewConstMetric(descDialogBytes, prometheus.GaugeValue, float64(c.s.dialogs.Bytes()))
	ch <- prometheus.MustNewConstMetric(descPartialBytes, prometheus.GaugeValue, float64(c.s.tcp.budget.held()), "tcp")
	ch <- prometheus.MustNewConstMetric(descReadBuffers, prometheus.GaugeValue, float64(c.s.tcp.readBufs.Load()), "tcp")
	ch <- prometheus.MustNewConstMetric(descNoRoute, prometheus.CounterValue, float64(m.NoRoute.Load()))
	ch <- prometheus.MustNewConstMetric(descProxyConns, prometheus.GaugeValue, float64(c.s.proxied.len()))
	set := c.s.pool.Load()
	if set == nil {
		return
	}
	for _, r := range set.routes.HitsBySpec() {
		ch <- prometheus.MustNewConstMetric(descRouteHits, prometheus.CounterValue, float64(r.Hits), r.Spec, r.Pool)
	}
	if set.gen.Pool(lb.DefaultPool) != nil {
		ch <- prometheus.MustNewConstMetric(descRouteHits, prometheus.CounterValue, float64(m.DefaultRouted.Load()), "default", lb.DefaultPool)
	}
	for name, st := range set.stats {
		for r := range st.refused {
			reason := admission.Reason(r).String()
			if reason == "" {
				reason = "no_backend"
			}
			ch <- prometheus.MustNewConstMetric(descPoolRefused, prometheus.CounterValue, float64(st.refused[r].Load()), name, reason)
		}
	}
	for k, n := range set.sent {
		ch <- prometheus.MustNewConstMetric(descPoolSent, prometheus.CounterValue, float64(n.Load()), k.pool, k.id)
	}
}
