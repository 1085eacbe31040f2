package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/persist"
	lbsip "github.com/sluicelb/sluice/sip"
)

func init() {
	register("run", "run the balancer: HTTP and SIP front ends, admission control, admin listener", runRun)
}

// runOptions holds the flags of `sluice run`.
type runOptions struct {
	http         lbhttp.Config
	httpBackends listFlag
	trusted      listFlag
	policy       string
	health       lb.HealthConfig
	passive      lb.PassiveConfig
	arm          listFlag
	mop          admission.MOPConfig
	mopMaxHeap   fraction
	mopReject    int
	mopProbe     lb.MemoryProbeConfig
	mem          admission.MemoryConfig
	memLimit     byteSize
	memLow       fraction
	memLower     fraction
	memCritical  fraction
	keyFile      string
	backendsFile string
	// The backends given by flags; -backends-file adds to them.
	flagHTTPBackends, flagSIPBackends []string
	persist                           persist.Config
	adminListen                       string
	logLevel                          string
	shutdown                          time.Duration
	cpuProfile                        string
	sip                               *sipOptions
}

// newRunFlags defines the flags of `sluice run` on fs and returns where
// they land, and the names whose SLUICE_* twin applyEnv handles (the SIP
// flags read their twins themselves).
func newRunFlags(fs *flag.FlagSet) (*runOptions, []string) {
	o := &runOptions{}
	h := &o.http
	fs.StringVar(&h.Listen, "http-listen", ":8080", "HTTP listen address")
	o.httpBackends.check = func(s string) error { _, err := lbhttp.ParseBackend(s); return err }
	fs.Var(&o.httpBackends, "http-backend", "HTTP `backend` ADDR[,weight=N][,metrics=URL][,health=PATH][,id=NAME] (repeatable; none: no HTTP front end)")
	o.trusted.check = func(s string) error { _, err := lbhttp.ParseTrustedProxies(s); return err }
	fs.Var(&o.trusted, "http-trusted-proxy", "`CIDR` whose X-Forwarded-For/Forwarded are kept and appended to (repeatable, or comma-separated)")
	fs.StringVar(&h.StickyCookie, "http-sticky-cookie", "SLUICE", "name of the signed sticky cookie; - disables it")
	fs.DurationVar(&h.StickyTTL, "http-sticky-ttl", time.Hour, "lifetime of the sticky cookie (renewed past half)")
	fs.StringVar(&h.AppCookie, "http-sticky-app-cookie", "", "application session cookie to learn from backends' Set-Cookie, e.g. JSESSIONID")
	fs.DurationVar(&h.AppCookieTTL, "http-sticky-app-ttl", 30*time.Minute, "a learned session id pins its backend this long after last use")
	fs.IntVar(&h.AppCookieMax, "http-sticky-app-max", 100000, "most learned session ids kept")
	fs.StringVar(&h.HashKey, "http-hash-key", "source", "key of -lb-policy consistent-hash: source, header:NAME or cookie:NAME")
	fs.IntVar(&h.MaxConns, "http-backend-max-conns", 1024, "most connections to each HTTP backend")
	fs.DurationVar(&h.ConnWait, "http-backend-conn-wait", 100*time.Millisecond, "wait for a free backend connection before answering 503")
	fs.DurationVar(&h.ConnectTimeout, "http-connect-timeout", 2*time.Second, "timeout dialing a backend")
	fs.DurationVar(&h.BackendTimeout, "http-backend-timeout", 30*time.Second, "timeout writing a request to and reading the answer from a backend (504 past it)")
	fs.DurationVar(&h.BackendIdle, "http-backend-idle", 30*time.Second, "close backend connections idle this long (keep it below the backends' keep-alive timeout)")
	fs.DurationVar(&h.ClientReadTimeout, "http-client-timeout", 60*time.Second, "timeout reading a client request")
	fs.DurationVar(&h.ClientIdle, "http-client-idle", 120*time.Second, "close idle client connections after this long")
	fs.IntVar(&h.StreamThreshold, "http-stream-threshold", 1<<20, "request bodies larger than this many bytes are streamed to the backend, not buffered")
	fs.IntVar(&h.ResponseBuffer, "http-response-buffer", 64<<10, "fasthttp engine: answers to body-less idempotent requests up to this many bytes are buffered, larger ones re-requested and streamed (-1: always stream); the loop engine relays every answer as it arrives")
	fs.StringVar(&h.Engine, "http-engine", lbhttp.DefaultEngine, "how client connections are served: loop (epoll event loops; Linux) or fasthttp (a goroutine per connection); the loop hands HTTP/1.0, chunked or large uploads, Upgrade and Expect to fasthttp")
	fs.IntVar(&h.Loops, "http-loops", 0, "event loops of the loop engine (0: GOMAXPROCS)")

	fs.StringVar(&o.policy, "lb-policy", "round-robin", "HTTP selection of new work: round-robin, weighted-round-robin, least-outstanding, p2c, consistent-hash")
	fs.DurationVar(&o.health.Interval, "health-interval", 2*time.Second, "active health check period per backend (0 disables)")
	fs.DurationVar(&o.health.Timeout, "health-timeout", time.Second, "timeout of one health probe")
	fs.IntVar(&o.health.Rise, "health-rise", 2, "passing probes in a row that bring a backend up")
	fs.IntVar(&o.health.Fall, "health-fall", 3, "failing probes in a row that take a backend down")
	fs.IntVar(&o.passive.MaxFails, "health-max-fails", 3, "consecutive connect errors, timeouts or 5xx that eject a backend (0 disables)")
	fs.DurationVar(&o.passive.Cooldown, "health-cooldown", 10*time.Second, "how long an ejected backend stays out")

	o.arm.check = func(s string) error { _, err := admission.ParseRule(s); return err }
	fs.Var(&o.arm, "arm", "ARM `rule` name=N,limit=100/s[,proto=,method=,host=,path=,action=delay|reject|log,queue=,wait=,qualify=,low=,lower=] (repeatable)")
	o.mopMaxHeap = 0.85
	fs.Var(&o.mopMaxHeap, "mop-max-heap", "MOP memory ceiling of a backend, fraction of its max memory (0.85) or percent (85)")
	fs.DurationVar(&o.mop.Window, "mop-window", 60*time.Second, "MOP averaging window: at least as long as most sessions live")
	fs.Float64Var(&o.mop.InitialRate, "mop-initial-rate", 10, "MOP allowed new work per second before anything is learned")
	fs.IntVar(&o.mopReject, "mop-reject-code", 503, "HTTP status when every backend's MOP refuses")
	fs.StringVar(&o.mopProbe.UsedMetric, "mop-used-metric", lb.DefaultUsedMetric, "Prometheus series summed as a backend's used memory")
	fs.StringVar(&o.mopProbe.MaxMetric, "mop-max-metric", lb.DefaultMaxMetric, "Prometheus series summed as a backend's maximum memory")
	fs.DurationVar(&o.mopProbe.Interval, "mop-probe-interval", time.Second, "how often a backend's metrics= URL is polled")

	fs.Var(&o.memLimit, "mem-limit", "memory limit of this process in bytes (e.g. 512MiB); default GOMEMLIMIT; without either, memory states are off")
	o.memLow, o.memLower, o.memCritical = 0.70, 0.80, 0.90
	fs.Var(&o.memLow, "mem-low", "memory state Low at this share of the limit (no new background work; /healthz 429)")
	fs.Var(&o.memLower, "mem-lower", "memory state Lower at this share (new work refused 429)")
	fs.Var(&o.memCritical, "mem-critical", "memory state Critical at this share (in-flight new work ended 503)")

	fs.StringVar(&o.keyFile, "affinity-key-file", "", "key, or key ring of \"ID HEXKEY\" lines (newest last), of sticky cookies and SIP tokens; created when missing (default: affinity.key in -data-dir)")
	fs.StringVar(&o.backendsFile, "backends-file", "", "file of backends, one \"http SPEC\" or \"sip SPEC\" a line, added to the flags' and re-read on SIGHUP")
	persistFlags(fs, &o.persist)
	fs.StringVar(&o.adminListen, "admin-listen", "127.0.0.1:9090", "admin listener for /healthz and /status (empty disables)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.shutdown, "drain-timeout", 10*time.Second, "on SIGTERM, how long in-flight requests and affinity traffic may finish (new work is refused at once)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile to this file (benchmarks)")

	var own []string
	for n := range flagNames(fs) {
		own = append(own, n)
	}
	o.sip = addSIPFlags(fs)
	return o, own
}

// runRun is the run command: it serves until SIGINT or SIGTERM.
// A second SIGINT or SIGTERM ends the process at once, without waiting
// for the drain or the final save.
func runRun(args []string, stdout, stderr io.Writer) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		cancel()
		s, ok = <-sigs
		if ok {
			fmt.Fprintf(stderr, "sluice run: second %v: exiting now, without finishing the drain or the final save\n", s)
			os.Exit(1)
		}
	}()
	return run(ctx, args, stdout, stderr, nil)
}

