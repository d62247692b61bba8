package classify

import (
	"context"
	"errors"
)

// Causes of a failed attempt that the attempt layer reports, matched with
// errors.Is. Each ends an attempt with a category of its own: a local
// rejection for ErrInvalidRequest and ErrTooManyUpstreams, and for
// ErrAttemptTimeout whatever the attempt had sent when it ended.
var (
	// ErrAttemptTimeout is the context cause a caller sets (with
	// context.WithTimeoutCause) for a per-attempt timeout, as
	// outbound.Config.AttemptTimeout does. An attempt whose context ended
	// with this cause counts as an upstream failure (too slow); an attempt
	// whose context ended for any other reason was cancelled by the caller
	// and counts as neither success nor failure.
	//
	// It reports itself the way net/http reports a timeout: it is a
	// net.Error whose Timeout is true, and errors.Is(ErrAttemptTimeout,
	// context.DeadlineExceeded) holds.
	ErrAttemptTimeout error = attemptTimeout{}

	// ErrInvalidRequest matches the error of an attempt whose request
	// net/http would refuse to send: an invalid method, header or trailer
	// field, or Host; a control character in the URL's query; a
	// ContentLength without a Body. Such a request is refused before it
	// asks any guard, so it is never an upstream failure and never retried.
	ErrInvalidRequest = errors.New("invalid request")

	// ErrTooManyUpstreams is the error of an attempt to a new upstream when
	// as many upstreams as the configuration's MaxUpstreams are kept and
	// none of them can be forgotten (each holds a permit or a connection,
	// or its breaker has failures in its window or is not CLOSED). The
	// attempt was not sent.
	ErrTooManyUpstreams = errors.New("outbound: too many upstreams (Config.MaxUpstreams), none of which can be forgotten")
)

type attemptTimeout struct{}

func (attemptTimeout) Error() string   { return "outbound: attempt timed out" }
func (attemptTimeout) Timeout() bool   { return true }
func (attemptTimeout) Temporary() bool { return true }

// Is makes errors.Is(ErrAttemptTimeout, context.DeadlineExceeded) hold.
func (attemptTimeout) Is(target error) bool { return target == context.DeadlineExceeded }
