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
	"strings"
	"syscall"
	"time"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/cluster"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/node"
	"github.com/sluicelb/sluice/persist"
	"github.com/sluicelb/sluice/tlsedge"
	"github.com/sluicelb/sluice/tracing"
)

func init() {
	register("run", "run the balancer: HTTP and SIP front ends, admission control, admin listener", runRun)
}

// runOptions holds the flags of `sluice run`.
type runOptions struct {
	// fields maps each library Config field a flag sets, as its
	// FieldError names it, to that flag (see section).
	fields       map[string]string
	http         node.HTTPConfig
	accessLog    node.AccessLogConfig
	httpBackends listFlag
	httpPools    listFlag
	httpRoutes   listFlag
	fs           *flag.FlagSet // the flags parsed, which know where each list value came from
	trusted      listFlag
	proxyFrom    listFlag
	pool         lb.PoolConfig // Policy, Passive
	health       lb.HealthConfig
	healthPath   string
	arm          listFlag
	ctrl         admission.ControllerConfig // MOPRejectCode
	mop          admission.MOPConfig
	mopProbe     lb.MemoryProbeConfig
	memory       admission.MemoryConfig
	keyFile      string
	backendsFile string
	armFile      string
	adminTokens  string
	persist      persist.Config
	adminListen  string
	adminHosts   listFlag
	logLevel     string
	shutdown     time.Duration
	cpuProfile   string
	sip          *sipOptions
	cluster      cluster.Config
	dns          node.DNSConfig
	tls          tlsedge.Config
	tlsCerts     listFlag
	tracing      tracing.Config
}

// defaultDrainTimeout is -drain-timeout's default: the shutdown drain.
const defaultDrainTimeout = 10 * time.Second

