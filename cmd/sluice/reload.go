package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/lb"
)

// httpGen is one set of HTTP backends: the pool, its active health checks
// and memory probes. A reload builds a new one and retires the old.
type httpGen struct {
	pool   *lb.Pool
	health *lb.HealthChecker // nil when -health-interval is 0
	probes []*lb.MemoryProbe
	cancel context.CancelFunc
}

// newHTTPGen builds the backends of specs. A backend whose key (protocol
// and address) is already known keeps its MOP limiter, so what it learned
// survives a reload.
func (p *plan) newHTTPGen(o *runOptions, specs []string) (*httpGen, error) {
	if o.health.Interval < 0 {
		return nil, errors.New("-health-interval must not be negative")
	}
	var backends []*lb.Backend
	var parsed []lbhttp.BackendSpec
	for _, s := range specs {
		spec, err := lbhttp.ParseBackend(s)
		if err != nil {
			return nil, err
		}
		var mop *admission.MOP
		if spec.MetricsURL != "" {
			// MOP learns from memory samples: without a probe it would
			// hold the backend at -mop-initial-rate for ever.
			if mop, err = p.newMOP(o, "http", spec.ID, spec.Addr); err != nil {
				return nil, err
			}
		}
		b, err := lb.NewBackend(lb.BackendConfig{ID: spec.ID, Addr: spec.Addr, Proto: "http", Weight: spec.Weight, MOP: mop})
		if err != nil {
			return nil, fmt.Errorf("-http-backend %q: %w", s, err)
		}
		backends = append(backends, b)
		parsed = append(parsed, spec)
	}
	g := &httpGen{}
	var err error
	if g.pool, err = lb.NewPool(lb.PoolConfig{Policy: o.policy, Passive: o.passive}, backends); err != nil {
		return nil, err
	}
	if o.health.Interval > 0 {
		if g.health, err = lb.NewHealthChecker(p.healthConfig(o), p.logger); err != nil {
			return nil, err
		}
		for i, b := range backends {
			if parsed[i].HealthPath != "" {
				g.health.Add(b, lb.HTTPProber{Path: parsed[i].HealthPath})
			} else {
				g.health.Add(b, lb.TCPProber{})
			}
		}
	}
	for i, b := range backends {
		if parsed[i].MetricsURL == "" {
			continue
		}
		pc := o.mopProbe
		pc.URL = parsed[i].MetricsURL
		probe, err := lb.NewMemoryProbe(b, pc, p.clock, p.logger)
		if err != nil {
			return nil, err
		}
		g.probes = append(g.probes, probe)
	}
	return g, nil
}

// startHTTPGen runs g's health checks and probes until the plan stops or
// g is retired.
func (p *plan) startHTTPGen(g *httpGen) {
	ctx, cancel := context.WithCancel(p.ctx)
	g.cancel = cancel
	if g.health != nil {
		g.health.ProbeAll(ctx) // a first verdict before traffic
		p.goBackground(func() { g.health.Run(ctx) })
	}
	for _, probe := range g.probes {
		p.goBackground(func() { probe.Run(ctx) })
	}
}

// readBackendsFile reads -backends-file: one backend a line, "http SPEC"
// or "sip SPEC" with SPEC as for -http-backend and -sip-backend; blank
// lines and lines starting with # are skipped. Errors name file and line.
func readBackendsFile(path string) (httpSpecs, sipSpecs []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("-backends-file: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		proto, spec, _ := strings.Cut(line, " ")
		spec = strings.TrimSpace(spec)
		switch {
		case spec == "":
			return nil, nil, fmt.Errorf("-backends-file %s:%d: want \"http SPEC\" or \"sip SPEC\", got %q", path, n, line)
		case proto == "http":
			if _, err := lbhttp.ParseBackend(spec); err != nil {
				return nil, nil, fmt.Errorf("-backends-file %s:%d: %w", path, n, err)
			}
			httpSpecs = append(httpSpecs, spec)
		case proto == "sip":
			sipSpecs = append(sipSpecs, spec)
		default:
			return nil, nil, fmt.Errorf("-backends-file %s:%d: protocol %q: want http or sip", path, n, proto)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("-backends-file %s: %w", path, err)
	}
	return httpSpecs, sipSpecs, nil
}

// reload re-reads -backends-file (SIGHUP) and puts the new backend sets in
// force: backends are added, removed or reweighted; those that stay keep
// their learned rates and their clients' affinity (cookies and SIP tokens
// name backends by id). On any error nothing changes.
func (p *plan) reload(o *runOptions) error {
	if o.backendsFile == "" {
		return errors.New("reload: no -backends-file given")
	}
	httpSpecs, sipSpecs, err := readBackendsFile(o.backendsFile)
	if err != nil {
		return err
	}
	httpAll := append(append([]string{}, o.flagHTTPBackends...), httpSpecs...)
	sipAll := append(append([]string{}, o.flagSIPBackends...), sipSpecs...)
	if (len(httpAll) > 0) != (p.httpSrv != nil) || (len(sipAll) > 0) != (p.sipSrv != nil) {
		return errors.New("reload: a front end can be added or removed only by a restart (keep at least one backend per protocol in use)")
	}
	var gen *httpGen
	if p.httpSrv != nil {
		if gen, err = p.newHTTPGen(o, httpAll); err != nil {
			return fmt.Errorf("reload http backends: %w", err)
		}
	}
	if p.sipSrv != nil {
		if err := p.reloadSIP(o, sipAll); err != nil {
			return fmt.Errorf("reload sip backends: %w", err)
		}
	}
	if gen != nil {
		p.startHTTPGen(gen)
		if err := p.httpSrv.SetPool(gen.pool); err != nil {
			gen.cancel()
			return err
		}
		old := p.httpGen
		p.httpGen = gen
		old.cancel()
	}
	p.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigReload, Subject: o.backendsFile,
		Message: fmt.Sprintf("backends reloaded: %d http, %d sip", len(httpAll), len(sipAll))})
	return nil
}

// healthConfig is -health-* with the event log attached.
func (p *plan) healthConfig(o *runOptions) lb.HealthConfig {
	c := o.health
	c.Events = p.events
	return c
}
