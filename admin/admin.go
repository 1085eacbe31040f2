// Package admin is the admin listener of sluice: /healthz and /status, on a
// mux that other parts (the event log, Prometheus metrics) add handlers to
// with Handle. It uses net/http: the admin port carries little traffic and
// must stay answerable when the front ends are saturated.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// Server is the admin HTTP listener. Register handlers with Handle before
// Serve; Handle after Serve is safe too (http.ServeMux is concurrent-safe).
type Server struct {
	mux    *http.ServeMux
	srv    *http.Server
	logger *slog.Logger
	tokens atomic.Pointer[Tokens] // nil: no token needed (auth.go)
	// hosts is what the listener answers to (hosts.go); nil: localhost,
	// loopback and the address a request arrived on.
	hosts       atomic.Pointer[hostPolicy]
	servePort   atomic.Int32 // port of the listener Serve was given; 0 before
	misdirected misdirected

	mu      sync.Mutex
	tasks   []func(context.Context)
	taskCtx context.Context    // of the running tasks; nil before Serve
	cancel  context.CancelFunc // ends taskCtx
	closed  bool               // Shutdown was called: tasks never start
	running sync.WaitGroup
}

// New returns an admin server with no routes. The logger gets
// component=admin.
func New(logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		mux:    http.NewServeMux(),
		logger: logger.With("component", "admin"),
		srv: &http.Server{
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       60 * time.Second,
		},
	}
	s.srv.Handler = s
	return s
}

// Handle registers h for pattern (net/http ServeMux syntax, e.g.
// "GET /metrics").
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns what the listener serves (the token check, then the
// mux), for tests.
func (s *Server) Handler() http.Handler { return s }

// Go registers a background task of the admin listener (the dashboard's
// sampler): it starts when Serve does, or at once if Serve already
// started, and its context ends at Shutdown, which waits for it to return.
// A server that never serves never starts its tasks.
func (s *Server) Go(task func(ctx context.Context)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tasks = append(s.tasks, task)
	if s.cancel != nil && !s.closed {
		s.start(task)
	}
}

// startTasks starts the registered tasks once.
func (s *Server) startTasks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil || s.closed {
		return
	}
	s.taskCtx, s.cancel = context.WithCancel(context.Background())
	for _, t := range s.tasks {
		s.start(t)
	}
}

func (s *Server) start(task func(context.Context)) {
	ctx := s.taskCtx
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		task(ctx)
	}()
}

// Serve answers on ln until Shutdown; it returns nil after Shutdown. At
// most MaxConns connections are open at once.
func (s *Server) Serve(ln net.Listener) error {
	s.logger.Info("admin listening", "addr", ln.Addr().String())
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		s.servePort.Store(int32(a.Port))
	}
	s.startTasks()
	if err := s.srv.Serve(newLimitListener(ln, MaxConns)); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve admin %s: %w", ln.Addr(), err)
	}
	return nil
}

// Shutdown stops the listener and waits for open requests until ctx ends,
// then ends the background tasks and waits for them.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.mu.Lock()
	s.closed = true
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.running.Wait()
	return err
}

// Healthz answers 200 while the node memory state is Normal and 429
// otherwise (Low, Lower, Critical: "send no new requests", as Oracle Health
// Insurance's health endpoint does), with the state in the body. A nil mem
// is always Normal.
func Healthz(mem *admission.Memory) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := mem.State()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if st != admission.Normal {
			w.Header().Set("Retry-After", "5")
		}
		w.WriteHeader(st.HealthCode())
		fmt.Fprintln(w, st)
	})
}

// Status is the JSON document of /status.
type Status struct {
	MemoryState string          `json:"memory_state"`
	Memory      MemoryStatus    `json:"memory"`
	Backends    []BackendStatus `json:"backends"`
	// Pools groups the backends by pool, each front end's pools in
	// order (the pool default first); Routes are the routes of new
	// work by protocol, in order, with their hits.
	Pools  []PoolStatus             `json:"pools"`
	Routes map[string][]RouteStatus `json:"routes"`
	ARM    []RuleStatus             `json:"arm"`
	// Storage is the data directory's health (persist.Health), when a
	// store is open.
	Storage any `json:"storage,omitempty"`
	// TLSCertificates lists the certificates of the TLS listeners in
	// service (file, names, issuer, serial, not_after,
	// seconds_to_expiry, ...); absent without TLS.
	TLSCertificates any `json:"tls_certificates,omitempty"`
	// LastReload is the outcome of the last reload (SIGHUP) of each
	// configuration file, together; absent before the first.
	LastReload *ReloadStatus `json:"last_reload,omitempty"`
	// HTTPTunnels are the HTTP front end's upgraded connections
	// (WebSocket): open, pending, limits; absent without an HTTP front end.
	HTTPTunnels any `json:"http_tunnels,omitempty"`
	// AccessLog is the access log's counters (records logged, dropped,
	// written, write errors, per protocol); absent without one.
	AccessLog any `json:"access_log,omitempty"`
	// SIP is the SIP front end's dialogs, transactions, connections and
	// dialog store (sip.Status); absent without a SIP front end.
	SIP any `json:"sip,omitempty"`
}

