package tlsedge

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsStayLow enforces the layering that lets http, sip and node
// all import tlsedge: besides the standard library, only admission and
// internal/opfile.
func TestImportsStayLow(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}}`, "github.com/sluicelb/sluice/tlsedge").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{"github.com/sluicelb/sluice/admission": true, "github.com/sluicelb/sluice/internal/opfile": true}
	for _, imp := range strings.Fields(string(out)) {
		if first, _, _ := strings.Cut(imp, "/"); strings.Contains(first, ".") && !allowed[imp] {
			t.Errorf("tlsedge imports %s; it may import only the standard library, admission and internal/opfile", imp)
		}
	}
}
