// Package ratelimit is the rate-limiting guard of the admission pipeline: a
// token bucket whose token can be given back when the attempt it was taken
// for never reached the wire.
//
// The bucket is kept as GCRA (the generic cell rate algorithm): a single
// "theoretical arrival time" updated with compare-and-swap, so taking a token
// is one clock read and one atomic operation, with no lock, and refunding one
// is subtracting one emission interval. It admits exactly what a token bucket
// of the same rate and burst admits.
//
// Under contention from several processors the limiter stops making every
// caller write the one shared word: once it has seen repeated
// compare-and-swap failures, each processor leases a small batch of tokens
// from the bucket into a cell of its own (internal/shard) and takes from
// there, without reading the clock. A batch is at most Burst/(8 × cells) and
// at most 64 tokens, sized when the limiter switches, and a limiter whose
// burst is too small for batches of two never switches. A cell never holds
// more than a batch minus one. Leased tokens count as taken when leased, so
// the sustained rate is exact; what moves is when they are used: at the
// moment a burst is allowed, the tokens held in cells (together fewer than
// Burst/8) may be used on top of it. A caller that finds its cell and the
// bucket empty takes from another processor's cell before it is rejected.
//
// Why not golang.org/x/time/rate: its refund is Reservation.Cancel, reachable
// only through ReserveN, which returns a *Reservation that escapes to the heap
// once kept beyond the call (one allocation per attempt), and every call takes
// a mutex and reads the wall clock as well as the monotonic one. Together that
// is more than the whole admission pipeline may cost (see BENCHMARKS.md).
package ratelimit

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/internal/clock"
	"github.com/outboundhq/outbound/internal/clocked"
	"github.com/outboundhq/outbound/internal/shard"
)

func init() { clocked.LimiterTake = (*Limiter).tryAcquireAt }

// ErrLimited is returned when no token is available now and none would be
// within the configured wait.
var ErrLimited = errors.New("ratelimit: rate limit exceeded")

// Config configures a Limiter. The zero value means "no limit".
type Config struct {
	// PerSecond is the sustained number of tokens per second. Zero means no
	// limit: New returns a nil *Limiter, on which every method admits.
	PerSecond float64

	// Burst is how many tokens may be taken at once after an idle period.
	// Zero means one second's worth of PerSecond (at least 1).
	Burst int

	// MaxWait is the longest an attempt waits for a token. Zero means an
	// attempt that finds no token is rejected at once. The wait also ends,
	// with the context's error, when the context is done, and is not
	// started at all when the token would come after the context's deadline.
	MaxWait time.Duration
}

// Limiter is a token bucket with refunds. It is safe for concurrent use. A nil
// *Limiter admits everything.
type Limiter struct {
	// tat is the theoretical arrival time: the instant at which the bucket
	// would be full again if no token were taken from now on, minus one
	// interval. A token is available at now when tat+interval-now <= tau.
	tat       atomic.Int64
	stripes   atomic.Pointer[shard.Stripes]
	contended atomic.Int64 // failed compare-and-swaps on tat, until striped
	interval  int64        // nanoseconds per token
	tau       int64        // burst * interval
	maxWait   int64
}

// New validates cfg and returns a Limiter, or nil (no limit) when
// cfg.PerSecond is zero. Errors name the offending field.
func New(cfg Config) (*Limiter, error) {
	switch {
	case !(cfg.PerSecond >= 0 && cfg.PerSecond <= 1e9):
		return nil, cfgerr.New("ratelimit", "PerSecond", "must be in [0, 1e9], got %v", cfg.PerSecond)
	case cfg.Burst < 0:
		return nil, cfgerr.New("ratelimit", "Burst", "must be >= 0, got %d", cfg.Burst)
	case cfg.MaxWait < 0:
		return nil, cfgerr.New("ratelimit", "MaxWait", "must be >= 0, got %v", cfg.MaxWait)
	case cfg.PerSecond == 0:
		if cfg.Burst != 0 || cfg.MaxWait != 0 {
			return nil, cfgerr.New("ratelimit", "Burst", "and MaxWait need PerSecond > 0, got PerSecond 0")
		}
		return nil, nil
	}
	interval := max(1, int64(math.Round(float64(time.Second)/cfg.PerSecond)))
	burst := int64(cfg.Burst)
	if burst == 0 {
		burst = max(1, int64(math.Ceil(cfg.PerSecond)))
	}
	if burst > math.MaxInt64/4/interval {
		return nil, cfgerr.New("ratelimit", "Burst", "%d is too large for PerSecond %v", cfg.Burst, cfg.PerSecond)
	}
	l := &Limiter{interval: interval, tau: burst * interval, maxWait: int64(cfg.MaxWait)}
	l.tat.Store(clock.Never)
	if shard.Forced() {
		l.stripe(true)
	}
	return l, nil
}

// Acquire takes one token, waiting for it at most the configured MaxWait.
// It returns nil, ErrLimited, or ctx.Err() unchanged; on failure no token is
// held.
func (l *Limiter) Acquire(ctx context.Context) error {
	if l == nil || l.tryTake(0) {
		return nil
	}
	return l.acquireSlow(ctx)
}

