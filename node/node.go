// Package node wires a sluice node together: the HTTP and SIP front ends,
// the admission controller, the backends with their health checks and
// memory probes, persistence of learned rates and the event log, and the
// admin listener (/healthz, /status, /metrics, /events).
//
// New validates a Config and builds every part without listening; Start
// restores learned rates and then listens; Reload re-reads the backends
// file; Drain refuses new work while work under way finishes; Stop ends
// everything and saves. cmd/sluice turns the command line into a Config;
// tests drive a Node in-process.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/cluster"
	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/persist"
	lbsip "github.com/sluicelb/sluice/sip"
	"github.com/sluicelb/sluice/tlsedge"
	"github.com/sluicelb/sluice/tracing"
)

// Config is everything a node is built from. cmd/sluice fills it from
// flags, their SLUICE_* twins and a config file.
type Config struct {
	// Settings are the command's other settings as it resolved them, one
	// "name value" line each in the -config file syntax; RunningConfig
	// writes them before the backends and rules in force.
	Settings []string
	// HTTP configures the HTTP front end (its Listen is the address).
	HTTP lbhttp.Config
	// HTTPBackends are -http-backend specs, ADDR[,key=value...]. None: no
	// HTTP front end (unless the backends file gives some).
	HTTPBackends []string
	// HTTPPools are -http-pool specs (lb.ParsePoolSpec): the settings of
	// named pools where they differ from the front end's.
	HTTPPools []string
	// HTTPRoutes are -http-route specs (lb.ParseRouteSpec), first match
	// wins; no match: the pool default.
	HTTPRoutes []string
	// TrustedProxies are -http-trusted-proxy values, each a CIDR or a
	// comma-separated list of them.
	TrustedProxies []string
	// ProxyFrom are -proxy-protocol-from values, each a CIDR or a
	// comma-separated list of them: the layer-4 balancers whose
	// connections to the HTTP, HTTPS, SIP TCP and SIP TLS listeners start
	// with a PROXY protocol header (bounded by HTTP.ProxyTimeout,
	// -proxy-protocol-timeout, for both front ends).
	ProxyFrom []string
	// Policy selects HTTP backends for new work (-lb-policy).
	Policy string
	// Health is the HTTP backends' active health check; Interval 0
	// disables it.
	Health lb.HealthConfig
	// HealthPath is -health-path: the HTTP probe's path ("": GET / where
	// any answer below 500 is up; "-": a TCP connect only). A backend's
	// own health=PATH wins.
	HealthPath string
	// Passive is the HTTP backends' passive health check (OnEject is set
	// by the node: it logs and records each ejection).
	Passive lb.PassiveConfig
	// ARM are the -arm rule specs.
	ARM []string
	// ARMFile holds more ARM rules, one -arm spec a line (-arm-file);
	// ReloadARM (SIGHUP) re-reads it.
	ARMFile string
	// MOP configures every backend's limiter (Name and Events are set per
	// backend).
	MOP admission.MOPConfig
	// MOPRejectCode is the HTTP status when every backend's MOP refuses.
	MOPRejectCode int
	// MOPProbe configures the backends' memory probes (URL is set per
	// backend).
	MOPProbe lb.MemoryProbeConfig
	// Memory configures the node memory states.
	Memory admission.MemoryConfig
	// KeyFile holds the affinity HMAC key; "" is affinity.key in the data
	// directory.
	KeyFile string
	// BackendsFile lists more backends, pool settings and routes ("http
	// SPEC", "sip SPEC", "http-pool SPEC", "http-route SPEC", ... lines);
	// Reload re-reads it.
	BackendsFile string
	// Persist configures the data directory.
	Persist persist.Config
	// AdminListen is the admin listener's address; "" disables it.
	AdminListen string
	// AdminTokenFile holds the bearer tokens the admin listener requires
	// (-admin-token-file); needed when AdminListen is not loopback.
	AdminTokenFile string
	// AdminHosts are more Host names the admin listener answers to
	// (-admin-host), besides localhost, loopback and its own addresses.
	AdminHosts []string
	// DrainTimeout bounds the shutdown drain (Drain); 0 is none: new
	// work is refused and the node stops at once.
	DrainTimeout time.Duration
	// CPUProfile, when set, is a file a CPU profile is written to while
	// the node runs.
	CPUProfile string
	// SIP configures the SIP front end; its Backends come from SIPBackends.
	SIP lbsip.Config
	// AccessLog is the access log of both front ends (-access-log...).
	AccessLog AccessLogConfig
	// SIPBackends are -sip-backend specs. None: no SIP front end (unless
	// the backends file gives some).
	SIPBackends []string
	// SIPPools and SIPRoutes are -sip-pool and -sip-route specs.
	SIPPools, SIPRoutes []string
	// Cluster joins a cluster of nodes sharing budgets through Redis;
	// Redis "" keeps the node standalone.
	Cluster cluster.Config
	// TLS holds the certificates (-tls-cert) and handshake bounds of every
	// TLS listener; all zero is tlsedge's defaults without certificates.
	TLS tlsedge.Config
	// Tracing exports a span per HTTP request and SIP transaction
	// (-otlp-endpoint, -trace-sample); Endpoint "" is off.
	Tracing tracing.Config
	// DNS configures the backends found in DNS (dns:, srv:, naptr: specs).
	DNS DNSConfig
}