// runHooks lets tests learn the bound addresses.
type runHooks struct {
	ready func(httpAddr, adminAddr net.Addr)
}

// run parses args, wires the parts, serves until ctx is done and then
// shuts down gracefully. It returns 2 for a bad flag, 1 for a failure to
// start.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, hooks *runHooks) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o, own := newRunFlags(fs)
	fs.Usage = func() { groupedUsage(fs.Output(), "run", fs) }
	if err := applyEnv(fs, own, os.LookupEnv); err != nil {
		fmt.Fprintln(stderr, "sluice run:", err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice run: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	// The default -health-timeout (1s) follows a shorter -health-interval.
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if !explicit["health-timeout"] && o.health.Interval > 0 && o.health.Timeout > o.health.Interval {
		o.health.Timeout = o.health.Interval
	}
	p, err := o.build(stderr)
	if err != nil {
		fmt.Fprintln(stderr, "sluice run:", err)
		return 2
	}
	// Learned rates are restored before anything listens.
	if err := p.openStore(o); err != nil {
		p.logger.Error("start failed", "err", err)
		fmt.Fprintln(stderr, "sluice run:", err)
		return 1
	}
	if err := p.mountMetrics(); err != nil {
		fmt.Fprintln(stderr, "sluice run:", err)
		p.closeStore()
		return 1
	}
	if err := p.start(ctx, o, hooks); err != nil {
		p.logger.Error("start failed", "err", err)
		fmt.Fprintln(stderr, "sluice run:", err)
		p.stop(o.shutdown)
		p.closeStore()
		return 1
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for wait := true; wait; {
		select {
		case <-ctx.Done():
			wait = false
		case <-hup:
			if err := p.reload(o); err != nil {
				p.logger.Error("reload failed: backends unchanged", "err", err)
			} else {
				p.logger.Info("reloaded backends", "file", o.backendsFile)
			}
		}
	}
	left := p.drain(o.shutdown)
	p.logger.Info("shutting down", "timeout", left)
	p.stop(left)
	p.closeStore()
	return 0
}

// plan is everything built from the flags before anything listens.
type plan struct {
	logger         *slog.Logger
	clock          admission.Clock
	events         admission.EventSink
	eventLog       *eventLog
	store          *persist.Store
	saver          *persist.Saver
	forward        *prometheus.HistogramVec // forwarding latency, by protocol
	mem            *admission.Memory
	prevGoMemLimit int64 // Go memory limit before -mem-limit set it; 0: untouched
	ctrl           *admission.Controller
	signer         *lb.Signer
	httpSrv        *lbhttp.Server
	httpGen        *httpGen          // HTTP backends with their health checks and probes
	probes         []*lb.MemoryProbe // SIP backends' memory probes
	sipProbeCancel context.CancelFunc
	mopByKey       map[string]*admission.MOP
	ctx            context.Context // of the running plan, for reloads
	sipSrv         *lbsip.Server
	admin          *admin.Server

	// mops lists every backend's MOP limiter by its persist key
	// (persist.MOPKey(proto, addr)), built before any front end serves:
	// the place where learned states are imported at start and exported
	// for saving.
	mops []mopEntry

	cpuProfile *os.File
	stopFronts []func(context.Context) error // front ends, in start order
	background sync.WaitGroup
	cancel     context.CancelFunc
}

type mopEntry struct {
	key string
	mop *admission.MOP
}

// build validates the options and constructs every part. Errors name the
// flag.
func (o *runOptions) build(stderr io.Writer) (*plan, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", o.logLevel)
	}
	p := &plan{
		logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl})),
		clock:  admission.MonoClock{},
	}
	p.eventLog = &eventLog{logger: p.logger}
	p.events = p.eventLog.emit
	p.forward = newForwardHistogram()
	o.flagHTTPBackends = append([]string{}, o.httpBackends.values...)
	o.flagSIPBackends = append([]string{}, o.sip.backends...)
	if o.backendsFile != "" {
		h, s, err := readBackendsFile(o.backendsFile)
		if err != nil {
			return nil, err
		}
		o.httpBackends.values = append(o.httpBackends.values, h...)
		o.sip.backends = append(o.sip.backends, s...)
	}
	if len(o.httpBackends.values) == 0 && !o.sip.enabled() {
		return nil, errors.New("no backends: give -http-backend and/or -sip-backend (or -backends-file)")
	}
	if err := o.checkPositive(); err != nil {
		return nil, err
	}

	var err error
	o.mem = admission.MemoryConfig{Limit: int64(o.memLimit), Low: float64(o.memLow), Lower: float64(o.memLower), Critical: float64(o.memCritical)}
	if p.mem, err = admission.NewMemory(o.mem, nil, p.events); err != nil {
		return nil, err
	}
	// The runtime collects and returns memory to stay under the Low share of
	// -mem-limit, so that garbage never raises the memory state; only live
	// memory does.
	if rl := o.mem.RuntimeLimit(); rl > 0 {
		p.prevGoMemLimit = debug.SetMemoryLimit(rl)
		p.logger.Info("go memory limit set from -mem-limit", "limit_bytes", rl, "mem_limit_bytes", o.mem.Limit, "previous_bytes", p.prevGoMemLimit)
	}
	var rules []admission.RuleConfig
	for _, s := range o.arm.values {
		rc, err := admission.ParseRule(s)
		if err != nil {
			return nil, err
		}
		rules = append(rules, rc)
	}
	if p.ctrl, err = admission.NewController(admission.ControllerConfig{Rules: rules, MOPRejectCode: o.mopReject, Events: p.events}, p.mem, p.clock.Now()); err != nil {
		return nil, err
	}
	o.mop.MaxHeap = float64(o.mopMaxHeap)
	if err := o.checkMOP(); err != nil {
		return nil, err
	}

	keyFile := o.keyFile
	if keyFile == "" {
		keyFile = defaultKeyFile(o.persist.Dir)
	}
	ring, err := lb.LoadOrCreateKeyRing(keyFile)
	if err != nil {
		return nil, fmt.Errorf("-affinity-key-file: %w", err)
	}
	if p.signer, err = lb.NewRingSigner(ring); err != nil {
		return nil, fmt.Errorf("-affinity-key-file %s: %w", keyFile, err)
	}

	if len(o.httpBackends.values) > 0 {
		if err := p.buildHTTP(o); err != nil {
			return nil, err
		}
	}
	if o.sip.enabled() {
		if err := p.buildSIP(o); err != nil {
			return nil, err
		}
	}
	if o.adminListen != "" {
		p.admin = admin.New(p.logger)
		p.admin.Handle("GET /healthz", p.healthz())
		src := admin.Source{Memory: p.mem, Controller: p.ctrl, Backends: p.backendStatus, Storage: p.storageStatus}
		p.admin.Handle("GET /status", admin.StatusHandler(src))
		// The dashboard at / samples src every second while the admin
		// listener serves; its buttons drain and reweigh the pools in force.
		pools := func() []*lb.Pool {
			var pools []*lb.Pool
			if p.httpSrv != nil {
				pools = append(pools, p.httpSrv.Pool())
			}
			return append(pools, p.sipPool())
		}
		admin.NewDashboard(admin.DashboardConfig{Source: src, Control: admin.PoolControl(pools), MOPMaxHeap: o.mop.MaxHeap, Events: p.events}, p.logger).Register(p.admin)
	}
	return p, nil
}