// TryAcquire takes a token if one is available now, without waiting. A nil
// Limiter always has one.
func (l *Limiter) TryAcquire() bool { return l == nil || l.tryTake(0) }

// tryAcquireAt is TryAcquire at now, a clock.Now reading the caller has:
// the admission pipeline's, which reads the clock once for the throttle and
// the limiter (package clocked).
func (l *Limiter) tryAcquireAt(now int64) bool {
	if l == nil {
		return true
	}
	if s := l.stripes.Load(); s != nil {
		return l.takeStriped(s, s.Choose(0))
	}
	return l.take(now)
}

// tryTake takes a token available at once; hint chooses the per-processor
// cell a striped limiter takes from. Any hint is correct; one from the
// caller's processor is fastest; 0 means none (the limiter looks the
// processor up itself).
func (l *Limiter) tryTake(hint uint32) bool {
	if s := l.stripes.Load(); s != nil {
		return l.takeStriped(s, s.Choose(hint))
	}
	return l.take(clock.Now())
}

// take is the fast path: one attempt to take a token available at once.
func (l *Limiter) take(now int64) bool {
	old := l.tat.Load()
	next := max(old, now) + l.interval
	if next-now > l.tau {
		return false
	}
	if l.tat.CompareAndSwap(old, next) {
		return true
	}
	l.contention()
	return false
}

// contention counts a failed compare-and-swap on the bucket and stripes the
// limiter once there have been enough.
func (l *Limiter) contention() {
	if l.contended.Add(1) == shard.After && shard.Worthwhile() {
		l.stripe(false)
	}
}

// stripe makes the limiter lease tokens to per-processor cells from now on,
// if its burst is big enough for batches of two tokens per cell (or, forced,
// of one). A cell holds at most Batch-1 tokens, so all cells together hold
// less than Burst/8.
func (l *Limiter) stripe(force bool) {
	if s := shard.Plan(l.tau/l.interval, 8, force); s != nil {
		l.stripes.CompareAndSwap(nil, s)
	}
}

// takeStriped takes a token from cell c, or leases a batch from
// the bucket, or takes one from another processor's cell.
func (l *Limiter) takeStriped(s *shard.Stripes, c uint32) bool {
	return s.Take(c) || l.lease(s, c, clock.Now()) || s.Steal(c)
}

// lease takes up to a batch of tokens available at now from the bucket: one
// for the caller, the rest for cell c, which never holds more than Batch-1;
// what it has no room for (another caller filled it meanwhile) goes back to
// the bucket.
func (l *Limiter) lease(s *shard.Stripes, c uint32, now int64) bool {
	for {
		old := l.tat.Load()
		base := max(old, now)
		k := min(s.Batch, (l.tau-(base-now))/l.interval)
		if k < 1 {
			return false
		}
		if l.tat.CompareAndSwap(old, base+k*l.interval) {
			if k > 1 {
				if rest := s.PutUpTo(c, k-1, s.Batch-1); rest > 0 {
					l.tat.Add(-rest * l.interval)
				}
			}
			return true
		}
	}
}

func (l *Limiter) acquireSlow(ctx context.Context) error {
	wait, ok := l.reserve(clock.Now(), ctx)
	if !ok {
		return ErrLimited
	}
	if wait <= 0 {
		return nil
	}
	return l.sleep(ctx, wait)
}

// reserve takes a token at now if one is available at once, or if one will
// be within maxWait (and within ctx's deadline); it returns how long the
// caller must wait before using it.
func (l *Limiter) reserve(now int64, ctx context.Context) (wait int64, ok bool) {
	for {
		old := l.tat.Load()
		next := max(old, now) + l.interval
		wait = next - l.tau - now
		if wait > 0 {
			if wait > l.maxWait {
				return 0, false
			}
			if d, has := ctx.Deadline(); has && time.Until(d) < time.Duration(wait) {
				return 0, false
			}
		}
		if l.tat.CompareAndSwap(old, next) {
			return wait, true
		}
	}
}

func (l *Limiter) sleep(ctx context.Context, wait int64) error {
	t := time.NewTimer(time.Duration(wait))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		l.Refund()
		return ctx.Err()
	}
}

// Refund gives back one token taken by Acquire, for an attempt that never
// reached the wire. Refunding a token that was not taken lets one more
// attempt through than the rate allows; it never raises the burst.
func (l *Limiter) Refund() {
	if l == nil {
		return
	}
	l.tat.Add(-l.interval)
}

// Available reports how many tokens could be taken at once now.
func (l *Limiter) Available() int {
	if l == nil {
		return math.MaxInt
	}
	n := l.availableAt(clock.Now())
	if s := l.stripes.Load(); s != nil {
		n += int(s.Sum())
	}
	return n
}

// Full reports whether every token is back: no token taken is still owed,
// so a new limiter of the same configuration would allow no more than this
// one. (Tokens held in per-processor cells count as taken: a limiter that
// is full by this measure may allow a few more than a new one, never fewer.)
func (l *Limiter) Full() bool { return l == nil || l.tat.Load() <= clock.Now() }

func (l *Limiter) availableAt(now int64) int {
	used := max(l.tat.Load(), now) - now
	return int((l.tau - used) / l.interval)
}
