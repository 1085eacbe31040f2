package sip

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// Config configures the SIP front end. Each field maps to one flag of
// cmd/sluice; New fills zero fields from DefaultConfig.
type Config struct {
	// Listen is the address served on both UDP and TCP. Flag -sip-listen.
	Listen string
	// Advertise is the host:port written into our Via and Record-Route and
	// recognised in Route and Request-URI. Flag -sip-advertise. Default: the
	// listen address, or, when that has no IP, the local address the kernel
	// picks to reach the first backend.
	Advertise string
	// Backends are the upstreams, each in its pools (none: the pool
	// "default"); New builds its backend generation from them, without
	// routes. Empty when the generation is handed in with SetGeneration.
	// Flag -sip-backend (repeatable).
	Backends []BackendConfig
	// Policy selects a backend for new work. Flag -sip-lb-policy: "hash"
	// (consistent hash on Call-ID) or one of lb.PolicyNames.
	Policy string
	// TokenTTL is how long the signed backend token in our Record-Route
	// stays valid: the longest dialog we keep affinity for. Flag
	// -sip-affinity-ttl.
	TokenTTL time.Duration
	// DialogTTL is how long an entry of the dialog table lives without an
	// in-dialog request: a bit more than the longest call expected. Flag
	// -sip-dialog-ttl.
	DialogTTL time.Duration
	// AccessLogDialogs adds to the access log one summary record per
	// dialog when it ends (its BYE answered; without one, -sip-dialog-ttl
	// after its 2xx): duration and which side hung up. Flag
	// -sip-access-log-dialogs.
	AccessLogDialogs bool
	// DialogMax caps the dialog table's entries (dialogEntryBytes each,
	// so also its memory). When full, new dialogs are not recorded and
	// their in-dialog requests without our Route go by Call-ID hash. Flag
	// -sip-dialog-max.
	DialogMax int
	// UnknownDialog says what happens to a request with a To-tag that
	// carries no token of ours and whose dialog the dialog table does not
	// know: "new-work" (default: routed by Call-ID hash, admitted like
	// new work), "reject" (481) or "hash" (routed by Call-ID hash as
	// affinity, past every guard). Flag -sip-unknown-dialog.
	UnknownDialog string
	// UnknownDialogSourceRate caps, per source IP address, the requests
	// of unknown dialogs admitted per second under "new-work", before
	// the ARM rules see them; 0 is no cap. Flag
	// -sip-unknown-dialog-source-rate.
	UnknownDialogSourceRate int
	// FailoverTimeout is how long new work waits for a first response from
	// a backend before it is moved to the next one. Flag
	// -sip-failover-timeout.
	FailoverTimeout time.Duration
	// InDialogTimeout is how long an in-dialog request (not ACK) waits for
	// any answer from its backend before the client gets our 408: a
	// backend that died mid-call must not leave the client in silence
	// until its own Timer F (32 s). Flag -sip-in-dialog-timeout (8 s, a
	// quarter of Timer F).
	InDialogTimeout time.Duration
	// BusyDefault is how long a backend that answered 503 without a
	// Retry-After is busy: it gets no new work, at most lb.MaxAvoid (5 min,
	// the cap of every back-off), and the Retry-After of our own 503s.
	// Flag -sip-busy-default (formerly -sip-drain-default: "drain" is an
	// operator's drain of a backend).
	BusyDefault time.Duration
	// HealthInterval is the OPTIONS ping period per backend; 0 disables
	// pinging. Flag -sip-health-interval.
	HealthInterval time.Duration
	// HealthTimeout is how long a ping waits for an answer. Flag
	// -sip-health-timeout.
	HealthTimeout time.Duration
	// HealthRise and HealthFall are the consecutive answered / unanswered
	// pings that mark a backend up / down. Flags -sip-health-rise and
	// -sip-health-fall.
	HealthRise, HealthFall int
	// TCPIdleTimeout closes a TCP connection that received nothing for this
	// long. Flag -sip-tcp-idle-timeout.
	TCPIdleTimeout time.Duration
	// TCPMessageTimeout closes a TCP connection whose message is not
	// complete this long after its first byte. Unlike the idle timeout it
	// is not restarted by each byte, so a peer that trickles bytes cannot
	// hold a connection. Flag -sip-tcp-message-timeout.
	TCPMessageTimeout time.Duration
	// TCPMaxConns bounds the accepted TCP connections. When the table is
	// full, a new connection takes the place of the one idle the longest (no
	// complete message for the longest time, none half received, nothing
	// queued for it); only when every connection looked at is busy is the
	// new one closed. Flag -sip-tcp-max-conns.
	TCPMaxConns int
	// TCPMaxConnsPerSource bounds the accepted TCP connections of one IPv4
	// address or IPv6 /64; more are closed at once. Flag
	// -sip-tcp-max-conns-per-source.
	TCPMaxConnsPerSource int
	// ProxyFrom are the networks (layer-4 balancers) whose TCP and TLS
	// connections must start with a PROXY protocol header (v1 or v2,
	// before TLS): the client address it carries is the connection's
	// source everywhere (Via received/rport, the per-source cap, the
	// sticky source hash, logs). From any other source a header is
	// refused. Flag -proxy-protocol-from (repeatable CIDR).
	ProxyFrom []netip.Prefix
	// ProxyTimeout bounds the wait for that header, from accept. Flag
	// -proxy-protocol-timeout.
	ProxyTimeout time.Duration
	// TCPFirstMessageTimeout closes an accepted TCP connection that has not
	// sent a complete message this long after it was accepted; keep-alives
	// do not count. Flag -sip-tcp-first-message-timeout.
	TCPFirstMessageTimeout time.Duration
	// TCPPartialBudget bounds the bytes buffered, over every accepted TCP
	// connection, for messages not yet complete. Past it the connection
	// holding the most is closed (the oldest among equals). Flag
	// -sip-tcp-partial-budget.
	TCPPartialBudget int
	// UDPBuffer is the socket receive and send buffer in bytes. Flag
	// -sip-udp-buffer (the kernel may cap it at
	// net.core.rmem_max).
	UDPBuffer int
	// UDPBatch is the most datagrams one read of the UDP socket returns:
	// above 1 a recvmmsg call on Linux (udpio_linux.go), 1 net's call, one
	// datagram a call, as on systems without recvmmsg. Flag
	// -sip-udp-batch.
	UDPBatch int
	// UDPRawSend sends UDP datagrams with raw sendto calls (Linux) rather
	// than net's call, which goes through the runtime's syscall path;
	// DefaultUDPBatch says what it saves. On in DefaultConfig; New does
	// not fill it (false is a setting). Flag -sip-udp-raw-send.
	UDPRawSend bool
	// UDPSendBatch queues the UDP datagrams produced while a read batch
	// (UDPBatch above 1) is handled and sends them with one sendmmsg at
	// its end (udpbatch.go); a batch of one datagram sends at once. On in
	// DefaultConfig; New does not fill it. Flag -sip-udp-send-batch.
	UDPSendBatch bool
	// UDPFastPath relays responses with our Via on top and a client's
	// in-dialog ACK or BYE with our Route over UDP without sipgo's parse
	// and re-serialisation when a byte scan is certain sipgo reads them
	// the same way (fastresp.go, fastreq.go); false sends every message
	// through sipgo. On in DefaultConfig; New does not fill it. Flag
	// -sip-udp-fast-path.
	UDPFastPath bool
	// MaxMessage is the largest message accepted, in bytes. Flag
	// -sip-max-message.
	MaxMessage int
	// TLSListen is the address of the SIP over TLS listener (RFC 3261
	// §26.2, sips: and transport=tls), "" for none; it needs TLSConfig.
	// Flag -sip-tls-listen.
	TLSListen string
	// WSListen and WSSListen are the addresses of the SIP over WebSocket
	// and secure WebSocket listeners (RFC 7118), "" for none; WSS needs
	// TLSConfig. Flags -sip-ws-listen, -sip-wss-listen.
	WSListen, WSSListen string
	// TLSAdvertise, WSAdvertise and WSSAdvertise are the host:port each
	// edge listener is known by (Kamailio's "listen=tls:IP:5061 advertise
	// HOST:PORT"): the client-facing Record-Route of its clients, and,
	// for TLSAdvertise, every entry a TLS backend reaches us by (its
	// Record-Route, Path, Contact alias, Via). Each is recognised as ours
	// in Route and Request-URI. Default: the listener's bound address, or,
	// when it is bound to no IP, the host of Advertise with the
	// listener's port. Flags -sip-tls-advertise, -sip-ws-advertise,
	// -sip-wss-advertise.
	TLSAdvertise, WSAdvertise, WSSAdvertise string
	// TLSConfig serves the certificates of the TLS and WSS listeners
	// (node builds it from the -tls-cert store); nil: no TLS.
	TLSConfig *tls.Config
	// Handshakes bounds the TLS and WebSocket handshakes in progress and
	// their rate; nil: no bound.
	Handshakes HandshakeGate
	// HandshakeTimeout bounds a TLS or WebSocket handshake (both for WSS)
	// from accept to its end. Set by node from -tls-handshake-timeout.
	HandshakeTimeout time.Duration
	// WSOrigins, when not empty, are the only Origin values (as a browser
	// sends them, e.g. https://phone.example.com; case aside) a WebSocket
	// handshake may carry; one without an Origin is then refused too
	// (403). Flag -sip-ws-origin (repeatable).
	WSOrigins []string
	// WSPath, when set, is the only request path a WebSocket handshake
	// may ask for (404 otherwise); the query is not compared. Flag
	// -sip-ws-path.
	WSPath string
	// NoRouteCode is the final answer to new work that no route matches
	// when the generation has no pool "default": 400..699, default 404
	// (Not Found). Flag -sip-no-route-code.
	NoRouteCode int
	// ContactAlias rewrites the Contact of a REGISTER or an initial
	// INVITE from a client connection (TCP, TLS, WS) to point at sluice
	// with a signed parameter naming that connection, so a backend
	// without Path support (RFC 3327) reaches the client through us:
	// what Kamailio's add_contact_alias/handle_ruri_alias do, signed so
	// the parameter names one live connection of this node and no other
	// address. Flag -sip-contact-alias.
	ContactAlias bool
	// AllowSipsDowngrade lets a sips: request go on over UDP or TCP;
	// without it such a request gets 480 with a Warning (RFC 5630: sips
	// asks for TLS on every hop). Flag -sip-allow-sips-downgrade.
	AllowSipsDowngrade bool
}

