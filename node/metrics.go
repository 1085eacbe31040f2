package node

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/persist"
)

// metricsSources are what /metrics reads at scrape time. Everything is
// read from counters the request paths keep anyway; a scrape adds nothing to
// them. Any field may be nil.
type metricsSources struct {
	ctrl     *admission.Controller
	mem      *admission.Memory
	backends func() []admin.BackendStatus
	// forward holds the forwarding latency histograms, observed by the
	// front ends.
	forward *prometheus.HistogramVec
	// store is the data directory.
	store *persist.Store
	// fronts are the front ends' own collectors.
	fronts []prometheus.Collector
}

// newForwardHistogram is sluice_forward_duration_seconds{protocol}: from a
// request's arrival to its backend's answer being relayed.
func newForwardHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_forward_duration_seconds",
		Help:    "Time from a request's arrival to the relay of its backend's answer (HTTP: whole exchange; SIP: new work to its final answer).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"protocol"})
}

var (
	descAdmitted     = prometheus.NewDesc("sluice_requests_admitted_total", "Requests admitted by the balancer, by protocol and class (new work or affinity).", []string{"protocol", "class"}, nil)
	descRefused      = prometheus.NewDesc("sluice_requests_refused_total", "New work refused by the balancer, by protocol and the guard that refused it.", []string{"protocol", "reason"}, nil)
	descMemState     = prometheus.NewDesc("sluice_memory_state", "Node memory state: 0 normal, 1 low, 2 lower, 3 critical.", nil, nil)
	descMemUsed      = prometheus.NewDesc("sluice_memory_used_bytes", "Memory the Go runtime holds in use (free heap excluded, collected first when at or above -mem-low), last sample.", nil, nil)
	descMemLimit     = prometheus.NewDesc("sluice_memory_limit_bytes", "Memory limit of the node memory states (0: states off).", nil, nil)
	descARMRate      = prometheus.NewDesc("sluice_arm_rate", "ARM rule arrival rate: admissions in the current six sub-intervals.", []string{"rule"}, nil)
	descARMLimit     = prometheus.NewDesc("sluice_arm_limit", "ARM rule limit per unit.", []string{"rule", "unit"}, nil)
	descARMQueued    = prometheus.NewDesc("sluice_arm_queued", "Requests waiting in the ARM rule's delay queue.", []string{"rule"}, nil)
	descARMDelayed   = prometheus.NewDesc("sluice_arm_delayed_total", "Requests the ARM rule put in its delay queue.", []string{"rule"}, nil)
	descARMRefused   = prometheus.NewDesc("sluice_arm_refused_total", "Requests the ARM rule refused.", []string{"rule"}, nil)
	descARMOver      = prometheus.NewDesc("sluice_arm_over_limit_total", "Requests admitted over the limit (action=log, or while qualifying).", []string{"rule"}, nil)
	descMOPAllowed   = prometheus.NewDesc("sluice_mop_allowed_rate", "New work per second MOP lets through to the backend now.", []string{"protocol", "backend", "pool"}, nil)
	descMOPLearned   = prometheus.NewDesc("sluice_mop_learned_rate", "Learned safe rate of new work per second (0 while discovering).", []string{"protocol", "backend", "pool"}, nil)
	descMOPPhase     = prometheus.NewDesc("sluice_mop_learned", "1 when the backend's MOP rate is learned, 0 while discovering.", []string{"protocol", "backend", "pool"}, nil)
	descMOPLifetime  = prometheus.NewDesc("sluice_mop_session_lifetime_seconds", "Session lifetime MOP estimates from the backend's memory (quantile 0.5 and 0.95); absent while nothing is estimated.", []string{"protocol", "backend", "pool", "quantile"}, nil)
	descMOPBytes     = prometheus.NewDesc("sluice_mop_session_bytes", "Bytes one session holds on the backend, as MOP estimates them; absent while nothing is estimated.", []string{"protocol", "backend", "pool"}, nil)
	descMOPPredicted = prometheus.NewDesc("sluice_mop_predicted_memory_ratio", "Backend memory (used over max) MOP predicts at the allowed rate; absent while nothing is estimated.", []string{"protocol", "backend", "pool"}, nil)
	descBEMemory     = prometheus.NewDesc("sluice_backend_memory_ratio", "Backend's used memory over its maximum, last probe; absent while the probe fails.", []string{"protocol", "backend", "pool"}, nil)
	descProbeFails   = prometheus.NewDesc("sluice_mop_probe_failures_total", "Memory probes of the backend that failed (no answer, too large, a reading that cannot be true).", []string{"protocol", "backend", "pool"}, nil)
	descBEState      = prometheus.NewDesc("sluice_backend_state", "Backend state: 1 for the current one of up, down, draining, unknown.", []string{"protocol", "backend", "pool", "state"}, nil)
	descBEOut        = prometheus.NewDesc("sluice_backend_outstanding", "Requests sent to the backend and not yet answered.", []string{"protocol", "backend", "pool"}, nil)
	descStoreOK      = prometheus.NewDesc("sluice_persist_healthy", "1 while the data directory takes writes, 0 while saving learned rates or events fails (they wait in memory and are retried).", nil, nil)
	descStoreErrors  = prometheus.NewDesc("sluice_persist_write_errors_total", "Failed writes to the data directory (each retry counts).", nil, nil)
	descStorePending = prometheus.NewDesc("sluice_persist_events_pending", "Events waiting in memory for the data directory to take them.", nil, nil)
	descStoreDropped = prometheus.NewDesc("sluice_persist_events_dropped_total", "Events not stored: queue or in-memory backlog full.", nil, nil)
	descStoreChild   = prometheus.NewDesc("sluice_persist_child_restarts_total", "Deaths of the store process (Badger's; SIGBUS on a full disk, killed, exited), each followed by a restart with backoff.", nil, nil)
	descStoreQDrop   = prometheus.NewDesc("sluice_persist_queue_dropped_total", "History samples and dialog records not stored: the queue to the store process was full.", nil, nil)
)

