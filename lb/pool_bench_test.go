package lb

import (
	"sync/atomic"
	"testing"
)

func BenchmarkPick(b *testing.B) {
	for _, pol := range PolicyNames {
		b.Run(pol, func(b *testing.B) {
			p := newPool(b, pol, 1, 2, 3, 1)
			var k atomic.Uint64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := k.Add(1)
					be, _, _ := p.Pick(int64(key), key, nil)
					be.Acquire()
					be.Release(int64(key), OK)
				}
			})
		})
	}
}

func BenchmarkPinned(b *testing.B) {
	p := newPool(b, "round-robin", 1, 1)
	id := []byte(p.Backends()[1].ID())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if p.Pinned(string(id), 0) == nil {
				b.Fatal("not pinned")
			}
		}
	})
}
