package http

import (
	"crypto/tls"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// Config configures the HTTP front end. Fields map 1:1 to flags of
// `sluice run`; zero values take the defaults of DefaultConfig.
type Config struct {
	// Listen is the address to serve on; ListenOff serves no plain HTTP
	// (HTTPS only: TLSListen). Flag -http-listen.
	Listen string
	// H2CListen, when set, is an address that serves HTTP/2 over
	// cleartext with prior knowledge (h2c, RFC 9113 §3.3) and nothing
	// else; "" serves none. Flag -http-h2c-listen.
	H2CListen string
	// TLSListen is the address of the HTTPS listener, served by the same
	// engine and pipeline as Listen; "" serves no HTTPS. It needs
	// TLSConfig. Flag -https-listen.
	TLSListen string
	// TLSConfig is the HTTPS listener's TLS configuration: certificates
	// (by SNI), versions, session tickets and the ALPN protocols offered
	// (NextProtos; "h2" is offered only when an HTTP/2 handler is
	// registered, HTTP/1.1 is served otherwise). nil: no HTTPS.
	TLSConfig *tls.Config
	// Handshakes bounds the TLS handshakes in flight and their rate, so
	// that a handshake flood cannot starve established clients; a
	// connection it refuses is closed before the handshake. nil: no bound.
	Handshakes HandshakeGate
	// HandshakeTimeout bounds a TLS handshake, from accept to the last
	// handshake message: a slow or stalled one is closed at it (default
	// 10 s).
	HandshakeTimeout time.Duration
	// HTTPSRedirect makes the plain listener answer every request 308 to
	// the same host and target over HTTPS (the port of TLSListen, left out
	// when 443). Flag -https-redirect.
	HTTPSRedirect bool
	// TrustedProxies are the networks whose X-Forwarded-For, Forwarded and
	// X-Forwarded-Proto values are kept (and appended to). From anyone else
	// those headers are replaced. Flag -http-trusted-proxy (repeatable CIDR).
	TrustedProxies []netip.Prefix
	// RequestID makes every request carry an X-Request-ID to its backend:
	// a trusted proxy's (TrustedProxies) is kept, anyone else's replaced
	// by 32 hex digits made here. The id is in the access log and in the
	// answers sluice makes itself. Flag -http-request-id (on by default).
	RequestID bool
	// ProxyFrom are the networks (layer-4 balancers) whose connections
	// must start with a PROXY protocol header (v1 or v2, before TLS on
	// the HTTPS listener): the client address it carries is the client's
	// everywhere. From any other source a header is refused. Flag
	// -proxy-protocol-from (repeatable CIDR).
	ProxyFrom []netip.Prefix
	// ProxyTimeout bounds the wait for that header, from accept. Flag
	// -proxy-protocol-timeout.
	ProxyTimeout time.Duration

	// StickyCookie names the signed balancer cookie; "-" disables it. Flag
	// -http-sticky-cookie.
	StickyCookie string
	// StickyTTL is the lifetime of the sticky cookie; it is renewed when
	// less than half is left. Flag -http-sticky-ttl.
	StickyTTL time.Duration
	// AppCookie names an application session cookie (e.g. JSESSIONID) to
	// learn from backends' Set-Cookie; "" disables. Flag
	// -http-sticky-app-cookie.
	AppCookie string
	// AppCookieTTL is how long a learned session id pins its backend after
	// it was last seen. Flag -http-sticky-app-ttl.
	AppCookieTTL time.Duration
	// AppCookieMax bounds the learned session table. Flag
	// -http-sticky-app-max.
	AppCookieMax int

	// HashKey is the key for the consistent-hash policy: "source" (client
	// address), "header:NAME" or "cookie:NAME". Flag -http-hash-key.
	HashKey string

	// MaxConns bounds the connections to each backend, of both engines
	// together (the loops' and the fasthttp engine's, which serves the
	// connections handed over). A source holds at most MaxConns/8 (at
	// least 1) backend connections at once, over all backends. Flag
	// -http-backend-max-conns.
	MaxConns int
	// ConnWait is how long a request waits for a free backend connection
	// when MaxConns are busy before it is answered 503. Flag
	// -http-backend-conn-wait.
	ConnWait time.Duration
	// ConnectTimeout bounds dialing a backend. Flag -http-connect-timeout.
	ConnectTimeout time.Duration
	// BackendTimeout bounds a whole exchange with a backend (write the
	// request, read the response head): the first-byte timeout. Flag
	// -http-backend-timeout (10 s), so that a backend that accepts and
	// never answers costs a client 10 s, not 30, before its request moves
	// to another backend (idempotent) or gets 504; an endpoint that takes
	// longer to start its answer needs a higher value.
	BackendTimeout time.Duration
	// BackendIdle closes backend connections idle this long. Flag
	// -http-backend-idle.
	BackendIdle time.Duration

	// MaxClientConns bounds the client connections open at once, on
	// either engine; a connection over it is closed unanswered. 0 derives
	// it from the descriptor limit (RLIMIT_NOFILE): half of what is left
	// after 64 descriptors reserved for listeners, health probes, the
	// store and the admin listener, as each client connection may hold a
	// backend connection. Flag -http-max-conns.
	MaxClientConns int
	// MaxConnsPerSource bounds the client connections open at once from
	// one address (not counting -http-trusted-proxy addresses); 0 is one
	// eighth of MaxClientConns, at least 64. Flag
	// -http-max-conns-per-source.
	MaxConnsPerSource int

	// ClientReadTimeout bounds reading a client request (headers and
	// buffered body). Flag -http-client-timeout.
	ClientReadTimeout time.Duration
	// ClientIdle closes idle client keep-alive connections. Flag
	// -http-client-idle.
	ClientIdle time.Duration
	// StreamThreshold is the body size, in bytes, above which request
	// bodies are streamed to the backend instead of buffered. Response
	// bodies are always streamed. Flag -http-stream-threshold.
	StreamThreshold int

	// ResponseBuffer is the largest response body, in bytes, that the
	// fasthttp engine reads into memory before it is relayed, decided from
	// the answer's Content-Length once its head arrived; other answers
	// (larger, chunked, or delimited by close) are streamed from the same
	// exchange. 0 streams every response. Flag -http-response-buffer; -1
	// turns buffering off.
	ResponseBuffer int

	// Engine chooses how connections are driven: "loop" (default on
	// Linux) runs event loops over epoll that parse with fasthttp's header
	// types and hand any connection they do not handle (HTTP/1.0, chunked
	// or large request bodies, an Upgrade the allow-list does not forward,
	// Expect, malformed heads) to the
	// fasthttp server; "fasthttp" serves every connection with fasthttp's
	// goroutine per connection. Flag -http-engine.
	Engine string
	// Loops is the number of event loops of the loop engine; 0 is
	// GOMAXPROCS. Flag -http-loops.
	Loops int
	// IOURing makes the loop engine read each round's plain client and
	// backend sockets, and write its answers to plain HTTP clients and
	// requests to backends, as batches on an io_uring (one system call
	// for the round's reads and one for its writes instead of one per
	// socket), where the kernel allows it (5.18 or later); where it does
	// not, the loop says so once and reads and writes as without it. On
	// in DefaultConfig (the flag's default): on this project's 2-core
	// guest it takes system calls per request from 4.1 to 0.55 at 200
	// connections and 1.76x the requests per core (http/README.md); a
	// Config built without DefaultConfig leaves it off. Flag
	// -http-io-uring.
	IOURing bool

	// Upgrades are the protocols a client may switch to through sluice, a
	// comma list of Upgrade tokens (case-insensitive); "none" forwards no
	// upgrade. Only a GET without a body whose Upgrade names one of them
	// (and nothing else) keeps its Upgrade and Connection: upgrade towards
	// the backend; every other Upgrade is removed. h2c is never
	// forwarded. Flag -http-upgrade, default websocket.
	Upgrades string
	// MaxTunnels bounds the upgraded connections (tunnels) open at once,
	// counting upgrade requests waiting for their backend's answer; an
	// upgrade request over it is answered 503 before any backend is
	// contacted. Flag -http-max-tunnels.
	MaxTunnels int
	// TunnelIdle closes a tunnel that carried no byte either way for
	// this long. Flag -http-tunnel-idle.
	TunnelIdle time.Duration

	// RetryAfterNoBackend is the Retry-After of a 503 when no backend is
	// up.
	RetryAfterNoBackend time.Duration

	// Clock supplies monotonic time for admission and lb; nil is
	// admission.MonoClock.
	Clock admission.Clock
	// Now supplies wall time for cookie expiry; nil derives it from Clock.
	Now func() time.Time
	// ObserveForward, when set, is called with the time from a request's
	// arrival to the end of its forwarding (the backend's answer relayed,
	// or the error answered), for a latency histogram. It is called on the
	// request path: it must be quick and safe for concurrent use.
	ObserveForward func(time.Duration)
}

// DefaultConfig returns the defaults of every field: the one place they
// are written (flags take their defaults from here; New fills zero fields
// from here).
func DefaultConfig() Config {
	return Config{
		Listen:              ":8080",
		HandshakeTimeout:    10 * time.Second,
		RequestID:           true,
		ProxyTimeout:        5 * time.Second,
		StickyCookie:        "SLUICE",
		StickyTTL:           time.Hour,
		AppCookieTTL:        30 * time.Minute,
		AppCookieMax:        100000,
		HashKey:             "source",
		MaxConns:            1024,
		ConnWait:            100 * time.Millisecond,
		ConnectTimeout:      2 * time.Second,
		BackendTimeout:      10 * time.Second,
		BackendIdle:         30 * time.Second,
		ClientReadTimeout:   60 * time.Second,
		ClientIdle:          120 * time.Second,
		StreamThreshold:     1 << 20,
		ResponseBuffer:      64 << 10,
		Engine:              DefaultEngine,
		IOURing:             true,
		Upgrades:            "websocket",
		MaxTunnels:          10000,
		TunnelIdle:          time.Hour,
		RetryAfterNoBackend: 5 * time.Second,
	}
}

// setDefaults fills the zero fields from DefaultConfig.
func (c *Config) setDefaults() {
	d := DefaultConfig()
	fill(&c.Listen, d.Listen)
	fill(&c.HandshakeTimeout, d.HandshakeTimeout)
	fill(&c.ProxyTimeout, d.ProxyTimeout)
	fill(&c.StickyCookie, d.StickyCookie)
	fill(&c.StickyTTL, d.StickyTTL)
	fill(&c.AppCookieTTL, d.AppCookieTTL)
	fill(&c.AppCookieMax, d.AppCookieMax)
	fill(&c.HashKey, d.HashKey)
	fill(&c.MaxConns, d.MaxConns)
	fill(&c.ConnWait, d.ConnWait)
	fill(&c.ConnectTimeout, d.ConnectTimeout)
	fill(&c.BackendTimeout, d.BackendTimeout)
	fill(&c.BackendIdle, d.BackendIdle)
	fill(&c.ClientReadTimeout, d.ClientReadTimeout)
	fill(&c.ClientIdle, d.ClientIdle)
	fill(&c.StreamThreshold, d.StreamThreshold)
	fill(&c.ResponseBuffer, d.ResponseBuffer)
	if c.ResponseBuffer < 0 {
		c.ResponseBuffer = 0
	}
	if c.MaxClientConns == 0 {
		c.MaxClientConns = defaultMaxClientConns(fdLimit())
	}
	if c.MaxConnsPerSource == 0 {
		c.MaxConnsPerSource = defaultMaxConnsPerSource(c.MaxClientConns)
	}
	fill(&c.RetryAfterNoBackend, d.RetryAfterNoBackend)
	fill(&c.Engine, d.Engine)
	fill(&c.Upgrades, d.Upgrades)
	fill(&c.MaxTunnels, d.MaxTunnels)
	fill(&c.TunnelIdle, d.TunnelIdle)
	if c.Clock == nil {
		c.Clock = admission.MonoClock{}
	}
}

// fill sets *p to def when *p is the zero value.
func fill[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// ListenOff is the Config.Listen of a front end that serves HTTPS only.
const ListenOff = "off"

// Engine names (Config.Engine).
const (
	EngineLoop     = "loop"
	EngineFastHTTP = "fasthttp"
)

// FieldError reports an invalid Config field by its Go name (e.g.
// "StickyTTL"); it is admission.FieldError, the one type of every package,
// with Pkg "http". cmd/sluice maps the field to its flag.
type FieldError = admission.FieldError

func fieldError(field, format string, a ...any) error {
	return admission.NewFieldError("http", field, format, a...)
}

// Validate reports the first invalid field as a *FieldError.
func (c *Config) Validate() error {
	switch {
	case c.StickyTTL < time.Second:
		return fieldError("StickyTTL", "must be at least 1s (got %s)", c.StickyTTL)
	case c.StickyCookie != "-" && !validCookieName(c.StickyCookie):
		return fieldError("StickyCookie", "%q is not a valid cookie name", c.StickyCookie)
	case c.AppCookie != "" && !validCookieName(c.AppCookie):
		return fieldError("AppCookie", "%q is not a valid cookie name", c.AppCookie)
	case c.AppCookieTTL < 0:
		return fieldError("AppCookieTTL", "must be positive")
	case c.AppCookieMax < 0:
		return fieldError("AppCookieMax", "must be positive")
	case c.MaxConns < 0:
		return fieldError("MaxConns", "must be positive")
	case c.ConnWait < 0:
		return fieldError("ConnWait", "must not be negative")
	case c.ConnectTimeout < 0:
		return fieldError("ConnectTimeout", "must be positive")
	case c.BackendTimeout < 0:
		return fieldError("BackendTimeout", "must be positive")
	case c.BackendIdle < 0:
		return fieldError("BackendIdle", "must be positive")
	case c.MaxClientConns < 0:
		return fieldError("MaxClientConns", "must not be negative (0: derived from the descriptor limit)")
	case c.MaxConnsPerSource < 0:
		return fieldError("MaxConnsPerSource", "must not be negative (0: an eighth of the connection limit)")
	case c.ClientReadTimeout < 0:
		return fieldError("ClientReadTimeout", "must be positive")
	case c.ClientIdle < 0:
		return fieldError("ClientIdle", "must be positive")
	case c.StreamThreshold < 0:
		return fieldError("StreamThreshold", "must be positive")
	case c.Engine != EngineLoop && c.Engine != EngineFastHTTP:
		return fieldError("Engine", "%q: want %s or %s", c.Engine, EngineLoop, EngineFastHTTP)
	case c.Engine == EngineLoop && !loopSupported:
		return fieldError("Engine", "%s needs Linux (epoll); use %s", EngineLoop, EngineFastHTTP)
	case c.Loops < 0:
		return fieldError("Loops", "must not be negative")
	case c.ProxyTimeout < 0:
		return fieldError("ProxyTimeout", "must be positive (got %s)", c.ProxyTimeout)
	case c.HandshakeTimeout < 0:
		return fieldError("HandshakeTimeout", "must be positive (got %s)", c.HandshakeTimeout)
	case c.Listen == ListenOff && c.TLSListen == "":
		return fieldError("Listen", "%q serves no plain HTTP: it needs an HTTPS listener (-https-listen)", ListenOff)
	case c.TLSListen != "" && c.TLSConfig == nil:
		return fieldError("TLSListen", "HTTPS listener %s needs certificates (-tls-cert)", c.TLSListen)
	case c.MaxTunnels < 0:
		return fieldError("MaxTunnels", "must be positive (got %d)", c.MaxTunnels)
	case c.TunnelIdle < 0:
		return fieldError("TunnelIdle", "must be positive (got %s)", c.TunnelIdle)
	}
	if _, err := parseUpgrades(c.Upgrades); err != nil {
		return err
	}
	if _, _, err := parseHashKey(c.HashKey); err != nil {
		return err
	}
	return nil
}

// hashKind says what a consistent-hash key is taken from.
type hashKind uint8

const (
	hashSource hashKind = iota
	hashHeader
	hashCookie
)

func parseHashKey(s string) (hashKind, string, error) {
	kind, name, _ := strings.Cut(s, ":")
	switch strings.ToLower(kind) {
	case "source", "src", "ip":
		return hashSource, "", nil
	case "header":
		if name != "" {
			return hashHeader, name, nil
		}
	case "cookie":
		if validCookieName(name) {
			return hashCookie, name, nil
		}
	}
	return 0, "", fieldError("HashKey", "%q: want source, header:NAME or cookie:NAME", s)
}

// validCookieName reports whether s is an RFC 6265 token.
func validCookieName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}

// ParseTrustedProxies parses a comma-separated list of CIDRs or single
// addresses for -http-trusted-proxy.
func ParseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if p, err := netip.ParsePrefix(f); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fieldError("TrustedProxies", "%q: not a CIDR or address", f)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// BackendSpec is one -http-backend value: ADDR[,weight=N][,metrics=URL]
// [,health=PATH][,id=NAME], the grammar of lb.ParseBackendSpec.
type BackendSpec struct {
	Addr       string // host:port
	ID         string // default Addr
	Weight     int    // default 1
	MetricsURL string // memory probe for MOP; "" disables MOP for it
	HealthPath string // active HTTP health check path; "" probes GET /
}

// Prober is the active health check of the backend: an HTTP GET of
// HealthPath (2xx/3xx up), or without one a GET / where any answer below
// 500 is up. Either fails on a backend that accepts connections and never
// answers, which a TCP connect would pass.
func (b BackendSpec) Prober() lb.Prober {
	if b.HealthPath != "" {
		return lb.HTTPProber{Path: b.HealthPath}
	}
	return lb.HTTPProber{Path: "/", AnyBelow500: true}
}

// ParseBackend parses a -http-backend value with lb.ParseBackendSpec.
func ParseBackend(s string) (BackendSpec, error) {
	b, err := lb.ParseBackendSpec("http", s)
	if err != nil {
		return BackendSpec{}, fmt.Errorf("http %w", err)
	}
	return BackendSpec{Addr: b.Addr, ID: b.ID, Weight: b.Weight, MetricsURL: b.MetricsURL, HealthPath: b.HealthPath}, nil
}
