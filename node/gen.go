package node

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sluicelb/sluice/admission"
	lbhttp "github.com/sluicelb/sluice/http"
	"github.com/sluicelb/sluice/lb"
)

// Backend generations: the node builds one lb.Generation per front end
// from the backend, pool and route specs in force (the flags' and the
// backends file's, the routes changed at run time on top), at start and
// on every reload or route change, with the previous generation as Prev
// so that every backend that stays keeps its state.

// specSet is the backends, pool settings and routes of one protocol, as
// spec strings in the operator's order.
type specSet struct {
	Backends, Pools, Routes []string
}

// ValueError is an error about one value of a repeatable setting of the
// Config (a -http-route, an -arm rule): Flag names it ("-http-route"),
// Value is the value as given. cmd/sluice adds where the value came from
// (the command line, a SLUICE_* variable, a -config file line).
type ValueError struct {
	Flag, Value string
	Err         error
}

func (e *ValueError) Error() string { return fmt.Sprintf("%s %q: %v", e.Flag, e.Value, e.Err) }
func (e *ValueError) Unwrap() error { return e.Err }

// CheckPool validates one -http-pool or -sip-pool spec.
func CheckPool(proto string) func(string) error {
	return func(s string) error { _, err := lb.ParsePoolSpec(proto, s); return err }
}

// CheckRoute validates one -http-route or -sip-route spec.
func CheckRoute(proto string) func(string) error {
	return func(s string) error { _, err := lb.ParseRouteSpec(proto, s); return err }
}

// parseSpecs parses set as proto's backends, pools and routes. Errors name
// the flag and the value (ValueError).
func parseSpecs(proto string, set specSet) (backends []lb.BackendSpec, pools []lb.PoolSpec, routes []lb.RouteSpec, err error) {
	for _, s := range set.Backends {
		b, err := lb.ParseBackendSpec(proto, s)
		if err != nil {
			return nil, nil, nil, &ValueError{Flag: "-" + proto + "-backend", Value: s, Err: err}
		}
		backends = append(backends, b)
	}
	for _, s := range set.Pools {
		p, err := lb.ParsePoolSpec(proto, s)
		if err != nil {
			return nil, nil, nil, &ValueError{Flag: "-" + proto + "-pool", Value: s, Err: err}
		}
		pools = append(pools, p)
	}
	for _, s := range set.Routes {
		r, err := lb.ParseRouteSpec(proto, s)
		if err != nil {
			return nil, nil, nil, &ValueError{Flag: "-" + proto + "-route", Value: s, Err: err}
		}
		routes = append(routes, r)
	}
	return backends, pools, routes, nil
}

// poolNames returns the pools the backends of set are members of (the
// pool default for a backend without pool=). Specs that do not parse are
// skipped (parseSpecs reports them).
func poolNames(proto string, backends []string) map[string]bool {
	names := map[string]bool{}
	for _, s := range backends {
		b, err := lb.ParseBackendSpec(proto, s)
		if err != nil {
			continue
		}
		if len(b.Pools) == 0 {
			names[lb.DefaultPool] = true
		}
		for _, p := range b.Pools {
			names[p] = true
		}
	}
	return names
}

// checkSpecs checks what lb.NewGeneration would refuse about one value,
// naming that value: a pool setting or a route naming a pool no backend
// is a member of.
func checkSpecs(proto string, set specSet) error {
	if _, _, _, err := parseSpecs(proto, set); err != nil {
		return err
	}
	names := poolNames(proto, set.Backends)
	for _, s := range set.Pools {
		p, _ := lb.ParsePoolSpec(proto, s)
		if !names[p.Name] {
			return &ValueError{Flag: "-" + proto + "-pool", Value: s, Err: fmt.Errorf("pool %s has no %s backends (name it in a -%s-backend's pool=)", p.Name, proto, proto)}
		}
	}
	for _, s := range set.Routes {
		r, _ := lb.ParseRouteSpec(proto, s)
		if !names[r.Pool] {
			return &ValueError{Flag: "-" + proto + "-route", Value: s, Err: fmt.Errorf("pool %s has no %s backends (name it in a -%s-backend's pool=)", r.Pool, proto, proto)}
		}
	}
	return nil
}

// checkRulePools refuses an ARM rule whose pool= names a pool of no front
// end: its budget would never meter anything. rules are loadRules': the
// -arm flags' first, in order, then -arm-file's.
func (n *Node) checkRulePools(rules []admission.RuleConfig) error {
	for i, rc := range rules {
		err := n.rulePoolKnown(rc)
		if err == nil {
			continue
		}
		if i < len(n.cfg.ARM) {
			return &ValueError{Flag: "-arm", Value: n.cfg.ARM[i], Err: err}
		}
		return fmt.Errorf("-arm-file %s: rule %s: %w", n.cfg.ARMFile, rc.Name, err)
	}
	return nil
}

