// Package sipdemo is the SIP backend of `sluice demo`: a user agent
// server on sipgo that answers INVITE and holds real memory per dialog until
// BYE or a timeout, and reports that memory on an HTTP metrics listener as
// package demo does for its HTTP backend, so that sluice's memory overload
// protection (MOP) can learn the dialog rate it takes.
//
// It is a demo and a test peer, not a SIP application server: it does no
// media, no authentication and no retransmission of 2xx responses over UDP
// (RFC 3261 §13.3.1.4); dialogs are identified by Call-ID alone.
package sipdemo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/emiago/sipgo"
	"github.com/emiago/sipgo/sip"

	"github.com/sluicelb/sluice/demo"
)

// Defaults.
const (
	// DefaultDialogBytes is the memory one dialog holds: 64 KiB.
	DefaultDialogBytes = 64 << 10
	// DefaultDialogTimeout is how long a dialog holds memory when no BYE
	// comes.
	DefaultDialogTimeout = 30 * time.Second
)

// Config configures a UAS. Zero fields take their defaults.
type Config struct {
	// Name identifies the backend in Contact, logs and the metrics,
	// e.g. "s1". Default "sip".
	Name string
	// Addr is the SIP listen address, UDP and TCP on the same port
	// (port 0 picks one free for both). Default "127.0.0.1:0".
	Addr string
	// MetricsAddr is the HTTP listen address of /metrics and /health.
	// Default "127.0.0.1:0".
	MetricsAddr string
	// DialogBytes is the memory in bytes each dialog holds from its INVITE
	// until BYE, CANCEL or DialogTimeout. Default DefaultDialogBytes
	// (64 KiB).
	DialogBytes int
	// DialogTimeout is the longest a dialog holds memory without a BYE.
	// Default DefaultDialogTimeout (30s).
	DialogTimeout time.Duration
	// AnswerDelay is the time between 180 Ringing and 200 OK; during it a
	// CANCEL ends the call with 487. Default 0: 100 Trying, then 200 OK at
	// once.
	AnswerDelay time.Duration
	// MaxMemory is the maximum memory in bytes reported to the memory
	// probe. Default demo.DefaultMaxMemory (64 MiB).
	MaxMemory int64
	// BaseMemory is memory in bytes reported as used with no dialog.
	// Default 0.
	BaseMemory int64
	// Ledger, when set, is used instead of one built from MaxMemory and
	// BaseMemory; the UAS then does not close it. For tests with a fake
	// clock.
	Ledger *demo.Ledger
	// Logger receives the UAS's messages. sipgo's own messages go to it
	// at debug level: sipgo logs whole datagrams at error level, which is
	// noise in a demo. Default: discard.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Name == "" {
		c.Name = "sip"
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	if c.MetricsAddr == "" {
		c.MetricsAddr = "127.0.0.1:0"
	}
	if c.DialogBytes == 0 {
		c.DialogBytes = DefaultDialogBytes
	}
	if c.DialogTimeout == 0 {
		c.DialogTimeout = DefaultDialogTimeout
	}
	if c.MaxMemory == 0 {
		c.MaxMemory = demo.DefaultMaxMemory
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.DialogBytes < 0:
		return fmt.Errorf("sip backend %s: dialog bytes must not be negative (got %d)", c.Name, c.DialogBytes)
	case c.DialogTimeout < 0:
		return fmt.Errorf("sip backend %s: dialog timeout must not be negative", c.Name)
	case c.AnswerDelay < 0:
		return fmt.Errorf("sip backend %s: answer delay must not be negative", c.Name)
	case c.MaxMemory <= 0:
		return fmt.Errorf("sip backend %s: max memory must be positive (got %d)", c.Name, c.MaxMemory)
	case c.BaseMemory < 0:
		return fmt.Errorf("sip backend %s: base memory must not be negative (got %d)", c.Name, c.BaseMemory)
	}
	return nil
}

