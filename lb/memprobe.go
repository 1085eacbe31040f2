package lb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicelb/sluice/admission"
)

// Default metric selectors: JVM Micrometer's heap gauges, summed over the
// memory pools.
const (
	DefaultUsedMetric = `jvm_memory_used_bytes{area="heap"}`
	DefaultMaxMetric  = `jvm_memory_max_bytes{area="heap"}`
)

// maxMetricsBody bounds how much of a metrics answer is read.
const maxMetricsBody = 8 << 20

// MetricSelector picks the series of one metric family whose labels include
// the given ones, e.g. jvm_memory_used_bytes{area="heap"}.
type MetricSelector struct {
	Name   string
	Labels map[string]string
}

// String returns the selector in PromQL-like syntax.
func (s MetricSelector) String() string {
	if len(s.Labels) == 0 {
		return s.Name
	}
	parts := make([]string, 0, len(s.Labels))
	for k, v := range s.Labels {
		parts = append(parts, fmt.Sprintf("%s=%q", k, v))
	}
	return s.Name + "{" + strings.Join(parts, ",") + "}"
}

// ParseMetricSelector parses `name` or `name{label="value",...}`. The
// selector is parsed by the Prometheus text parser itself, as a sample line,
// so it follows the exposition format's quoting rules exactly.
func ParseMetricSelector(s string) (MetricSelector, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.ContainsAny(s, "\n#") {
		return MetricSelector{}, fmt.Errorf("metric selector %q: want name or name{label=\"value\"}", s)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(s + " 0\n"))
	if err != nil || len(fams) != 1 {
		return MetricSelector{}, fmt.Errorf("metric selector %q: want name or name{label=\"value\"}: %w", s, err)
	}
	for name, f := range fams {
		sel := MetricSelector{Name: name, Labels: map[string]string{}}
		for _, lp := range f.GetMetric()[0].GetLabel() {
			sel.Labels[lp.GetName()] = lp.GetValue()
		}
		return sel, nil
	}
	panic("unreachable")
}

