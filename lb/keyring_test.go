package lb

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	hexA = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	hexB = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestParseKeyRing(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []Key
		err  string // substring; "" = no error
	}{
		{"one key", "1 " + hexA + "\n", []Key{{1, mustHex(hexA)}}, ""},
		{"comments, blanks, CRLF, tabs, upper case", "# ring\r\n\r\n0\t" + strings.ToUpper(hexA) + "  # old\r\n  7 " + hexB + "\r\n",
			[]Key{{0, mustHex(hexA)}, {7, mustHex(hexB)}}, ""},
		{"no final newline", "255 " + hexB, []Key{{255, mustHex(hexB)}}, ""},
		{"order kept, newest last", "9 " + hexB + "\n2 " + hexA + "\n", []Key{{9, mustHex(hexB)}, {2, mustHex(hexA)}}, ""},
		{"three fields", "1 " + hexA + "\n2 " + hexB + " extra\n", nil, "line 2: 3 fields"},
		{"id only", "# c\n5\n6 " + hexA, nil, "line 2: 1 fields"},
		{"id too big", "256 " + hexA, nil, `line 1: key id "256"`},
		{"negative id", "-1 " + hexA, nil, `line 1: key id "-1"`},
		{"word id", "new " + hexA, nil, `line 1: key id "new"`},
		{"duplicate id", "1 " + hexA + "\n\n1 " + hexB, nil, "line 3: key id 1 already used on line 1"},
		{"not hex", "1 " + strings.Repeat("zz", 32), nil, "line 1: key 1: not hexadecimal"},
		{"odd length", "1 " + hexA[:63], nil, "line 1: key 1: not hexadecimal (63 characters"},
		{"short key", "1 00112233445566778899aabbccddee", nil, "line 1: key 1: 15 bytes, want at least 16"},
		{"no keys", "# nothing yet\n\n", nil, "no keys"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseKeyRing([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.err)
				}
				// An error must never echo key material.
				if strings.Contains(err.Error(), hexA[:32]) || strings.Contains(err.Error(), hexB[:32]) {
					t.Errorf("error quotes a key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("error = %v", err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d keys, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if got[i].ID != tc.want[i].ID || !bytes.Equal(got[i].Secret, tc.want[i].Secret) {
					t.Errorf("key %d = %d %x, want %d %x", i, got[i].ID, got[i].Secret, tc.want[i].ID, tc.want[i].Secret)
				}
			}
		})
	}
	if _, err := ParseKeyRing([]byte("1 00112233445566778899aabbccddee")); !errors.Is(err, ErrKeyTooShort) {
		t.Errorf("short key error = %v, want ErrKeyTooShort", err)
	}
}

// TestLoadOrCreateKeyRing covers the formats one -affinity-key-file may
// hold and what each becomes.
func TestLoadOrCreateKeyRing(t *testing.T) {
	dir := t.TempDir()
	binary := append([]byte{0x00, 0xff, 0x10}, testKey...)
	tests := []struct {
		name    string
		content []byte // nil: no file
		want    []Key
		err     string
	}{
		{"binary single key", binary, []Key{{0, binary}}, ""},
		{"hex text single key, newline kept", []byte(hexA + "\n"), []Key{{0, []byte(hexA + "\n")}}, ""},
		{"passphrase single key", []byte("a-long-passphrase-used-as-key"), []Key{{0, []byte("a-long-passphrase-used-as-key")}}, ""},
		{"key ring", []byte("# rotated 2026-12\n1 " + hexA + "\n2 " + hexB + "\n"), []Key{{1, mustHex(hexA)}, {2, mustHex(hexB)}}, ""},
		{"single line ring", []byte("3 " + hexA), []Key{{3, mustHex(hexA)}}, ""},
		{"ring with a bad line", []byte("1 " + hexA + "\n2 " + hexB + "\n3 xyz\n"), nil, "line 3: key 3: not hexadecimal"},
		{"short binary key", []byte{1, 2, 0xff}, nil, "3 bytes"},
		{"short text key", []byte("tiny"), nil, "4 bytes"},
		{"only comments", []byte("# todo\n"), nil, "no keys"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.Repeat("k", i+1))
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := LoadOrCreateKeyRing(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), path) {
					t.Fatalf("error = %v, want one naming %s and containing %q", err, path, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("error = %v", err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d keys, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if got[i].ID != tc.want[i].ID || !bytes.Equal(got[i].Secret, tc.want[i].Secret) {
					t.Errorf("key %d = %d %q, want %d %q", i, got[i].ID, got[i].Secret, tc.want[i].ID, tc.want[i].Secret)
				}
			}
		})
	}

	t.Run("missing file is created", func(t *testing.T) {
		path := filepath.Join(dir, "new", "affinity.key")
		ring, err := LoadOrCreateKeyRing(path)
		if err != nil {
			t.Fatal(err)
		}
		onDisk, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(ring) != 1 || ring[0].ID != 0 || !bytes.Equal(ring[0].Secret, onDisk) || len(onDisk) != keySize {
			t.Fatalf("ring = %v, file %d bytes; want {0: the file's %d bytes}", ring, len(onDisk), keySize)
		}
		again, err := LoadOrCreateKeyRing(path)
		if err != nil || !bytes.Equal(again[0].Secret, onDisk) {
			t.Fatalf("second load: %v, %v", again, err)
		}
	})
}

