package bulkhead_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outboundhq/outbound/admission/bulkhead"
)

// Noisy latency (each answer's up to ±jitter of the model's) neither brings
// the limit down (the lowest of many noisy window means is below their true
// mean) nor lets it run away: the thresholds move up with the noise. At a
// capacity of 100 every answer's square is in the noise estimate; at 2,000
// the windows are long and one answer in 16 is.
func TestNoisyLatencyNeitherCollapsesNorInflatesTheAdaptiveLimit(t *testing.T) {
	for _, capacity := range []int{100, 2000} {
		for _, c := range []struct {
			jitter float64
			lo, hi float64 // bounds on the limit, in capacities
		}{{0.1, 0.9, 1.1}, {0.2, 0.9, 1.15}, {0.5, 0.9, 1.35}} {
			h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 10 * capacity})
			r := rand.New(rand.NewPCG(1, 2))
			q := queue{c: capacity, base: 10 * time.Millisecond}
			for h.Windows() < 300 {
				n := 0
				for n < 4*capacity && h.TryAcquire() {
					n++
				}
				before := h.Windows()
				for range n {
					h.ReleaseAfter(time.Duration(float64(q.latency(n)) * (1 - c.jitter + 2*c.jitter*r.Float64())))
				}
				if w := h.Windows(); w != before && w > 10 && w%bulkhead.RefreshEvery != 0 {
					if l := float64(h.Limit()) / float64(capacity); l < c.lo || l > c.hi {
						t.Fatalf("capacity %d, jitter ±%v: limit %d after %d windows", capacity, c.jitter, h.Limit(), w)
					}
				}
			}
		}
	}
}