// Node is a sluice node. Create it with New; Start, Reload, Drain and Stop
// are called from one goroutine.
type Node struct {
	cfg Config
	// boundAddrs are the addresses Start bound (ownListeners).
	boundAddrs     atomic.Pointer[[]netip.AddrPort]
	logger         *slog.Logger
	alog           *accesslog.Logger // nil: no access log
	clock          admission.Clock
	events         admission.EventSink
	eventLog       *eventLog
	store          *persist.Store
	saver          *persist.Saver
	forward        *prometheus.HistogramVec // forwarding latency, by protocol
	mem            *admission.Memory
	memLimit       admission.MemoryConfig // with the limit in force and its source
	prevGoMemLimit int64                  // Go memory limit before Start set it; 0: untouched
	ctrl           *admission.Controller
	signer         *lb.Signer
	keyRing        []lb.Key         // the affinity key ring; the cluster signs dialog changes with keys derived from it
	dash           *admin.Dashboard // nil without an admin listener
	history        historyStore     // the dashboard's history to the store, once open
	httpSrv        *lbhttp.Server
	httpGen        *lb.Generation // HTTP backends in pools, with their health checks and probes
	sipGen         *lb.Generation // SIP backends in pools, with their pings and probes
	sipStarted     bool           // the SIP server runs: its generations can ping
	mopByKey       map[string]*admission.MOP
	ctx            context.Context // of the running node, for reloads
	sipSrv         *lbsip.Server
	admin          *admin.Server
	op             *operator                // run-time changes (control.go)
	cfgRules       []admission.RuleConfig   // the ARM rules of -arm and -arm-file, before overrides
	cluster        *cluster.Cluster         // nil: standalone
	dataKeyFile    string                   // the affinity key generated in the data directory ("" with -affinity-key-file)
	dataKey        []byte                   // and its bytes
	reloads        reloadLog                // the last reload of each file, for /status
	dns            *dnsState                // backends from DNS; nil until a template is met
	dnsRunning     bool                     // its lookups run in the background
	dnsMetrics     atomic.Pointer[dnsState] // n.dns for /metrics, which scrapes while a reload may set it

	// What the TLS listeners share (tls.go).
	tlsStore   *tlsedge.Store            // certificates; nil without -tls-cert
	tlsCfg     tlsedge.Config            // cfg.TLS with defaults filled
	handshakes *tlsedge.HandshakeLimiter // the bound on TLS and WebSocket handshakes

	specsInForce

	// mops lists every backend's MOP limiter by its persist key
	// (persist.MOPKey(proto, addr)), built before any front end serves:
	// the place where learned states are imported at start and exported
	// for saving.
	mops []mopEntry
	// mopMu guards mops, mopByKey and mopUsed: generations are built
	// under op.mu, the saver exports from its own goroutine.
	mopMu sync.Mutex
	// mopUsed is the mopTick of the last generation build that used each
	// limiter, by key (pruneMOPs).
	mopUsed map[string]uint64
	mopTick uint64

	// tracer exports spans (-otlp-endpoint), fed by the access log's
	// records (a Sink of alog); nil: off.
	tracer *tracing.Exporter

	httpAddr, adminAddr net.Addr
	httpsAddr           net.Addr
	cpuProfile          *os.File
	stopFronts          []func(context.Context) error // front ends, in start order
	background          sync.WaitGroup
	cancel              context.CancelFunc
}