// newRunFlags defines the flags of `sluice run` on fs and returns where
// they land. Defaults come from the packages' Default* functions; each
// flag of a library's field is declared by that field (section).
func newRunFlags(fs *flag.FlagSet) *runOptions {
	o := &runOptions{fields: map[string]string{}}
	o.http = node.DefaultHTTPConfig()
	h := &o.http
	hs := newSection(fs, o.fields, "http", "", h)
	hs.add(&h.Listen, "http-listen", "HTTP listen address; off: none (HTTPS only, -https-listen)")
	hs.add(&h.H2CListen, "http-h2c-listen", "address serving HTTP/2 over cleartext with prior knowledge (h2c) only; empty: none (Upgrade: h2c is never honoured)")
	hs.add(&h.TLSListen, "https-listen", "HTTPS listen address, served beside -http-listen (or alone with -http-listen off) by the same front end, HTTP/1.1 and HTTP/2 (ALPN h2); certificates by -tls-cert")
	// node sets the HTTPS handshake bound from -tls-handshake-timeout.
	hs.also(&h.HandshakeTimeout, "tls-handshake-timeout")
	hs.add(&h.HTTPSRedirect, "https-redirect", "the plain HTTP listener answers every request 308 to the same host and target over HTTPS (on -https-listen's port; without -https-listen, 443: HTTPS served elsewhere)")
	o.httpBackends.check = node.CheckHTTPBackend
	fs.Var(&o.httpBackends, "http-backend", "HTTP `backend` ADDR (or dns:HOST:PORT, srv:NAME: every address DNS gives, followed at its TTL)[,weight=N][,metrics=URL][,health=PATH][,id=NAME][,pool=NAME][,tls=on[,ca=FILE][,sni=NAME]][,proxy=v1|v2] (repeatable, pool= too; none: no HTTP front end; no pool=: the pool default; tls=on: TLS to the backend, its certificate verified against ca= (else the system roots) for sni= (else the host of ADDR); proxy=: a PROXY protocol header naming the client starts each connection to it)")
	o.httpPools.check = node.CheckPool("http")
	fs.Var(&o.httpPools, "http-pool", "settings of an HTTP `pool` where they differ from the front end's: name=NAME[,policy=P][,hash-key=source|header:NAME|cookie:NAME][,health=PATH|-] (repeatable)")
	o.httpRoutes.check = node.CheckRoute("http")
	fs.Var(&o.httpRoutes, "http-route", "HTTP `route` of new work to a pool, first match wins (no match: the pool default, else 404): pool=NAME[,host=H|*.H][,path=/PREFIX|~REGEX][,method=M][,header=NAME:VALUE][,strip=/PREFIX] (repeatable, in order)")
	o.trusted.check = node.CheckTrustedProxies
	fs.Var(&o.trusted, "http-trusted-proxy", "`CIDR` whose X-Forwarded-For/Forwarded are kept and appended to (repeatable, or comma-separated)")
	hs.also(&h.TrustedProxies, "http-trusted-proxy")
	o.proxyFrom.check = node.CheckProxyProtocolFrom
	fs.Var(&o.proxyFrom, "proxy-protocol-from", "`CIDR` of layer-4 balancers (HAProxy in TCP mode, a cloud network load balancer) whose connections to the HTTP, HTTPS, SIP TCP and SIP TLS listeners must start with a PROXY protocol header (v1 or v2, before TLS); the client address it carries is the client's everywhere; a header from any other source is refused (repeatable, or comma-separated)")
	hs.also(&h.ProxyFrom, "proxy-protocol-from")
	hs.add(&h.ProxyTimeout, "proxy-protocol-timeout", "close a -proxy-protocol-from connection whose PROXY header is not whole this long after accept")
	hs.add(&h.StickyCookie, "http-sticky-cookie", "name of the signed sticky cookie; - disables it")
	hs.add(&h.StickyTTL, "http-sticky-ttl", "lifetime of the sticky cookie (renewed past half)")
	hs.add(&h.AppCookie, "http-sticky-app-cookie", "application session cookie to learn from backends' Set-Cookie, e.g. JSESSIONID")
	hs.add(&h.AppCookieTTL, "http-sticky-app-ttl", "a learned session id pins its backend this long after last use")
	hs.add(&h.AppCookieMax, "http-sticky-app-max", "most learned session ids kept")
	hs.add(&h.HashKey, "http-hash-key", "key of -lb-policy consistent-hash: source, header:NAME or cookie:NAME")
	hs.add(&h.MaxConns, "http-backend-max-conns", "most connections to each HTTP backend")
	hs.add(&h.ConnWait, "http-backend-conn-wait", "wait for a free backend connection before answering 503")
	hs.add(&h.ConnectTimeout, "http-connect-timeout", "timeout dialing a backend")
	hs.add(&h.BackendTimeout, "http-backend-timeout", "first-byte timeout: writing a request to a backend and reading its answer's head (past it: idempotent requests go once to another backend, others get 504)")
	hs.add(&h.BackendIdle, "http-backend-idle", "close backend connections idle this long (keep it below the backends' keep-alive timeout)")
	hs.add(&h.MaxClientConns, "http-max-conns", "most client connections open at once; more are closed unanswered (0: half of the descriptor limit left after 64 kept for listeners, health probes, the store and the admin listener)")
	hs.add(&h.MaxConnsPerSource, "http-max-conns-per-source", "most client connections open at once from one address, -http-trusted-proxy excepted (0: an eighth of -http-max-conns, at least 64)")
	hs.add(&h.ClientReadTimeout, "http-client-timeout", "timeout reading a client request")
	hs.add(&h.ClientIdle, "http-client-idle", "close idle client connections after this long")
	hs.add(&h.StreamThreshold, "http-stream-threshold", "request bodies larger than this many bytes are streamed to the backend, not buffered")
	hs.add(&h.ResponseBuffer, "http-response-buffer", "fasthttp engine: answers with a Content-Length up to this many bytes are read whole before they are relayed, others streamed from the same exchange (-1: always stream); the loop engine relays every answer as it arrives")
	hs.add(&h.Engine, "http-engine", "how client connections are served: loop (epoll event loops; Linux) or fasthttp (a goroutine per connection); the loop hands HTTP/1.0, chunked or large uploads, Upgrade other than -http-upgrade's, and Expect to fasthttp")
	hs.add(&h.Loops, "http-loops", "event loops of the loop engine (0: GOMAXPROCS)")
	hs.add(&h.IOURing, "http-io-uring", "loop engine: read and write a round of events' plain HTTP sockets (clients and backends) in one io_uring system call each instead of one per socket (Linux; where io_uring cannot be set up, one WARN and a system call each as without it; =false: a system call each, as before)")
	hs.add(&h.Upgrades, "http-upgrade", "protocols a GET may upgrade to through sluice, a comma list of Upgrade tokens, or none; the connection becomes a byte tunnel only after the backend answers 101 (h2c is never forwarded)")
	hs.add(&h.MaxTunnels, "http-max-tunnels", "most upgraded connections (tunnels) open at once, upgrade requests awaiting their answer included; more are answered 503 before a backend is contacted")
	hs.add(&h.TunnelIdle, "http-tunnel-idle", "close a tunnel that carried no byte either way for this long")
	hs.add(&h.RequestID, "http-request-id", "send every request to its backend with an X-Request-ID: a -http-trusted-proxy's kept, anyone else's replaced by 32 hex digits; in the access log and in the answers sluice makes itself")

	o.accessLog = node.DefaultAccessLogConfig()
	al := &o.accessLog
	fs.StringVar(&al.Dest, "access-log", al.Dest, "`destination` of the access log, one line per HTTP request and SIP transaction: - (stdout), a file path (reopened on SIGUSR1, appended to: logrotate's postrotate SIGUSR1; copytruncate works but can lose lines written during its copy), syslog://HOST:PORT (UDP), syslog+tcp://HOST:PORT, syslog+unix:///dev/log (RFC 5424; ?facility=local0..7); empty: none")
	fs.StringVar(&al.HTTPDest, "http-access-log", al.HTTPDest, "`destination` of the HTTP access log in place of -access-log's (off: no HTTP access log)")
	fs.StringVar(&al.SIPDest, "sip-access-log", al.SIPDest, "`destination` of the SIP access log in place of -access-log's (off: no SIP access log)")
	fs.StringVar(&al.Format, "access-log-format", al.Format, "access log line format: json, logfmt or combined (Apache/nginx combined, without sluice's fields)")
	fs.StringVar(&al.Sample, "access-log-sample", al.Sample, "share of records logged per class, CLASS=RATE,... with classes refused, new, affinity and rates 0 to 1 (e.g. affinity=0.01)")
	fs.BoolVar(&al.Query, "access-log-query", al.Query, "log HTTP query strings (off: they often carry tokens and personal data)")
	fs.BoolVar(&al.MaskUser, "access-log-mask-user", al.MaskUser, "log SIP Request-URIs with their user part as *")

	o.pool = lb.DefaultPoolConfig()
	ps := newSection(fs, o.fields, "lb", "PoolConfig.", &o.pool)
	ps.add(&o.pool.Policy, "lb-policy", "HTTP selection of new work: "+strings.Join(lb.PolicyNames, ", "))
	pa := newSection(fs, o.fields, "lb", "PassiveConfig.", &o.pool.Passive)
	pa.add(&o.pool.Passive.MaxFails, "health-max-fails", "consecutive connect errors, timeouts or 5xx that eject a backend (0 disables)")
	pa.add(&o.pool.Passive.Cooldown, "health-cooldown", "how long an ejected backend stays out")
	o.health = lb.DefaultHealthConfig()
	hc := newSection(fs, o.fields, "lb", "HealthConfig.", &o.health)
	hc.add(&o.health.Interval, "health-interval", "active health check period per backend (0 disables)")
	hc.add(&o.health.Timeout, "health-timeout", "timeout of one health probe")
	fs.StringVar(&o.healthPath, "health-path", "", "HTTP health check: GET this path, 2xx/3xx up, 429 busy (default: GET / where any answer below 500 is up; - for a TCP connect only, which passes a hung backend; health=PATH in -http-backend wins)")
	hc.add(&o.health.Rise, "health-rise", "passing probes in a row that bring a backend up")
	hc.add(&o.health.Fall, "health-fall", "failing probes in a row that take a backend down")
	hc.add((*panicShare)(&o.health.Panic), "health-panic", "past this share of backends down by their health checks alone (percent, or a fraction), new work goes to every backend not shown dead by traffic (100: never)")

	o.dns = node.DefaultDNSConfig()
	ds := newSection(fs, o.fields, "node", "DNSConfig.", &o.dns)
	ds.add(&o.dns.Server, "dns-server", "resolver asked for backends from DNS (dns:, srv:, naptr: in -http-backend/-sip-backend), ADDR[:PORT]; UDP, TCP when an answer is truncated (default: the nameservers of /etc/resolv.conf)")
	ds.add(&o.dns.MinTTL, "dns-min-ttl", "shortest time between two lookups of a name, whatever its TTL; a failed lookup is retried after it")
	ds.add(&o.dns.MaxTTL, "dns-max-ttl", "longest time between two lookups of a name, whatever its TTL")
	ds.add(&o.dns.KeepStale, "dns-keep-stale", "how long a name's last good answer stays in force while lookups fail or find it gone (NXDOMAIN); a pool whose only source is the name keeps its last addresses past it")
	ds.add(&o.dns.Drain, "dns-drain", "how long an address that left DNS stays in its pools, draining (sticky sessions, dialogs and requests in flight go on; no new work), before it is dropped")
	ds.add(&o.dns.Timeout, "dns-timeout", "timeout of one DNS query")
	ds.add(&o.dns.Family, "dns-family", "address family of backends from DNS: any (A and AAAA, both must be answered), ipv4 (A only), ipv6 (AAAA only)")

	cs := newSection(fs, o.fields, "admission", "ControllerConfig.", &o.ctrl)
	o.arm.check = func(s string) error { _, err := admission.ParseRule(s); return err }
	fs.Var(&o.arm, "arm", "ARM `rule` name=N,limit=100/s[,proto=,method=,host=,path=,pool=,action=delay|reject|log,queue=,wait=,qualify=,low=,lower=] (repeatable)")
	cs.also(&o.ctrl.Rules, "arm")
	o.ctrl.MOPRejectCode = admission.DefaultMOPRejectCode
	cs.add(&o.ctrl.MOPRejectCode, "mop-reject-code", "HTTP status when every backend's MOP refuses")
	o.mop = admission.DefaultMOPConfig()
	ms := newSection(fs, o.fields, "admission", "MOPConfig.", &o.mop)
	ms.add((*fraction)(&o.mop.MaxHeap), "mop-max-heap", "MOP memory ceiling of a backend, fraction of its max memory (0.85) or percent (85)")
	ms.add(&o.mop.Window, "mop-window", "MOP averaging window: at least as long as most sessions live")
	ms.add(&o.mop.InitialRate, "mop-initial-rate", "MOP allowed new work per second before anything is learned; discovery raises it from there, and new work over it is refused meanwhile: set it near the backend's present rate when turning MOP on for a busy backend")
	o.mopProbe = lb.DefaultMemoryProbeConfig()
	mp := newSection(fs, o.fields, "lb", "MemoryProbeConfig.", &o.mopProbe)
	mp.add(&o.mopProbe.UsedMetric, "mop-used-metric", "Prometheus series summed as a backend's used memory")
	mp.add(&o.mopProbe.MaxMetric, "mop-max-metric", "Prometheus series summed as a backend's maximum memory")
	mp.add(&o.mopProbe.Interval, "mop-probe-interval", "how often a backend's metrics= URL is polled")
	mp.add((*byteSize)(&o.mopProbe.MaxBytes), "mop-probe-max-bytes", "largest metrics answer read on the wire (e.g. 512KiB, at most 16MiB); unpacked at most four times that; a larger one is a failed probe")

	o.memory = admission.DefaultMemoryConfig()
	me := newSection(fs, o.fields, "admission", "MemoryConfig.", &o.memory)
	me.add((*byteSize)(&o.memory.Limit), "mem-limit", "memory limit of this process in bytes (e.g. 512MiB); its -mem-low share becomes the Go runtime's limit, so garbage is collected before the states climb; default: the cgroup's (v2 memory.max, v1 memory.limit_in_bytes) or GOMEMLIMIT, the smaller; without any, memory states are off")
	me.add((*fraction)(&o.memory.Low), "mem-low", "memory state Low at this share of the limit (no new background work; /healthz 429)")
	me.add((*fraction)(&o.memory.Lower), "mem-lower", "memory state Lower at this share (new work refused 429)")
	me.add((*fraction)(&o.memory.Critical), "mem-critical", "memory state Critical at this share (in-flight new work ended 503)")

	fs.StringVar(&o.keyFile, "affinity-key-file", "", "key, or key ring of \"ID HEXKEY\" lines (newest last), of sticky cookies and SIP tokens; created when missing (default: affinity.key in -data-dir)")
	fs.StringVar(&o.backendsFile, "backends-file", "", "file of backends, pools and routes, one \"http SPEC\", \"sip SPEC\", \"http-pool SPEC\", \"sip-pool SPEC\", \"http-route SPEC\" or \"sip-route SPEC\" a line, added after the flags' and re-read on SIGHUP")
	persistFlags(fs, &o.persist)
	fs.StringVar(&o.adminListen, "admin-listen", admin.DefaultListen, "admin listener for /healthz, /status, /metrics, /events and /control (empty disables); off loopback it needs -admin-token-file")
	o.adminHosts.check = func(s string) error { _, err := admin.ParseHost(s); return err }
	fs.Var(&o.adminHosts, "admin-host", "`name` (or NAME:PORT) the admin listener also answers to, e.g. the name a reverse proxy or an SSH tunnel's browser uses (repeatable); any other Host but localhost, loopback and the listener's own address gets 421 (DNS rebinding guard)")
	fs.StringVar(&o.adminTokens, "admin-token-file", "", "`file` of bearer tokens the admin listener requires, one \"NAME TOKEN\" a line (the name goes into the event log)")
	fs.StringVar(&o.armFile, "arm-file", "", "`file` of ARM rules, one -arm rule a line, added to the -arm flags' and re-read on SIGHUP")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.shutdown, "drain-timeout", defaultDrainTimeout, "shutdown drain: on SIGTERM, how long in-flight requests and affinity traffic (dialogs, sticky sessions) may finish, ended sooner by 2s with neither; new work is refused at once (0: no drain, stop at once)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile to this file (benchmarks)")
	o.sip = addSIPFlags(fs, o.fields)
	clusterFlags(fs, o.fields, &o.cluster)
	tlsFlags(fs, o.fields, &o.tls, &o.tlsCerts)
	traceFlags(fs, o.fields, &o.tracing)
	return o
}

