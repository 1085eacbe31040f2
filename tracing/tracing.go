// Package tracing exports a span per HTTP request and per SIP transaction
// to an OpenTelemetry collector over OTLP/HTTP (protobuf), with the
// OpenTelemetry Go SDK.
//
// The traffic side only offers a finished Span (Exporter.Offer): sampling
// is decided there (parent-based: the client's traceparent flag, else the
// ratio), and a sampled span is copied into a bounded queue without
// blocking and without allocating. One goroutine turns the queued spans
// into SDK spans (with the request's own start and end times and the
// client's span as parent) and exports them in batches. When the queue is
// full (the collector is slow or down) spans are dropped and counted,
// never waited for: tracing never slows the traffic it describes.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config configures the exporter. Each field maps to one flag of
// cmd/sluice (or is fixed there); zero fields take DefaultConfig's.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP URL (flag -otlp-endpoint):
	// http:// or https://, host and port; without a path the traces path
	// /v1/traces is added (as OTEL_EXPORTER_OTLP_ENDPOINT does), with one
	// it is used as given. Empty: tracing off.
	Endpoint string
	// SampleRatio is the share of traces sampled when the client sent no
	// traceparent (flag -trace-sample, 0 to 1). With a traceparent its
	// sampled flag decides (parent-based sampling).
	SampleRatio float64
	// QueueSize bounds the spans waiting for export; past it they are
	// dropped and counted.
	QueueSize int
	// BatchSize is the most spans sent in one export request.
	BatchSize int
	// FlushInterval is the longest a span waits for its batch to fill.
	FlushInterval time.Duration
	// ExportTimeout bounds one export request; a failed one is not
	// retried (its spans are counted as failed) so the queue keeps moving.
	ExportTimeout time.Duration
	// ServiceName and Instance are the resource's service.name and
	// service.instance.id.
	ServiceName string
	Instance    string
	// MaskUser replaces the user part of SIP Request-URIs with '*' in
	// span attributes, as -access-log-mask-user does in the log.
	MaskUser bool
}

// DefaultConfig returns the defaults: sample ratio 1 (every trace the
// client did not mark unsampled), 2048 queued spans, batches of 512
// spans sent at least every 2 s, 10 s per export.
func DefaultConfig() Config {
	return Config{SampleRatio: 1, QueueSize: 2048, BatchSize: 512, FlushInterval: 2 * time.Second,
		ExportTimeout: 10 * time.Second, ServiceName: "sluice"}
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	if c.QueueSize == 0 {
		c.QueueSize = d.QueueSize
	}
	if c.BatchSize == 0 {
		c.BatchSize = d.BatchSize
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = d.FlushInterval
	}
	if c.ExportTimeout == 0 {
		c.ExportTimeout = d.ExportTimeout
	}
	if c.ServiceName == "" {
		c.ServiceName = d.ServiceName
	}
}

// Validate checks c and names the flag of a bad value.
func (c Config) Validate() error {
	if c.Endpoint != "" {
		if _, err := EndpointURL(c.Endpoint); err != nil {
			return err
		}
	}
	if math.IsNaN(c.SampleRatio) || c.SampleRatio < 0 || c.SampleRatio > 1 {
		return fmt.Errorf("-trace-sample %v: want a ratio from 0 to 1", c.SampleRatio)
	}
	if c.QueueSize < 0 || c.QueueSize > 1<<20 {
		return fmt.Errorf("tracing queue size %d: want 1 to %d", c.QueueSize, 1<<20)
	}
	if c.BatchSize < 0 || c.BatchSize > 1<<16 {
		return fmt.Errorf("tracing batch size %d: want 1 to %d", c.BatchSize, 1<<16)
	}
	if c.FlushInterval < 0 || c.ExportTimeout < 0 {
		return errors.New("tracing flush interval and export timeout: want positive durations")
	}
	return nil
}

