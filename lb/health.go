package lb

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// ProbeResult is the verdict of one active health probe.
type ProbeResult uint8

// Probe verdicts.
const (
	// ProbeUp: the backend answered well.
	ProbeUp ProbeResult = iota
	// ProbeBusy: the backend is alive but asks for no new work (an HTTP
	// health answer of 429, as Oracle Health Insurance's memory states
	// give it). It counts as up for rise/fall; the backend drains.
	ProbeBusy
	// ProbeDown: no answer, or an answer that says the backend is unwell.
	ProbeDown
)

var probeNames = [...]string{"up", "busy", "down"}

// String returns "up", "busy" or "down".
func (r ProbeResult) String() string {
	if int(r) < len(probeNames) {
		return probeNames[r]
	}
	return fmt.Sprintf("probe(%d)", r)
}

// Prober checks one backend once. It must return when ctx is done; the
// error, if any, says why a probe is down and is only logged.
type Prober interface {
	Probe(ctx context.Context, b *Backend) (ProbeResult, error)
}

// ProberFunc adapts a function to Prober.
type ProberFunc func(ctx context.Context, b *Backend) (ProbeResult, error)

// Probe implements Prober.
func (f ProberFunc) Probe(ctx context.Context, b *Backend) (ProbeResult, error) { return f(ctx, b) }

// HTTPProber sends GET Path to the backend over HTTP/1.1 (over TLS, with
// the backend's own settings, when Backend.TLS is set): 2xx and
// 3xx are up, 429 is busy, anything else (or no answer within the probe's
// timeout) is down. With AnyBelow500 every status below 500 but 429 is up.
//
// Unlike TCPProber it proves that the backend answers: a backend that
// accepts connections and never answers (a black hole: hung threads, a
// full accept queue behind a live socket) passes a TCP connect and fails
// this probe on its timeout.
type HTTPProber struct {
	// Path is the request path, e.g. "/healthz"; empty is "/".
	Path string
	// AnyBelow500 counts any answer below 500 (but 429) as up: for a path
	// the backend was not configured to answer (the default GET /, which
	// an API may answer 401 or 404), where any answer proves the backend
	// alive. Leave it false for a real health endpoint, whose 404 means
	// the wrong service is listening.
	AnyBelow500 bool
	// Client sends the probe; nil uses a client without keep-alive, so a
	// probe also proves that new connections (and, for a TLS backend, TLS
	// handshakes verified as requests' are) are accepted.
	Client *http.Client
}

// tlsProbeClient returns the probe client of a backend spoken to over
// TLS with cfg: without keep-alive, as defaultProbeClient, one per
// configuration (a backend's configuration lives as long as its
// generation), so that its session cache lets probes resume.
func tlsProbeClient(cfg *tls.Config) *http.Client {
	if c, ok := tlsProbeClients.Load(cfg); ok {
		return c.(*http.Client)
	}
	c, _ := tlsProbeClients.LoadOrStore(cfg, &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true, Proxy: nil, TLSClientConfig: cfg, ForceAttemptHTTP2: false},
		CheckRedirect: defaultProbeClient.CheckRedirect,
	})
	return c.(*http.Client)
}

// tlsProbeClients maps a backend's *tls.Config to its probe client.
// Entries are few (one per TLS backend and generation) and small;
// forgetTLSProbeClient drops a stopped generation's.
var tlsProbeClients sync.Map

// forgetTLSProbeClient drops the probe client of cfg.
func forgetTLSProbeClient(cfg *tls.Config) {
	if cfg != nil {
		tlsProbeClients.Delete(cfg)
	}
}

