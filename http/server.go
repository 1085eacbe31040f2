package http

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/sluicelb/sluice/accesslog"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/proxyproto"
)

// Server is the HTTP front end. Build it with New, start it with Serve or
// ListenAndServe, stop it with Shutdown. Safe for concurrent use.
type Server struct {
	cfg          Config
	backends     atomic.Pointer[backendSet] // SetPool swaps them
	ctrl         *admission.Controller
	mem          *admission.Memory
	signer       *lb.Signer
	clock        admission.Clock
	logger       *slog.Logger
	sticky       *stickyCookie // nil when disabled
	sessions     *sessionTable // nil when disabled
	appName      string
	trusted      []netip.Prefix
	hashKind     hashKind
	hashName     string
	ruleView     atomic.Pointer[ruleView] // of the ARM rules in force (rules.go)
	connDeny     string                   // the hash header, lower case: Connection may not name it
	denyNames    atomic.Pointer[[]string] // connDeny and the set's pool hash headers and route headers (denyList)
	loopMark     []byte                   // this Server's Sluice-Via mark (loop.go)
	poolMu       sync.Mutex
	poolCounters map[string]*poolStats // by pool name, the pools of the set in force
	srv          *fasthttp.Server
	loops        atomic.Pointer[loopEngine] // set while the loop engine serves
	h2s          h2State                    // HTTP/2 clients (h2.go)
	shut         atomic.Bool                // Shutdown was called
	conns        clientLimit                // client connections open (connlimit.go)
	held         clientLimit                // requests holding (or waiting for) a backend connection, per source
	delayed      sourceCount                // requests in ARM delay queues, per source
	acceptLog    acceptLog
	limitLog     limitLog // client connections closed over a limit (connlimit.go)
	slotsMu      sync.Mutex
	slots        map[string]*backendSlots // connections per backend address, both engines (connlimit.go)
	// poolForget is how long a loop keeps its pool of an address no
	// backend has any more, once the pool has no connection and carried
	// no request (ns; poolForgetAfter, shorter in tests).
	poolForget atomic.Int64
	// wallBase and monoBase map monotonic time to wall time for cookie
	// expiry without a second clock read per request.
	wallBase time.Time
	monoBase int64

	stats Stats
	alog  *accesslog.Logger // nil: requests are not logged
	trace TraceStarter      // nil: no trace made for requests without one

	// HTTPS (tls.go).
	tls           atomic.Pointer[tlsFront] // the HTTPS listener, while served
	httpsPort     atomic.Pointer[string]   // the HTTPS listener's port, for -https-redirect
	upgrades      []string                 // Config.Upgrades parsed (tunnel.go)
	tunnels       tunnelSet                // open tunnels, for Shutdown
	tunnelsForced atomic.Bool
}

// Stats counts what the front end did since start. Fields are atomics.
// Admitted and refused requests, by class and guard, are counted by the
// admission controller, not here.
type Stats struct {
	// ProxyRejected counts client connections closed for their PROXY
	// protocol header, by reason (proxyin.go).
	ProxyRejected  proxyproto.Rejected
	UpstreamError  atomic.Uint64 // answered 502/503/504 for a backend failure
	Retried        atomic.Uint64 // moved to another backend after a connect failure
	Restreamed     atomic.Uint64 // always 0: an answer is never requested twice (kept for the metric's users)
	Aborted        atomic.Uint64 // in-flight new work ended by memory state Critical
	Repinned       atomic.Uint64 // affinity to a backend that was down, sent elsewhere
	HandedOver     atomic.Uint64 // loop engine: connections given to the fasthttp server
	BadRequest     atomic.Uint64 // request heads refused (400, 414, 431, 501, 505), connection closed; and requests the routes cannot read (400 ambiguous path or duplicate routed header, 414 path too long for regex routes), connection kept
	Loops          atomic.Uint64 // request heads that came back to this Server (508, loop.go); also counted in BadRequest
	ConnLimited    atomic.Uint64 // client connections closed at once: -http-max-conns or -http-max-conns-per-source reached
	SourceLimited  atomic.Uint64 // requests answered 503: their source held MaxConns/8 backend connections
	DelayAbandoned atomic.Uint64 // requests taken out of an ARM delay queue because their client left
	DelayLimited   atomic.Uint64 // requests refused (429) because their source held its share (1/8) of an ARM delay queue
	NoRoute        atomic.Uint64 // requests answered 404: no route took them and there is no default pool
	// CookieStripped counts backend Set-Cookie headers for the balancer's
	// own cookie, removed from answers.
	CookieStripped atomic.Uint64
	// SessionNotLearned counts application session ids not learned: the
	// table was full of sessions in use, or the id was too long.
	SessionNotLearned atomic.Uint64
	// H2 counts HTTP/2 client connections and streams (h2.go).
	H2 H2Stats
	// HandshakeRefused counts TLS connections closed before their
	// handshake: Config.Handshakes refused one more in flight (or its rate).
	HandshakeRefused atomic.Uint64
	// HandshakeFailed counts TLS handshakes that failed or timed out
	// (Config.HandshakeTimeout), and connections that negotiated a
	// protocol nothing serves.
	HandshakeFailed atomic.Uint64
	// Redirected counts plain requests answered 308 to HTTPS
	// (Config.HTTPSRedirect).
	Redirected atomic.Uint64

	// Tunnels are the upgraded connections open now (tunnel.go).
	Tunnels atomic.Int64
	// TunnelsPending are upgrade requests sent, their answer not yet in;
	// they count against MaxTunnels with Tunnels.
	TunnelsPending atomic.Int64
	// TunnelsTotal counts the tunnels opened (backend answered 101).
	TunnelsTotal atomic.Uint64
	// TunnelsRefused counts upgrade requests answered 503 at MaxTunnels.
	TunnelsRefused atomic.Uint64
}

