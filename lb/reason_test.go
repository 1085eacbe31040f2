package lb

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicelb/sluice/admission"
)

// /status said "down" and nothing more: the reason of a backend that is
// not up (its probes with their error, its traffic, the operator) was only
// in the log. Reason says it, and is empty again once the backend is up.
func TestBackendReason(t *testing.T) {
	clock := &admission.ManualClock{}
	pr := down()
	p, h, _ := checked(t, clock, HealthConfig{}, pr, up())
	b := p.Backends()[0]
	ctx := context.Background()
	if r := b.Reason(0); r != "" {
		t.Fatalf("fresh backend: reason %q", r)
	}
	for i := range 3 {
		clock.Set(int64(i) * int64(2*time.Second))
		h.ProbeAll(ctx)
	}
	now := clock.Now()
	if b.State(now) != Down {
		t.Fatalf("state %v after three failed probes", b.State(now))
	}
	if r := b.Reason(now); !strings.Contains(r, "health checks") || !strings.Contains(r, context.DeadlineExceeded.Error()) {
		t.Errorf("down by probes: reason %q, want the health checks and the probe's error", r)
	}
	if st := b.Status(now); st.Reason != b.Reason(now) {
		t.Errorf("Status().Reason %q", st.Reason)
	}
	pr.v.Store(uint32(ProbeUp))
	for i := 3; i < 6; i++ {
		clock.Set(int64(i) * int64(2*time.Second))
		h.ProbeAll(ctx)
	}
	now = clock.Now()
	if r := b.Reason(now); r != "" || b.State(now) != Up {
		t.Fatalf("up again: state %v, reason %q", b.State(now), r)
	}
	for range 3 {
		b.Acquire()
		b.Release(now, ConnectError)
	}
	if r := b.Reason(now); !strings.Contains(r, "ejected by its traffic (connect error)") {
		t.Errorf("ejected: reason %q", r)
	}
	b2 := p.Backends()[1]
	b2.Drain(true)
	if r := b2.Reason(now); r != "drained by the operator" {
		t.Errorf("drained: reason %q", r)
	}
	b2.Disable(true)
	if r := b2.Reason(now); r != "disabled by the operator" {
		t.Errorf("disabled: reason %q", r)
	}
}

// A backend added at run time that answers before its first probe ends
// (a SIP ping's answer ends Unknown at once) was up without a line: the
// operator who added it saw nothing. The next probe now says it.
func TestNewBackendUpAnnounced(t *testing.T) {
	clock := &admission.ManualClock{}
	p, h, events := checked(t, clock, HealthConfig{}, up())
	b := p.Backends()[0]
	b.SetUnknown(true)
	b.Served(1)
	if b.State(1) != Up {
		t.Fatalf("state %v after an answer", b.State(1))
	}
	h.ProbeAll(context.Background())
	h.ProbeAll(context.Background())
	n := 0
	for _, e := range *events {
		if strings.Contains(e, "(new) takes new work") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d events of the new backend taking work, want 1: %q", n, *events)
	}
}
