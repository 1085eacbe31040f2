package lb

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// Default metric selectors: JVM Micrometer's heap gauges, summed over the
// memory pools.
const (
	DefaultUsedMetric = `jvm_memory_used_bytes{area="heap"}`
	DefaultMaxMetric  = `jvm_memory_max_bytes{area="heap"}`
)

// Size limits of one metrics answer, by default. A page over either is a
// failed probe: a JVM's memory families take a few KB, a large Spring Boot
// page some 200 KB, and the probe must stay cheap whatever a backend sends.
const (
	// MaxMetricsWire bounds the bytes read from the connection, compressed
	// or not: the default of MemoryProbeConfig.MaxBytes.
	MaxMetricsWire = 256 << 10
	// MaxMetricsBody bounds the page after decompression (gzip): four
	// times MemoryProbeConfig.MaxBytes, 1 MiB by default.
	MaxMetricsBody = 4 * MaxMetricsWire
	// maxMetricsLimit is the highest MaxBytes: past it a backend's page
	// costs the node more than its probe is worth.
	maxMetricsLimit = 16 << 20
)

// maxMetricsHeader bounds the header of a metrics answer.
const maxMetricsHeader = 64 << 10

// ErrMetricsTooLarge is wrapped by Poll when an answer is over
// MemoryProbeConfig.MaxBytes on the wire or four times that decompressed.
var ErrMetricsTooLarge = errors.New("metrics answer too large")

// MetricSelector picks the series of one metric family whose labels include
// the given ones, e.g. jvm_memory_used_bytes{area="heap"}.
type MetricSelector struct {
	Name   string
	Labels map[string]string
}

// String returns the selector in PromQL-like syntax, labels sorted.
func (s MetricSelector) String() string {
	if len(s.Labels) == 0 {
		return s.Name
	}
	parts := make([]string, 0, len(s.Labels))
	for k, v := range s.Labels {
		parts = append(parts, fmt.Sprintf("%s=%q", k, v))
	}
	sort.Strings(parts)
	return s.Name + "{" + strings.Join(parts, ",") + "}"
}

// ParseMetricSelector parses `name` or `name{label="value",...}` with the
// same rules as the series lines of a metrics page (the Prometheus text
// format's quoting: \\, \" and \n in values).
func ParseMetricSelector(s string) (MetricSelector, error) {
	s = strings.TrimSpace(s)
	bad := func(err error) (MetricSelector, error) {
		return MetricSelector{}, fmt.Errorf("metric selector %q: want name or name{label=\"value\"}: %w", s, err)
	}
	var sc seriesScanner
	name, labels, rest, err := sc.series([]byte(s))
	if err != nil {
		return bad(err)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return bad(errors.New("text after the selector"))
	}
	sel := MetricSelector{Name: string(name), Labels: make(map[string]string, len(labels))}
	for _, lp := range labels {
		if _, dup := sel.Labels[string(lp.name)]; dup {
			return bad(fmt.Errorf("label %s twice", lp.name))
		}
		sel.Labels[string(lp.name)] = string(lp.value)
	}
	return sel, nil
}

// selects reports whether a line of a metrics page starts with the
// selector's metric name (and not a longer one).
func (s MetricSelector) selects(line []byte) bool {
	if !bytes.HasPrefix(line, []byte(s.Name)) || len(line) == len(s.Name) {
		return false
	}
	c := line[len(s.Name)]
	return c == '{' || c == ' ' || c == '\t'
}

