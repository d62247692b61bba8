// Package clock reads the monotonic clock cheaply.
//
// Now costs one monotonic clock read (time.Since on a time with a monotonic
// reading), about half of time.Now, which also reads the wall clock. Inside a
// testing/synctest bubble it follows the bubble's fake clock, so the guards
// that use it are tested without sleeping on the real clock. Its values have an
// arbitrary origin (inside a bubble they are even negative): compare them only
// with each other.
package clock

import "time"

var origin = time.Now()

// Now returns the monotonic time in nanoseconds since an arbitrary origin.
func Now() int64 { return int64(time.Since(origin)) }

// Never is a time before every value Now can return, inside or outside a
// synctest bubble, and far enough from the int64 limits that adding a few
// centuries to it cannot overflow.
const Never int64 = -1 << 62