// defaultKeyFile is where the affinity key lives when -affinity-key-file
// is not given: in the data directory, where -data-reset leaves it, so that
// sticky cookies and SIP dialogs issued before a reset stay valid.
func defaultKeyFile(dataDir string) string {
	return filepath.Join(dataDir, persist.AffinityKeyFile)
}

// checkPositive rejects zero or negative values of the flags whose zero
// value the packages would silently replace by their default.
func (o *runOptions) checkPositive() error {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"-mop-initial-rate", o.mop.InitialRate > 0},
		{"-mop-window", o.mop.Window > 0},
		{"-mop-probe-interval", o.mopProbe.Interval > 0},
		{"-health-timeout", o.health.Timeout > 0},
		{"-health-rise", o.health.Rise > 0},
		{"-health-fall", o.health.Fall > 0},
		{"-health-cooldown", o.passive.Cooldown > 0},
		{"-health-max-fails", o.passive.MaxFails >= 0},
		{"-http-sticky-ttl", o.http.StickyTTL > 0},
		{"-http-sticky-app-ttl", o.http.AppCookieTTL > 0},
		{"-http-sticky-app-max", o.http.AppCookieMax > 0},
		{"-http-backend-max-conns", o.http.MaxConns > 0},
		{"-http-connect-timeout", o.http.ConnectTimeout > 0},
		{"-http-backend-timeout", o.http.BackendTimeout > 0},
		{"-http-backend-idle", o.http.BackendIdle > 0},
		{"-http-client-timeout", o.http.ClientReadTimeout > 0},
		{"-http-client-idle", o.http.ClientIdle > 0},
		{"-http-stream-threshold", o.http.StreamThreshold > 0},
		{"-drain-timeout", o.shutdown > 0},
	} {
		if !c.ok {
			return fmt.Errorf("%s must be positive", c.name)
		}
	}
	return nil
}

