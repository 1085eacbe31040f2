package node

import (
	"context"
	"time"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/tracing"
)

// buildTracing starts the span exporter of -otlp-endpoint (none without
// one). It takes its spans from the access log's records, as a Sink
// (accessLogSinks): openAccessLog, called after it, opens a Logger for
// it even when no access log destination is set. The Request-URI's user
// part is masked in spans as in the log (-access-log-mask-user).
func (n *Node) buildTracing() error {
	tc := n.cfg.Tracing
	if err := tc.Validate(); err != nil {
		return err
	}
	if tc.Endpoint == "" {
		return nil
	}
	if tc.Instance == "" {
		tc.Instance = n.cfg.Cluster.Node
	}
	tc.MaskUser = tc.MaskUser || n.cfg.AccessLog.MaskUser
	t, err := tracing.New(tc, n.logger)
	if err != nil {
		return err
	}
	n.tracer = t
	n.logger.Info("tracing", "otlp_endpoint", tc.Endpoint, "sample", tc.SampleRatio)
	return nil
}

// accessLogSinks are the access log's consumers besides its
// destinations: the span exporter, when tracing is on.
func (n *Node) accessLogSinks() []accesslog.Sink {
	if n.tracer == nil {
		return nil
	}
	return []accesslog.Sink{n.tracer.Sink()}
}

// closeTracing exports the spans still queued, within timeout (at least
// a second), and stops the exporter. Called after the access log was
// closed, which hands it the last records.
func (n *Node) closeTracing(timeout time.Duration) {
	if n.tracer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Second))
	defer cancel()
	if err := n.tracer.Close(ctx); err != nil {
		n.logger.Warn("tracing shutdown", "err", err)
	}
	n.tracer = nil
}

// traceStats are the exporter's counters for /status (access_log's
// trace_spans); nil when tracing is off.
func (n *Node) traceStats() *tracing.Stats {
	if n.tracer == nil {
		return nil
	}
	st := n.tracer.Stats()
	return &st
}
