// Package bulkhead is the concurrency-limiting guard of the admission
// pipeline: at most N attempts of an upstream in flight at once.
//
// Taking and giving back a slot is one atomic operation each. Only an attempt
// that finds the bulkhead full and is allowed to wait takes the slow path: it
// registers a wake-up channel under a mutex and re-checks, so a slot freed at
// any moment is never missed. Waiters are woken in arrival order, but an
// arriving attempt may take a freed slot before a woken waiter does (no strict
// FIFO), which keeps the fast path lock-free.
//
// Under contention from several processors the free slots are spread over
// per-processor cells (internal/shard), so that attempts on different cores
// stop writing one shared counter: the bulkhead switches once it has seen
// repeated compare-and-swap failures, and only when the limit is large
// enough to give each cell a batch of at least two slots. Slots are moved,
// never created: as long as every Release matches an Acquire, the limit
// holds exactly in both modes. A rejection is decided after looking at every
// cell; a slot freed while it looks may be missed, exactly as if it had been
// freed a moment later.
package bulkhead

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/internal/shard"
)

// ErrFull is returned when every slot is taken and none was freed within the
// configured wait.
var ErrFull = errors.New("bulkhead: concurrency limit reached")

// Config configures a Bulkhead. The zero value means "no limit".
type Config struct {
	// MaxConcurrent is the number of slots. Zero means no limit: New
	// returns a nil *Bulkhead, on which every method admits.
	MaxConcurrent int

	// MaxWait is the longest an attempt waits for a slot. Zero means an
	// attempt that finds the bulkhead full is rejected at once. The wait
	// also ends, with the context's error, when the context is done.
	MaxWait time.Duration

	// Adaptive makes the limit move between MinConcurrent and
	// MaxConcurrent, learned from the latency of answered attempts (see
	// ReleaseAfter): it comes down when answers get slower than the
	// upstream's uncongested latency by more than Tolerance — the upstream
	// is queueing — and goes up while they do not and the limit is
	// reached. An adaptive bulkhead is never striped, and its
	// MaxConcurrent is at most MaxAdaptive.
	Adaptive bool

	// MinConcurrent is the lowest the adaptive limit goes (default 1);
	// InitialConcurrent where it starts (default 20, within the bounds).
	MinConcurrent, InitialConcurrent int

	// Tolerance is how much slower than uncongested answers may get before
	// the adaptive limit comes down: 0.05 (the default) means 5%. Answers
	// whose latency varies a lot from one to the next need a larger one.
	Tolerance float64
}

// Bulkhead limits concurrency. It is safe for concurrent use. A nil *Bulkhead
// admits everything.
type Bulkhead struct {
	free      atomic.Int64 // slots in the shared pool: neither taken nor in a cell
	stripes   atomic.Pointer[shard.Stripes]
	waiting   atomic.Int64 // len(waiters), readable without the lock
	contended atomic.Int64 // failed compare-and-swaps on free, until striped
	max       int64
	far       int64 // free slots above which no reserve applies: a tenth of max
	maxWait   time.Duration
	ad        *adaptive // the adaptive mode, if on

	// critical is set once a critical call has asked for a slot near the
	// limit: from then on, room is kept for critical calls (see reserve).
	critical atomic.Bool

	mu      sync.Mutex
	waiters [3][]chan struct{} // by criticality: sheddable, default, critical; woken critical first
}

// New validates cfg and returns a Bulkhead, or nil (no limit) when
// cfg.MaxConcurrent is zero. Errors name the offending field.
func New(cfg Config) (*Bulkhead, error) {
	switch {
	case cfg.MaxConcurrent < 0:
		return nil, cfgerr.New("bulkhead", "MaxConcurrent", "must be >= 0, got %d", cfg.MaxConcurrent)
	case cfg.MaxWait < 0:
		return nil, cfgerr.New("bulkhead", "MaxWait", "must be >= 0, got %v", cfg.MaxWait)
	case cfg.MaxConcurrent == 0:
		if cfg.MaxWait != 0 {
			return nil, cfgerr.New("bulkhead", "MaxWait", "needs MaxConcurrent > 0, got MaxConcurrent 0")
		}
		if cfg.Adaptive {
			return nil, cfgerr.New("bulkhead", "Adaptive", "needs MaxConcurrent > 0 (the highest the limit goes), got MaxConcurrent 0")
		}
	}
	if err := validateAdaptive(cfg); err != nil || cfg.MaxConcurrent == 0 {
		return nil, err
	}
	h := &Bulkhead{max: int64(cfg.MaxConcurrent), maxWait: cfg.MaxWait, far: tenth(int64(cfg.MaxConcurrent))}
	if cfg.Adaptive {
		h.ad = newAdaptive(cfg)
		return h, nil
	}
	h.free.Store(h.max)
	if shard.Forced() {
		h.stripe(true)
	}
	return h, nil
}

