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