// BackendConfig is one -sip-backend value:
// ADDR[,transport=udp|tcp][,weight=N][,metrics=URL][,id=NAME][,pool=NAME...][,proxy=v1|v2],
// the grammar of lb.ParseBackendSpec.
type BackendConfig struct {
	// ID names the backend in tokens, logs and metrics. Default: ADDR.
	ID string
	// Addr is the backend's IP:port (a host name is resolved once at start).
	Addr string
	// Transport is "udp" (default), "tcp" or "tls".
	Transport string
	// CAFile and SNI are a TLS backend's certificate authorities (PEM;
	// "" is the system's) and the name its certificate must be valid
	// for ("" is the host of Addr).
	CAFile, SNI string
	// Weight is the relative share of new work, default 1.
	Weight int
	// MetricsURL is the backend's memory probe (Prometheus text), optional.
	MetricsURL string
	// Pools are the pools the backend is a member of (pool=NAME,
	// repeatable); none is the pool "default".
	Pools []string
	// Proxy is the PROXY protocol version (1 or 2; 0: none) that starts
	// each connection to the backend, transport tcp or tls only: one
	// connection per client, its header naming the client (proxyout.go).
	Proxy uint8
}

// ParseBackend parses a -sip-backend value with lb.ParseBackendSpec.
func ParseBackend(s string) (BackendConfig, error) {
	b, err := lb.ParseBackendSpec("sip", s)
	if err != nil {
		return BackendConfig{}, fmt.Errorf("sip %w", err)
	}
	bc := BackendConfig{ID: b.ID, Addr: b.Addr, Transport: b.Transport, CAFile: b.CAFile, SNI: b.SNI, Weight: b.Weight, MetricsURL: b.MetricsURL, Proxy: b.Proxy}
	if len(b.Pools) != 1 || b.Pools[0] != lb.DefaultPool {
		bc.Pools = b.Pools
	}
	return bc, nil
}

