package lb

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"strings"
	"testing"
	"time"
)

// TestPoolTokenRoundTrip: a version 3 token gives back its pool and id;
// a token issued without a pool (version 2, and version 1 from older
// releases) gives pool "".
func TestPoolTokenRoundTrip(t *testing.T) {
	s := newTestSigner(t)
	exp := t0.Add(time.Hour)
	tests := []struct {
		name, pool, id string
		version        byte
	}{
		{"named pool", "london", "10.0.0.7:5060", tokenV3},
		{"default pool", "default", "b1", tokenV3},
		{"no pool", "", "b1", tokenV2},
		{"longest pool", strings.Repeat("p", maxPoolLen), "b", tokenV3},
		{"id with slash and colon", "api", "a/b:c", tokenV3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := s.PoolToken(tc.pool, tc.id, exp)
			if v := decode(t, tok)[0]; v != tc.version {
				t.Errorf("version %d, want %d", v, tc.version)
			}
			pool, id, e, ok := s.VerifyPool(tok, t0)
			if !ok || pool != tc.pool || id != tc.id || !e.Equal(exp) {
				t.Errorf("VerifyPool = %q %q %v %v; want %q %q %v true", pool, id, e, ok, tc.pool, tc.id, exp)
			}
			// Verify and VerifyExpiry keep their contract: the id alone.
			if id, ok := s.Verify(tok, t0); !ok || id != tc.id {
				t.Errorf("Verify = %q %v, want %q", id, ok, tc.id)
			}
		})
	}
	const v1 = "AQAAAABrSeAQDzEyNy4wLjAuMToxODA4MdT3uA9JrJ0R4yFgzOeYHFc"
	ring := ringSigner(t, Key{ID: 0, Secret: testKey})
	if pool, id, _, ok := ring.VerifyPool(v1, t0); !ok || pool != "" || id != "127.0.0.1:18081" {
		t.Errorf("v1 VerifyPool = %q %q %v", pool, id, ok)
	}
}

// TestPoolTokenTruncatesPool: pool names longer than 64 bytes are cut,
// never rejected (a pool name is at most 64 bytes anyway).
func TestPoolTokenTruncatesPool(t *testing.T) {
	s := newTestSigner(t)
	long := strings.Repeat("x", maxPoolLen+10)
	pool, _, _, ok := s.VerifyPool(s.PoolToken(long, "b", t0.Add(time.Hour)), t0)
	if !ok || pool != long[:maxPoolLen] {
		t.Errorf("pool = %q (%d bytes) ok=%v, want the first %d bytes", pool, len(pool), ok, maxPoolLen)
	}
}

// TestTokenV3Layout pins the version 3 format with a fixed nonce and
// checks that the version byte is authenticated: a version 3 token
// relabelled as version 2 (which would read the pool as part of the id)
// fails, and so does a sealed body whose pool length runs past the end.
func TestTokenV3Layout(t *testing.T) {
	s := ringSigner(t, Key{ID: 7, Secret: testKey})
	s.nonces = &counter{}
	got := decode(t, s.PoolToken("api", "b1", time.Unix(1_800_003_600, 0)))

	k, err := hkdf.Key(sha256.New, testKey, nil, "sluice affinity token v2 aes-256-gcm", 32)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := aes.NewCipher(k)
	gcm, _ := cipher.NewGCM(block)
	nonce := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	plain := append(binary.BigEndian.AppendUint32(nil, 1_800_003_600), 3, 'a', 'p', 'i', 'b', '1')
	want := append([]byte{3, 7}, nonce...)
	want = gcm.Seal(want, nonce, plain, []byte{3, 7})
	if !bytes.Equal(got, want) {
		t.Fatalf("token\n got % x\nwant % x", got, want)
	}

	relabelled := append([]byte(nil), got...)
	relabelled[0] = tokenV2
	if _, _, _, ok := s.VerifyPool(b64.EncodeToString(relabelled), time.Unix(1_800_000_000, 0)); ok {
		t.Error("a version 3 token relabelled as version 2 verified")
	}
	for _, body := range [][]byte{
		{0, 'b'},           // pool length 0: version 3 always names a pool
		{9, 'a', 'p', 'i'}, // pool length past the end
		{3, 'a', 'p', 'i'}, // no backend id after the pool
	} {
		p := append(binary.BigEndian.AppendUint32(nil, 1_800_003_600), body...)
		tok := gcm.Seal(append([]byte{3, 7}, nonce...), nonce, p, []byte{3, 7})
		if pool, id, _, ok := s.VerifyPool(b64.EncodeToString(tok), time.Unix(1_800_000_000, 0)); ok {
			t.Errorf("sealed body % x verified as pool %q id %q", body, pool, id)
		}
	}
}

func TestPoolTokenAllocs(t *testing.T) {
	s := newTestSigner(t)
	tok := s.PoolToken("london", "b1", t0.Add(time.Hour))
	s.VerifyPool(tok, t0) // warm the pool
	if n := testing.AllocsPerRun(100, func() { s.VerifyPool(tok, t0) }); n > 2 {
		t.Errorf("VerifyPool allocs = %v, want <= 2 (pool and id)", n)
	}
	if n := testing.AllocsPerRun(100, func() { s.PoolToken("london", "127.0.0.1:18081", t0) }); n > 1 {
		t.Errorf("PoolToken allocs = %v, want <= 1", n)
	}
}
