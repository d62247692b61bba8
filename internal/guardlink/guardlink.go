// Package guardlink lets the admission pipeline reach the paths of the rate
// limiter and the bulkhead that take a processor hint (internal/shard),
// which are not part of their API: the pipeline looks the hint up once for
// both guards and keeps it for the bulkhead's release. The guards' packages
// set these functions when they are initialized; each takes the guard (a
// *ratelimit.Limiter or a *bulkhead.Bulkhead, possibly nil) as its first
// argument.
package guardlink

var (
	// LimiterStriped reports whether the limiter leases tokens to
	// per-processor cells.
	LimiterStriped func(limiter any) bool
	// LimiterTake takes a token at once, from the cell hint chooses if the
	// limiter is striped (any hint is correct; 0: look it up).
	LimiterTake func(limiter any, hint uint32) bool

	// BulkheadStriped reports whether the bulkhead has spread its slots
	// over per-processor cells.
	BulkheadStriped func(bulkhead any) bool
	// BulkheadTake takes a slot at once, from the cell hint chooses.
	BulkheadTake func(bulkhead any, hint uint32) bool
	// BulkheadRelease gives a slot back, into the cell hint chooses.
	BulkheadRelease func(bulkhead any, hint uint32)
)