// sum adds the values of every series in fams that s selects. Negative
// values are skipped: Micrometer reports -1 for a pool without a defined
// maximum. found is false when no series matched.
func (s MetricSelector) sum(fams map[string]*dto.MetricFamily) (total float64, found bool) {
	f := fams[s.Name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.GetMetric() {
		if !s.matches(m.GetLabel()) {
			continue
		}
		var v float64
		switch {
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		default:
			continue
		}
		found = true
		if v > 0 && !math.IsInf(v, 0) {
			total += v
		}
	}
	return total, found
}

func (s MetricSelector) matches(labels []*dto.LabelPair) bool {
	for k, want := range s.Labels {
		ok := false
		for _, lp := range labels {
			if lp.GetName() == k {
				ok = lp.GetValue() == want
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// ErrNoMemoryMetric is wrapped by ParseMemory when a body lacks the used or
// max metric.
var ErrNoMemoryMetric = errors.New("memory metric not found")

// jsonMemory is the JSON report a backend may give instead of Prometheus
// text.
type jsonMemory struct {
	Used *int64 `json:"heap_used_bytes"`
	Max  *int64 `json:"heap_max_bytes"`
}

// ParseMemory reads a backend's memory from a metrics answer: JSON
// {"heap_used_bytes":N,"heap_max_bytes":M} when the content type says JSON
// or the body starts with '{', else Prometheus text, where used and max
// are each the sum of the series their selector picks.
func ParseMemory(body []byte, contentType string, used, max MetricSelector) (usedBytes, maxBytes int64, err error) {
	mt, _, _ := mime.ParseMediaType(contentType)
	trimmed := bytes.TrimSpace(body)
	if mt == "application/json" || bytes.HasPrefix(trimmed, []byte("{")) {
		var j jsonMemory
		if err := json.Unmarshal(trimmed, &j); err != nil {
			return 0, 0, fmt.Errorf("parse memory json: %w", err)
		}
		if j.Used == nil || j.Max == nil {
			return 0, 0, fmt.Errorf("parse memory json: heap_used_bytes and heap_max_bytes required: %w", ErrNoMemoryMetric)
		}
		if *j.Used < 0 || *j.Max <= 0 {
			return 0, 0, fmt.Errorf("parse memory json: used %d max %d out of range", *j.Used, *j.Max)
		}
		return *j.Used, *j.Max, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return 0, 0, fmt.Errorf("parse memory metrics: %w", err)
	}
	u, ok := used.sum(fams)
	if !ok {
		return 0, 0, fmt.Errorf("parse memory metrics: %s: %w", used, ErrNoMemoryMetric)
	}
	m, ok := max.sum(fams)
	if !ok || m <= 0 {
		return 0, 0, fmt.Errorf("parse memory metrics: %s: %w", max, ErrNoMemoryMetric)
	}
	return int64(u), int64(m), nil
}

// MemoryProbeConfig configures the memory probe of one backend.
type MemoryProbeConfig struct {
	// URL answers Prometheus text or the JSON report; from the
	// metrics= option of -http-backend.
	URL string
	// UsedMetric and MaxMetric select the used and maximum memory series.
	// Flags -mop-used-metric and -mop-max-metric; defaults
	// DefaultUsedMetric and DefaultMaxMetric.
	UsedMetric, MaxMetric string
	// Interval between polls. Flag -mop-probe-interval, default 1s.
	Interval time.Duration
	// Timeout of one poll. Default Interval.
	Timeout time.Duration
}

// MemoryProbe polls one backend's metrics and feeds its MOP. It is the only
// source of memory samples for MOP learning.
type MemoryProbe struct {
	b         *Backend
	cfg       MemoryProbeConfig
	used, max MetricSelector
	client    *http.Client
	clock     admission.Clock
	logger    *slog.Logger
}

// NewMemoryProbe validates cfg and returns a probe feeding b's MOP. clock
// supplies the time of each sample (nil: admission.MonoClock).
func NewMemoryProbe(b *Backend, cfg MemoryProbeConfig, clock admission.Clock, logger *slog.Logger) (*MemoryProbe, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("memory probe %s: empty metrics url", b.id)
	}
	if !strings.HasPrefix(cfg.URL, "http://") && !strings.HasPrefix(cfg.URL, "https://") {
		return nil, fmt.Errorf("memory probe %s: metrics url %q must start with http:// or https://", b.id, cfg.URL)
	}
	if cfg.UsedMetric == "" {
		cfg.UsedMetric = DefaultUsedMetric
	}
	if cfg.MaxMetric == "" {
		cfg.MaxMetric = DefaultMaxMetric
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Interval < 0 {
		return nil, fieldError("MemoryProbeConfig.Interval", "must be positive")
	}
	if cfg.Timeout <= 0 || cfg.Timeout > cfg.Interval {
		cfg.Timeout = cfg.Interval
	}
	used, err := ParseMetricSelector(cfg.UsedMetric)
	if err != nil {
		return nil, &FieldError{Field: "MemoryProbeConfig.UsedMetric", Err: err}
	}
	max, err := ParseMetricSelector(cfg.MaxMetric)
	if err != nil {
		return nil, &FieldError{Field: "MemoryProbeConfig.MaxMetric", Err: err}
	}
	if clock == nil {
		clock = admission.MonoClock{}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &MemoryProbe{
		b: b, cfg: cfg, used: used, max: max, clock: clock,
		client: &http.Client{Timeout: cfg.Timeout},
		logger: logger.With("component", "memprobe", "backend", b.id),
	}, nil
}

// Poll fetches the metrics once and, when they parse, feeds MOP.Observe.
func (p *MemoryProbe) Poll(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.URL, nil)
	if err != nil {
		return fmt.Errorf("poll memory %s: %w", p.b.id, err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4, application/json;q=0.5")
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("poll memory %s: %w", p.b.id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fmt.Errorf("poll memory %s: status %d", p.b.id, resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBody))
	if err != nil {
		return fmt.Errorf("poll memory %s: %w", p.b.id, err)
	}
	used, max, err := ParseMemory(body, resp.Header.Get("Content-Type"), p.used, p.max)
	if err != nil {
		return fmt.Errorf("poll memory %s: %w", p.b.id, err)
	}
	p.b.mop.Observe(p.clock.Now(), used, max)
	return nil
}

// Run polls every Interval until ctx is done. Failures are logged at most
// once per state change, not per poll.
func (p *MemoryProbe) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	failing := false
	for {
		err := p.Poll(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			p.logger.Warn("memory probe failing", "err", err)
		case err == nil && failing:
			p.logger.Info("memory probe recovered")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
