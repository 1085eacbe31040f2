package lb

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// t0 is the "now" of most tests.
var t0 = time.Unix(1_800_000_000, 0)

func newTestSigner(t testing.TB) *Signer {
	t.Helper()
	s, err := NewSigner(testKey)
	if err != nil {
		t.Fatalf("NewSigner: %v", err)
	}
	return s
}

func ringSigner(t testing.TB, ring ...Key) *Signer {
	t.Helper()
	s, err := NewRingSigner(ring)
	if err != nil {
		t.Fatalf("NewRingSigner: %v", err)
	}
	return s
}

// counter is a nonce source that yields 0, 1, 2, ... so that tokens are
// reproducible.
type counter struct{ n byte }

func (c *counter) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = c.n
		c.n++
	}
	return len(p), nil
}

func decode(t *testing.T, tok string) []byte {
	t.Helper()
	raw, err := b64.DecodeString(tok)
	if err != nil {
		t.Fatalf("decode %q: %v", tok, err)
	}
	return raw
}

func TestSignerRoundTrip(t *testing.T) {
	s := newTestSigner(t)
	for _, id := range []string{"", "b1", "127.0.0.1:18081", "sip:10.0.0.7:5060;transport=tcp", strings.Repeat("x", 255)} {
		tok := s.Token(id, t0.Add(time.Hour))
		if strings.ContainsAny(tok, ";,= \"'+/") {
			t.Errorf("Token(%q) = %q contains a character unsafe in a cookie or SIP parameter", id, tok)
		}
		if want := (4*(v2Overhead+len(id)) + 2) / 3; len(tok) != want {
			t.Errorf("Token(%q) has %d characters, want %d", id, len(tok), want)
		}
		got, exp, ok := s.VerifyExpiry(tok, t0)
		if !ok || got != id || !exp.Equal(t0.Add(time.Hour)) {
			t.Errorf("VerifyExpiry(Token(%q)) = %q, %v, %v; want %q, %v, true", id, got, exp, ok, id, t0.Add(time.Hour))
		}
	}
}

func TestSignerLongIDTruncated(t *testing.T) {
	s := newTestSigner(t)
	id := strings.Repeat("y", 300)
	got, ok := s.Verify(s.Token(id, t0.Add(time.Minute)), t0)
	if !ok || got != id[:255] {
		t.Fatalf("Verify = %d bytes, %v; want 255 bytes, true", len(got), ok)
	}
}

func TestSignerExpiry(t *testing.T) {
	s := newTestSigner(t)
	tok := s.Token("b1", t0.Add(10*time.Second))
	tests := []struct {
		name string
		now  time.Time
		want bool
	}{
		{"well before", t0, true},
		{"one second before", t0.Add(9 * time.Second), true},
		{"at expiry", t0.Add(10 * time.Second), false},
		{"after expiry", t0.Add(time.Hour), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := s.Verify(tok, tc.now); ok != tc.want {
				t.Errorf("Verify at %v: ok = %v, want %v", tc.now.Sub(t0), ok, tc.want)
			}
		})
	}
}

// TestTokenExpiryClamped: expiries outside the 32-bit range are clamped,
// never wrapped into a far future or an early past.
func TestTokenExpiryClamped(t *testing.T) {
	s := newTestSigner(t)
	if _, ok := s.Verify(s.Token("b1", time.Unix(-5, 0)), time.Unix(0, 0)); ok {
		t.Error("token that expired before 1970 accepted at 1970")
	}
	_, exp, ok := s.VerifyExpiry(s.Token("b1", time.Unix(1<<40, 0)), t0)
	if !ok || exp.Unix() != 1<<32-1 {
		t.Errorf("far expiry: %v %v, want %d true", exp.Unix(), ok, int64(1<<32-1))
	}
}

