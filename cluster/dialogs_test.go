package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// TestShareDialogs: a change published on one node is applied on the
// others and not echoed back to its own.
func TestShareDialogs(t *testing.T) {
	mr, _ := newMini(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type got struct {
		mu   sync.Mutex
		msgs []string
	}
	var nodes []*Cluster
	var gots []*got
	var pubs []func([]byte)
	for _, name := range []string{"a", "b", "c"} {
		rdb, err := NewClient("redis://"+mr.Addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		c, err := New(Config{Redis: "x", Name: "t", Node: name}, rdb, admission.MonoClock{}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.heartbeat(ctx, false)
		g := &got{}
		pubs = append(pubs, c.ShareDialogs(ctx, func(b []byte) { g.mu.Lock(); g.msgs = append(g.msgs, string(b)); g.mu.Unlock() }))
		nodes = append(nodes, c)
		gots = append(gots, g)
	}
	// Subscriptions are asynchronous: publish until b and c have one.
	deadline := time.Now().Add(5 * time.Second)
	for {
		pubs[0]([]byte(`{"op":1,"call_id":"x"}`))
		time.Sleep(20 * time.Millisecond)
		gots[1].mu.Lock()
		gots[2].mu.Lock()
		n1, n2 := len(gots[1].msgs), len(gots[2].msgs)
		gots[2].mu.Unlock()
		gots[1].mu.Unlock()
		if n1 > 0 && n2 > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b got %d and c got %d changes within 5s", n1, n2)
		}
	}
	gots[0].mu.Lock()
	defer gots[0].mu.Unlock()
	if len(gots[0].msgs) != 0 {
		t.Errorf("the publishing node applied its own change: %v", gots[0].msgs)
	}
	if gots[1].msgs[0] != `{"op":1,"call_id":"x"}` {
		t.Errorf("b got %q", gots[1].msgs[0])
	}
	if st := nodes[0].Dialogs(); st.Published == 0 {
		t.Errorf("a's counters %+v", st)
	}
}