// UAS is a demo SIP user agent server. It answers:
//
//   - INVITE: 100 Trying, then (after AnswerDelay, with 180 Ringing) 200 OK
//     with a To-tag, a Contact, the request's Record-Route copied (RFC 3261
//     §12.1.1) and, when the INVITE offers SDP, an answer rejecting every
//     stream. From the INVITE on, the dialog holds DialogBytes of memory,
//     keyed by Call-ID. When the memory is exhausted (see demo.Ledger): 503
//     with Retry-After. An INVITE with a To-tag (re-INVITE) gets 200 on a
//     live dialog and 481 otherwise.
//   - ACK: nothing.
//   - CANCEL of a pending INVITE: 200, then 487 to the INVITE, and the
//     memory is released; a CANCEL matching nothing: 481.
//   - BYE: 200 and the memory is released; on an unknown dialog: 481.
//   - OPTIONS: 200.
//
// Other methods get 405. A UAS is safe for concurrent use.
type UAS struct {
	cfg       Config
	ledger    *demo.Ledger
	ownLedger bool
	logger    *slog.Logger

	ua      *sipgo.UserAgent
	srv     *sipgo.Server
	udp     net.PacketConn
	tcp     net.Listener
	host    string
	port    int
	metrics *http.Server
	mln     net.Listener

	serving sync.WaitGroup // listener goroutines

	mu       sync.Mutex // guards closed and the Add side of handlers
	closed   bool
	handlers sync.WaitGroup // request handlers in progress
	closing  chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// New validates cfg, listens for SIP on UDP and TCP at cfg.Addr and for
// HTTP at cfg.MetricsAddr, and starts serving.
func New(cfg Config) (*UAS, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u := &UAS{
		cfg:     cfg,
		ledger:  cfg.Ledger,
		logger:  cfg.Logger.With("component", "demo", "backend", cfg.Name),
		closing: make(chan struct{}),
	}
	if u.ledger == nil {
		l, err := demo.NewLedger(demo.LedgerConfig{Max: cfg.MaxMemory, Base: cfg.BaseMemory})
		if err != nil {
			return nil, fmt.Errorf("sip backend %s: %w", cfg.Name, err)
		}
		u.ledger, u.ownLedger = l, true
	}
	fail := func(err error) (*UAS, error) {
		u.closeListeners()
		if u.ownLedger {
			u.ledger.Close()
		}
		return nil, fmt.Errorf("sip backend %s: %w", cfg.Name, err)
	}
	if err := u.listen(); err != nil {
		return fail(err)
	}

	sipLog := slog.New(demoteHandler{u.logger.Handler()})
	ua, err := sipgo.NewUA(
		sipgo.WithUserAgent("sluice-demo-"+cfg.Name),
		sipgo.WithUserAgentHostname(u.host),
		sipgo.WithUserAgentTransportLayerOptions(sip.WithTransportLayerLogger(sipLog)),
		sipgo.WithUserAgentTransactionLayerOptions(
			sip.WithTransactionLayerLogger(sipLog),
			// Retransmitted 2xx or stray responses: nothing to do.
			sip.WithTransactionLayerUnhandledResponseHandler(func(*sip.Response) {}),
		),
	)
	if err != nil {
		return fail(fmt.Errorf("create user agent: %w", err))
	}
	srv, err := sipgo.NewServer(ua, sipgo.WithServerLogger(sipLog))
	if err != nil {
		ua.Close()
		return fail(fmt.Errorf("create server: %w", err))
	}
	u.ua, u.srv = ua, srv
	// The handler map has no lock: register everything before serving.
	srv.OnInvite(u.guard(u.onInvite))
	srv.OnAck(u.guard(func(*sip.Request, sip.ServerTransaction) {}))
	srv.OnCancel(u.guard(u.onCancel))
	srv.OnBye(u.guard(u.onBye))
	srv.OnOptions(u.guard(u.onOptions))

	u.metrics = &http.Server{
		Handler:           demo.NewMetricsMux(u.ledger),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(u.logger.Handler(), slog.LevelDebug),
	}
	u.serving.Add(3)
	go func() {
		defer u.serving.Done()
		srv.ServeUDP(u.udp)
	}()
	go func() {
		defer u.serving.Done()
		srv.ServeTCP(u.tcp)
	}()
	go func() {
		defer u.serving.Done()
		if err := u.metrics.Serve(u.mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			u.logger.Error("metrics listener stopped", "err", err)
		}
	}()
	u.logger.Info("demo sip backend listening", "sip", u.Addr(), "metrics", u.MetricsURL())
	return u, nil
}

// listen binds UDP, then TCP on the same port, then the metrics listener.
// With port 0 the TCP port may already be taken; a few fresh ports are tried.
func (u *UAS) listen() error {
	host, port, err := net.SplitHostPort(u.cfg.Addr)
	if err != nil {
		return fmt.Errorf("sip listen address %q: %w", u.cfg.Addr, err)
	}
	tries := 1
	if port == "0" {
		tries = 10
	}
	for i := 0; ; i++ {
		pc, err := net.ListenPacket("udp", u.cfg.Addr)
		if err != nil {
			return fmt.Errorf("listen udp %s: %w", u.cfg.Addr, err)
		}
		bound := pc.LocalAddr().(*net.UDPAddr)
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(bound.Port)))
		if err != nil {
			pc.Close()
			if i+1 < tries {
				continue
			}
			return fmt.Errorf("listen tcp %s: %w", u.cfg.Addr, err)
		}
		u.udp, u.tcp = pc, ln
		u.host, u.port = bound.IP.String(), bound.Port
		break
	}
	if unspecified(u.host) {
		// A wildcard listen address: give a reachable address in Contact.
		u.host = "127.0.0.1"
	}
	mln, err := net.Listen("tcp", u.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("listen metrics %s: %w", u.cfg.MetricsAddr, err)
	}
	u.mln = mln
	return nil
}