// rulePoolKnown returns an error when rc's pool= names a pool no backend
// of either front end is in.
func (n *Node) rulePoolKnown(rc admission.RuleConfig) error {
	if rc.Match.Pool == "" {
		return nil
	}
	names := poolNames("http", n.specs("http").Backends)
	for p := range poolNames("sip", n.specs("sip").Backends) {
		names[p] = true
	}
	if names[rc.Match.Pool] {
		return nil
	}
	have := make([]string, 0, len(names))
	for p := range names {
		have = append(have, p)
	}
	slices.Sort(have)
	return fmt.Errorf("pool %s is a pool of no front end (pools: %s)", rc.Match.Pool, strings.Join(have, ", "))
}

// specs returns proto's specs in force: backends and pool settings of
// the configuration, routes as the operator last set them.
func (n *specsInForce) specs(proto string) specSet {
	if proto == "sip" {
		return specSet{Backends: n.sipBackends, Pools: n.sipPools, Routes: n.routes["sip"]}
	}
	return specSet{Backends: n.httpBackends, Pools: n.httpPools, Routes: n.routes["http"]}
}

// buildGen builds proto's generation of set, with prev's state carried
// over. It starts nothing.
func (n *Node) buildGen(proto string, set specSet, prev *lb.Generation) (*lb.Generation, error) {
	backends, pools, routes, err := parseSpecs(proto, set)
	if err != nil {
		return nil, err
	}
	if backends, err = n.expand(proto, backends); err != nil {
		return nil, err
	}
	gc := lb.GenConfig{
		Proto:    proto,
		Backends: backends,
		Pools:    pools,
		Routes:   routes,
		Probe:    n.cfg.MOPProbe,
		Prev:     prev,
		Clock:    n.clock,
		Logger:   n.logger,
		Events:   n.events,
		MOP: func(spec lb.BackendSpec) (*admission.MOP, error) {
			// MOP learns from memory samples: without a probe it would
			// hold the backend at -mop-initial-rate for ever.
			if spec.MetricsURL == "" {
				return nil, nil
			}
			return n.newMOP(proto, spec.ID, spec.Addr)
		},
	}
	switch proto {
	case "http":
		if err := n.cfg.checkHTTPGen(); err != nil {
			return nil, err
		}
		gc.Policy = n.cfg.Policy
		gc.Passive = n.cfg.Passive
		gc.Passive.OnEject = n.onEject("http")
		gc.Health = n.healthConfig()
		gc.Prober = n.httpProber
	case "sip":
		if err := n.sipGenConfig(&gc); err != nil {
			return nil, err
		}
	}
	return lb.NewGeneration(gc)
}

// httpProber is the active check of an HTTP backend: its own health=PATH,
// else its pool's (- for a TCP connect), else -health-path's.
func (n *Node) httpProber(b *lb.Backend, spec lb.BackendSpec, pool *lb.PoolSpec) lb.Prober {
	if pool != nil && pool.HealthPath != "" && spec.HealthPath == "" {
		return httpProber(pool.HealthPath, httpSpec(spec))
	}
	return httpProber(n.cfg.HealthPath, httpSpec(spec))
}

// Generation returns the backend generation in force of proto ("http" or
// "sip"), nil when the node has no such front end or the front end does
// not serve one.
func (n *Node) Generation(proto string) *lb.Generation {
	switch proto {
	case "http":
		if n.httpSrv != nil {
			return n.httpSrv.Generation()
		}
	case "sip":
		return n.sipGeneration()
	}
	return nil
}

// httpSpec is spec as the HTTP front end's parser gives it.
func httpSpec(spec lb.BackendSpec) lbhttp.BackendSpec {
	return lbhttp.BackendSpec{Addr: spec.Addr, ID: spec.ID, Weight: spec.Weight, MetricsURL: spec.MetricsURL, HealthPath: spec.HealthPath}
}

// checkHTTPGen checks the front end's settings of the HTTP generation
// with the libraries' own checks, whose FieldErrors cmd/sluice names by
// their flags (lb.NewGeneration's errors name the backends instead).
func (c *Config) checkHTTPGen() error {
	if c.Health.Interval < 0 {
		return errors.New("-health-interval must not be negative")
	}
	if _, err := lb.PolicyName(c.Policy); err != nil {
		return err
	}
	if c.Health.Interval > 0 {
		if _, err := lb.NewHealthChecker(c.Health, nil); err != nil {
			return err
		}
	}
	return nil
}