// Defaults of the dialog table. Entries idle for an hour go. Three million
// entries hold 10,000 calls/s of 180 s (1.8 M live dialogs) plus the
// 32 s linger of ended ones (about 0.35 M) with room to spare, in at most
// 3e6 × dialogEntryBytes = 192 MB (35 to 56 bytes measured per entry, so
// 105 to 168 MB in practice).
const (
	DefaultDialogTTL = time.Hour
	DefaultDialogMax = 3_000_000
)

// DefaultUnknownDialogSourceRate is the per-source cap of requests of
// unknown dialogs (-sip-unknown-dialog-source-rate): a UA or proxy in
// good order sends none (its requests carry our token or name a recorded
// dialog); a flood from one address gets 20/s, whatever the ARM rules
// would let through. Since 0 means "no cap", New cannot fill a zero from
// DefaultConfig: a Config built by hand gets no cap unless it sets one.
const DefaultUnknownDialogSourceRate = 20

// DefaultUDPBatch is the default -sip-udp-batch: 16 datagrams a read
// (recvmmsg on Linux), each in a buffer of its own of 64 KiB (1 MiB in
// all); 1 reads one datagram a call with net's call. MaxUDPBatch bounds it
// (4 MiB of buffers). DefaultConfig sends with raw sendto calls
// (UDPRawSend) and what one read batch produces with one sendmmsg
// (UDPSendBatch): together 0.80 of the CPU per call of net's sendto per
// datagram on a core of its own, 0.85–0.87 on a core shared with a busy
// loop, where net's path collapsed in 2 of 7 runs and this one in none
// (bench/RESULTS.md, "CPU per call"). A Config built by hand has both off
// (their zero values), as before.
const (
	DefaultUDPBatch = 16
	MaxUDPBatch     = 64
)

