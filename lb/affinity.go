package lb

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"
)

// Token format, version 3 (issued for a session or dialog in a named pool):
//
//	version(1)=3 | key id(1) | nonce(12) | AES-256-GCM(expiry(4) | pool length(1) | pool | backend id) | tag(16)
//
// Version 2 (issued when no pool is named, and accepted):
//
//	version(1)=2 | key id(1) | nonce(12) | AES-256-GCM(expiry(4) | backend id) | tag(16)
//
// base64url-encoded without padding. The version and key id are the
// AEAD's additional data, so neither can be changed without failing the
// tag. The expiry is unix seconds as an unsigned 32-bit big-endian number
// (good until 2106). Nothing in the encoded token reveals the backend id
// or its address; only its length shows, within the token length.
//
// Version 1 (accepted, never issued; see verifyV1):
//
//	version(1)=1 | expiry unix seconds(8) | id length(1) | id | HMAC-SHA256(16)
const (
	tokenV1 = 1
	tokenV2 = 2
	tokenV3 = 3
)

// Token sizes, in bytes.
const (
	macSize    = 16 // HMAC-SHA256 bytes kept in a version 1 token
	nonceSize  = 12 // AES-GCM standard nonce
	tagSize    = 16 // AES-GCM tag
	expSize    = 4  // version 2 expiry
	headerSize = 2  // version, key id
	// v2Overhead is the size of a version 2 token naming an empty id.
	v2Overhead = headerSize + nonceSize + expSize + tagSize
	// v1Overhead is the size of a version 1 token naming an empty id.
	v1Overhead = 1 + 8 + 1 + macSize
)

// maxIDLen bounds the backend id carried in a token so a token is never
// larger than a cookie or URI parameter should be.
const maxIDLen = 255

// maxPoolLen bounds the pool name a version 3 token carries (pool names
// are at most admission.MaxPoolName bytes).
const maxPoolLen = 64

// maxRaw and maxToken are the largest decoded and encoded token sizes.
const (
	maxRaw   = v2Overhead + 1 + maxPoolLen + maxIDLen
	maxToken = (4*maxRaw + 2) / 3
)

// aeadLabel is the HKDF info that turns a configured key into the AES-256
// key of version 2 tokens. The label separates this use of the key from
// any other (the version 1 HMAC uses the key as is), so one key file
// serves both formats without one weakening the other.
const aeadLabel = "sluice affinity token v2 aes-256-gcm"

// ErrKeyTooShort is returned when an affinity key has fewer than
// MinKeySize bytes.
var ErrKeyTooShort = errors.New("affinity key too short")

// b64 is base64url without padding: its alphabet is [A-Za-z0-9_-], so a
// token is safe in a cookie value, a URL and a SIP URI parameter (no ';',
// ',', '=' or quotes). Strict decoding rejects non-zero padding bits,
// so each token has exactly one spelling.
var b64 = base64.RawURLEncoding.Strict()

// Signer seals and opens affinity tokens: a backend id and an expiry,
// encrypted and authenticated with AES-256-GCM under a key ring. A token
// needs no state in the balancer, so affinity survives a restart as long
// as its key stays in the ring; and a token reveals nothing about the
// backend it names, so a client never learns internal addresses.
//
// Tokens are sealed with the newest key of the ring and opened with any
// key in it: adding a key, and later removing the old one, rotates keys
// without breaking live SIP dialogs or HTTP sessions.
//
// Nonces are 12 random bytes per token. With random nonces AES-GCM stays
// safe while the chance of a repeated nonce under one key is negligible:
// after n tokens it is about n²/2⁹⁷, 2⁻³³ after 2³² tokens. Tokens are
// issued once per SIP dialog and at most once per second and backend for
// HTTP cookies, so 2³² tokens take 165 days at 300 new dialogs per second
// summed over every node sharing the key; rotating keys every few months
// keeps the margin. A 24-byte nonce (XChaCha20-Poly1305) would remove the
// limit but lengthen every Record-Route by 16 characters and need a module
// outside the standard library.
//
// A Signer is safe for concurrent use. The zero value is not usable; build
// one with NewSigner or NewRingSigner.
type Signer struct {
	keys   [256]cipher.AEAD // by key id; nil: not in the ring
	newest byte             // id of the key that seals
	// v1 is the HMAC key of version 1 tokens: the key with id 0, which
	// is what a single-key file or NewSigner gives. Nil when the ring has
	// no key 0, and then version 1 tokens are refused.
	v1 *hmacKey
	// nonces is the source of nonces; nil means crypto/rand. Tests set
	// it to get reproducible tokens.
	nonces io.Reader
	// subkeySeed is derived from the newest key (HKDF, label
	// subkeyLabel); DeriveKey derives the keys of other uses from it.
	subkeySeed []byte
}

