package cluster

import "github.com/prometheus/client_golang/prometheus"

var (
	descUp         = prometheus.NewDesc("sluice_cluster_up", "1 while Redis answers and budgets are shared; 0 while the fail policy is in force.", []string{"cluster", "policy"}, nil)
	descNodes      = prometheus.NewDesc("sluice_cluster_nodes", "Nodes of the cluster as last seen by this node's heartbeat.", []string{"cluster"}, nil)
	descDowns      = prometheus.NewDesc("sluice_cluster_down_total", "Times this node lost Redis and switched to the fail policy.", []string{"cluster"}, nil)
	descRoundTrips = prometheus.NewDesc("sluice_cluster_round_trips_total", "Redis round trips (heartbeats and leases) made by this node.", []string{"cluster"}, nil)
	descFailed     = prometheus.NewDesc("sluice_cluster_round_trips_failed_total", "Redis round trips that failed or timed out.", []string{"cluster"}, nil)
	descLeases     = prometheus.NewDesc("sluice_cluster_leases_total", "Lease round trips per ARM rule.", []string{"rule"}, nil)
	descGranted    = prometheus.NewDesc("sluice_cluster_tokens_granted_total", "Admissions leased from the shared budget per ARM rule.", []string{"rule"}, nil)
	descReturned   = prometheus.NewDesc("sluice_cluster_tokens_returned_total", "Leased admissions given back unspent per ARM rule.", []string{"rule"}, nil)
	descRejected   = prometheus.NewDesc("sluice_cluster_redis_rejected_total", "Values read from Redis that were out of range and not used, by kind.", []string{"cluster", "kind"}, nil)
)

var _ prometheus.Collector = (*Cluster)(nil)

// Describe implements prometheus.Collector.
func (c *Cluster) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descNodes, descDowns, descRoundTrips, descFailed, descLeases, descGranted, descReturned, descRejected} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; it reads counters only.
func (c *Cluster) Collect(ch chan<- prometheus.Metric) {
	st := c.Status()
	up := 0.0
	if st.Redis == "up" {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up, st.Name, st.FailPolicy)
	ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(st.Nodes), st.Name)
	ch <- prometheus.MustNewConstMetric(descDowns, prometheus.CounterValue, float64(st.Downs), st.Name)
	ch <- prometheus.MustNewConstMetric(descRoundTrips, prometheus.CounterValue, float64(st.RoundTrips), st.Name)
	ch <- prometheus.MustNewConstMetric(descFailed, prometheus.CounterValue, float64(st.Failed), st.Name)
	for kind, n := range st.Rejected {
		ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(n), st.Name, kind)
	}
	for _, r := range st.Rules {
		ch <- prometheus.MustNewConstMetric(descLeases, prometheus.CounterValue, float64(r.Leases), r.Name)
		ch <- prometheus.MustNewConstMetric(descGranted, prometheus.CounterValue, float64(r.Granted), r.Name)
		ch <- prometheus.MustNewConstMetric(descReturned, prometheus.CounterValue, float64(r.Returned), r.Name)
	}
}
