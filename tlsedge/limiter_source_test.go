package tlsedge

import (
	"net/netip"
	"testing"
)

// TestHandshakeSourceShare: one source (an IPv4 address, an IPv6 /64)
// holds at most an eighth of the places in flight, at least one; other
// sources get theirs; a release gives the place back; a connection not
// counted per source (no address) and a limiter without a bound are held
// to nothing of the kind.
func TestHandshakeSourceShare(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.1")
	a6 := netip.MustParseAddr("::ffff:192.0.2.1") // the same source, mapped
	b := netip.MustParseAddr("192.0.2.2")
	v6a := netip.MustParseAddr("2001:db8:1:2::1")
	v6b := netip.MustParseAddr("2001:db8:1:2::ffff") // same /64
	v6c := netip.MustParseAddr("2001:db8:1:3::1")    // another /64
	type step struct {
		src     netip.Addr
		acquire bool // else release
		want    bool
	}
	for _, tc := range []struct {
		name  string
		max   int
		steps []step
	}{
		{"share of 16 is 2", 16, []step{
			{a, true, true}, {a6, true, true}, {a, true, false}, {b, true, true},
			{a, false, true}, {a, true, true}, {a, true, false},
		}},
		{"share is at least 1", 4, []step{{a, true, true}, {a, true, false}, {b, true, true}}},
		{"IPv6 by /64", 8, []step{{v6a, true, true}, {v6b, true, false}, {v6c, true, true}}},
		{"no address: no share", 8, []step{
			{netip.Addr{}, true, true}, {netip.Addr{}, true, true}, {netip.Addr{}, true, true},
		}},
		{"no bound: no share", 0, []step{{a, true, true}, {a, true, true}, {a, true, true}}},
		{"the node's bound still holds", 2, []step{{a, true, true}, {b, true, true}, {v6c, true, false}}},
	} {
		l := NewHandshakeLimiter(tc.max, 0)
		for i, s := range tc.steps {
			if !s.acquire {
				l.ReleaseFrom(s.src)
				continue
			}
			if got := l.AcquireFrom(s.src, 0); got != s.want {
				t.Errorf("%s: step %d AcquireFrom(%v) = %v, want %v", tc.name, i, s.src, got, s.want)
			}
		}
	}
}

// TestHandshakeSourceTableEmpties: the per-source table holds only
// sources with a handshake under way.
func TestHandshakeSourceTableEmpties(t *testing.T) {
	l := NewHandshakeLimiter(64, 0)
	var srcs []netip.Addr
	for i := range 50 {
		s := netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})
		if !l.AcquireFrom(s, 0) {
			t.Fatalf("source %d refused", i)
		}
		srcs = append(srcs, s)
	}
	for _, s := range srcs {
		l.ReleaseFrom(s)
	}
	l.ReleaseFrom(srcs[0]) // one release too many changes nothing
	if n := len(l.src.by); n != 0 || l.Stats().InFlight != 0 {
		t.Errorf("after every release: %d sources in the table, %d in flight", n, l.Stats().InFlight)
	}
}

func BenchmarkAcquireFrom(b *testing.B) {
	l := NewHandshakeLimiter(256, 0)
	src := netip.MustParseAddr("192.0.2.1")
	b.ReportAllocs()
	for b.Loop() {
		if l.AcquireFrom(src, 0) {
			l.ReleaseFrom(src)
		}
	}
}
