package lb

import "github.com/sluicelb/sluice/admission"

// FieldError reports an invalid configuration field of lb by its Go name
// (type and field, e.g. "HealthConfig.Rise"); it is admission.FieldError,
// the one type of every package, with Pkg "lb".
type FieldError = admission.FieldError

func fieldError(field, format string, a ...any) error {
	return admission.NewFieldError("lb", field, format, a...)
}
