package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// Run-time control: every change the admin listener makes goes through an
// Operator as a Change. The endpoints (POST only; a GET is 405):
//
//	POST /control/backends/{id}/drain|undrain|enable|disable
//	POST /control/backends/{id}/weight        value=1..1000 (or weight=)
//	POST /control/backends/{id}/mop/reset|unpin
//	POST /control/backends/{id}/mop/pin       value=RATE (requests/s)
//	POST /control/arm/{name}/set              value=key=value,... (-arm grammar: limit=500/s,action=reject)
//	POST /control/arm/{name}/remove
//	POST /control/arm/add                     value=an -arm rule
//	GET  /control/config                      the running configuration, config-file syntax
//	GET  /control/routes                      the routes by protocol with their hits (JSON)
//	POST /control/routes/{proto}/add          value (or the body)=a route spec; ?at=N puts it at position N (0: first; default last)
//	POST /control/routes/{proto}/{index}/remove  removes route index (0: the first)
//	POST /control/pools/{name}/drain|undrain  drains every backend of the pool (?protocol= when both front ends have it)
//
// A backend id used by both protocols needs ?protocol=http|sip.

// Targets of a Change.
const (
	TargetBackend = "backend"
	TargetARM     = "arm"
	// TargetRoute is a route of new work: Action add (Value the spec,
	// Name the position, "" for last) or remove (Name the index).
	TargetRoute = "route"
	// TargetPool is every backend of a pool: Action drain or undrain.
	TargetPool = "pool"
)

// Change is one operator request.
type Change struct {
	// Target is TargetBackend or TargetARM.
	Target string
	// Action is, for a backend: drain, undrain, weight, disable, enable,
	// mop-reset, mop-pin, mop-unpin; for an ARM rule: set, add, remove.
	Action string
	// Protocol narrows a backend id to "http" or "sip"; "" when unique.
	Protocol string
	// Name is the backend id or the rule name.
	Name string
	// Value is the weight, the pinned rate, the rule's changes (set) or
	// the whole rule (add).
	Value string
	// By says who asked: the remote address and, with tokens, the token's
	// name.
	By string
}

// Subject names what the change is about, as in events: "backend h1",
// "arm rule invites".
func (c Change) Subject() string {
	switch c.Target {
	case TargetARM:
		return "arm rule " + c.Name
	case TargetRoute:
		return c.Protocol + " routes"
	case TargetPool:
		return strings.TrimPrefix(c.Protocol+" pool ", " ") + c.Name
	}
	if c.Protocol != "" {
		return c.Protocol + " backend " + c.Name
	}
	return "backend " + c.Name
}

// Operator applies changes. It returns what changed ("weight 3 -> 7"), for
// the answer and the event log. Implementations must be safe for
// concurrent use.
type Operator interface {
	Apply(c Change) (done string, err error)
}

// ConfigSource writes the running configuration in the syntax of the
// config file (one "flag value" a line), for GET /control/config.
type ConfigSource interface {
	RunningConfig() string
}

// Errors of an Operator, mapped to status codes by the control endpoints.
var (
	// ErrBadValue: the value does not parse or is out of range (400).
	ErrBadValue = errors.New("bad value")
	// ErrRefused: the change does not apply to this target, e.g. pinning
	// the MOP rate of a backend without a memory probe (409).
	ErrRefused = errors.New("change refused")
	// ErrUnknownAction: no such action (404).
	ErrUnknownAction = errors.New("unknown action")
	// ErrNoSuchRoute: no route at that index (404).
	ErrNoSuchRoute = errors.New("no such route")
	// ErrNoSuchPool: no pool of that name (404).
	ErrNoSuchPool = errors.New("no such pool")
)

// statusOf maps an Operator's error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrNoSuchBackend), errors.Is(err, admission.ErrNoSuchRule), errors.Is(err, ErrUnknownAction),
		errors.Is(err, ErrNoSuchRoute), errors.Is(err, ErrNoSuchPool):
		return http.StatusNotFound
	case errors.Is(err, ErrAmbiguousBackend), errors.Is(err, admission.ErrRuleExists), errors.Is(err, ErrRefused):
		return http.StatusConflict
	case errors.Is(err, ErrBadValue), errors.Is(err, lb.ErrBadBackend):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// Apply implements Operator for the backend actions over the pools in force.