// validateAdaptive checks the fields of the adaptive mode.
func validateAdaptive(cfg Config) error {
	switch {
	case !cfg.Adaptive && cfg.MinConcurrent != 0:
		return cfgerr.New("bulkhead", "MinConcurrent", "needs Adaptive, got %d without it", cfg.MinConcurrent)
	case !cfg.Adaptive && cfg.InitialConcurrent != 0:
		return cfgerr.New("bulkhead", "InitialConcurrent", "needs Adaptive, got %d without it", cfg.InitialConcurrent)
	case !cfg.Adaptive && cfg.Tolerance != 0:
		return cfgerr.New("bulkhead", "Tolerance", "needs Adaptive, got %v without it", cfg.Tolerance)
	case cfg.Adaptive && cfg.MaxConcurrent > MaxAdaptive:
		return cfgerr.New("bulkhead", "MaxConcurrent", "must be at most %d with Adaptive, got %d", MaxAdaptive, cfg.MaxConcurrent)
	case cfg.MinConcurrent < 0 || cfg.MinConcurrent > cfg.MaxConcurrent:
		return cfgerr.New("bulkhead", "MinConcurrent", "must be in [0, MaxConcurrent %d], got %d", cfg.MaxConcurrent, cfg.MinConcurrent)
	case cfg.InitialConcurrent < 0 || cfg.InitialConcurrent > cfg.MaxConcurrent ||
		cfg.InitialConcurrent != 0 && cfg.InitialConcurrent < cfg.MinConcurrent:
		return cfgerr.New("bulkhead", "InitialConcurrent", "must be 0 or in [MinConcurrent %d, MaxConcurrent %d], got %d",
			cfg.MinConcurrent, cfg.MaxConcurrent, cfg.InitialConcurrent)
	case !(cfg.Tolerance >= 0 && cfg.Tolerance <= 10): // NaN too
		return cfgerr.New("bulkhead", "Tolerance", "must be in [0, 10], got %v", cfg.Tolerance)
	}
	return nil
}

// Acquire takes a slot, waiting for one at most the configured MaxWait. It
// returns nil, ErrFull, or ctx.Err() unchanged; on failure no slot is held.
// The criticality ctx carries (package criticality) decides how much room
// the call must leave (see reserve), and waiting critical calls are given
// a freed slot first.
func (h *Bulkhead) Acquire(ctx context.Context) error {
	if h == nil {
		return nil
	}
	ok, l := h.tryFor(ctx)
	if ok {
		return nil
	}
	if h.maxWait == 0 {
		return ErrFull
	}
	return h.wait(ctx, l)
}

// TryAcquire takes a slot if one is free now, without waiting, for a call
// of Default criticality.
func (h *Bulkhead) TryAcquire() bool {
	if h == nil {
		return true
	}
	ok, _ := h.tryFor(nil)
	return ok
}

// tryFor takes a slot free at once for a call of the criticality ctx
// carries (Default for a nil ctx), which it looks up only near the limit,
// where a reserve may apply; it returns the level it used.
func (h *Bulkhead) tryFor(ctx context.Context) (bool, criticality.Level) {
	if h.ad != nil {
		return h.ad.tryFor(h, ctx)
	}
	if h.stripes.Load() == nil {
		for { // far from the limit no reserve applies: the level is not looked up
			n := h.free.Load()
			if n <= h.far {
				break
			}
			if h.free.CompareAndSwap(n, n-1) {
				return true, criticality.Default
			}
			h.contention()
		}
	} else if h.free.Load() > h.far {
		return h.tryAcquire(0), criticality.Default
	}
	l := criticality.Of(ctx)
	r := h.reserve(l, h.max)
	if r == 0 {
		return h.tryAcquire(0), l
	}
	if h.stripes.Load() == nil {
		for {
			n := h.free.Load()
			if n <= r {
				return false, l
			}
			if h.free.CompareAndSwap(n, n-1) {
				return true, l
			}
			h.contention()
		}
	}
	// Striped: the free slots are spread over the cells. Taken, then given
	// back if it went into the reserve; racing takers may overshoot it by
	// a slot each for a moment.
	if int64(h.InUse())+1 > h.max-r || !h.tryAcquire(0) {
		return false, l
	}
	if int64(h.InUse()) > h.max-r {
		h.release(0)
		return false, l
	}
	return true, l
}

