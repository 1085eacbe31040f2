package lb

import (
	"math/rand/v2"
	"strings"
	"sync/atomic"
)

// poolPanic links a policy to the panic flag of the pool it serves, so
// that a backend down by its probes alone gets new work in that pool's
// panic and not in another's. Its zero value never panics.
type poolPanic struct {
	flag *atomic.Bool
}

// setPanic is called once by the pool, before the policy is used.
func (p *poolPanic) setPanic(f *atomic.Bool) { p.flag = f }

func (p *poolPanic) panicking() bool { return p.flag != nil && p.flag.Load() }

// panicLinker is implemented by every policy of this package.
type panicLinker interface{ setPanic(*atomic.Bool) }

// Policy picks the next candidate for new work. Select returns the index in
// bs of a backend that accepts new work at now and is not in tried, or -1
// when there is none. Pool.Pick calls it again, with the refused candidate
// added to tried, when a candidate's MOP refuses.
//
// A policy serves one pool: bs is always that pool's backends, and the
// indices are positions in it (never Backend.Index, since a backend may be
// in several pools). The policies of this package built by a Pool follow
// that pool's panic (Pool.Panicking); built alone by NewPolicy they never
// panic.
//
// Select is on every request's path: it must be safe for concurrent use,
// take no lock and allocate nothing. tried is passed by value (128 bytes)
// because a pointer passed through an interface escapes to the heap.
type Policy interface {
	Select(bs []*Backend, now int64, key uint64, tried Set) int
}

// Interface guards.
var (
	_ Policy = (*RoundRobin)(nil)
	_ Policy = (*WeightedRoundRobin)(nil)
	_ Policy = (*LeastOutstanding)(nil)
	_ Policy = (*PowerOfTwo)(nil)
	_ Policy = (*ConsistentHash)(nil)
)

// PolicyNames lists the names NewPolicy accepts.
var PolicyNames = []string{"round-robin", "weighted-round-robin", "least-outstanding", "p2c", "consistent-hash"}

// NewPolicy builds the policy called name for bs: "round-robin" (default
// for ""), "weighted-round-robin" (smooth, nginx-style), "least-outstanding",
// "p2c" (power of two choices) or "consistent-hash" (Maglev over the key).
// A few aliases are accepted: rr, wrr, least, least-conn, random-two, hash,
// maglev.
func NewPolicy(name string, bs []*Backend) (Policy, error) {
	canon, err := PolicyName(name)
	if err != nil {
		return nil, err
	}
	if len(bs) == 0 {
		// A Maglev table of no backends would never fill: refuse here
		// rather than loop (NewPool refuses empty pools anyway).
		return nil, ErrNoBackends
	}
	switch canon {
	case "weighted-round-robin":
		return NewWeightedRoundRobin(bs), nil
	case "least-outstanding":
		return &LeastOutstanding{}, nil
	case "p2c":
		return &PowerOfTwo{}, nil
	case "consistent-hash":
		return NewConsistentHash(bs), nil
	}
	return &RoundRobin{}, nil
}

// PolicyName returns the name in PolicyNames that name (or an alias of
// NewPolicy, "" for round-robin) stands for, or a *FieldError naming the
// known ones: to check a policy without building it.
func PolicyName(name string) (string, error) {
	switch strings.ToLower(name) {
	case "", "round-robin", "roundrobin", "rr":
		return "round-robin", nil
	case "weighted-round-robin", "wrr", "smooth-weighted-round-robin":
		return "weighted-round-robin", nil
	case "least-outstanding", "least", "least-conn", "leastconn", "least-request":
		return "least-outstanding", nil
	case "p2c", "power-of-two", "random-two":
		return "p2c", nil
	case "consistent-hash", "hash", "maglev":
		return "consistent-hash", nil
	}
	return "", fieldError("PoolConfig.Policy", "%q: unknown (want one of %s)", name, strings.Join(PolicyNames, ", "))
}

// eligible reports whether bs[i] may be tried for new work, in a pool
// in panic or not.
func eligible(bs []*Backend, i int, now int64, tried *Set, panicking bool) bool {
	return !tried.Has(i) && bs[i].acceptsNew(now, panicking)
}

