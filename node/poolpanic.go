package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/lb"
)

var (
	descPoolPanic  = prometheus.NewDesc("sluice_pool_panic", "1 while the backend pool is in panic: past -health-panic of its backends are down by their health checks alone, and new work goes to every backend not shown dead by traffic.", []string{"protocol", "pool"}, nil)
	descPoolPanics = prometheus.NewDesc("sluice_pool_panics_total", "Times the backend pool went into panic (since its backend set was last replaced).", []string{"protocol", "pool"}, nil)
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
	for _, ps := range c.n.poolsByProto() {
		for _, p := range ps.pools {
			v := 0.0
			if p.Panicking() {
				v = 1
			}
			name := p.Name()
			if name == "" {
				name = lb.DefaultPool
			}
			ch <- prometheus.MustNewConstMetric(descPoolPanic, prometheus.GaugeValue, v, ps.proto, name)
			ch <- prometheus.MustNewConstMetric(descPoolPanics, prometheus.CounterValue, float64(p.Panics()), ps.proto, name)
		}
	}
}

// protoPools are the pools in force of one front end.
type protoPools struct {
	proto string
	pools []*lb.Pool
}

// poolsByProto lists the pools in force of each front end the node has.
func (n *Node) poolsByProto() []protoPools {
	var out []protoPools
	for _, proto := range []string{"http", "sip"} {
		if g := n.Generation(proto); g != nil {
			out = append(out, protoPools{proto, g.Pools()})
		} else if p := n.frontPool(proto); p != nil {
			out = append(out, protoPools{proto, []*lb.Pool{p}})
		}
	}
	return out
}
