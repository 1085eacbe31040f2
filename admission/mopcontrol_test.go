package admission

import (
	"testing"
	"time"
)

func TestMOPPinResetUnpin(t *testing.T) {
	var events []Event
	m, err := NewMOP(MOPConfig{Name: "http b1", InitialRate: 10, Window: time.Second, MaxHeap: 0.8,
		Events: func(e Event) { events = append(events, e) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Import(MOPState{Phase: Learned, LearnedRate: 200, AllowedRate: 200}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []float64{0, -1, 0.5, 2e6} { // 0.5 is under the default minimum rate 1, 2e6 over MaxMOPRate
		if err := m.Pin(bad); err == nil {
			t.Errorf("Pin(%v) accepted", bad)
		}
	}
	if err := m.Pin(50); err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); st.AllowedRate != 50 || m.Pinned() != 50 {
		t.Errorf("pinned: allowed %v pinned %v, want 50", st.AllowedRate, m.Pinned())
	}
	// Memory far over the ceiling teaches nothing while pinned.
	for i := range 10 {
		m.Observe(int64(i)*int64(100*time.Millisecond), 99, 100)
	}
	if st := m.Status(); st.AllowedRate != 50 || st.MemoryFraction != 0.99 {
		t.Errorf("pinned through overload: allowed %v mem %v; want 50 and the sample shown", st.AllowedRate, st.MemoryFraction)
	}
	// What is saved is the learned state, not the pin.
	if ex := m.Export(); ex.AllowedRate != 200 || ex.LearnedRate != 200 {
		t.Errorf("export while pinned %+v: want the learned 200/s", ex)
	}
	if !m.Unpin() || m.Pinned() != 0 || m.Status().AllowedRate != 200 {
		t.Errorf("unpin: pinned %v allowed %v, want 0 and 200", m.Pinned(), m.Status().AllowedRate)
	}
	if m.Unpin() {
		t.Error("a second Unpin reported a pin")
	}
	m.Pin(70)
	m.Reset()
	st := m.Status()
	if st.Phase != Discovery || st.AllowedRate != 10 || st.LearnedRate != 0 || m.Pinned() != 0 {
		t.Errorf("after reset %+v pinned %v: want discovery at the initial 10/s", st, m.Pinned())
	}
	if len(events) == 0 || events[len(events)-1].Kind != EventMOPPhase {
		t.Errorf("reset wrote no mop.phase event: %v", events)
	}
	var nilMOP *MOP
	nilMOP.Reset()
	if nilMOP.Pin(5) == nil || nilMOP.Unpin() || nilMOP.Pinned() != 0 {
		t.Error("a backend without MOP must refuse a pin")
	}
}
