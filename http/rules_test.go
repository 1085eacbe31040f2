package http

import (
	"strings"
	"testing"

	"github.com/sluicelb/sluice/admission"
)

// TestRuleChangesReachRequests: the ARM rules change at run time; a path
// rule added after the front end started matches the next request's path,
// and refusals name the rule in force, on both engines.
func TestRuleChangesReachRequests(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 1, arm: []string{"name=hosts,host=example.invalid,limit=1/min,action=reject"}})
		add := func(spec string) {
			t.Helper()
			rc, err := admission.ParseRule(spec)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.ctrl.AddRule(rc, r.clock.Now()); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 {
			if rep := r.get("/api/x", ""); rep.status != 200 {
				t.Fatalf("before any path rule: %d", rep.status)
			}
		}
		add("name=api,path=/api/,limit=1/min,action=reject")
		if rep := r.get("/api/x", ""); rep.status != 200 {
			t.Fatalf("first request under the new rule: %d", rep.status)
		}
		rep := r.get("/api/y", "")
		if rep.status != 429 || !strings.Contains(rep.header.Get("Proxy-Status"), `"arm rule api"`) {
			t.Errorf("second request under the new path rule: %d %q, want 429 naming arm rule api", rep.status, rep.header.Get("Proxy-Status"))
		}
		if rep := r.get("/other", ""); rep.status != 200 {
			t.Errorf("a path the rule does not match: %d", rep.status)
		}
		// The first rule goes: api is now rule 0, and a new rule 1 matches
		// another path; refusals name each by its new index.
		if _, err := r.ctrl.RemoveRule("hosts", r.clock.Now()); err != nil {
			t.Fatal(err)
		}
		add("name=docs,path=/docs/,limit=1/min,action=reject")
		r.get("/docs/a", "")
		for path, rule := range map[string]string{"/api/z": "api", "/docs/b": "docs"} {
			rep := r.get(path, "")
			if rep.status != 429 || !strings.Contains(rep.header.Get("Proxy-Status"), `"arm rule `+rule+`"`) {
				t.Errorf("%s: %d %q, want 429 naming arm rule %s", path, rep.status, rep.header.Get("Proxy-Status"), rule)
			}
		}
	})
}