// subkeyLabel is the HKDF info of the seed DeriveKey derives from, apart
// from aeadLabel so that no derived key is the AEAD key.
const subkeyLabel = "sluice derived keys v1"

// DeriveKey returns a 32-byte key for the use named by label, derived
// with HKDF-SHA256 from the newest key of the ring: the same ring and
// label give the same key on every node and after a restart; different
// labels give independent keys, none of them the token key. The SIP
// front end keys the MAC of its Via branches with it.
func (s *Signer) DeriveKey(label string) []byte {
	k, err := hkdf.Key(sha256.New, s.subkeySeed, nil, label, 32)
	if err != nil {
		panic("lb: derive key: " + err.Error()) // only for lengths HKDF cannot give
	}
	return k
}

// NewSigner returns a Signer for a single key, which must have at least
// MinKeySize bytes: the key ring {0: key}. The Signer keeps no reference to
// key.
func NewSigner(key []byte) (*Signer, error) {
	return NewRingSigner([]Key{{ID: 0, Secret: key}})
}

// NewRingSigner returns a Signer that seals with the last key of ring and
// opens tokens sealed with any of them. Ids must be unique and every
// secret must have at least MinKeySize bytes. The Signer keeps no
// reference to ring or its secrets.
func NewRingSigner(ring []Key) (*Signer, error) {
	if len(ring) == 0 {
		return nil, errors.New("new signer: no affinity keys")
	}
	s := &Signer{}
	for _, k := range ring {
		if len(k.Secret) < MinKeySize {
			return nil, fmt.Errorf("new signer: key %d: %d bytes: %w", k.ID, len(k.Secret), ErrKeyTooShort)
		}
		if s.keys[k.ID] != nil {
			return nil, fmt.Errorf("new signer: key id %d listed twice", k.ID)
		}
		aead, err := newAEAD(k.Secret)
		if err != nil {
			return nil, fmt.Errorf("new signer: key %d: %w", k.ID, err)
		}
		s.keys[k.ID] = aead
		if k.ID == 0 {
			s.v1 = newHMACKey(k.Secret)
		}
	}
	s.newest = ring[len(ring)-1].ID
	seed, err := hkdf.Key(sha256.New, ring[len(ring)-1].Secret, nil, subkeyLabel, 32)
	if err != nil {
		return nil, fmt.Errorf("new signer: %w", err)
	}
	s.subkeySeed = seed
	return s, nil
}

