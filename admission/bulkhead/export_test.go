package bulkhead

import "github.com/outboundhq/outbound/internal/shard"

// StripeAfter is the contention threshold, for tests.
const StripeAfter = shard.After

// Contend records one failed compare-and-swap on h's pool.
func Contend(h *Bulkhead) { h.contention() }

// Striped reports whether h's slots are spread over per-processor cells.
func Striped(h *Bulkhead) bool { return h != nil && h.stripes.Load() != nil }

// Waiting reports how many attempts wait for a slot.
func (h *Bulkhead) Waiting() int64 { return h.waiting.Load() }

// TryAcquireHint takes a slot from the cell hint chooses.
func TryAcquireHint(h *Bulkhead, hint uint32) bool { return h == nil || h.tryAcquire(hint) }

// ReleaseHint gives a slot back into the cell hint chooses.
func ReleaseHint(h *Bulkhead, hint uint32) { h.release(hint) }

// MinWindow is the fewest answers in a sampling window of an adaptive
// bulkhead.
const MinWindow = minWindow

// RefreshEvery is how many sampling windows apart an adaptive bulkhead runs
// one at half its limit, to see the uncongested latency again.
const RefreshEvery = refreshEvery
