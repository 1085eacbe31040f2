package sip

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// ErrClosed is returned by SetGeneration and SetBackends after Close.
var ErrClosed = errors.New("sip: server closed")

// SetGeneration puts the backend generation g in force while the server
// runs (or before Start): its backends, its pools and its routes. g is
// built with lb.NewGeneration, protocol "sip", with Prober set to
// s.Prober (the OPTIONS health check) and Prev set to the generation in
// force (Generation), which carries the operator's and the traffic's
// state over to the backends that stay; the operator's drain and disable
// and the back-offs are copied again at the swap, so what changed between
// g's build and its swap is kept too. The caller owns g: it starts it
// (after Start, since the pings leave from the server's socket; a ping
// before that is down) and stops the generation it replaces once
// SetGeneration returned.
//
// Every backend's address is resolved first (a host name once, here); an
// address that does not resolve or a transport other than udp or tcp
// returns an error naming the backend and changes nothing. Then the new
// set takes over atomically, from the next message on:
//
//   - New work is routed with g's routes and picked in g's pools.
//   - In-dialog requests keep their backend: their token (or the dialog
//     table) names it by id, whatever the routes and pools now say. A
//     backend g no longer has still gets the in-dialog requests of its
//     dialogs at its last address for one token lifetime
//     (-sip-affinity-ttl), so calls already under way can end
//     (affinity_removed_total counts them), and requests it sends are
//     still relayed towards the clients. It never gets new work.
//   - New work already sent keeps its backend until its final answer
//     (CANCEL and ACK included), and a failover stays in its pool and
//     never goes back to a backend (by id) it already tried.
//   - Once Start has run, each TCP backend of g gets a connection.
//
// SetGeneration may be called from any goroutine; calls are serialised,
// and the message path takes no lock. It returns ErrClosed after Close.
func (s *Server) SetGeneration(g *lb.Generation) error {
	set, err := newBackendSet(g)
	if err != nil {
		return err
	}
	if err := s.checkTLSBackends(set); err != nil {
		return err
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	return s.installLocked(set)
}

// installLocked puts set in force. The caller holds reloadMu.
func (s *Server) installLocked(set *backendSet) error {
	if s.stopping {
		return ErrClosed
	}
	old := s.pool.Load()
	if old != nil && old.gen == set.gen {
		return nil
	}
	var added, changed, kept, removed []string
	if old != nil {
		set.carryFrom(old)
		set.retire(old, time.Now(), s.cfg.TokenTTL)
		for _, b := range set.list {
			switch ob := old.byID[b.id]; {
			case ob == nil:
				added = append(added, b.id)
			case sameServer(ob, b):
				kept = append(kept, b.id)
			default:
				changed = append(changed, b.id)
			}
		}
		for _, ob := range old.list {
			if set.byID[ob.id] == nil {
				removed = append(removed, ob.id)
			}
		}
	}
	if old != nil {
		// What changed on old's backends since set's generation was built
		// (its Start ran a first round of pings meanwhile).
		set.gen.CatchUp(old.gen, s.clock.Now())
	}
	s.pool.Store(set)
	if old != nil {
		// A backend at an address whose proxy= changed reads its
		// connections otherwise now: the ones open go, new ones start
		// as it wants.
		for _, b := range set.list {
			if ob := old.backendAt(b.addr); ob != nil && ob.spec.Proxy != b.spec.Proxy {
				s.closeBackendConns(b.addr)
			}
		}
	}
	if s.started {
		s.runBackendsLocked(set)
	}
	if old != nil && old.owned {
		// Its checks and probes end; in the background, since a first
		// round of pings under way ends only at its timeout.
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			old.gen.Stop()
		}()
	}
	if old != nil {
		s.log.Info("sip backends replaced", "backends", len(set.list), "pools", len(set.gen.Pools()), "added", added,
			"removed", removed, "changed", changed, "kept", kept, "removed_in_dialog", len(set.goneByID))
	}
	return nil
}

// Generation returns the backend generation in force (SetGeneration,
// SetBackends, or the one New built from Config.Backends), nil before
// one. Build the next one with it as lb.GenConfig.Prev.
func (s *Server) Generation() *lb.Generation {
	if set := s.pool.Load(); set != nil {
		return set.gen
	}
	return nil
}

