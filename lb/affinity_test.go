package lb

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func newTestSigner(t testing.TB) *Signer {
	t.Helper()
	s, err := NewSigner(testKey)
	if err != nil {
		t.Fatalf("NewSigner: %v", err)
	}
	return s
}

func TestSignerRoundTrip(t *testing.T) {
	s := newTestSigner(t)
	now := time.Unix(1_800_000_000, 0)
	for _, id := range []string{"", "b1", "127.0.0.1:18081", "sip:10.0.0.7:5060;transport=tcp", strings.Repeat("x", 255)} {
		tok := s.Token(id, now.Add(time.Hour))
		if strings.ContainsAny(tok, ";,= \"'+/") {
			t.Errorf("Token(%q) = %q contains a character unsafe in a cookie or SIP parameter", id, tok)
		}
		got, ok := s.Verify(tok, now)
		if !ok || got != id {
			t.Errorf("Verify(Token(%q)) = %q, %v; want %q, true", id, got, ok, id)
		}
	}
}

func TestSignerLongIDTruncated(t *testing.T) {
	s := newTestSigner(t)
	now := time.Unix(1_800_000_000, 0)
	id := strings.Repeat("y", 300)
	got, ok := s.Verify(s.Token(id, now.Add(time.Minute)), now)
	if !ok || got != id[:255] {
		t.Fatalf("Verify = %d bytes, %v; want 255 bytes, true", len(got), ok)
	}
}

func TestSignerExpiry(t *testing.T) {
	s := newTestSigner(t)
	t0 := time.Unix(1_800_000_000, 0)
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

func TestSignerRejectsTampering(t *testing.T) {
	s := newTestSigner(t)
	now := time.Unix(1_800_000_000, 0)
	tok := s.Token("b1", now.Add(time.Hour))
	raw, err := b64.DecodeString(tok)
	if err != nil {
		t.Fatal(err)
	}
	// Flip each bit of the decoded token: every variant must fail.
	for i := range raw {
		for bit := 0; bit < 8; bit++ {
			m := bytes.Clone(raw)
			m[i] ^= 1 << bit
			if id, ok := s.Verify(b64.EncodeToString(m), now); ok {
				t.Fatalf("byte %d bit %d flipped: Verify = %q, true; want false", i, bit, id)
			}
		}
	}
	other, err := NewSigner([]byte("another key, also long enough!!"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := other.Verify(tok, now); ok {
		t.Error("token verified under a different key")
	}
	// A forged token naming another backend with a far expiry, MAC from the
	// original token: must fail.
	forged := append([]byte{tokenVersion, 0, 0, 0, 0, 0x7f, 0, 0, 0, 2, 'b', '2'}, raw[len(raw)-macSize:]...)
	if _, ok := s.Verify(b64.EncodeToString(forged), now); ok {
		t.Error("forged token verified")
	}
}

func TestSignerRejectsGarbage(t *testing.T) {
	s := newTestSigner(t)
	now := time.Unix(1_800_000_000, 0)
	for _, tok := range []string{"", "x", "====", "not base64!", strings.Repeat("A", 2000), "AQAAAABrSdIAAmIx", s.Token("b1", now.Add(time.Hour)) + "A"} {
		if id, ok := s.Verify(tok, now); ok {
			t.Errorf("Verify(%q) = %q, true; want false", tok, id)
		}
	}
}

func TestNewSignerShortKey(t *testing.T) {
	if _, err := NewSigner([]byte("short")); !errors.Is(err, ErrKeyTooShort) {
		t.Fatalf("NewSigner(short) error = %v, want ErrKeyTooShort", err)
	}
}

func TestSignerVerifyAllocs(t *testing.T) {
	s := newTestSigner(t)
	now := time.Unix(1_800_000_000, 0)
	tok := s.Token("b1", now.Add(time.Hour))
	s.Verify(tok, now) // warm the pool
	// The returned id string is the only allocation.
	if n := testing.AllocsPerRun(100, func() { s.Verify(tok, now) }); n > 1 {
		t.Errorf("Verify allocs = %v, want <= 1", n)
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "affinity.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(k1) != keySize {
		t.Fatalf("generated key has %d bytes, want %d", len(k1), keySize)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("key file mode = %o, want 600", perm)
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if !bytes.Equal(k1, k2) {
		t.Error("second load returned a different key")
	}

	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("tiny"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = LoadOrCreateKey(short)
	if !errors.Is(err, ErrKeyTooShort) || !strings.Contains(err.Error(), short) {
		t.Errorf("short key error = %v, want ErrKeyTooShort naming %s", err, short)
	}
	got, _ := os.ReadFile(short)
	if string(got) != "tiny" {
		t.Error("short key file was overwritten")
	}

	// A directory where the file should be cannot be read.
	asDir := filepath.Join(dir, "isdir")
	if err := os.Mkdir(asDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(asDir); err == nil || !strings.Contains(err.Error(), asDir) {
		t.Errorf("unreadable key error = %v, want an error naming %s", err, asDir)
	}
}

func FuzzSignerVerify(f *testing.F) {
	s := newTestSigner(f)
	now := time.Unix(1_800_000_000, 0)
	f.Add(s.Token("b1", now.Add(time.Hour)))
	f.Add(s.Token("", now.Add(time.Hour)))
	f.Add(s.Token("b1", now.Add(-time.Hour)))
	f.Add("")
	f.Add("AQ")
	f.Add("////")
	f.Fuzz(func(t *testing.T, tok string) {
		id, ok := s.Verify(tok, now)
		if !ok {
			return
		}
		// Anything accepted must be exactly what Token produces.
		raw, err := b64.DecodeString(tok)
		if err != nil {
			t.Fatalf("accepted undecodable token %q", tok)
		}
		exp := time.Unix(int64(uint64(raw[1])<<56|uint64(raw[2])<<48|uint64(raw[3])<<40|uint64(raw[4])<<32|uint64(raw[5])<<24|uint64(raw[6])<<16|uint64(raw[7])<<8|uint64(raw[8])), 0)
		if again := s.Token(id, exp); again != tok {
			t.Fatalf("accepted %q, which Token does not produce (%q)", tok, again)
		}
	})
}

func BenchmarkSignerVerify(b *testing.B) {
	s := newTestSigner(b)
	now := time.Unix(1_800_000_000, 0)
	tok := s.Token("127.0.0.1:18081", now.Add(time.Hour))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Verify(tok, now)
		}
	})
}

// TestSignerMatchesHMAC checks the hand-rolled HMAC against crypto/hmac.
func TestSignerMatchesHMAC(t *testing.T) {
	for _, key := range [][]byte{testKey, bytes.Repeat([]byte{7}, 64), bytes.Repeat([]byte{9}, 100)} {
		s, err := NewSigner(key)
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte("\x01\x00\x00\x00\x00\x6b\x49\xd2\x00\x02b1")
		var out [sha256.Size]byte
		got := s.mac(msg, &out)
		h := hmac.New(sha256.New, key)
		h.Write(msg)
		if want := h.Sum(nil); !bytes.Equal(got, want) {
			t.Errorf("key %d bytes: mac = %x, want %x", len(key), got, want)
		}
	}
}
