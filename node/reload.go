package node

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/internal/opfile"
	"github.com/sluicelb/sluice/lb"
)

// fileSpecs is what -backends-file gives, by protocol.
type fileSpecs struct {
	http, sip specSet
	path      string
	lines     map[string]int // "http-route SPEC" -> its line
}

// check is checkSpecs of proto's specs in force, an error about a value of
// the file naming its line.
func (f fileSpecs) check(proto string, set specSet) error {
	err := checkSpecs(proto, set)
	var ve *ValueError
	if errors.As(err, &ve) {
		if n, ok := f.lines[strings.TrimPrefix(ve.Flag, "-")+" "+ve.Value]; ok {
			return fmt.Errorf("-backends-file %s:%d: %w", f.path, n, err)
		}
	}
	return err
}

// readBackendsFile reads -backends-file: one item a line, "http SPEC" or
// "sip SPEC" for a backend (SPEC as for -http-backend and -sip-backend),
// "http-pool SPEC", "sip-pool SPEC" for a pool's settings and
// "http-route SPEC", "sip-route SPEC" for a route (in order: first match
// wins, after the flags' routes); blank lines and lines starting with #
// are skipped. Errors name file and line. A route or pool setting naming
// a pool without backends is named with its line too.
func readBackendsFile(path string) (fileSpecs, error) {
	out := fileSpecs{path: path, lines: map[string]int{}}
	data, err := opfile.ReadLines(path, opfile.MaxSize)
	if err != nil {
		return out, fmt.Errorf("-backends-file: %w", err)
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
		kind, spec, _ := strings.Cut(line, " ")
		spec = strings.TrimSpace(spec)
		proto, what, _ := strings.Cut(kind, "-")
		set := &out.http
		if proto == "sip" {
			set = &out.sip
		}
		switch {
		case spec == "":
			return out, fmt.Errorf("-backends-file %s:%d: want \"http SPEC\", \"sip SPEC\", \"http-pool SPEC\", \"sip-pool SPEC\", \"http-route SPEC\" or \"sip-route SPEC\", got %q", path, n, line)
		case proto != "http" && proto != "sip":
			return out, fmt.Errorf("-backends-file %s:%d: protocol %q: want http or sip", path, n, proto)
		case what == "":
			b, err := lb.ParseBackendSpec(proto, spec)
			if err != nil {
				return out, fmt.Errorf("-backends-file %s:%d: %s %w", path, n, proto, err)
			}
			if err := dup(proto, b.ID, b.Addr, n); err != nil {
				return out, err
			}
			set.Backends = append(set.Backends, spec)
		case what == "pool":
			if _, err := lb.ParsePoolSpec(proto, spec); err != nil {
				return out, fmt.Errorf("-backends-file %s:%d: %s-pool %q: %w", path, n, proto, spec, err)
			}
			set.Pools = append(set.Pools, spec)
			out.lines[kind+" "+spec] = n
		case what == "route":
			if _, err := lb.ParseRouteSpec(proto, spec); err != nil {
				return out, fmt.Errorf("-backends-file %s:%d: %s-route %q: %w", path, n, proto, spec, err)
			}
			set.Routes = append(set.Routes, spec)
			out.lines[kind+" "+spec] = n
		default:
			return out, fmt.Errorf("-backends-file %s:%d: %q: want http, sip, http-pool, sip-pool, http-route or sip-route", path, n, kind)
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("-backends-file %s: %w", path, err)
	}
	return out, nil
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
	dropped, err := n.reload()
	if err != nil {
		n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigReload, Subject: n.cfg.BackendsFile,
			Message: "backends not reloaded, the backends in force are unchanged: " + err.Error()})
	}
	n.reloaded(n.cfg.BackendsFile, err, dropped)
	return err
}