// ErrNoBackends is returned (in a FieldError) by New, SetBackends and
// Start when no backend is configured.
var ErrNoBackends = errors.New("at least one backend is required")

// FieldError reports an invalid Config field by its Go name (e.g.
// "TokenTTL"); it is admission.FieldError, the one type of every package,
// with Pkg "sip". cmd/sluice maps the field to its flag.
type FieldError = admission.FieldError

func fieldError(field, format string, a ...any) error {
	return admission.NewFieldError("sip", field, format, a...)
}

// DefaultConfig returns the defaults of every field: the one place they
// are written (flags take their defaults from here; New fills zero fields
// from here). HealthInterval's zero value disables pinging, so New keeps
// a zero there.
func DefaultConfig() Config {
	return Config{
		Listen:            ":5060",
		Policy:            "hash",
		TokenTTL:          24 * time.Hour,
		DialogTTL:         DefaultDialogTTL,
		DialogMax:         DefaultDialogMax,
		FailoverTimeout:   2 * time.Second,
		InDialogTimeout:   8 * time.Second,
		BusyDefault:       5 * time.Second,
		HealthInterval:    5 * time.Second,
		HealthTimeout:     2 * time.Second,
		HealthRise:        2,
		HealthFall:        3,
		TCPIdleTimeout:    5 * time.Minute,
		TCPMessageTimeout: 10 * time.Second,
		TCPMaxConns:       10000,
		UDPBuffer:         4 << 20,
		UDPBatch:          DefaultUDPBatch,
		UDPRawSend:        true,
		UDPSendBatch:      true,
		UDPFastPath:       true,
		MaxMessage:        65535,
		NoRouteCode:       404,
		HandshakeTimeout:  DefaultHandshakeTimeout,

		UnknownDialog:           UnknownDialogNewWork,
		UnknownDialogSourceRate: DefaultUnknownDialogSourceRate,
		// 256: one address is at most 2.5% of the default table, and a NAT
		// or an SBC/PBX with a connection per user or per call still gets
		// 256 (a single UA needs one or two, RFC 5626).
		TCPMaxConnsPerSource:   256,
		TCPFirstMessageTimeout: 10 * time.Second,
		ProxyTimeout:           5 * time.Second,
		// 64 MiB: about 1,000 maximal messages in flight at once; the
		// 10,000 default connections with 64 KiB each would be 640 MiB.
		TCPPartialBudget: 64 << 20,
	}
}

