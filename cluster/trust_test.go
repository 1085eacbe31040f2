package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServers runs f against miniredis (its TIME fixed at base) and
// against a real redis-server started on a loopback ephemeral port and
// stopped by PID (skipped where none is installed): Lua differs between
// the two (gopher-lua and Redis's Lua 5.1, e.g. tonumber("nan")).
func redisServers(t *testing.T, f func(t *testing.T, rdb redis.UniversalClient)) {
	t.Run("miniredis", func(t *testing.T) {
		mr, rdb := newMini(t)
		mr.SetTime(base)
		f(t, rdb)
	})
	t.Run("redis-server", func(t *testing.T) {
		if testing.Short() {
			t.Skip("redis-server")
		}
		port := freePort(t)
		startRedis(t, port)
		rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
		t.Cleanup(func() { rdb.Close() })
		f(t, rdb)
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
	}{
		{name: "empty", g: 5, sum: 5},
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
	redisServers(t, func(t *testing.T, rdb redis.UniversalClient) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				key := "{sluice:t:arm:hostile}"
				for try := 0; ; try++ {
					rdb.Del(ctx, key)
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
					res, err := leaseScript.Run(ctx, rdb, []string{key}, 10, 100, sub, 1, 0, 0, 0).Int64Slice()
					if err != nil {
						t.Fatalf("script failed: %v", err)
					}
					if len(res) != 6 {
						t.Fatalf("reply %v, want 6 values", res)
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
					res2, err := leaseScript.Run(ctx, rdb, []string{key}, 10, 1, sub, 1, 0, 0, 0).Int64Slice()
					if err != nil || len(res2) != 6 || res2[1] != tc.sum+res2[0] || res2[5] != 0 {
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
		{[]int64{3, 3, 7, 500, 5000, 0}, true},
		{[]int64{0, 10, 7, 1000, 0, 2}, true},
		{[]int64{3, 3, 7, 500, 5000}, false},     // old reply without the invalid field count
		{[]int64{6, 6, 7, 500, 5000, 0}, false},  // more than asked
		{[]int64{-1, 0, 7, 500, 5000, 0}, false}, // negative grant
		{[]int64{3, 3, 0, 500, 5000, 0}, false},  // no sub-interval
		{[]int64{3, 3, 7, 0, 5000, 0}, false},    // ends now
		{[]int64{3, 3, 7, 1001, 5000, 0}, false}, // ends after a sub-interval
		{[]int64{3, 3, 7, 500, 6001, 0}, false},  // Retry-After beyond the window
		{[]int64{3, 3, 7, 500, -1, 0}, false},
	} {
		if err := r.checkReply(tc.res, 5); (err == nil) != tc.ok {
			t.Errorf("checkReply(%v) = %v, want ok %v", tc.res, err, tc.ok)
		}
	}
}