type mopEntry struct {
	key string
	mop *admission.MOP
}

// New validates cfg and constructs every part; nothing listens yet. Errors
// name the flag of the field at fault.
func New(cfg Config, logger *slog.Logger) (_ *Node, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		cfg:    cfg,
		logger: logger,
		clock:  admission.MonoClock{},
	}
	defer func() {
		if err != nil {
			n.closeAccessLog() // its files and writer, when opened before the failure
			n.closeTracing(time.Second)
		}
	}()
	n.eventLog = &eventLog{logger: n.logger}
	n.events = n.eventLog.emit
	n.forward = newForwardHistogram()
	var file fileSpecs
	if cfg.BackendsFile != "" {
		var err error
		if file, err = readBackendsFile(cfg.BackendsFile); err != nil {
			return nil, err
		}
	}
	n.setSpecs(cfg, file)
	if len(n.httpBackends) == 0 && len(n.sipBackends) == 0 {
		return nil, errors.New("no backends: give -http-backend and/or -sip-backend (or -backends-file)")
	}
	for _, proto := range []string{"http", "sip"} {
		if err := file.check(proto, n.specs(proto)); err != nil {
			return nil, err
		}
	}
	if err := cfg.checkPositive(); err != nil {
		return nil, err
	}
	if err := listenClash(n.listeners()); err != nil {
		return nil, err
	}
	if dc := cfg.DNS; true {
		if err := dc.check(); err != nil {
			return nil, err
		}
	}

	// Without -mem-limit the container's limit counts (the OOM killer
	// counts the cgroup), or GOMEMLIMIT when that is lower; a GOMEMLIMIT
	// stays the reader's, so the runtime's own limit is left as it is.
	mc := cfg.Memory
	var detected int64
	if mc.Limit > 0 {
		mc.LimitSource = "-mem-limit"
	} else if detected, mc.LimitSource = admission.DetectLimit(os.DirFS("/"), debug.SetMemoryLimit(-1)); mc.LimitSource != admission.LimitFromGOMEMLIMIT {
		mc.Limit = detected
	}
	n.memLimit = mc
	if n.mem, err = admission.NewMemory(mc, nil, n.events); err != nil {
		return nil, err
	}
	rules, err := n.loadRules()
	if err != nil {
		return nil, err
	}
	if err := n.checkRulePools(rules); err != nil {
		return nil, err
	}
	n.cfgRules = rules
	n.op = &operator{n: n}
	if n.ctrl, err = admission.NewController(admission.ControllerConfig{Rules: slices.Clone(rules), MOPRejectCode: cfg.MOPRejectCode, Events: n.events}, n.mem, n.clock.Now()); err != nil {
		return nil, err
	}
	if err := cfg.checkMOP(); err != nil {
		return nil, err
	}
	if err := cfg.checkMOPProbe(); err != nil {
		return nil, err
	}
	if err := n.newCluster(); err != nil {
		return nil, err
	}

	keyFile, keyFlag := cfg.KeyFile, "-affinity-key-file"
	if keyFile == "" {
		keyFile, keyFlag = defaultKeyFile(cfg.Persist.Dir), "-data-dir"
	}
	ring, err := lb.LoadOrCreateKeyRing(keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyFlag, err)
	}
	n.keyRing = ring
	if n.cluster != nil {
		if err := n.cluster.SetKeyRing(ring); err != nil {
			return nil, fmt.Errorf("%s: %w", keyFlag, err)
		}
		if cfg.KeyFile == "" {
			n.logger.Warn("cluster without -affinity-key-file: unless every node's data directory holds the same key, nodes refuse each other's affinity tokens, SIP dialog changes and MOP states", "key_file", keyFile)
		}
	}
	if n.signer, err = lb.NewRingSigner(ring); err != nil {
		return nil, fmt.Errorf("-affinity-key-file %s: %w", keyFile, err)
	}
	if cfg.KeyFile == "" {
		// The generated key lives in the data directory: keep its bytes to
		// write it back should the directory vanish while we run.
		if data, err := os.ReadFile(keyFile); err == nil {
			n.dataKeyFile, n.dataKey = keyFile, data
		}
	}
	// Before the front ends: their TLS listeners take the store.
	if err := n.buildTLS(); err != nil {
		return nil, err
	}
	if err := n.buildTracing(); err != nil {
		return nil, err
	}
	if err := n.openAccessLog(); err != nil {
		return nil, err
	}

	if len(n.httpBackends) > 0 {
		if err := n.buildHTTP(); err != nil {
			return nil, err
		}
	}
	if len(n.sipBackends) > 0 {
		if err := n.buildSIP(); err != nil {
			return nil, err
		}
	} else {
		sc := cfg.SIP
		if err := n.sipEdge(&sc); err != nil {
			return nil, err
		}
		if err := lbsip.CheckSettings(sc); err != nil {
			return nil, err
		}
	}
	if err := admin.CheckListen(cfg.AdminListen, cfg.AdminTokenFile); err != nil {
		return nil, err
	}
	var tokens *admin.Tokens
	if cfg.AdminTokenFile != "" {
		if tokens, err = admin.LoadTokens(cfg.AdminTokenFile); err != nil {
			return nil, err
		}
	}
	if cfg.AdminListen != "" {
		n.admin = admin.New(n.logger)
		n.admin.RequireTokens(tokens)
		if err := n.admin.AllowHosts(cfg.AdminListen, cfg.AdminHosts); err != nil {
			return nil, err
		}
		n.admin.Handle("GET /healthz", n.healthz())
		src := admin.Source{Memory: n.mem, Controller: n.ctrl, Backends: n.backendStatus, Storage: n.storageStatus, Pools: n.poolStatus, Routes: n.routeStatus, LastReload: n.lastReload, HTTPTunnels: n.httpTunnels, AccessLog: n.accessLogStatus}
		src.TLSCertificates = n.tlsCertStatus
		src.SIP = n.sipStatus
		n.admin.Handle("GET /status", admin.StatusHandler(src))
		// The dashboard at / samples src every second while the admin
		// listener serves; its buttons drain and reweigh the pools in force.
		// Its buttons and the control endpoints go through the operator,
		// which keeps every change as an override (control.go).
		n.dash = admin.NewDashboard(admin.DashboardConfig{Source: src, Operator: n.op, Config: n, MOPMaxHeap: cfg.MOP.MaxHeap, Events: n.events,
			CoarseSamples: coarseHistorySamples(cfg.Persist.HistoryRetention), Store: &n.history}, n.logger)
		n.dash.Register(n.admin)
	}
	return n, nil
}

