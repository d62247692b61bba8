// Package mutate holds deliberate faults that a test switches on to prove
// that the checks meant to catch them can fail. Each switch breaks one
// invariant of the library, exactly as a plausible bug would.
//
// The switches exist only in a build with the tag mutate (go test -tags
// mutate), which scripts/test uses. In any other build every switch is the
// constant false — the branches that read them compile to nothing — and
// Enabled is false: a test that needs one skips.
package mutate

var (
	// KeepCircuitPermitOnLocalRejection leaves the circuit permission held
	// when the rate limiter or the bulkhead rejects an attempt: the bug
	// that starves a HALF_OPEN breaker of its trial slots.
	KeepCircuitPermitOnLocalRejection Switch

	// SkipRateRefundOnBulkheadRejection keeps the rate token of an attempt
	// that the bulkhead rejected.
	SkipRateRefundOnBulkheadRejection Switch

	// ResendOneShotBodies treats a one-shot body that was already sent as
	// if it could be sent again (the retry decision's body rule).
	ResendOneShotBodies Switch
)