// ReloadStatus is the outcome of the last reload of each configuration
// file (-backends-file, -arm-file) in /status: when the latest was, whether
// they all took (ok), why not (error, each failed file's), and the
// operator's run-time changes they dropped because the configuration
// changed the same setting (each "KEY=VALUE (by WHO at TIME)"). A reload
// that fails or drops changes is what an operator must see.
type ReloadStatus struct {
	Time    time.Time `json:"time"`
	OK      bool      `json:"ok"`
	Error   string    `json:"error,omitempty"`
	Dropped []string  `json:"dropped"`
}

// MemoryStatus is the node's own memory.
type MemoryStatus struct {
	UsedBytes  int64 `json:"used_bytes"`
	LimitBytes int64 `json:"limit_bytes"`
	// LimitSource says where the limit comes from: -mem-limit, cgroup v2
	// memory.max, cgroup v1 memory.limit_in_bytes, GOMEMLIMIT or none.
	LimitSource string `json:"limit_source"`
}

// BackendStatus is one backend in /status.
type BackendStatus struct {
	ID          string    `json:"id"`
	Protocol    string    `json:"protocol"`
	Addr        string    `json:"addr"`
	State       string    `json:"state"`
	Reason      string    `json:"reason,omitempty"` // why it is not up: the operator, its traffic, its health checks (with the probe's error), a Retry-After
	Weight      int       `json:"weight"`
	Outstanding int64     `json:"outstanding"`
	Requests    uint64    `json:"requests"`
	Failures    uint64    `json:"failures"`
	MOP         MOPStatus `json:"mop"`
	// Pools are the pools the backend is a member of.
	Pools []string `json:"pools,omitempty"`
}

// PoolStatus is one pool in /status: its protocol, name, policy, whether
// it panics, and its members' ids.
type PoolStatus struct {
	Protocol string   `json:"protocol"`
	Name     string   `json:"name"`
	Policy   string   `json:"policy"`
	Panic    bool     `json:"panic"`
	Backends []string `json:"backends"`
}

// RouteStatus is one route in /status: its spec (the -http-route or
// -sip-route syntax), the pool it chooses, and the new work it took.
type RouteStatus struct {
	Spec string `json:"spec"`
	Pool string `json:"pool"`
	Hits uint64 `json:"hits"`
}

// MOPStatus is a backend's memory overload protection in /status. Rates
// are per second; learned_rate is 0 while discovering; memory_percent is
// the last sampled used/max of the backend, null while unknown (no sample
// yet, or the last probe failed: probe_error says why, probe_failures
// counts them). enabled is false for a backend without a memory probe (no
// MOP).
type MOPStatus struct {
	Enabled       bool    `json:"enabled"`
	Phase         string  `json:"phase"`
	AllowedRate   float64 `json:"allowed_rate"`
	LearnedRate   float64 `json:"learned_rate"`
	MemoryPercent float64 `json:"memory_percent"` // 0 while unknown; null in JSON
	MemoryKnown   bool    `json:"-"`
	ProbeError    string  `json:"probe_error,omitempty"`
	ProbeFailures uint64  `json:"probe_failures"`
	Admitted      uint64  `json:"admitted"`
	Refused       uint64  `json:"refused"`
	// What MOP has learned of the backend's sessions from its memory's
	// answer to changes of the admitted rate (0 while nothing is
	// estimated): their median and 95th-percentile lifetime in seconds,
	// the bytes one holds, and the memory (percent of the backend's max)
	// predicted at the allowed rate.
	LifetimeSeconds        float64 `json:"session_lifetime_s,omitempty"`
	LifetimeHighSeconds    float64 `json:"session_lifetime_p95_s,omitempty"`
	BytesPerSession        float64 `json:"bytes_per_session,omitempty"`
	PredictedMemoryPercent float64 `json:"predicted_memory_percent,omitempty"`
}

// MarshalJSON writes memory_percent as null while memory is unknown, so
// that a backend whose probe fails does not read as an idle one.
func (s MOPStatus) MarshalJSON() ([]byte, error) {
	type plain MOPStatus
	if s.MemoryKnown || !s.Enabled {
		return json.Marshal(plain(s))
	}
	return json.Marshal(struct {
		plain
		MemoryPercent *float64 `json:"memory_percent"`
	}{plain: plain(s)})
}

// RuleStatus is one ARM rule in /status: rate is the admissions in the
// current six sub-intervals of its unit, limit the base limit per unit.
type RuleStatus struct {
	Name     string `json:"name"`
	Rate     int64  `json:"rate"`
	Limit    int64  `json:"limit"`
	Unit     string `json:"unit"`
	Queued   int64  `json:"queued"`
	Admitted uint64 `json:"admitted"`
	Delayed  uint64 `json:"delayed"`
	Refused  uint64 `json:"refused"`
}