// defaultKeyFile is where the affinity key lives when -affinity-key-file
// is not given: in the data directory, where -data-reset leaves it, so that
// sticky cookies and SIP dialogs issued before a reset stay valid.
func defaultKeyFile(dataDir string) string {
	return filepath.Join(dataDir, persist.AffinityKeyFile)
}

// checkPositive rejects zero or negative values of the fields whose zero
// value the packages would silently replace by their default. Its errors
// are the packages' FieldErrors, which cmd/sluice names by their flags.
func (c *Config) checkPositive() error {
	const positive = "must be positive"
	for _, f := range []struct {
		ok  bool
		err error
	}{
		{c.MOP.InitialRate > 0, admission.NewFieldError("admission", "MOPConfig.InitialRate", positive)},
		{c.MOP.Window > 0, admission.NewFieldError("admission", "MOPConfig.Window", positive)},
		{c.MOPProbe.Interval > 0, admission.NewFieldError("lb", "MemoryProbeConfig.Interval", positive)},
		{c.MOPProbe.MaxBytes > 0, admission.NewFieldError("lb", "MemoryProbeConfig.MaxBytes", positive)},
		{c.Health.Timeout > 0, admission.NewFieldError("lb", "HealthConfig.Timeout", positive)},
		{c.Health.Rise > 0, admission.NewFieldError("lb", "HealthConfig.Rise", positive)},
		{c.Health.Fall > 0, admission.NewFieldError("lb", "HealthConfig.Fall", positive)},
		{c.Passive.Cooldown > 0, admission.NewFieldError("lb", "PassiveConfig.Cooldown", positive)},
		{c.Passive.MaxFails >= 0, admission.NewFieldError("lb", "PassiveConfig.MaxFails", "must not be negative (0 disables passive ejection)")},
		{c.HTTP.StickyTTL > 0, admission.NewFieldError("http", "StickyTTL", positive)},
		{c.HTTP.AppCookieTTL > 0, admission.NewFieldError("http", "AppCookieTTL", positive)},
		{c.HTTP.AppCookieMax > 0, admission.NewFieldError("http", "AppCookieMax", positive)},
		{c.HTTP.MaxConns > 0, admission.NewFieldError("http", "MaxConns", positive)},
		{c.HTTP.ConnectTimeout > 0, admission.NewFieldError("http", "ConnectTimeout", positive)},
		{c.HTTP.BackendTimeout > 0, admission.NewFieldError("http", "BackendTimeout", positive)},
		{c.HTTP.BackendIdle > 0, admission.NewFieldError("http", "BackendIdle", positive)},
		{c.HTTP.ClientReadTimeout > 0, admission.NewFieldError("http", "ClientReadTimeout", positive)},
		{c.HTTP.ClientIdle > 0, admission.NewFieldError("http", "ClientIdle", positive)},
		{c.HTTP.StreamThreshold > 0, admission.NewFieldError("http", "StreamThreshold", positive)},
	} {
		if !f.ok {
			return f.err
		}
	}
	if c.DrainTimeout < 0 {
		return fmt.Errorf("-drain-timeout must not be negative (0: no shutdown drain)")
	}
	return checkHealthPath(c.HealthPath)
}