// newAEAD derives the AES-256 key from secret with HKDF-SHA256 (RFC 5869)
// and returns its GCM. Deriving rather than using the secret directly
// keeps key files of any length (16 bytes and up, earlier releases wrote
// 32 random bytes) usable and separates the AEAD key from the HMAC key.
func newAEAD(secret []byte) (cipher.AEAD, error) {
	k, err := hkdf.Key(sha256.New, secret, nil, aeadLabel, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// NewestKeyID returns the id of the key that seals new tokens.
func (s *Signer) NewestKeyID() uint8 { return s.newest }

// scratch holds the buffers of one Token or Verify call. The AEAD is an
// interface, so buffers handed to it escape to the heap; pooling them
// keeps both calls at one allocation (the returned string).
type scratch struct {
	text [maxToken]byte // the token's text
	raw  [maxRaw]byte   // the decoded token
	data [maxRaw]byte   // expiry and id in the clear
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Token returns a token naming backendID that Verify accepts until expires
// (second resolution, clamped to 1970..2106), sealed with the newest key.
// The result contains only [A-Za-z0-9_-] and differs on every call (the
// nonce is random). Ids longer than 255 bytes are truncated, so keep
// backend ids short: a token has ⌈(34 + len(id))·4/3⌉ characters (66
// for a 15-byte id such as "127.0.0.1:18081").
func (s *Signer) Token(backendID string, expires time.Time) string {
	return s.PoolToken("", backendID, expires)
}

// PoolToken is Token for a session or dialog of the named pool: the pool
// travels sealed with the backend id, so an affinity request stays in its
// pool whatever the routes say by the time it comes back. With pool ""
// it is exactly Token (a version 2 token); otherwise a version 3 token,
// 1+len(pool) bytes longer before encoding. Pool names longer than 64
// bytes are truncated (a pool name is at most admission.MaxPoolName).
func (s *Signer) PoolToken(pool, backendID string, expires time.Time) string {
	if len(backendID) > maxIDLen {
		backendID = backendID[:maxIDLen]
	}
	if len(pool) > maxPoolLen {
		pool = pool[:maxPoolLen]
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)

	version := byte(tokenV2)
	data := binary.BigEndian.AppendUint32(sc.data[:0], clampExpiry(expires.Unix()))
	if pool != "" {
		version = tokenV3
		data = append(data, byte(len(pool)))
		data = append(data, pool...)
	}
	data = append(data, backendID...)

	raw := sc.raw[:headerSize+nonceSize]
	raw[0], raw[1] = version, s.newest
	nonce := raw[headerSize:]
	if s.nonces == nil {
		rand.Read(nonce) // never fails (crypto/rand aborts the program instead)
	} else if _, err := io.ReadFull(s.nonces, nonce); err != nil {
		panic("lb: affinity nonce source: " + err.Error())
	}
	raw = s.keys[s.newest].Seal(raw, nonce, data, raw[:headerSize])

	text := sc.text[:b64.EncodedLen(len(raw))]
	b64.Encode(text, raw)
	return string(text)
}

// clampExpiry maps unix seconds to the 32-bit expiry of a token.
func clampExpiry(sec int64) uint32 {
	switch {
	case sec < 0:
		return 0
	case sec > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(sec)
}

// Verify checks token and returns the backend id it names. ok is false for
// anything that is not a well-formed token sealed with a key of the ring
// (unknown key id, tampered, truncated, extended), and for a token whose
// expiry is at or before now. Verify never panics, whatever the input, and
// allocates only the returned id.
func (s *Signer) Verify(token string, now time.Time) (backendID string, ok bool) {
	backendID, _, ok = s.VerifyExpiry(token, now)
	return backendID, ok
}

// VerifyExpiry is Verify that also returns the token's expiry, so that a
// caller can renew a token that is about to run out. It ignores the pool
// a version 3 token names: use VerifyPool where pools matter.
func (s *Signer) VerifyExpiry(token string, now time.Time) (backendID string, expires time.Time, ok bool) {
	_, backendID, expires, ok = s.VerifyPool(token, now)
	return backendID, expires, ok
}

// VerifyPool is VerifyExpiry that also returns the pool a version 3
// token names; pool is "" for tokens issued without one (version 1 and 2,
// and PoolToken with ""). It allocates only the returned strings.
func (s *Signer) VerifyPool(token string, now time.Time) (pool, backendID string, expires time.Time, ok bool) {
	if len(token) == 0 || len(token) > maxToken {
		return "", "", time.Time{}, false
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	// The decoder skips '\r' and '\n'; accept only the alphabet, so that
	// each token has exactly one spelling.
	for i := 0; i < len(token); i++ {
		c := token[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "", "", time.Time{}, false
		}
		sc.text[i] = c
	}
	n, err := b64.Decode(sc.raw[:], sc.text[:len(token)])
	if err != nil || n == 0 {
		return "", "", time.Time{}, false
	}
	raw := sc.raw[:n]
	var id, poolName []byte
	var exp int64
	switch raw[0] {
	case tokenV2, tokenV3:
		if n < v2Overhead {
			return "", "", time.Time{}, false
		}
		aead := s.keys[raw[1]]
		if aead == nil {
			return "", "", time.Time{}, false
		}
		data, err := aead.Open(sc.data[:0], raw[headerSize:headerSize+nonceSize], raw[headerSize+nonceSize:], raw[:headerSize])
		if err != nil {
			return "", "", time.Time{}, false
		}
		exp, id = int64(binary.BigEndian.Uint32(data)), data[expSize:]
		if raw[0] == tokenV3 {
			// Sealed by us, so well formed unless the key leaked; check
			// anyway: a bad length must not slice out of bounds.
			if len(id) == 0 || id[0] == 0 || 1+int(id[0]) >= len(id) {
				return "", "", time.Time{}, false
			}
			poolName, id = id[1:1+int(id[0])], id[1+int(id[0]):]
		}
	case tokenV1:
		if id, exp, ok = s.verifyV1(raw); !ok {
			return "", "", time.Time{}, false
		}
	default:
		return "", "", time.Time{}, false
	}
	if now.Unix() >= exp {
		return "", "", time.Time{}, false
	}
	return string(poolName), string(id), time.Unix(exp, 0), true
}

// verifyV1 checks a version 1 token (HMAC-signed, id in the clear) with
// key 0 and returns the id (aliasing raw) and expiry. Earlier releases
// issued these; accepting them keeps sessions and dialogs alive across the
// upgrade while key 0 stays in the ring. They are never issued: they
// reveal the backend id.
func (s *Signer) verifyV1(raw []byte) (id []byte, exp int64, ok bool) {
	n := len(raw)
	if s.v1 == nil || n < v1Overhead {
		return nil, 0, false
	}
	idLen := int(raw[9])
	if n != v1Overhead+idLen {
		return nil, 0, false
	}
	body, got := raw[:n-macSize], raw[n-macSize:]
	var sum [sha256.Size]byte
	if !hmac.Equal(s.v1.mac(body, &sum)[:macSize], got) {
		return nil, 0, false
	}
	return raw[10 : 10+idLen], int64(binary.BigEndian.Uint64(raw[1:9])), true
}

// hmacKey is an HMAC-SHA256 key as its inner and outer pads (RFC 2104).
type hmacKey struct {
	ipad, opad [sha256.BlockSize]byte // key XOR 0x36 / 0x5c
}

func newHMACKey(key []byte) *hmacKey {
	if len(key) > sha256.BlockSize {
		sum := sha256.Sum256(key)
		key = sum[:]
	}
	h := &hmacKey{}
	copy(h.ipad[:], key)
	copy(h.opad[:], key)
	for i := range h.ipad {
		h.ipad[i] ^= 0x36
		h.opad[i] ^= 0x5c
	}
	return h
}

// maxV1Body is the longest body a version 1 MAC covers.
const maxV1Body = v1Overhead - macSize + maxIDLen

// mac returns HMAC-SHA256(key, b) (RFC 2104) in out. It is spelled out
// with sha256.Sum256 instead of crypto/hmac because hash.Hash is an
// interface and makes every buffer passed to it escape. len(b) is at most
// maxV1Body.
func (h *hmacKey) mac(b []byte, out *[sha256.Size]byte) []byte {
	var inner [sha256.BlockSize + maxV1Body]byte
	copy(inner[:], h.ipad[:])
	n := copy(inner[sha256.BlockSize:], b)
	ih := sha256.Sum256(inner[:sha256.BlockSize+n])
	var outer [sha256.BlockSize + sha256.Size]byte
	copy(outer[:], h.opad[:])
	copy(outer[sha256.BlockSize:], ih[:])
	*out = sha256.Sum256(outer[:])
	return out[:]
}