// EndpointURL checks an -otlp-endpoint value and returns the URL spans
// are posted to: raw with /v1/traces added when it has no path.
func EndpointURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("-otlp-endpoint %q: %v", raw, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("-otlp-endpoint %q: want an http:// or https:// URL (OTLP over HTTP)", raw)
	case u.Host == "" || u.Hostname() == "":
		return "", fmt.Errorf("-otlp-endpoint %q: want a host (http://HOST:4318)", raw)
	case u.User != nil:
		return "", fmt.Errorf("-otlp-endpoint %q: credentials in the URL are not supported", raw)
	case u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("-otlp-endpoint %q: want no query or fragment", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// Stats are the exporter's counters since it started.
type Stats struct {
	// Queued spans were sampled and taken into the queue.
	Queued uint64 `json:"queued"`
	// Unsampled spans were left out by sampling.
	Unsampled uint64 `json:"unsampled"`
	// Dropped spans were sampled but the queue was full.
	Dropped uint64 `json:"dropped"`
	// Exported spans were accepted by the collector.
	Exported uint64 `json:"exported"`
	// Failed spans were in an export request that failed.
	Failed uint64 `json:"failed"`
}

// Exporter turns offered spans into OTLP exports. Create it with New,
// offer spans with Offer from any goroutine, stop it with Close.
type Exporter struct {
	cfg   Config
	log   *slog.Logger
	bound uint64 // TraceIDRatioBased's: sampled when id>>1 < bound
	all   bool   // ratio 1

	queue chan Span

	queued, unsampled, dropped, exported, failed atomic.Uint64

	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	ids      *idGen
	batch    *batcher
	// seed keys rootSpanID: only this exporter knows which span ids it
	// gave (StartTrace), so no client can pass its own span for one.
	seed maphash.Seed

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New builds an Exporter for cfg (cfg.Endpoint must be set) and starts
// its goroutine. Nothing is sent before the first span.
func New(cfg Config, logger *slog.Logger) (*Exporter, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Endpoint == "" {
		return nil, errors.New("-otlp-endpoint: want a URL to export spans to")
	}
	endpoint, _ := EndpointURL(cfg.Endpoint)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	client, err := otlptracehttp.New(context.Background(),
		otlptracehttp.WithEndpointURL(endpoint),
		otlptracehttp.WithTimeout(cfg.ExportTimeout),
		otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}),
		otlptracehttp.WithMaxResponseSize(64<<10),
	)
	if err != nil {
		return nil, fmt.Errorf("-otlp-endpoint %q: %w", cfg.Endpoint, err)
	}
	e := &Exporter{
		cfg:   cfg,
		log:   logger.With("component", "tracing"),
		queue: make(chan Span, cfg.QueueSize),
		ids:   &idGen{},
		seed:  maphash.MakeSeed(),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	e.all = cfg.SampleRatio >= 1
	e.bound = uint64(cfg.SampleRatio * (1 << 63))
	e.batch = &batcher{exp: client, e: e}
	res := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if cfg.Instance != "" {
		res = append(res, attribute.String("service.instance.id", cfg.Instance))
	}
	e.provider = sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.AlwaysSample()), // decided in Offer
		sdktrace.WithIDGenerator(e.ids),
		sdktrace.WithSpanProcessor(e.batch),
		sdktrace.WithResource(sdkresource.NewSchemaless(res...)),
	)
	e.tracer = e.provider.Tracer("github.com/sluicelb/sluice")
	go e.run()
	return e, nil
}

// Sampled reports whether a request with this parent (zero when the
// client sent no traceparent) and trace id (zero when it has none yet) is
// sampled: the parent's flag, else the ratio, on the trace id as the
// OpenTelemetry TraceIDRatioBased sampler decides it (so every
// implementation keeps the same traces), else at random. Callers may ask
// before building a Span to save the work of an unsampled one.
func (e *Exporter) Sampled(parent *TraceContext, traceID *[16]byte) bool {
	if parent != nil && parent.Valid() {
		return parent.Sampled
	}
	if e.all {
		return true
	}
	if e.bound == 0 {
		return false
	}
	var x uint64
	if traceID != nil && *traceID != [16]byte{} {
		for _, b := range traceID[8:16] {
			x = x<<8 | uint64(b)
		}
	} else {
		x = rand.Uint64()
	}
	return x>>1 < e.bound
}

