package node

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/tracing"
)

// buildTracing starts the span exporter of -otlp-endpoint (none without
// one) and, when the access log has not given the front ends a Logger,
// one without destination whose only consumer is the exporter: the
// exporter takes its spans from the access log's records, whether or not
// they are written anywhere.
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
	t, err := tracing.New(tc, n.logger)
	if err != nil {
		return err
	}
	n.tracer = t
	if n.accessLog == nil {
		l, err := accesslog.New(accesslog.Options{Sample: accesslog.DefaultSample, Sinks: []accesslog.Sink{t.Sink()}})
		if err != nil {
			n.closeTracing(time.Second)
			return fmt.Errorf("-otlp-endpoint: %w", err)
		}
		n.accessLog, n.ownLog = l, true
	}
	n.logger.Info("tracing", "otlp_endpoint", tc.Endpoint, "sample", tc.SampleRatio)
	return nil
}

// closeTracing writes out the records and spans still queued, within
// timeout, and stops the exporter (and the Logger it made). Called once
// the front ends stopped.
func (n *Node) closeTracing(timeout time.Duration) {
	if n.ownLog && n.accessLog != nil {
		_ = n.accessLog.Close()
		n.accessLog, n.ownLog = nil, false
	}
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
