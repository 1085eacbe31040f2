package sip

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// ErrClosed is returned by SetBackends after Close.
var ErrClosed = errors.New("sip: server closed")

// SetBackends replaces the backend set while the server runs (the SIGHUP
// reload of -backends-file). Backends are matched by id (BackendConfig.ID,
// default the address); host names are resolved again.
//
// The whole list is checked first: an empty list, a duplicate id, an
// address that is missing or does not resolve, a bad transport, weight or
// id returns an error and changes nothing (mop is not called either). A
// list equal to the current one, in the same order, changes nothing.
//
// Otherwise the new set takes over atomically, from the next message on:
//
//   - A backend whose id, address and transport stay keeps its health
//     verdict (down stays down until its pings say up) and the
//     no-new-work period of a 503, whatever its new weight. If its metrics
//     URL stays too, it keeps its MOP limiter, and with it the learned
//     rate; mop is not called for it. Its health rise/fall counts and its
//     request, failure and outstanding counters start again from zero.
//   - A new id, or an id whose address, transport or metrics URL changed,
//     gets the limiter mop returns for it (mop nil, or returning nil: no
//     limiter). mop is called once for each such backend, in list order,
//     after the list was checked, with defaults filled in. An id whose
//     address or transport changed starts up and takes its dialogs to the
//     new address: give a different server a new id.
//   - Removed backends get no new work. In-dialog requests whose token
//     names one still go to its last address for one token lifetime
//     (-sip-affinity-ttl), so calls already under way can end
//     (affinity_removed_total counts them), and requests it sends are
//     still relayed towards the clients.
//   - New work already sent keeps its backend until its final answer
//     (CANCEL and ACK included), and a failover never goes back to a
//     backend (by id) it already tried.
//   - Once Start has run, every backend of the new set gets OPTIONS pings
//     (when -sip-health-interval is set) and each TCP backend a connection.
//   - Pool and Backends report the new set. Memory probes feeding the
//     limiters are the caller's to start and stop.
//
// In-dialog requests without our Route are routed by the Call-ID hash
// over the new set. SetBackends may be called before Start and from any
// goroutine; calls are serialised, and the message path takes no lock.
// It returns ErrClosed after Close.
func (s *Server) SetBackends(backends []BackendConfig, mop func(BackendConfig) *admission.MOP) error {
	specs, err := checkBackends(backends)
	if err != nil {
		return err
	}
	// A dry run without limiters, so that every error comes before mop
	// is called (it may start a memory probe).
	if _, err := newPool(specs, s.cfg.Policy, nil); err != nil {
		return err
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if s.stopping {
		return ErrClosed
	}
	old := s.pool.Load()
	if old.sameAs(specs) {
		return nil
	}
	mops := make([]*admission.MOP, len(specs))
	var added, changed, kept []string
	for i, sp := range specs {
		ob := old.byID[sp.cfg.ID]
		switch {
		case ob != nil && sameServer(ob, sp) && ob.cfg.MetricsURL == sp.cfg.MetricsURL:
			mops[i] = ob.lb.MOP()
			kept = append(kept, sp.cfg.ID)
		default:
			if mop != nil {
				mops[i] = mop(sp.cfg)
			}
			if ob == nil {
				added = append(added, sp.cfg.ID)
			} else {
				changed = append(changed, sp.cfg.ID)
			}
		}
	}
	p, err := newPool(specs, s.cfg.Policy, mops)
	if err != nil {
		return err // not reached: the dry run passed
	}
	p.carryFrom(old, s.clock.Now())
	if s.cfg.HealthInterval > 0 {
		// A backend new to the set takes no new work until its first
		// OPTIONS is answered (or it answers real traffic).
		for _, b := range p.list {
			if ob := old.byID[b.id]; ob == nil || !sameServer(ob, backendSpec{cfg: b.cfg, addr: b.addr}) {
				b.lb.SetUnknown(true)
			}
		}
	}
	p.retire(old, time.Now(), s.cfg.TokenTTL)
	var removed []string
	for _, ob := range old.list {
		if p.byID[ob.id] == nil {
			removed = append(removed, ob.id)
		}
	}
	s.pool.Store(p)
	if s.started {
		s.runBackendsLocked(p)
	}
	s.log.Info("sip backends replaced", "backends", len(p.list), "added", added, "removed", removed,
		"changed", changed, "kept", kept, "removed_in_dialog", len(p.goneByID))
	return nil
}

// newHealth builds the OPTIONS health checker of p's backends, or nil
// when pinging is off.
func (s *Server) newHealth(p *pool) (*lb.HealthChecker, error) {
	if s.cfg.HealthInterval <= 0 {
		return nil, nil
	}
	hc, err := lb.NewPoolHealthChecker(lb.HealthConfig{Interval: s.cfg.HealthInterval, Timeout: s.cfg.HealthTimeout,
		Rise: s.cfg.HealthRise, Fall: s.cfg.HealthFall, Clock: s.clock, Events: s.events}, p.lb,
		func(*lb.Backend) lb.Prober { return optionsProber{s: s, p: p} }, s.base.With("proto", "sip"))
	if err != nil {
		return nil, fmt.Errorf("sip health: %w", err)
	}
	return hc, nil
}

// runBackendsLocked starts what p's backends need once the server runs:
// OPTIONS pings (the previous pool's stop) and a connection to each TCP
// backend. The caller holds reloadMu.
func (s *Server) runBackendsLocked(p *pool) {
	if s.stopping {
		return
	}
	if s.healthStop != nil {
		s.healthStop()
		s.healthStop = nil
	}
	// The configuration was checked by Start: no error here.
	if hc, _ := s.newHealth(p); hc != nil {
		ctx, cancel := context.WithCancel(s.ctx)
		s.healthStop = cancel
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer cancel()
			hc.Run(ctx)
		}()
	}
	for _, b := range p.list {
		if b.tcp {
			s.dialAsync(b.addr, nil) // so the first request finds a connection
		}
	}
}

// drainBackend marks b busy after a 503: no new work for d. b may be a
// backend SetBackends replaced since the request was sent: the current
// backend with its id and address is marked too.
//
// d is capped at lb.MaxAvoid, the cap HTTP's Retry-After has too. Every
// back-off is counted (backend_backoffs); one that takes a backend off new
// work is also logged and an event (backend.state), extensions are not.
func (s *Server) drainBackend(b *backend, now int64, d time.Duration, why string) {
	d = min(d, lb.MaxAvoid)
	if d <= 0 {
		return
	}
	s.metrics.Backoffs.Add(1)
	started := b.drain(now, d)
	if c := s.pool.Load().byID[b.id]; c != nil && c != b && c.addr == b.addr {
		started = c.drain(now, d) || started
	}
	if !started {
		return
	}
	msg := fmt.Sprintf("busy: %s, no new work for %s (at most %s)", why, d, lb.MaxAvoid)
	s.log.Info("sip backend "+msg, "backend", b.id)
	if s.events != nil {
		s.events(admission.Event{Time: time.Now(), Kind: admission.EventBackendState, Subject: "sip " + b.id, Message: msg})
	}
}
