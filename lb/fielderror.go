package lb

import "fmt"

// FieldError reports an invalid configuration field by its Go name
// (type and field, e.g. "HealthConfig.Rise"); cmd/sluice maps the field to its flag.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return "lb: " + e.Field + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// ConfigField names the package and the field at fault.
func (e *FieldError) ConfigField() (pkg, field string) { return "lb", e.Field }

func fieldError(field, format string, a ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, a...)}
}
