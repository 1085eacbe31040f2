package main

import (
	"flag"

	"github.com/sluicelb/sluice/tracing"
)

// traceFlags registers the flags of tracing.Config on fs (sluice run),
// recording in fields the field each sets. The endpoint is checked when
// it is read, so a bad URL stops start-up naming -otlp-endpoint.
func traceFlags(fs *flag.FlagSet, fields map[string]string, cfg *tracing.Config) {
	*cfg = tracing.DefaultConfig()
	sec := newSection(fs, fields, "tracing", "", cfg)
	sec.fn(&cfg.Endpoint, "otlp-endpoint", "export a span per HTTP request and per SIP transaction to this OpenTelemetry collector, OTLP over HTTP (protobuf): http(s)://HOST:PORT (/v1/traces is added) or the full URL of its traces path (empty: no tracing); batched, bounded, never waited for: spans the collector cannot take in time are dropped and counted (sluice_trace_spans_total)", func(s string) error {
		if s != "" {
			if _, err := tracing.EndpointURL(s); err != nil {
				return err
			}
		}
		cfg.Endpoint = s
		return nil
	})
	sec.add(&cfg.SampleRatio, "trace-sample", "share of traces exported, from 0 to 1, when the client sent no traceparent; with one its sampled flag decides (parent-based)")
}
