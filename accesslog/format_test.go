package accesslog

import (
	"testing"
	"time"
)

// TestAppendJSONInner: every escape, at the start, the middle and the end
// of runs of bytes that need none.
func TestAppendJSONInner(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain/path?x=1", "plain/path?x=1"},
		{`"`, `\"`},
		{`a"b\c`, `a\"b\\c`},
		{"line\nbreak\r\ttab", `line\nbreak\r\ttab`},
		{"\x00\x1f\x7f", `\u0000\u001f\u007f`},
		{"end\x01", `end\u0001`},
		{"caf\u00e9 \u20ac", "caf\u00e9 \u20ac"},
		{"\xff", `\ufffd`},
		{"a\xe2\x82", `a\ufffd\ufffd`}, // a rune cut short
		{"x\u2028y\u2029", `x\u2028y\u2029`},
		{"evil\u202egnp.exe", `evil\u202egnp.exe`},                   // right-to-left override
		{"a\u2066b\u2069\u200e\u200f", `a\u2066b\u2069\u200e\u200f`}, // isolates, marks
		{"nel\u0085\u0080\u009f", `nel\u0085\u0080\u009f`},           // C1 controls
		{"\u202f\u2070\u00a0", "\u202f\u2070\u00a0"},                 // their neighbours stay
		{"x\ufeff", "x\ufeff"},
		{"\U0001F600!", "\U0001F600!"},
	} {
		if got := string(appendJSONInner([]byte("<"), tc.in)); got != "<"+tc.want {
			t.Errorf("%q: got %q, want %q", tc.in, got[1:], tc.want)
		}
		if got := string(appendJSONInner(nil, []byte(tc.in))); got != tc.want {
			t.Errorf("%q as bytes: got %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestStampCache: the cached timestamps are the formatted ones, whatever
// the order of the times (same millisecond, next, earlier, another
// second, another location).
func TestStampCache(t *testing.T) {
	base := time.Date(2026, 12, 1, 14, 2, 3, 456_000_000, time.UTC)
	east := time.FixedZone("east", 3*3600)
	times := []time.Time{
		base,
		base.Add(400 * time.Microsecond), // same millisecond
		base.Add(time.Millisecond),       // the next
		base.Add(-time.Millisecond),      // an earlier one
		base.Add(time.Second),            // another second
		base.Add(time.Second).In(east),   // the same instant elsewhere
		base.Add(time.Second + time.Nanosecond).In(east),
		base.Add(time.Second),
		time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC), // too long to cache
		base,
	}
	var c stampCache
	for i, tm := range times {
		if got, want := string(c.appendISO([]byte("x"), tm)), "x"+tm.UTC().Format(isoLayout); got != want {
			t.Errorf("%d iso: got %q, want %q", i, got, want)
		}
		if got, want := string(c.appendCLF([]byte("x"), tm)), "x"+tm.Format(clfLayout); got != want {
			t.Errorf("%d clf: got %q, want %q", i, got, want)
		}
	}
	var none *stampCache
	if got, want := string(none.appendISO(nil, base)), "2026-12-01T14:02:03.456Z"; got != want {
		t.Errorf("no cache: got %q, want %q", got, want)
	}
}
