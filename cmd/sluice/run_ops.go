package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/persist"
)

// eventLog is the event sink of a run: every event is logged, and appended
// to the store once it is open. Events emitted before that (configuration
// warnings while the rules are built) wait in a small buffer.
type eventLog struct {
	logger *slog.Logger
	mu     sync.Mutex
	store  *persist.Store
	early  []admission.Event
}

const maxEarlyEvents = 1000

func (l *eventLog) emit(ev admission.Event) {
	l.logger.Info("event", "kind", string(ev.Kind), "subject", ev.Subject, "msg", ev.Message)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.store != nil {
		l.store.Append(ev)
		return
	}
	if len(l.early) < maxEarlyEvents {
		l.early = append(l.early, ev)
	}
}

// attach starts writing to st, first the events that waited for it.
func (l *eventLog) attach(st *persist.Store) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.store = st
	for _, ev := range l.early {
		st.Append(ev)
	}
	l.early = nil
}

func (l *eventLog) detach() {
	l.mu.Lock()
	l.store = nil
	l.mu.Unlock()
}

// openStore opens the data directory, gives every backend's MOP the state
// learned before the restart, and starts saving it. It runs before any
// front end serves, so no request is admitted at an unlearned rate.
func (p *plan) openStore(o *runOptions) error {
	st, err := persist.Open(o.persist, p.logger)
	if err != nil {
		return fmt.Errorf("open data directory: %w", err)
	}
	states, err := st.LoadMOP()
	if err != nil {
		st.Close(context.Background())
		return fmt.Errorf("load learned rates: %w", err)
	}
	imported := 0
	for _, e := range p.mops {
		s, ok := states[e.key]
		if !ok {
			continue
		}
		if err := e.mop.Import(s); err != nil {
			p.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigWarning, Subject: e.key,
				Message: "stored learned rate not used: " + err.Error()})
			continue
		}
		imported++
		p.logger.Info("learned rate restored", "backend", e.key, "phase", s.Phase.String(), "learned_rate", s.LearnedRate, "allowed_rate", s.AllowedRate)
	}
	p.logger.Info("data directory open", "dir", st.Dir(), "learned_rates", len(states), "restored", imported)
	saver, err := st.NewSaver(p.mopStates)
	if err != nil {
		st.Close(context.Background())
		return fmt.Errorf("start saving learned rates: %w", err)
	}
	p.store, p.saver = st, saver
	p.eventLog.attach(st)
	if p.admin != nil {
		p.admin.Handle("GET /events", st.EventsHandler())
	}
	return nil
}

// mopStates exports every backend's learned state, keyed for the store.
func (p *plan) mopStates() map[string]admission.MOPState {
	out := make(map[string]admission.MOPState, len(p.mops))
	for _, e := range p.mops {
		out[e.key] = e.mop.Export()
	}
	return out
}

// storeCloseTimeout bounds the final save at shutdown: a disk that does
// not answer must not keep the process from exiting.
const storeCloseTimeout = 3 * time.Second

// closeStore saves the learned rates a last time and closes the store,
// giving up after storeCloseTimeout.
func (p *plan) closeStore() {
	if p.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeCloseTimeout)
	defer cancel()
	if err := p.saver.Close(ctx); err != nil {
		p.logger.Error("final save of learned rates failed", "err", err)
	}
	p.eventLog.detach()
	if err := p.store.Close(ctx); err != nil {
		p.logger.Error("close data directory", "err", err)
	}
	p.store = nil
}

// mountMetrics adds /metrics to the admin listener.
func (p *plan) mountMetrics() error {
	if p.admin == nil {
		return nil
	}
	src := metricsSources{ctrl: p.ctrl, mem: p.mem, backends: p.backendStatus, forward: p.forward, store: p.store}
	if p.httpSrv != nil {
		src.http = p.httpSrv.Stats()
	}
	if p.sipSrv != nil {
		src.extra = append(src.extra, func(w io.Writer) { p.sipSrv.WritePrometheus(w) })
	}
	h, err := metricsHandler(src)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	p.admin.Handle("GET /metrics", h)
	return nil
}

// healthz answers 200 in memory state Normal, 429 otherwise and from the
// moment a drain starts, so that a balancer in front stops sending.
func (p *plan) healthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := p.mem.State()
		code, text := st.HealthCode(), st.String()
		if p.ctrl.Draining() {
			code, text = http.StatusTooManyRequests, "draining"
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if code != http.StatusOK {
			w.Header().Set("Retry-After", "5")
		}
		w.WriteHeader(code)
		fmt.Fprintln(w, text)
	})
}

// inFlight is the new work and requests sent to backends and not yet
// answered, over every front end.
func (p *plan) inFlight() int64 {
	var n int64
	for _, b := range p.backendStatus() {
		n += b.Outstanding
	}
	return n
}

// drainQuiet is how long a drain waits with nothing in flight and no
// affinity traffic before it ends early.
const drainQuiet = 2 * time.Second

// drain refuses new work at once (health 429) and keeps serving in-flight
// requests and affinity traffic until nothing has been in flight and no
// affinity request has come for drainQuiet, or until timeout. It returns
// the time left of timeout.
func (p *plan) drain(timeout time.Duration) time.Duration {
	start := time.Now()
	p.ctrl.SetDraining(true)
	if p.sipSrv != nil {
		p.sipSrv.Drain()
	}
	p.logger.Info("draining: new work refused, affinity and in-flight requests served", "timeout", timeout)
	affinity := func() (n uint64) {
		c := p.ctrl.Counts()
		for i := range c.Admitted {
			n += c.Admitted[i][admission.Affinity]
		}
		return n
	}
	last, quietSince := affinity(), time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for range tick.C {
		if time.Since(start) >= timeout {
			p.logger.Warn("drain timeout reached", "in_flight", p.inFlight())
			break
		}
		if a := affinity(); a != last || p.inFlight() > 0 {
			last, quietSince = a, time.Now()
			continue
		}
		if time.Since(quietSince) >= drainQuiet {
			p.logger.Info("drained", "after", time.Since(start).Round(time.Millisecond))
			break
		}
	}
	return max(timeout-time.Since(start), time.Second)
}

// storageStatus is the data directory's health for /status.
func (p *plan) storageStatus() any {
	if st := p.store; st != nil {
		return st.Health()
	}
	return nil
}