// StartTrace starts the trace of a request that came without a valid
// traceparent: a new random trace id, the id the request's span will
// have (the parent of the traceparent the front end sends the backend,
// so that the backend joins the trace; the record's ParentSpan), and
// whether the span is sampled (-trace-sample, on the trace id, as
// Sampled decides it; the traceparent's flag). The access log writes the
// trace id, so the span is found from the log line. It allocates nothing
// and is safe for concurrent use.
func (e *Exporter) StartTrace() (traceID [16]byte, spanID [8]byte, sampled bool) {
	for traceID == [16]byte{} {
		putUint64(traceID[:8], rand.Uint64())
		putUint64(traceID[8:], rand.Uint64())
	}
	return traceID, e.rootSpanID(&traceID), e.Sampled(nil, &traceID)
}

// rootSpanID is the span id StartTrace gives the request of traceID: a
// keyed hash of it, so a record's trace context tells by itself whether
// it is one StartTrace made (ownRoot). Never zero.
func (e *Exporter) rootSpanID(traceID *[16]byte) (id [8]byte) {
	putUint64(id[:], maphash.Bytes(e.seed, traceID[:])|1)
	return id
}

// ownRoot reports whether a record's trace context is one StartTrace
// made: its span is then a root with that trace and span id.
func (e *Exporter) ownRoot(has bool, traceID *[16]byte, parent *[8]byte) bool {
	return has && *parent == e.rootSpanID(traceID)
}

// Offer queues sp for export when it is sampled. It never blocks and
// allocates nothing: with the queue full the span is dropped and counted.
// It reports whether sp was queued. Safe for concurrent use; sp is copied.
func (e *Exporter) Offer(sp *Span) bool {
	if !e.Sampled(&sp.Parent, &sp.TraceID) {
		e.unsampled.Add(1)
		return false
	}
	return e.enqueue(sp)
}

// Stats returns the counters.
func (e *Exporter) Stats() Stats {
	return Stats{Queued: e.queued.Load(), Unsampled: e.unsampled.Load(), Dropped: e.dropped.Load(),
		Exported: e.exported.Load(), Failed: e.failed.Load()}
}

// Close exports what is queued, within ctx, and stops the exporter.
// Spans offered after Close are dropped. Safe to call more than once.
func (e *Exporter) Close(ctx context.Context) error {
	var err error
	e.closeOnce.Do(func() {
		close(e.stop)
		select {
		case <-e.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if serr := e.provider.Shutdown(ctx); serr != nil && err == nil {
			err = serr
		}
	})
	return err
}

// run is the exporter's goroutine: it builds SDK spans from the queue and
// exports a batch when it is full or FlushInterval old.
func (e *Exporter) run() {
	defer close(e.done)
	tick := time.NewTicker(e.cfg.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case sp := <-e.queue:
			e.emit(&sp)
			if e.batch.len() >= e.cfg.BatchSize {
				e.batch.flush()
			}
		case <-tick.C:
			e.batch.flush()
		case <-e.stop:
			for {
				select {
				case sp := <-e.queue:
					e.emit(&sp)
					if e.batch.len() >= e.cfg.BatchSize {
						e.batch.flush()
					}
					continue
				default:
				}
				break
			}
			e.batch.flush()
			return
		}
	}
}

