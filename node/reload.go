package node

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/internal/opfile"
	"github.com/sluicelb/sluice/lb"
	lbsip "github.com/sluicelb/sluice/sip"
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
func (n *Node) newHTTPGen(specs []string) (*httpGen, error) {
	if n.cfg.Health.Interval < 0 {
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
			if mop, err = n.newMOP("http", spec.ID, spec.Addr); err != nil {
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
	passive := n.cfg.Passive
	passive.OnEject = n.onEject("http")
	if g.pool, err = lb.NewPool(lb.PoolConfig{Policy: n.cfg.Policy, Passive: passive}, backends); err != nil {
		return nil, err
	}
	if n.cfg.Health.Interval > 0 {
		prober := func(b *lb.Backend) lb.Prober { return httpProber(n.cfg.HealthPath, parsed[b.Index()]) }
		if g.health, err = lb.NewPoolHealthChecker(n.healthConfig(), g.pool, prober, n.logger); err != nil {
			return nil, err
		}
	}
	for i, b := range backends {
		if parsed[i].MetricsURL == "" {
			continue
		}
		pc := n.cfg.MOPProbe
		pc.URL = parsed[i].MetricsURL
		probe, err := lb.NewMemoryProbe(b, pc, n.clock, n.logger)
		if err != nil {
			return nil, err
		}
		g.probes = append(g.probes, probe)
	}
	return g, nil
}

// startHTTPGen runs g's health checks and probes until the plan stops or
// g is retired.
func (n *Node) startHTTPGen(g *httpGen) {
	ctx, cancel := context.WithCancel(n.ctx)
	g.cancel = cancel
	if g.health != nil {
		g.health.ProbeAll(ctx) // a first verdict before traffic
		n.goBackground(func() { g.health.Run(ctx) })
	}
	for _, probe := range g.probes {
		n.goBackground(func() { probe.Run(ctx) })
	}
}

// readBackendsFile reads -backends-file: one backend a line, "http SPEC"
// or "sip SPEC" with SPEC as for -http-backend and -sip-backend; blank
// lines and lines starting with # are skipped. Errors name file and line.
func readBackendsFile(path string) (httpSpecs, sipSpecs []string, err error) {
	data, err := opfile.ReadLines(path, opfile.MaxSize)
	if err != nil {
		return nil, nil, fmt.Errorf("-backends-file: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	// Ids are unique per protocol: a duplicate is named with both lines
	// here (the pool would refuse it without a line number).
	seen := map[string]int{}
	dup := func(proto, id, addr string, n int) error {
		if id == "" {
			id = addr
		}
		if first, ok := seen[proto+" "+id]; ok {
			return fmt.Errorf("-backends-file %s:%d: %s backend id %q already on line %d (ids default to the address)", path, n, proto, id, first)
		}
		seen[proto+" "+id] = n
		return nil
	}
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
			b, err := lbhttp.ParseBackend(spec)
			if err != nil {
				return nil, nil, fmt.Errorf("-backends-file %s:%d: %w", path, n, err)
			}
			if err := dup(proto, b.ID, b.Addr, n); err != nil {
				return nil, nil, err
			}
			httpSpecs = append(httpSpecs, spec)
		case proto == "sip":
			b, err := lbsip.ParseBackend(spec)
			if err != nil {
				return nil, nil, fmt.Errorf("-backends-file %s:%d: %w", path, n, err)
			}
			if err := dup(proto, b.ID, b.Addr, n); err != nil {
				return nil, nil, err
			}
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

// Reload re-reads -backends-file (SIGHUP) and puts the new backend sets in
// force: backends are added, removed or reweighted; those that stay keep
// their learned rates and their clients' affinity (cookies and SIP tokens
// name backends by id). On any error nothing changes, and the error goes
// to the event log too.
func (n *Node) Reload() error {
	if n.cfg.BackendsFile == "" {
		return errors.New("reload: no -backends-file given")
	}
	err := n.reload()
	if err != nil {
		n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigReload, Subject: n.cfg.BackendsFile,
			Message: "backends not reloaded, the backends in force are unchanged: " + err.Error()})
	}
	return err
}

func (n *Node) reload() error {
	httpSpecs, sipSpecs, err := readBackendsFile(n.cfg.BackendsFile)
	if err != nil {
		return err
	}
	// No run-time change while the pools are swapped: it would reach the
	// old pool and be lost.
	n.op.mu.Lock()
	defer n.op.mu.Unlock()
	httpAll := append(append([]string{}, n.cfgHTTPBackends...), httpSpecs...)
	sipAll := append(append([]string{}, n.cfgSIPBackends...), sipSpecs...)
	if (len(httpAll) > 0) != (n.httpSrv != nil) || (len(sipAll) > 0) != (n.sipSrv != nil) {
		return errors.New("reload: a front end can be added or removed only by a restart (keep at least one backend per protocol in use)")
	}
	var gen *httpGen
	if n.httpSrv != nil {
		if gen, err = n.newHTTPGen(httpAll); err != nil {
			return fmt.Errorf("-backends-file %s: http backends: %w", n.cfg.BackendsFile, err)
		}
	}
	if n.sipSrv != nil {
		if err := n.reloadSIP(sipAll); err != nil {
			return fmt.Errorf("-backends-file %s: sip backends: %w", n.cfg.BackendsFile, err)
		}
	}
	if gen != nil {
		carryRunTimeState(n.httpGen.pool, gen.pool, gen.health != nil)
		n.startHTTPGen(gen)
		if err := n.httpSrv.SetPool(gen.pool); err != nil {
			gen.cancel()
			return err
		}
		old := n.httpGen
		n.httpGen = gen
		n.httpBackends = httpAll
		old.cancel()
	}
	n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigReload, Subject: n.cfg.BackendsFile,
		Message: fmt.Sprintf("backends reloaded: %d http, %d sip", len(httpAll), len(sipAll))})
	// The new backends start at their configured weight: put the
	// run-time changes kept in the data directory back on them.
	n.applyOverrides("backend/", "mop/")
	return nil
}

// carryRunTimeState drains and disables each backend of next that the
// operator drained or disabled in prev (same id), before next serves: a
// reload of the backends does not send new work to a drained backend,
// with or without a data directory. With health checks on, a backend new
// to the set is Unknown until its first probe (lb.Backend.SetUnknown).
func carryRunTimeState(prev, next *lb.Pool, probed bool) {
	for _, b := range next.Backends() {
		if ob := prev.Lookup(b.ID()); ob != nil {
			b.Drain(ob.Drained())
			b.Disable(ob.Disabled())
		} else if probed {
			b.SetUnknown(true)
		}
	}
}

// healthConfig is -health-* with the event log attached.
func (n *Node) healthConfig() lb.HealthConfig {
	c := n.cfg.Health
	c.Events = n.events
	c.Clock = n.clock
	return c
}
