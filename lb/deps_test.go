package lb

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports enforces the layering rule: lb imports the standard library
// and admission only; the memory probe may also import the Prometheus text
// parser and its data model.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string]bool{
		"github.com/sluicelb/sluice/admission":  true,
		"github.com/prometheus/common/expfmt":   true,
		"github.com/prometheus/common/model":    true,
		"github.com/prometheus/client_model/go": true,
	}
	for _, imp := range strings.Fields(string(out)) {
		if strings.Contains(strings.SplitN(imp, "/", 2)[0], ".") && !allowed[imp] {
			t.Errorf("lb imports %s; only the standard library, admission and expfmt are allowed", imp)
		}
	}
}
