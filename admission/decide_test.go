package admission

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func newTestController(t *testing.T, mem *Memory, rules ...RuleConfig) *Controller {
	t.Helper()
	c, err := NewController(ControllerConfig{Rules: rules, MOPRejectCode: 503}, mem, 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDecideAffinityAlwaysAdmitted(t *testing.T) {
	r := &fakeReader{used: 99, limit: 100}
	mem, _ := NewMemory(MemoryConfig{}, r, nil)
	mem.Sample() // Critical
	c := newTestController(t, mem, RuleConfig{Name: "zero", Limit: 0, Unit: time.Second, Action: ActionReject})
	mop, _ := NewMOP(MOPConfig{Name: "b", InitialRate: 1})
	for i := 0; i < 100; i++ {
		d := c.Decide(int64(i), &Request{Class: Affinity, Proto: "sip", Method: "BYE"}, mop)
		if d.Verdict != Admit {
			t.Fatalf("affinity request %d: %v (%v)", i, d.Verdict, d.Reason)
		}
	}
	if st := c.Rules()[0].Status(); st.Rate != 0 {
		t.Errorf("affinity counted against ARM: rate %d", st.Rate)
	}
	if st := mop.Status(); st.Admitted != 0 {
		t.Errorf("affinity counted against MOP: %d", st.Admitted)
	}
	if d := c.Decide(0, &Request{Proto: "sip", Method: "INVITE"}, nil); d.Verdict != Refuse || d.Reason != ReasonMemory || d.HTTPStatus != 429 {
		t.Errorf("new work in Critical: %+v", d)
	}
}

func TestDecidePipeline(t *testing.T) {
	c := newTestController(t, nil,
		RuleConfig{Name: "invites", Match: Match{Proto: "sip", Method: "INVITE"}, Limit: 2, Unit: time.Minute, Action: ActionReject},
		RuleConfig{Name: "api", Match: Match{Proto: "http", PathPrefix: "/api/"}, Limit: 1, Unit: time.Minute})
	invite := &Request{Proto: "sip", Method: "invite"}
	for i := 0; i < 2; i++ {
		if d := c.Decide(int64(i), invite, nil); d.Verdict != Admit {
			t.Fatalf("invite %d: %v", i, d.Verdict)
		}
	}
	d := c.Decide(2, invite, nil)
	if d.Verdict != Refuse || d.Reason != ReasonARM || c.RuleName(d) != "invites" || d.HTTPStatus != 429 || d.RetryAfter <= 0 {
		t.Fatalf("third invite: %+v rule %q", d, c.RuleName(d))
	}
	// Other traffic is not counted by the INVITE rule.
	if d := c.Decide(3, &Request{Proto: "sip", Method: "OPTIONS"}, nil); d.Verdict != Admit {
		t.Errorf("options: %v", d.Verdict)
	}
	// Delay, then resume through MOP.
	api := &Request{Proto: "http", Method: "GET", Path: "/api/x"}
	c.Decide(4, api, nil)
	d = c.Decide(5, api, nil)
	if d.Verdict != Delay || d.Wait == nil || c.RuleName(d) != "api" {
		t.Fatalf("second api: %+v", d)
	}
	mop, _ := NewMOP(MOPConfig{Name: "b", InitialRate: 1, Burst: time.Nanosecond})
	mop.Allow(int64(time.Minute)) // uses the backend's only slot
	c.Advance(int64(time.Minute))
	<-d.Wait.Done()
	final := c.Resume(int64(time.Minute), api, d, mop)
	if final.Verdict != Refuse || final.Reason != ReasonMOP || final.HTTPStatus != 503 || final.RetryAfter <= 0 {
		t.Errorf("resumed into a full MOP: %+v", final)
	}
}

func TestDecideWaitCanceled(t *testing.T) {
	c := newTestController(t, nil, RuleConfig{Name: "one", Limit: 1, Unit: time.Minute})
	r := &Request{Proto: "http"}
	c.Decide(0, r, nil)
	d := c.Decide(1, r, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var clock ManualClock
	if got := c.Wait(ctx, &clock, r, d, nil); got.Verdict != Refuse || got.Reason != ReasonARM {
		t.Errorf("canceled wait: %+v", got)
	}
	if q := c.Rules()[0].Status().Queued; q != 0 {
		t.Errorf("canceled request still queued: %d", q)
	}
}

func TestControllerConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  ControllerConfig
		want string
	}{
		{ControllerConfig{MOPRejectCode: 200}, "ControllerConfig.MOPRejectCode"},
		{ControllerConfig{Rules: []RuleConfig{{Name: "a", Limit: 1, Unit: time.Second}, {Name: "a", Limit: 1, Unit: time.Second}}}, "duplicate"},
		{ControllerConfig{Rules: []RuleConfig{{Name: "a", Limit: 1, Unit: time.Millisecond}}}, "unit"},
	} {
		if _, err := NewController(tc.cfg, nil, 0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err %v, want one containing %q", err, tc.want)
		}
	}
}

func TestDecideAdmitAllocs(t *testing.T) {
	c := newTestController(t, nil, RuleConfig{Name: "big", Match: Match{Proto: "http"}, Limit: 1 << 30, Unit: time.Hour})
	mop, _ := NewMOP(MOPConfig{Name: "b", InitialRate: 1e9})
	r := &Request{Proto: "http", Method: "GET", Path: "/"}
	now := int64(0)
	if n := testing.AllocsPerRun(1000, func() { now += 1000; c.Decide(now, r, mop) }); n != 0 {
		t.Errorf("Decide allocates %v per admitted request, want 0", n)
	}
}

// TestImportsStdlibOnly keeps admission/ free of any other package.
func TestImportsStdlibOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/sluicelb/sluice/admission" {
			t.Errorf("admission depends on %s; it may import the standard library only", p)
		}
	}
}