// checkMOPProbe validates the memory probe settings (-mop-probe-*,
// -mop-*-metric) at start even when no backend has a metrics URL yet: a
// bad value would otherwise pass start-up and fail the first SIGHUP that
// adds a backend with metrics=.
func (c *Config) checkMOPProbe() error {
	b, err := lb.NewBackend(lb.BackendConfig{Addr: "127.0.0.1:1"})
	if err != nil {
		return err
	}
	p := c.MOPProbe
	p.URL = "http://127.0.0.1:1/metrics"
	_, err = lb.NewMemoryProbe(b, p, nil, nil)
	return err
}

// checkMOP validates the MOP settings once, before any backend needs them.
func (c *Config) checkMOP() error {
	m := c.MOP
	m.Name = "check"
	_, err := admission.NewMOP(m)
	return err
}

// mopKeep bounds the MOP limiters kept per protocol. Each address a
// backend ever had keeps its limiter, so that one that comes back (a
// reload, DNS) keeps what it learned; past mopKeep, those least recently
// in a generation go (DNS answers that change at every lookup would
// otherwise add limiters, and saved states, without bound). Twice
// lb.MaxBackends leaves room for a whole generation in force and as
// many that left it.
var mopKeep = 2 * lb.MaxBackends

// newMOP builds the limiter of one backend with a memory probe.
func (n *Node) newMOP(proto, id, addr string) (*admission.MOP, error) {
	key := persist.MOPKey(proto, addr)
	n.mopMu.Lock()
	defer n.mopMu.Unlock()
	n.mopTick++
	if m := n.mopByKey[key]; m != nil {
		n.mopUsed[key] = n.mopTick
		return m, nil // a backend that stays across a reload keeps what it learned
	}
	c := n.cfg.MOP
	c.Name = proto + " " + id
	c.Events = n.events
	m, err := admission.NewMOP(c)
	if err != nil {
		return nil, err
	}
	n.mops = append(n.mops, mopEntry{key: key, mop: m})
	if n.mopByKey == nil {
		n.mopByKey = map[string]*admission.MOP{}
	}
	n.mopByKey[key] = m
	if n.mopUsed == nil {
		n.mopUsed = map[string]uint64{}
	}
	n.mopUsed[key] = n.mopTick
	if n.cluster != nil {
		n.cluster.AttachMOP(key, m) // the same backend address has the same key on every node
	}
	n.pruneMOPs(proto + "/")
	return m, nil
}