// RoundRobin takes backends in turn, ignoring weights, skipping those that
// do not accept new work. The zero value is ready to use.
type RoundRobin struct {
	poolPanic
	next atomic.Uint64
}

// Select implements Policy.
func (r *RoundRobin) Select(bs []*Backend, now int64, _ uint64, tried Set) int {
	n := uint64(len(bs))
	start := r.next.Add(1) - 1
	pan := r.panicking()
	for j := uint64(0); j < n; j++ {
		i := int((start + j) % n)
		if eligible(bs, i, now, &tried, pan) {
			return i
		}
	}
	return -1
}

// maxSequence bounds the precomputed weighted sequence; larger weight sums
// are scaled down.
const maxSequence = 4096

// WeightedRoundRobin is nginx's smooth weighted round robin: over a cycle of
// sum(weights) picks each backend gets its weight's share, interleaved
// rather than in bursts (weights 5,1,1 give a a b a c a a). The cycle is
// computed once, so Select is one atomic add and an index; a backend that
// does not accept new work passes its turn to the next entry.
type WeightedRoundRobin struct {
	poolPanic
	seq  []uint16
	next atomic.Uint64
}

// NewWeightedRoundRobin precomputes the smooth sequence for bs.
func NewWeightedRoundRobin(bs []*Backend) *WeightedRoundRobin {
	w := make([]int, len(bs))
	total := 0
	for i, b := range bs {
		w[i] = b.Weight()
		total += w[i]
	}
	if total > maxSequence {
		sum := total
		total = 0
		for i := range w {
			w[i] = max(1, w[i]*maxSequence/sum)
			total += w[i]
		}
	}
	if g := gcdAll(w); g > 1 {
		total = 0
		for i := range w {
			w[i] /= g
			total += w[i]
		}
	}
	seq := make([]uint16, 0, total)
	cur := make([]int, len(w))
	for range total {
		best := 0
		for i := range w {
			cur[i] += w[i]
			if cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= total
		seq = append(seq, uint16(best))
	}
	return &WeightedRoundRobin{seq: seq}
}

func gcdAll(w []int) int {
	g := 0
	for _, x := range w {
		for x != 0 {
			g, x = x, g%x
		}
	}
	return g
}

// Select implements Policy.
func (r *WeightedRoundRobin) Select(bs []*Backend, now int64, _ uint64, tried Set) int {
	n := uint64(len(r.seq))
	start := r.next.Add(1) - 1
	pan := r.panicking()
	for j := uint64(0); j < n; j++ {
		i := int(r.seq[(start+j)%n])
		if i < len(bs) && eligible(bs, i, now, &tried, pan) {
			return i
		}
	}
	return -1
}

// LeastOutstanding takes the backend with the fewest requests in flight
// relative to its weight. Ties go to the larger MOP headroom, then in turn.
// The zero value is ready to use.
type LeastOutstanding struct {
	poolPanic
	next atomic.Uint64
}

// better reports whether bs[i] is a better candidate than bs[j].
func better(bs []*Backend, i, j int, now int64) bool {
	a, b := bs[i], bs[j]
	// o_a/w_a < o_b/w_b without division.
	l, r := a.outstanding.Load()*int64(b.weight.Load()), b.outstanding.Load()*int64(a.weight.Load())
	if l != r {
		return l < r
	}
	if a.mop == nil && b.mop == nil {
		return false
	}
	return a.mop.Headroom(now) > b.mop.Headroom(now)
}

// Select implements Policy.
func (r *LeastOutstanding) Select(bs []*Backend, now int64, _ uint64, tried Set) int {
	n := uint64(len(bs))
	start := r.next.Add(1) - 1
	best := -1
	pan := r.panicking()
	for j := uint64(0); j < n; j++ {
		i := int((start + j) % n)
		if !eligible(bs, i, now, &tried, pan) {
			continue
		}
		if best < 0 || better(bs, i, best, now) {
			best = i
		}
	}
	return best
}

// PowerOfTwo samples two eligible backends at random and takes the one with
// fewer requests in flight relative to its weight (ties: MOP headroom). It
// avoids the herding of least-outstanding when many balancers share
// backends. The zero value is ready to use.
type PowerOfTwo struct {
	poolPanic
	fallback LeastOutstanding
}

// setPanic links the fallback too.
func (r *PowerOfTwo) setPanic(f *atomic.Bool) { r.flag = f; r.fallback.setPanic(f) }

// Select implements Policy.
func (r *PowerOfTwo) Select(bs []*Backend, now int64, _ uint64, tried Set) int {
	n := len(bs)
	pan := r.panicking()
	if n == 1 {
		if eligible(bs, 0, now, &tried, pan) {
			return 0
		}
		return -1
	}
	// A few random draws find two eligible backends when most are; when
	// few are, scanning is cheaper and exact.
	a, b := -1, -1
	for range 4 {
		i := int(rand.Uint64N(uint64(n)))
		if i == a || !eligible(bs, i, now, &tried, pan) {
			continue
		}
		if a < 0 {
			a = i
			continue
		}
		b = i
		break
	}
	if b < 0 {
		return r.fallback.Select(bs, now, 0, tried)
	}
	if better(bs, b, a, now) {
		return b
	}
	return a
}

// maglevSmall and maglevLarge are the lookup table sizes (primes, at least
// 100 entries per backend as the Maglev paper advises).
const (
	maglevSmall = 65537
	maglevLarge = 655373
)

// ConsistentHash is Maglev hashing (Eisenbud et al., NSDI 2016) of the key
// onto backends, weighted: a backend with weight w fills w table slots per
// round. The same key goes to the same backend while it accepts new work;
// when it does not, the key walks on through the table, so its fallback is
// stable too and keys of healthy backends never move.
type ConsistentHash struct {
	poolPanic
	table []uint16
}

// NewConsistentHash builds the Maglev table for bs, from their ids: the
// same ids and weights give the same table after a restart.
func NewConsistentHash(bs []*Backend) *ConsistentHash {
	m := uint64(maglevSmall)
	if len(bs) > maglevSmall/100 {
		m = maglevLarge
	}
	offset := make([]uint64, len(bs))
	skip := make([]uint64, len(bs))
	next := make([]uint64, len(bs))
	for i, b := range bs {
		h := Hash(b.id)
		offset[i] = mix(h^0x9e3779b97f4a7c15) % m
		skip[i] = mix(h^0xc2b2ae3d27d4eb4f)%(m-1) + 1
	}
	table := make([]uint16, m)
	filled := make([]bool, m)
	var count uint64
	for count < m {
		for i, b := range bs {
			for range b.Weight() {
				c := (offset[i] + next[i]*skip[i]) % m
				for filled[c] {
					next[i]++
					c = (offset[i] + next[i]*skip[i]) % m
				}
				table[c] = uint16(i)
				filled[c] = true
				next[i]++
				count++
				if count == m {
					return &ConsistentHash{table: table}
				}
			}
		}
	}
	return &ConsistentHash{table: table}
}

// Select implements Policy.
func (r *ConsistentHash) Select(bs []*Backend, now int64, key uint64, tried Set) int {
	// Walking the table for an eligible backend costs about
	// len(bs)/eligible steps; make sure there is one first.
	found := false
	pan := r.panicking()
	for i := range bs {
		if eligible(bs, i, now, &tried, pan) {
			found = true
			break
		}
	}
	if !found {
		return -1
	}
	m := uint64(len(r.table))
	start := mix(key) % m
	for j := uint64(0); j < m; j++ {
		i := int(r.table[(start+j)%m])
		if i < len(bs) && eligible(bs, i, now, &tried, pan) {
			return i
		}
	}
	return -1
}

// Hash returns a 64-bit hash of s (FNV-1a) for Pick's key. It allocates
// nothing.
func Hash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// HashBytes is Hash for a byte slice.
func HashBytes(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

// mix is the splitmix64 finalizer: it spreads FNV's weak low bits before
// reducing modulo the table size.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