// FromBackend converts an lb view (with its MOP, nil for none).
func FromBackend(s lb.BackendStatus, mop *admission.MOP) BackendStatus {
	return BackendStatus{
		ID: s.ID, Protocol: s.Proto, Addr: s.Addr, State: s.State.String(), Reason: s.Reason, Weight: s.Weight,
		Outstanding: s.Outstanding, Requests: s.Requests, Failures: s.Failures,
		MOP: FromMOP(mop),
	}
}

// FromMOP converts a MOP's status; nil gives Enabled false.
func FromMOP(m *admission.MOP) MOPStatus {
	if m == nil {
		return MOPStatus{Phase: "off"}
	}
	s := m.Status()
	phase := s.Phase.String()
	if m.Pinned() > 0 {
		phase = "pinned" // by an operator: nothing is learned
	}
	st := MOPStatus{
		Enabled: true, Phase: phase, AllowedRate: s.AllowedRate, LearnedRate: s.LearnedRate,
		MemoryKnown: s.MemoryKnown, ProbeError: s.ProbeError, ProbeFailures: s.ProbeFailures,
		Admitted: s.Admitted, Refused: s.Refused,
		LifetimeSeconds: s.Lifetime.Seconds(), LifetimeHighSeconds: s.LifetimeHigh.Seconds(),
		BytesPerSession: s.BytesPerSession, PredictedMemoryPercent: 100 * s.PredictedMemory,
	}
	if s.MemoryKnown {
		st.MemoryPercent = 100 * s.MemoryFraction
	}
	return st
}

// Source gathers the parts of /status.
type Source struct {
	// Memory is the node memory state; nil is always Normal.
	Memory *admission.Memory
	// Controller supplies the ARM rules; nil for none.
	Controller *admission.Controller
	// Backends lists the backends of every front end, in order.
	Backends func() []BackendStatus
	// Storage reports the data directory's health; nil, or nil returned,
	// leaves it out.
	Storage func() any
	// TLSCertificates lists the TLS certificates in service; nil, or nil
	// returned, leaves them out.
	TLSCertificates func() any
	// Pools lists the pools of every front end; nil for none.
	Pools func() []PoolStatus
	// Routes lists the routes by protocol; nil for none.
	Routes func() map[string][]RouteStatus
	// LastReload reports the last reloads; nil, or nil returned, leaves
	// it out.
	LastReload func() *ReloadStatus
	// HTTPTunnels reports the HTTP front end's tunnels; nil, or nil
	// returned, leaves them out.
	HTTPTunnels func() any
	// AccessLog reports the access log's counters; nil, or nil returned:
	// none.
	AccessLog func() any
	// SIP reports the SIP front end; nil, or nil returned: none.
	SIP func() any
}

// Snapshot builds the Status document now.
func (src Source) Snapshot() Status {
	st := Status{MemoryState: src.Memory.State().String(), Backends: []BackendStatus{}, Pools: []PoolStatus{}, Routes: map[string][]RouteStatus{}, ARM: []RuleStatus{}}
	st.Memory.LimitSource = src.Memory.LimitSource()
	if src.Memory != nil {
		st.Memory.UsedBytes, st.Memory.LimitBytes = src.Memory.Usage()
	}
	if src.Backends != nil {
		st.Backends = append(st.Backends, src.Backends()...)
	}
	if src.Pools != nil {
		st.Pools = append(st.Pools, src.Pools()...)
	}
	if src.Routes != nil {
		for proto, rs := range src.Routes() {
			st.Routes[proto] = rs
		}
	}
	if src.Controller != nil {
		for _, m := range src.Controller.Rules() {
			rs := m.Status()
			st.ARM = append(st.ARM, RuleStatus{
				Name: rs.Name, Rate: rs.Rate, Limit: rs.Limit, Unit: admission.UnitName(rs.Unit), Queued: rs.Queued,
				Admitted: rs.Admitted + rs.Released, Delayed: rs.Delayed, Refused: rs.Refused,
			})
		}
	}
	if src.Storage != nil {
		st.Storage = src.Storage()
	}
	if src.TLSCertificates != nil {
		st.TLSCertificates = src.TLSCertificates()
	}
	if src.LastReload != nil {
		st.LastReload = src.LastReload()
	}
	if src.AccessLog != nil {
		st.AccessLog = src.AccessLog()
	}
	if src.HTTPTunnels != nil {
		st.HTTPTunnels = src.HTTPTunnels()
	}
	if src.SIP != nil {
		st.SIP = src.SIP()
	}
	return st
}

// StatusHandler answers /status with src's Snapshot as indented JSON.
func StatusHandler(src Source) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(src.Snapshot())
	})
}
