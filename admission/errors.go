package admission

import (
	"errors"

	"github.com/outboundhq/outbound/classify"
)

// ErrRejected matches every *RejectedError with errors.Is.
var ErrRejected = errors.New("admission: attempt rejected by a local guard")

// RejectedError says that a local guard refused an attempt before it left the
// process: the upstream never saw it. Err is the guard's reason:
// circuit.ErrOpen, circuit.ErrHalfOpenFull, ratelimit.ErrLimited,
// bulkhead.ErrFull, or the context's error if the attempt gave up waiting.
type RejectedError struct {
	Upstream string
	Guard    classify.Guard
	Err      error
}

func (e *RejectedError) Error() string {
	return "admission: " + e.Upstream + ": rejected by the " + e.Guard.String() + " guard: " + e.Err.Error()
}

// Unwrap returns the guard's reason.
func (e *RejectedError) Unwrap() error { return e.Err }

// Is reports whether target is ErrRejected.
func (e *RejectedError) Is(target error) bool { return target == ErrRejected }