// preset is a command that runs the node of `sluice run`: the same flags
// with the same defaults, and check, when set, refusing what the command
// cannot do without.
type preset struct {
	name  string
	check func(*runOptions) error
}

// runPreset is `sluice run` itself.
var runPreset = preset{name: "run"}

// errNoSIPBackend is sluice sip's refusal to start without SIP backends.
var errNoSIPBackend = errors.New("-sip-backend: at least one is required (or a -backends-file with sip lines)")

// runRun is the run command: it serves until SIGINT or SIGTERM.
func runRun(args []string, stdout, stderr io.Writer) int {
	return serveUntilSignal(runPreset, args, stdout, stderr)
}

// serveUntilSignal runs the node of p until SIGINT or SIGTERM. A second
// SIGINT or SIGTERM ends the process at once, without waiting for the
// drain or the final save, unless it comes within repeatSignal of the
// first: that is one stop delivered twice (coreutils timeout signals its
// child and then the child's process group; a terminal's Ctrl-C reaches
// every process of the group), not an operator asking again.
func serveUntilSignal(p preset, args []string, stdout, stderr io.Writer) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		first := time.Now()
		cancel()
		for s = range sigs {
			if repeated(first, time.Now()) {
				continue
			}
			fmt.Fprintf(stderr, "sluice %s: second %v: exiting now, without finishing the drain or the final save\n", p.name, s)
			os.Exit(1)
		}
	}()
	return serve(ctx, p, args, stdout, stderr, nil)
}

