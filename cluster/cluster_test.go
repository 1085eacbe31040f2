package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicelb/sluice/admission"
)

// gauge reads one sample of family name from c through a registry.
func gauge(t *testing.T, c *Cluster, name string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			m := f.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestParseFailPolicy(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    FailPolicy
		wantErr bool
	}{
		{"local", FailLocal, false},
		{"OPEN", FailOpen, false},
		{"closed", FailClosed, false},
		{"shut", 0, true},
	} {
		got, err := ParseFailPolicy(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("ParseFailPolicy(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
		if err == nil && got.String() != strings.ToLower(tc.in) {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
}

func TestNewClientURLs(t *testing.T) {
	for _, tc := range []struct {
		url, kind, err string
	}{
		{"redis://127.0.0.1:6379/2", "*redis.Client", ""},
		{"rediss://user:secret@127.0.0.1:6380/0", "*redis.Client", ""},
		{"redis://127.0.0.1:26379?master_name=main&addr=127.0.0.1:26380", "*redis.Client", ""}, // a failover client is a *redis.Client
		{"redis+cluster://127.0.0.1:7000?addr=127.0.0.1:7001", "*redis.ClusterClient", ""},
		{"http://127.0.0.1:6379", "", "scheme must be redis"},
		{"redis://user:secret@127.0.0.1:6379/notanumber", "", "invalid"},
	} {
		c, err := NewClient(tc.url, 50*time.Millisecond)
		if tc.err != "" {
			if err == nil || !errors.Is(err, ErrConfig) {
				t.Errorf("NewClient(%q): error %v, want one wrapping ErrConfig", tc.url, err)
			} else if strings.Contains(err.Error(), "secret") {
				t.Errorf("NewClient(%q): error %q shows the password", tc.url, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("NewClient(%q): %v", tc.url, err)
			continue
		}
		if got := typeName(c); got != tc.kind {
			t.Errorf("NewClient(%q) is %s, want %s", tc.url, got, tc.kind)
		}
		c.Close()
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		err  string
	}{
		{"braces", Config{Name: "a{b}"}, "braces"},
		{"wait", Config{Wait: 50 * time.Millisecond}, "Wait"},
		{"policy", Config{Fail: 9}, "fail policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.fill()
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, ErrConfig) {
				t.Errorf("fill: %v, want an ErrConfig naming %s", err, tc.err)
			}
		})
	}
	c := Config{}
	if err := c.fill(); err != nil || c.Name != "sluice" || c.Wait != 2*time.Millisecond || c.Node == "" {
		t.Errorf("defaults: %+v, %v", c, err)
	}
}

// TestFailPolicySwitch: Redis going away switches every rule to the fail
// policy (after two failed round trips), with one event; Redis coming back
// switches them back to shared, with one event, and /status says so.
func TestFailPolicySwitch(t *testing.T) {
	for _, tc := range []struct {
		policy  FailPolicy
		mode    string
		divisor int64
	}{
		{FailLocal, "local", 3},
		{FailOpen, "open", 1},
		{FailClosed, "closed", 1},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			mr, rdb := newMini(t)
			var mu sync.Mutex
			var events []admission.Event
			sink := func(e admission.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
			c, err := New(Config{Redis: "x", Name: "t", Node: "a", Fail: tc.policy, Timeout: 50 * time.Millisecond}, rdb, &admission.ManualClock{}, sink, nil)
			if err != nil {
				t.Fatal(err)
			}
			m, _ := admission.NewMeter(admission.RuleConfig{Name: "r", Limit: 30, Unit: time.Second, Action: admission.ActionReject}, 0, nil)
			c.AttachRules([]*admission.Meter{m})
			ctx := context.Background()
			for _, n := range []string{"b", "c"} { // two more members, alive for the longest heartbeat
				if err := heartbeatScript.Run(ctx, rdb, []string{"{sluice:t}:nodes"}, n, maxLockMS, "0", maxLockMS).Err(); err != nil {
					t.Fatal(err)
				}
			}
			c.heartbeat(ctx, false)
			if st := c.Status(); st.Redis != "up" || st.Nodes != 3 || st.Rules[0].Mode != "shared" {
				t.Fatalf("after the first heartbeat: %+v", st)
			}
			mr.Close()
			c.heartbeat(ctx, false)
			if !c.Up() {
				t.Error("one failed round trip switched to the fail policy; want two")
			}
			c.heartbeat(ctx, false)
			if got := gauge(t, c, "sluice_cluster_up"); got != 0 {
				t.Errorf("sluice_cluster_up = %v while Redis is away, want 0", got)
			}
			st := c.Status()
			if st.Redis != "down" || st.Rules[0].Mode != tc.mode || st.LastError == "" || st.Downs != 1 {
				t.Errorf("Redis closed: %+v, want down in mode %s", st, tc.mode)
			}
			admitted := 0
			for range 40 {
				if m.Admit(1, admission.Normal).Verdict == admission.Admit {
					admitted++
				}
			}
			want := map[FailPolicy]int{FailLocal: 10, FailOpen: 30, FailClosed: 0}[tc.policy]
			if admitted != want {
				t.Errorf("admitted %d of 40 while Redis was away, want %d", admitted, want)
			}
			if err := mr.Restart(); err != nil {
				t.Fatal(err)
			}
			c.heartbeat(ctx, false)
			if st := c.Status(); st.Redis != "up" || st.Rules[0].Mode != "shared" {
				t.Errorf("Redis back: %+v", st)
			}
			mu.Lock()
			defer mu.Unlock()
			var kinds []string
			for _, e := range events {
				kinds = append(kinds, string(e.Kind))
			}
			if strings.Join(kinds, " ") != "cluster.up cluster.down cluster.up" {
				t.Errorf("events %v, want up, down, up", kinds)
			}
			if len(events) > 1 && !strings.Contains(events[1].Message, tc.policy.String()) {
				t.Errorf("down event %q does not name the policy", events[1].Message)
			}
		})
	}
}

// TestRejoinSeedsLocalWindow: after Redis comes back (perhaps empty), the
// first lease counts what the node admitted meanwhile, once.
func TestRejoinSeedsLocalWindow(t *testing.T) {
	_, rdb := newMini(t)
	clock := &admission.ManualClock{}
	c, _ := New(Config{Redis: "x", Name: "t", Node: "a"}, rdb, clock, nil, nil)
	m, _ := admission.NewMeter(admission.RuleConfig{Name: "r", Limit: 30, Unit: time.Second, Action: admission.ActionReject}, 0, nil)
	c.AttachRules([]*admission.Meter{m})
	for range 7 { // unknown state: the fail policy (local, one node) applies
		m.Admit(1, admission.Normal)
	}
	ctx := context.Background()
	c.heartbeat(ctx, false)
	r := c.rules[0]
	r.lease(ctx, clock.Now(), 5)
	vals, err := rdb.HGetAll(ctx, r.key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum int
	for _, v := range vals {
		n, _ := strconv.Atoi(v)
		sum += n
	}
	if sum != 12 || r.l.Tokens() != 5 {
		t.Errorf("Redis counts %v (sum %d) and %d tokens, want 7 seeded + 5 granted", vals, sum, r.l.Tokens())
	}
	r.lease(ctx, clock.Now(), 1)
	if r.seed.Load() {
		t.Error("seed still pending after a successful lease")
	}
}

func typeName(v any) string { return fmt.Sprintf("%T", v) }

// TestSyncRulesFollowsRuleChanges: a rule added at run time gets a leased
// budget, a removed one stops leasing, and a rule that stays keeps its
// lease.
func TestSyncRulesFollowsRuleChanges(t *testing.T) {
	_, rdb := newMini(t)
	clock := &admission.ManualClock{}
	c, err := New(Config{Redis: "x", Name: "t", Node: "a"}, rdb, clock, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	meter := func(name string) *admission.Meter {
		rc, err := admission.ParseRule("name=" + name + ",limit=10/s")
		if err != nil {
			t.Fatal(err)
		}
		m, err := admission.NewMeter(rc, clock.Now(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, b := meter("a"), meter("b")
	c.AttachRules([]*admission.Meter{a})
	leaseA := a.Lease()
	if leaseA == nil {
		t.Fatal("attached rule has no lease")
	}
	c.SyncRules([]*admission.Meter{a, b})
	if a.Lease() != leaseA || b.Lease() == nil || len(c.rules) != 2 {
		t.Fatalf("after adding b: a keeps its lease %v, b has one %v, %d leasers; want true, true, 2", a.Lease() == leaseA, b.Lease() != nil, len(c.rules))
	}
	c.SyncRules([]*admission.Meter{b})
	if len(c.rules) != 1 || c.rules[0].m.(armBudget).m != b {
		t.Fatalf("after removing a: %d leasers, want only b's", len(c.rules))
	}
}
