package cluster

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicelb/sluice/admission"
	"github.com/sluicelb/sluice/lb"
)

// redisServers runs f against miniredis (its TIME fixed at base) and
// against a real redis-server started on a loopback ephemeral port and
// stopped by PID (skipped where none is installed): Lua differs between
// the two (gopher-lua and Redis's Lua 5.1, e.g. tonumber("nan")).
func redisServers(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient, addr string)) {
	t.Run("miniredis", func(t *testing.T) {
		mr, rdb := newMini(t)
		mr.SetTime(base)
		f(t, rdb, mr.Addr())
	})
	t.Run("redis-server", func(t *testing.T) {
		if testing.Short() {
			t.Skip("redis-server")
		}
		port := freePort(t)
		startRedis(t, port)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { rdb.Close() })
		f(t, rdb, addr)
	})
}

// TestLeaseScriptHostileFields is the golden table of forged contents of a
// rule's counters (limit 10, one node, want 100, sub-interval one hour so
// that a real Redis's clock stays in one): each forged field is deleted
// and counted, and the grant is the one an empty window (or the valid
// fields alone) gives. Before the fix a negative or future field lent the
// cluster budget, and a field that is not a number broke every lease.
func TestLeaseScriptHostileFields(t *testing.T) {
	const sub = int64(time.Hour / time.Microsecond)
	type field struct {
		at  int64 // sub-interval offset from the current one (ignored when name is set)
		nm  string
		val string
	}
	cases := []struct {
		name       string
		fields     []field
		g, sum     int64
		bad        int64
		keep, gone []int // indexes into fields
		typed      bool  // the key is a string, not a hash
	}{
		{name: "empty", g: 5, sum: 5},
		{name: "key of another type", typed: true, g: 5, sum: 5, bad: 1},
		{name: "valid past count", fields: []field{{at: -1, val: "4"}}, g: 3, sum: 7, keep: []int{0}},
		{name: "negative current", fields: []field{{at: 0, val: "-1000"}}, g: 5, sum: 5, bad: 1},
		{name: "negative past", fields: []field{{at: -2, val: "-1000"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "future positive", fields: []field{{at: 1, val: "3"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "future negative", fields: []field{{at: 3, val: "-1000000"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "far future", fields: []field{{at: 1 << 40, val: "-5"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "value not a number", fields: []field{{at: -1, val: "abc"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "field not a number", fields: []field{{nm: "abc", val: "3"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "fractional", fields: []field{{at: -1, val: "3.5"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "nan", fields: []field{{at: -1, val: "nan"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "inf", fields: []field{{at: -1, val: "inf"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "minus inf", fields: []field{{at: -1, val: "-inf"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "hexadecimal", fields: []field{{at: -1, val: "0x10"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "exponent", fields: []field{{at: -1, val: "1e300"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "above 2^53", fields: []field{{at: -1, val: "9223372036854775807"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "padded", fields: []field{{at: -1, val: " 3"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "expired", fields: []field{{at: -6, val: "7"}}, g: 5, sum: 5, gone: []int{0}},
		{name: "expired and negative", fields: []field{{at: -6, val: "-7"}}, g: 5, sum: 5, bad: 1, gone: []int{0}},
		{name: "valid and forged", fields: []field{{at: -1, val: "4"}, {at: 2, val: "-100"}, {at: -3, val: "x"}}, g: 3, sum: 7, bad: 2, keep: []int{0}, gone: []int{1, 2}},
	}
	redisServers(t, func(t *testing.T, rdb redis.UniversalClient, _ string) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				key := "{sluice:t:arm:hostile}"
				for try := 0; ; try++ {
					rdb.Del(ctx, key)
					if tc.typed {
						rdb.Set(ctx, key, "x", 0)
					}
					tm, err := rdb.Time(ctx).Result()
					if err != nil {
						t.Fatal(err)
					}
					k := tm.UnixMicro() / sub
					names := make([]string, len(tc.fields))
					for i, f := range tc.fields {
						names[i] = f.nm
						if names[i] == "" {
							names[i] = fmt.Sprint(k + f.at)
						}
						rdb.HSet(ctx, key, names[i], f.val)
					}
					res, err := leaseScript.Run(ctx, rdb, []string{key, key + ":lost"}, 10, 100, sub, 1, 0, 0, 0).Int64Slice()
					if err != nil {
						t.Fatalf("script failed: %v", err)
					}
					if len(res) != 7 {
						t.Fatalf("reply %v, want 7 values", res)
					}
					if res[2] != k && try == 0 {
						continue // the hour turned between TIME and the script
					}
					if res[0] != tc.g || res[1] != tc.sum || res[5] != tc.bad {
						t.Errorf("reply %v, want grant %d, sum %d, %d invalid fields", res, tc.g, tc.sum, tc.bad)
					}
					for _, i := range tc.keep {
						if v, _ := rdb.HGet(ctx, key, names[i]).Result(); v != tc.fields[i].val {
							t.Errorf("valid field %s = %q, want %q kept", names[i], v, tc.fields[i].val)
						}
					}
					for _, i := range tc.gone {
						if ok, _ := rdb.HExists(ctx, key, names[i]).Result(); ok {
							t.Errorf("field %s=%q still there", names[i], tc.fields[i].val)
						}
					}
					// A second lease still works and sees the grant.
					res2, err := leaseScript.Run(ctx, rdb, []string{key, key + ":lost"}, 10, 1, sub, 1, 0, 0, 0).Int64Slice()
					if err != nil || len(res2) != 7 || res2[1] != tc.sum+res2[0] || res2[5] != 0 {
						t.Errorf("next lease: %v, %v; want the window at %d plus its grant, no invalid field", res2, err, tc.sum)
					}
					return
				}
			})
		}
	})
}

// TestLeaseReplyChecked: a reply the script cannot give (from something
// that is not the script, or not a Redis) is refused as a whole.
func TestLeaseReplyChecked(t *testing.T) {
	r := &ruleLease{subUS: 1000}
	for _, tc := range []struct {
		res []int64
		ok  bool
	}{
		{[]int64{3, 3, 7, 500, 5000, 0, 0}, true},
		{[]int64{0, 10, 7, 1000, 0, 2, 4}, true},
		{[]int64{3, 3, 7, 500, 5000}, false},        // old reply without the invalid field count
		{[]int64{6, 6, 7, 500, 5000, 0, 0}, false},  // more than asked
		{[]int64{-1, 0, 7, 500, 5000, 0, 0}, false}, // negative grant
		{[]int64{3, 3, 0, 500, 5000, 0, 0}, false},  // no sub-interval
		{[]int64{3, 3, 7, 0, 5000, 0, 0}, false},    // ends now
		{[]int64{3, 3, 7, 1001, 5000, 0, 0}, false}, // ends after a sub-interval
		{[]int64{3, 3, 7, 500, 6001, 0, 0}, false},  // Retry-After beyond the window
		{[]int64{3, 3, 7, 500, -1, 0, 0}, false},
		{[]int64{3, 3, 7, 500, 5000, -1, 0}, false},
		{[]int64{3, 3, 7, 500, 5000, 0, -1}, false},
	} {
		if err := r.checkReply(tc.res, 5); (err == nil) != tc.ok {
			t.Errorf("checkReply(%v) = %v, want ok %v", tc.res, err, tc.ok)
		}
	}
}

// TestRateLimitConversion: an allowed rate becomes a lease limit in
// [1, maxMOPRate] whatever the float (9.3e18 converted to a negative
// int64 and refused everything).
func TestRateLimitConversion(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		want int64
	}{
		{42.7, 42}, {1, 1}, {0.5, 1}, {0, 1}, {-5, 1}, {math.NaN(), 1}, {math.Inf(-1), 1},
		{1e6, 1e6}, {2e6, 1e6}, {9.3e18, 1e6}, {1e300, 1e6}, {math.Inf(1), 1e6},
	} {
		if got := rateLimit(tc.rate); got != tc.want {
			t.Errorf("rateLimit(%g) = %d, want %d", tc.rate, got, tc.want)
		}
	}
}

// mopPair is two nodes of cluster name sharing backend mopBackend's MOP
// (initial rate 100/s) through the Redis at addr; a takes the learner lock.
func mopPair(t *testing.T, addr, name string, ring ...lb.Key) (a, b *mopShare) {
	t.Helper()
	var s [2]*mopShare
	for i, node := range []string{"a", "b"} {
		rdb, err := NewClient("redis://"+addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rdb.Close() })
		c, err := New(Config{Redis: "x", Name: name, Node: node}, rdb, &admission.ManualClock{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		m, err := admission.NewMOP(admission.MOPConfig{Name: "b", InitialRate: 100, MinRate: 1})
		if err != nil {
			t.Fatal(err)
		}
		if ring != nil {
			if err := c.SetKeyRing(ring); err != nil {
				t.Fatal(err)
			}
		}
		c.AttachMOP(mopBackend, m)
		c.heartbeat(context.Background(), false)
		s[i] = c.mops[0]
	}
	s[0].sync(context.Background())
	s[1].sync(context.Background())
	if !s[0].leader || s[1].leader {
		t.Fatalf("a leader %v, b leader %v; want a learning", s[0].leader, s[1].leader)
	}
	return s[0], s[1]
}

const mopBackend = "10.0.0.1:5060"

// TestMOPHostileRedis is the golden table of forged contents of a
// backend's MOP hash (learner lock, totals, learned state): for each, what
// the follower b (or the learner a) does on its next sync. A forged value
// is never imported, never overwrites the node's own state (so it is
// never persisted), and is counted by kind. Before the fix: a lock in the
// year 5138 stopped all learning, learner_until=abc or a total that is not
// a count broke every sync, a learned rate of 1e15 was imported (598 of
// 600 admitted with the backend at 95 % memory) and 9.3e18 refused
// everything, a 30 MB state was read on every sync.
func TestMOPHostileRedis(t *testing.T) {
	big := `{"phase":1,"learned_rate":42,"allowed_rate":42,"pad":"` + strings.Repeat("x", 100_000) + `"}`
	type forge struct{ field, val string }
	cases := []struct {
		name  string
		forge []forge
		typed bool // replace the hash with a string key
		// What b sees after its sync.
		bLeads    bool
		allowed   float64 // b's allowed rate after the sync
		rejected  string  // the kind counted (on the node named by on)
		on        string
		stateGone bool
	}{
		{name: "lock in the year 5138", forge: []forge{{"learner", "evil"}, {"learner_until", "99999999999999"}}, bLeads: true, allowed: 100, rejected: "mop_lock", on: "b"},
		{name: "lock not a time", forge: []forge{{"learner", "evil"}, {"learner_until", "abc"}}, bLeads: true, allowed: 100, rejected: "mop_lock", on: "b"},
		{name: "lock nan", forge: []forge{{"learner", "evil"}, {"learner_until", "nan"}}, bLeads: true, allowed: 100, rejected: "mop_lock", on: "b"},
		{name: "lock inf", forge: []forge{{"learner", "evil"}, {"learner_until", "inf"}}, bLeads: true, allowed: 100, rejected: "mop_lock", on: "b"},
		{name: "empty holder", forge: []forge{{"learner", ""}}, bLeads: true, allowed: 100, rejected: "mop_lock", on: "b"},
		{name: "holder of 300 bytes", forge: []forge{{"learner", strings.Repeat("e", 300)}}, bLeads: true, allowed: 100, rejected: "mop_lock", on: "b"},
		{name: "admitted not a number", forge: []forge{{"admitted", "abc"}}, allowed: 100, rejected: "mop_count", on: "b"},
		{name: "admitted negative", forge: []forge{{"admitted", "-5"}}, allowed: 100, rejected: "mop_count", on: "b"},
		{name: "refused at the int64 edge", forge: []forge{{"refused", "9223372036854775807"}}, allowed: 100, rejected: "mop_count", on: "b"},
		{name: "admitted jumps by 1e12", forge: []forge{{"admitted", "1000000000000"}}, allowed: 100, rejected: "mop_count", on: "b"},
		{name: "key of another type", typed: true, bLeads: true, allowed: 100, rejected: "mop_count", on: "b"},
		{name: "learned 1e15", forge: []forge{{"state", `{"phase":1,"learned_rate":1e15,"allowed_rate":1e15}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "learned 9.3e18", forge: []forge{{"state", `{"phase":1,"learned_rate":9.3e18,"allowed_rate":9.3e18}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "allowed 1e300, discovery", forge: []forge{{"state", `{"phase":0,"allowed_rate":1e300}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "rate beyond float64", forge: []forge{{"state", `{"phase":1,"learned_rate":1e400,"allowed_rate":1}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "negative rate", forge: []forge{{"state", `{"phase":0,"allowed_rate":-3}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "learned without a rate", forge: []forge{{"state", `{"phase":1,"allowed_rate":50}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "unknown phase", forge: []forge{{"state", `{"phase":7,"learned_rate":50,"allowed_rate":50}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "model of no slope", forge: []forge{{"state", `{"phase":1,"learned_rate":50,"allowed_rate":50,"base":0.1,"slope":1e-300}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "model not finite", forge: []forge{{"state", `{"phase":1,"learned_rate":50,"allowed_rate":50,"base":1e308,"slope":1}`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "not JSON", forge: []forge{{"state", `learned=1e15`}}, allowed: 100, rejected: "mop_state", on: "b"},
		{name: "100 KB state", forge: []forge{{"state", big}}, allowed: 100, rejected: "mop_state", on: "b", stateGone: true},
		// Within range: taken, as from a learner (only ACLs keep such
		// writes out; see the README).
		{name: "valid state", forge: []forge{{"state", `{"phase":1,"learned_rate":42,"allowed_rate":42,"base":0.2,"slope":0.01}`}}, allowed: 42},
		{name: "valid lock of another node", forge: []forge{{"learner", "c"}}, allowed: 100},
	}
	redisServers(t, func(t *testing.T, rdb redis.UniversalClient, addr string) {
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				name := fmt.Sprint("h", i)
				a, b := mopPair(t, addr, name)
				key := "{sluice:" + name + ":mop:" + mopBackend + "}"
				before := b.m.Export()
				b.lease.l.Grant(1000, 0, 1<<62)
				for range 7 {
					b.m.Allow(1) // some admissions of b's own, counted on its next sync
				}
				if tc.typed {
					rdb.Del(ctx, key)
					rdb.Set(ctx, key, "x", 0)
				}
				for _, f := range tc.forge {
					if err := rdb.HSet(ctx, key, f.field, f.val).Err(); err != nil {
						t.Fatal(err)
					}
					if f.field == "learner" && len(tc.forge) == 1 {
						// a lock within its lease: until now + 10s by Redis TIME
						tm, _ := rdb.Time(ctx).Result()
						rdb.HSet(ctx, key, "learner_until", tm.UnixMilli()+10_000)
					}
				}
				admittedBefore := b.admitted.Load()
				b.sync(ctx)
				if b.syncs.Load() != 2 {
					t.Fatalf("b's sync failed (%d syncs)", b.syncs.Load())
				}
				if b.leader != tc.bLeads {
					t.Errorf("b leader %v, want %v", b.leader, tc.bLeads)
				}
				if st := b.m.Status(); st.AllowedRate != tc.allowed {
					t.Errorf("b's allowed rate %g, want %g", st.AllowedRate, tc.allowed)
				}
				if lim := b.lease.m.limit(0); lim != int64(tc.allowed) {
					t.Errorf("b's lease limit %d, want %g", lim, tc.allowed)
				}
				if tc.rejected != "" {
					if got := b.c.Rejected()[tc.rejected]; got != 1 {
						t.Errorf("b counted %d %s rejections, want 1 (%v)", got, tc.rejected, b.c.Rejected())
					}
					if after := b.m.Export(); after.AllowedRate != before.AllowedRate || after.LearnedRate != before.LearnedRate || after.Phase != before.Phase {
						t.Errorf("b's own state changed from %+v to %+v", before, after)
					}
				}
				if strings.HasPrefix(tc.name, "admitted") || strings.HasPrefix(tc.name, "refused") {
					if got := b.admitted.Load() - admittedBefore; got != 7 {
						t.Errorf("b's cluster admitted count grew by %d, want its own 7", got)
					}
				}
				if tc.stateGone {
					if ok, _ := rdb.HExists(ctx, key, "state").Result(); ok {
						t.Error("the oversized state is still in Redis")
					}
				}
				// The next syncs of both work.
				a.sync(ctx)
				b.sync(ctx)
				if a.syncs.Load() != 2 || b.syncs.Load() != 3 {
					t.Errorf("syncs a %d b %d, want 2 and 3", a.syncs.Load(), b.syncs.Load())
				}
			})
		}
	})
}

// TestHeartbeatHostileRedis is the golden table of forged members: a
// member alive further ahead than any node's heartbeat (which kept the
// node count, and so every share, wrong for as long as the attacker
// chose) is dropped; a member set of another type (which broke every
// heartbeat, so the node ran under its fail policy) is replaced; a member
// count beyond any cluster's is not used. Members alive within the
// longest heartbeat are counted: only ACLs keep them out.
func TestHeartbeatHostileRedis(t *testing.T) {
	redisServers(t, func(t *testing.T, rdb redis.UniversalClient, addr string) {
		for i, tc := range []struct {
			name    string
			forge   func(ctx context.Context, key string, now int64)
			nodes   int64
			bad     uint64
			wantErr bool
		}{
			{"no forgery", func(context.Context, string, int64) {}, 1, 0, false},
			{"alive until the year 5138", func(ctx context.Context, key string, now int64) {
				rdb.ZAdd(ctx, key, redis.Z{Score: 99999999999999, Member: "evil"})
			}, 1, 1, false},
			{"alive for ever", func(ctx context.Context, key string, now int64) {
				rdb.ZAdd(ctx, key, redis.Z{Score: math.Inf(1), Member: "evil"})
			}, 1, 1, false},
			{"alive 40s ahead", func(ctx context.Context, key string, now int64) {
				rdb.ZAdd(ctx, key, redis.Z{Score: float64(now + 40_000), Member: "evil"})
			}, 1, 1, false},
			{"a string, not a member set", func(ctx context.Context, key string, now int64) {
				rdb.Set(ctx, key, "x", 0)
			}, 1, 1, false},
			{"2,000 members", func(ctx context.Context, key string, now int64) {
				zs := make([]redis.Z, 2000)
				for j := range zs {
					zs[j] = redis.Z{Score: float64(now + 10_000), Member: fmt.Sprint("m", j)}
				}
				rdb.ZAdd(ctx, key, zs...)
			}, 1, 1, false},
			{"alive 20s ahead: counted", func(ctx context.Context, key string, now int64) {
				rdb.ZAdd(ctx, key, redis.Z{Score: float64(now + 20_000), Member: "other"})
			}, 2, 0, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				r, err := NewClient("redis://"+addr, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				name := fmt.Sprint("hb", i)
				c, err := New(Config{Redis: "x", Name: name, Node: "a"}, r, &admission.ManualClock{}, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				tm, err := rdb.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				tc.forge(ctx, "{sluice:"+name+"}:nodes", tm.UnixMilli())
				c.heartbeat(ctx, false)
				if !c.Up() {
					t.Fatalf("heartbeat failed: %s", c.Status().LastError)
				}
				if c.Nodes() != tc.nodes {
					t.Errorf("%d nodes, want %d", c.Nodes(), tc.nodes)
				}
				if got := c.Rejected()["nodes"]; got != tc.bad {
					t.Errorf("%d rejections of kind nodes, want %d", got, tc.bad)
				}
			})
		}
	})
}

// TestNewClientTLSAndUser: rediss:// turns TLS on and the URL's user and
// password reach Redis's AUTH, for a server, a Sentinel-watched master
// (its credentials in the query) and a Redis Cluster; an error about such
// a URL shows no password.
func TestNewClientTLSAndUser(t *testing.T) {
	for _, tc := range []struct {
		url, user, pass string
		tls             bool
	}{
		{"rediss://sluice-edge:s3cret@127.0.0.1:6380/0", "sluice-edge", "s3cret", true},
		{"redis://sluice-edge:s3cret@127.0.0.1:6379/0", "sluice-edge", "s3cret", false},
		{"rediss://sentinel-user:sp@127.0.0.1:26379?master_name=m&username=sluice-edge&password=s3cret", "sluice-edge", "s3cret", true},
		{"rediss+cluster://sluice-edge:s3cret@127.0.0.1:7000?addr=127.0.0.1:7001", "sluice-edge", "s3cret", true},
	} {
		c, err := NewClient(tc.url, time.Second)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		var user, pass string
		var tls bool
		switch cc := c.(type) {
		case *redis.Client:
			o := cc.Options()
			user, pass, tls = o.Username, o.Password, o.TLSConfig != nil
		case *redis.ClusterClient:
			o := cc.Options()
			user, pass, tls = o.Username, o.Password, o.TLSConfig != nil
		}
		c.Close()
		if user != tc.user || pass != tc.pass || tls != tc.tls {
			t.Errorf("%s: user %q password %q TLS %v; want %q %q %v", tc.url, user, pass, tls, tc.user, tc.pass, tc.tls)
		}
	}
	_, err := NewClient("rediss://u:pw1@127.0.0.1:26379?master_name=m&password=pw2&sentinel_password=pw3&dial_timeout=bogus", time.Second)
	if err == nil {
		t.Fatal("a bad Sentinel URL: no error")
	}
	if msg := err.Error(); strings.Contains(msg, "pw1") || strings.Contains(msg, "pw2") || strings.Contains(msg, "pw3") {
		t.Errorf("error %q shows a password", msg)
	}
}

// TestACLUserSuffices: the ACL the README gives a cluster lets its nodes
// do everything they do (heartbeat, lease, MOP sync, dialog sharing) and
// nothing else: no other key, no other channel, no FLUSHALL. Real
// redis-server only (miniredis has no ACLs).
func TestACLUserSuffices(t *testing.T) {
	if testing.Short() {
		t.Skip("redis-server")
	}
	port := freePort(t)
	startRedis(t, port)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The README's command, for cluster "edge".
	acl := []any{"ACL", "SETUSER", "sluice-edge", "on", ">pw", "resetkeys", "~{sluice:edge}*", "~{sluice:edge:*",
		"resetchannels", "&{sluice:edge}:dialogs", "-@all", "+@read", "+@write", "+@scripting", "+@pubsub", "+ping", "+time", "-@dangerous"}
	if err := admin.Do(ctx, acl...).Err(); err != nil {
		t.Fatal(err)
	}
	url := "redis://sluice-edge:pw@" + addr + "/0"
	mk := func(node string) *Cluster {
		rdb, err := NewClient(url, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rdb.Close() })
		if err := CheckReachable(ctx, rdb); err != nil {
			t.Fatal(err)
		}
		c, err := New(Config{Redis: url, Name: "edge", Node: node}, rdb, admission.MonoClock{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := mk("a"), mk("b")
	for _, c := range []*Cluster{a, b} {
		c.heartbeat(ctx, false)
		if !c.Up() {
			t.Fatalf("heartbeat as sluice-edge failed: %s", c.Status().LastError)
		}
	}
	m, err := admission.NewMeter(admission.RuleConfig{Name: "r", Limit: 100, Unit: time.Second, Action: admission.ActionReject}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.AttachRules([]*admission.Meter{m})
	if err := a.rules[0].lease(ctx, a.clock.Now(), 5); err != nil {
		t.Errorf("lease as sluice-edge: %v", err)
	}
	mop, err := admission.NewMOP(admission.MOPConfig{Name: "b", InitialRate: 100, MinRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	a.AttachMOP(mopBackend, mop)
	a.mops[0].sync(ctx)
	if a.mops[0].syncs.Load() != 1 {
		t.Error("MOP sync as sluice-edge failed")
	}
	got := make(chan string, 16)
	pub, err := a.ShareDialogs(ctx, testRing, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ShareDialogs(ctx, testRing, func(p []byte) error { got <- string(p); return nil }); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
wait:
	for {
		pub([]byte(`{"op":1,"call_id":"acl"}`))
		select {
		case <-got:
			break wait
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			t.Fatal("no dialog change shared as sluice-edge within 5s")
		}
	}
	// And nothing else.
	user := redis.NewClient(&redis.Options{Addr: addr, Username: "sluice-edge", Password: "pw"})
	defer user.Close()
	for what, err := range map[string]error{
		"FLUSHALL":            user.FlushAll(ctx).Err(),
		"another key":         user.Set(ctx, "{sluice:other}:nodes", "x", 0).Err(),
		"another channel":     user.Publish(ctx, "{sluice:other}:dialogs", "x").Err(),
		"CONFIG SET":          user.ConfigSet(ctx, "maxmemory", "1").Err(),
		"a script on another": user.Eval(ctx, "return redis.call('SET', KEYS[1], 'x')", []string{"{sluice:other}:x"}).Err(),
	} {
		if err == nil {
			t.Errorf("%s allowed to the cluster's user", what)
		}
	}
}

// TestMOPStateSealed: with the affinity key ring, a follower imports only
// a state sealed by a node for this backend and newer than the last one it
// imported: a plausible rate written by a Redis client (within every range
// check), a state sealed with another ring or for another backend, an
// unsealed state (a node without the ring) and a replayed older state are
// refused, and the follower keeps the learner's last rate.
func TestMOPStateSealed(t *testing.T) {
	redisServers(t, func(t *testing.T, rdb redis.UniversalClient, addr string) {
		ctx := context.Background()
		a, b := mopPair(t, addr, "sealed", testRing...)
		key := "{sluice:sealed:mop:" + mopBackend + "}"
		learn := func(rate float64) {
			t.Helper()
			if err := a.m.Import(admission.MOPState{Phase: admission.Learned, LearnedRate: rate, AllowedRate: rate, UpdatedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			a.sync(ctx)
		}
		learn(42)
		old, err := rdb.HGet(ctx, key, "state").Result()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(old, "s1 2 ") {
			t.Fatalf("the learner wrote %q, want a state sealed with key 2", old)
		}
		b.sync(ctx)
		if st := b.m.Status(); st.AllowedRate != 42 {
			t.Fatalf("follower at %g, want the learner's sealed 42", st.AllowedRate)
		}
		learn(30)
		b.sync(ctx)
		if st := b.m.Status(); st.AllowedRate != 30 {
			t.Fatalf("follower at %g, want the learner's sealed 30", st.AllowedRate)
		}
		other, _ := newKeySet([]lb.Key{{ID: 2, Secret: bytes.Repeat([]byte{9}, 32)}}, MOPStateKeyLabel)
		mine, _ := newKeySet(testRing, MOPStateKeyLabel)
		plausible := `{"phase":1,"learned_rate":999999,"allowed_rate":999999,"updated_at":"2100-01-01T00:00:00Z"}`
		for _, tc := range []struct{ name, state string }{
			{"unsealed, plausible", plausible},
			{"sealed with another ring", other.seal(key, plausible)},
			{"sealed for another backend", mine.seal("{sluice:sealed:mop:10.0.0.2:5060}", plausible)},
			{"sealed, altered", strings.Replace(mine.seal(key, plausible), "999999", "999998", 1)},
			{"replayed older state", old},
		} {
			before := b.c.Rejected()["mop_state"]
			rdb.HSet(ctx, key, "state", tc.state)
			b.sync(ctx)
			if st := b.m.Status(); st.AllowedRate != 30 {
				t.Errorf("%s: follower at %g, want 30 kept", tc.name, st.AllowedRate)
			}
			if got := b.c.Rejected()["mop_state"] - before; got != 1 {
				t.Errorf("%s: %d rejections counted, want 1", tc.name, got)
			}
		}
	})
}

// TestRejectsLoggedRateLimited: every rejected value is counted, and each
// kind is logged at most once per rejectLogEvery, the line carrying how
// many were rejected since the last.
func TestRejectsLoggedRateLimited(t *testing.T) {
	var buf bytes.Buffer
	c, err := New(Config{Redis: "x", Name: "t", Node: "a"}, redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), &admission.ManualClock{}, nil, slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var now int64 = 1
	c.rejected.now = func() int64 { return now }
	for range 100 {
		c.rejectf(rejectLeaseField, 2, "bad field")
	}
	c.rejectf(rejectMOPState, 1, "bad state")
	now += int64(rejectLogEvery)
	c.rejectf(rejectLeaseField, 1, "bad field")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d log lines, want 3 (two kinds, then one after the interval):\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "rejected=2 ") || !strings.Contains(lines[2], "rejected=199 ") || !strings.Contains(lines[2], "rejected_total=201") {
		t.Errorf("counts in the log lines:\n%s", buf.String())
	}
	if got := c.Rejected(); got["lease_field"] != 201 || got["mop_state"] != 1 {
		t.Errorf("counters %v", got)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var metric float64
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if f.GetName() == "sluice_cluster_redis_rejected_total" && l.GetName() == "kind" && l.GetValue() == "lease_field" {
					metric = m.GetCounter().GetValue()
				}
			}
		}
	}
	if metric != 201 {
		t.Errorf("sluice_cluster_redis_rejected_total{kind=\"lease_field\"} = %g, want 201", metric)
	}
}

// TestLeaseScriptRestoresOwnCounts: a sub-interval holding fewer tokens
// than the calling node alone counted in it (flushed, deleted or lowered
// by another client) is raised back to the node's own count before
// anything is granted; counts of sub-intervals out of the window, and
// counts already at least the node's, are left alone.
func TestLeaseScriptRestoresOwnCounts(t *testing.T) {
	const sub = int64(time.Hour / time.Microsecond)
	redisServers(t, func(t *testing.T, rdb redis.UniversalClient, _ string) {
		ctx := context.Background()
		key := "{sluice:t:arm:restore}"
		rdb.Del(ctx, key)
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		k := tm.UnixMicro() / sub
		rdb.HSet(ctx, key, fmt.Sprint(k-1), "2", fmt.Sprint(k-2), "9") // k-1 lowered from 5; k-2 holds more than ours
		own := fmt.Sprintf("%d:5,%d:3,%d:4,%d:7", k-1, k-2, k, k-6)    // k-6 is out of the window
		res, err := leaseScript.Run(ctx, rdb, []string{key, key + ":lost"}, 100, 1, sub, 1, 0, 0, 0, own).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		if res[2] != k {
			t.Skip("the hour turned during the test")
		}
		// restored: 3 in k-1, 4 in k; window 5+9+4 = 18 before the grant of 1
		if res[6] != 7 || res[1] != 19 || res[0] != 1 {
			t.Errorf("reply %v, want 7 restored, window 19 after a grant of 1", res)
		}
		for f, want := range map[int64]string{k - 1: "5", k - 2: "9", k: "5"} {
			if v, _ := rdb.HGet(ctx, key, fmt.Sprint(f)).Result(); v != want {
				t.Errorf("field %d = %q, want %q", f, v, want)
			}
		}
		if ok, _ := rdb.HExists(ctx, key, fmt.Sprint(k-6)).Result(); ok {
			t.Error("a count out of the window was restored")
		}
		// For a window after a loss every node keeps to its share: limit
		// 100 ÷ 5 nodes = 20, of which this node holds 5+3+5 = 13.
		if ttl := rdb.PTTL(ctx, key+":lost").Val(); ttl <= 0 || ttl > 6*time.Hour+time.Second {
			t.Errorf("lost marker lives %s, want at most a window", ttl)
		}
		own = fmt.Sprintf("%d:5,%d:3,%d:5", k-1, k-2, k)
		res, err = leaseScript.Run(ctx, rdb, []string{key, key + ":lost"}, 100, 100, sub, 5, 0, 0, 0, own).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != 7 || res[6] != 0 {
			t.Errorf("after a loss: reply %v, want a grant of 7 (share 20 - 13), nothing restored", res)
		}
		// A marker set to last longer than a window is cut to one.
		rdb.Set(ctx, key+":lost", "x", 1000*time.Hour)
		if res, err = leaseScript.Run(ctx, rdb, []string{key, key + ":lost"}, 100, 1, sub, 5, 0, 0, 0, own).Int64Slice(); err != nil || res[5] != 1 {
			t.Errorf("a marker for 1000h: reply %v, %v; want it counted invalid", res, err)
		}
		if ttl := rdb.PTTL(ctx, key+":lost").Val(); ttl > 6*time.Hour+time.Second {
			t.Errorf("lost marker lives %s after the lease, want at most a window", ttl)
		}
	})
}

// TestMOPLockTakenBack: a learner whose lock another name took before it
// expired (a forged lock; no node takes a lock before its expiry) takes it
// back at its next sync, and counts it; a lock that expired while the
// learner was away stays with the node that took it.
func TestMOPLockTakenBack(t *testing.T) {
	redisServers(t, func(t *testing.T, rdb redis.UniversalClient, addr string) {
		ctx := context.Background()
		a, b := mopPair(t, addr, "takeback")
		key := "{sluice:takeback:mop:" + mopBackend + "}"
		tm, _ := rdb.Time(ctx).Result()
		rdb.HSet(ctx, key, "learner", "evil", "learner_until", tm.UnixMilli()+20_000)
		b.sync(ctx)
		if b.leader {
			t.Fatal("b took a lock that has not expired")
		}
		a.sync(ctx)
		if !a.leader || a.c.Rejected()["mop_lock"] != 1 {
			t.Errorf("a leader %v, %d mop_lock rejections; want the lock taken back and counted", a.leader, a.c.Rejected()["mop_lock"])
		}
		if h, _ := rdb.HGet(ctx, key, "learner").Result(); h != "a" {
			t.Errorf("learner %q, want a", h)
		}
		// a's lock expires (a was away past it, by Redis's clock and so by
		// the expiry a holds); b takes it as any node would: a does not
		// take it back.
		tm, _ = rdb.Time(ctx).Result()
		rdb.HSet(ctx, key, "learner_until", tm.UnixMilli()-1)
		a.lockUntil = tm.UnixMilli() - 1
		b.sync(ctx)
		a.sync(ctx)
		if a.leader || !b.leader {
			t.Errorf("after a's lock expired: a leader %v, b leader %v; want b", a.leader, b.leader)
		}
	})
}
