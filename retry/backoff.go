package retry

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff configures the wait between attempts: exponential, with jitter.
// Every zero value means the default in its comment.
type Backoff struct {
	// Initial is the wait before the second attempt. Default 100ms.
	Initial time.Duration
	// Max bounds every wait. Default 5s.
	Max time.Duration
	// Multiplier grows the wait after each attempt. Default 2.
	Multiplier float64
	// Jitter spreads each wait uniformly over ±Jitter of itself, in [0, 1].
	// Default 0.2. Negative means none.
	Jitter float64
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = 100 * time.Millisecond
	}
	if b.Max == 0 {
		b.Max = 5 * time.Second
	}
	if b.Multiplier == 0 {
		b.Multiplier = 2
	}
	switch {
	case b.Jitter == 0:
		b.Jitter = 0.2
	case b.Jitter < 0:
		b.Jitter = 0
	}
	return b
}

// delay is Delay with the jitter's random draw r, uniform in [0, 1).
func (b Backoff) delay(n int, r float64) time.Duration {
	d := float64(b.Initial) * math.Pow(b.Multiplier, float64(n-1))
	d = math.Min(d, float64(b.Max))
	d *= 1 + b.Jitter*(2*r-1)
	return time.Duration(math.Min(d, float64(b.Max)))
}

// Delay returns the wait before attempt n+1 after n attempts, with jitter.
func (b Backoff) Delay(n int) time.Duration { return b.withDefaults().delay(n, rand.Float64()) }
