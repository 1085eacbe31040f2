package node

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/lb"
)

// Routes at run time: the operator adds and removes routes of new work
// (POST /control/routes/..., sluice ctl route). Each change builds a new
// generation with the new route list, the previous one as Prev, so every
// backend keeps its state, and is kept as the override "routes/PROTO"
// (the whole list, one spec a line) in the data directory.

// routeKey is the override key of proto's routes.
func routeKey(proto string) string { return "routes/" + proto }

// changeRoutes applies a TargetRoute change. The caller holds op.mu.
func (n *Node) changeRoutes(c admin.Change) (string, error) {
	proto := c.Protocol
	if proto != "http" && proto != "sip" {
		return "", fmt.Errorf("routes of protocol %q: want http or sip: %w", proto, admin.ErrBadValue)
	}
	if n.frontPool(proto) == nil {
		return "", fmt.Errorf("this node has no %s front end: %w", proto, admin.ErrRefused)
	}
	cur := n.routes[proto]
	var next []string
	var done string
	switch c.Action {
	case "add":
		r, err := lb.ParseRouteSpec(proto, c.Value)
		if err != nil {
			return "", fmt.Errorf("%w: %w", admin.ErrBadValue, err)
		}
		at := len(cur)
		if c.Name != "" {
			if at, err = strconv.Atoi(c.Name); err != nil || at < 0 || at > len(cur) {
				return "", fmt.Errorf("position %q: want 0 to %d (the number of routes): %w", c.Name, len(cur), admin.ErrBadValue)
			}
		}
		spec := r.String()
		next = slices.Insert(slices.Clone(cur), at, spec)
		done = fmt.Sprintf("added %s at %d (%d routes)", spec, at, len(next))
	case "remove":
		i, err := strconv.Atoi(c.Name)
		if err != nil || i < 0 || i >= len(cur) {
			return "", fmt.Errorf("%s route %q: want an index from 0 to %d: %w", proto, c.Name, len(cur)-1, admin.ErrNoSuchRoute)
		}
		next = slices.Delete(slices.Clone(cur), i, i+1)
		done = fmt.Sprintf("removed route %d %s (%d routes)", i, cur[i], len(next))
	default:
		return "", fmt.Errorf("route action %q: %w", c.Action, admin.ErrUnknownAction)
	}
	if err := n.setRoutes(proto, next); err != nil {
		return "", fmt.Errorf("%w: %w", admin.ErrRefused, err)
	}
	return done, nil
}

// setRoutes puts routes in force for proto: a new generation of the same
// backends and pools with these routes, carrying every backend's state
// over. On an error nothing changes.
func (n *Node) setRoutes(proto string, routes []string) error {
	if slices.Equal(routes, n.routes[proto]) && n.Generation(proto) != nil && n.Generation(proto).Routes().Len() == len(routes) {
		return nil // in force already (a reload took the kept list)
	}
	set := n.specs(proto)
	set.Routes = routes
	if err := checkSpecs(proto, set); err != nil {
		return err
	}
	switch proto {
	case "http":
		if n.httpSrv == nil {
			return errors.New("no http front end")
		}
		gen, err := n.buildGen("http", set, n.httpGen)
		if err != nil {
			return err
		}
		carryWeights(n.httpGen, gen)
		if err := n.installHTTP(gen); err != nil {
			return err
		}
	case "sip":
		if err := n.setSIPRoutes(set); err != nil {
			return err
		}
	}
	n.routes[proto] = slices.Clone(routes)
	return nil
}

// setSIPRoutes puts set in force on the SIP front end.
func (n *Node) setSIPRoutes(set specSet) error {
	if n.sipSrv == nil {
		return errors.New("no sip front end")
	}
	gen, err := n.buildGen("sip", set, n.sipGen)
	if err != nil {
		return err
	}
	carryWeights(n.sipGen, gen)
	return n.installSIP(gen)
}

// routesValue is the override value of a route list: one spec a line.
func routesValue(routes []string) string { return strings.Join(routes, "\n") }

// parseRoutesValue is routesValue's inverse.
func parseRoutesValue(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, "\n")
}

// drainPool applies a TargetPool change: drains (or undrains) every
// backend of the pool, each kept as a backend override. The caller holds
// op.mu.
func (n *Node) drainPool(c admin.Change) (string, error) {
	if c.Action != "drain" && c.Action != "undrain" {
		return "", fmt.Errorf("pool action %q: %w", c.Action, admin.ErrUnknownAction)
	}
	var hit []string
	var errs []string
	for _, proto := range []string{"http", "sip"} {
		if c.Protocol != "" && c.Protocol != proto {
			continue
		}
		var members []*lb.Backend
		if g := n.Generation(proto); g != nil {
			if p := g.Pool(c.Name); p != nil {
				members = p.Backends()
			}
		} else if p := n.frontPool(proto); p != nil && c.Name == lb.DefaultPool {
			members = p.Backends()
		}
		for _, b := range members {
			bc := admin.Change{Target: admin.TargetBackend, Action: c.Action, Protocol: proto, Name: b.ID(), By: c.By}
			if _, err := n.backendOps().Apply(bc); err != nil {
				return "", err
			}
			if err := n.keepOverride(bc); err != nil {
				errs = append(errs, err.Error())
			}
			hit = append(hit, proto+" "+b.ID())
		}
	}
	if len(hit) == 0 {
		return "", fmt.Errorf("pool %q: %w", c.Name, admin.ErrNoSuchPool)
	}
	done := fmt.Sprintf("%sed %d backends: %s", c.Action, len(hit), strings.Join(hit, ", "))
	if len(errs) > 0 {
		done += " (in force, but not kept across a restart: " + errs[0] + ")"
	}
	return done, nil
}

// carryWeights gives next's backends the weights they have in prev (an
// operator's run-time weight): a route change keeps them, where a reload
// starts from the configured weights and puts the overrides back.
func carryWeights(prev, next *lb.Generation) {
	if prev == nil {
		return
	}
	for _, b := range next.Backends() {
		if ob := prev.Lookup(b.ID()); ob != nil && ob.Weight() != b.Weight() {
			next.SetWeight(b.ID(), ob.Weight()) // in range: it was set before
		}
	}
}