func (pc PoolControl) Apply(c Change) (string, error) {
	if c.Target != TargetBackend {
		return "", fmt.Errorf("%s: %w", c.Target, ErrUnknownAction)
	}
	_, b, err := pc.Find(c.Protocol, c.Name)
	if err != nil {
		return "", err
	}
	switch c.Action {
	case "drain", "undrain":
		on := c.Action == "drain"
		was := b.Drained()
		b.Drain(on)
		return fmt.Sprintf("drained %v -> %v", was, on), nil
	case "disable", "enable":
		on := c.Action == "disable"
		was := b.Disabled()
		b.Disable(on)
		return fmt.Sprintf("disabled %v -> %v", was, on), nil
	case "weight":
		w, err := ParseWeight(c.Value)
		if err != nil {
			return "", err
		}
		was := b.Weight()
		if err := pc.setWeight(b, w); err != nil {
			return "", err
		}
		return fmt.Sprintf("weight %d -> %d", was, w), nil
	case "mop-reset":
		m := b.MOP()
		if m == nil {
			return "", fmt.Errorf("backend %s has no memory probe (metrics=), so no MOP rate: %w", b.ID(), ErrRefused)
		}
		was := m.Status()
		m.Reset()
		return fmt.Sprintf("mop %s at %.1f/s -> discovery at %.1f/s", was.Phase, was.AllowedRate, m.Status().AllowedRate), nil
	case "mop-pin":
		m := b.MOP()
		if m == nil {
			return "", fmt.Errorf("backend %s has no memory probe (metrics=), so no MOP rate to pin: %w", b.ID(), ErrRefused)
		}
		rate, err := ParseRate(c.Value)
		if err != nil {
			return "", err
		}
		was := m.Status().AllowedRate
		if err := m.Pin(rate); err != nil {
			return "", fmt.Errorf("%w: %w", ErrBadValue, err)
		}
		return fmt.Sprintf("mop rate %.1f/s -> pinned at %g/s", was, rate), nil
	case "mop-unpin":
		m := b.MOP()
		was := m.Pinned()
		if !m.Unpin() {
			return "", fmt.Errorf("backend %s: MOP rate is not pinned: %w", b.ID(), ErrRefused)
		}
		return fmt.Sprintf("mop pinned at %g/s -> learning at %.1f/s", was, m.Status().AllowedRate), nil
	}
	return "", fmt.Errorf("backend action %q: %w", c.Action, ErrUnknownAction)
}

// maxRouteBody bounds a route spec sent as a request body.
const maxRouteBody = 16 << 10

// ParseWeight parses a backend weight, 1 to lb.MaxWeight.
func ParseWeight(v string) (int, error) {
	w, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || w < 1 || w > lb.MaxWeight {
		return 0, fmt.Errorf("weight %q: want an integer from 1 to %d: %w", v, lb.MaxWeight, ErrBadValue)
	}
	return w, nil
}

// ParseRate parses a MOP rate: requests per second, "500" or "500/s".
func ParseRate(v string) (float64, error) {
	s := strings.TrimSuffix(strings.TrimSpace(v), "/s")
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || !(r > 0) || r > 1e9 {
		return 0, fmt.Errorf("rate %q: want requests per second > 0, e.g. 500: %w", v, ErrBadValue)
	}
	return r, nil
}

// RuleControl is an Operator for the ARM actions over a controller.
type RuleControl struct {
	Controller *admission.Controller
	// Now is the monotonic clock of the controller.
	Now func() int64
}

// Apply implements Operator for set, add and remove of ARM rules.
func (rc RuleControl) Apply(c Change) (string, error) {
	if c.Target != TargetARM {
		return "", fmt.Errorf("%s: %w", c.Target, ErrUnknownAction)
	}
	now := rc.Now()
	switch c.Action {
	case "set":
		old, ok := rc.Controller.Rule(c.Name)
		if !ok {
			return "", fmt.Errorf("arm rule %q: %w", c.Name, admission.ErrNoSuchRule)
		}
		next, err := admission.ChangeRule(old, c.Value)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrBadValue, err)
		}
		if _, err := rc.Controller.UpdateRule(next, now); err != nil {
			return "", err
		}
		return admission.FormatRule(old) + " -> " + admission.FormatRule(next), nil
	case "add":
		r, err := admission.ParseRule(c.Value)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrBadValue, err)
		}
		if c.Name != "" && r.Name != c.Name {
			return "", fmt.Errorf("rule %q is named %q: %w", c.Value, r.Name, ErrBadValue)
		}
		if _, err := rc.Controller.AddRule(r, now); err != nil {
			return "", err
		}
		return "added " + admission.FormatRule(r), nil
	case "remove":
		ch, err := rc.Controller.RemoveRule(c.Name, now)
		if err != nil {
			return "", err
		}
		return "removed " + admission.FormatRule(ch.Old), nil
	}
	return "", fmt.Errorf("arm action %q: %w", c.Action, ErrUnknownAction)
}

// Operators sends each change to the Operator of its target.
type Operators map[string]Operator

// Apply implements Operator.
func (o Operators) Apply(c Change) (string, error) {
	op := o[c.Target]
	if op == nil {
		return "", fmt.Errorf("%s control is not available on this listener: %w", c.Target, ErrUnknownAction)
	}
	return op.Apply(c)
}

// legacyControl adapts a Control (drain, undrain, weight) to Operator.
type legacyControl struct{ c Control }