// TestTokenRejected: every way a token can be wrong, in one table. Each
// case must also be refused by a ring that holds the right key.
func TestTokenRejected(t *testing.T) {
	oldKey := Key{ID: 1, Secret: []byte("old key, sixteen+ bytes long....")}
	newKey := Key{ID: 2, Secret: []byte("new key, sixteen+ bytes long....")}
	// twin has the same secret as newKey under another id: only the
	// authenticated key id tells them apart.
	twin := Key{ID: 3, Secret: newKey.Secret}
	ring := ringSigner(t, oldKey, twin, newKey)
	good := ring.Token("127.0.0.1:18081", t0.Add(time.Hour))
	raw := decode(t, good)
	if raw[1] != newKey.ID {
		t.Fatalf("sealed with key %d, want the newest (%d)", raw[1], newKey.ID)
	}
	with := func(f func(b []byte) []byte) string { return b64.EncodeToString(f(bytes.Clone(raw))) }

	tests := []struct {
		name  string
		token string
		s     *Signer
		now   time.Time
	}{
		{"expired", good, ring, t0.Add(time.Hour)},
		{"wrong key id (same secret)", with(func(b []byte) []byte { b[1] = twin.ID; return b }), ring, t0},
		{"wrong key id (other secret)", with(func(b []byte) []byte { b[1] = oldKey.ID; return b }), ring, t0},
		{"unknown key id", with(func(b []byte) []byte { b[1] = 200; return b }), ring, t0},
		{"key removed from ring", good, ringSigner(t, oldKey, twin), t0},
		{"other key under the same id", good, ringSigner(t, Key{ID: newKey.ID, Secret: oldKey.Secret}), t0},
		{"version 1 byte", with(func(b []byte) []byte { b[0] = tokenV1; return b }), ring, t0},
		{"version 3", with(func(b []byte) []byte { b[0] = 3; return b }), ring, t0},
		{"nonce changed", with(func(b []byte) []byte { b[5] ^= 1; return b }), ring, t0},
		{"tag changed", with(func(b []byte) []byte { b[len(b)-1] ^= 0x80; return b }), ring, t0},
		{"tag dropped", with(func(b []byte) []byte { return b[:len(b)-tagSize] }), ring, t0},
		{"byte appended", with(func(b []byte) []byte { return append(b, 0) }), ring, t0},
		{"character appended", good + "A", ring, t0},
		{"line break inside", good[:10] + "\n" + good[10:], ring, t0},
		{"padding", good + "==", ring, t0},
		{"header only", with(func(b []byte) []byte { return b[:headerSize] }), ring, t0},
		{"empty", "", ring, t0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if id, ok := tc.s.Verify(tc.token, tc.now); ok {
				t.Errorf("Verify(%q) = %q, true; want false", tc.token, id)
			}
		})
	}
	t.Run("every bit flipped", func(t *testing.T) {
		for i := range raw {
			for bit := 0; bit < 8; bit++ {
				m := bytes.Clone(raw)
				m[i] ^= 1 << bit
				if id, ok := ring.Verify(b64.EncodeToString(m), t0); ok {
					t.Fatalf("byte %d bit %d flipped: Verify = %q, true; want false", i, bit, id)
				}
			}
		}
	})
	t.Run("every truncation", func(t *testing.T) {
		for n := range len(good) {
			if id, ok := ring.Verify(good[:n], t0); ok {
				t.Fatalf("first %d characters: Verify = %q, true; want false", n, id)
			}
		}
	})
	if _, ok := ring.Verify(good, t0); !ok {
		t.Fatal("the untouched token was refused: the cases above prove nothing")
	}
}