// unspecified reports whether ip is a wildcard address such as 0.0.0.0.
func unspecified(ip string) bool {
	a := net.ParseIP(ip)
	return a == nil || a.IsUnspecified()
}

func (u *UAS) closeListeners() {
	if u.udp != nil {
		u.udp.Close()
	}
	if u.tcp != nil {
		u.tcp.Close()
	}
	if u.mln != nil {
		u.mln.Close()
	}
}

// guard counts a handler in progress so that Close can wait for it, and
// drops requests that arrive while closing.
func (u *UAS) guard(h sipgo.RequestHandler) sipgo.RequestHandler {
	return func(req *sip.Request, tx sip.ServerTransaction) {
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			// sipgo handles each message on a goroutine of its own. One that
			// starts a transaction after Close has cleared the connection
			// pools opens a fresh connection to answer on; close it, or its
			// reader goroutine outlives the UAS. (A UDP listener's
			// connection ignores Close.)
			if stx, ok := tx.(*sip.ServerTx); ok && stx.Connection() != nil {
				stx.Connection().Close()
			}
			return
		}
		u.handlers.Add(1)
		u.mu.Unlock()
		defer u.handlers.Done()
		h(req, tx)
	}
}

// Name returns the backend's name.
func (u *UAS) Name() string { return u.cfg.Name }

// Addr returns the SIP address, host:port, for both UDP and TCP.
func (u *UAS) Addr() string { return net.JoinHostPort(u.host, strconv.Itoa(u.port)) }

// MetricsAddr returns the metrics listener's address, host:port.
func (u *UAS) MetricsAddr() string { return u.mln.Addr().String() }

// MetricsURL returns the URL of the memory metrics (see demo.MetricsHandler).
func (u *UAS) MetricsURL() string { return "http://" + u.MetricsAddr() + "/metrics" }

// HealthURL returns the URL of the health endpoint (see demo.HealthHandler).
func (u *UAS) HealthURL() string { return "http://" + u.MetricsAddr() + "/health" }

// Ledger returns the memory ledger of the dialogs.
func (u *UAS) Ledger() *demo.Ledger { return u.ledger }

