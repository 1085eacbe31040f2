package tracing

import "github.com/prometheus/client_golang/prometheus"

var descSpans = prometheus.NewDesc("sluice_trace_spans_total",
	"Spans of requests and SIP transactions by what became of them: queued for export, unsampled, dropped (queue full), exported, failed (the export request failed).",
	[]string{"result"}, nil)

// Collector returns the exporter's counters as Prometheus metrics
// (sluice_trace_spans_total{result}), read at scrape time.
func (e *Exporter) Collector() prometheus.Collector { return collector{e} }

type collector struct{ e *Exporter }

func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- descSpans }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	st := c.e.Stats()
	for _, v := range []struct {
		n string
		v uint64
	}{{"queued", st.Queued}, {"unsampled", st.Unsampled}, {"dropped", st.Dropped}, {"exported", st.Exported}, {"failed", st.Failed}} {
		ch <- prometheus.MustNewConstMetric(descSpans, prometheus.CounterValue, float64(v.v), v.n)
	}
}
