package lb

import (
	"errors"
	"sync"
	"testing"
)

// TestSetWeightRebuildsPolicies: a weight changed at run time shows in
// Status and in the share of new work under every weighted policy,
// including those that precompute from the weights.
func TestSetWeightRebuildsPolicies(t *testing.T) {
	for _, tc := range []struct {
		policy string
		n      int
		check  func(got []int) bool
		want   string
	}{
		{"weighted-round-robin", 400, func(c []int) bool { return c[0] == 100 && c[1] == 300 }, "[100 300]"},
		{"consistent-hash", 40000, func(c []int) bool { return c[1] > 2*c[0] }, "backend 1 more than twice backend 0"},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			p := newPool(t, tc.policy, 1, 1)
			id := p.Backends()[1].ID()
			if err := p.SetWeight(id, 3); err != nil {
				t.Fatal(err)
			}
			if got := p.Backends()[1].Weight(); got != 3 {
				t.Errorf("Weight() = %d, want 3", got)
			}
			if got := p.Status(0)[1].Weight; got != 3 {
				t.Errorf("Status weight = %d, want 3", got)
			}
			got := counts(t, p, tc.n, func(i int) uint64 { return Hash(string(rune(i))+"k") ^ uint64(i)*0x9e3779b97f4a7c15 })
			if !tc.check(got) {
				t.Errorf("counts after weight 3 = %v, want %s", got, tc.want)
			}
		})
	}
}

func TestSetWeightLeastOutstanding(t *testing.T) {
	p := newPool(t, "least-outstanding", 1, 1)
	bs := p.Backends()
	bs[0].Acquire()
	bs[1].Acquire()
	bs[1].Acquire()
	// 1/1 < 2/1: backend 0. With weight 4 on backend 1, 2/4 < 1/1.
	if b, _, _ := p.Pick(0, 0, nil); b != bs[0] {
		t.Fatalf("before: picked %s, want %s", b.ID(), bs[0].ID())
	}
	if err := p.SetWeight(bs[1].ID(), 4); err != nil {
		t.Fatal(err)
	}
	if b, _, _ := p.Pick(0, 0, nil); b != bs[1] {
		t.Errorf("after weight 4: picked %s, want %s", b.ID(), bs[1].ID())
	}
}

func TestSetWeightErrors(t *testing.T) {
	p := newPool(t, "weighted-round-robin", 2, 1)
	for _, tc := range []struct {
		id   string
		w    int
		want error
	}{
		{"nope", 2, ErrUnknownBackend},
		{p.Backends()[0].ID(), 0, ErrBadBackend},
		{p.Backends()[0].ID(), MaxWeight + 1, ErrBadBackend},
	} {
		if err := p.SetWeight(tc.id, tc.w); !errors.Is(err, tc.want) {
			t.Errorf("SetWeight(%q, %d) = %v, want %v", tc.id, tc.w, err, tc.want)
		}
	}
	if got := p.Backends()[0].Weight(); got != 2 {
		t.Errorf("weight after rejected changes = %d, want 2", got)
	}
}

// TestSetWeightConcurrentPicks: picks keep working while weights change
// (run with -race).
func TestSetWeightConcurrentPicks(t *testing.T) {
	p := newPool(t, "weighted-round-robin", 1, 1, 1)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				if _, out, _ := p.Pick(0, uint64(g), nil); out != Picked {
					t.Errorf("outcome %v", out)
					return
				}
			}
		}()
	}
	for i := range 200 {
		if err := p.SetWeight(p.Backends()[i%3].ID(), 1+i%7); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
}
