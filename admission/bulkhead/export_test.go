package bulkhead

import "github.com/outboundhq/outbound/internal/shard"

// StripeAfter is the contention threshold, for tests.
const StripeAfter = shard.After

// Contend records one failed compare-and-swap on h's pool.
func Contend(h *Bulkhead) { h.contention() }

// Striped reports whether h's slots are spread over per-processor cells.
func Striped(h *Bulkhead) bool { return h.stripes.Load() != nil }

// Waiting reports how many attempts wait for a slot.
func (h *Bulkhead) Waiting() int64 { return h.waiting.Load() }
