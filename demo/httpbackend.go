package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// HTTP backend defaults.
const (
	// DefaultSessionBytes is the memory one session holds: 64 KiB.
	DefaultSessionBytes = 64 << 10
	// DefaultSessionLifetime is how long a session holds its memory.
	DefaultSessionLifetime = 30 * time.Second
)

// SessionCookie is the name of the HTTP backend's session cookie, the
// application cookie a balancer may learn for stickiness (like JSESSIONID).
const SessionCookie = "DEMOSESSION"

// HTTPBackendConfig configures an HTTPBackend. Zero fields take their
// defaults.
type HTTPBackendConfig struct {
	// Name identifies the backend in its answers and logs, e.g. "h1".
	// Default "http".
	Name string
	// Addr is the listen address (host:port; port 0 picks a free one).
	// Default "127.0.0.1:0".
	Addr string
	// SessionBytes is the memory in bytes each live session holds.
	// Default DefaultSessionBytes (64 KiB).
	SessionBytes int
	// SessionLifetime is how long a session holds its memory, counted from
	// its first request; requests on a live session do not extend it.
	// Default DefaultSessionLifetime (30s).
	SessionLifetime time.Duration
	// MaxMemory is the maximum memory in bytes reported to the memory
	// probe. Default DefaultMaxMemory (64 MiB).
	MaxMemory int64
	// BaseMemory is memory in bytes reported as used with no session.
	// Default 0.
	BaseMemory int64
	// Ledger, when set, is used instead of one built from MaxMemory and
	// BaseMemory; the backend then does not close it. For tests with a
	// fake clock.
	Ledger *Ledger
	// Logger receives start and stop messages. Default: discard.
	Logger *slog.Logger
}

func (c *HTTPBackendConfig) setDefaults() {
	if c.Name == "" {
		c.Name = "http"
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:0"
	}
	if c.SessionBytes == 0 {
		c.SessionBytes = DefaultSessionBytes
	}
	if c.SessionLifetime == 0 {
		c.SessionLifetime = DefaultSessionLifetime
	}
	if c.MaxMemory == 0 {
		c.MaxMemory = DefaultMaxMemory
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first invalid field.
func (c HTTPBackendConfig) Validate() error {
	switch {
	case c.SessionBytes < 0:
		return fmt.Errorf("http backend %s: session bytes must not be negative (got %d)", c.Name, c.SessionBytes)
	case c.SessionLifetime < 0:
		return fmt.Errorf("http backend %s: session lifetime must not be negative", c.Name)
	case c.MaxMemory <= 0:
		return fmt.Errorf("http backend %s: max memory must be positive (got %d)", c.Name, c.MaxMemory)
	case c.BaseMemory < 0:
		return fmt.Errorf("http backend %s: base memory must not be negative (got %d)", c.Name, c.BaseMemory)
	}
	return nil
}

// HTTPBackend is a demo web application on its own listener. A request
// without a live DEMOSESSION cookie starts a session, which holds
// SessionBytes of memory for SessionLifetime; a request with one is served
// from it. On the same listener, /metrics serves the memory (see
// MetricsHandler), /health the OHI-style health (see HealthHandler), and
// /logout ends the caller's session at once.
type HTTPBackend struct {
	cfg       HTTPBackendConfig
	ledger    *Ledger
	ownLedger bool
	ln        net.Listener
	srv       *http.Server
	served    chan struct{} // closed when Serve has returned
	logger    *slog.Logger

	closeOnce sync.Once
	closeErr  error
}

// NewHTTPBackend validates cfg, listens on cfg.Addr and starts serving.
func NewHTTPBackend(cfg HTTPBackendConfig) (*HTTPBackend, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &HTTPBackend{
		cfg:    cfg,
		ledger: cfg.Ledger,
		served: make(chan struct{}),
		logger: cfg.Logger.With("component", "demo", "backend", cfg.Name),
	}
	if b.ledger == nil {
		l, err := NewLedger(LedgerConfig{Max: cfg.MaxMemory, Base: cfg.BaseMemory})
		if err != nil {
			return nil, fmt.Errorf("http backend %s: %w", cfg.Name, err)
		}
		b.ledger, b.ownLedger = l, true
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		if b.ownLedger {
			b.ledger.Close()
		}
		return nil, fmt.Errorf("http backend %s: listen %s: %w", cfg.Name, cfg.Addr, err)
	}
	b.ln = ln
	mux := NewMetricsMux(b.ledger)
	mux.HandleFunc("/logout", b.logout)
	mux.HandleFunc("/", b.serve)
	b.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(b.logger.Handler(), slog.LevelDebug),
	}
	go func() {
		defer close(b.served)
		if err := b.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			b.logger.Error("http backend stopped", "err", err)
		}
	}()
	b.logger.Info("demo http backend listening", "addr", b.Addr())
	return b, nil
}