var defaultProbeClient = &http.Client{
	Transport:     &http.Transport{DisableKeepAlives: true, Proxy: nil},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// Probe implements Prober.
func (p HTTPProber) Probe(ctx context.Context, b *Backend) (ProbeResult, error) {
	c := p.Client
	scheme := "http://"
	if b.tls != nil {
		scheme = "https://"
	}
	switch {
	case c != nil:
	case b.tls != nil:
		c = tlsProbeClient(b.tls)
	default:
		c = defaultProbeClient
	}
	path := p.Path
	if path == "" {
		path = "/"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+b.addr+path, nil)
	if err != nil {
		return ProbeDown, fmt.Errorf("probe %s: %w", b.id, err)
	}
	req.Header.Set("User-Agent", "sluice-health")
	resp, err := c.Do(req)
	if err != nil {
		return ProbeDown, fmt.Errorf("probe %s: %w", b.id, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		return ProbeBusy, nil
	case resp.StatusCode >= 200 && resp.StatusCode < 400:
		return ProbeUp, nil
	case p.AnyBelow500 && resp.StatusCode < 500:
		return ProbeUp, nil
	}
	return ProbeDown, fmt.Errorf("probe %s: status %d", b.id, resp.StatusCode)
}

// TCPProber is up when a TCP connection to the backend opens (and, for a
// backend with TLS, its TLS handshake succeeds with the backend's own
// settings, certificate verified). It cannot
// tell a black hole (accepts, never answers) from a working backend: use
// it only where no application probe exists; HTTP backends get
// HTTPProber.
type TCPProber struct{}

// Probe implements Prober.
func (TCPProber) Probe(ctx context.Context, b *Backend) (ProbeResult, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", b.addr)
	if err != nil {
		return ProbeDown, fmt.Errorf("probe %s: %w", b.id, err)
	}
	defer c.Close()
	if b.tls != nil {
		tc := tls.Client(c, b.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			return ProbeDown, fmt.Errorf("probe %s: tls: %w", b.id, err)
		}
	}
	return ProbeUp, nil
}

// HealthConfig configures active health checks.
type HealthConfig struct {
	// Interval between probes of one backend. Flag -health-interval.
	Interval time.Duration
	// Timeout of one probe, at most Interval. Flag -health-timeout.
	Timeout time.Duration
	// Rise is how many probes in a row must succeed to bring a down
	// backend up. Flag -health-rise.
	Rise int
	// Fall is how many probes in a row must fail to take an up backend
	// down. Flag -health-fall.
	Fall int
	// Panic is the share of a pool's backends, in (0, 1], that may be
	// down by their probes alone before the pool panics (Pool.Panicking):
	// past it, new work goes to every backend traffic has not shown dead,
	// so probes alone never empty a pool. 1 never panics. Flag
	// -health-panic (a percentage), default 0.5.
	Panic float64
	// Clock gives the monotonic time probes are stamped with; it must be
	// the clock of the front end that reports answers (Backend.Release,
	// Backend.Served), since a probe verdict is compared with them.
	// Default admission.MonoClock.
	Clock admission.Clock
	// Events receives a backend.state event on every change the checks
	// make (down, up, draining by a 429 answer, no longer draining, pool
	// panic on and off). May be nil.
	Events admission.EventSink
}

// DefaultHealthConfig returns the defaults of every field: the one place
// they are written (flags take their defaults from here; zero fields are
// filled from here, a Timeout over Interval shortened to it).
func DefaultHealthConfig() HealthConfig {
	return HealthConfig{Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 3, Panic: 0.5}
}

func (c *HealthConfig) setDefaults() {
	d := DefaultHealthConfig()
	if c.Interval == 0 {
		c.Interval = d.Interval
	}
	if c.Timeout == 0 {
		c.Timeout = min(d.Timeout, c.Interval)
	}
	if c.Rise == 0 {
		c.Rise = d.Rise
	}
	if c.Fall == 0 {
		c.Fall = d.Fall
	}
	if c.Panic == 0 {
		c.Panic = d.Panic
	}
	if c.Clock == nil {
		c.Clock = admission.MonoClock{}
	}
}

// Validate reports the first invalid field as a *FieldError.
func (c HealthConfig) Validate() error {
	switch {
	case c.Interval < 0:
		return fieldError("HealthConfig.Interval", "must be positive")
	case c.Timeout < 0 || c.Timeout > c.Interval:
		return fieldError("HealthConfig.Timeout", "must be in (0, Interval] (got %s)", c.Timeout)
	case c.Rise < 1:
		return fieldError("HealthConfig.Rise", "must be >= 1 (got %d)", c.Rise)
	case c.Fall < 1:
		return fieldError("HealthConfig.Fall", "must be >= 1 (got %d)", c.Fall)
	case c.Panic < 0 || c.Panic > 1:
		return fieldError("HealthConfig.Panic", "must be in (0%%, 100%%] (got %g%%)", c.Panic*100)
	}
	return nil
}

// HealthChecker probes backends on a ticker and moves them up and down
// with rise/fall counts. Backends start up: a balancer that starts before
// its backends fails over on the first connect errors (passive ejection)
// and the checker takes them down after Fall probes. A backend added at
// run time starts Unknown (Backend.SetUnknown): its first probe decides.
//
// A probe verdict of down is advisory against real traffic: a backend
// that keeps answering real requests while its probes fail is not down
// (Backend.State), and affinity traffic ignores probes altogether.
type HealthChecker struct {
	cfg    HealthConfig
	logger *slog.Logger
	checks []*healthCheck
	// pools are the pools whose panic the checker decides, each over its
	// own members (NewPoolHealthChecker's one, a Generation's all); none:
	// no panic threshold.
	pools []*Pool
	pmu   sync.Mutex // serialises the panic verdicts
}

type healthCheck struct {
	b      *Backend
	prober Prober
	mu     sync.Mutex // serialises Observe for one backend
	ok     int        // consecutive successes
	bad    int        // consecutive failures
}

// NewHealthChecker validates cfg (zero fields take their defaults).
func NewHealthChecker(cfg HealthConfig, logger *slog.Logger) (*HealthChecker, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &HealthChecker{cfg: cfg, logger: logger.With("component", "health")}, nil
}

// NewPoolHealthChecker is the one way a front end wires health checks: a
// checker over every backend of pool, each probed with prober(b) (HTTP:
// an HTTP GET or a TCP connect; SIP: an OPTIONS ping). A front end builds
// one per backend set and stops it when the set is replaced.
func NewPoolHealthChecker(cfg HealthConfig, pool *Pool, prober func(*Backend) Prober, logger *slog.Logger) (*HealthChecker, error) {
	h, err := NewHealthChecker(cfg, logger)
	if err != nil {
		return nil, err
	}
	for _, b := range pool.Backends() {
		h.Add(b, prober(b))
	}
	h.pools = []*Pool{pool}
	return h, nil
}

// Add registers b to be probed with p. Call it before Run.
func (h *HealthChecker) Add(b *Backend, p Prober) {
	h.checks = append(h.checks, &healthCheck{b: b, prober: p})
}

// Run probes every registered backend each Interval, each on its own
// goroutine, until ctx is done; it returns when they have all stopped.
func (h *HealthChecker) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, c := range h.checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(h.cfg.Interval)
			defer t.Stop()
			for {
				h.probe(ctx, c)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}()
	}
	wg.Wait()
}

