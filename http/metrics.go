package http

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// eventsHelp is the help of sluice_frontend_events_total. Every front end
// writes the same text: Prometheus requires one help per family.
const eventsHelp = "Front end events, by protocol and event (the front end's README lists its events)."

var descEvents = prometheus.NewDesc("sluice_frontend_events_total", eventsHelp, []string{"event"}, prometheus.Labels{"protocol": "http"})

// NewCollector returns st as a prometheus.Collector:
// sluice_frontend_events_total{protocol="http",event} with the events
// upstream_error, retried, restreamed (always 0 now), aborted, repinned,
// handed_over, bad_request, cookie_stripped, session_not_learned,
// conn_limited, source_limited, delay_abandoned and delay_limited.
// (Admitted and refused requests are the admission
// controller's sluice_requests_*_total.) It reads the counters at scrape
// time.
func NewCollector(st *Stats) prometheus.Collector { return collector{st} }

// Collector returns the front end's counters (see NewCollector).
func (s *Server) Collector() prometheus.Collector { return NewCollector(s.Stats()) }

type collector struct{ st *Stats }

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- descEvents }

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.st
	for _, e := range []struct {
		name string
		v    *atomic.Uint64
	}{
		{"upstream_error", &st.UpstreamError}, {"retried", &st.Retried}, {"restreamed", &st.Restreamed},
		{"aborted", &st.Aborted}, {"repinned", &st.Repinned}, {"handed_over", &st.HandedOver},
		{"bad_request", &st.BadRequest}, {"cookie_stripped", &st.CookieStripped},
		{"session_not_learned", &st.SessionNotLearned},
		{"conn_limited", &st.ConnLimited}, {"source_limited", &st.SourceLimited},
		{"delay_abandoned", &st.DelayAbandoned}, {"delay_limited", &st.DelayLimited},
	} {
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(e.v.Load()), e.name)
	}
}