// tenth is a tenth of limit, rounded up.
func tenth(limit int64) int64 { return (limit + 9) / 10 }

// reserve is how many of limit's slots a call of level l must leave free:
// none for a critical call (which marks the bulkhead as serving them); a
// tenth (at least one) for a sheddable call, and for a default call once a
// critical call has asked near the limit. Never every slot: with a limit of
// 2 or more one slot is always open to every level, and a limit of 1 keeps
// nothing. The room kept is idle while no critical call comes for it: a
// tenth, not more (measured in DESIGN.md, "Criticality").
func (h *Bulkhead) reserve(l criticality.Level, limit int64) int64 {
	if l >= criticality.Critical {
		if !h.critical.Load() {
			h.critical.Store(true)
		}
		return 0
	}
	if limit < 2 || l == criticality.Default && !h.critical.Load() {
		return 0
	}
	return min(tenth(limit), limit-1)
}

// tryAcquire takes a slot free at once; hint chooses the per-processor cell
// a striped bulkhead takes from. Any hint is correct; one from the caller's
// processor is fastest; 0 means none (the bulkhead looks the processor up
// itself). The slot goes back with release, the same hint sparing a look-up.
func (h *Bulkhead) tryAcquire(hint uint32) bool {
	if h.ad != nil {
		return h.ad.tryAcquire()
	}
	if s := h.stripes.Load(); s != nil {
		return h.tryStriped(s, s.Choose(hint))
	}
	for {
		n := h.free.Load()
		if n <= 0 {
			// Striped meanwhile? Then the free slots may be in cells.
			if s := h.stripes.Load(); s != nil {
				return h.tryStriped(s, s.Choose(hint))
			}
			return false
		}
		if h.free.CompareAndSwap(n, n-1) {
			return true
		}
		h.contention()
	}
}

// contention counts a failed compare-and-swap on the pool and stripes the
// bulkhead once there have been enough.
func (h *Bulkhead) contention() {
	if h.ad != nil {
		return
	}
	if h.contended.Add(1) == shard.After && shard.Worthwhile() {
		h.stripe(false)
	}
}

// stripe spreads the free slots over per-processor cells from now on, if
// the bulkhead is big enough for batches of two slots per cell (or, forced,
// of one). A cell gives a batch back once it holds more than two, so the
// cells hold about half of the slots at most and the pool keeps the rest
// for processors that come late.
func (h *Bulkhead) stripe(force bool) {
	if s := shard.Plan(h.max, 4, force); s != nil {
		h.stripes.CompareAndSwap(nil, s)
	}
}

// tryStriped takes a slot from cell c, or a batch from the pool,
// or a slot from another cell. It rejects only after a look at the pool and
// every cell during which no batch was in transit between them; a move is a
// few instructions, so it looks again (yielding meanwhile) until one is.
func (h *Bulkhead) tryStriped(s *shard.Stripes, c uint32) bool {
	if s.Take(c) {
		return true
	}
	for {
		m, settled := s.Mark()
		if h.refill(s, c) || s.Steal(c) {
			return true
		}
		if settled && s.Settled(m) {
			return false
		}
		runtime.Gosched()
	}
}

// refill takes a batch of slots from the pool: one for the caller, the rest
// for cell c.
func (h *Bulkhead) refill(s *shard.Stripes, c uint32) bool {
	for {
		n := h.free.Load()
		if n <= 0 {
			return false
		}
		k := min(n, s.Batch)
		if k == 1 { // nothing for the cell: nothing in transit
			if h.free.CompareAndSwap(n, n-1) {
				return true
			}
			continue
		}
		s.StartMove()
		ok := h.free.CompareAndSwap(n, n-k)
		if ok {
			s.Put(c, k-1)
		}
		s.EndMove()
		if ok {
			return true
		}
	}
}

// Release gives back a slot taken by Acquire or TryAcquire.
// Releasing more slots than were taken is a programming error and panics
// (before the bulkhead is striped, at once; after, when the surplus reaches
// the shared pool).
func (h *Bulkhead) Release() { h.release(0) }

// ReleaseAfter is Release for an attempt that was answered after elapsed
// (from its admission to its answer's head): an adaptive bulkhead learns its
// limit from that latency. Give back every other attempt with Release: one
// refused later in the pipeline, never sent, cancelled, or failed without an
// answer.
func (h *Bulkhead) ReleaseAfter(elapsed time.Duration) {
	if h != nil && h.ad != nil {
		h.releaseAdaptive(elapsed, true)
		return
	}
	h.release(0)
}