func TestControllerCounts(t *testing.T) {
	c := newTestController(t, nil, RuleConfig{Name: "one", Match: Match{Proto: "sip"}, Limit: 1, Unit: time.Minute, Action: ActionReject})
	c.Decide(0, &Request{Proto: "sip"}, nil)                  // admitted new
	c.Decide(1, &Request{Proto: "sip"}, nil)                  // refused arm
	c.Decide(2, &Request{Proto: "sip", Class: Affinity}, nil) // admitted affinity
	c.Decide(3, &Request{Proto: "http"}, nil)                 // admitted new
	c.RefuseMOPFor(&Request{Proto: "http"}, time.Second)      // refused mop
	got := c.Counts()
	if got.Admitted[protoSIP][NewWork] != 1 || got.Admitted[protoSIP][Affinity] != 1 || got.Admitted[protoHTTP][NewWork] != 1 {
		t.Errorf("admitted: %+v", got.Admitted)
	}
	if got.Refused[protoSIP][ReasonARM] != 1 || got.Refused[protoHTTP][ReasonMOP] != 1 {
		t.Errorf("refused: %+v", got.Refused)
	}
	if ProtoNames[protoSIP] != "sip" || ClassNames[Affinity] != "affinity" || ReasonNames[ReasonMOP] != "mop" {
		t.Error("label tables out of order")
	}
}

func TestDecideDraining(t *testing.T) {
	c := newTestController(t, nil)
	c.SetDraining(true)
	d := c.Decide(0, &Request{Proto: "http"}, nil)
	if d.Verdict != Refuse || d.Reason != ReasonDraining || d.HTTPStatus != 503 || d.RetryAfter <= 0 {
		t.Errorf("new work while draining: %+v", d)
	}
	if d := c.Decide(0, &Request{Proto: "http", Class: Affinity}, nil); d.Verdict != Admit {
		t.Errorf("affinity while draining: %+v", d)
	}
	c.SetDraining(false)
	if d := c.Decide(0, &Request{Proto: "http"}, nil); d.Verdict != Admit {
		t.Errorf("new work after draining ended: %+v", d)
	}
}