// TestTokenHidesBackend is the security finding this format fixes: the
// decoded bytes of a token contain neither the backend id nor its address
// or port, for the HTTP cookie and for the SIP Record-Route subject.
func TestTokenHidesBackend(t *testing.T) {
	s := newTestSigner(t)
	tests := []struct {
		id    string
		parts []string // pieces of id that must not show either
	}{
		{"127.0.0.1:18081", []string{"127.0.0.1", "18081", "\x7f\x00\x00\x01"}},
		{"10.20.30.40:8080", []string{"10.20.30.40", "8080", "\x0a\x14\x1e\x28"}},
		{"[fd00::7]:5060|3kq1z0v2a8m5c", []string{"fd00::7", "5060", "3kq1z0v2a8m5c"}},
		{"backend-eu-west-1", []string{"backend", "west"}},
	}
	for _, tc := range tests {
		for i := range 50 {
			raw := decode(t, s.Token(tc.id, t0.Add(time.Hour)))
			for _, p := range append([]string{tc.id}, tc.parts...) {
				if bytes.Contains(raw, []byte(p)) {
					t.Fatalf("token %d for %q contains %q: % x", i, tc.id, p, raw)
				}
			}
			if exp := make([]byte, 4); bytes.Contains(raw, binary.BigEndian.AppendUint32(exp[:0], uint32(t0.Add(time.Hour).Unix()))) {
				t.Fatalf("token %d for %q carries its expiry in the clear", i, tc.id)
			}
		}
	}
	// Two tokens for the same backend and expiry look unrelated.
	a, b := s.Token("b1", t0.Add(time.Hour)), s.Token("b1", t0.Add(time.Hour))
	if a == b {
		t.Errorf("two tokens for the same backend are equal (%q): the nonce is not random", a)
	}
}

// TestTokenV2Layout rebuilds a token from the documented layout with the
// standard library alone (HKDF-SHA256, AES-256-GCM) and compares it with
// Token's, byte for byte.
func TestTokenV2Layout(t *testing.T) {
	s := ringSigner(t, Key{ID: 7, Secret: testKey})
	s.nonces = &counter{}
	got := decode(t, s.Token("b1", time.Unix(1_800_003_600, 0)))

	k, err := hkdf.Key(sha256.New, testKey, nil, "sluice affinity token v2 aes-256-gcm", 32)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := aes.NewCipher(k)
	gcm, _ := cipher.NewGCM(block)
	nonce := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	plain := append(binary.BigEndian.AppendUint32(nil, 1_800_003_600), "b1"...)
	want := append([]byte{2, 7}, nonce...)
	want = gcm.Seal(want, nonce, plain, []byte{2, 7})
	if !bytes.Equal(got, want) {
		t.Fatalf("token\n got % x\nwant % x", got, want)
	}
}

// TestTokenGolden pins the wire format: tokens issued by earlier builds
// stay valid. The version 2 vector is Token("127.0.0.1:18081", 1800003600)
// under key 7 = testKey with nonce 00 01 .. 0b; the version 1 vectors
// were issued by the release before encryption, under testKey.
func TestTokenGolden(t *testing.T) {
	tests := []struct {
		name  string
		token string
		id    string
		exp   int64
	}{
		{"v2 cookie", "AgcAAQIDBAUGBwgJCgtLDWtLF2CHhhFbeUP5EfAtSJ71WRnxq26gN8wkSuf-J3zQJg", "127.0.0.1:18081", 1_800_003_600},
		{"v1 cookie", "AQAAAABrSeAQDzEyNy4wLjAuMToxODA4MdT3uA9JrJ0R4yFgzOeYHFc", "127.0.0.1:18081", 1_800_003_600},
		{"v1 sip subject", "AQAAAABrSyOAGzEwLjAuMC43OjUwNjB8M2txMXowdjJhOG01Y34jlJ6QSdzFsorzwAkIFLM", "10.0.0.7:5060|3kq1z0v2a8m5c", 1_800_086_400},
	}
	ring := ringSigner(t, Key{ID: 0, Secret: testKey}, Key{ID: 7, Secret: testKey})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, exp, ok := ring.VerifyExpiry(tc.token, t0)
			if !ok || id != tc.id || exp.Unix() != tc.exp {
				t.Errorf("VerifyExpiry = %q, %d, %v; want %q, %d, true", id, exp.Unix(), ok, tc.id, tc.exp)
			}
		})
	}
	s := ringSigner(t, Key{ID: 7, Secret: testKey})
	s.nonces = &counter{}
	if got := s.Token("127.0.0.1:18081", time.Unix(1_800_003_600, 0)); got != tests[0].token {
		t.Errorf("Token = %q, want the golden %q", got, tests[0].token)
	}
}

