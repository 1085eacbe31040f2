package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunBadKeyRing: a key ring file with a bad line, given by the flag or
// its environment twin, stops start-up with a message naming the flag, the
// file and the line.
func TestRunBadKeyRing(t *testing.T) {
	dir := t.TempDir()
	ring := filepath.Join(dir, "ring")
	content := "# keys\n1 00112233445566778899aabbccddeeff\n2 not-hex\n"
	if err := os.WriteFile(ring, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"-data-dir", dir, "-http-listen", "127.0.0.1:0", "-admin-listen", "", "-http-backend", "127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		args []string
		env  string
	}{
		{"flag", append(base, "-affinity-key-file", ring), ""},
		{"env", base, ring},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("SLUICE_AFFINITY_KEY_FILE", tc.env)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			code := run(ctx, tc.args, io.Discard, &stderr, nil)
			for _, want := range []string{"-affinity-key-file", ring, "line 3"} {
				if code == 0 || !strings.Contains(stderr.String(), want) {
					t.Errorf("exit %d, stderr %q; want a failure naming %q", code, stderr.String(), want)
				}
			}
			if got, _ := os.ReadFile(ring); string(got) != content {
				t.Error("the key ring file was changed")
			}
		})
	}
}
