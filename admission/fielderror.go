package admission

import "fmt"

// FieldError reports an invalid configuration field by its Go name: the
// one error type every sluice package uses for a bad Config field (lb,
// http, sip and cluster name it FieldError too, as an alias). cmd/sluice
// maps Pkg and Field to the flag that sets the field, so the operator
// reads flags where the libraries speak of fields.
type FieldError struct {
	// Pkg is the package whose Config holds Field ("lb", "http", "sip",
	// "cluster"); "" is admission.
	Pkg string
	// Field is the field at fault, as a Go selector inside Pkg, e.g.
	// "MemoryConfig.Low" or, for a package's own Config, "TokenTTL".
	Field string
	// Err says what is wrong with the value.
	Err error
}

func (e *FieldError) Error() string {
	pkg, field := e.ConfigField()
	return pkg + ": " + field + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// ConfigField names the package and the field at fault.
func (e *FieldError) ConfigField() (pkg, field string) {
	if e.Pkg == "" {
		return "admission", e.Field
	}
	return e.Pkg, e.Field
}

// NewFieldError returns a *FieldError of pkg's field with the message of
// format and a (which may wrap an error with %w).
func NewFieldError(pkg, field, format string, a ...any) error {
	return &FieldError{Pkg: pkg, Field: field, Err: fmt.Errorf(format, a...)}
}

func fieldError(field, format string, a ...any) error {
	return NewFieldError("admission", field, format, a...)
}
