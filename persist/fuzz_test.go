package persist

import (
	"bytes"
	"testing"
	"time"
)

// FuzzDecodeMOP: a stored state either fails to decode or decodes to a
// usable state that encodes and decodes to the same value.
func FuzzDecodeMOP(f *testing.F) {
	for _, seed := range []string{
		`{"phase":1,"learned_rate":120.5,"allowed_rate":120.5,"base":0.2,"slope":0.001,"updated_at":"2026-11-29T15:00:00Z"}`,
		`{"phase":0,"allowed_rate":10}`,
		`{"phase":2}`,
		`{"learned_rate":-1}`,
		`{"base":1e309}`,
		`{"updated_at":"not a time"}`,
		`null`, `[]`, `{`, ``, `{"phase":1}{"phase":0}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		st, err := decodeMOP(v)
		if err != nil {
			return
		}
		enc, err := encodeMOP(st)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", st, err)
		}
		st2, err := decodeMOP(enc)
		if err != nil || !sameState(st, st2) {
			t.Fatalf("round trip of %+v gave %+v, %v", st, st2, err)
		}
	})
}

// FuzzDecodeEvent: a stored event either fails to decode or decodes to an
// event with a time and a kind that survives a round trip.
func FuzzDecodeEvent(f *testing.F) {
	for _, seed := range []string{
		`{"time":"2026-11-29T15:00:00Z","kind":"memory.state","subject":"node","message":"normal -> low"}`,
		`{"time":"2026-11-29T15:00:00.123456789+09:00","kind":"arm.engaged","message":""}`,
		`{"time":"0001-01-01T00:00:00Z","kind":"x","message":"zero time"}`,
		`{"kind":"x"}`, `{"time":"2026-11-29T15:00:00Z"}`,
		`null`, `"x"`, `{`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		ev, err := decodeEvent(v)
		if err != nil {
			return
		}
		if ev.Kind == "" || ev.Time.IsZero() {
			t.Fatalf("decoded %+v without time or kind", ev)
		}
		enc, err := encodeEvent(ev)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", ev, err)
		}
		ev2, err := decodeEvent(enc)
		if err != nil || !ev2.Time.Equal(ev.Time) || string(ev2.Kind) != cut(string(ev.Kind), maxText) ||
			ev2.Subject != cut(ev.Subject, maxText) || ev2.Message != cut(ev.Message, maxText) {
			t.Fatalf("round trip of %+v gave %+v, %v", ev, ev2, err)
		}
	})
}

// FuzzDecodeEventKey: a key either fails to decode or is 19 bytes whose
// fields rebuild it.
func FuzzDecodeEventKey(f *testing.F) {
	f.Add(eventKey(t0, 1))
	f.Add(eventKey(time.Unix(0, 0), 0))
	f.Add([]byte("ev/"))
	f.Add([]byte("ev/\xff\xff\xff\xff\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Add([]byte("mop/http/a:1"))
	f.Fuzz(func(t *testing.T, k []byte) {
		nanos, seq, err := decodeEventKey(k)
		if err != nil {
			return
		}
		if got := eventKey(time.Unix(0, int64(nanos)), seq); !bytes.Equal(got, k) {
			t.Fatalf("key %x decoded to (%d, %d), which encodes to %x", k, nanos, seq, got)
		}
	})
}

// FuzzParseMOPKey: a stored key either fails to parse or names a
// protocol and an address that give the key back.
func FuzzParseMOPKey(f *testing.F) {
	for _, seed := range []string{"mop/http/127.0.0.1:18081", "mop/sip/[::1]:5060", "mop/http/", "mop//a",
		"mop/noslash", "mop/http/a b", "mop/http/\x00", "ev/x", "mop/http/a/b"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, k []byte) {
		key, err := parseMOPKey(k)
		if err != nil {
			return
		}
		if err := checkMOPKey(key); err != nil {
			t.Fatalf("parsed key %q fails its own check: %v", key, err)
		}
		if "mop/"+key != string(k) {
			t.Fatalf("key %q parsed to %q", k, key)
		}
	})
}

// FuzzParseSince: query values never panic, and a duration never gives a
// time after now.
func FuzzParseSince(f *testing.F) {
	for _, seed := range []string{"", "2026-11-29T15:00:00Z", "2026-11-29T15:00:00.5+01:00", "15m", "-1h", "0s", "x", "9999999h"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseSince(v, t0)
		if err == nil && got.After(t0) {
			if _, perr := time.Parse(time.RFC3339Nano, v); perr != nil {
				t.Fatalf("ParseSince(%q) = %v, after now", v, got)
			}
		}
		if n, err := ParseLimit(v); err == nil && (n < 1 || n > MaxEventsLimit) {
			t.Fatalf("ParseLimit(%q) = %d", v, n)
		}
	})
}
