package node

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicelb/sluice/admin"
	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/internal/opfile"
	"github.com/sluicelb/sluice/lb"
	"github.com/sluicelb/sluice/persist"
)

// Run-time control: the admin listener's POST /control/... endpoints and
// `sluice ctl` change backends and ARM rules through the node's operator,
// which keeps each change as an override in the data directory, so that
// it survives a restart.
//
// Precedence: the configuration (flags, SLUICE_* variables, -config,
// -backends-file, -arm-file) is the base; an override applies on top of it
// while the configuration still gives the setting the value it had when
// the override was made. When the configuration of that setting changed
// since (an operator edited the flag or file later), the configuration
// wins and the override is dropped with a config.warning event. A change
// back to the configured value removes the override.

// operator applies the admin listener's changes and records overrides.
type operator struct {
	n  *Node
	mu sync.Mutex // one change at a time: a change and its override together
}

// backendOps and ruleOps do the changes themselves.
func (n *Node) backendOps() admin.PoolControl { return admin.PoolControl(n.pools) }

func (n *Node) ruleOps() admin.RuleControl {
	return admin.RuleControl{Controller: n.ctrl, Now: n.clock.Now}
}

// pools are the pools in force of both front ends (a reload replaces
// them); a backend in several pools is in several of them.
func (n *Node) pools() []*lb.Pool {
	var pools []*lb.Pool
	for _, proto := range []string{"http", "sip"} {
		if g := n.Generation(proto); g != nil {
			pools = append(pools, g.Pools()...)
		} else if p := n.frontPool(proto); p != nil {
			pools = append(pools, p)
		}
	}
	return pools
}

// frontPool is the default pool of proto's front end, nil without one.
func (n *Node) frontPool(proto string) *lb.Pool {
	if proto == "http" {
		if n.httpSrv == nil {
			return nil
		}
		return n.httpSrv.Pool()
	}
	return n.sipPool()
}

// backendsOf lists proto's backends in force, each once, in spec order.
func (n *Node) backendsOf(proto string) []*lb.Backend {
	if g := n.Generation(proto); g != nil {
		return g.Backends()
	}
	if p := n.frontPool(proto); p != nil {
		return p.Backends()
	}
	return nil
}

// Apply implements admin.Operator.
func (o *operator) Apply(c admin.Change) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := o.n
	var done string
	var err error
	switch c.Target {
	case admin.TargetBackend:
		done, err = n.backendOps().Apply(c)
	case admin.TargetARM:
		if err := n.checkRuleChange(c); err != nil {
			return "", err
		}
		done, err = n.ruleOps().Apply(c)
		n.rulesChanged()
	case admin.TargetRoute:
		done, err = n.changeRoutes(c)
	case admin.TargetPool:
		// Each backend's drain is kept as its own override.
		return n.drainPool(c)
	default:
		return "", fmt.Errorf("%s: %w", c.Target, admin.ErrUnknownAction)
	}
	if err != nil {
		return "", err
	}
	if err := n.keepOverride(c); err != nil {
		n.logger.Warn("run-time change made but not kept for a restart", "change", c.Subject()+" "+c.Action, "err", err)
		done += " (in force, but not kept across a restart: " + err.Error() + ")"
	}
	return done, nil
}

// checkRuleChange refuses an ARM rule added or changed at run time whose
// pool= names a pool of no front end, as start-up does.
func (n *Node) checkRuleChange(c admin.Change) error {
	var rc admission.RuleConfig
	switch c.Action {
	case "add":
		r, err := admission.ParseRule(c.Value)
		if err != nil {
			return nil // the rule control says what is wrong
		}
		rc = r
	case "set":
		old, ok := n.ctrl.Rule(c.Name)
		if !ok {
			return nil
		}
		r, err := admission.ChangeRule(old, c.Value)
		if err != nil {
			return nil
		}
		rc = r
	default:
		return nil
	}
	if err := n.rulePoolKnown(rc); err != nil {
		return fmt.Errorf("arm rule %s: %w: %w", rc.Name, admin.ErrBadValue, err)
	}
	return nil
}