// collector turns metricsSources into Prometheus metrics on each scrape.
type collector struct{ src metricsSources }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAdmitted, descRefused, descMemState, descMemUsed, descMemLimit,
		descARMRate, descARMLimit, descARMQueued, descARMDelayed, descARMRefused, descARMOver,
		descMOPAllowed, descMOPLearned, descMOPPhase, descMOPLifetime, descMOPBytes, descMOPPredicted, descBEMemory, descProbeFails, descBEState, descBEOut,
		descStoreOK, descStoreErrors, descStorePending, descStoreDropped, descStoreChild, descStoreQDrop} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if ctrl := c.src.ctrl; ctrl != nil {
		counts := ctrl.Counts()
		for p, proto := range admission.ProtoNames {
			for cl, class := range admission.ClassNames {
				counter(descAdmitted, float64(counts.Admitted[p][cl]), proto, class)
			}
			for r, reason := range admission.ReasonNames {
				if reason != "" {
					counter(descRefused, float64(counts.Refused[p][r]), proto, reason)
				}
			}
		}
		for _, m := range ctrl.Rules() {
			st := m.Status()
			gauge(descARMRate, float64(st.Rate), st.Name)
			gauge(descARMLimit, float64(st.Limit), st.Name, unitLabel(st.Unit))
			gauge(descARMQueued, float64(st.Queued), st.Name)
			counter(descARMDelayed, float64(st.Delayed), st.Name)
			counter(descARMRefused, float64(st.Refused), st.Name)
			counter(descARMOver, float64(st.Over), st.Name)
		}
	}
	if s := c.src.store; s != nil {
		h := s.Health()
		ok := 0.0
		if h.Healthy {
			ok = 1
		}
		gauge(descStoreOK, ok)
		counter(descStoreErrors, float64(h.SaveErrors))
		gauge(descStorePending, float64(h.EventsPending))
		counter(descStoreDropped, float64(h.EventsDropped))
		counter(descStoreChild, float64(h.ChildRestarts))
		counter(descStoreQDrop, float64(h.QueueDropped))
	}
	if mem := c.src.mem; mem != nil {
		used, limit := mem.Usage()
		gauge(descMemState, float64(mem.State()))
		gauge(descMemUsed, float64(used))
		gauge(descMemLimit, float64(limit))
	}
	if c.src.backends != nil {
		for _, b := range c.src.backends() {
			// pool: the backend's pools, comma-separated (one series per
			// backend, so a backend in two pools is not counted twice).
			pool := strings.Join(b.Pools, ",")
			for _, s := range []string{"up", "down", "draining", "unknown"} {
				v := 0.0
				if b.State == s {
					v = 1
				}
				gauge(descBEState, v, b.Protocol, b.ID, pool, s)
			}
			gauge(descBEOut, float64(b.Outstanding), b.Protocol, b.ID, pool)
			if !b.MOP.Enabled {
				continue
			}
			gauge(descMOPAllowed, b.MOP.AllowedRate, b.Protocol, b.ID, pool)
			gauge(descMOPLearned, b.MOP.LearnedRate, b.Protocol, b.ID, pool)
			learned := 0.0
			if b.MOP.Phase == admission.Learned.String() {
				learned = 1
			}
			gauge(descMOPPhase, learned, b.Protocol, b.ID, pool)
			if b.MOP.BytesPerSession > 0 {
				gauge(descMOPLifetime, b.MOP.LifetimeSeconds, b.Protocol, b.ID, pool, "0.5")
				gauge(descMOPLifetime, b.MOP.LifetimeHighSeconds, b.Protocol, b.ID, pool, "0.95")
				gauge(descMOPBytes, b.MOP.BytesPerSession, b.Protocol, b.ID, pool)
				gauge(descMOPPredicted, b.MOP.PredictedMemoryPercent/100, b.Protocol, b.ID, pool)
			}
			counter(descProbeFails, float64(b.MOP.ProbeFailures), b.Protocol, b.ID, pool)
			if b.MOP.MemoryKnown {
				gauge(descBEMemory, b.MOP.MemoryPercent/100, b.Protocol, b.ID, pool)
			}
		}
	}
}

