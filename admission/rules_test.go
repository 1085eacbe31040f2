package admission

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func mustRule(t *testing.T, spec string) RuleConfig {
	t.Helper()
	rc, err := ParseRule(spec)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// admitN decides n INVITEs at now and returns how many were admitted.
func admitN(c *Controller, now int64, n int) int {
	got := 0
	for range n {
		if c.Decide(now, &Request{Proto: "sip", Method: "INVITE"}, nil).Verdict == Admit {
			got++
		}
	}
	return got
}

func TestUpdateRuleLimitTakesEffectOnNextDecision(t *testing.T) {
	c := newTestController(t, nil, mustRule(t, "name=invites,proto=sip,method=INVITE,limit=2/min,action=reject"))
	meter := c.Rules()[0]
	if got := admitN(c, 0, 5); got != 2 {
		t.Fatalf("limit 2/min admitted %d of 5", got)
	}
	rc, err := ChangeRule(meter.Config(), "limit=5/min")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := c.UpdateRule(rc, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ch.How != "changed" || ch.Old.Limit != 2 || ch.New.Limit != 5 {
		t.Errorf("change %+v", ch)
	}
	if c.Rules()[0] != meter {
		t.Fatal("a limit change replaced the meter: its counters are lost")
	}
	// The metered rate (2) is kept: three more fit under 5.
	if got := admitN(c, 1, 5); got != 3 {
		t.Errorf("after raising to 5/min: admitted %d more, want 3", got)
	}
	st := meter.Status()
	if st.Limit != 5 || st.Rate != 5 || st.Refused != 5 {
		t.Errorf("status after change %+v: want limit 5, rate 5, refused 5 (counters kept)", st)
	}
	// Lowering holds new work until the rate is under the new limit.
	rc.Limit = 1
	if _, err := c.UpdateRule(rc, 2); err != nil {
		t.Fatal(err)
	}
	if d := c.Decide(2, &Request{Proto: "sip", Method: "INVITE"}, nil); d.Verdict != Refuse || c.RuleName(d) != "invites" {
		t.Errorf("after lowering to 1/min: %+v", d)
	}
}

func TestUpdateRuleActionAndLowLimits(t *testing.T) {
	c := newTestController(t, nil, mustRule(t, "name=r,limit=1/s,action=reject"))
	req := &Request{Proto: "http", Method: "GET"}
	c.Decide(0, req, nil)
	if d := c.Decide(0, req, nil); d.Verdict != Refuse {
		t.Fatalf("reject rule over its limit: %v", d.Verdict)
	}
	rc, err := ChangeRule(c.Rules()[0].Config(), "action=delay,wait=1s,low=1/s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateRule(rc, 0); err != nil {
		t.Fatal(err)
	}
	d := c.Decide(0, req, nil)
	if d.Verdict != Delay {
		t.Fatalf("after action=delay: %v", d.Verdict)
	}
	d.Wait.Cancel()
	if got := c.Rules()[0].Config(); got.Action != ActionDelay || got.MaxWait != time.Second || got.LowLimit != 1 {
		t.Errorf("config in force %+v", got)
	}
}

func TestAddRemoveRule(t *testing.T) {
	c := newTestController(t, nil)
	req := &Request{Proto: "sip", Method: "INVITE"}
	if got := admitN(c, 0, 3); got != 3 {
		t.Fatalf("no rules: admitted %d of 3", got)
	}
	ch, err := c.AddRule(mustRule(t, "name=invites,limit=1/min"), 0)
	if err != nil || ch.How != "added" {
		t.Fatalf("add: %+v %v", ch, err)
	}
	if _, err := c.AddRule(mustRule(t, "name=invites,limit=9/min"), 0); !errors.Is(err, ErrRuleExists) {
		t.Errorf("adding a second rule named invites: %v, want ErrRuleExists", err)
	}
	if d := c.Decide(0, req, nil); d.Verdict != Admit {
		t.Fatalf("first under the added rule: %v", d.Verdict)
	}
	d := c.Decide(0, req, nil)
	if d.Verdict != Delay {
		t.Fatalf("second under the added 1/min delay rule: %v", d.Verdict)
	}
	// Removing the rule admits what it queued.
	ch, err = c.RemoveRule("invites", 1)
	if err != nil || ch.How != "removed" || ch.Old.Limit != 1 {
		t.Fatalf("remove: %+v %v", ch, err)
	}
	select {
	case <-d.Wait.Done():
	default:
		t.Fatal("the removed rule's queued request is still waiting")
	}
	if fin := c.Resume(1, req, d, nil); fin.Verdict != Admit {
		t.Errorf("queued request after its rule was removed: %v", fin.Verdict)
	}
	if got := admitN(c, 1, 3); got != 3 {
		t.Errorf("after removing the rule: admitted %d of 3", got)
	}
	if _, err := c.RemoveRule("invites", 1); !errors.Is(err, ErrNoSuchRule) {
		t.Errorf("removing twice: %v, want ErrNoSuchRule", err)
	}
	if _, err := c.UpdateRule(mustRule(t, "name=nope,limit=1/s"), 1); !errors.Is(err, ErrNoSuchRule) {
		t.Errorf("updating an unknown rule: %v, want ErrNoSuchRule", err)
	}
}

func TestSetRulesKeepsUnchangedMeters(t *testing.T) {
	c := newTestController(t, nil,
		mustRule(t, "name=a,limit=10/min"),
		mustRule(t, "name=b,proto=sip,limit=10/min"),
		mustRule(t, "name=c,limit=10/min"))
	admitN(c, 0, 4)
	before := map[string]*Meter{}
	for _, m := range c.Rules() {
		before[m.Name()] = m
	}
	// a unchanged, b's match changes (new meter), c removed, d added.
	changes, err := c.SetRules([]RuleConfig{
		mustRule(t, "name=d,limit=1/s"),
		mustRule(t, "name=a,limit=10/min"),
		mustRule(t, "name=b,proto=http,limit=10/min"),
	}, 1)
	if err != nil {
		t.Fatal(err)
	}
	how := map[string]string{}
	for _, ch := range changes {
		how[ch.Name] = ch.How
	}
	want := map[string]string{"a": "unchanged", "b": "replaced", "c": "removed", "d": "added"}
	for k, v := range want {
		if how[k] != v {
			t.Errorf("rule %s: %q, want %q (all: %v)", k, how[k], v, how)
		}
	}
	rules := c.Rules()
	if len(rules) != 3 || rules[0].Name() != "d" || rules[1] != before["a"] || rules[2] == before["b"] {
		t.Fatalf("rules in force %v", names(rules))
	}
	if st := rules[1].Status(); st.Rate != 4 || st.Admitted != 4 {
		t.Errorf("unchanged rule lost its counters: %+v", st)
	}
	// An invalid set changes nothing.
	if _, err := c.SetRules([]RuleConfig{mustRule(t, "name=x,limit=1/s"), mustRule(t, "name=x,limit=2/s")}, 2); err == nil || !strings.Contains(err.Error(), "duplicate") {
		t.Errorf("duplicate names: %v", err)
	}
	bad := mustRule(t, "name=y,limit=1/s")
	bad.Unit = 3 * time.Second
	if _, err := c.SetRules([]RuleConfig{bad}, 2); err == nil {
		t.Error("a bad unit was accepted")
	}
	if got := names(c.Rules()); got != "d,a,b" {
		t.Errorf("a refused set changed the rules to %s", got)
	}
}

func names(rules []*Meter) string {
	var s []string
	for _, m := range rules {
		s = append(s, m.Name())
	}
	return strings.Join(s, ",")
}

func TestFormatRuleRoundTrip(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"name=a,limit=10/s", "name=a,limit=10/s"},
		{"limit=100/minute,name=invites,proto=SIP,method=invite,action=reject",
			"name=invites,proto=sip,method=INVITE,limit=100/min,action=reject"},
		{"name=api,proto=http,host=example.com,path=/api/,limit=5/h,action=log,queue=50,wait=2s,qualify=10s,low=3/h,lower=1/min",
			"name=api,proto=http,host=example.com,path=/api/,limit=5/h,action=log,queue=50,wait=2s,qualify=10s,low=3/h,lower=1/min"},
		{"name=q,limit=1/s,queue=1000,proto=any", "name=q,limit=1/s"},
		{"pool=london,limit=300/s,method=INVITE,name=ldn,proto=sip,action=reject",
			"name=ldn,proto=sip,method=INVITE,pool=london,limit=300/s,action=reject"},
		{"name=api,proto=http,method=POST,host=api.example.com,path=/v1/,pool=api,limit=5/min,wait=1s",
			"name=api,proto=http,method=POST,host=api.example.com,path=/v1/,pool=api,limit=5/min,wait=1s"},
		{"name=p,pool=,limit=1/s", "name=p,limit=1/s"},
	} {
		rc := mustRule(t, tc.in)
		got := FormatRule(rc)
		if got != tc.want {
			t.Errorf("FormatRule(%q) = %q, want %q", tc.in, got, tc.want)
		}
		back := mustRule(t, got)
		if rc.Queue == 1000 { // the default is left out, and 0 means it
			rc.Queue = 0
		}
		if back != rc {
			t.Errorf("%q does not parse back: %+v, want %+v", got, back, rc)
		}
	}
}