// TestDecidePoolBudgets: two rules with pool=a and pool=b at 10/s each
// admit 10 of 20 requests to each pool, independently, in every second;
// a rule without pool= counts the requests of both pools (and of a front
// end without pools), and a limited one is shared by them.
func TestDecidePoolBudgets(t *testing.T) {
	c := newTestController(t, nil,
		mustRule(t, "name=all,limit=1000/s"),
		mustRule(t, "name=a,pool=a,limit=10/s,action=reject"),
		mustRule(t, "name=b,pool=b,limit=10/s,action=reject"))
	reqA := &Request{Proto: "http", Method: "GET", Path: "/", Pool: "a"}
	reqB := &Request{Proto: "sip", Method: "INVITE", Pool: "b"}
	reqNone := &Request{Proto: "http", Method: "GET", Path: "/"}
	var clock ManualClock
	for second := range 3 {
		start := clock.Now()
		admitted := map[string]int{}
		// Interleaved, so that one pool's refusals come while the other
		// still has room.
		for i := range 20 {
			for _, r := range []*Request{reqA, reqB, reqNone} {
				d := c.Decide(clock.Now(), r, nil)
				switch {
				case d.Verdict == Admit:
					admitted[r.Pool]++
				case d.Verdict != Refuse || d.Reason != ReasonARM || d.RuleName() != r.Pool || d.Pool != r.Pool:
					t.Fatalf("second %d, request %d to pool %q: %+v (rule %q), want refused by rule %q", second, i, r.Pool, d, d.RuleName(), r.Pool)
				}
			}
			clock.Advance(10 * time.Millisecond) // 20 rounds in 200ms: one window
		}
		if admitted["a"] != 10 || admitted["b"] != 10 || admitted[""] != 20 {
			t.Errorf("second %d: admitted %v, want a:10 b:10 and all 20 without a pool", second, admitted)
		}
		for _, i := range []int{1, 2} {
			if st := c.Rules()[i].Status(); st.Rate != 10 || st.Refused != uint64(10*(second+1)) {
				t.Errorf("second %d: rule %s rate %d refused %d, want 10 and %d", second, st.Name, st.Rate, st.Refused, 10*(second+1))
			}
		}
		clock.Set(start + int64(time.Second)) // the next window
		c.Advance(clock.Now())
		// "all" comes first, so it counts every request, of both pools
		// and of none. Its count is exact once the window has rotated
		// (Rate may include reservations of the fast path).
		if st := c.Rules()[0].Status(); st.Admitted != uint64(60*(second+1)) {
			t.Errorf("second %d: rule without pool= counted %d, want %d (both pools and none)", second, st.Admitted, 60*(second+1))
		}
	}

	// A limited rule without pool= is one budget for both pools.
	shared := newTestController(t, nil, mustRule(t, "name=both,limit=15/s,action=reject"))
	admitted := map[string]int{}
	for range 20 {
		for _, r := range []*Request{reqA, reqB} {
			d := shared.Decide(0, r, nil)
			if d.Verdict == Admit {
				admitted[r.Pool]++
				continue
			}
			if d.Pool != r.Pool || d.Detail() != "arm rule both pool "+r.Pool {
				t.Errorf("refusal of a request to pool %s: %+v detail %q", r.Pool, d, d.Detail())
			}
		}
	}
	if admitted["a"]+admitted["b"] != 15 || admitted["a"] < 7 || admitted["b"] < 7 {
		t.Errorf("shared rule admitted %v, want 15 in all, split about evenly", admitted)
	}
}