// Name returns the backend's name.
func (b *HTTPBackend) Name() string { return b.cfg.Name }

// Addr returns the listening address, host:port.
func (b *HTTPBackend) Addr() string { return b.ln.Addr().String() }

// URL returns the backend's base URL, e.g. http://127.0.0.1:18081.
func (b *HTTPBackend) URL() string { return "http://" + b.Addr() }

// MetricsURL returns the URL of the backend's memory metrics.
func (b *HTTPBackend) MetricsURL() string { return b.URL() + "/metrics" }

// HealthURL returns the URL of the backend's health endpoint.
func (b *HTTPBackend) HealthURL() string { return b.URL() + "/health" }

// Ledger returns the backend's memory ledger.
func (b *HTTPBackend) Ledger() *Ledger { return b.ledger }

func (b *HTTPBackend) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if c, err := r.Cookie(SessionCookie); err == nil && b.ledger.Holds(c.Value) {
		fmt.Fprintf(w, "%s session %s\n", b.cfg.Name, c.Value)
		return
	}
	id := newSessionID()
	if err := b.ledger.Hold(id, b.cfg.SessionBytes, b.cfg.SessionLifetime); err != nil {
		// Out of memory (or closing): a real server would fail the
		// request too. 503 lets the balancer try another backend.
		w.Header().Set("Retry-After", "1")
		http.Error(w, b.cfg.Name+" out of memory", http.StatusServiceUnavailable)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name:     SessionCookie,
		Value:    id,
		Path:     "/",
		MaxAge:   int(b.cfg.SessionLifetime / time.Second),
		HttpOnly: true,
	})
	fmt.Fprintf(w, "%s new session %s\n", b.cfg.Name, id)
}

func (b *HTTPBackend) logout(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	c, err := r.Cookie(SessionCookie)
	if err != nil || !b.ledger.Release(c.Value) {
		fmt.Fprintf(w, "%s no session\n", b.cfg.Name)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1})
	fmt.Fprintf(w, "%s ended session %s\n", b.cfg.Name, c.Value)
}

// newSessionID returns 16 random hex digits.
func newSessionID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Shutdown stops accepting connections, waits for in-flight requests until
// ctx is done, then frees the backend's memory.
func (b *HTTPBackend) Shutdown(ctx context.Context) error {
	return b.stop(func() error { return b.srv.Shutdown(ctx) })
}

// Close stops the backend at once and frees its memory.
func (b *HTTPBackend) Close() error {
	return b.stop(b.srv.Close)
}

func (b *HTTPBackend) stop(f func() error) error {
	b.closeOnce.Do(func() {
		err := f()
		if err != nil {
			// Shutdown gave up waiting: cut the remaining connections.
			b.srv.Close()
			err = fmt.Errorf("http backend %s: shutdown: %w", b.cfg.Name, err)
		}
		<-b.served
		if b.ownLedger {
			b.ledger.Close()
		}
		b.logger.Info("demo http backend stopped")
		b.closeErr = err
	})
	return b.closeErr
}