func TestChangeRule(t *testing.T) {
	rc := mustRule(t, "name=invites,proto=sip,limit=100/s,action=delay")
	for _, tc := range []struct{ changes, want, err string }{
		{"limit=500/s", "name=invites,proto=sip,limit=500/s", ""},
		{"action=reject", "name=invites,proto=sip,limit=100/s,action=reject", ""},
		{"limit=10/min, action=log", "name=invites,proto=sip,limit=10/min,action=log", ""},
		{"", "", "no change"},
		{"name=other", "", "name cannot change"},
		{"limit=fast", "", "limit"},
		{"action=drop", "", "unknown action"},
		{"colour=red", "", "unknown key"},
		{"pool=london", "name=invites,proto=sip,pool=london,limit=100/s", ""},
		{"pool=London", "", `pool: "London": want a pool name`},
	} {
		got, err := ChangeRule(rc, tc.changes)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ChangeRule(%q): %v, want an error with %q", tc.changes, err, tc.err)
			}
			continue
		}
		if err != nil || FormatRule(got) != tc.want {
			t.Errorf("ChangeRule(%q) = %q, %v; want %q", tc.changes, FormatRule(got), err, tc.want)
		}
	}
}

// TestRuleChangesUnderLoad changes, adds and removes rules while decisions
// run, for the race detector; each loop is bounded.
func TestRuleChangesUnderLoad(t *testing.T) {
	c := newTestController(t, nil, mustRule(t, "name=a,limit=1000/s,action=reject"))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &Request{Proto: "http", Method: "GET"}
			for i := 0; i < 20000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := c.Decide(int64(i)*1000+int64(g), req, nil)
				if d.Verdict == Delay {
					d.Wait.Cancel()
				}
				_ = c.RuleName(d)
			}
		}()
	}
	for i := range 200 {
		rc := mustRule(t, "name=a,limit=1000/s,action=reject")
		rc.Limit = int64(10 + i)
		if _, err := c.UpdateRule(rc, int64(i)); err != nil {
			t.Error(err)
		}
		c.AddRule(mustRule(t, "name=b,limit=5/s"), int64(i))
		c.Advance(int64(i) * 1000)
		c.RemoveRule("b", int64(i))
		_ = c.Rules()[0].Status()
	}
	close(stop)
	wg.Wait()
	if got := c.Rules()[0].Config().Limit; got != 209 {
		t.Errorf("limit after the last change %d, want 209", got)
	}
}

