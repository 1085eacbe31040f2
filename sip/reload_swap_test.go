package sip

import (
	"context"
	"testing"

	gosip "github.com/emiago/sipgo/sip"
)

// TestStateKeptBetweenBuildAndSwap: a generation carries the operator's
// and the traffic's state over from its Prev when it is built
// (lb.NewGeneration), but it serves only once SetGeneration puts it in
// force, after its Start has run a first round of pings. What happens to
// the backends in between lands on the generation being replaced: here a
// backend's 503 with Retry-After: 30 and an operator's drain of the other
// backend, both made after the build and before the swap. The swap copies
// them again: once the new generation serves, neither backend takes new
// work.
func TestStateKeptBetweenBuildAndSwap(t *testing.T) {
	b1 := newUAS(t, "b1")
	b2 := newUAS(t, "b2")
	specs := []string{b1.addr.String() + ",id=b1", b2.addr.String() + ",id=b2"}
	s := poolServer(t, specs, nil, nil, func(c *Config) { c.Policy = "round-robin" })
	c := newUAC(t, s.udpAddr())

	next := sipGen(t, s, specs, nil) // a reload: built, carrying state over
	next.Start(context.Background()) // its first round of pings

	// Meanwhile b1 answers an INVITE 503 Retry-After: 30 (the INVITE
	// fails over to b2), and an operator drains b2.
	b1.mode.Store(mode503)
	for b1.count(gosip.INVITE, "") == 0 {
		k := c.newCall()
		k.invite("")
		c.awaitResponse(gosip.INVITE, 200, 200)
	}
	old := s.Generation()
	if !(old.Lookup("b1").BusyUntil() > s.clock.Now()) {
		t.Fatal("b1's 503 did not back it off in the generation in force")
	}
	old.Lookup("b2").Drain(true)

	if err := s.SetGeneration(next); err != nil {
		t.Fatal(err)
	}
	old.Stop()
	now := s.clock.Now()
	if !(next.Lookup("b1").BusyUntil() > now) {
		t.Error("b1 asked for 30 s without new work just before the reload; the generation now in force has forgotten it")
	}
	if !next.Lookup("b2").Drained() {
		t.Error("b2 was drained by the operator just before the reload; the generation now in force has forgotten it")
	}
	b1.mode.Store(modeAnswer)
	before1, before2 := b1.count(gosip.INVITE, ""), b2.count(gosip.INVITE, "")
	for range 4 {
		k := c.newCall()
		k.invite("")
		finalAnswer(t, c, k.callID)
	}
	if n1, n2 := b1.count(gosip.INVITE, "")-before1, b2.count(gosip.INVITE, "")-before2; n1+n2 != 0 {
		t.Errorf("after the reload b1 (backed off) got %d and b2 (drained) got %d new INVITEs, want none", n1, n2)
	}
}

// finalAnswer waits for the final answer to the INVITE of callID,
// whatever its code, skipping other messages.
func finalAnswer(t *testing.T, c *uac, callID string) int { return finalAnswerTo(t, c, callID) }

// finalAnswerTo waits for the final answer to the request of callID,
// whatever its code, skipping other messages.
func finalAnswerTo(t *testing.T, c *uac, callID string) int {
	t.Helper()
	for {
		m := c.recv()
		if m == nil {
			t.Fatalf("no final answer to %s", callID)
		}
		if res, ok := m.(*gosip.Response); ok && res.StatusCode >= 200 && res.CallID() != nil && res.CallID().Value() == callID {
			return res.StatusCode
		}
	}
}