// TestVersion1OnlyWithKey0: a version 1 token (issued before tokens were
// encrypted) is accepted while key 0, the single-key file, is in the
// ring, and refused once it is gone; it is never issued.
func TestVersion1OnlyWithKey0(t *testing.T) {
	const v1 = "AQAAAABrSeAQDzEyNy4wLjAuMToxODA4MdT3uA9JrJ0R4yFgzOeYHFc"
	newKey := Key{ID: 1, Secret: []byte("new key, sixteen+ bytes long....")}
	tests := []struct {
		name string
		ring []Key
		want bool
	}{
		{"single key", []Key{{0, testKey}}, true},
		{"key 0 kept after rotation", []Key{{0, testKey}, newKey}, true},
		{"key 0 removed", []Key{newKey}, false},
		{"same secret, other id", []Key{{5, testKey}}, false},
		{"other key 0", []Key{{0, newKey.Secret}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := ringSigner(t, tc.ring...)
			if _, ok := s.Verify(v1, t0); ok != tc.want {
				t.Errorf("Verify(v1) ok = %v, want %v", ok, tc.want)
			}
			if raw := decode(t, s.Token("b1", t0.Add(time.Hour))); raw[0] != tokenV2 {
				t.Errorf("issued a version %d token", raw[0])
			}
		})
	}
	// Forged version 1 tokens: a MAC from a real token over another body.
	raw := decode(t, v1)
	forged := append([]byte{tokenV1, 0, 0, 0, 0, 0x7f, 0, 0, 0, 2, 'b', '2'}, raw[len(raw)-macSize:]...)
	if _, ok := newTestSigner(t).Verify(b64.EncodeToString(forged), t0); ok {
		t.Error("forged version 1 token verified")
	}
	for i := range raw {
		m := bytes.Clone(raw)
		m[i] ^= 0x10
		if _, ok := newTestSigner(t).Verify(b64.EncodeToString(m), t0); ok {
			t.Fatalf("version 1 token with byte %d changed verified", i)
		}
	}
}

// TestRotation walks the operator's procedure: tokens sealed with the old
// key stay valid while it is listed, new tokens use the newest key, and
// removing the old key ends its tokens.
func TestRotation(t *testing.T) {
	oldKey := Key{ID: 1, Secret: []byte("old key, sixteen+ bytes long....")}
	newKey := Key{ID: 2, Secret: []byte("new key, sixteen+ bytes long....")}
	before := ringSigner(t, oldKey)
	oldTok := before.Token("b1", t0.Add(time.Hour))

	// Step 1 (cluster): the new key is listed everywhere but not newest.
	staged := ringSigner(t, newKey, oldKey)
	if raw := decode(t, staged.Token("b1", t0.Add(time.Hour))); raw[1] != oldKey.ID {
		t.Errorf("staged ring sealed with key %d, want %d", raw[1], oldKey.ID)
	}
	// Step 2: the new key is newest; both open.
	during := ringSigner(t, oldKey, newKey)
	newTok := during.Token("b1", t0.Add(time.Hour))
	if raw := decode(t, newTok); raw[1] != newKey.ID {
		t.Errorf("rotated ring sealed with key %d, want %d", raw[1], newKey.ID)
	}
	if during.NewestKeyID() != newKey.ID {
		t.Errorf("NewestKeyID = %d, want %d", during.NewestKeyID(), newKey.ID)
	}
	// Step 3: the old key is gone.
	after := ringSigner(t, newKey)
	tests := []struct {
		name string
		s    *Signer
		tok  string
		want bool
	}{
		{"old token, old ring", before, oldTok, true},
		{"old token, staged ring", staged, oldTok, true},
		{"old token, ring [old,new]", during, oldTok, true},
		{"new token, ring [old,new]", during, newTok, true},
		{"new token, staged ring", staged, newTok, true},
		{"new token, old ring", before, newTok, false},
		{"old token, ring [new]", after, oldTok, false},
		{"new token, ring [new]", after, newTok, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := tc.s.Verify(tc.tok, t0); ok != tc.want {
				t.Errorf("Verify ok = %v, want %v", ok, tc.want)
			}
		})
	}
}