// TestMigrateSingleKeyToRing follows the README: the single key file
// becomes key 0 of a ring, a new key is appended; cookies and dialog
// tokens issued before (version 1 and 2) keep working and new ones use
// the new key.
func TestMigrateSingleKeyToRing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "affinity.key")
	oldSecret, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := LoadOrCreateKeyRing(path)
	if err != nil {
		t.Fatal(err)
	}
	before := ringSigner(t, ring...)
	tok := before.Token("10.0.0.7:5060", t0.Add(time.Hour))
	v1 := legacyToken(oldSecret, "10.0.0.7:8080", t0.Add(time.Hour))

	text := "# migrated from the single key\n0 " + hex.EncodeToString(oldSecret) + "\n1 " + hexB + "\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	ring, err = LoadOrCreateKeyRing(path)
	if err != nil {
		t.Fatal(err)
	}
	after := ringSigner(t, ring...)
	if id, ok := after.Verify(tok, t0); !ok || id != "10.0.0.7:5060" {
		t.Errorf("token from the single key after migration: %q %v", id, ok)
	}
	if id, ok := after.Verify(v1, t0); !ok || id != "10.0.0.7:8080" {
		t.Errorf("version 1 token after migration: %q %v", id, ok)
	}
	if after.NewestKeyID() != 1 {
		t.Errorf("sealing with key %d, want 1", after.NewestKeyID())
	}
}

// legacyToken builds a version 1 token as the release before encryption
// did, with crypto/hmac.
func legacyToken(key []byte, id string, exp time.Time) string {
	raw := []byte{tokenV1}
	raw = append(raw, byte(exp.Unix()>>56), byte(exp.Unix()>>48), byte(exp.Unix()>>40), byte(exp.Unix()>>32),
		byte(exp.Unix()>>24), byte(exp.Unix()>>16), byte(exp.Unix()>>8), byte(exp.Unix()))
	raw = append(raw, byte(len(id)))
	raw = append(raw, id...)
	h := hmac.New(sha256.New, key)
	h.Write(raw)
	raw = append(raw, h.Sum(nil)[:macSize]...)
	return b64.EncodeToString(raw)
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
	if _, err := LoadOrCreateKeyRing(asDir); err == nil || !strings.Contains(err.Error(), asDir) {
		t.Errorf("unreadable key ring error = %v, want an error naming %s", err, asDir)
	}
}

// TestDeriveKeys: a derived key keeps its id, is the same on every node
// for the same secret and label, and is unrelated to the secret and to
// other labels' keys; a short secret is refused.
func TestDeriveKeys(t *testing.T) {
	ring := []Key{{ID: 3, Secret: bytes.Repeat([]byte{3}, 32)}, {ID: 9, Secret: bytes.Repeat([]byte{9}, 16)}}
	a, err := DeriveKeys(ring, "use a")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := DeriveKeys(ring, "use a")
	b, _ := DeriveKeys(ring, "use b")
	for i := range ring {
		if a[i].ID != ring[i].ID || len(a[i].Secret) != 32 {
			t.Errorf("key %d: id %d, %d bytes", i, a[i].ID, len(a[i].Secret))
		}
		if !bytes.Equal(a[i].Secret, again[i].Secret) {
			t.Errorf("key %d: derived twice, two keys", i)
		}
		if bytes.Equal(a[i].Secret, b[i].Secret) || bytes.Contains(a[i].Secret, ring[i].Secret[:16]) {
			t.Errorf("key %d: derived key related to another label's or to the secret", i)
		}
	}
	if !bytes.Equal(ring[0].Secret, bytes.Repeat([]byte{3}, 32)) {
		t.Error("the ring was modified")
	}
	if _, err := DeriveKeys([]Key{{ID: 1, Secret: []byte("short")}}, "x"); !errors.Is(err, ErrKeyTooShort) {
		t.Errorf("short secret: %v", err)
	}
}