// poolStats counts what the front end did in one pool: the refusals it
// answered there, by the guard that refused (admission.Reason), and the
// requests it found no backend up for.
type poolStats struct {
	Refused   [admission.NumReasons]atomic.Uint64
	NoBackend atomic.Uint64
}

// Deps are what the HTTP front end is built on, as sip.Deps are the SIP
// front end's.
type Deps struct {
	// Generation is the backends, in pools, with the routes among them;
	// SetGeneration swaps it at run time. One of Generation and Pool is
	// required.
	Generation *lb.Generation
	// Pool is the backends of a front end without pools (one pool takes
	// every request); SetPool swaps it at run time. Ignored when
	// Generation is set.
	Pool *lb.Pool
	// Admission decides new work. Required.
	Admission *admission.Controller
	// Signer makes and checks sticky cookies; it may be nil only when the
	// sticky cookie is disabled (StickyCookie "-").
	Signer *lb.Signer
	// AccessLog takes one record per request; nil: none.
	AccessLog *accesslog.Logger
	// Tracer, when spans are exported (-otlp-endpoint), starts the trace
	// of a request that came without a valid traceparent: its trace id is
	// logged and the backend gets a traceparent naming the request's span
	// as parent. nil: such a request goes on without one. Its records
	// reach the exporter through AccessLog.
	Tracer TraceStarter
}

// TraceStarter makes a request's trace context (tracing.Exporter's
// StartTrace): a trace id, the id of the span exported for the request,
// and whether it is sampled. Called on the data plane: it must not block
// or allocate.
type TraceStarter interface {
	StartTrace() (traceID [16]byte, spanID [8]byte, sampled bool)
}

