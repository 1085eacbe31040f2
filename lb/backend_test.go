package lb

import (
	"errors"
	"strings"
	"testing"
)

// TestLastProbeError: the failed health check's error is kept for the
// operator's lines until a check passes.
func TestLastProbeError(t *testing.T) {
	b := newBackends(t, 1)[0]
	if e := b.LastProbeError(); e != "" {
		t.Fatalf("new backend: %q, want none", e)
	}
	b.setProbeErr(errors.New("tls: failed to verify certificate: x509: certificate is valid for backend.test, not wrong.test"))
	if e := b.LastProbeError(); !strings.Contains(e, "x509: certificate is valid for backend.test") {
		t.Fatalf("after a failed check: %q", e)
	}
	b.setProbeErr(nil)
	if e := b.LastProbeError(); e != "" {
		t.Fatalf("after a passed check: %q, want none", e)
	}
}
