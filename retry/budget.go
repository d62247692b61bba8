package retry

import (
	"fmt"
	"math"
	"sync/atomic"

	"github.com/outboundhq/outbound/internal/cfgerr"
)

// BudgetConfig configures a retry budget: gRPC's retry throttling (gRFC A6).
// The zero value means the defaults below.
//
// Why this one: it needs no clock and no window, costs one atomic operation
// per attempt, and throttles on the ratio of failures to successes, which is
// exactly what distinguishes a dead upstream (every attempt fails: the
// bucket drains and retries stop after a handful) from a healthy one with
// occasional failures (successes refill it). Envoy's alternative, a
// percentage of the requests in flight, needs the active-request count and
// lets retries through in proportion to load, which is what a retry storm is.
type BudgetConfig struct {
	// MaxTokens is the bucket's size. Each failed attempt takes one token,
	// each success adds TokenRatio; retries are allowed while the bucket
	// holds more than half of MaxTokens. Default 10: against an upstream that
	// fails everything, a burst of calls makes at most about 5 retries.
	MaxTokens float64
	// TokenRatio is what a success gives back. Default 0.1.
	TokenRatio float64
}

// Budget is a per-upstream retry budget. It is safe for concurrent use.
type Budget struct {
	milli atomic.Int64 // tokens × 1000
	max   int64
	ratio int64
}

// NewBudget validates cfg and returns a full Budget. Errors name the field.
func NewBudget(cfg BudgetConfig) (*Budget, error) {
	if cfg.MaxTokens == 0 {
		cfg.MaxTokens = 10
	}
	if cfg.TokenRatio == 0 {
		cfg.TokenRatio = 0.1
	}
	if !(cfg.MaxTokens > 0 && cfg.MaxTokens <= 1e6) {
		return nil, &cfgerr.FieldError{Pkg: "retry", Type: "BudgetConfig", Path: []string{"MaxTokens"}, Issue: fmt.Sprintf("must be in (0, 1e6], got %v", cfg.MaxTokens)}
	}
	if !(cfg.TokenRatio > 0 && cfg.TokenRatio <= cfg.MaxTokens) {
		return nil, &cfgerr.FieldError{Pkg: "retry", Type: "BudgetConfig", Path: []string{"TokenRatio"}, Issue: fmt.Sprintf("must be in (0, MaxTokens], got %v", cfg.TokenRatio)}
	}
	b := &Budget{max: int64(math.Round(cfg.MaxTokens * 1000)), ratio: int64(math.Round(cfg.TokenRatio * 1000))}
	b.milli.Store(b.max)
	return b, nil
}

// OnFailure records a failed attempt (an attempt whose outcome makes the
// caller consider a retry).
func (b *Budget) OnFailure() { b.add(-1000) }

// OnSuccess records a successful attempt.
func (b *Budget) OnSuccess() { b.add(b.ratio) }

func (b *Budget) add(delta int64) {
	for {
		old := b.milli.Load()
		v := min(max(old+delta, 0), b.max)
		if v == old || b.milli.CompareAndSwap(old, v) {
			return
		}
	}
}

// Allows reports whether a retry may be made now.
func (b *Budget) Allows() bool { return b.milli.Load() > b.max/2 }

// Above reports whether the bucket holds more than share of the tokens it
// can hold: Allows is Above(0.5).
func (b *Budget) Above(share float64) bool { return float64(b.milli.Load()) > share*float64(b.max) }

// Full reports whether the bucket holds every token it can.
func (b *Budget) Full() bool { return b.milli.Load() == b.max }

// Tokens returns the tokens in the bucket.
func (b *Budget) Tokens() float64 { return float64(b.milli.Load()) / 1000 }
