package admission

import (
	"errors"
	"testing"
)

// TestFieldError: one type for every package's bad field: its text names
// the package and the field, ConfigField gives both ("" is admission),
// and the cause stays reachable through a %w.
func TestFieldError(t *testing.T) {
	cause := errors.New("boom")
	for _, tc := range []struct {
		err        error
		text       string
		pkg, field string
	}{
		{fieldError("MemoryConfig.Low", "must be positive"), "admission: MemoryConfig.Low: must be positive", "admission", "MemoryConfig.Low"},
		{&FieldError{Field: "ControllerConfig.Rules", Err: cause}, "admission: ControllerConfig.Rules: boom", "admission", "ControllerConfig.Rules"},
		{NewFieldError("sip", "TokenTTL", "must be at least %s", "1m"), "sip: TokenTTL: must be at least 1m", "sip", "TokenTTL"},
		{NewFieldError("lb", "HealthConfig.Rise", "%w", cause), "lb: HealthConfig.Rise: boom", "lb", "HealthConfig.Rise"},
	} {
		if got := tc.err.Error(); got != tc.text {
			t.Errorf("Error() = %q, want %q", got, tc.text)
		}
		var fe *FieldError
		if !errors.As(tc.err, &fe) {
			t.Fatalf("%v is no *FieldError", tc.err)
		}
		if pkg, field := fe.ConfigField(); pkg != tc.pkg || field != tc.field {
			t.Errorf("ConfigField() = %q, %q, want %q, %q", pkg, field, tc.pkg, tc.field)
		}
	}
	if err := NewFieldError("lb", "X", "%w", cause); !errors.Is(err, cause) {
		t.Error("the cause is lost")
	}
}