// keepOverride stores (or, when the setting is back at its configured
// value, removes) the override of a change just made.
func (n *Node) keepOverride(c admin.Change) error {
	if n.store == nil {
		return errors.New("the data directory is not open")
	}
	var key, value string
	switch c.Target {
	case admin.TargetRoute:
		key, value = routeKey(c.Protocol), routesValue(n.routes[c.Protocol])
	case admin.TargetARM:
		key = "arm/" + ruleNameOf(c)
		if rc, ok := n.ctrl.Rule(ruleNameOf(c)); ok {
			value = admission.FormatRule(rc)
		}
	case admin.TargetBackend:
		_, b, err := admin.PoolControl(n.pools).Find(c.Protocol, c.Name)
		if err != nil {
			return err
		}
		prefix := "backend/" + b.Proto() + "/" + b.ID() + "/"
		switch c.Action {
		case "drain", "undrain":
			key, value = prefix+"drain", strconv.FormatBool(b.Drained())
		case "disable", "enable":
			key, value = prefix+"disable", strconv.FormatBool(b.Disabled())
		case "weight":
			key, value = prefix+"weight", strconv.Itoa(b.Weight())
		case "mop-pin", "mop-unpin", "mop-reset":
			key = "mop/" + b.Proto() + "/" + b.ID() + "/pin"
			if p := b.MOP().Pinned(); p > 0 {
				value = strconv.FormatFloat(p, 'g', -1, 64)
			} else {
				value = n.configuredValue(key) // learning: as configured
			}
		}
	}
	configured := n.configuredValue(key)
	if value == configured {
		return n.store.DeleteOverrides(key)
	}
	return n.store.SetOverride(persist.Override{Key: key, Value: value, Configured: configured, By: c.By})
}

func ruleNameOf(c admin.Change) string {
	if c.Action == "add" {
		if rc, err := admission.ParseRule(c.Value); err == nil {
			return rc.Name
		}
	}
	return c.Name
}

// configuredValue is the value the configuration gives the setting key
// now, "" when it gives none (a backend or rule not configured).
func (n *Node) configuredValue(key string) string {
	parts := strings.Split(key, "/")
	switch {
	case len(parts) == 2 && parts[0] == "routes":
		return routesValue(n.cfgRoutes[parts[1]])
	case len(parts) == 2 && parts[0] == "arm":
		for _, rc := range n.cfgRules {
			if rc.Name == parts[1] {
				return admission.FormatRule(rc)
			}
		}
		return ""
	case len(parts) == 4 && (parts[0] == "backend" || parts[0] == "mop"):
		spec, ok := n.configuredBackend(parts[1], parts[2])
		if !ok {
			return ""
		}
		switch parts[0] + "/" + parts[3] {
		case "backend/drain", "backend/disable":
			return "false"
		case "backend/weight":
			return strconv.Itoa(spec.Weight)
		case "mop/pin":
			if spec.MetricsURL != "" {
				return "learning"
			}
		}
	}
	return ""
}

// configuredBackend finds the backend proto/id among the specs in force.
func (n *Node) configuredBackend(proto, id string) (lb.BackendSpec, bool) {
	specs := n.httpBackends
	if proto == "sip" {
		specs = n.sipBackends
	}
	for _, s := range specs {
		if spec, err := lb.ParseBackendSpec(proto, s); err == nil && spec.ID == id {
			return spec, true
		}
	}
	return lb.BackendSpec{}, false
}

// applyOverrides puts the stored overrides on top of the configuration:
// at start (before any front end serves) and after a reload of the
// backends. An override whose setting the configuration changed since is
// dropped, with an event. only limits which keys are looked at ("arm/",
// "backend/" and "mop/").
//
// It returns the dropped changes, each "KEY=VALUE (by WHO at TIME)".
func (n *Node) applyOverrides(only ...string) (droppedChanges []string) {
	apply, dropped := n.reconcile(only...)
	droppedChanges = n.dropOverrides(dropped)
	// Routes first: a route list builds a new generation, which the
	// backends' overrides then apply to.
	slices.SortStableFunc(apply, func(a, b persist.Override) int {
		ra, rb := strings.HasPrefix(a.Key, "routes/"), strings.HasPrefix(b.Key, "routes/")
		switch {
		case ra && !rb:
			return -1
		case rb && !ra:
			return 1
		}
		return 0
	})
	for _, o := range apply {
		if err := n.applyOverride(o); err != nil {
			n.overrideNotApplied(o, err)
			continue
		}
		n.logger.Info("run-time change applied", "key", o.Key, "value", o.Value, "by", o.By, "at", o.At)
	}
	return droppedChanges
}

// reconcile splits the stored overrides whose keys start with one of only
// into those that apply on top of the configuration in force and those it
// overrules now. It changes nothing.
func (n *Node) reconcile(only ...string) (apply, dropped []persist.Override) {
	if n.store == nil {
		return nil, nil
	}
	var ovs []persist.Override
	for _, o := range n.store.Overrides() {
		for _, p := range only {
			if strings.HasPrefix(o.Key, p) {
				ovs = append(ovs, o)
				break
			}
		}
	}
	return persist.Reconcile(ovs, n.configuredValue)
}