// New builds the front end; it opens no socket. The logger gets
// component=http.
func New(cfg Config, deps Deps, logger *slog.Logger) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pool, ctrl, signer := deps.Pool, deps.Admission, deps.Signer
	if (pool == nil && deps.Generation == nil) || ctrl == nil {
		return nil, errors.New("new http front end: backends (a generation or a pool) and controller are required")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:      cfg,
		ctrl:     ctrl,
		mem:      ctrl.Memory(),
		signer:   signer,
		clock:    cfg.Clock,
		logger:   logger.With("component", "http"),
		trusted:  cfg.TrustedProxies,
		appName:  cfg.AppCookie,
		alog:     deps.AccessLog,
		trace:    deps.Tracer,
		loopMark: newLoopMark(),
	}
	s.upgrades, _ = parseUpgrades(cfg.Upgrades) // Validate checked it
	// A layer-4 balancer's own address counts toward the total only: its
	// clients are counted by the addresses its headers carry (rekey).
	s.conns.max, s.conns.perSource, s.conns.trusted = cfg.MaxClientConns, cfg.MaxConnsPerSource, slices.Concat(cfg.TrustedProxies, cfg.ProxyFrom)
	if fit := defaultMaxClientConns(fdLimit()); cfg.MaxClientConns > fit {
		// Each client connection may hold a backend connection: past
		// this, accept fails for lack of descriptors before the limit
		// closes anything, and probes and the store fail with it.
		s.logger.Warn("-http-max-conns is above what the descriptor limit allows; raise the limit (ulimit -n, systemd LimitNOFILE) or lower -http-max-conns",
			"max_conns", cfg.MaxClientConns, "fits", fit, "nofile", fdLimit())
	}
	if cfg.MaxConnsPerSource > cfg.MaxClientConns {
		s.logger.Warn("-http-max-conns-per-source is above -http-max-conns: only the total limit applies",
			"max_conns_per_source", cfg.MaxConnsPerSource, "max_conns", cfg.MaxClientConns)
	}
	s.held.max, s.held.perSource, s.held.trusted = math.MaxInt, max(1, cfg.MaxConns/8), cfg.TrustedProxies
	s.delayed.trusted = cfg.TrustedProxies
	s.wallBase, s.monoBase = time.Now(), cfg.Clock.Now()
	if cfg.StickyCookie != "-" {
		if signer == nil {
			return nil, errors.New("new http front end: sticky cookie needs an affinity key (-affinity-key-file)")
		}
		s.sticky = newStickyCookie(cfg.StickyCookie, cfg.StickyTTL, signer)
	}
	if cfg.AppCookie != "" {
		s.sessions = newSessionTable(cfg.AppCookieTTL, cfg.AppCookieMax)
		s.sessions.trusted = cfg.TrustedProxies
	}
	s.hashKind, s.hashName, _ = parseHashKey(cfg.HashKey)
	if s.hashKind == hashHeader {
		s.connDeny = strings.ToLower(s.hashName)
	}
	s.rules()
	var set *backendSet
	var err error
	if g := deps.Generation; g != nil {
		if g.Proto() != "http" {
			return nil, fmt.Errorf("new http front end: a %s generation", g.Proto())
		}
		set, err = s.newBackendSet(g, nil, g.Routes(), nil)
	} else {
		set, err = s.newBackendSet(nil, pool, nil, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("new http front end: %w", err)
	}
	s.install(set)
	s.srv = &fasthttp.Server{
		Handler:               s.handle,
		Name:                  "sluice",
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
		ReadTimeout:           cfg.ClientReadTimeout,
		IdleTimeout:           cfg.ClientIdle,
		MaxRequestBodySize:    cfg.StreamThreshold,
		ReadBufferSize:        16 << 10, // request heads up to 16 KiB on either engine
		StreamRequestBody:     true,
		CloseOnShutdown:       true,
		// Answer malformed requests 400 without a handler call; the
		// connection is closed, the server keeps serving.
		ErrorHandler: s.errorHandlerCtx,
		Logger:       fasthttpLogger{s.logger},
	}
	s.poolForget.Store(int64(poolForgetAfter))
	return s, nil
}

// Stats returns the front end's counters.
func (s *Server) Stats() *Stats { return &s.stats }

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if s.cfg.Engine == EngineLoop {
		return s.serveLoops(ln, nil)
	}
	s.logger.Info("http front end serving", "addr", ln.Addr().String(), "backends", len(s.backends.Load().backends),
		"max_conns", s.conns.max, "max_conns_per_source", s.conns.perSource)
	return s.srv.Serve(limitedListener{ln, s})
}

// Shutdown stops accepting, lets in-flight requests finish until ctx is
// done, and closes idle backend connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shut.Store(true)
	h2done := make(chan error, 1)
	go func() { h2done <- s.shutdownH2(ctx) }()
	s.closeTLS()
	var err error
	if e := s.loops.Load(); e != nil {
		err = e.shutdown(ctx)
	} else {
		err = s.srv.ShutdownWithContext(ctx)
	}
	if h2err := <-h2done; err == nil {
		err = h2err
	}
	s.drainTunnels(ctx) // hijacked connections are no longer the engines'

	set := s.backends.Load()
	for _, c := range set.clients {
		if c != nil {
			c.CloseIdleConnections()
		}
	}
	return err
}

// wall returns the wall time at monotonic now: Config.Now when set, else
// derived from the monotonic clock (a step of the system clock after start
// shifts cookie expiry by that step).
func (s *Server) wall(now int64) time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now()
	}
	return s.wallBase.Add(time.Duration(now - s.monoBase))
}

// b2s views b as a string without copying. Only for values that are used
// before the handler returns and not retained (admission.Request says
// Decide keeps no reference; Signer.Verify copies what it returns).
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