// emit builds and ends the SDK span of sp; the batcher collects it.
func (e *Exporter) emit(sp *Span) {
	ctx := context.Background()
	if sp.Parent.Valid() {
		sc := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID:    sp.Parent.TraceID,
			SpanID:     sp.Parent.SpanID,
			TraceFlags: trace.FlagsSampled,
			Remote:     true,
		})
		if sp.Parent.State != "" {
			if ts, err := trace.ParseTraceState(sp.Parent.State); err == nil {
				sc = sc.WithTraceState(ts)
			}
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
	} else {
		e.ids.next, e.ids.nextSpan = sp.TraceID, sp.SpanID
	}
	attrs := make([]attribute.KeyValue, 0, sp.n)
	for _, a := range sp.Attrs() {
		if a.IsInt {
			attrs = append(attrs, attribute.Int64(a.Key, a.Int))
		} else {
			attrs = append(attrs, attribute.String(a.Key, a.Str))
		}
	}
	_, s := e.tracer.Start(ctx, sp.Name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(sp.Start), trace.WithAttributes(attrs...))
	e.ids.next, e.ids.nextSpan = [16]byte{}, [8]byte{}
	if sp.Error {
		s.SetStatus(codes.Error, sp.ErrorText)
	}
	s.End(trace.WithTimestamp(sp.End))
}

// idGen is the SDK's id source: a root span takes the trace and span id
// its request was given (next, nextSpan, set by the exporter's goroutine,
// the only one starting spans), else random ones.
type idGen struct {
	next     [16]byte
	nextSpan [8]byte
}

func (g *idGen) NewIDs(context.Context) (trace.TraceID, trace.SpanID) {
	tid := trace.TraceID(g.next)
	for tid == (trace.TraceID{}) {
		var b [16]byte
		putUint64(b[:8], rand.Uint64())
		putUint64(b[8:], rand.Uint64())
		tid = b
	}
	if g.nextSpan != ([8]byte{}) {
		return tid, trace.SpanID(g.nextSpan)
	}
	return tid, g.NewSpanID(context.Background(), tid)
}

func (g *idGen) NewSpanID(context.Context, trace.TraceID) trace.SpanID {
	var sid trace.SpanID
	for sid == (trace.SpanID{}) {
		putUint64(sid[:], rand.Uint64())
	}
	return sid
}

func putUint64(b []byte, v uint64) {
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

// batcher is the SDK span processor: it collects ended spans and exports
// them when the exporter's goroutine says so, in that goroutine, one
// request at a time, so a slow collector holds up only that goroutine
// (and the queue in front of it fills and drops).
type batcher struct {
	exp  sdktrace.SpanExporter
	e    *Exporter
	mu   sync.Mutex
	b    []sdktrace.ReadOnlySpan
	shut bool
	// warned is when an export failure was last logged (the exporter's
	// goroutine only).
	warned time.Time
}

func (b *batcher) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (b *batcher) OnEnd(s sdktrace.ReadOnlySpan) {
	b.mu.Lock()
	if !b.shut {
		b.b = append(b.b, s)
	}
	b.mu.Unlock()
}

func (b *batcher) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.b)
}

// flush exports the collected spans, counting them as exported or failed.
func (b *batcher) flush() {
	b.mu.Lock()
	spans := b.b
	b.b = nil
	b.mu.Unlock()
	if len(spans) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.e.cfg.ExportTimeout)
	defer cancel()
	if err := b.exp.ExportSpans(ctx, spans); err != nil {
		b.e.failed.Add(uint64(len(spans)))
		// At most one warning every 10 s: a collector that is down
		// fails every batch.
		if now := time.Now(); now.Sub(b.warned) >= 10*time.Second {
			b.warned = now
			b.e.log.Warn("otlp export failed", "spans", len(spans), "failed_total", b.e.failed.Load(), "err", err)
		}
		return
	}
	b.e.exported.Add(uint64(len(spans)))
}

func (b *batcher) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	b.shut = true
	b.b = nil
	b.mu.Unlock()
	return b.exp.Shutdown(ctx)
}

func (b *batcher) ForceFlush(context.Context) error { return nil }
