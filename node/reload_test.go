package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadBackendsFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ body, want string }{
		{"ftp 127.0.0.1:1\n", ":1: protocol \"ftp\""},
		{"http\n", ":1: want"},
		{"# c\nhttp nohost\n", ":2:"},
	} {
		f := filepath.Join(dir, "b")
		os.WriteFile(f, []byte(tc.body), 0o600)
		if _, _, err := readBackendsFile(f); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "-backends-file") {
			t.Errorf("%q: err %v, want one with %q", tc.body, err, tc.want)
		}
	}
	if _, _, err := readBackendsFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file accepted")
	}
}
