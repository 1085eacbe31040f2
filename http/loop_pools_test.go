//go:build linux

package http

import (
	"testing"
	"time"
)

// TestSlotsForgotten: an address's connection count is forgotten once
// nobody refers to it and no connection of it is open, and never before:
// a count forgotten while a slot is taken, or while a loop's pool may
// still take one, would let a new count start from 0 beside it and the
// backend get more than -http-backend-max-conns.
func TestSlotsForgotten(t *testing.T) {
	const a = "192.0.2.1:80"
	for _, tc := range []struct {
		name string
		run  func(s *Server) // leaves the state to check
		kept bool
	}{
		{"referred to, nothing taken", func(s *Server) { s.backendSlots(a) }, true},
		{"reference given back", func(s *Server) { s.dropSlots(a, s.backendSlots(a)) }, false},
		{"slot taken, reference given back", func(s *Server) {
			b := s.backendSlots(a)
			b.take(10)
			s.dropSlots(a, b)
		}, true},
		{"slot taken and freed", func(s *Server) {
			b := s.backendSlots(a)
			b.take(10)
			s.dropSlots(a, b)
			s.releaseSlot(a, b)
		}, false},
		{"slot freed while a pool refers to it", func(s *Server) {
			pool := s.backendSlots(a)
			b := s.backendSlots(a)
			b.take(10)
			s.dropSlots(a, b)
			s.releaseSlot(a, b)
			_ = pool
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{}
			tc.run(s)
			s.slotsMu.Lock()
			_, kept := s.slots[a]
			s.slotsMu.Unlock()
			if kept != tc.kept {
				t.Errorf("entry kept %v, want %v", kept, tc.kept)
			}
		})
	}
}

// TestLoopForgetsUnusedPools: a loop's pool of a backend address that no
// longer has a connection and carried no request for poolForgetAfter is
// forgotten with the address's count (an address that left DNS costs
// nothing after it), and the address is served as before when it comes
// back.
func TestLoopForgetsUnusedPools(t *testing.T) {
	r := loopRig(t, rigOpts{backends: 1, cfg: Config{BackendIdle: 100 * time.Millisecond}})
	r.srv.poolForget.Store(0)
	addr := r.backends[0].addr()
	state := func() (pools int, slots bool) {
		for _, l := range r.srv.loops.Load().loops {
			done := make(chan int)
			l.post(func() { done <- len(l.connPools) })
			pools += <-done
		}
		r.srv.slotsMu.Lock()
		_, slots = r.srv.slots[addr]
		r.srv.slotsMu.Unlock()
		return pools, slots
	}
	for round := range 2 {
		if rep := r.get("/", ""); rep.status != 200 {
			t.Fatalf("round %d: GET: %d %q", round, rep.status, rep.body)
		}
		if pools, slots := state(); pools == 0 || !slots {
			t.Fatalf("round %d: after a request %d pools, count kept %v; want the pool and its count", round, pools, slots)
		}
		// The backend connection idles out (BackendIdle), then the pool
		// goes at the next tick; bounded.
		deadline := time.Now().Add(10 * time.Second)
		for {
			pools, slots := state()
			if pools == 0 && !slots {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d pools and count kept %v 10s after the last request; want none", round, pools, slots)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
