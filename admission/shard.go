package admission

import (
	"sync/atomic"
	"unsafe"
)

// Sharded reservations keep the hot paths off one contended cache line.
//
// On 2 cores a CAS on a word both cores write costs 35–40 ns, as much as
// x/time/rate's whole mutex-guarded Allow. So when there is room, a caller
// reserves a small batch of admissions on the shared word with one CAS and
// parks the rest in a shard of its own; the next callers that land on that
// shard take from it with an uncontended CAS. Batches are only taken while
// the free room is large (see batchFor), so decisions near a limit stay
// exact, and reservations are tied to an epoch: the owner invalidates them
// when the epoch moves on (and the ARM meter gives unused ones back).

const (
	numShards   = 16 // power of two
	maxBatch    = 16 // ARM
	maxMOPBatch = 64 // MOP: reservations expire with their ~1ms tick anyway
	shardTokens = 1<<32 - 1
)

// shard is one slot of parked reservations and its counters. It spans two
// cache lines so that the hot words of neighbours never share one, whatever
// the alignment of the array.
type shard struct {
	w       atomic.Uint64               // epoch (high 32 bits) | tokens (low 32 bits)
	refused atomic.Uint64               // refusals decided on this shard
	granted atomic.Uint64               // MOP: admissions reserved here (parked ones included)
	counts  [numProtos][2]atomic.Uint64 // Controller: admissions by protocol and class
	_       [48]byte
}

// shards is a set of shard slots; the zero value is ready.
type shards [numShards]shard

// pick returns the caller's shard. Goroutine stacks lie kilobytes apart,
// so a hash of the address of a stack variable spreads concurrent callers
// over the shards without any per-goroutine state; a moved stack only means
// another shard, never a wrong decision.
func (s *shards) pick() *shard {
	var x byte
	p := uint64(uintptr(unsafe.Pointer(&x))) >> 10
	return &s[(p*0x9E3779B97F4A7C15)>>(64-4)]
}

// take consumes one parked reservation of epoch e, if there is one.
func (sh *shard) take(e uint32) bool {
	for {
		w := sh.w.Load()
		if uint32(w>>32) != e || w&shardTokens == 0 {
			return false
		}
		if sh.w.CompareAndSwap(w, w-1) {
			return true
		}
	}
}

// park stores n spare reservations of epoch e, replacing what was there.
// It returns how many reservations of epoch e it replaced (lost unless the
// caller accounts for them).
func (sh *shard) park(e uint32, n uint64) (replaced uint64) {
	old := sh.w.Swap(uint64(e)<<32 | n)
	if uint32(old>>32) == e {
		return old & shardTokens
	}
	return 0
}

// drain takes back every parked reservation of epoch e.
func (s *shards) drain(e uint32) (n uint64) {
	for i := range s {
		old := s[i].w.Swap(0)
		if uint32(old>>32) == e {
			n += old & shardTokens
		}
	}
	return n
}

func (s *shards) refused() (n uint64) {
	for i := range s {
		n += s[i].refused.Load()
	}
	return n
}

func (s *shards) granted() (n uint64) {
	for i := range s {
		n += s[i].granted.Load()
	}
	return n
}

func (s *shards) count(proto, class int) (n uint64) {
	for j := range s {
		n += s[j].counts[proto][class].Load()
	}
	return n
}

// batchFor is how many admissions to reserve when room are free: one until
// the room is large, so that a rule near its limit decides one by one.
func batchFor(room int64) int64 {
	b := room / (4 * numShards)
	if b < 1 {
		return 1
	}
	if b > maxBatch {
		return maxBatch
	}
	return b
}
