package bulkhead_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/internal/shard"
)

// striped builds a bulkhead whose slots are spread over per-processor cells
// from the start.
func striped(t *testing.T, cfg bulkhead.Config) *bulkhead.Bulkhead {
	t.Helper()
	defer shard.Force(true)()
	h := mustNew(t, cfg)
	if !bulkhead.Striped(h) {
		t.Fatal("not striped")
	}
	return h
}

func TestStripedBulkheadNeverAdmitsMoreThanMaxConcurrent(t *testing.T) {
	const limit = 40
	h := striped(t, bulkhead.Config{MaxConcurrent: limit})
	var inside, peak, admitted atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 2000 {
				if !h.TryAcquire() {
					runtime.Gosched()
					continue
				}
				admitted.Add(1)
				n := inside.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				runtime.Gosched()
				inside.Add(-1)
				h.Release()
			}
		})
	}
	wg.Wait()
	if peak.Load() > limit || admitted.Load() == 0 {
		t.Fatalf("peak %d (limit %d), %d admitted", peak.Load(), limit, admitted.Load())
	}
	if got := h.InUse(); got != 0 {
		t.Fatalf("in use %d at the end, want 0", got)
	}
}

func TestStripedBulkheadRejectsOnlyWhenEverySlotIsTaken(t *testing.T) {
	const limit = 64
	h := striped(t, bulkhead.Config{MaxConcurrent: limit})
	for round := range 3 {
		// Take every slot from many goroutines, so the slots pass through
		// several cells; then every slot must be found, wherever it sits.
		var wg sync.WaitGroup
		var got atomic.Int64
		for range limit {
			wg.Go(func() {
				if h.TryAcquire() {
					got.Add(1)
				}
			})
		}
		wg.Wait()
		for got.Load() < limit && h.TryAcquire() {
			got.Add(1)
		}
		if got.Load() != limit {
			t.Fatalf("round %d: %d slots taken of %d", round, got.Load(), limit)
		}
		if h.TryAcquire() {
			t.Fatalf("round %d: admitted beyond the limit", round)
		}
		for range limit / 2 {
			wg.Go(func() { h.Release(); h.Release() })
		}
		wg.Wait()
		if n := h.InUse(); n != 0 {
			t.Fatalf("round %d: in use %d after releasing all", round, n)
		}
	}
}

func TestStripedBulkheadWakesAWaiter(t *testing.T) {
	const limit = 16
	h := striped(t, bulkhead.Config{MaxConcurrent: limit, MaxWait: time.Minute})
	for range limit {
		if !h.TryAcquire() {
			t.Fatal("rejected below the limit")
		}
	}
	done := make(chan error)
	go func() { done <- h.Acquire(context.Background()) }()
	for h.Waiting() == 0 {
		runtime.Gosched()
	}
	h.Release()
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if n := h.InUse(); n != limit {
		t.Fatalf("in use %d, want %d", n, limit)
	}
	for range limit {
		h.Release()
	}
}

func TestBulkheadStripesAfterRepeatedContention(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	h := mustNew(t, bulkhead.Config{MaxConcurrent: 1000})
	for range bulkhead.StripeAfter - 1 {
		bulkhead.Contend(h)
	}
	if bulkhead.Striped(h) {
		t.Fatal("striped before the threshold")
	}
	bulkhead.Contend(h)
	if !bulkhead.Striped(h) {
		t.Fatal("not striped after the threshold")
	}
}

func TestSmallBulkheadNeverStripes(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	h := mustNew(t, bulkhead.Config{MaxConcurrent: 8}) // a batch of one slot per cell
	for range 10 * bulkhead.StripeAfter {
		bulkhead.Contend(h)
	}
	if bulkhead.Striped(h) {
		t.Fatal("a bulkhead too small for batches of two was striped")
	}
}

func TestOneProcessorNeverStripes(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	h := mustNew(t, bulkhead.Config{MaxConcurrent: 1000})
	for range 10 * bulkhead.StripeAfter {
		bulkhead.Contend(h)
	}
	if bulkhead.Striped(h) {
		t.Fatal("striped with GOMAXPROCS 1")
	}
}

func TestStripedBulkheadPanicsWhenSlotsReleasedTwiceReachThePool(t *testing.T) {
	h := striped(t, bulkhead.Config{MaxConcurrent: 64})
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	for range 10 * 64 { // nothing taken: every release is one too many
		h.Release()
	}
}

// Inside a synctest bubble the wait's timer fires as soon as every goroutine
// is blocked: a waiter left asleep next to a free slot (a lost wake-up)
// fails at once with ErrFull instead of going unnoticed.
func TestStripedBulkheadWaitersNeverSleepNextToAFreeSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := striped(t, bulkhead.Config{MaxConcurrent: 16, MaxWait: time.Minute})
		var wg sync.WaitGroup
		for range 48 {
			wg.Go(func() {
				for range 300 {
					if err := h.Acquire(context.Background()); err != nil {
						t.Errorf("a waiter gave up: %v (in use %d)", err, h.InUse())
						return
					}
					runtime.Gosched()
					h.Release()
				}
			})
		}
		wg.Wait()
		if n := h.InUse(); n != 0 {
			t.Fatalf("in use %d at the end", n)
		}
	})
}

// A hint only chooses a cell: any value, and a release with another hint
// than its acquire, keeps the limit and loses no slot.
func TestStripedBulkheadAnyHintIsCorrect(t *testing.T) {
	const limit = 64
	h := striped(t, bulkhead.Config{MaxConcurrent: limit})
	if !bulkhead.Striped(h) {
		t.Fatal("not striped")
	}
	for round := range 3 {
		for i := range uint32(limit) {
			if !bulkhead.TryAcquireHint(h, i*2654435761) {
				t.Fatalf("round %d: slot %d rejected below the limit", round, i)
			}
		}
		if bulkhead.TryAcquireHint(h, 12345) || h.TryAcquire() {
			t.Fatalf("round %d: admitted beyond the limit", round)
		}
		for i := range uint32(limit) {
			bulkhead.ReleaseHint(h, i^0xdeadbeef)
		}
		if n := h.InUse(); n != 0 {
			t.Fatalf("round %d: in use %d after releasing all", round, n)
		}
	}
	var none *bulkhead.Bulkhead
	if bulkhead.Striped(none) || !bulkhead.TryAcquireHint(none, 1) {
		t.Fatal("a nil bulkhead must admit and not be striped")
	}
	bulkhead.ReleaseHint(none, 1)
}
