package testenv

import (
	"testing"
)

// fakeT records how a test ended without ending the real one.
type fakeT struct {
	testing.TB
	failed, skipped bool
}

func (f *fakeT) Helper()                           {}
func (f *fakeT) Fatalf(format string, args ...any) { f.failed = true }
func (f *fakeT) Skip(args ...any)                  { f.skipped = true }

func TestMissingFailsInCIAndSkipsElsewhere(t *testing.T) {
	for _, tc := range []struct {
		ci               string
		wantFail, wantSk bool
	}{
		{ci: "", wantSk: true},
		{ci: "1", wantFail: true},
		{ci: "true", wantFail: true},
	} {
		t.Setenv("CI", tc.ci)
		f := &fakeT{}
		Tool(f, "no-such-program-sluice-test", "none")
		if f.failed != tc.wantFail || f.skipped != tc.wantSk {
			t.Errorf("CI=%q: failed=%v skipped=%v, want failed=%v skipped=%v", tc.ci, f.failed, f.skipped, tc.wantFail, tc.wantSk)
		}
	}
}

func TestToolFindsAProgram(t *testing.T) {
	t.Setenv("CI", "1")
	f := &fakeT{}
	if p := Tool(f, "go", "golang"); p == "" || f.failed || f.skipped {
		t.Fatalf("go not found: %q failed=%v skipped=%v", p, f.failed, f.skipped)
	}
}
