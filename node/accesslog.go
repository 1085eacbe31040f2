package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/tracing"
)

// AccessLogConfig is the access log's flags as given; node parses them
// (accesslog.ParseFormat, ParseSample, ParseDest through accesslog.New),
// so every error names its flag and value.
type AccessLogConfig struct {
	// Dest is -access-log: where both protocols' lines go ("" none).
	Dest string
	// HTTPDest and SIPDest are -http-access-log and -sip-access-log: a
	// protocol's own destination ("off": none for it).
	HTTPDest, SIPDest string
	// Format is -access-log-format: json, logfmt or combined.
	Format string
	// Sample is -access-log-sample: refused=R,new=R,affinity=R.
	Sample string
	// Query is -access-log-query: log HTTP query strings.
	Query bool
	// MaskUser is -access-log-mask-user: mask the user part of SIP R-URIs.
	MaskUser bool
}

// DefaultAccessLogConfig is the flags' defaults: no access log, JSON,
// every record.
func DefaultAccessLogConfig() AccessLogConfig {
	return AccessLogConfig{Format: "json", Sample: accesslog.DefaultSample.String()}
}

// on reports whether any destination is set.
func (c AccessLogConfig) on() bool {
	return c.Dest != "" || c.HTTPDest != "" || c.SIPDest != ""
}

// openAccessLog opens the access log the configuration asks for, or one
// without destination when only its consumers want the records (the
// tracer); none: n.alog stays nil and the front ends log nothing.
func (n *Node) openAccessLog() error {
	c := n.cfg.AccessLog
	f, err := accesslog.ParseFormat(c.Format)
	if err != nil {
		return err
	}
	s, err := accesslog.ParseSample(c.Sample)
	if err != nil {
		return err
	}
	sinks := n.accessLogSinks()
	if !c.on() && len(sinks) == 0 {
		return nil
	}
	n.alog, err = accesslog.New(accesslog.Options{
		Dest: c.Dest, HTTPDest: c.HTTPDest, SIPDest: c.SIPDest,
		Format: f, Sample: s, Query: c.Query, MaskUser: c.MaskUser,
		Sinks: sinks, Log: n.logger,
	})
	return err
}

// AccessLog is the node's access log, nil when none: the front ends log
// to it (and other consumers are its Options.Sinks).
func (n *Node) AccessLog() *accesslog.Logger { return n.alog }

// ReopenAccessLog reopens the access log's files (SIGUSR1, after
// logrotate renamed them) and reconnects its syslog streams.
func (n *Node) ReopenAccessLog() { n.alog.Reopen() }

// closeAccessLog writes what the access log holds and closes it, after
// the front ends stopped.
func (n *Node) closeAccessLog() {
	if n.alog != nil {
		if err := n.alog.Close(); err != nil {
			n.logger.Warn("access log close", "err", err)
		}
		n.alog = nil
	}
}

// accessLogStatus is /status's access_log: the counters per protocol.
func (n *Node) accessLogStatus() any {
	if n.alog == nil {
		return nil
	}
	st := n.alog.Stats()
	type counts struct {
		Logged  uint64 `json:"logged"`
		Dropped uint64 `json:"dropped"`
		Written uint64 `json:"written"`
		Lost    uint64 `json:"lost"`
	}
	return struct {
		HTTP        counts         `json:"http"`
		SIP         counts         `json:"sip"`
		WriteErrors uint64         `json:"write_errors"`
		TraceSpans  *tracing.Stats `json:"trace_spans,omitempty"`
	}{
		HTTP:        counts{st.Logged[accesslog.HTTP], st.Dropped[accesslog.HTTP], st.Written[accesslog.HTTP], st.Lost[accesslog.HTTP]},
		SIP:         counts{st.Logged[accesslog.SIP], st.Dropped[accesslog.SIP], st.Written[accesslog.SIP], st.Lost[accesslog.SIP]},
		WriteErrors: st.WriteErrors,
		TraceSpans:  n.traceStats(),
	}
}

var (
	descALogDropped = prometheus.NewDesc("sluice_access_log_dropped_total", "Access log records dropped: the writer was behind (the destination slower than the traffic) and the ring full.", []string{"proto"}, nil)
	descALogWritten = prometheus.NewDesc("sluice_access_log_written_total", "Access log lines their destination took whole.", []string{"proto"}, nil)
	descALogLost    = prometheus.NewDesc("sluice_access_log_lost_total", "Access log lines that did not reach their destination: a failed or short write (a full disk, a pipe nobody reads), a syslog receiver down.", []string{"proto"}, nil)
	descALogErrors  = prometheus.NewDesc("sluice_access_log_write_errors_total", "Failed writes, opens and dials of the access log's destinations (their lines are counted in sluice_access_log_lost_total).", nil, nil)
)

// accessLogCollector is the access log's metrics.
type accessLogCollector struct{ l *accesslog.Logger }

func (c accessLogCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descALogDropped
	ch <- descALogWritten
	ch <- descALogLost
	ch <- descALogErrors
}

func (c accessLogCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.l.Stats()
	for _, p := range []accesslog.Proto{accesslog.HTTP, accesslog.SIP} {
		ch <- prometheus.MustNewConstMetric(descALogDropped, prometheus.CounterValue, float64(st.Dropped[p]), p.String())
		ch <- prometheus.MustNewConstMetric(descALogWritten, prometheus.CounterValue, float64(st.Written[p]), p.String())
		ch <- prometheus.MustNewConstMetric(descALogLost, prometheus.CounterValue, float64(st.Lost[p]), p.String())
	}
	ch <- prometheus.MustNewConstMetric(descALogErrors, prometheus.CounterValue, float64(st.WriteErrors))
}