// releaseAdaptive gives a slot back to an adaptive bulkhead, and wakes one
// waiter for it and one for each slot by which the limit grew.
func (h *Bulkhead) releaseAdaptive(elapsed time.Duration, answered bool) {
	grew := h.ad.release(elapsed, answered)
	for i := int64(0); i <= grew && h.waiting.Load() > 0; i++ {
		h.wakeOne()
	}
}

func (h *Bulkhead) release(hint uint32) {
	if h == nil {
		return
	}
	if h.ad != nil {
		h.releaseAdaptive(0, false)
		return
	}
	if s := h.stripes.Load(); s != nil {
		c := s.Choose(hint)
		if s.Put(c, 1) > 2*s.Batch {
			h.spill(s, c)
		}
	} else if h.free.Add(1) > h.max {
		panic("bulkhead: released more than held")
	}
	// Put first, look second: a waiter registered after this look scans
	// the cells and the pool after the slot is there.
	if h.waiting.Load() > 0 {
		h.wakeOne()
	}
}

// spill moves a batch from cell c back to the pool.
func (h *Bulkhead) spill(s *shard.Stripes, c uint32) {
	s.StartMove()
	over := s.TakeN(c, s.Batch) && h.free.Add(s.Batch) > h.max
	s.EndMove()
	if over {
		panic("bulkhead: released more than held")
	}
}

func (h *Bulkhead) wakeOne() {
	h.mu.Lock()
	for i := len(h.waiters) - 1; i >= 0; i-- { // critical first
		if q := h.waiters[i]; len(q) > 0 {
			h.waiters[i] = q[1:]
			h.waiting.Add(-1)
			q[0] <- struct{}{} // buffered: never blocks
			break
		}
	}
	h.mu.Unlock()
}

// queue is the index in waiters of level l.
func queue(l criticality.Level) int {
	return int(min(max(l, criticality.Sheddable), criticality.Critical) + 1)
}

func (h *Bulkhead) wait(ctx context.Context, l criticality.Level) error {
	timer := time.NewTimer(h.maxWait)
	defer timer.Stop()
	w := make(chan struct{}, 1)
	q := queue(l)
	for {
		h.mu.Lock()
		h.waiters[q] = append(h.waiters[q], w)
		h.waiting.Add(1)
		h.mu.Unlock()
		// Registered first, checked second: a Release between the failed
		// fast path and the registration is seen here, and one after the
		// registration wakes us.
		if ok, _ := h.tryFor(ctx); ok {
			h.leave(w)
			return nil
		}
		select {
		case <-w:
			if ok, _ := h.tryFor(ctx); ok {
				return nil
			}
			// Another attempt took the slot first, or it is kept for
			// critical calls; wait again.
		case <-ctx.Done():
			h.leave(w)
			return ctx.Err()
		case <-timer.C:
			h.leave(w)
			return ErrFull
		}
	}
}

// leave removes w from the waiters. If a Release woke w in the meantime, the
// wake-up is passed on so that it is not lost.
func (h *Bulkhead) leave(w chan struct{}) {
	h.mu.Lock()
	for q := range h.waiters {
		for i, x := range h.waiters[q] {
			if x == w {
				h.waiters[q] = append(h.waiters[q][:i], h.waiters[q][i+1:]...)
				h.waiting.Add(-1)
				h.mu.Unlock()
				return
			}
		}
	}
	h.mu.Unlock()
	select {
	case <-w:
		// Passed on whenever someone waits: a waiter woken for nothing
		// looks and waits again, while a lost wake-up would leave it
		// asleep next to a free slot.
		if h.waiting.Load() > 0 {
			h.wakeOne()
		}
	default:
	}
}

// InUse reports how many slots are taken. It is exact when no slot is
// being taken or given back; meanwhile, once the bulkhead is striped, it is
// an estimate (a batch moving between the pool and a cell may be counted
// twice or not at all), kept within [0, MaxConcurrent].
func (h *Bulkhead) InUse() int {
	if h == nil {
		return 0
	}
	if h.ad != nil {
		return int(min(h.ad.inUse(), h.max))
	}
	n := h.max - h.free.Load()
	if s := h.stripes.Load(); s != nil {
		n -= s.Sum()
	}
	return int(min(max(n, 0), h.max))
}

// Capacity reports the number of slots (0 for a nil, unlimited Bulkhead):
// for an adaptive one, the most the limit may reach (see Limit).
func (h *Bulkhead) Capacity() int {
	if h == nil {
		return 0
	}
	return int(h.max)
}
