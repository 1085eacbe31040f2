package lb

import (
	"errors"
	"testing"
)

// TestNewPolicyNoBackends: every policy refuses an empty backend list
// (consistent-hash used to loop for ever filling its table).
func TestNewPolicyNoBackends(t *testing.T) {
	for _, name := range PolicyNames {
		if _, err := NewPolicy(name, nil); !errors.Is(err, ErrNoBackends) {
			t.Errorf("NewPolicy(%q, nil) err = %v, want ErrNoBackends", name, err)
		}
	}
}
