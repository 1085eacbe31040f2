package lb

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports enforces the layering rule: lb imports the standard library,
// admission and internal/opfile (bounded reads of operator files; standard
// library only) and nothing else (the memory probe scans its series itself).
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{
		"github.com/sluicelb/sluice/admission":       true,
		"github.com/sluicelb/sluice/internal/opfile": true,
	}
	for _, imp := range strings.Fields(string(out)) {
		if strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") && !allowed[imp] {
			t.Errorf("lb imports %s; only the standard library, admission and internal/opfile are allowed", imp)
		}
	}
}