// pruneMOPs drops the limiters with keys starting with prefix (one
// protocol's) least recently in a generation while there are more than
// mopKeep. A generation in force keeps using its own; only what is saved
// and what a later generation finds changes. n.mopMu is held.
func (n *Node) pruneMOPs(prefix string) {
	count := 0
	for _, e := range n.mops {
		if strings.HasPrefix(e.key, prefix) {
			count++
		}
	}
	for ; count > mopKeep; count-- {
		oldest := -1
		for i, e := range n.mops {
			if strings.HasPrefix(e.key, prefix) && (oldest < 0 || n.mopUsed[e.key] < n.mopUsed[n.mops[oldest].key]) {
				oldest = i
			}
		}
		key := n.mops[oldest].key
		n.mops = slices.Delete(n.mops, oldest, oldest+1)
		delete(n.mopByKey, key)
		delete(n.mopUsed, key)
		if n.cluster != nil {
			n.cluster.DetachMOP(key)
		}
	}
}

func (n *Node) buildHTTP() error {
	gen, err := n.buildGen("http", n.specs("http"), nil)
	if err != nil {
		return err
	}
	n.httpGen = gen
	hc := n.cfg.HTTP
	for _, s := range n.cfg.TrustedProxies {
		nets, err := lbhttp.ParseTrustedProxies(s)
		if err != nil {
			return err
		}
		hc.TrustedProxies = append(hc.TrustedProxies, nets...)
	}
	if hc.ProxyFrom, err = n.proxyProtocolFrom(); err != nil {
		return err
	}
	hc.Clock = n.clock
	if hc.TLSListen != "" {
		// -https-listen: certificates by SNI from the node's store, h2,
		// http/1.1 and http/1.0 offered by ALPN (Go refuses a client whose
		// ALPN list shares nothing with the server's, and curl --http1.0
		// offers only http/1.0: nginx serves it), one bound on handshakes
		// shared by every TLS and WebSocket listener,
		// -tls-handshake-timeout.
		if err := n.cfg.needTLS("-https-listen"); err != nil {
			return err
		}
		hc.TLSConfig = n.tlsConfig("h2", "http/1.1", "http/1.0")
		hc.Handshakes = n.handshakes
		hc.HandshakeTimeout = n.HandshakeTimeout()
	}
	hist := n.forward.WithLabelValues("http")
	hc.ObserveForward = func(d time.Duration) { hist.Observe(d.Seconds()) }
	deps := lbhttp.Deps{Generation: n.httpGen, Admission: n.ctrl, Signer: n.signer, AccessLog: n.alog}
	if n.tracer != nil {
		deps.Tracer = n.tracer
	}
	n.httpSrv, err = lbhttp.New(hc, deps, n.logger)
	return err
}

func (n *Node) buildSIP() error {
	cfg := sipConfig(n.cfg.SIP)
	if err := n.sipEdge(&cfg); err != nil {
		return err
	}
	hist := n.forward.WithLabelValues("sip")
	observe := func(d time.Duration) { hist.Observe(d.Seconds()) }
	var err error
	n.sipSrv, err = lbsip.New(cfg, lbsip.Deps{Admission: n.ctrl, Signer: n.signer, Clock: n.clock, ObserveForward: observe, Events: n.events, AccessLog: n.alog}, n.logger)
	if err != nil {
		return err
	}
	gen, err := n.buildGen("sip", n.specs("sip"), nil)
	if err != nil {
		return err
	}
	return n.installSIP(gen)
}

// Start restores the learned rates, then runs the background loops, binds
// the listeners and starts the front ends: the one place where front ends
// start. The node runs until Stop; ctx bounds its background work. On an
// error everything started is stopped again.
func (n *Node) Start(ctx context.Context) error {
	// Learned rates are restored before anything listens.
	if err := n.openStore(); err != nil {
		return err
	}
	// Run-time changes kept from before the restart, on top of the
	// configuration, before anything listens.
	n.applyOverrides("routes/", "arm/", "backend/", "mop/")
	if err := n.mountMetrics(); err != nil {
		n.closeStore()
		return err
	}
	if err := n.start(ctx); err != nil {
		n.Stop(n.cfg.DrainTimeout)
		return err
	}
	return nil
}

