package admin

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// ui is the dashboard page, its script and the vendored chart library
// (uPlot, MIT; refreshed by scripts/vendor-ui.sh). Nothing is fetched from
// elsewhere at run time.
//
//go:embed ui
var ui embed.FS

// Control changes backends at run time for the dashboard's buttons and
// POST /control/backends/{id}/.... protocol is "http" or "sip", or "" when
// the id is unique across front ends. Implementations must be safe for
// concurrent use.
type Control interface {
	// Drain stops (on) or resumes (!on) new work to the backend; its
	// affinity traffic continues.
	Drain(protocol, id string, on bool) error
	// SetWeight sets the backend's weight, in [1, lb.MaxWeight].
	SetWeight(protocol, id string, w int) error
}

// Errors of a Control, mapped to 404 and 409 by the control endpoints.
var (
	// ErrNoSuchBackend: no backend has the id (in the protocol, if given).
	ErrNoSuchBackend = errors.New("no such backend")
	// ErrAmbiguousBackend: the id names a backend of more than one
	// protocol; add ?protocol=http or ?protocol=sip.
	ErrAmbiguousBackend = errors.New("backend id used by more than one protocol: add ?protocol=http or ?protocol=sip")
)

// PoolControl is a Control over the pools in force, which it asks for on
// every call (a reload may replace them). nil pools are skipped.
type PoolControl func() []*lb.Pool

var _ Control = PoolControl(nil)

// Find returns the backend id (of protocol, if given) and its first pool;
// ErrNoSuchBackend or ErrAmbiguousBackend when there is not exactly one
// (a backend in several pools of a generation is one backend).
func (pc PoolControl) Find(protocol, id string) (*lb.Pool, *lb.Backend, error) {
	var pool *lb.Pool
	var found *lb.Backend
	for _, p := range pc() {
		if p == nil {
			continue
		}
		b := p.Lookup(id)
		if b == nil || (protocol != "" && b.Proto() != protocol) || b == found {
			continue
		}
		if found != nil {
			return nil, nil, fmt.Errorf("backend %q: %w", id, ErrAmbiguousBackend)
		}
		pool, found = p, b
	}
	if found == nil {
		if protocol != "" {
			return nil, nil, fmt.Errorf("backend %q of protocol %s: %w", id, protocol, ErrNoSuchBackend)
		}
		return nil, nil, fmt.Errorf("backend %q: %w", id, ErrNoSuchBackend)
	}
	return pool, found, nil
}

// Drain implements Control with lb.Backend.Drain.
func (pc PoolControl) Drain(protocol, id string, on bool) error {
	_, b, err := pc.Find(protocol, id)
	if err != nil {
		return err
	}
	b.Drain(on)
	return nil
}

// SetWeight implements Control with lb.Pool.SetWeight, in every pool the
// backend is a member of.
func (pc PoolControl) SetWeight(protocol, id string, w int) error {
	_, b, err := pc.Find(protocol, id)
	if err != nil {
		return err
	}
	return pc.setWeight(b, w)
}

// setWeight sets b's weight in each pool of pc that holds b.
func (pc PoolControl) setWeight(b *lb.Backend, w int) error {
	for _, p := range pc() {
		if p != nil && p.Lookup(b.ID()) == b {
			if err := p.SetWeight(b.ID(), w); err != nil {
				return err
			}
		}
	}
	return nil
}

// DashboardConfig configures the dashboard.
type DashboardConfig struct {
	// Source is what /status shows; the sampler records it every Interval.
	Source Source
	// Control backs the drain, undrain and weight buttons; nil answers
	// 501 to them. A Control that is also an Operator (PoolControl is)
	// gets every backend action of the control endpoints.
	Control Control
	// Operator, when set, applies every change of the control endpoints
	// (control.go) in place of Control.
	Operator Operator
	// Config answers GET /control/config; nil answers 501.
	Config ConfigSource
	// MOPMaxHeap is the MOP memory ceiling (-mop-max-heap) as a fraction,
	// drawn on each backend's memory plot; 0 draws none.
	MOPMaxHeap float64
	// Samples is the size of the history ring. Default
	// DefaultHistorySamples (15 minutes at 1 s).
	Samples int
	// Interval is the sampling period. Default 1s.
	Interval time.Duration
	// Ticker makes the sampler's ticker; tests inject their own channel.
	// Default time.NewTicker.
	Ticker func(d time.Duration) (ticks <-chan time.Time, stop func())
	// Events receives an event for every control change (shown as a
	// marker on the plots); nil for none.
	Events admission.EventSink
	// CoarseSamples is the size of the 10 s ring (GET
	// /status/history?resolution=10s). Default DefaultCoarseSamples (24 h),
	// at most MaxCoarseSamples.
	CoarseSamples int
	// Store, when set, receives every sample of both rings (history.go).
	Store HistoryStore
}