// matches reports whether a series with labels carries every label of s.
func (s MetricSelector) matches(labels []labelPair) bool {
	for k, want := range s.Labels {
		ok := false
		for _, lp := range labels {
			if string(lp.name) == k {
				ok = string(lp.value) == want
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// labelPair is one label of a series line; the slices point into the
// line, or into a copy when the value had escapes.
type labelPair struct{ name, value []byte }

// seriesScanner parses series lines of the Prometheus text format:
// name, optional {labels}, value, optional timestamp. Its label slice is
// reused from line to line.
type seriesScanner struct {
	labels []labelPair
}

func isNameChar(c byte, first, colon bool) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9' || colon && c == ':'
}

func skipBlank(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// series parses a metric name and its labels from the start of line and
// returns what follows them.
func (sc *seriesScanner) series(line []byte) (name []byte, labels []labelPair, rest []byte, err error) {
	i := 0
	for i < len(line) && isNameChar(line[i], i == 0, true) {
		i++
	}
	if i == 0 {
		return nil, nil, nil, errors.New("no metric name")
	}
	name, rest = line[:i], skipBlank(line[i:])
	sc.labels = sc.labels[:0]
	if len(rest) == 0 || rest[0] != '{' {
		return name, sc.labels, line[i:], nil
	}
	rest = rest[1:]
	for {
		rest = skipBlank(rest)
		if len(rest) > 0 && rest[0] == '}' {
			return name, sc.labels, rest[1:], nil
		}
		j := 0
		for j < len(rest) && isNameChar(rest[j], j == 0, false) {
			j++
		}
		if j == 0 {
			return nil, nil, nil, errors.New("bad label name")
		}
		lname := rest[:j]
		rest = skipBlank(rest[j:])
		if len(rest) == 0 || rest[0] != '=' {
			return nil, nil, nil, fmt.Errorf("label %s: want =", lname)
		}
		rest = skipBlank(rest[1:])
		if len(rest) == 0 || rest[0] != '"' {
			return nil, nil, nil, fmt.Errorf("label %s: want a quoted value", lname)
		}
		rest = rest[1:]
		val, escaped, k := []byte(nil), false, 0
		for ; k < len(rest) && rest[k] != '"'; k++ {
			if rest[k] == '\\' {
				escaped = true
				k++
			}
		}
		if k >= len(rest) {
			return nil, nil, nil, fmt.Errorf("label %s: unterminated value", lname)
		}
		val, rest = rest[:k], rest[k+1:]
		if escaped {
			if val, err = unescapeLabel(val); err != nil {
				return nil, nil, nil, fmt.Errorf("label %s: %w", lname, err)
			}
		}
		sc.labels = append(sc.labels, labelPair{lname, val})
		rest = skipBlank(rest)
		switch {
		case len(rest) > 0 && rest[0] == ',':
			rest = rest[1:] // a trailing comma is allowed (Micrometer writes one)
		case len(rest) > 0 && rest[0] == '}':
		default:
			return nil, nil, nil, fmt.Errorf("label %s: want , or }", lname)
		}
	}
}

func unescapeLabel(v []byte) ([]byte, error) {
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] != '\\' {
			out = append(out, v[i])
			continue
		}
		i++
		switch v[i] {
		case '\\', '"':
			out = append(out, v[i])
		case 'n':
			out = append(out, '\n')
		default:
			return nil, fmt.Errorf("bad escape %q", v[i-1:i+1])
		}
	}
	return out, nil
}

// sample parses a whole series line: name, labels, value and an optional
// integer timestamp.
func (sc *seriesScanner) sample(line []byte) (labels []labelPair, v float64, err error) {
	_, labels, rest, err := sc.series(line)
	if err != nil {
		return nil, 0, err
	}
	if len(rest) == len(skipBlank(rest)) {
		return nil, 0, errors.New("want a blank before the value")
	}
	rest = skipBlank(rest)
	end := bytes.IndexAny(rest, " \t")
	if end < 0 {
		end = len(rest)
	}
	v, err = strconv.ParseFloat(string(rest[:end]), 64)
	if err != nil {
		return nil, 0, errors.New("value is not a number")
	}
	if ts := skipBlank(rest[end:]); len(ts) > 0 {
		if _, err := strconv.ParseInt(string(ts), 10, 64); err != nil {
			return nil, 0, errors.New("text after the value")
		}
	}
	return labels, v, nil
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
//
// Only lines of the two selected families are parsed; the rest of the
// page is skipped unread. A reading that cannot be true is an error, so
// that the probe fails rather than feed MOP a made-up memory: a selected
// used series that is NaN, infinite or negative, a max series that is NaN
// or infinite (a negative max, Micrometer's -1 for a pool without one, is
// skipped), and totals that admission.CheckMemorySample refuses (over
// 1e18 bytes, used over max by more than 2%).
func ParseMemory(body []byte, contentType string, used, max MetricSelector) (usedBytes, maxBytes int64, err error) {
	return readMemory(bytes.NewReader(body), contentType, used, max)
}

// Bounds of what the probe holds of a page at once.
const (
	// maxSeriesLine bounds a line of a selected series (and the read
	// buffer): such a line takes some hundred bytes.
	maxSeriesLine = 16 << 10
	// maxJSONReport bounds the JSON report, which takes some ten.
	maxJSONReport = 64 << 10
)

// readMemory is ParseMemory on a stream. Prometheus text is read line by
// line: a page costs one line buffer however long it is.
func readMemory(r io.Reader, contentType string, used, max MetricSelector) (usedBytes, maxBytes int64, err error) {
	br := bufio.NewReaderSize(r, maxSeriesLine)
	mt, _, _ := mime.ParseMediaType(contentType)
	isJSON, lines := mt == "application/json", 0
	for !isJSON { // skip blanks to the first byte: '{' is JSON
		b, err := br.ReadByte()
		if err != nil {
			break
		}
		if b == '\n' {
			lines++
		}
		if b != ' ' && b != '\t' && b != '\r' && b != '\n' {
			br.UnreadByte()
			isJSON = b == '{'
			break
		}
	}
	if isJSON {
		data, err := io.ReadAll(io.LimitReader(br, maxJSONReport+1))
		switch {
		case err != nil:
			return 0, 0, fmt.Errorf("parse memory json: %w", err)
		case len(data) > maxJSONReport:
			return 0, 0, fmt.Errorf("parse memory json: %w: report over %d KiB", ErrMetricsTooLarge, maxJSONReport>>10)
		}
		var j jsonMemory
		if err := json.Unmarshal(bytes.TrimSpace(data), &j); err != nil {
			return 0, 0, fmt.Errorf("parse memory json: %w", err)
		}
		if j.Used == nil || j.Max == nil {
			return 0, 0, fmt.Errorf("parse memory json: heap_used_bytes and heap_max_bytes required: %w", ErrNoMemoryMetric)
		}
		if err := admission.CheckMemorySample(float64(*j.Used), float64(*j.Max)); err != nil {
			return 0, 0, fmt.Errorf("parse memory json: %w", err)
		}
		return *j.Used, *j.Max, nil
	}
	u, m, err := scanMemory(br, lines, used, max)
	if err != nil {
		return 0, 0, fmt.Errorf("parse memory metrics: %w", err)
	}
	return int64(u), int64(m), nil
}

// scanMemory sums the selected series of a Prometheus text page, line by
// line, parsing only the lines that start with a selected metric name;
// line numbers go on from n.
func scanMemory(br *bufio.Reader, n int, used, max MetricSelector) (u, m float64, err error) {
	var sc seriesScanner
	var uFound, mFound bool
	for {
		line, rerr := br.ReadSlice('\n')
		long := rerr == bufio.ErrBufferFull
		if rerr != nil && !long && rerr != io.EOF {
			return 0, 0, rerr
		}
		if len(line) == 0 && rerr == io.EOF {
			break
		}
		n++
		line = skipBlank(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'}))
		selected := len(line) > 0 && line[0] != '#' && (used.selects(line) || max.selects(line))
		if long {
			if selected {
				return 0, 0, fmt.Errorf("line %d: a selected series over %d KiB", n, maxSeriesLine>>10)
			}
			for rerr == bufio.ErrBufferFull { // the rest of a line nobody reads
				_, rerr = br.ReadSlice('\n')
			}
			if rerr != nil && rerr != io.EOF {
				return 0, 0, rerr
			}
		}
		if rerr == io.EOF && !selected {
			break
		}
		if !selected {
			continue
		}
		isU, isM := used.selects(line), max.selects(line)
		labels, v, err := sc.sample(line)
		if err != nil {
			return 0, 0, fmt.Errorf("line %d: %w", n, err)
		}
		if isU && used.matches(labels) {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				return 0, 0, fmt.Errorf("line %d: %s: value %g: %w", n, used, v, admission.ErrBadMemorySample)
			}
			u += v
			uFound = true
		}
		if isM && max.matches(labels) {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return 0, 0, fmt.Errorf("line %d: %s: value %g: %w", n, max, v, admission.ErrBadMemorySample)
			}
			mFound = true
			if v > 0 {
				m += v
			}
		}
	}
	if !uFound {
		return 0, 0, fmt.Errorf("%s: %w", used, ErrNoMemoryMetric)
	}
	if !mFound || m <= 0 {
		return 0, 0, fmt.Errorf("%s: %w", max, ErrNoMemoryMetric)
	}
	if err := admission.CheckMemorySample(u, m); err != nil {
		return 0, 0, err
	}
	return u, m, nil
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
	// MaxBytes is the largest answer read on the wire; unpacked (gzip) it
	// may be four times that. Flag -mop-probe-max-bytes, default
	// MaxMetricsWire (256 KiB), at most 16 MiB.
	MaxBytes int64
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
	d := DefaultMemoryProbeConfig()
	if cfg.UsedMetric == "" {
		cfg.UsedMetric = d.UsedMetric
	}
	if cfg.MaxMetric == "" {
		cfg.MaxMetric = d.MaxMetric
	}
	if cfg.Interval == 0 {
		cfg.Interval = d.Interval
	}
	if cfg.Interval < 0 {
		return nil, fieldError("MemoryProbeConfig.Interval", "must be positive")
	}
	if cfg.Timeout <= 0 || cfg.Timeout > cfg.Interval {
		cfg.Timeout = cfg.Interval
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = d.MaxBytes
	}
	if cfg.MaxBytes < 1<<10 || cfg.MaxBytes > maxMetricsLimit {
		return nil, fieldError("MemoryProbeConfig.MaxBytes", "must be between 1 KiB and %d MiB (got %d bytes)", maxMetricsLimit>>20, cfg.MaxBytes)
	}
	used, err := ParseMetricSelector(cfg.UsedMetric)
	if err != nil {
		return nil, fieldError("MemoryProbeConfig.UsedMetric", "%w", err)
	}
	max, err := ParseMetricSelector(cfg.MaxMetric)
	if err != nil {
		return nil, fieldError("MemoryProbeConfig.MaxMetric", "%w", err)
	}
	if clock == nil {
		clock = admission.MonoClock{}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment}
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		tr = dt.Clone()
	}
	tr.MaxResponseHeaderBytes = maxMetricsHeader
	tr.DisableCompression = true // gzip is asked for and decoded in fetch
	return &MemoryProbe{
		b: b, cfg: cfg, used: used, max: max, clock: clock,
		client: &http.Client{
			Transport: tr,
			Timeout:   cfg.Timeout,
			// The metrics URL is the operator's; a backend does not get
			// to send the probe elsewhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		logger: logger.With("component", "memprobe", "backend", b.id),
	}, nil
}

// Poll fetches the metrics once and, when they parse, feeds MOP.Observe.
// Any failure (no answer, a status other than 200, a redirect, an answer
// over the size limits, a page without the selected series or with a
// reading that cannot be true) is reported to MOP.ProbeFailed, which shows
// the backend's memory as unknown, and returned.
func (p *MemoryProbe) Poll(ctx context.Context) error {
	used, max, err := p.fetch(ctx)
	if err == nil {
		err = p.b.mop.Observe(p.clock.Now(), used, max)
	}
	if err != nil {
		err = fmt.Errorf("poll memory %s: %w", p.b.id, err)
		if ctx.Err() == nil { // a probe stopped (shutdown, reload) has not failed
			p.b.mop.ProbeFailed(err)
		}
	}
	return err
}

func (p *MemoryProbe) fetch(ctx context.Context) (used, max int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.URL, nil)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4, application/json;q=0.5")
	// Set here, gzip is not decoded by the transport: the probe decodes
	// it itself, within four times MaxBytes.
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			return 0, 0, fmt.Errorf("status %d: redirects are not followed", resp.StatusCode)
		}
		return 0, 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	wire := &capReader{r: resp.Body, limit: p.cfg.MaxBytes, what: "on the wire"}
	var r io.Reader = wire
	switch enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(wire)
		if err != nil {
			return 0, 0, fmt.Errorf("gzip: %w", err)
		}
		r = zr
	default:
		return 0, 0, fmt.Errorf("content encoding %.32q not supported", enc)
	}
	return readMemory(&capReader{r: r, limit: 4 * p.cfg.MaxBytes, what: "decoded"}, resp.Header.Get("Content-Type"), p.used, p.max)
}

// capReader reads at most limit bytes from r and fails with
// ErrMetricsTooLarge when r has more.
type capReader struct {
	r     io.Reader
	limit int64
	what  string // "on the wire" or "decoded"
	n     int64
}

func (c *capReader) Read(b []byte) (int, error) {
	if c.n > c.limit {
		return 0, c.tooLarge()
	}
	if room := c.limit + 1 - c.n; int64(len(b)) > room {
		b = b[:room]
	}
	n, err := c.r.Read(b)
	c.n += int64(n)
	if c.n > c.limit {
		return n - int(c.n-c.limit), c.tooLarge()
	}
	return n, err
}

func (c *capReader) tooLarge() error {
	return fmt.Errorf("%w: over %d KiB %s", ErrMetricsTooLarge, c.limit>>10, c.what)
}

// Run polls every Interval until ctx is done. Failures are logged at most
// once per state change, not per poll.
func (p *MemoryProbe) Run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	defer p.client.CloseIdleConnections()
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
