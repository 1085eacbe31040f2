package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/lb"
)

var (
	descPoolPanic  = prometheus.NewDesc("sluice_pool_panic", "1 while the protocol's backend pool is in panic: past -health-panic of its backends are down by their health checks alone, and new work goes to every backend not shown dead by traffic.", []string{"protocol"}, nil)
	descPoolPanics = prometheus.NewDesc("sluice_pool_panics_total", "Times the protocol's backend pool went into panic (since its backend set was last replaced).", []string{"protocol"}, nil)
)

// poolPanic reports the panic state of the HTTP and SIP pools in force.
type poolPanic struct{ n *Node }

// Describe implements prometheus.Collector.
func (c poolPanic) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPoolPanic
	ch <- descPoolPanics
}

// Collect implements prometheus.Collector.
func (c poolPanic) Collect(ch chan<- prometheus.Metric) {
	var httpPool *lb.Pool
	if c.n.httpSrv != nil {
		httpPool = c.n.httpSrv.Pool()
	}
	for _, p := range []struct {
		proto string
		pool  *lb.Pool
	}{{"http", httpPool}, {"sip", c.n.sipPool()}} {
		if p.pool == nil {
			continue
		}
		v := 0.0
		if p.pool.Panicking() {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descPoolPanic, prometheus.GaugeValue, v, p.proto)
		ch <- prometheus.MustNewConstMetric(descPoolPanics, prometheus.CounterValue, float64(p.pool.Panics()), p.proto)
	}
}