// checkMOP validates the MOP flags once, before any backend needs them.
func (o *runOptions) checkMOP() error {
	c := o.mop
	c.Name = "check"
	_, err := admission.NewMOP(c)
	return err
}

// newMOP builds the limiter of one backend with a memory probe.
func (p *plan) newMOP(o *runOptions, proto, id, addr string) (*admission.MOP, error) {
	key := persist.MOPKey(proto, addr)
	if m := p.mopByKey[key]; m != nil {
		return m, nil // a backend that stays across a reload keeps what it learned
	}
	c := o.mop
	c.Name = proto + " " + id
	c.Events = p.events
	m, err := admission.NewMOP(c)
	if err != nil {
		return nil, err
	}
	p.mops = append(p.mops, mopEntry{key: key, mop: m})
	if p.mopByKey == nil {
		p.mopByKey = map[string]*admission.MOP{}
	}
	p.mopByKey[key] = m
	return m, nil
}

func (p *plan) buildHTTP(o *runOptions) error {
	gen, err := p.newHTTPGen(o, o.httpBackends.values)
	if err != nil {
		return err
	}
	p.httpGen = gen
	for _, s := range o.trusted.values {
		nets, err := lbhttp.ParseTrustedProxies(s)
		if err != nil {
			return err
		}
		o.http.TrustedProxies = append(o.http.TrustedProxies, nets...)
	}
	o.http.Clock = p.clock
	hist := p.forward.WithLabelValues("http")
	o.http.ObserveForward = func(d time.Duration) { hist.Observe(d.Seconds()) }
	p.httpSrv, err = lbhttp.New(o.http, p.httpGen.pool, p.ctrl, p.signer, p.logger)
	return err
}

