package sip

import "math/bits"

// The dialog table's hashes (its keys, recorded To-tags and sources) are
// SipHash-2-4 with a 128-bit key. hash/maphash would do in memory, but its
// seed cannot be set: the keys of a table written to the store would mean
// nothing to the next process. With a key derived from the affinity key
// ring (dialogKeyLabel), the same Call-ID and From-tag give the same key
// after a restart, and nobody without the key can craft collisions.

// sipKey is a SipHash key.
type sipKey struct{ k0, k1 uint64 }

// newSipKey takes the first 16 bytes of b (little endian, as SipHash reads
// its key); b has at least 16.
func newSipKey(b []byte) sipKey {
	le := func(p []byte) uint64 {
		return uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24 |
			uint64(p[4])<<32 | uint64(p[5])<<40 | uint64(p[6])<<48 | uint64(p[7])<<56
	}
	return sipKey{k0: le(b[:8]), k1: le(b[8:16])}
}

// sipHash is the streaming state of one SipHash-2-4 sum; it lives on the
// caller's stack.
type sipHash struct {
	v0, v1, v2, v3 uint64
	tail           uint64 // bytes not yet in a block, little endian
	ntail          uint
	length         uint64
}

func (k sipKey) hash() sipHash {
	return sipHash{
		v0: k.k0 ^ 0x736f6d6570736575,
		v1: k.k1 ^ 0x646f72616e646f6d,
		v2: k.k0 ^ 0x6c7967656e657261,
		v3: k.k1 ^ 0x7465646279746573,
	}
}

// sipRound is one SipRound; small enough to be inlined.
func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13) ^ v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16) ^ v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21) ^ v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17) ^ v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

func (h *sipHash) block(m uint64) {
	v0, v1, v2, v3 := h.v0, h.v1, h.v2, h.v3^m
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	h.v0, h.v1, h.v2, h.v3 = v0^m, v1, v2, v3
}

func (h *sipHash) writeByte(c byte) {
	h.tail |= uint64(c) << (8 * h.ntail)
	h.ntail++
	h.length++
	if h.ntail == 8 {
		h.block(h.tail)
		h.tail, h.ntail = 0, 0
	}
}

func (h *sipHash) writeString(s string) {
	i := 0
	for ; h.ntail != 0 && i < len(s); i++ {
		h.writeByte(s[i])
	}
	if i+8 <= len(s) {
		v0, v1, v2, v3 := h.v0, h.v1, h.v2, h.v3
		for ; i+8 <= len(s); i += 8 {
			m := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
				uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
			v3 ^= m
			v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
			v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
			v0 ^= m
			h.length += 8
		}
		h.v0, h.v1, h.v2, h.v3 = v0, v1, v2, v3
	}
	for ; i < len(s); i++ {
		h.writeByte(s[i])
	}
}

func (h *sipHash) writeBytes(b []byte) {
	for _, c := range b {
		h.writeByte(c)
	}
}

func (h *sipHash) sum64() uint64 {
	h.block(h.length<<56 | h.tail)
	v0, v1, v2, v3 := h.v0, h.v1, h.v2^0xff, h.v3
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	return v0 ^ v1 ^ v2 ^ v3
}