func TestSignerRejectsGarbage(t *testing.T) {
	s := newTestSigner(t)
	for _, tok := range []string{"", "x", "====", "not base64!", strings.Repeat("A", 2000), strings.Repeat("A", maxToken), "AQAAAABrSdIAAmIx", "AgAA", "Ag" + strings.Repeat("A", 60)} {
		if id, ok := s.Verify(tok, t0); ok {
			t.Errorf("Verify(%q) = %q, true; want false", tok, id)
		}
	}
}

func TestNewRingSignerErrors(t *testing.T) {
	tests := []struct {
		name string
		ring []Key
		want string
	}{
		{"no keys", nil, "no affinity keys"},
		{"short key", []Key{{1, testKey}, {2, []byte("short")}}, "key 2: 5 bytes"},
		{"duplicate id", []Key{{1, testKey}, {1, testKey}}, "key id 1 listed twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRingSigner(tc.ring)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	if _, err := NewSigner([]byte("short")); !errors.Is(err, ErrKeyTooShort) {
		t.Errorf("NewSigner(short) error = %v, want ErrKeyTooShort", err)
	}
}

// TestSignerAllocs: Verify allocates only the returned id and Token only
// the returned string; both run on the message path.
func TestSignerAllocs(t *testing.T) {
	s := newTestSigner(t)
	tok := s.Token("b1", t0.Add(time.Hour))
	const v1 = "AQAAAABrSeAQDzEyNy4wLjAuMToxODA4MdT3uA9JrJ0R4yFgzOeYHFc"
	s.Verify(tok, t0) // warm the pool
	for name, f := range map[string]func(){
		"Verify":    func() { s.Verify(tok, t0) },
		"Verify v1": func() { s.Verify(v1, t0) },
		"Token":     func() { s.Token("127.0.0.1:18081", t0) },
	} {
		if n := testing.AllocsPerRun(100, f); n > 1 {
			t.Errorf("%s allocs = %v, want <= 1", name, n)
		}
	}
}

// TestHMACMatchesStdlib checks the hand-rolled HMAC of version 1 tokens
// against crypto/hmac.
func TestHMACMatchesStdlib(t *testing.T) {
	for _, key := range [][]byte{testKey, bytes.Repeat([]byte{7}, 64), bytes.Repeat([]byte{9}, 100)} {
		h := newHMACKey(key)
		msg := []byte("\x01\x00\x00\x00\x00\x6b\x49\xd2\x00\x02b1")
		var out [sha256.Size]byte
		got := h.mac(msg, &out)
		ref := hmac.New(sha256.New, key)
		ref.Write(msg)
		if want := ref.Sum(nil); !bytes.Equal(got, want) {
			t.Errorf("key %d bytes: mac = %x, want %x", len(key), got, want)
		}
	}
}

// FuzzOpen feeds any string to Verify on a ring of two keys (0 and 9) as
// the message path would. Nothing panics, and nothing is accepted except
// the tokens this test issued or the committed version 1 and 2 seeds:
// forging one would take a key.
func FuzzOpen(f *testing.F) {
	s := ringSigner(f, Key{ID: 0, Secret: testKey}, Key{ID: 9, Secret: []byte("fuzz key 9, sixteen+ bytes long.")})
	issued := map[string]string{
		// Committed under testdata/fuzz/FuzzOpen as well.
		"AQAAAABrSeAQDzEyNy4wLjAuMToxODA4MdT3uA9JrJ0R4yFgzOeYHFc":                            "127.0.0.1:18081",
		"AQAAAABrSyOAGzEwLjAuMC43OjUwNjB8M2txMXowdjJhOG01Y34jlJ6QSdzFsorzwAkIFLM":            "10.0.0.7:5060|3kq1z0v2a8m5c",
		"AglkZWZnaGlqa2xtbm8tNtxW1zkVzrb0zpCmBC7rdMUzLhg1f8AlF3UOzuy76Wia7w":                 "127.0.0.1:18081",
		"AglwcXJzdHV2d3h5envhPh26HG6F7WmwWrtpCMUcIYe2zsSBUw-gmk6MwVLJ7rvQug1EXWhJaoZ8wCEn3A": "10.0.0.7:5060|3kq1z0v2a8m5c",
		"AgDIycrLzM3Oz9DR0tNPgiNVCT1evxWTEAr6qaTiZGpt0k7h":                                   "b1",
	}
	// Fuzzing reruns this setup in worker processes: the seeds must be
	// the same tokens there.
	s.nonces = &counter{n: 50}
	for _, id := range []string{"b1", "", "127.0.0.1:18081", "10.0.0.7:5060|3kq1z0v2a8m5c"} {
		tok := s.Token(id, t0.Add(time.Hour))
		issued[tok] = id
		f.Add(tok)
	}
	f.Add(s.Token("b1", t0.Add(-time.Hour)))
	f.Add("")
	f.Add("Ag")
	f.Add("AQ")
	f.Add("////")
	for tok, id := range issued {
		if got, ok := s.Verify(tok, t0); !ok || got != id {
			f.Fatalf("issued token %q refused (%q, %v): the property below would be empty", tok, got, ok)
		}
	}
	f.Fuzz(func(t *testing.T, tok string) {
		id, ok := s.Verify(tok, t0)
		if !ok {
			return
		}
		if want, known := issued[tok]; !known || id != want {
			t.Fatalf("accepted %q naming %q, which this test never issued", tok, id)
		}
	})
}

func BenchmarkSignerToken(b *testing.B) {
	s := newTestSigner(b)
	exp := t0.Add(time.Hour)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Token("127.0.0.1:18081", exp)
		}
	})
}