func unitLabel(d time.Duration) string {
	switch d {
	case time.Second:
		return "second"
	case time.Minute:
		return "minute"
	case time.Hour:
		return "hour"
	}
	return d.String()
}

// metricsHandler serves /metrics through promhttp: our families, the
// front ends' and the Go runtime's and process's, from a registry of
// their own.
func metricsHandler(src metricsSources) (http.Handler, error) {
	reg := prometheus.NewRegistry()
	cs := []prometheus.Collector{collector{src}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})}
	if src.forward != nil {
		cs = append(cs, src.forward)
	}
	for _, c := range append(cs, src.fronts...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// mountMetrics adds /metrics to the admin listener.
func (n *Node) mountMetrics() error {
	if n.admin == nil {
		return nil
	}
	src := metricsSources{ctrl: n.ctrl, mem: n.mem, backends: n.backendStatus, forward: n.forward, store: n.store}
	src.fronts = append(src.fronts, poolPanic{n}, tlsCollector{n}, dnsCollector{n})
	if n.httpSrv != nil {
		src.fronts = append(src.fronts, n.httpSrv.Collector())
	}
	if n.sipSrv != nil {
		src.fronts = append(src.fronts, n.sipSrv.Collector())
	}
	if n.cluster != nil {
		src.fronts = append(src.fronts, n.cluster)
	}
	if n.alog != nil {
		src.fronts = append(src.fronts, accessLogCollector{n.alog})
	}
	if n.tracer != nil {
		src.fronts = append(src.fronts, n.tracer.Collector())
	}
	src.fronts = append(src.fronts, n.admin.Collector())
	h, err := metricsHandler(src)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	n.admin.Handle("GET /metrics", h)
	return nil
}
