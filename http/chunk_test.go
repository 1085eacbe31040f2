package http

import (
	"strings"
	"testing"
)

// TestChunkScan: golden chunked bodies (RFC 9112 §7.1), followed by bytes
// of the next answer, fed whole, byte by byte and in two pieces: the end is
// found at the same place every way, and malformed bodies are errors.
func TestChunkScan(t *testing.T) {
	const next = "HTTP/1.1 200 OK\r\n"
	valid := []struct{ name, body string }{
		{"empty", "0\r\n\r\n"},
		{"one chunk", "5\r\nhello\r\n0\r\n\r\n"},
		{"two chunks", "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"},
		{"hex sizes", "a\r\n0123456789\r\nA\r\n0123456789\r\n0\r\n\r\n"},
		{"extensions", "5;name=value\r\nhello\r\n0;last\r\n\r\n"},
		{"trailers", "5\r\nhello\r\n0\r\nExpires: never\r\nX-Sum: 1\r\n\r\n"},
		{"bare LF", "5\nhello\n0\n\n"},
		{"data holding CRLF", "4\r\n\r\n\r\n\r\n0\r\n\r\n"},
		{"leading zeros", "0005\r\nhello\r\n000\r\n\r\n"},
	}
	for _, tc := range valid {
		in := tc.body + next
		// whole
		var c chunkScan
		n, done, err := c.feed([]byte(in))
		if err != nil || !done || n != len(tc.body) {
			t.Errorf("%s whole: n=%d done=%v err=%v, want n=%d done", tc.name, n, done, err, len(tc.body))
		}
		// byte by byte
		c = chunkScan{}
		end := -1
		for i := 0; i < len(in); i++ {
			n, done, err := c.feed([]byte{in[i]})
			if err != nil {
				t.Fatalf("%s byte %d: %v", tc.name, i, err)
			}
			if done {
				if n != 1 {
					t.Errorf("%s byte %d: n=%d at the end, want 1", tc.name, i, n)
				}
				end = i + 1
				break
			}
			if n != 1 {
				t.Fatalf("%s byte %d: n=%d, want 1", tc.name, i, n)
			}
		}
		if end != len(tc.body) {
			t.Errorf("%s byte by byte: end at %d, want %d", tc.name, end, len(tc.body))
		}
		// every split into two pieces
		for k := 0; k < len(tc.body); k++ {
			c = chunkScan{}
			n1, done1, err1 := c.feed([]byte(in[:k]))
			if err1 != nil || done1 || n1 != k {
				t.Fatalf("%s split %d first: %d %v %v", tc.name, k, n1, done1, err1)
			}
			n2, done2, err2 := c.feed([]byte(in[k:]))
			if err2 != nil || !done2 || k+n2 != len(tc.body) {
				t.Errorf("%s split %d: end at %d done=%v err=%v, want %d", tc.name, k, k+n2, done2, err2, len(tc.body))
			}
		}
	}
	invalid := []struct{ name, body string }{
		{"no size", "\r\nhello\r\n0\r\n\r\n"},
		{"bad digit", "5x\r\nhello\r\n0\r\n\r\n"},
		{"data longer than size", "3\r\nhello\r\n0\r\n\r\n"},
		{"CR without LF", "5\rhello\r\n0\r\n\r\n"},
		{"size overflow", strings.Repeat("f", 20) + "\r\n"},
		{"negative", "-5\r\nhello\r\n0\r\n\r\n"},
	}
	for _, tc := range invalid {
		var c chunkScan
		if _, done, err := c.feed([]byte(tc.body)); err == nil {
			t.Errorf("%s: no error (done=%v)", tc.name, done)
		}
	}
}

func BenchmarkChunkScan(b *testing.B) {
	body := []byte(strings.Repeat("400\r\n"+strings.Repeat("x", 1024)+"\r\n", 16) + "0\r\n\r\n")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var c chunkScan
		if _, done, err := c.feed(body); !done || err != nil {
			b.Fatal(done, err)
		}
	}
}