// ProbeAll probes every backend once, one after another, synchronously:
// for tests, whose probers and event sinks see one probe at a time. A
// generation's first round is parallel (probeSome).
func (h *HealthChecker) ProbeAll(ctx context.Context) {
	for _, c := range h.checks {
		h.probe(ctx, c)
	}
}

// firstRoundParallel bounds the probes of a generation's synchronous
// first round running at once: enough that the round takes about one
// probe timeout for any usual number of new backends, few enough that a
// reload does not open hundreds of connections in one burst.
const firstRoundParallel = 32

// probeSome probes each of checks once, at most firstRoundParallel at a
// time, and waits for them all: a round over backends that do not answer
// takes about one Timeout, not one per backend.
func (h *HealthChecker) probeSome(ctx context.Context, checks []*healthCheck) {
	if len(checks) == 1 {
		h.probe(ctx, checks[0])
		return
	}
	sem := make(chan struct{}, firstRoundParallel)
	var wg sync.WaitGroup
	for _, c := range checks {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			h.probe(ctx, c)
		}()
	}
	wg.Wait()
}

func (h *HealthChecker) probe(ctx context.Context, c *healthCheck) {
	start := h.cfg.Clock.Now()
	pctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	r, err := c.prober.Probe(pctx, c.b)
	cancel()
	if ctx.Err() != nil {
		return // shutting down: not the backend's fault
	}
	h.observe(c, r, err, start)
	h.checkPanic()
}