// TestDecisionDetail: what a delay or refusal carries for the answer and
// events to name: the reason, the rule and the request's pool.
func TestDecisionDetail(t *testing.T) {
	c := newTestController(t, nil,
		mustRule(t, "name=api-burst,pool=api,limit=1/min,action=reject"),
		mustRule(t, "name=invites,proto=sip,limit=1/min,action=reject"),
		mustRule(t, "name=slow,pool=slow,limit=1/min,action=delay,queue=1"))
	api := &Request{Proto: "http", Pool: "api"}
	invite := &Request{Proto: "sip", Method: "INVITE", Pool: "london"}
	bare := &Request{Proto: "sip", Method: "INVITE"}
	slow := &Request{Proto: "http", Pool: "slow"}
	c.Decide(0, api, nil)
	c.Decide(0, invite, nil)
	c.Decide(0, slow, nil)
	mop, _ := NewMOP(MOPConfig{Name: "b", InitialRate: 1, Burst: time.Nanosecond})
	mop.Allow(0)

	delayed := c.Decide(1, slow, nil)
	for _, tc := range []struct {
		name   string
		d      Decision
		pool   string
		rule   string
		detail string
	}{
		{"arm rule with a pool", c.Decide(1, api, nil), "api", "api-burst", "arm rule api-burst pool api"},
		{"arm rule without a pool, pooled request", c.Decide(1, invite, nil), "london", "invites", "arm rule invites pool london"},
		{"arm rule, front end without pools", c.Decide(1, bare, nil), "", "invites", "arm rule invites"},
		{"delayed", delayed, "slow", "slow", "arm rule slow pool slow"},
		{"queue full", c.Decide(1, slow, nil), "slow", "slow", "arm rule slow pool slow"},
		{"mop", c.Decide(1, &Request{Proto: "http", Pool: "static"}, mop), "static", "", "mop pool static"},
		{"mop for", c.RefuseMOPFor(&Request{Proto: "sip", Pool: "paris"}, time.Second), "paris", "", "mop pool paris"},
		{"admitted", c.Decide(1, &Request{Proto: "http", Pool: "web"}, nil), "", "", ""},
		{"made by a front end, no reason", Decision{Verdict: Refuse, Rule: -1, Pool: "web"}, "web", "", "pool web"},
		{"made by a front end, nothing", Decision{Verdict: Refuse, Rule: -1}, "", "", ""},
	} {
		if tc.d.Pool != tc.pool || tc.d.RuleName() != tc.rule || c.RuleName(tc.d) != tc.rule || tc.d.Detail() != tc.detail {
			t.Errorf("%s: pool %q rule %q/%q detail %q, want %q %q %q", tc.name, tc.d.Pool, tc.d.RuleName(), c.RuleName(tc.d), tc.d.Detail(), tc.pool, tc.rule, tc.detail)
		}
		var buf [64]byte
		if got := string(tc.d.AppendDetail(buf[:0])); got != tc.detail {
			t.Errorf("%s: AppendDetail %q, want %q", tc.name, got, tc.detail)
		}
	}
	// A refusal, and its words in a buffer on the stack, allocate nothing.
	var buf [64]byte
	if n := testing.AllocsPerRun(100, func() {
		d := c.Decide(1, api, nil)
		_ = d.AppendDetail(buf[:0])
	}); n != 0 {
		t.Errorf("a refusal and its AppendDetail allocate %v, want 0", n)
	}

	// The delayed request's wait runs out: the refusal still names both.
	delayed.Wait.Cancel()
	if d := c.Resume(2, slow, delayed, nil); d.Verdict != Refuse || d.Pool != "slow" || d.Detail() != "arm rule slow pool slow" {
		t.Errorf("delayed then refused: %+v detail %q", d, d.Detail())
	}

	c.SetDraining(true)
	if d := c.Decide(2, api, nil); d.Detail() != "draining pool api" {
		t.Errorf("draining: %q", d.Detail())
	}
	c.SetDraining(false)
	r := &fakeReader{used: 99, limit: 100}
	mem, _ := NewMemory(MemoryConfig{}, r, nil)
	mem.Sample() // Critical
	if d := newTestController(t, mem).Decide(2, api, nil); d.Detail() != "memory pool api" {
		t.Errorf("memory: %q", d.Detail())
	}
}

// TestDecisionRuleAfterRuleChange: a refusal names the rule that refused
// it even when the rule set changed before the answer was written (the
// index Rule then points at another rule, or at none).
func TestDecisionRuleAfterRuleChange(t *testing.T) {
	c := newTestController(t, nil,
		mustRule(t, "name=first,pool=x,limit=1/min,action=reject"),
		mustRule(t, "name=second,pool=y,limit=1/min,action=reject"))
	r := &Request{Proto: "http", Pool: "y"}
	c.Decide(0, r, nil)
	d := c.Decide(1, r, nil)
	if d.Verdict != Refuse || d.Rule != 1 {
		t.Fatalf("second request: %+v", d)
	}
	if _, err := c.RemoveRule("first", 2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddRule(mustRule(t, "name=third,limit=1/s"), 2); err != nil {
		t.Fatal(err)
	}
	if got := c.RuleName(d); got != "second" {
		t.Errorf("after the rule set changed the refusal names %q, want second", got)
	}
	if got := d.Detail(); got != "arm rule second pool y" {
		t.Errorf("detail %q", got)
	}
}

// TestARMEventsNamePool: a rule's events name its pool.
func TestARMEventsNamePool(t *testing.T) {
	var events []Event
	c, err := NewController(ControllerConfig{
		Rules:  []RuleConfig{mustRule(t, "name=ldn,pool=london,limit=1/min,action=reject")},
		Events: func(e Event) { events = append(events, e) },
	}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := &Request{Proto: "sip", Method: "INVITE", Pool: "london"}
	c.Decide(0, r, nil)
	c.Decide(1, r, nil)
	c.Advance(int64(3 * time.Minute)) // under the limit from here
	c.Advance(int64(4 * time.Minute)) // for a whole unit: released
	want := []string{
		"arm rule ldn pool london reached its limit 1/min (reject)",
		"arm rule ldn pool london is refusing requests: over the limit",
		"arm rule ldn pool london is under its limit again (rate 0 of 1)",
	}
	var got []string
	for _, e := range events {
		got = append(got, e.Message)
		if e.Subject != "ldn" {
			t.Errorf("event subject %q, want the rule's name", e.Subject)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
