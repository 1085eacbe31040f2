package tlsedge

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// TestTryFromSaysWhy: each refusal is told by its reason and counted
// under it: the source's share as source, the node's bound as
// in_flight, the rate as rate.
func TestTryFromSaysWhy(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.1")
	b := netip.MustParseAddr("192.0.2.2")
	c := netip.MustParseAddr("192.0.2.3")
	l := NewHandshakeLimiter(2, 0) // share 1
	for i, s := range []struct {
		src  netip.Addr
		want Refusal
	}{{a, NotRefused}, {a, RefusedSource}, {b, NotRefused}, {c, RefusedInFlight}, {netip.Addr{}, RefusedInFlight}} {
		if got := l.TryFrom(s.src, 0); got != s.want {
			t.Errorf("step %d: TryFrom(%v) = %v, want %v", i, s.src, got, s.want)
		}
	}
	if st := l.Stats(); st.Started != 2 || st.RefusedSource != 1 || st.RefusedBusy != 2 || st.RefusedRate != 0 || st.InFlight != 2 {
		t.Errorf("stats %+v", st)
	}
	l.ReleaseFrom(a)
	l.ReleaseFrom(b)
	if n := len(l.src.by); n != 0 {
		t.Errorf("%d sources left in the table after a refusal by the node's bound", n)
	}

	r := NewHandshakeLimiter(0, 1) // one a second, burst 1
	if got := r.TryFrom(a, 0); got != NotRefused {
		t.Fatalf("first: %v", got)
	}
	if got := r.TryFrom(b, 0); got != RefusedRate {
		t.Fatalf("second at once: %v, want rate", got)
	}
	if st := r.Stats(); st.RefusedRate != 1 || st.RefusedBusy != 0 || st.RefusedSource != 0 {
		t.Errorf("stats %+v", st)
	}
	for r, want := range map[Refusal]string{NotRefused: "none", RefusedInFlight: "in_flight", RefusedSource: "source", RefusedRate: "rate", 9: "unknown"} {
		if r.String() != want {
			t.Errorf("%d: %q, want %q", r, r.String(), want)
		}
	}
}

// TestRefusalLog: a line at the first refusal, then none until 10 s
// after it; the next line counts every refusal since the last by reason
// and names the source refused most (an IPv6 /64 as one).
func TestRefusalLog(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.1")
	b := netip.MustParseAddr("::ffff:192.0.2.2")
	v6 := netip.MustParseAddr("2001:db8:1:2::1")
	v6b := netip.MustParseAddr("2001:db8:1:2::2")
	s := int64(time.Second)
	type note struct {
		why  Refusal
		src  netip.Addr
		at   int64
		line bool
		want RefusalSummary
	}
	var l RefusalLog
	for i, n := range []note{
		{RefusedSource, a, 100 * s, true, RefusalSummary{Source: 1, Top: a, TopRefusals: 1}},
		{RefusedInFlight, b, 101 * s, false, RefusalSummary{}},
		{RefusedSource, v6, 102 * s, false, RefusalSummary{}},
		{RefusedSource, v6b, 103 * s, false, RefusalSummary{}},
		{RefusedRate, netip.Addr{}, 109*s + s - 1, false, RefusalSummary{}},
		{RefusedRate, netip.Addr{}, 110 * s, true, RefusalSummary{InFlight: 1, Source: 2, Rate: 2, Top: netip.MustParseAddr("2001:db8:1:2::"), TopRefusals: 2}},
		{RefusedInFlight, netip.Addr{}, 200 * s, true, RefusalSummary{InFlight: 1}},
	} {
		got, line := l.Note(n.why, n.src, n.at)
		if line != n.line || !reflect.DeepEqual(got, n.want) {
			t.Errorf("note %d: %+v, %v; want %+v, %v", i, got, line, n.want, n.line)
		}
	}
	want := []any{"in_flight", uint64(1), "source", uint64(2), "rate", uint64(0), "top_source", "192.0.2.1", "top_source_refusals", uint64(2)}
	if got := (RefusalSummary{InFlight: 1, Source: 2, Top: netip.MustParseAddr("192.0.2.1"), TopRefusals: 2}).Args(); !reflect.DeepEqual(got, want) {
		t.Errorf("Args %v, want %v", got, want)
	}
	if got := (RefusalSummary{Rate: 3}).Args(); len(got) != 6 {
		t.Errorf("Args without a source: %v", got)
	}
}

// TestRefusalLogBounded: a flood from many sources keeps at most 64 of
// them in the table, and the table empties with each line.
func TestRefusalLogBounded(t *testing.T) {
	var l RefusalLog
	l.Note(RefusedRate, netip.Addr{}, 0)
	for i := range 1000 {
		l.Note(RefusedRate, netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), 1)
	}
	if len(l.by) != refusalSources {
		t.Errorf("%d sources counted, want %d", len(l.by), refusalSources)
	}
	sum, line := l.Note(RefusedRate, netip.Addr{}, int64(RefusalLogEvery))
	if !line || sum.Rate != 1001 || sum.TopRefusals != 1 || len(l.by) != 0 {
		t.Errorf("%+v %v; %d sources left", sum, line, len(l.by))
	}
}

func BenchmarkRefusalLogNote(b *testing.B) {
	var l RefusalLog
	src := netip.MustParseAddr("192.0.2.1")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l.Note(RefusedSource, src, int64(i))
	}
}