// observe applies one probe verdict, of a probe started at start, to c's
// backend.
func (h *HealthChecker) observe(c *healthCheck, r ProbeResult, err error, start int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.b
	if b.unknown.Load() {
		// Added at run time: the first probe decides, no rise or fall.
		b.announce.Store(false)
		if r == ProbeDown {
			c.ok, c.bad = 0, h.cfg.Fall
			b.MarkProbeDown(start)
			b.setProbeErr(err)
			h.logger.Warn("new backend down: its first health check failed", "backend", b.id, "err", err)
			h.event(b, fmt.Sprintf("backend %s (new) down: its first health check failed: %v", b.id, err))
			return
		}
		b.unknown.Store(false)
		h.logger.Info("new backend up: its first health check passed", "backend", b.id)
		h.event(b, "backend "+b.id+" (new) takes new work: its first health check passed")
	}
	if b.announce.CompareAndSwap(true, false) {
		// Added at run time and shown serving before this probe's verdict
		// (a SIP ping's answer, or real traffic, ends Unknown at once):
		// say so, as for a first probe passed.
		h.logger.Info("new backend up: it answered before its first health check ended", "backend", b.id)
		h.event(b, "backend "+b.id+" (new) takes new work: it answered")
	}
	// A failed probe says nothing about busyness: keep the last answer.
	if busy := r == ProbeBusy; r != ProbeDown && b.probeBusy.Load() != busy {
		b.SetProbeBusy(busy)
		h.logger.Info("backend busy changed", "backend", b.id, "busy", busy)
		if busy {
			h.event(b, "backend "+b.id+" draining: its health check answered 429 (no new work, affinity continues)")
		} else {
			h.event(b, "backend "+b.id+" takes new work again: its health check no longer answers 429")
		}
	}
	if r == ProbeDown {
		c.ok = 0
		c.bad++
		if c.bad < h.cfg.Fall {
			return
		}
		// Real answers overrule the probes only while they keep coming:
		// one within the interval before this failed probe started. A
		// backend that dies stops answering, and is down after Fall
		// probes as it always was (with Fall >= 3; one probe later with
		// Fall 2), whatever it answered before.
		since := start - int64(h.cfg.Interval)
		b.setProbeErr(err)
		if b.probeDown.Load() {
			if b.probeFrom.Load() < since {
				b.probeFrom.Store(since)
			}
			return
		}
		b.MarkProbeDown(since)
		h.logger.Warn("backend down by its health checks (real answers overrule them)", "backend", b.id, "fails", c.bad, "err", err)
		h.event(b, fmt.Sprintf("backend %s down after %d failed health checks, unless it answers real traffic: %v", b.id, c.bad, err))
		return
	}
	c.bad = 0
	c.ok++
	if c.ok >= h.cfg.Rise && b.probeDown.Load() {
		b.SetProbeDown(false)
		b.probeErr.Store(nil)
		h.logger.Info("backend up", "backend", b.id, "passes", c.ok)
		h.event(b, fmt.Sprintf("backend %s up after %d passed health checks", b.id, c.ok))
	}
}

// checkPanic puts each pool in panic when more than Panic of its backends
// that would take new work but for their probes (not shown dead by
// traffic, not disabled, not draining, not Unknown) are down by their
// probes alone, and out of it when no longer; each change is logged and
// sent as an event. It runs after every probe.
func (h *HealthChecker) checkPanic() {
	if len(h.pools) == 0 {
		return
	}
	h.pmu.Lock()
	defer h.pmu.Unlock()
	now := h.cfg.Clock.Now()
	for _, p := range h.pools {
		h.checkPoolPanic(p, now)
	}
}

// checkPoolPanic is checkPanic for one pool; the caller holds pmu.
func (h *HealthChecker) checkPoolPanic(p *Pool, now int64) {
	var down, counted int
	for _, b := range p.backends {
		// Only backends that would take new work but for their probes
		// count: not shown dead by traffic, not disabled, not draining
		// (operator, 429, Retry-After), not Unknown.
		if b.deadByTraffic(now) || b.unknown.Load() || b.draining(now) {
			continue
		}
		counted++
		if b.downByProbes() {
			down++
		}
	}
	on := down > 0 && float64(down) > h.cfg.Panic*float64(counted)
	if p.panicking.Load() == on {
		return
	}
	p.panicking.Store(on)
	step := int32(-1)
	if on {
		step = 1
	}
	for _, b := range p.backends {
		b.panicPools.Add(step)
	}
	if on {
		p.panics.Add(1)
		msg := fmt.Sprintf("pool %s in panic: %d of %d backends down by their health checks alone (over %g%%); new work goes to every backend not shown dead by traffic", p.name, down, counted, h.cfg.Panic*100)
		h.logger.Warn(msg, "pool", p.name)
		h.poolEvent(p, msg)
	} else {
		msg := fmt.Sprintf("pool %s out of panic: %d of %d backends down by their health checks alone", p.name, down, counted)
		h.logger.Info(msg, "pool", p.name)
		h.poolEvent(p, msg)
	}
}

// poolEvent sends msg about p: subject "PROTO pool" for the default pool
// (as before pools had names), "PROTO pool NAME" for the others.
func (h *HealthChecker) poolEvent(p *Pool, msg string) {
	if h.cfg.Events == nil || len(p.backends) == 0 {
		return
	}
	subject := p.backends[0].proto + " pool"
	if p.name != DefaultPool {
		subject += " " + p.name
	}
	h.cfg.Events(admission.Event{Time: time.Now(), Kind: admission.EventBackendState, Subject: subject, Message: msg})
}

func (h *HealthChecker) event(b *Backend, msg string) {
	if h.cfg.Events != nil {
		h.cfg.Events(admission.Event{Time: time.Now(), Kind: admission.EventBackendState, Subject: b.proto + " " + b.id, Message: msg})
	}
}

// check returns the registered check of b, for tests.
func (h *HealthChecker) check(b *Backend) *healthCheck {
	for _, c := range h.checks {
		if c.b == b {
			return c
		}
	}
	return nil
}
