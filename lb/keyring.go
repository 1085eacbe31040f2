package lb

import (
	"bytes"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/sluicelb/sluice/internal/opfile"
)

// MinKeySize is the smallest affinity key, in bytes, that NewSigner,
// NewRingSigner, LoadOrCreateKey and key ring files accept.
const MinKeySize = 16

// keySize is the length of a generated key, in bytes.
const keySize = 32

// Key is one key of an affinity key ring. ID travels in every token sealed
// with it, so that a Signer holding several keys knows which one opens a
// token.
type Key struct {
	ID     uint8
	Secret []byte // at least MinKeySize bytes; 32 random bytes recommended
}

// LoadOrCreateKeyRing returns the affinity keys in the file at path,
// newest last, in one of two formats:
//
//   - a single key: the file's bytes are the key, with id 0. This is what
//     LoadOrCreateKey writes (32 random bytes) and what earlier releases
//     read, so existing key files keep working. A file that holds a byte
//     outside printable ASCII, tab, CR and LF is a single key, and so is a
//     text file holding one word on one line (e.g. the output of
//     "openssl rand -hex 32"); the key is then the whole file, newline
//     included.
//   - a key ring: any other text, parsed by ParseKeyRing.
//
// When the file does not exist it is created as LoadOrCreateKey does.
// Errors name path, and the line for a bad key ring line.
func LoadOrCreateKeyRing(path string) ([]Key, error) {
	data, err := opfile.Read(path, opfile.MaxSize) // a regular file, bounded: never a FIFO or /dev/zero
	switch {
	case errors.Is(err, fs.ErrNotExist):
		key, err := LoadOrCreateKey(path)
		if err != nil {
			return nil, err
		}
		return []Key{{ID: 0, Secret: key}}, nil
	case err != nil:
		return nil, fmt.Errorf("load affinity key %s: %w", path, err)
	}
	if !isKeyRing(data) {
		if len(data) < MinKeySize {
			return nil, fmt.Errorf("load affinity key %s: %d bytes: %w", path, len(data), ErrKeyTooShort)
		}
		return []Key{{ID: 0, Secret: data}}, nil
	}
	ring, err := ParseKeyRing(data)
	if err != nil {
		return nil, fmt.Errorf("load affinity key ring %s: %w", path, err)
	}
	return ring, nil
}

// isKeyRing reports whether data is a key ring rather than a single key
// (see LoadOrCreateKeyRing). 32 random bytes are all printable with a
// chance of about 10⁻¹³, so a generated key is never taken for a ring.
func isKeyRing(data []byte) bool {
	for _, c := range data {
		if (c < 0x20 || c > 0x7e) && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	lines, words := 0, 0
	for line := range bytes.Lines(data) {
		f := bytes.Fields(stripComment(line))
		if len(f) > 0 {
			lines++
			words += len(f)
		}
	}
	return !(lines == 1 && words == 1)
}

// stripComment drops everything from the first '#' of line.
func stripComment(line []byte) []byte {
	if i := bytes.IndexByte(line, '#'); i >= 0 {
		return line[:i]
	}
	return line
}

// ParseKeyRing parses a key ring file: one key a line as "ID HEXKEY", where
// ID is a key id from 0 to 255 and HEXKEY the key in hexadecimal, at least
// MinKeySize bytes (e.g. from "openssl rand -hex 32"). '#' starts a
// comment; blank lines are skipped. The last key is the newest: it seals
// new tokens, and every listed key opens them. Ids must be unique; id 0
// is the id of a single-key file, so listing that key as 0 keeps the
// tokens it sealed valid. Errors name the line and never quote a key.
func ParseKeyRing(data []byte) ([]Key, error) {
	var ring []Key
	seen := map[uint8]int{} // id -> line
	n := 0
	for line := range bytes.Lines(data) {
		n++
		f := bytes.Fields(stripComment(line))
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("line %d: %d fields, want \"ID HEXKEY\"", n, len(f))
		}
		id, err := strconv.ParseUint(string(f[0]), 10, 8)
		if err != nil {
			return nil, fmt.Errorf("line %d: key id %q: want a number from 0 to 255", n, f[0])
		}
		if prev, dup := seen[uint8(id)]; dup {
			return nil, fmt.Errorf("line %d: key id %d already used on line %d", n, id, prev)
		}
		secret := make([]byte, hex.DecodedLen(len(f[1])))
		if _, err := hex.Decode(secret, f[1]); err != nil {
			return nil, fmt.Errorf("line %d: key %d: not hexadecimal (%d characters; want an even number of 0-9a-f)", n, id, len(f[1]))
		}
		if len(secret) < MinKeySize {
			return nil, fmt.Errorf("line %d: key %d: %d bytes, want at least %d: %w", n, id, len(secret), MinKeySize, ErrKeyTooShort)
		}
		seen[uint8(id)] = n
		ring = append(ring, Key{ID: uint8(id), Secret: secret})
	}
	if len(ring) == 0 {
		return nil, errors.New("no keys (want lines of \"ID HEXKEY\")")
	}
	return ring, nil
}

// LoadOrCreateKey returns the affinity key stored at path. When the file
// does not exist it generates 32 random bytes, creates the parent
// directory (0700) and writes them with mode 0600. A file that exists but
// cannot be read or holds fewer than MinKeySize bytes is an error naming
// path; an existing file is never overwritten. LoadOrCreateKeyRing reads
// such a file, and key ring files too.
func LoadOrCreateKey(path string) ([]byte, error) {
	key, err := opfile.Read(path, opfile.MaxSize)
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

// DeriveKeys returns, for every key of ring, a key with the same id for
// another use than affinity tokens: 32 bytes from HKDF-SHA256 of the
// secret with info label. Keys of different labels are unrelated to each
// other and to the token key, so one key ring serves several uses without
// what one use signs being valid for another. label names the use (e.g.
// "sluice cluster dialog events v1"); ring is not modified.
func DeriveKeys(ring []Key, label string) ([]Key, error) {
	out := make([]Key, 0, len(ring))
	for _, k := range ring {
		if len(k.Secret) < MinKeySize {
			return nil, fmt.Errorf("derive key %d: %d bytes: %w", k.ID, len(k.Secret), ErrKeyTooShort)
		}
		secret, err := hkdf.Key(sha256.New, k.Secret, nil, label, keySize)
		if err != nil {
			return nil, fmt.Errorf("derive key %d: %w", k.ID, err)
		}
		out = append(out, Key{ID: k.ID, Secret: secret})
	}
	return out, nil
}