// dropOverrides removes overrides the configuration overruled, with one
// event each saying what was dropped and why (logged at WARN), and
// returns them, each "KEY=VALUE (by WHO at TIME)".
func (n *Node) dropOverrides(dropped []persist.Override) (changes []string) {
	var gone []string
	for _, o := range dropped {
		now := n.configuredValue(o.Key)
		if now == "" {
			now = "(not configured)"
		}
		n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigWarning, Subject: o.Key,
			Message: fmt.Sprintf("run-time change %s=%q (by %s at %s) dropped: the configuration changed since from %q to %q and wins",
				o.Key, o.Value, o.By, o.At.Format(time.RFC3339), o.Configured, now)})
		gone = append(gone, o.Key)
		changes = append(changes, fmt.Sprintf("%s=%s (by %s at %s)", o.Key, o.Value, o.By, o.At.Format(time.RFC3339)))
	}
	if len(gone) > 0 {
		if err := n.store.DeleteOverrides(gone...); err != nil {
			n.logger.Warn("dropped overrides not removed from the data directory", "err", err)
		}
	}
	return changes
}

func (n *Node) overrideNotApplied(o persist.Override, err error) {
	n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigWarning, Subject: o.Key,
		Message: fmt.Sprintf("run-time change %s=%q not applied: %v", o.Key, o.Value, err)})
}

// rulesWith returns rules with the ARM overrides of apply on top: a rule
// changed or removed at run time, and rules added at run time after the
// configured ones. An override that does not parse is left out, with an
// event.
func (n *Node) rulesWith(rules []admission.RuleConfig, apply []persist.Override) []admission.RuleConfig {
	out := slices.Clone(rules)
	for _, o := range apply {
		name, ok := strings.CutPrefix(o.Key, "arm/")
		if !ok {
			continue
		}
		i := slices.IndexFunc(out, func(r admission.RuleConfig) bool { return r.Name == name })
		if o.Value == "" {
			if i >= 0 {
				out = slices.Delete(out, i, i+1)
			}
			continue
		}
		rc, err := admission.ParseRule(o.Value)
		if err != nil {
			n.overrideNotApplied(o, err)
			continue
		}
		if i >= 0 {
			out[i] = rc
		} else {
			out = append(out, rc)
		}
	}
	return out
}

func (n *Node) applyOverride(o persist.Override) error {
	parts := strings.Split(o.Key, "/")
	now := n.clock.Now()
	if parts[0] == "routes" && len(parts) == 2 {
		if n.frontPool(parts[1]) == nil {
			return fmt.Errorf("no %s front end", parts[1])
		}
		return n.setRoutes(parts[1], parseRoutesValue(o.Value))
	}
	if parts[0] == "arm" {
		defer n.rulesChanged()
		if o.Value == "" {
			_, err := n.ctrl.RemoveRule(parts[1], now)
			return err
		}
		rc, err := admission.ParseRule(o.Value)
		if err != nil {
			return err
		}
		if _, ok := n.ctrl.Rule(rc.Name); ok {
			_, err = n.ctrl.UpdateRule(rc, now)
		} else {
			_, err = n.ctrl.AddRule(rc, now)
		}
		return err
	}
	c := admin.Change{Target: admin.TargetBackend, Protocol: parts[1], Name: parts[2], Value: o.Value}
	switch parts[0] + "/" + parts[3] {
	case "backend/drain":
		c.Action = map[bool]string{true: "drain", false: "undrain"}[o.Value == "true"]
	case "backend/disable":
		c.Action = map[bool]string{true: "disable", false: "enable"}[o.Value == "true"]
	case "backend/weight":
		c.Action = "weight"
	case "mop/pin":
		c.Action = "mop-pin"
	default:
		return fmt.Errorf("unknown setting %q", o.Key)
	}
	_, err := n.backendOps().Apply(c)
	return err
}

// loadRules reads the configured ARM rules: -arm flags, then -arm-file.
func (n *Node) loadRules() ([]admission.RuleConfig, error) {
	var rules []admission.RuleConfig
	for _, s := range n.cfg.ARM {
		rc, err := admission.ParseRule(s)
		if err != nil {
			return nil, err
		}
		rules = append(rules, rc)
	}
	if n.cfg.ARMFile != "" {
		data, err := opfile.ReadLines(n.cfg.ARMFile, opfile.MaxSize)
		if err != nil {
			return nil, fmt.Errorf("-arm-file: %w", err)
		}
		more, err := admission.ParseRuleFile(n.cfg.ARMFile, data)
		if err != nil {
			return nil, err
		}
		for _, rc := range more {
			if slices.ContainsFunc(rules, func(r admission.RuleConfig) bool { return r.Name == rc.Name }) {
				return nil, fmt.Errorf("-arm-file %s: rule %q is also given by -arm", n.cfg.ARMFile, rc.Name)
			}
		}
		rules = append(rules, more...)
	}
	return rules, nil
}