func (p *plan) buildSIP(o *runOptions) error {
	if o.sip.cfg.Listen == "" {
		o.sip.cfg.Listen = ":5060"
	}
	cfg, err := o.sip.config()
	if err != nil {
		return err
	}
	var mopErr error
	mops := p.sipMOPHook(o, &mopErr)
	hist := p.forward.WithLabelValues("sip")
	observe := func(d time.Duration) { hist.Observe(d.Seconds()) }
	p.sipSrv, err = lbsip.New(cfg, lbsip.Deps{Admission: p.ctrl, Signer: p.signer, Clock: p.clock, MOP: mops, ObserveForward: observe, Events: p.events}, p.logger)
	if err != nil {
		return err
	}
	if mopErr != nil {
		return mopErr
	}
	p.probes, err = p.sipProbesFor(o, cfg.Backends)
	return err
}

// start runs the background loops, binds the listeners and starts the
// front ends: the one place where front ends start.
func (p *plan) start(parent context.Context, o *runOptions, hooks *runHooks) error {
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		p.cpuProfile = f
	}
	ctx, cancel := context.WithCancel(parent)
	p.cancel = cancel
	p.goBackground(func() { p.mem.Run(ctx) })
	p.goBackground(func() { p.ctrl.Run(ctx, p.clock, 10*time.Millisecond) })
	p.ctx = ctx
	if p.httpGen != nil {
		p.startHTTPGen(p.httpGen)
	}
	p.startSIPProbes(p.probes)
	if _, limit := p.mem.Usage(); limit <= 0 {
		p.logger.Info("memory states off: set -mem-limit or GOMEMLIMIT")
	}

	var httpAddr, adminAddr net.Addr
	if p.admin != nil {
		ln, err := net.Listen("tcp", o.adminListen)
		if err != nil {
			return fmt.Errorf("-admin-listen %s: %w", o.adminListen, err)
		}
		adminAddr = ln.Addr()
		p.goBackground(func() {
			if err := p.admin.Serve(ln); err != nil {
				p.logger.Error("admin stopped", "err", err)
			}
		})
	}
	if p.httpSrv != nil {
		ln, err := net.Listen("tcp", o.http.Listen)
		if err != nil {
			return fmt.Errorf("-http-listen %s: %w", o.http.Listen, err)
		}
		httpAddr = ln.Addr()
		p.goBackground(func() {
			if err := p.httpSrv.Serve(ln); err != nil {
				p.logger.Error("http front end stopped", "err", err)
			}
		})
		p.stopFronts = append(p.stopFronts, p.httpSrv.Shutdown)
	}
	if p.sipSrv != nil {
		if err := p.sipSrv.Start(ctx); err != nil {
			return fmt.Errorf("start sip front end: %w", err)
		}
		p.stopFronts = append(p.stopFronts, func(context.Context) error { return p.sipSrv.Close() })
	}
	attrs := []any{}
	if httpAddr != nil {
		attrs = append(attrs, "http", httpAddr.String())
	}
	if p.sipSrv != nil {
		attrs = append(attrs, "sip", p.sipSrv.Addr().String())
	}
	if adminAddr != nil {
		attrs = append(attrs, "admin", adminAddr.String())
	}
	p.logger.Info("listening", attrs...)
	if hooks != nil && hooks.ready != nil {
		hooks.ready(httpAddr, adminAddr)
	}
	return nil
}

