package sip

import (
	"bytes"
	"testing"

	"github.com/gobwas/ws"
)

// FuzzWSHeader: the frame header parser never panics, and a header it
// takes is the header gobwas/ws reads from the same bytes.
func FuzzWSHeader(f *testing.F) {
	f.Add([]byte{0x81, 0x85, 1, 2, 3, 4})
	f.Add([]byte{0x02, 0xfe, 0x01, 0x00, 9, 9, 9, 9})
	f.Add([]byte{0x80, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0})
	f.Add([]byte{0x89, 0x80, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, n, err := parseWSHeader(b)
		if err != nil || n == 0 {
			return
		}
		if n > len(b) || n > wsMaxHeader {
			t.Fatalf("header of %d bytes from %d", n, len(b))
		}
		want, werr := ws.ReadHeader(bytes.NewReader(b))
		if werr != nil {
			t.Fatalf("we took % x, gobwas refuses it: %v", b[:n], werr)
		}
		if got.fin != want.Fin || got.op != want.OpCode || got.masked != want.Masked || got.length != want.Length || got.masked && got.mask != want.Mask {
			t.Fatalf("% x: we read %+v, gobwas %+v", b[:n], got, want)
		}
	})
}