func BenchmarkSignerVerify(b *testing.B) {
	s := newTestSigner(b)
	tok := s.Token("127.0.0.1:18081", t0.Add(time.Hour))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := s.Verify(tok, t0); !ok {
				b.Fatal("refused")
			}
		}
	})
}

// BenchmarkSignerVerifyV1 measures the version 1 path that stays for
// tokens issued before the upgrade.
func BenchmarkSignerVerifyV1(b *testing.B) {
	s := newTestSigner(b)
	const tok = "AQAAAABrSeAQDzEyNy4wLjAuMToxODA4MdT3uA9JrJ0R4yFgzOeYHFc"
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := s.Verify(tok, t0); !ok {
				b.Fatal("refused")
			}
		}
	})
}

// TestDeriveKey: a derived key is the same for the same newest key and
// label (every node, every restart), differs per label and per newest
// key, and is neither the key itself nor a function of older keys.
func TestDeriveKey(t *testing.T) {
	k1 := []byte("0123456789abcdef0123456789abcdef")
	k2 := []byte("fedcba9876543210fedcba9876543210")
	a, _ := NewRingSigner([]Key{{ID: 1, Secret: k1}})
	b, _ := NewRingSigner([]Key{{ID: 1, Secret: k1}})
	rotated, _ := NewRingSigner([]Key{{ID: 1, Secret: k1}, {ID: 2, Secret: k2}})
	x := a.DeriveKey("sip branch")
	if len(x) != 32 {
		t.Fatalf("derived key of %d bytes, want 32", len(x))
	}
	if !bytes.Equal(x, b.DeriveKey("sip branch")) {
		t.Error("same ring and label gave different keys")
	}
	if bytes.Equal(x, a.DeriveKey("other use")) {
		t.Error("two labels gave the same key")
	}
	if bytes.Equal(x, rotated.DeriveKey("sip branch")) {
		t.Error("a new newest key did not change the derived key")
	}
	if bytes.Equal(x, k1) {
		t.Error("derived key is the affinity key")
	}
}