func (p *plan) goBackground(f func()) {
	p.background.Add(1)
	go func() {
		defer p.background.Done()
		f()
	}()
}

// stop ends the front ends (in-flight requests get up to timeout), then
// the admin listener and the background loops: the one place where front
// ends stop.
func (p *plan) stop(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for i := len(p.stopFronts) - 1; i >= 0; i-- {
		if err := p.stopFronts[i](ctx); err != nil {
			p.logger.Warn("front end shutdown", "err", err)
		}
	}
	if p.admin != nil {
		p.admin.Shutdown(ctx)
	}
	if p.cancel != nil {
		p.cancel()
	}
	p.background.Wait()
	if p.cpuProfile != nil {
		pprof.StopCPUProfile()
		p.cpuProfile.Close()
	}
	if p.prevGoMemLimit > 0 {
		debug.SetMemoryLimit(p.prevGoMemLimit) // the process may run on (tests, embedding)
	}
}

// backendStatus lists the HTTP and SIP backends for /status.
func (p *plan) backendStatus() []admin.BackendStatus {
	var out []admin.BackendStatus
	now := p.clock.Now()
	var httpPool *lb.Pool
	if p.httpSrv != nil {
		httpPool = p.httpSrv.Pool() // the set in force, also after a reload
	}
	for _, pool := range []*lb.Pool{httpPool, p.sipPool()} {
		if pool == nil {
			continue
		}
		for _, b := range pool.Backends() {
			out = append(out, admin.FromBackend(b.Status(now), b.MOP()))
		}
	}
	return out
}

func (p *plan) sipPool() *lb.Pool {
	if p.sipSrv == nil {
		return nil
	}
	return p.sipSrv.Pool()
}