func (l legacyControl) Apply(c Change) (string, error) {
	if c.Target != TargetBackend {
		return "", fmt.Errorf("%s: %w", c.Target, ErrUnknownAction)
	}
	switch c.Action {
	case "drain", "undrain":
		return c.Action + "ed", l.c.Drain(c.Protocol, c.Name, c.Action == "drain")
	case "weight":
		w, err := ParseWeight(c.Value)
		if err != nil {
			return "", err
		}
		return "weight set to " + strconv.Itoa(w), l.c.SetWeight(c.Protocol, c.Name, w)
	}
	return "", fmt.Errorf("backend action %q: %w", c.Action, ErrUnknownAction)
}

// ControlConfig configures the control endpoints.
type ControlConfig struct {
	// Operator applies the changes; nil answers 501.
	Operator Operator
	// Config answers GET /control/config; nil answers 501.
	Config ConfigSource
	// Events receives one event per change made, with who asked; nil for
	// none.
	Events admission.EventSink
	// Logger logs every change and refusal; default the Server's.
	Logger *slog.Logger
	// Routes answers GET /control/routes: the routes by protocol with
	// their hits; nil answers 501.
	Routes func() map[string][]RouteStatus
}

// EventControl is the event kind of an operator's ARM change; backend
// changes are backend.state events (markers on the dashboard's plots).
const EventControl admission.EventKind = "control.change"

// RegisterControl mounts the control endpoints on s. Changes refuse
// cross-site browser requests (a page elsewhere posting to the admin port).
func RegisterControl(s *Server, cfg ControlConfig) {
	cop := http.NewCrossOriginProtection()
	logger := cfg.Logger
	if logger == nil {
		logger = s.logger
	}
	post := func(path, target, action string) {
		s.Handle("POST "+path, cop.Handler(controlHandler(cfg, logger, target, action)))
	}
	for _, a := range []string{"drain", "undrain", "weight", "disable", "enable"} {
		post("/control/backends/{id}/"+a, TargetBackend, a)
	}
	for _, a := range []string{"reset", "pin", "unpin"} {
		post("/control/backends/{id}/mop/"+a, TargetBackend, "mop-"+a)
	}
	post("/control/arm/{id}/set", TargetARM, "set")
	post("/control/arm/{id}/remove", TargetARM, "remove")
	post("/control/arm/add", TargetARM, "add")
	post("/control/routes/{proto}/add", TargetRoute, "add")
	post("/control/routes/{proto}/{id}/remove", TargetRoute, "remove")
	post("/control/pools/{id}/drain", TargetPool, "drain")
	post("/control/pools/{id}/undrain", TargetPool, "undrain")
	s.Handle("GET /control/routes", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if cfg.Routes == nil {
			http.Error(w, "routes are not available on this listener", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(cfg.Routes())
	}))
	s.Handle("GET /control/config", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if cfg.Config == nil {
			http.Error(w, "the running configuration is not available on this listener", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, cfg.Config.RunningConfig())
	}))
}

// controlHandler applies one action; the value comes as the form or query
// value "value" (or "weight", as the dashboard sends it).
func controlHandler(cfg ControlConfig, logger *slog.Logger, target, action string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if cfg.Operator == nil {
			http.Error(w, target+" control is not available on this listener", http.StatusNotImplemented)
			return
		}
		c := Change{Target: target, Action: action, Protocol: r.URL.Query().Get("protocol"),
			Name: r.PathValue("id"), Value: strings.TrimSpace(r.FormValue("value")), By: Caller(r)}
		if c.Value == "" {
			c.Value = strings.TrimSpace(r.FormValue("weight"))
		}
		if target == TargetRoute {
			c.Protocol = r.PathValue("proto")
			if action == "add" {
				c.Name = r.URL.Query().Get("at")
				if c.Value == "" {
					// The spec as the body (text/plain, curl --data-binary).
					body, err := io.ReadAll(io.LimitReader(r.Body, maxRouteBody+1))
					if err != nil || len(body) > maxRouteBody {
						http.Error(w, fmt.Sprintf("route spec: want at most %d bytes", maxRouteBody), http.StatusRequestEntityTooLarge)
						return
					}
					c.Value = strings.TrimSpace(string(body))
				}
			}
		}
		if target == TargetARM && action == "add" {
			c.Name = ""
			if rc, err := admission.ParseRule(c.Value); err == nil {
				c.Name = rc.Name
			}
		}
		done, err := cfg.Operator.Apply(c)
		key := target
		switch key {
		case TargetARM:
			key = "rule"
		case TargetRoute:
			key = "index"
		}
		if err != nil {
			logger.Warn(target+" control refused", "action", action, key, c.Name, "protocol", c.Protocol, "value", c.Value, "remote", c.By, "err", err)
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		logger.Info(target+" changed by operator", "action", action, key, c.Name, "protocol", c.Protocol, "result", done, "remote", c.By)
		if cfg.Events != nil {
			kind := admission.EventBackendState
			if target == TargetARM || target == TargetRoute {
				kind = EventControl
			}
			cfg.Events(admission.Event{Time: time.Now(), Kind: kind, Subject: c.Subject(),
				Message: fmt.Sprintf("%s %s by the operator (%s): %s", c.Subject(), action, c.By, done)})
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "%s: %s\n", c.Subject(), done)
	})
}
