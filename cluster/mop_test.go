package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

func mopNode(t *testing.T, name string, rdbURL string, mr interface{ Addr() string }) (*Cluster, *admission.MOP) {
	t.Helper()
	rdb, err := NewClient("redis://"+mr.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	c, err := New(Config{Redis: rdbURL, Name: "t", Node: name}, rdb, &admission.ManualClock{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := admission.NewMOP(admission.MOPConfig{Name: "b", InitialRate: 100, MinRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	c.AttachMOP("10.0.0.1:5060", m)
	c.heartbeat(context.Background(), false)
	return c, m
}

// TestMOPShared: one node holds the backend's learner lock and learns on
// the cluster's total; the other follows its published state; when the
// learner stops renewing, the lock passes on.
func TestMOPShared(t *testing.T) {
	mr, _ := newMini(t)
	ctx := context.Background()
	a, ma := mopNode(t, "a", "x", mr)
	b, mb := mopNode(t, "b", "x", mr)
	sa, sb := a.mops[0], b.mops[0]
	sa.sync(ctx) // a takes the lock first
	sb.sync(ctx)
	if !sa.leader || sb.leader || ma.Follower() || !mb.Follower() {
		t.Fatalf("leaders a=%v b=%v, followers a=%v b=%v; want a learning, b following", sa.leader, sb.leader, ma.Follower(), mb.Follower())
	}
	// Both admit new work; the learner's counts are the cluster's total.
	sa.lease.l.Grant(1000, 0, 1<<62)
	sb.lease.l.Grant(1000, 0, 1<<62)
	for range 30 {
		ma.Allow(1)
	}
	for range 50 {
		mb.Allow(1)
	}
	sa.sync(ctx)
	sb.sync(ctx)
	sa.sync(ctx)
	la, _ := ma.LocalCounts()
	lb, _ := mb.LocalCounts()
	if la == 0 || lb == 0 {
		t.Fatalf("admitted %d and %d, want some on each node", la, lb)
	}
	if st := ma.Status(); st.Admitted != la+lb {
		t.Errorf("learner's admitted count %d, want the cluster's %d+%d", st.Admitted, la, lb)
	}
	// The learner's state reaches the follower.
	if err := ma.Import(admission.MOPState{Phase: admission.Learned, LearnedRate: 42, AllowedRate: 42}); err != nil {
		t.Fatal(err)
	}
	sa.sync(ctx)
	sb.sync(ctx)
	if st := mb.Status(); st.LearnedRate != 42 || st.AllowedRate != 42 {
		t.Errorf("follower rates %v/%v, want the learner's 42", st.LearnedRate, st.AllowedRate)
	}
	// a dies: after its lock expires b takes over.
	mr.SetTime(time.Now().Add(time.Second))
	sb.sync(ctx)
	if !sb.leader || mb.Follower() {
		t.Errorf("after the learner stopped renewing, b leader=%v follower=%v; want b learning", sb.leader, mb.Follower())
	}
	if st := b.Status(); len(st.Backends) != 1 || !st.Backends[0].Learner {
		t.Errorf("status %+v", st.Backends)
	}
}
