package lb

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// MinKeySize is the smallest affinity key, in bytes, that NewSigner and
// LoadOrCreateKey accept.
const MinKeySize = 16

// keySize is the length of a generated key, in bytes.
const keySize = 32

// macSize is the number of HMAC-SHA256 bytes kept in a token. 16 bytes
// (128 bits) is far beyond what an online forger can guess and keeps SIP
// Record-Route parameters short.
const macSize = 16

// maxIDLen bounds the backend id carried in a token so a token is never
// larger than a cookie or URI parameter should be.
const maxIDLen = 255

// tokenVersion is the first byte of every token; a format change bumps it
// so old tokens fail verification instead of being misread.
const tokenVersion = 1

// maxRaw and maxToken are the largest decoded and encoded token sizes.
const (
	maxRaw   = 1 + 8 + 1 + maxIDLen + macSize
	maxToken = (4*maxRaw + 2) / 3
)

// ErrKeyTooShort is returned when an affinity key has fewer than
// MinKeySize bytes.
var ErrKeyTooShort = errors.New("affinity key too short")

// b64 is base64url without padding: its alphabet is [A-Za-z0-9_-], so a
// token is safe in a cookie value, a URL and a SIP URI parameter (no ';',
// ',', '=' or quotes). Strict decoding rejects non-zero padding bits,
// so each token has exactly one spelling.
var b64 = base64.RawURLEncoding.Strict()

// Signer makes and checks affinity tokens: a backend id and an expiry,
// authenticated with HMAC-SHA256. A token needs no state in the balancer,
// so affinity survives a restart as long as the key does.
//
// A Signer is safe for concurrent use. The zero value is not usable; build
// one with NewSigner.
type Signer struct {
	ipad, opad [sha256.BlockSize]byte // key XOR 0x36 / 0x5c (RFC 2104)
}

// NewSigner returns a Signer for key, which must have at least MinKeySize
// bytes. The Signer keeps no reference to key.
func NewSigner(key []byte) (*Signer, error) {
	if len(key) < MinKeySize {
		return nil, fmt.Errorf("new signer: %d bytes: %w", len(key), ErrKeyTooShort)
	}
	if len(key) > sha256.BlockSize {
		sum := sha256.Sum256(key)
		key = sum[:]
	}
	s := &Signer{}
	copy(s.ipad[:], key)
	copy(s.opad[:], key)
	for i := range s.ipad {
		s.ipad[i] ^= 0x36
		s.opad[i] ^= 0x5c
	}
	return s, nil
}

// Token returns a token naming backendID that Verify accepts until expires
// (second resolution). The result contains only [A-Za-z0-9_-]. Ids longer
// than 255 bytes are truncated, so keep backend ids short.
//
// Layout before encoding: version(1) | expiry unix seconds(8, big endian) |
// id length(1) | id | first 16 bytes of HMAC-SHA256 over the preceding bytes.
func (s *Signer) Token(backendID string, expires time.Time) string {
	if len(backendID) > maxIDLen {
		backendID = backendID[:maxIDLen]
	}
	var stack [maxRaw]byte
	n := 1 + 8 + 1 + len(backendID)
	raw := stack[:n]
	raw[0] = tokenVersion
	binary.BigEndian.PutUint64(raw[1:9], uint64(expires.Unix()))
	raw[9] = byte(len(backendID))
	copy(raw[10:], backendID)
	var sum [sha256.Size]byte
	raw = append(raw, s.mac(raw, &sum)[:macSize]...)
	return b64.EncodeToString(raw)
}

// Verify checks token and returns the backend id it names. ok is false for
// anything that is not a well-formed token signed with this key, and for a
// token whose expiry is at or before now. The MAC is compared in constant
// time. Verify never panics, whatever the input, and allocates only the
// returned id.
func (s *Signer) Verify(token string, now time.Time) (backendID string, ok bool) {
	backendID, _, ok = s.VerifyExpiry(token, now)
	return backendID, ok
}

// VerifyExpiry is Verify that also returns the token's expiry, so that a
// caller can renew a token that is about to run out.
func (s *Signer) VerifyExpiry(token string, now time.Time) (backendID string, expires time.Time, ok bool) {
	if len(token) == 0 || len(token) > maxToken {
		return "", time.Time{}, false
	}
	// Copy into a stack buffer: []byte(token) would allocate for tokens
	// longer than 32 bytes.
	// The decoder skips '\r' and '\n'; only the alphabet is accepted, so
	// each token has exactly one spelling.
	var in [maxToken]byte
	for i := 0; i < len(token); i++ {
		c := token[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "", time.Time{}, false
		}
		in[i] = c
	}
	var stack [maxRaw]byte
	n, err := b64.Decode(stack[:], in[:len(token)])
	if err != nil || n < 1+8+1+macSize {
		return "", time.Time{}, false
	}
	raw := stack[:n]
	if raw[0] != tokenVersion {
		return "", time.Time{}, false
	}
	idLen := int(raw[9])
	if n != 1+8+1+idLen+macSize {
		return "", time.Time{}, false
	}
	body, got := raw[:n-macSize], raw[n-macSize:]
	var sum [sha256.Size]byte
	if !hmac.Equal(s.mac(body, &sum)[:macSize], got) {
		return "", time.Time{}, false
	}
	exp := int64(binary.BigEndian.Uint64(raw[1:9]))
	if now.Unix() >= exp {
		return "", time.Time{}, false
	}
	return string(raw[10 : 10+idLen]), time.Unix(exp, 0), true
}

// mac returns HMAC-SHA256(key, b) (RFC 2104) in out. It is spelled out
// with sha256.Sum256 instead of crypto/hmac because hash.Hash is an
// interface and makes every buffer passed to it escape: Verify runs on each
// sticky request and must not allocate. len(b) is at most maxRaw-macSize.
func (s *Signer) mac(b []byte, out *[sha256.Size]byte) []byte {
	var inner [sha256.BlockSize + maxRaw - macSize]byte
	copy(inner[:], s.ipad[:])
	n := copy(inner[sha256.BlockSize:], b)
	ih := sha256.Sum256(inner[:sha256.BlockSize+n])
	var outer [sha256.BlockSize + sha256.Size]byte
	copy(outer[:], s.opad[:])
	copy(outer[sha256.BlockSize:], ih[:])
	*out = sha256.Sum256(outer[:])
	return out[:]
}

// LoadOrCreateKey returns the affinity key stored at path. When the file
// does not exist it generates 32 random bytes, creates the parent
// directory (0700) and writes them with mode 0600. A file that exists but
// cannot be read or holds fewer than MinKeySize bytes is an error naming
// path; an existing file is never overwritten.
func LoadOrCreateKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(key) < MinKeySize {
			return nil, fmt.Errorf("load affinity key %s: %d bytes: %w", path, len(key), ErrKeyTooShort)
		}
		return key, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("load affinity key %s: %w", path, err)
	}
	key = make([]byte, keySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("generate affinity key %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create affinity key dir for %s: %w", path, err)
	}
	// O_EXCL: if another process created the key meanwhile, never clobber it.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create affinity key %s: %w", path, err)
	}
	if _, err := f.Write(key); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("write affinity key %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("write affinity key %s: %w", path, err)
	}
	return key, nil
}