// SetBackends replaces the backend set with backends (in their pools,
// none: the pool "default"; no routes, so new work goes to the pool
// "default"): a thin wrapper that builds a generation (lb.NewGeneration
// with the server's policy, OPTIONS health checks and the generation in
// force as Prev) and puts it in force as SetGeneration does; the server
// starts and stops the generations it builds. Backends are matched by id
// (BackendConfig.ID, default the address); host names are resolved again.
//
// The whole list is checked first: an empty list, a duplicate id, an
// address that is missing or does not resolve, a bad transport, weight or
// id returns an error and changes nothing (mop is not called either). A
// list equal to the current one, in the same order, changes nothing.
//
// A backend whose id, address and transport stay keeps what the
// generation carries over (the operator's drain and disable, a 503's
// back-off, a passive ejection, its last real answer; its probe verdict
// only when OPTIONS pings run before and after). If its metrics URL
// stays too, it keeps its MOP limiter, and with it the learned rate; mop
// is not called for it. Any other backend gets the limiter mop returns
// for it (mop nil, or returning nil: no limiter), in list order, after
// the list was checked. With pings on, a backend new to the set takes no
// new work until its first ping is answered (or it answers real traffic).
// Memory probes feeding the limiters are the caller's to start and stop.
func (s *Server) SetBackends(backends []BackendConfig, mop func(BackendConfig) *admission.MOP) error {
	specs, cfgs, err := checkBackends(backends)
	if err != nil {
		return err
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if s.stopping {
		return ErrClosed
	}
	old := s.pool.Load()
	if old != nil && old.sameAs(cfgs) {
		return nil
	}
	set, err := s.buildSet(specs, cfgs, old, mop)
	if err != nil {
		return err
	}
	return s.installLocked(set)
}

// buildSet builds, for SetBackends and New, a generation of the backends
// cfgs (checked, as specs) with old's generation as Prev, and its side
// table. The server owns it.
func (s *Server) buildSet(specs []lb.BackendSpec, cfgs []BackendConfig, old *backendSet, mop func(BackendConfig) *admission.MOP) (*backendSet, error) {
	byID := make(map[string]BackendConfig, len(cfgs))
	for _, c := range cfgs {
		byID[c.ID] = c
	}
	gc := lb.GenConfig{
		Proto:    "sip",
		Backends: specs,
		Policy:   s.cfg.Policy,
		Clock:    s.clock,
		Logger:   s.base.With("proto", "sip"),
		Events:   s.events,
		MOP: func(spec lb.BackendSpec) (*admission.MOP, error) {
			c := byID[spec.ID]
			if old != nil {
				// The limiter of a backend that stays, with its
				// learned rate.
				if ob := old.byID[c.ID]; ob != nil && ob.spec.Addr == c.Addr && strings.EqualFold(ob.spec.Transport, c.Transport) &&
					old.metricsURL(c.ID) == c.MetricsURL {
					return ob.lb.MOP(), nil
				}
			}
			if mop == nil {
				return nil, nil
			}
			return mop(c), nil
		},
	}
	if old != nil {
		gc.Prev = old.gen
	}
	if s.cfg.HealthInterval > 0 {
		gc.Health = lb.HealthConfig{Interval: s.cfg.HealthInterval, Timeout: s.cfg.HealthTimeout, Rise: s.cfg.HealthRise, Fall: s.cfg.HealthFall}
		gc.Prober = s.Prober
	}
	g, err := lb.NewGeneration(gc)
	if err != nil {
		return nil, fieldError("Backends", "%w", err)
	}
	set, err := newBackendSet(g)
	if err != nil {
		return nil, err
	}
	if err := s.checkTLSBackends(set); err != nil {
		return nil, err
	}
	set.owned = true
	set.cfgs = cfgs
	return set, nil
}

// runBackendsLocked starts what set needs once the server runs: its
// generation's checks when the server built it, and a connection to each
// TCP backend. The caller holds reloadMu.
func (s *Server) runBackendsLocked(set *backendSet) {
	if s.stopping {
		return
	}
	if set.owned {
		// In the background: the first round of pings waits for each
		// backend's answer (or its timeout), and the message path must
		// not.
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			set.gen.Start(s.ctx)
		}()
	}
	for _, b := range set.list {
		if b.tcp {
			s.dialAsync(b.addr, nil) // so the first request finds a connection
		}
	}
}

// drainBackend marks b busy after a 503: no new work for d
// (lb.Backend.BackOff: at most lb.MaxAvoid, never shortening a back-off
// under way). b may be a backend a reload replaced since the request was
// sent: the current backend with its id and address is marked too.
//
// Every back-off is counted (backend_backoffs); one that takes a backend off new
// work is also logged and an event (backend.state), extensions are not.
func (s *Server) drainBackend(b *lb.Backend, now int64, d time.Duration, why string) {
	d = min(d, lb.MaxAvoid)
	if d <= 0 {
		return
	}
	s.metrics.Backoffs.Add(1)
	started := b.BackOff(now, d)
	if set := s.pool.Load(); set != nil {
		if c := set.gen.Lookup(b.ID()); c != nil && c != b && c.Addr() == b.Addr() {
			started = c.BackOff(now, d) || started
		}
	}
	if !started {
		return
	}
	msg := fmt.Sprintf("busy: %s, no new work for %s (at most %s)", why, d, lb.MaxAvoid)
	s.log.Info("sip backend "+msg, "backend", b.ID())
	if s.events != nil {
		s.events(admission.Event{Time: time.Now(), Kind: admission.EventBackendState, Subject: "sip " + b.ID(), Message: msg})
	}
}

// checkTLSBackends refuses a transport=tls backend without a SIP TLS
// listener: every entry it reaches us back by (Record-Route, Path,
// Contact alias) must name a TLS listener, or its requests towards the
// clients would leave TLS (and a sips: dialog could not continue).
func (s *Server) checkTLSBackends(set *backendSet) error {
	if s.cfg.TLSListen != "" {
		return nil
	}
	for _, b := range set.list {
		if b.tls != nil {
			return tlsBackendNeedsListener(b.id)
		}
	}
	return nil
}

// tlsBackendNeedsListener is the error of a transport=tls backend without
// a SIP TLS listener.
func tlsBackendNeedsListener(id string) error {
	return fieldError("Backends", "%s: transport=tls needs a SIP TLS listener (-sip-tls-listen): the backend reaches the balancer back over TLS at its address", id)
}