func TestParseRuleFile(t *testing.T) {
	good := "# rules\n\nname=invites,proto=sip,method=INVITE,limit=100/s\n  name=api,limit=10/min,action=reject  \n"
	rules, err := ParseRuleFile("arm.rules", []byte(good))
	if err != nil || len(rules) != 2 || rules[0].Name != "invites" || rules[1].Action != ActionReject {
		t.Fatalf("ParseRuleFile: %+v %v", rules, err)
	}
	for _, tc := range []struct{ in, err string }{
		{"name=a,limit=1/s\nname=b,limit=lots\n", "arm.rules:2:"},
		{"name=a,limit=1/s\n#\nname=a,limit=2/s\n", "arm.rules:3: rule name \"a\" already used on line 1"},
		{"limit=1/s\n", "arm.rules:1:"},
	} {
		if _, err := ParseRuleFile("arm.rules", []byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("ParseRuleFile(%q) = %v, want %q", tc.in, err, tc.err)
		}
	}
	pooled := "name=ldn,proto=sip,method=INVITE,pool=london,limit=300/s\nname=api,pool=api,limit=10/s\n"
	if rules, err := ParseRuleFile("arm.rules", []byte(pooled)); err != nil || len(rules) != 2 ||
		rules[0].Match.Pool != "london" || rules[1].Match.Pool != "api" {
		t.Errorf("ParseRuleFile with pools: %+v %v", rules, err)
	}
	if _, err := ParseRuleFile("arm.rules", []byte("name=a,limit=1/s\nname=b,pool=Paris,limit=1/s\n")); err == nil ||
		!strings.Contains(err.Error(), `-arm-file arm.rules:2: -arm "name=b,pool=Paris,limit=1/s": pool: "Paris": want a pool name`) {
		t.Errorf("ParseRuleFile with a bad pool: %v", err)
	}
	if rules, err := ParseRuleFile("empty", nil); err != nil || len(rules) != 0 {
		t.Errorf("empty file: %v %v", rules, err)
	}
}
