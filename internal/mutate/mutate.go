// Package mutate holds deliberate faults that a test switches on to prove
// that the checks meant to catch them can fail. Each switch breaks one
// invariant of the library, exactly as a plausible bug would. They are read
// only on rare paths (rejections), never on the fast path, and nothing outside
// tests sets them.
package mutate

import "sync/atomic"

var (
	// KeepCircuitPermitOnLocalRejection leaves the circuit permission held
	// when the rate limiter or the bulkhead rejects an attempt: the bug
	// that starves a HALF_OPEN breaker of its trial slots.
	KeepCircuitPermitOnLocalRejection atomic.Bool

	// SkipRateRefundOnBulkheadRejection keeps the rate token of an attempt
	// that the bulkhead rejected.
	SkipRateRefundOnBulkheadRejection atomic.Bool

	// ResendOneShotBodies treats a one-shot body that was already sent as
	// if it could be sent again (the retry decision's body rule, D2).
	ResendOneShotBodies atomic.Bool
)
