package accesslog

import (
	"sync/atomic"
)

// ring is a bounded multi-producer, single-consumer queue of records
// (Vyukov's bounded queue): a producer claims a slot with one CAS, copies
// the record in and publishes it; the writer takes slots in order. Every
// slot and its byte arena are allocated once, at New: putting and taking
// allocate nothing, and a full ring makes put fail at once.
type ring[T any] struct {
	mask  uint64
	slots []slot[T]
	_     [64]byte
	head  atomic.Uint64 // next position producers claim
	_     [56]byte
	tail  uint64 // next position the writer takes (writer only)
}

type slot[T any] struct {
	seq    atomic.Uint64
	rec    T
	arena  []byte // the copied bytes of rec (HTTP)
	logged bool   // the log's sampling took it
	sinks  uint64 // the sinks that want it
}

func newRing[T any](size, arena int) *ring[T] {
	n := 1
	for n < size {
		n <<= 1
	}
	r := &ring[T]{mask: uint64(n - 1), slots: make([]slot[T], n)}
	var all []byte
	if arena > 0 {
		all = make([]byte, n*arena)
	}
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
		if arena > 0 {
			r.slots[i].arena = all[i*arena : i*arena : (i+1)*arena]
		}
	}
	return r
}

// put copies src into a free slot with cp; false when the ring is full.
// pos is the slot's position in the ring's sequence (the writer is woken
// at every wakeEvery of them).
func (r *ring[T]) put(src *T, logged bool, sinks uint64, cp func(dst *T, arena []byte, src *T) []byte) (ok bool, pos uint64) {
	pos = r.head.Load()
	var s *slot[T]
	for {
		s = &r.slots[pos&r.mask]
		seq := s.seq.Load()
		switch d := int64(seq - pos); {
		case d == 0:
			if r.head.CompareAndSwap(pos, pos+1) {
				goto claimed
			}
			pos = r.head.Load()
		case d < 0:
			return false, pos // full: the writer has not taken this slot yet
		default:
			pos = r.head.Load()
		}
	}
claimed:
	s.arena = cp(&s.rec, s.arena[:0], src)
	s.logged, s.sinks = logged, sinks
	s.seq.Store(pos + 1)
	return true, pos
}

// take returns the next published slot, or nil when there is none; the
// writer hands it back with release once done with it.
func (r *ring[T]) take() *slot[T] {
	s := &r.slots[r.tail&r.mask]
	if s.seq.Load() != r.tail+1 {
		return nil
	}
	return s
}

func (r *ring[T]) release(s *slot[T]) {
	var zero T
	s.rec = zero // let go of the strings it holds
	s.seq.Store(r.tail + r.mask + 1)
	r.tail++
}

// clip appends b to arena within its capacity and returns the copy and
// the arena.
func clip(arena []byte, b []byte) ([]byte, []byte) {
	if len(b) == 0 {
		return nil, arena
	}
	room := cap(arena) - len(arena)
	if len(b) > room {
		b = b[:room]
	}
	start := len(arena)
	arena = append(arena, b...)
	return arena[start:len(arena):len(arena)], arena
}

func copyHTTP(dst *HTTPRecord, arena []byte, src *HTTPRecord) []byte {
	*dst = *src
	// The short fields first, each bounded, so a long path or host cannot
	// crowd them out; then the path, and the rest shares what is left.
	dst.Method, arena = clip(arena, cut(src.Method, 24))
	dst.RequestID, arena = clip(arena, cut(src.RequestID, 128))
	dst.Reason, arena = clip(arena, cut(src.Reason, 160))
	dst.Host, arena = clip(arena, cut(src.Host, 128))
	dst.SNI, arena = clip(arena, cut(src.SNI, 128))
	dst.Path, arena = clip(arena, src.Path)
	dst.Query, arena = clip(arena, src.Query)
	dst.UserAgent, arena = clip(arena, src.UserAgent)
	dst.Referer, arena = clip(arena, src.Referer)
	return arena
}

// cut is b's first n bytes at most.
func cut(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func copySIP(dst *SIPRecord, arena []byte, src *SIPRecord) []byte {
	*dst = *src
	return arena
}