func (n *Node) start(parent context.Context) error {
	if n.cfg.CPUProfile != "" {
		f, err := os.Create(n.cfg.CPUProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		n.cpuProfile = f
	}
	// The runtime collects and returns memory to stay under the Low share of
	// the limit, so that garbage never raises the memory state; only live
	// memory does. A limit from GOMEMLIMIT is left to the runtime as it is.
	if rl := n.memLimit.RuntimeLimit(); rl > 0 {
		n.prevGoMemLimit = debug.SetMemoryLimit(rl)
		n.logger.Info("go memory limit set", "limit_bytes", rl, "mem_limit_bytes", n.memLimit.Limit, "source", n.memLimit.LimitSource, "previous_bytes", n.prevGoMemLimit)
	}
	ctx, cancel := context.WithCancel(parent)
	n.cancel = cancel
	n.goBackground(func() { n.mem.Run(ctx) })
	n.goBackground(func() { n.ctrl.Run(ctx, n.clock, 10*time.Millisecond) })
	n.ctx = ctx
	n.startDNS(ctx)
	if n.dataKeyFile != "" {
		n.goBackground(func() { n.keepDataKey(ctx, 5*time.Second) })
	}
	n.startCluster(ctx)
	n.startTLS(ctx)
	if n.httpGen != nil {
		n.httpGen.Start(ctx) // a first round of probes before traffic
	}
	if l := n.memLimit; l.LimitSource == admission.LimitFromNone {
		n.logger.Info("memory states off: no -mem-limit, cgroup memory limit or GOMEMLIMIT")
	} else {
		n.logger.Info("memory limit", "bytes", l.Limit, "source", l.LimitSource)
	}

	if n.admin != nil {
		ln, err := net.Listen("tcp", n.cfg.AdminListen)
		if err != nil {
			return fmt.Errorf("-admin-listen %s: %w", n.cfg.AdminListen, err)
		}
		n.adminAddr = ln.Addr()
		n.goBackground(func() {
			if err := n.admin.Serve(ln); err != nil {
				n.logger.Error("admin stopped", "err", err)
			}
		})
	}
	if n.httpSrv != nil {
		// The plain listener (unless -http-listen off) and the HTTPS one
		// (-https-listen), served by one front end.
		var plain, secure net.Listener
		if hl := n.cfg.HTTP.Listen; hl != lbhttp.ListenOff {
			ln, err := net.Listen("tcp", hl)
			if err != nil {
				return fmt.Errorf("-http-listen %s: %w", hl, err)
			}
			plain, n.httpAddr = ln, ln.Addr()
		}
		if tl := n.cfg.HTTP.TLSListen; tl != "" {
			ln, err := net.Listen("tcp", tl)
			if err != nil {
				if plain != nil {
					plain.Close()
				}
				return fmt.Errorf("-https-listen %s: %w", tl, err)
			}
			secure, n.httpsAddr = ln, ln.Addr()
		}
		var hln net.Listener
		if a := n.cfg.HTTP.H2CListen; a != "" {
			var err error
			if hln, err = net.Listen("tcp", a); err != nil {
				if plain != nil {
					plain.Close()
				}
				if secure != nil {
					secure.Close()
				}
				return fmt.Errorf("-http-h2c-listen %s: %w", a, err)
			}
		}
		n.goBackground(func() {
			if err := n.httpSrv.ServeListeners(plain, secure); err != nil {
				n.logger.Error("http front end stopped", "err", err)
			}
		})
		if hln != nil {
			n.goBackground(func() {
				if err := n.httpSrv.ServeH2C(hln); err != nil {
					n.logger.Error("http h2c listener stopped", "err", err)
				}
			})
		}
		n.stopFronts = append(n.stopFronts, n.httpSrv.Shutdown)
	}
	if n.sipSrv != nil {
		if err := n.sipSrv.Start(ctx); err != nil {
			return fmt.Errorf("start sip front end: %w", err)
		}
		n.sipStarted = true
		n.sipGen.Start(ctx) // pings leave from the server's socket
		n.stopFronts = append(n.stopFronts, func(context.Context) error { return n.sipSrv.Close() })
	}
	var bound []netip.AddrPort
	for _, a := range []net.Addr{n.adminAddr, n.httpAddr, n.httpsAddr, n.Addrs().SIP, n.Addrs().SIPTLS, n.Addrs().SIPWS, n.Addrs().SIPWSS} {
		if a == nil {
			continue
		}
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			bound = append(bound, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
		}
	}
	n.boundAddrs.Store(&bound)
	attrs := []any{}
	if n.httpAddr != nil {
		attrs = append(attrs, "http", n.httpAddr.String())
	}
	if n.httpsAddr != nil {
		attrs = append(attrs, "https", n.httpsAddr.String())
	}
	if n.sipSrv != nil {
		attrs = append(attrs, "sip", n.sipSrv.Addr().String())
	}
	if n.adminAddr != nil {
		attrs = append(attrs, "admin", n.adminAddr.String())
	}
	n.logger.Info("listening", attrs...)
	return nil
}

// Addrs are the addresses a started node listens on; nil for a listener
// it does not have.
type Addrs struct {
	HTTP, SIP, Admin net.Addr
	HTTPS            net.Addr // -https-listen
	// SIPTLS, SIPWS and SIPWSS are the SIP edge listeners.
	SIPTLS, SIPWS, SIPWSS net.Addr
}

// Addrs returns the bound addresses (after Start).
func (n *Node) Addrs() Addrs {
	a := Addrs{HTTP: n.httpAddr, Admin: n.adminAddr, HTTPS: n.httpsAddr}
	if n.sipSrv != nil {
		if sa := n.sipSrv.Addr(); sa != nil {
			a.SIP = sa
		}
		a.SIPTLS, a.SIPWS, a.SIPWSS = n.sipSrv.TLSAddr(), n.sipSrv.WSAddr(), n.sipSrv.WSSAddr()
	}
	return a
}

func (n *Node) goBackground(f func()) {
	n.background.Add(1)
	go func() {
		defer n.background.Done()
		f()
	}()
}

// Stop ends the front ends (in-flight requests get up to timeout), then
// the admin listener and the background loops, saves the learned rates a
// last time and closes the store: the one place where front ends stop.
func (n *Node) Stop(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for i := len(n.stopFronts) - 1; i >= 0; i-- {
		if err := n.stopFronts[i](ctx); err != nil {
			n.logger.Warn("front end shutdown", "err", err)
		}
	}
	n.stopFronts = nil
	if n.admin != nil {
		n.admin.Shutdown(ctx)
	}
	n.closeAccessLog()
	if n.cancel != nil {
		n.cancel()
	}
	n.background.Wait()
	if n.httpGen != nil {
		n.httpGen.Stop()
	}
	if n.sipGen != nil {
		n.sipGen.Stop()
	}
	n.closeTracing(timeout)
	if n.cpuProfile != nil {
		pprof.StopCPUProfile()
		n.cpuProfile.Close()
		n.cpuProfile = nil
	}
	if n.prevGoMemLimit > 0 {
		debug.SetMemoryLimit(n.prevGoMemLimit) // the process may run on (tests, embedding)
		n.prevGoMemLimit = 0
	}
	n.closeStore()
}

// backendStatus lists the HTTP and SIP backends for /status, each once
// with the pools it is a member of.
func (n *Node) backendStatus() []admin.BackendStatus {
	var out []admin.BackendStatus
	now := n.clock.Now()
	for _, proto := range []string{"http", "sip"} {
		g := n.Generation(proto)
		for _, b := range n.backendsOf(proto) {
			st := admin.FromBackend(b.Status(now), b.MOP())
			if g != nil {
				st.Pools = g.PoolsOf(b)
			} else {
				st.Pools = []string{lb.DefaultPool}
			}
			out = append(out, st)
		}
	}
	return out
}

func (n *Node) sipPool() *lb.Pool {
	if n.sipSrv == nil {
		return nil
	}
	return n.sipSrv.Pool()
}
