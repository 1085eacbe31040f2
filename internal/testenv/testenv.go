// Package testenv decides what a test does when a real component it needs
// (a program such as redis-server, sipp, wrk, promtool or chromium, or a
// privilege such as mounting a tmpfs) is missing. On a developer's machine
// the test skips and says what to install; in CI (the CI variable set to
// anything, as .ci/run does) it fails, so a CI run can never pass while a
// real-component test quietly did not run.
//
// Only tests import this package.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run in CI: the CI variable is set to any
// value.
func InCI() bool { return os.Getenv("CI") != "" }

// Tool returns the path of program name. When it is missing the test
// fails in CI and skips elsewhere; pkg names the Debian package that
// scripts/install-test-deps.sh installs for it.
func Tool(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	Missing(t, name+" not installed (Debian package "+pkg+"; scripts/install-test-deps.sh installs it)")
	return ""
}

// Missing ends a test whose real component is unavailable for the reason
// given: a failure in CI, a skip elsewhere.
func Missing(t testing.TB, why string) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s; CI is set, so this test may not skip", why)
		return
	}
	t.Skip(why)
}
