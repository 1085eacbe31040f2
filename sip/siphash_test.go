package sip

import "testing"

// TestSipHashVectors checks the hash against the SipHash-2-4 reference
// vectors (key 00..0f, message 00..n-1), fed whole and byte by byte.
func TestSipHashVectors(t *testing.T) {
	key := make([]byte, 16)
	for i := range key {
		key[i] = byte(i)
	}
	k := newSipKey(key)
	for _, tc := range []struct {
		n    int
		want uint64
	}{
		{0, 0x726fdb47dd0e0e31},
		{1, 0x74f839c593dc67fd},
		{7, 0xab0200f58b01d137},
		{8, 0x93f5f5799a932462},
		{15, 0xa129ca6149be45e5},
		{16, 0x3f2acc7f57c29bdb},
	} {
		msg := make([]byte, tc.n)
		for i := range msg {
			msg[i] = byte(i)
		}
		h := k.hash()
		h.writeString(string(msg))
		if got := h.sum64(); got != tc.want {
			t.Errorf("len %d: %#x, want %#x", tc.n, got, tc.want)
		}
		h = k.hash()
		h.writeBytes(msg)
		if got := h.sum64(); got != tc.want {
			t.Errorf("len %d bytewise: %#x, want %#x", tc.n, got, tc.want)
		}
		if tc.n > 3 {
			h = k.hash()
			h.writeString(string(msg[:3]))
			h.writeString(string(msg[3:]))
			if got := h.sum64(); got != tc.want {
				t.Errorf("len %d split: %#x, want %#x", tc.n, got, tc.want)
			}
		}
	}
}
