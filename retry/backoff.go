package retry

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/outboundhq/outbound/internal/cfgerr"
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

// Validate reports the first field of b that is invalid, or contradicts
// another once the defaults apply: a negative wait, a Max below Initial, a
// Multiplier below 1 (a wait that shrinks is no backoff) or a Jitter above 1.
func (b Backoff) Validate() error {
	d := b.withDefaults()
	bad := func(field, format string, args ...any) error {
		return &cfgerr.FieldError{Pkg: "retry", Type: "Backoff", Path: []string{field}, Issue: fmt.Sprintf(format, args...)}
	}
	switch {
	case b.Initial < 0:
		return bad("Initial", "must be >= 0, got %v", b.Initial)
	case b.Max < 0:
		return bad("Max", "must be >= 0, got %v", b.Max)
	case d.Max < d.Initial:
		note := ""
		if b.Initial == 0 {
			note = ", the default"
		}
		return bad("Max", "must be at least Initial (%v%s), got %v", d.Initial, note, d.Max)
	case b.Multiplier != 0 && b.Multiplier < 1:
		return bad("Multiplier", "must be 0 (the default, 2) or at least 1, got %v", b.Multiplier)
	case b.Jitter > 1:
		return bad("Jitter", "must be at most 1 (negative: none), got %v", b.Jitter)
	}
	return nil
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