// reload is Reload; it returns the run-time changes it dropped.
func (n *Node) reload() (dropped []string, err error) {
	file, err := readBackendsFile(n.cfg.BackendsFile)
	if err != nil {
		return nil, err
	}
	// No run-time change while the pools are swapped: it would reach the
	// old pool and be lost.
	n.op.mu.Lock()
	defer n.op.mu.Unlock()
	next := n.specsInForce
	next.setSpecs(n.cfg, file)
	if (len(next.httpBackends) > 0) != (n.httpSrv != nil) || (len(next.sipBackends) > 0) != (n.sipSrv != nil) {
		return nil, errors.New("reload: a front end can be added or removed only by a restart (keep at least one backend per protocol in use)")
	}
	for _, proto := range []string{"http", "sip"} {
		if err := file.check(proto, next.specs(proto)); err != nil {
			return nil, err
		}
		// The operator's route list, if it still applies, from the first
		// request on (not the file's for a moment).
		if routes, ok := n.keptRoutes(proto, next.cfgRoutes[proto]); ok {
			set := next.specs(proto)
			set.Routes = routes
			if checkSpecs(proto, set) == nil {
				next.routes[proto] = routes
			}
		}
	}
	var gen *lb.Generation
	if n.httpSrv != nil {
		if gen, err = n.buildGen("http", next.specs("http"), n.httpGen); err != nil {
			return nil, fmt.Errorf("-backends-file %s: http backends: %w", n.cfg.BackendsFile, err)
		}
	}
	if n.sipSrv != nil {
		if err := n.reloadSIP(next.specs("sip")); err != nil {
			return nil, fmt.Errorf("-backends-file %s: sip backends: %w", n.cfg.BackendsFile, err)
		}
	}
	n.specsInForce = next
	if gen != nil {
		if err := n.installHTTP(gen); err != nil {
			return nil, err
		}
	}
	n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigReload, Subject: n.cfg.BackendsFile,
		Message: fmt.Sprintf("backends reloaded: %d http, %d sip", len(n.httpBackends), len(n.sipBackends))})
	// The new backends start at their configured weight: put the
	// run-time changes kept in the data directory back on them.
	return n.applyOverrides("routes/", "backend/", "mop/"), nil
}

// specsInForce are the backends, pool settings and routes in force.
type specsInForce struct {
	httpBackends, sipBackends []string
	httpPools, sipPools       []string
	// Routes by protocol: configured (Config and backends file), and in
	// force (the configured ones, or the operator's run-time list).
	cfgRoutes, routes map[string][]string
}

// setSpecs puts cfg's backends, pool settings and routes with the
// backends file's after them in force; the routes in force are the
// configured ones (overrides go on top later).
func (n *specsInForce) setSpecs(cfg Config, file fileSpecs) {
	cat := func(a, b []string) []string { return append(slices.Clone(a), b...) }
	n.httpBackends = cat(cfg.HTTPBackends, file.http.Backends)
	n.sipBackends = cat(cfg.SIPBackends, file.sip.Backends)
	n.httpPools = cat(cfg.HTTPPools, file.http.Pools)
	n.sipPools = cat(cfg.SIPPools, file.sip.Pools)
	n.cfgRoutes = map[string][]string{"http": cat(cfg.HTTPRoutes, file.http.Routes), "sip": cat(cfg.SIPRoutes, file.sip.Routes)}
	n.routes = map[string][]string{"http": n.cfgRoutes["http"], "sip": n.cfgRoutes["sip"]}
}

// installHTTP starts gen (with the node running), hands it to the HTTP
// front end and stops the generation it replaces. The caller holds
// op.mu, or the node is not started yet.
func (n *Node) installHTTP(gen *lb.Generation) error {
	if n.ctx != nil {
		gen.Start(n.ctx) // a first round of probes before it serves
	}
	if err := n.httpSrv.SetGeneration(gen); err != nil {
		gen.Stop()
		return err
	}
	old := n.httpGen
	n.httpGen = gen
	if old != nil {
		old.Stop()
	}
	return nil
}

// healthConfig is -health-* with the event log attached.
func (n *Node) healthConfig() lb.HealthConfig {
	c := n.cfg.Health
	c.Events = n.events
	c.Clock = n.clock
	return c
}

// keptRoutes returns the route list of proto kept in the data directory
// when it applies on top of the configured routes cfg (the configuration
// did not change them since the list was kept).
func (n *Node) keptRoutes(proto string, cfg []string) ([]string, bool) {
	if n.store == nil {
		return nil, false
	}
	for _, o := range n.store.Overrides() {
		if o.Key == routeKey(proto) && o.Configured == routesValue(cfg) {
			return parseRoutesValue(o.Value), true
		}
	}
	return nil, false
}
