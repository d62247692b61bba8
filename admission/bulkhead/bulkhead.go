// Package bulkhead is the concurrency-limiting guard of the admission
// pipeline: at most N attempts of an upstream in flight at once.
//
// Taking and giving back a slot is one atomic operation each. Only an attempt
// that finds the bulkhead full and is allowed to wait takes the slow path: it
// registers a wake-up channel under a mutex and re-checks, so a slot freed at
// any moment is never missed. Waiters are woken in arrival order, but an
// arriving attempt may take a freed slot before a woken waiter does (no strict
// FIFO), which keeps the fast path lock-free.
package bulkhead

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
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
}

// Bulkhead limits concurrency. It is safe for concurrent use. A nil *Bulkhead
// admits everything.
type Bulkhead struct {
	inUse   atomic.Int64
	waiting atomic.Int64 // len(waiters), readable without the lock
	max     int64
	maxWait time.Duration

	mu      sync.Mutex
	waiters []chan struct{}
}

// New validates cfg and returns a Bulkhead, or nil (no limit) when
// cfg.MaxConcurrent is zero. Errors name the offending field.
func New(cfg Config) (*Bulkhead, error) {
	switch {
	case cfg.MaxConcurrent < 0:
		return nil, fmt.Errorf("bulkhead: Config.MaxConcurrent must be >= 0, got %d", cfg.MaxConcurrent)
	case cfg.MaxWait < 0:
		return nil, fmt.Errorf("bulkhead: Config.MaxWait must be >= 0, got %v", cfg.MaxWait)
	case cfg.MaxConcurrent == 0:
		if cfg.MaxWait != 0 {
			return nil, fmt.Errorf("bulkhead: Config.MaxWait needs a Config.MaxConcurrent > 0")
		}
		return nil, nil
	}
	return &Bulkhead{max: int64(cfg.MaxConcurrent), maxWait: cfg.MaxWait}, nil
}

// Acquire takes a slot, waiting for one at most the configured MaxWait. It
// returns nil, ErrFull, or ctx.Err() unchanged; on failure no slot is held.
func (h *Bulkhead) Acquire(ctx context.Context) error {
	if h == nil || h.tryAcquire() {
		return nil
	}
	if h.maxWait == 0 {
		return ErrFull
	}
	return h.wait(ctx)
}

// TryAcquire takes a slot if one is free now, without waiting.
func (h *Bulkhead) TryAcquire() bool { return h == nil || h.tryAcquire() }

func (h *Bulkhead) tryAcquire() bool {
	for {
		n := h.inUse.Load()
		if n >= h.max {
			return false
		}
		if h.inUse.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Release gives back a slot taken by Acquire. Releasing more slots than were
// taken is a programming error and panics.
func (h *Bulkhead) Release() {
	if h == nil {
		return
	}
	if h.inUse.Add(-1) < 0 || h.waiting.Load() > 0 {
		h.releaseSlow()
	}
}

func (h *Bulkhead) releaseSlow() {
	if h.inUse.Load() < 0 {
		panic("bulkhead: released more than held")
	}
	h.wakeOne()
}

func (h *Bulkhead) wakeOne() {
	h.mu.Lock()
	if len(h.waiters) > 0 {
		w := h.waiters[0]
		h.waiters = h.waiters[1:]
		h.waiting.Add(-1)
		w <- struct{}{} // buffered: never blocks
	}
	h.mu.Unlock()
}

func (h *Bulkhead) wait(ctx context.Context) error {
	timer := time.NewTimer(h.maxWait)
	defer timer.Stop()
	w := make(chan struct{}, 1)
	for {
		h.mu.Lock()
		h.waiters = append(h.waiters, w)
		h.waiting.Add(1)
		h.mu.Unlock()
		// Registered first, checked second: a Release between the failed
		// fast path and the registration is seen here, and one after the
		// registration wakes us.
		if h.tryAcquire() {
			h.leave(w)
			return nil
		}
		select {
		case <-w:
			if h.tryAcquire() {
				return nil
			}
			// Another attempt took the slot first; wait again.
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
	for i, x := range h.waiters {
		if x == w {
			h.waiters = append(h.waiters[:i], h.waiters[i+1:]...)
			h.waiting.Add(-1)
			h.mu.Unlock()
			return
		}
	}
	h.mu.Unlock()
	select {
	case <-w:
		if h.inUse.Load() < h.max && h.waiting.Load() > 0 {
			h.wakeOne()
		}
	default:
	}
}

// InUse reports how many slots are taken.
func (h *Bulkhead) InUse() int {
	if h == nil {
		return 0
	}
	return int(h.inUse.Load())
}

// Capacity reports the number of slots (0 for a nil, unlimited Bulkhead).
func (h *Bulkhead) Capacity() int {
	if h == nil {
		return 0
	}
	return int(h.max)
}
