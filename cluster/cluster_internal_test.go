package cluster

import (
	"testing"
	"time"
)

// TestMemberCountsKeepTheMostRecent: the node count is the most members
// seen over nodesMemory, so one heartbeat that found a member missing
// (late on a loaded machine) does not shrink the count, and a member that
// really left is forgotten once nodesMemory has passed.
func TestMemberCountsKeepTheMostRecent(t *testing.T) {
	ms := int64(time.Millisecond)
	var m memberCounts
	steps := []struct {
		at, n, want int64
	}{
		{0, 3, 3},
		{50 * ms, 3, 3},
		{100 * ms, 2, 3}, // one member's heartbeat late
		{150 * ms, 3, 3},
		{200 * ms, 2, 3}, // a member left for good
		{400 * ms, 2, 3},
		{600 * ms, 2, 3}, // the last 3 was at 150 ms: 450 ms ago
		{650 * ms, 2, 2}, // 500 ms ago: forgotten
		{700 * ms, 4, 4}, // a member joined: counted at once
		{750 * ms, 3, 4},
	}
	for _, s := range steps {
		if got := m.add(s.at, s.n); got != s.want {
			t.Errorf("at %v with %d members: count %d, want %d", time.Duration(s.at), s.n, got, s.want)
		}
	}
}
