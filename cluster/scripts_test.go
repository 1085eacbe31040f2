package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func newMini(t *testing.T) (*miniredis.Miniredis, redis.UniversalClient) {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return mr, rdb
}

// base is a Redis TIME on a sub-interval boundary of a 1s sub-interval.
var base = time.Unix(1_800_000_000, 0)

// leaseSub is the golden vector's sub-interval, in µs (the script's unit).
const leaseSub = int64(time.Second / time.Microsecond)

// leaseStep is one call of the lease script in the golden vector.
type leaseStep struct {
	at                time.Duration // after base
	want, nodes       int64
	retAt, ret, seed  int64 // retAt: sub-interval offset from k0
	g, sum, untilEnd  int64
	retryAfterSeconds float64
}

// leaseSteps is the lease script's golden vector: limit 10 over six
// sub-intervals of 1s, three nodes, at fixed instants.
var leaseSteps = []leaseStep{
	{at: 0, want: 4, nodes: 1, g: 4, sum: 4, untilEnd: leaseSub, retryAfterSeconds: 6},                                 // cap 10/2=5
	{at: 100 * time.Millisecond, want: 9, nodes: 3, g: 1, sum: 5, untilEnd: leaseSub - 100000, retryAfterSeconds: 5.9}, // cap 6/6 → 1
	{at: 1 * time.Second, want: 3, nodes: 1, retAt: 0, ret: 2, g: 3, sum: 6, untilEnd: leaseSub, retryAfterSeconds: 5}, // 5-2 live, cap 3
	{at: 2 * time.Second, want: 10, nodes: 1, g: 2, sum: 8, untilEnd: leaseSub, retryAfterSeconds: 4},
	{at: 3 * time.Second, want: 5, nodes: 1, g: 1, sum: 9, untilEnd: leaseSub, retryAfterSeconds: 3}, // cap shrinks to 1
	{at: 4 * time.Second, want: 5, nodes: 1, g: 1, sum: 10, untilEnd: leaseSub, retryAfterSeconds: 2},
	{at: 5 * time.Second, want: 5, nodes: 1, g: 0, sum: 10, untilEnd: leaseSub, retryAfterSeconds: 1},                  // full
	{at: 6 * time.Second, want: 5, nodes: 1, g: 1, sum: 8, untilEnd: leaseSub, retryAfterSeconds: 1},                   // k0's 3 left: free 3, cap 1
	{at: 7 * time.Second, want: 0, nodes: 1, retAt: 0, ret: 5, g: 0, sum: 5, untilEnd: leaseSub, retryAfterSeconds: 1}, // a stale return to k0 is ignored; k2 is the oldest
	{at: 8 * time.Second, want: 0, nodes: 1, retAt: 7, ret: 9, g: 0, sum: 3, untilEnd: leaseSub, retryAfterSeconds: 1}, // never below zero
	{at: 9 * time.Second, want: 0, nodes: 1, seed: 7, g: 0, sum: 9, untilEnd: leaseSub, retryAfterSeconds: 1},
}

// TestLeaseScriptSteps is the script's golden vector: limit 10 over six
// sub-intervals of 1s, three nodes, at fixed instants.
func TestLeaseScriptSteps(t *testing.T) {
	mr, rdb := newMini(t)
	const sub = leaseSub
	k0 := base.UnixMicro() / sub
	steps := leaseSteps
	for i, s := range steps {
		mr.SetTime(base.Add(s.at))
		res, err := leaseScript.Run(context.Background(), rdb, []string{"{sluice:t:arm:r}", "{sluice:t:arm:r}:lost"}, 10, s.want, sub, s.nodes, k0+s.retAt, s.ret, s.seed).Int64Slice()
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		k := k0 + int64(s.at/time.Second)
		want := []int64{s.g, s.sum, k, s.untilEnd, int64(s.retryAfterSeconds * float64(sub))}
		for j := range want {
			if res[j] != want[j] {
				t.Errorf("step %d at +%s: got %v, want %v", i, s.at, res, want)
				break
			}
		}
	}
	if ttl := mr.TTL("{sluice:t:arm:r}"); ttl <= 6*time.Second || ttl > 9*time.Second {
		t.Errorf("rule hash TTL %s, want just over the window", ttl)
	}
}

