package demo

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsStdlibOnly keeps demo/ on the standard library, so that it can
// be embedded anywhere (its tests may use more).
func TestImportsStdlibOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/sluicelb/sluice/demo" {
			t.Errorf("demo depends on %s; it may import the standard library only", p)
		}
	}
}
