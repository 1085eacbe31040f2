package http

import (
	"os/exec"
	"strings"
	"testing"
)

// TestOnlyImporterOfFasthttp enforces the layering rule: no package of the
// module but this one imports fasthttp directly.
func TestOnlyImporterOfFasthttp(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "github.com/sluicelb/sluice/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] == "github.com/sluicelb/sluice/http" {
			continue
		}
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, "github.com/valyala/fasthttp") {
				t.Errorf("%s imports %s; only http may", fields[0], imp)
			}
		}
	}
}
