package sip

import (
	"net/netip"
	"testing"
)

// TestBranchTamper: a branch verifies only for the client transaction,
// source and destination it was made for; any change of a character, of
// the transport flag or of the loop hash fails, and so do other keys.
func TestBranchTamper(t *testing.T) {
	br := newBrancher(nil)
	k := clientTxn{branch: "z9hG4bK-1", host: "192.0.2.10", port: 5060, src: netip.MustParseAddrPort("192.0.2.10:5060")}
	dst := target{addr: netip.MustParseAddrPort("10.0.0.1:5060")}
	b := br.branch(&k, 0xfeed, dst)
	if len(b) != branchLen || !br.verify(b, &k, dst) {
		t.Fatalf("branch %q (%d bytes) does not verify", b, len(b))
	}
	for i := len(proxyBranchPrefix); i < len(b); i++ {
		for _, c := range []byte("0ft") {
			if b[i] == c {
				continue
			}
			x := b[:i] + string(c) + b[i+1:]
			if br.verify(x, &k, dst) {
				t.Fatalf("branch %q with byte %d changed to %q verifies", b, i, c)
			}
		}
	}
	other := k
	other.src = netip.MustParseAddrPort("192.0.2.11:5060")
	tcp := k
	tcp.tcp = true
	for name, c := range map[string]struct {
		k   clientTxn
		dst target
	}{
		"another source":           {other, dst},
		"the source over TCP":      {tcp, dst},
		"another destination":      {k, target{addr: netip.MustParseAddrPort("10.0.0.2:5060")}},
		"the destination over TCP": {k, target{addr: dst.addr, tcp: true}},
	} {
		if br.verify(b, &c.k, c.dst) {
			t.Errorf("branch verifies for %s", name)
		}
	}
	if newBrancher(nil).verify(b, &k, dst) {
		t.Error("branch verifies under another key")
	}
	if br.verify(b[:len(b)-1], &k, dst) || br.verify(b+"0", &k, dst) {
		t.Error("branch of another length verifies")
	}
}

// BenchmarkBranch is what the keyed branch costs: computed once for every
// request we forward, checked once for every response.
func BenchmarkBranch(b *testing.B) {
	br := newBrancher(nil)
	k := clientTxn{branch: "z9hG4bK-74bf9-1-a8f3c2", host: "192.0.2.10", port: 5060, src: netip.MustParseAddrPort("192.0.2.10:5060")}
	dst := target{addr: netip.MustParseAddrPort("10.0.0.1:5060")}
	b.Run("compute", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = br.branch(&k, 0x1234, dst)
		}
	})
	v := br.branch(&k, 0x1234, dst)
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !br.verify(v, &k, dst) {
				b.Fatal("branch not verified")
			}
		}
	})
}
