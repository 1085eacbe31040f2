package http

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/proxyproto"
)

// eventsHelp is the help of sluice_frontend_events_total. Every front end
// writes the same text: Prometheus requires one help per family.
const eventsHelp = "Front end events, by protocol and event (the front end's README lists its events)."

var (
	descEvents         = prometheus.NewDesc("sluice_frontend_events_total", eventsHelp, []string{"event"}, prometheus.Labels{"protocol": "http"})
	descRouteHits      = prometheus.NewDesc("sluice_http_route_hits_total", "Requests that matched the HTTP route (labelled by its canonical spec, e.g. pool=api,path=/api/, so a label keeps its meaning when routes are added or removed) and the pool it sends them to; a route that stays across a route change keeps its count.", []string{"route", "pool"}, nil)
	descNoRoute        = prometheus.NewDesc("sluice_http_no_route_total", "HTTP requests answered 404: no route took them and there is no default pool.", nil, nil)
	descTunnels        = prometheus.NewDesc("sluice_http_tunnels", "HTTP upgraded connections (WebSocket tunnels) by state: open (the backend answered 101), pending (upgrade request sent, its answer not in yet). Both count against -http-max-tunnels.", []string{"state"}, nil)
	descURingLoops     = prometheus.NewDesc("sluice_http_io_uring_loops", "Event loops of the loop engine that batch their plain socket reads and writes on an io_uring now (-http-io-uring); 0: none does (the option off, the kernel refused it, or io_uring_enter failed).", nil, nil)
	descURingOps       = prometheus.NewDesc("sluice_http_io_uring_ops_total", "Socket operations the loop engine made through its io_uring rings, by op (send, recv).", []string{"op"}, nil)
	descTunnelsTotal   = prometheus.NewDesc("sluice_http_tunnels_total", "HTTP tunnels opened (the backend answered 101 with the Upgrade asked for).", nil, nil)
	descTunnelsRefused = prometheus.NewDesc("sluice_http_tunnels_refused_total", "HTTP upgrade requests answered 503 at -http-max-tunnels, before any backend was contacted.", nil, nil)
	descProxyRejected  = prometheus.NewDesc(proxyproto.MetricName, proxyproto.MetricHelp, []string{"reason"}, prometheus.Labels{"protocol": "http"})
	descPoolRefuse     = prometheus.NewDesc("sluice_http_pool_refused_total", "HTTP requests the front end refused, by the pool they were routed to and why: memory, arm, mop, draining (admission's guards, or the operator drained the pool) or no_backend (none up in the pool).", []string{"pool", "reason"}, nil)
)

// NewCollector returns st as a prometheus.Collector (a server's
// Collector adds its routes and pools):
// sluice_frontend_events_total{protocol="http",event} with the events
// upstream_error, retried, restreamed (always 0 now), aborted, repinned,
// handed_over, bad_request, cookie_stripped, session_not_learned,
// conn_limited, source_limited, delay_abandoned, delay_limited,
// tls_handshake_refused, tls_handshake_failed and https_redirected; and
// the tunnels: sluice_http_tunnels{state="open"|"pending"},
// sluice_http_tunnels_total, sluice_http_tunnels_refused_total; and
// sluice_proxy_protocol_rejected_total{protocol="http",reason}.
// (Admitted and refused requests are the admission
// controller's sluice_requests_*_total.) It reads the counters at scrape
// time.
func NewCollector(st *Stats) prometheus.Collector { return collector{st: st} }

// Collector returns the front end's counters (see NewCollector), and
// those of its routes and pools: sluice_http_route_hits_total{route,pool}
// (at most lb.MaxRoutes series), sluice_http_no_route_total, and
// sluice_http_pool_refused_total{pool,reason} for the pools in use (a
// pool's counts go when a generation without it is set).
func (s *Server) Collector() prometheus.Collector { return collector{st: s.Stats(), s: s} }

type collector struct {
	st *Stats
	s  *Server // nil: the events only
}

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descEvents
	describeH2(ch)
	ch <- descTunnels
	ch <- descTunnelsTotal
	ch <- descTunnelsRefused
	ch <- descProxyRejected
	if c.s != nil {
		ch <- descURingLoops
		ch <- descURingOps
		ch <- descRouteHits
		ch <- descNoRoute
		ch <- descPoolRefuse
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.st
	for _, e := range []struct {
		name string
		v    *atomic.Uint64
	}{
		{"upstream_error", &st.UpstreamError}, {"retried", &st.Retried}, {"restreamed", &st.Restreamed},
		{"aborted", &st.Aborted}, {"repinned", &st.Repinned}, {"handed_over", &st.HandedOver},
		{"bad_request", &st.BadRequest}, {"loops", &st.Loops}, {"cookie_stripped", &st.CookieStripped},
		{"session_not_learned", &st.SessionNotLearned},
		{"conn_limited", &st.ConnLimited}, {"source_limited", &st.SourceLimited},
		{"delay_abandoned", &st.DelayAbandoned}, {"delay_limited", &st.DelayLimited},
		{"tls_handshake_refused", &st.HandshakeRefused}, {"tls_handshake_failed", &st.HandshakeFailed},
		{"https_redirected", &st.Redirected},
	} {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(e.v.Load()), e.name)
	}
	collectH2(ch, &st.H2)
	ch <- prometheus.MustNewConstMetric(descTunnels, prometheus.GaugeValue, float64(st.Tunnels.Load()), "open")
	ch <- prometheus.MustNewConstMetric(descTunnels, prometheus.GaugeValue, float64(st.TunnelsPending.Load()), "pending")
	ch <- prometheus.MustNewConstMetric(descTunnelsTotal, prometheus.CounterValue, float64(st.TunnelsTotal.Load()))
	ch <- prometheus.MustNewConstMetric(descTunnelsRefused, prometheus.CounterValue, float64(st.TunnelsRefused.Load()))
	st.ProxyRejected.Each(func(reason string, n uint64) {
		ch <- prometheus.MustNewConstMetric(descProxyRejected, prometheus.CounterValue, float64(n), reason)
	})
	if c.s == nil {
		return
	}
	if e := c.s.loops.Load(); e != nil {
		ch <- prometheus.MustNewConstMetric(descURingLoops, prometheus.GaugeValue, float64(e.ringLoops.Load()))
		ch <- prometheus.MustNewConstMetric(descURingOps, prometheus.CounterValue, float64(e.uringSends.Load()), "send")
		ch <- prometheus.MustNewConstMetric(descURingOps, prometheus.CounterValue, float64(e.uringRecvs.Load()), "recv")
	}
	ch <- prometheus.MustNewConstMetric(descNoRoute, prometheus.CounterValue, float64(st.NoRoute.Load()))
	set := c.s.backends.Load()
	for _, r := range set.routes.HitsBySpec() {
		ch <- prometheus.MustNewConstMetric(descRouteHits, prometheus.CounterValue, float64(r.Hits), r.Spec, r.Pool)
	}
	for _, p := range set.pools {
		for r := admission.Reason(1); r < admission.NumReasons; r++ {
			ch <- prometheus.MustNewConstMetric(descPoolRefuse, prometheus.CounterValue, float64(p.stats.Refused[r].Load()), p.name, r.String())
		}
		ch <- prometheus.MustNewConstMetric(descPoolRefuse, prometheus.CounterValue, float64(p.stats.NoBackend.Load()), p.name, "no_backend")
	}
}
