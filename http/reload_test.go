package http

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicelb/sluice/lb"
)

// TestSetPoolKeepsAffinity: a reload that removes one backend, reweights
// another and adds a third keeps the sticky clients of the backend that
// stays, and sends no new work to the removed one.
func TestSetPoolKeepsAffinity(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		r := newRig(t, rigOpts{backends: 2})
		first := r.get("/", "")
		cookie := stickyFrom(t, first)
		kept := first.body // b0 or b1
		var keptAddr string
		for _, be := range r.backends {
			if be.name == kept {
				keptAddr = be.addr()
			}
		}
		added := startBackend(t, "b9")
		bk, err := lb.NewBackend(lb.BackendConfig{ID: kept, Addr: keptAddr, Proto: "http", Weight: 3})
		if err != nil {
			t.Fatal(err)
		}
		bn, err := lb.NewBackend(lb.BackendConfig{ID: "b9", Addr: added.addr(), Proto: "http"})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := lb.NewPool(lb.PoolConfig{}, []*lb.Backend{bk, bn})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.srv.SetPool(pool); err != nil {
			t.Fatal(err)
		}
		if r.srv.Pool() != pool {
			t.Fatal("Pool() does not return the new set")
		}
		for i := range 20 {
			if rep := r.get("/", cookie); rep.status != 200 || rep.body != kept {
				t.Fatalf("sticky request %d after reload: %d %q, want %s", i, rep.status, rep.body, kept)
			}
		}
		seen := map[string]int{}
		for range 20 {
			rep := r.get("/", "")
			if rep.status != 200 {
				t.Fatalf("new work after reload: %d %s", rep.status, rep.body)
			}
			seen[rep.body]++
		}
		if len(seen) != 2 || seen[kept] == 0 || seen["b9"] == 0 {
			t.Errorf("new work after reload went to %v, want only %s and b9", seen, kept)
		}
		if err := r.srv.SetPool(nil); err == nil {
			t.Error("SetPool(nil) succeeded")
		}
	})
}

func TestObserveForward(t *testing.T) {
	onEngines(t, func(t *testing.T) {
		var n atomic.Int64
		r := newRig(t, rigOpts{cfg: Config{ObserveForward: func(d time.Duration) {
			if d >= 0 {
				n.Add(1)
			}
		}}})
		for range 5 {
			if rep := r.get("/", ""); rep.status != 200 {
				t.Fatalf("status %d", rep.status)
			}
		}
		if got := n.Load(); got != 5 {
			t.Errorf("observed %d forwards, want 5", got)
		}
	})
}