// ReloadARM re-reads -arm-file (SIGHUP) and puts the rules of -arm and the
// file in force, with the run-time overrides on top, in one step: rules
// unchanged keep their counters, changed limits and actions change in
// place, and a rule an override holds does not flip to the file's value
// and back. An override whose rule the file changed is dropped (the file
// wins), with an event. A file that does not read or parse changes
// nothing; the error, naming the file and line, is returned and written to
// the event log.
func (n *Node) ReloadARM() error {
	if n.cfg.ARMFile == "" {
		return nil
	}
	rules, err := n.loadRules()
	if err == nil {
		err = n.checkRulePools(rules)
	}
	if err == nil {
		n.op.mu.Lock()
		defer n.op.mu.Unlock()
		prev := n.cfgRules
		n.cfgRules = rules // what configuredValue compares the overrides with
		apply, dropped := n.reconcile("arm/")
		var changes []admission.RuleChange
		if changes, err = n.ctrl.SetRules(n.rulesWith(rules, apply), n.clock.Now()); err == nil {
			n.rulesChanged()
			n.reloaded(n.cfg.ARMFile, nil, n.dropOverrides(dropped))
			var parts []string
			for _, ch := range changes {
				if ch.How != "unchanged" {
					parts = append(parts, ch.Name+" "+ch.How)
				}
			}
			if len(parts) == 0 {
				parts = append(parts, "no change")
			}
			n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigReload, Subject: n.cfg.ARMFile,
				Message: fmt.Sprintf("arm rules reloaded: %d in force (%s)", len(n.ctrl.Rules()), strings.Join(parts, ", "))})
			return nil
		}
		n.cfgRules = prev
		err = fmt.Errorf("-arm-file %s: %w", n.cfg.ARMFile, err)
	}
	n.events(admission.Event{Time: time.Now(), Kind: admission.EventConfigReload, Subject: n.cfg.ARMFile,
		Message: "arm rules not reloaded, the rules in force are unchanged: " + err.Error()})
	n.reloaded(n.cfg.ARMFile, err, nil)
	return err
}

// RunningConfig implements admin.ConfigSource: the rules and backends in
// force in the config-file syntax (one "flag value" a line), run-time
// states without a flag as comments.
func (n *Node) RunningConfig() string {
	// The specs in force change under op.mu (reloads, route changes).
	n.op.mu.Lock()
	defer n.op.mu.Unlock()
	var b strings.Builder
	b.WriteString("# the running configuration of this sluice, in -config file syntax\n")
	for _, l := range n.cfg.Settings {
		b.WriteString(l + "\n")
	}
	for _, rc := range n.ctrl.RuleConfigs() {
		fmt.Fprintf(&b, "arm %s\n", admission.FormatRule(rc))
	}
	for _, proto := range []string{"http", "sip"} {
		for _, be := range n.backendsOf(proto) {
			spec, ok := n.configuredBackend(be.Proto(), be.ID())
			if !ok {
				continue
			}
			spec.Weight = be.Weight()
			fmt.Fprintf(&b, "%s-backend %s\n", be.Proto(), lb.FormatBackendSpec(be.Proto(), spec))
			var notes []string
			if be.Drained() {
				notes = append(notes, "drained")
			}
			if be.Disabled() {
				notes = append(notes, "disabled")
			}
			if r := be.MOP().Pinned(); r > 0 {
				notes = append(notes, fmt.Sprintf("mop pinned at %g/s", r))
			}
			if len(notes) > 0 {
				fmt.Fprintf(&b, "# %s backend %s: %s (run-time, sluice ctl)\n", be.Proto(), be.ID(), strings.Join(notes, ", "))
			}
		}
	}
	// Backends from DNS: the names as configured (their addresses come
	// and go).
	for _, proto := range []string{"http", "sip"} {
		for _, s := range n.specs(proto).Backends {
			if spec, err := lb.ParseBackendSpec(proto, s); err == nil && spec.DNS.Kind != "" {
				fmt.Fprintf(&b, "%s-backend %s\n", proto, lb.FormatBackendSpec(proto, spec))
			}
		}
	}
	for _, proto := range []string{"http", "sip"} {
		set := n.specs(proto)
		for _, spec := range set.Pools {
			if p, err := lb.ParsePoolSpec(proto, spec); err == nil {
				fmt.Fprintf(&b, "%s-pool %s\n", proto, p)
			}
		}
		for _, spec := range set.Routes {
			if r, err := lb.ParseRouteSpec(proto, spec); err == nil {
				fmt.Fprintf(&b, "%s-route %s\n", proto, r)
			}
		}
	}
	return b.String()
}

// rulesChanged follows a change of the ARM rule set: with the cluster on,
// rules added or replaced get their leased budget and removed ones stop
// leasing.
func (n *Node) rulesChanged() {
	if n.cluster != nil {
		n.cluster.SyncRules(n.ctrl.Rules())
	}
}
