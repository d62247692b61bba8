// Package cfgerr names an invalid configuration field by its whole path from
// the configuration the user wrote: "outbound: Config.Admission.Rate.Burst
// must be >= 0, got -1", not a chain of one prefix per layer.
package cfgerr

import (
	"errors"
	"fmt"
	"strings"
)

// FieldError is an invalid field.
type FieldError struct {
	Pkg   string   // the package of the configuration the path starts from
	Type  string   // its type: "Config", "BudgetConfig"
	Path  []string // the field names, outermost first
	Issue string   // what is wrong, e.g. "must be >= 0, got -1"
}

func (e *FieldError) Error() string {
	return e.Pkg + ": " + e.Type + "." + strings.Join(e.Path, ".") + " " + e.Issue
}

// New returns the error of field of pkg's Config.
func New(pkg, field, format string, args ...any) error {
	return &FieldError{Pkg: pkg, Type: "Config", Path: strings.Split(field, "."), Issue: fmt.Sprintf(format, args...)}
}

// In returns err, an error of a configuration held in field of pkg's
// Config, as an error of that Config; field "" means the same fields (a
// configuration that mirrors another). An err that is not an *Error is
// returned unchanged.
func In(pkg, field string, err error) error {
	var e *FieldError
	if !errors.As(err, &e) {
		return err
	}
	out := &FieldError{Pkg: pkg, Type: "Config", Path: e.Path, Issue: e.Issue}
	if field != "" {
		out.Path = append(strings.Split(field, "."), e.Path...)
	}
	return out
}