// setDefaults fills the zero fields, but HealthInterval, from
// DefaultConfig.
func (c *Config) setDefaults() {
	d := DefaultConfig()
	fill(&c.Listen, d.Listen)
	fill(&c.Policy, d.Policy)
	fill(&c.TokenTTL, d.TokenTTL)
	fill(&c.DialogTTL, d.DialogTTL)
	fill(&c.DialogMax, d.DialogMax)
	fill(&c.UnknownDialog, d.UnknownDialog)
	fill(&c.FailoverTimeout, d.FailoverTimeout)
	fill(&c.InDialogTimeout, d.InDialogTimeout)
	fill(&c.BusyDefault, d.BusyDefault)
	fill(&c.HealthTimeout, d.HealthTimeout)
	fill(&c.HealthRise, d.HealthRise)
	fill(&c.HealthFall, d.HealthFall)
	fill(&c.TCPIdleTimeout, d.TCPIdleTimeout)
	fill(&c.TCPMessageTimeout, d.TCPMessageTimeout)
	fill(&c.TCPMaxConns, d.TCPMaxConns)
	fill(&c.TCPMaxConnsPerSource, d.TCPMaxConnsPerSource)
	fill(&c.TCPFirstMessageTimeout, d.TCPFirstMessageTimeout)
	fill(&c.ProxyTimeout, d.ProxyTimeout)
	fill(&c.TCPPartialBudget, d.TCPPartialBudget)
	fill(&c.UDPBuffer, d.UDPBuffer)
	fill(&c.UDPBatch, d.UDPBatch)
	fill(&c.MaxMessage, d.MaxMessage)
	fill(&c.NoRouteCode, d.NoRouteCode)
	fill(&c.HandshakeTimeout, d.HandshakeTimeout)
}

