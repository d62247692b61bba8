// Package clocked carries to the admission pipeline the methods of the
// client-side throttle and the rate limiter that take a clock reading
// (clock.Now) instead of reading the clock: the pipeline reads it once for
// both guards, and once more for neither when the attempt ends (its
// admission time plus its duration). On this path a clock reading costs as
// much as a guard.
//
// Each guard's package sets its values in init, as method expressions
// behind any (this package imports neither guard), and the pipeline asserts
// their types once; users of those packages see only the methods that read
// the clock themselves.
package clocked

var (
	ThrottleAllow  any // func(*throttle.Throttle, int64, context.Context) bool
	ThrottleAccept any // func(*throttle.Throttle, int64)
	ThrottleFail   any // func(*throttle.Throttle, int64)
	LimiterTake    any // func(*ratelimit.Limiter, int64) bool
)
