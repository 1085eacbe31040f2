package lb

import "testing"

// TestDisable: an operator's disable wins over health (Down, no affinity),
// drained and disabled are reported, and enabling gives the state back.
func TestDisable(t *testing.T) {
	p := newPool(t, "round-robin", 1)
	b := p.Backends()[0]
	b.Drain(true)
	b.Disable(true)
	if b.State(0) != Down || p.Pinned(b.ID(), 0) != nil || !b.Disabled() || !b.Drained() {
		t.Fatalf("disabled: state %v, pinned %v, disabled %v drained %v", b.State(0), p.Pinned(b.ID(), 0) != nil, b.Disabled(), b.Drained())
	}
	if got, _, _ := p.Pick(0, 1, nil); got != nil {
		t.Errorf("Pick chose the disabled backend %s", got.ID())
	}
	b.Disable(false)
	if b.State(0) != Draining || b.Disabled() {
		t.Errorf("enabled again while drained: %v, want draining", b.State(0))
	}
	b.Drain(false)
	if b.State(0) != Up || b.Drained() {
		t.Errorf("undrained: %v", b.State(0))
	}
}