// fill sets *p to def when *p is the zero value.
func fill[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// CheckSettings validates c's settings as New would, its backends aside
// (a node without SIP backends builds no Server, and a typo in a -sip-*
// flag would pass unseen until a configuration with SIP backends).
func CheckSettings(c Config) error {
	c.setDefaults()
	c.Backends = []BackendConfig{{ID: "check", Addr: "127.0.0.1:5060"}}
	return c.Validate()
}

// Validate reports the first invalid field as a *FieldError. It expects
// defaults to be filled. Backends may be empty: the server then serves a
// generation handed in with SetGeneration.
func (c *Config) Validate() error {
	switch {
	case c.Policy != "hash" && !slices.Contains(lb.PolicyNames, c.Policy):
		return fieldError("Policy", "%q: want hash, %s", c.Policy, strings.Join(lb.PolicyNames, ", "))
	case c.TokenTTL < time.Minute:
		return fieldError("TokenTTL", "must be at least 1m")
	case c.DialogTTL < time.Minute:
		return fieldError("DialogTTL", "must be at least 1m (a bit more than the longest call)")
	case c.DialogMax < 1:
		return fieldError("DialogMax", "must be at least 1")
	case !slices.Contains(UnknownDialogPolicies, c.UnknownDialog):
		return fieldError("UnknownDialog", "%q: want %s", c.UnknownDialog, strings.Join(UnknownDialogPolicies, ", "))
	case c.UnknownDialogSourceRate < 0:
		return fieldError("UnknownDialogSourceRate", "must not be negative (0: no per-source cap)")
	case c.FailoverTimeout < 10*time.Millisecond:
		return fieldError("FailoverTimeout", "must be at least 10ms")
	case c.BusyDefault < 0:
		return fieldError("BusyDefault", "must not be negative")
	case c.InDialogTimeout < 10*time.Millisecond:
		return fieldError("InDialogTimeout", "must be at least 10ms")
	case c.HealthInterval < 0:
		return fieldError("HealthInterval", "must not be negative")
	case c.HealthInterval > 0 && c.HealthTimeout >= c.HealthInterval:
		return fieldError("HealthTimeout", "must be shorter than HealthInterval")
	case c.HealthRise < 1:
		return fieldError("HealthRise", "must be at least 1")
	case c.HealthFall < 1:
		return fieldError("HealthFall", "must be at least 1")
	case c.TCPIdleTimeout < time.Second:
		return fieldError("TCPIdleTimeout", "must be at least 1s")
	case c.TCPMessageTimeout < 100*time.Millisecond:
		return fieldError("TCPMessageTimeout", "must be at least 100ms")
	case c.TCPMaxConns < 1:
		return fieldError("TCPMaxConns", "must be at least 1")
	case c.TCPMaxConnsPerSource < 1:
		return fieldError("TCPMaxConnsPerSource", "must be at least 1")
	case c.ProxyTimeout < 0:
		return fieldError("ProxyTimeout", "must be positive (got %s)", c.ProxyTimeout)
	case c.TCPFirstMessageTimeout < 100*time.Millisecond:
		return fieldError("TCPFirstMessageTimeout", "must be at least 100ms")
	case c.UDPBuffer < 1<<16:
		return fieldError("UDPBuffer", "must be at least 65536")
	case c.UDPBatch < 1 || c.UDPBatch > MaxUDPBatch:
		return fieldError("UDPBatch", "%d: want 1..%d datagrams a read (1: one a call)", c.UDPBatch, MaxUDPBatch)
	case c.MaxMessage < 1024 || c.MaxMessage > 1<<20:
		return fieldError("MaxMessage", "must be in 1024..1048576")
	case c.NoRouteCode < 400 || c.NoRouteCode > 699:
		return fieldError("NoRouteCode", "%d: want a final answer code in 400..699 (default 404)", c.NoRouteCode)
	case c.TCPPartialBudget < 2*(c.MaxMessage+1):
		return fieldError("TCPPartialBudget", "must be at least twice MaxMessage + 1 (%d bytes)", 2*(c.MaxMessage+1))
	}
	if err := c.checkEdge(); err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, b := range c.Backends {
		if b.Transport == "tls" && c.TLSListen == "" {
			return tlsBackendNeedsListener(b.ID)
		}
		if ids[b.ID] {
			return fieldError("Backends", "duplicate id %q", b.ID)
		}
		ids[b.ID] = true
	}
	return nil
}

// hostPort is a parsed host:port with the port defaulted to 5060.
type hostPort struct {
	host string // lowercase; IPv6 without brackets
	port int
}

func parseHostPort(s string) (hostPort, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return hostPort{}, fmt.Errorf("parse address %q: %w", s, err)
	}
	port := 5060
	if p != "" {
		port, err = strconv.Atoi(p)
		if err != nil || port < 0 || port > 65535 {
			return hostPort{}, fmt.Errorf("parse address %q: bad port", s)
		}
	}
	return hostPort{host: strings.ToLower(h), port: port}, nil
}

func (hp hostPort) String() string {
	return net.JoinHostPort(hp.host, strconv.Itoa(hp.port))
}

// resolveAddr resolves a backend address to an IP:port once at start.
func resolveAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	ua, err := net.ResolveUDPAddr("udp", s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("resolve %s: %w", s, err)
	}
	return ua.AddrPort(), nil
}