func (u *UAS) onInvite(req *sip.Request, tx sip.ServerTransaction) {
	callID, ok := callIDOf(req)
	if !ok {
		u.respond(tx, req, sip.StatusBadRequest, "Missing Call-ID", nil)
		return
	}
	if to := req.To(); to != nil && to.Params.Has("tag") {
		// A re-INVITE: the dialog exists or it does not; nothing new is held.
		if !u.ledger.Holds(callID) {
			u.respond(tx, req, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist", nil)
			return
		}
		u.answer(tx, req, "")
		return
	}
	u.respond(tx, req, sip.StatusTrying, "Trying", nil)

	if err := u.ledger.Hold(callID, u.cfg.DialogBytes, u.cfg.DialogTimeout); err != nil {
		// Out of memory: a real server fails the call too. Retry-After
		// makes a balancer send it no new work for a while (RFC 3261
		// §21.5.4).
		u.respond(tx, req, sip.StatusServiceUnavailable, "Out Of Memory", func(res *sip.Response) {
			res.AppendHeader(sip.NewHeader("Retry-After", "1"))
		})
		return
	}
	// A CANCEL may come any time before the 200 is sent. The callback runs
	// before the transaction sends 487: releasing here means the memory is
	// gone by the time the caller learns of it.
	cancelled := make(chan struct{})
	var once sync.Once
	if !tx.OnCancel(func(*sip.Request) {
		u.ledger.Release(callID)
		once.Do(func() { close(cancelled) })
	}) {
		u.ledger.Release(callID) // cancelled or ended already
		return
	}
	tag := newTag()
	if u.cfg.AnswerDelay > 0 {
		u.respond(tx, req, sip.StatusRinging, "Ringing", func(res *sip.Response) { setTag(res, tag) })
		t := time.NewTimer(u.cfg.AnswerDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-cancelled:
			return
		case <-tx.Done():
			u.ledger.Release(callID)
			return
		case <-u.closing:
			u.respond(tx, req, sip.StatusServiceUnavailable, "Shutting Down", nil)
			u.ledger.Release(callID)
			return
		}
	}
	u.answer(tx, req, tag)
}

// answer sends 200 OK with tag as the To-tag ("" keeps the request's).
func (u *UAS) answer(tx sip.ServerTransaction, req *sip.Request, tag string) {
	var body []byte
	if ct := req.ContentType(); ct != nil && strings.EqualFold(ct.Value(), "application/sdp") && len(req.Body()) > 0 {
		body = sdpAnswer(req.Body(), u.host)
	}
	u.respond(tx, req, sip.StatusOK, "OK", func(res *sip.Response) {
		if tag != "" {
			setTag(res, tag)
		}
		// NewResponseFromRequest copies Record-Route into a 2xx to an INVITE;
		// make sure of it, since a record-routing proxy relies on it.
		if res.GetHeader("Record-Route") == nil {
			sip.CopyHeaders("Record-Route", req, res)
		}
		res.AppendHeader(u.contact(req))
		if body != nil {
			res.AppendHeader(sip.NewHeader("Content-Type", "application/sdp"))
		}
	}, body)
}

func (u *UAS) onCancel(req *sip.Request, tx sip.ServerTransaction) {
	// A CANCEL matching a pending INVITE is answered by the transaction
	// layer (200, then 487 to the INVITE). Reaching here, it matches nothing
	// (RFC 3261 §9.2).
	u.respond(tx, req, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist", nil)
}

func (u *UAS) onBye(req *sip.Request, tx sip.ServerTransaction) {
	callID, ok := callIDOf(req)
	if !ok || !u.ledger.Release(callID) {
		u.respond(tx, req, sip.StatusCallTransactionDoesNotExists, "Call/Transaction Does Not Exist", nil)
		return
	}
	u.respond(tx, req, sip.StatusOK, "OK", nil)
}

func (u *UAS) onOptions(req *sip.Request, tx sip.ServerTransaction) {
	u.respond(tx, req, sip.StatusOK, "OK", func(res *sip.Response) {
		res.AppendHeader(sip.NewHeader("Allow", "INVITE, ACK, CANCEL, BYE, OPTIONS"))
		res.AppendHeader(sip.NewHeader("Accept", "application/sdp"))
	})
}

// respond builds a response to req, lets edit add to it, and sends it on
// tx. An optional body is set last so Content-Length matches.
func (u *UAS) respond(tx sip.ServerTransaction, req *sip.Request, code int, reason string, edit func(*sip.Response), body ...[]byte) {
	res := sip.NewResponseFromRequest(req, code, reason, nil)
	if edit != nil {
		edit(res)
	}
	if len(body) > 0 && body[0] != nil {
		res.SetBody(body[0])
	}
	if err := tx.Respond(res); err != nil {
		u.logger.Debug("send response failed", "code", code, "err", err)
	}
}

// contact is this backend's Contact for the transport req came on.
func (u *UAS) contact(req *sip.Request) *sip.ContactHeader {
	uri := sip.Uri{User: u.cfg.Name, Host: u.host, Port: u.port, UriParams: sip.NewParams()}
	if t := strings.ToLower(req.Transport()); t != "" && t != "udp" {
		uri.UriParams.Add("transport", t)
	}
	return &sip.ContactHeader{Address: uri}
}

func callIDOf(req *sip.Request) (string, bool) {
	h := req.CallID()
	if h == nil || h.Value() == "" {
		return "", false
	}
	return h.Value(), true
}

func setTag(res *sip.Response, tag string) {
	if to := res.To(); to != nil {
		to.Params.Add("tag", tag)
	}
}

// newTag returns a To-tag of 16 random hex digits (RFC 3261 §19.3).
func newTag() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// sdpAnswer answers an SDP offer by rejecting every stream: one m= line per
// offered one, with port 0 (RFC 3264 §6). The demo carries no media.
func sdpAnswer(offer []byte, host string) []byte {
	var b strings.Builder
	b.WriteString("v=0\r\n")
	fmt.Fprintf(&b, "o=- 1 1 IN IP4 %s\r\n", host)
	b.WriteString("s=-\r\n")
	fmt.Fprintf(&b, "c=IN IP4 %s\r\n", host)
	b.WriteString("t=0 0\r\n")
	for _, line := range strings.Split(string(offer), "\n") {
		line = strings.TrimRight(line, "\r")
		if !strings.HasPrefix(line, "m=") {
			continue
		}
		// m=<media> <port> <proto> <fmt> ...
		f := strings.Fields(line[2:])
		if len(f) < 4 {
			continue
		}
		fmt.Fprintf(&b, "m=%s 0 %s %s\r\n", f[0], f[2], f[3])
	}
	return []byte(b.String())
}

// Close stops the UAS: it stops taking requests, ends calls waiting to be
// answered, closes its listeners and connections, and frees its memory.
func (u *UAS) Close() error {
	u.closeOnce.Do(func() {
		u.mu.Lock()
		u.closed = true
		u.mu.Unlock()
		close(u.closing)
		u.handlers.Wait()

		u.udp.Close()
		u.tcp.Close()
		err := u.ua.Close()
		if mErr := u.metrics.Close(); mErr != nil {
			err = errors.Join(err, mErr)
		}
		u.serving.Wait()
		if u.ownLedger {
			u.ledger.Close()
		}
		if err != nil {
			u.closeErr = fmt.Errorf("sip backend %s: close: %w", u.cfg.Name, err)
		}
		u.logger.Info("demo sip backend stopped")
	})
	return u.closeErr
}

// Shutdown is Close; ctx is unused. It lets the UAS stop like an
// *http.Server or demo.HTTPBackend.
func (u *UAS) Shutdown(ctx context.Context) error { return u.Close() }

// demoteHandler passes sipgo's records on at debug level: sipgo logs
// malformed datagrams in full at error level, which is noise for a demo
// backend but useful when debugging one.
type demoteHandler struct{ h slog.Handler }

func (d demoteHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d demoteHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d demoteHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return demoteHandler{d.h.WithAttrs(as)}
}

func (d demoteHandler) WithGroup(name string) slog.Handler {
	return demoteHandler{d.h.WithGroup(name)}
}