// repeatSignal is how soon after the first stop signal another is taken
// for the same one delivered twice.
const repeatSignal = time.Second

// repeated reports whether a stop signal at now repeats the first one,
// received at first.
func repeated(first, now time.Time) bool { return now.Sub(first) < repeatSignal }

// runHooks lets tests learn the bound addresses.
type runHooks struct {
	ready func(httpAddr, adminAddr net.Addr)
	// addrs, when set, gets every bound address (SIP too) before ready.
	addrs func(node.Addrs)
}

// run is serve for `sluice run`.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, hooks *runHooks) int {
	return serve(ctx, runPreset, args, stdout, stderr, hooks)
}

// parseNode reads args (and their SLUICE_* twins and -config file) as the
// command of p and returns the node.Config they give, the options and the
// logger of -log-level. When ok is false the command stops with code
// (0 after -help, 2 for a bad value), the reason printed on stderr.
func parseNode(p preset, args []string, stderr io.Writer) (cfg node.Config, o *runOptions, logger *slog.Logger, code int, ok bool) {
	fs := newFlagSet(p.name, stderr)
	o = newRunFlags(fs)
	fs.Usage = func() { groupedUsage(fs.Output(), p.name, fs) }
	if code, ok := parseCommand(p.name, fs, args, stderr); !ok {
		return cfg, nil, nil, code, false
	}
	// The default -health-timeout (1s) follows a shorter -health-interval.
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if !explicit["health-timeout"] && o.health.Interval > 0 && o.health.Timeout > o.health.Interval {
		o.health.Timeout = o.health.Interval
	}
	var err error
	if p.check != nil {
		err = p.check(o)
	}
	if err == nil {
		cfg, logger, err = o.config(stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice %s: %v\n", p.name, err)
		return cfg, nil, nil, 2, false
	}
	cfg.Settings = settingLines(fs, "arm", "http-backend", "sip-backend", "http-pool", "sip-pool", "http-route", "sip-route")
	o.fs = fs
	return cfg, o, logger, 0, true
}

// serve parses args as the command of p, wires the parts, serves until
// ctx is done and then shuts down gracefully. It returns 2 for a bad
// flag, 1 for a failure to start.
func serve(ctx context.Context, p preset, args []string, stdout, stderr io.Writer, hooks *runHooks) int {
	cfg, o, logger, code, ok := parseNode(p, args, stderr)
	if !ok {
		return code
	}
	n, err := node.New(cfg, logger)
	if err != nil {
		fmt.Fprintf(stderr, "sluice %s: %v\n", p.name, flagError(sourcedError(o.fs, err)))
		return 2
	}
	// ctx ends at SIGTERM, when the drain starts: the node runs on a
	// context the signal does not end (its front ends must keep serving
	// dialogs, sessions and in-flight requests through the drain), and
	// Stop ends it afterwards.
	if err := n.Start(context.WithoutCancel(ctx)); err != nil {
		err = flagError(err)
		logger.Error("start failed", "err", err)
		fmt.Fprintf(stderr, "sluice %s: %v\n", p.name, err)
		return 1
	}
	if hooks != nil && hooks.addrs != nil {
		hooks.addrs(n.Addrs())
	}
	if hooks != nil && hooks.ready != nil {
		a := n.Addrs()
		hooks.ready(a.HTTP, a.Admin)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	usr1 := make(chan os.Signal, 1)
	if n.AccessLog() != nil {
		signal.Notify(usr1, syscall.SIGUSR1)
		defer signal.Stop(usr1)
	}
	for wait := true; wait; {
		select {
		case <-ctx.Done():
			wait = false
		case <-usr1:
			n.ReopenAccessLog()
			logger.Info("reopening the access log")
		case <-hup:
			if o.backendsFile == "" && o.armFile == "" && n.TLS() == nil {
				// nginx and HAProxy re-read their whole configuration on a
				// reload; say that this one has nothing to re-read.
				logger.Warn("SIGHUP: nothing to re-read: it re-reads -backends-file, -arm-file and -tls-cert files, and none is given; flags, SLUICE_* and -config are read at start only")
			}
			if o.backendsFile != "" {
				if err := n.Reload(); err != nil {
					logger.Error("reload failed: backends unchanged", "err", err)
				} else {
					logger.Info("reloaded backends", "file", o.backendsFile)
				}
			}
			if o.armFile != "" {
				if err := n.ReloadARM(); err != nil {
					logger.Error("reload failed: arm rules unchanged", "err", err)
				} else {
					logger.Info("reloaded arm rules", "file", o.armFile)
				}
			}
			if n.TLS() != nil {
				if err := n.ReloadTLS(); err != nil {
					logger.Error("reload refused a certificate file: the certificate loaded before it serves on", "err", err)
				} else {
					logger.Info("reloaded tls certificates", "files", len(o.tlsCerts.values))
				}
			}
		}
	}
	left := n.Drain(o.shutdown)
	logger.Info("shutting down", "timeout", left)
	n.Stop(left)
	return 0
}

// config turns the parsed flags into a node.Config and the logger of
// -log-level.
func (o *runOptions) config(stderr io.Writer) (node.Config, *slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(o.logLevel)); err != nil {
		return node.Config{}, nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", o.logLevel)
	}
	if err := checkDNSDurations(o.dns); err != nil {
		return node.Config{}, nil, err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	return node.Config{
		HTTP:           o.http,
		HTTPBackends:   o.httpBackends.values,
		HTTPPools:      o.httpPools.values,
		HTTPRoutes:     o.httpRoutes.values,
		TrustedProxies: o.trusted.values,
		ProxyFrom:      o.proxyFrom.values,
		Policy:         o.pool.Policy,
		Health:         o.health,
		HealthPath:     o.healthPath,
		Passive:        o.pool.Passive,
		ARM:            o.arm.values,
		MOP:            o.mop,
		MOPRejectCode:  o.ctrl.MOPRejectCode,
		MOPProbe:       o.mopProbe,
		Memory:         o.memory,
		KeyFile:        o.keyFile,
		BackendsFile:   o.backendsFile,
		Persist:        o.persist,
		AdminListen:    o.adminListen,
		AdminTokenFile: o.adminTokens,
		AdminHosts:     o.adminHosts.values,
		ARMFile:        o.armFile,
		DrainTimeout:   o.shutdown,
		CPUProfile:     o.cpuProfile,
		AccessLog:      o.accessLog,
		SIP:            o.sip.withLists(),
		SIPBackends:    o.sip.backends.values,
		SIPPools:       o.sip.pools.values,
		SIPRoutes:      o.sip.routes.values,
		Cluster:        o.cluster,
		TLS:            o.tlsSettings(),
		Tracing:        o.tracing,
		DNS:            o.dns,
	}, logger, nil
}

// checkDNSDurations refuses a -dns-* duration of 0: the node reads 0 as
// its default, so -dns-keep-stale 0 (meant as "drop at the first failure")
// or -dns-drain 0 ("drop at once") would silently keep an hour or a minute.
func checkDNSDurations(c node.DNSConfig) error {
	d := node.DefaultDNSConfig()
	for _, f := range []struct {
		flag   string
		v, def time.Duration
	}{
		{"-dns-min-ttl", c.MinTTL, d.MinTTL}, {"-dns-max-ttl", c.MaxTTL, d.MaxTTL}, {"-dns-keep-stale", c.KeepStale, d.KeepStale},
		{"-dns-drain", c.Drain, d.Drain}, {"-dns-timeout", c.Timeout, d.Timeout},
	} {
		if f.v == 0 {
			return fmt.Errorf("%s 0: want a duration above 0, such as 1s (without the flag: %s)", f.flag, f.def)
		}
	}
	return nil
}