// TestLeaseScriptStepsRealRedis replays the golden vector on a real
// redis-server, whose TIME the test cannot set: each step runs 300 ms
// into the sub-interval it names, counted from a boundary of the server's
// own clock, so Redis's Lua (not gopher-lua) and its integer replies and
// TIME give the same grants, sums and sub-intervals. The parts that depend
// on the exact instant (time to the sub-interval's end, Retry-After) are
// checked to lie in the right sub-interval. About 10 s.
func TestLeaseScriptStepsRealRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("replays 10 s of the golden vector on redis-server")
	}
	port := freePort(t)
	startRedis(t, port)
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	serverNow := func() int64 {
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMicro()
	}
	const sub = leaseSub
	k0 := serverNow()/sub + 1 // the next boundary of the server's clock
	for i, s := range leaseSteps {
		at := k0*sub + s.at.Microseconds() + 300_000
		for now := serverNow(); now < at; now = serverNow() {
			time.Sleep(time.Duration(at-now) * time.Microsecond)
		}
		res, err := leaseScript.Run(ctx, rdb, []string{"{sluice:t:arm:r}", "{sluice:t:arm:r}:lost"}, 10, s.want, sub, s.nodes, k0+s.retAt, s.ret, s.seed).Int64Slice()
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		k := k0 + int64(s.at/time.Second)
		if len(res) < 5 || res[0] != s.g || res[1] != s.sum || res[2] != k {
			t.Fatalf("step %d at +%s on redis-server: got %v, want grant %d, sum %d, sub-interval %d", i, s.at, res, s.g, s.sum, k)
		}
		// Both count down to the end of this sub-interval, with the
		// instant of the call; past the golden value by at most the
		// time the call took after its target.
		if res[3] <= 0 || res[3] > sub-300_000 {
			t.Errorf("step %d: %d µs to the sub-interval's end, want (0, %d]", i, res[3], sub-300_000)
		}
		want := int64(s.retryAfterSeconds * float64(sub))
		if d := want - res[4]; d < 0 || d >= sub {
			t.Errorf("step %d: Retry-After %d µs, want within a sub-interval below %d", i, res[4], want)
		}
	}
}

// heartbeatSteps is the heartbeat script's golden vector with a 150 ms
// TTL, at exact instants: b (beat at 10ms) lives until 160ms.
var heartbeatSteps = []struct {
	at          time.Duration
	node, leave string
	want        int64
	what        string
}{
	{0, "a", "0", 1, "after a"},
	{10 * time.Millisecond, "b", "0", 2, "after b"},
	{20 * time.Millisecond, "c", "0", 3, "after c"},
	{140 * time.Millisecond, "a", "0", 3, "a renews at 140ms"},
	{165 * time.Millisecond, "c", "0", 2, "at 165ms b has expired"},
	{170 * time.Millisecond, "c", "1", 1, "c leaves"},
}

// TestHeartbeatScript: members count while their heartbeat lasts, and a
// leaving node is gone at once.
func TestHeartbeatScript(t *testing.T) {
	mr, rdb := newMini(t)
	ctx := context.Background()
	for _, st := range heartbeatSteps {
		mr.SetTime(base.Add(st.at))
		res, err := heartbeatScript.Run(ctx, rdb, []string{"{sluice:t}:nodes"}, st.node, 150, st.leave, maxLockMS).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != st.want {
			t.Errorf("%s: %d nodes, want %d", st.what, res[0], st.want)
		}
	}
}

// TestHeartbeatScriptRealRedis replays the heartbeat vector on a real
// redis-server, fifty times slower (TTL 7.5 s, steps at the server's own
// clock), so a step late by up to 0.5 s still lands on the same side of
// every expiry. About 9 s.
func TestHeartbeatScriptRealRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("replays the heartbeat vector on redis-server")
	}
	port := freePort(t)
	startRedis(t, port)
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	serverNow := func() time.Time {
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	const scale = 50
	start := serverNow()
	for _, st := range heartbeatSteps {
		at := start.Add(scale * st.at)
		for now := serverNow(); now.Before(at); now = serverNow() {
			time.Sleep(at.Sub(now))
		}
		res, err := heartbeatScript.Run(ctx, rdb, []string{"{sluice:t}:nodes"}, st.node, 150*scale, st.leave, maxLockMS).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		if res[0] != st.want {
			t.Errorf("%s (x%d): %d nodes, want %d", st.what, scale, res[0], st.want)
		}
	}
}