// Dashboard is the live page at the admin listener's "/" with its history
// ring (GET /status/history) and control endpoints.
type Dashboard struct {
	cfg        DashboardConfig
	hist       *History
	coarse     *History  // a sample every coarseEvery intervals
	lastCoarse time.Time // when coarse was last recorded; the sampler's
	logger     *slog.Logger
}

// NewDashboard fills cfg's defaults and returns a dashboard; nothing is
// sampled before Run (started by Register with the admin listener).
func NewDashboard(cfg DashboardConfig, logger *slog.Logger) *Dashboard {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Ticker == nil {
		cfg.Ticker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	h := NewHistory(cfg.Samples)
	h.maxHeapPercent = 100 * cfg.MOPMaxHeap
	h.interval = cfg.Interval.Seconds()
	if cfg.CoarseSamples <= 0 {
		cfg.CoarseSamples = DefaultCoarseSamples
	}
	c := NewHistory(min(cfg.CoarseSamples, MaxCoarseSamples))
	c.maxHeapPercent = h.maxHeapPercent
	c.interval = coarseEvery * h.interval
	return &Dashboard{cfg: cfg, hist: h, coarse: c, logger: logger.With("component", "admin")}
}

// History returns the dashboard's ring.
func (d *Dashboard) History() *History { return d.hist }

// Register mounts the page, GET /status/history and the control endpoints
// on s, and has s run the sampler while it serves.
func (d *Dashboard) Register(s *Server) {
	s.Handle("GET /{$}", d.page())
	s.Handle("GET /ui/", http.FileServerFS(ui))
	s.Handle("GET /status/history", d.historyHandler())
	op := d.cfg.Operator
	if op == nil && d.cfg.Control != nil {
		var ok bool
		if op, ok = d.cfg.Control.(Operator); !ok {
			op = legacyControl{d.cfg.Control}
		}
	}
	RegisterControl(s, ControlConfig{Operator: op, Config: d.cfg.Config, Events: d.cfg.Events, Logger: d.logger, Routes: d.cfg.Source.Routes})
	s.Go(d.Run)
}

// Run samples every Interval until ctx ends.
func (d *Dashboard) Run(ctx context.Context) {
	ticks, stop := d.cfg.Ticker(d.cfg.Interval)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-ticks:
			d.Sample(now)
		}
	}
}

// Sample records the Source as of now in the history.
func (d *Dashboard) Sample(now time.Time) {
	st := d.cfg.Source.Snapshot()
	var counts *admission.Counts
	if c := d.cfg.Source.Controller; c != nil {
		cs := c.Counts()
		counts = &cs
	}
	d.hist.Record(now, st, counts)
	d.recordCoarse(now, st, counts)
}

func (d *Dashboard) page() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := ui.ReadFile("ui/index.html")
		if err != nil { // the file is embedded: only a broken build gets here
			http.Error(w, "dashboard page missing from the build", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Write(body)
	})
}

// historyHandler answers GET /status/history[?since=UNIX_MS][&resolution=1s|10s]
// with the samples after since (all without it) of the 1 s ring (15
// minutes) or the 10 s one (24 h): the page loads everything once, then
// asks for the new samples every second.
func (d *Dashboard) historyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var since int64
		if v := r.URL.Query().Get("since"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				http.Error(w, fmt.Sprintf("since %q: want unix milliseconds, e.g. %d", v, time.Now().UnixMilli()), http.StatusBadRequest)
				return
			}
			since = n
		}
		h := d.hist
		switch res := r.URL.Query().Get("resolution"); res {
		case "", HistoryFine:
		case HistoryCoarse:
			h = d.coarse
		default:
			http.Error(w, fmt.Sprintf("resolution %q: want %s or %s", res, HistoryFine, HistoryCoarse), http.StatusBadRequest)
			return
		}
		var buf bytes.Buffer
		h.WriteJSON(&buf, since)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(buf.Bytes())
	})
}
