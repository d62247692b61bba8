package bulkhead_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission/bulkhead"
)

func mustNew(t *testing.T, cfg bulkhead.Config) *bulkhead.Bulkhead {
	t.Helper()
	h, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestRejectsAtOnceWhenFullWithoutMaxWait(t *testing.T) {
	h := mustNew(t, bulkhead.Config{MaxConcurrent: 2})
	ctx := context.Background()
	for range 2 {
		if err := h.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Acquire(ctx); !errors.Is(err, bulkhead.ErrFull) {
		t.Fatalf("third: %v, want ErrFull", err)
	}
	h.Release()
	if err := h.Acquire(ctx); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if got := h.InUse(); got != 2 {
		t.Fatalf("in use %d, want 2", got)
	}
}

func TestWaiterGetsTheSlotOfARelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := mustNew(t, bulkhead.Config{MaxConcurrent: 1, MaxWait: time.Minute})
		ctx := context.Background()
		_ = h.Acquire(ctx)
		done := make(chan error)
		go func() { done <- h.Acquire(ctx) }()
		time.Sleep(10 * time.Second)
		h.Release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if h.InUse() != 1 {
			t.Fatalf("in use %d, want 1", h.InUse())
		}
	})
}

func TestWaitEndsAfterMaxWaitLeavingNothingHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := mustNew(t, bulkhead.Config{MaxConcurrent: 1, MaxWait: time.Second})
		_ = h.Acquire(context.Background())
		start := time.Now()
		if err := h.Acquire(context.Background()); !errors.Is(err, bulkhead.ErrFull) {
			t.Fatalf("err = %v, want ErrFull", err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Fatalf("waited %v, want 1s", waited)
		}
		h.Release()
		if h.InUse() != 0 {
			t.Fatalf("in use %d, want 0", h.InUse())
		}
	})
}

func TestWaitEndsWithTheContextLeavingNothingHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := mustNew(t, bulkhead.Config{MaxConcurrent: 1, MaxWait: time.Minute})
		_ = h.Acquire(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- h.Acquire(ctx) }()
		synctest.Wait()
		cancel()
		if err := <-done; err != context.Canceled {
			t.Fatalf("err = %v, want context.Canceled unchanged", err)
		}
		h.Release()
		if h.InUse() != 0 {
			t.Fatalf("in use %d, want 0", h.InUse())
		}
	})
}

func TestReleasingMoreThanHeldPanics(t *testing.T) {
	h := mustNew(t, bulkhead.Config{MaxConcurrent: 1})
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	h.Release()
}

func TestNeverMoreThanMaxConcurrentUnderContention(t *testing.T) {
	h := mustNew(t, bulkhead.Config{MaxConcurrent: 3, MaxWait: time.Minute})
	var inside, peak atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 200 {
				if err := h.Acquire(context.Background()); err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				inside.Add(-1)
				h.Release()
			}
		})
	}
	wg.Wait()
	if peak.Load() > 3 || h.InUse() != 0 {
		t.Fatalf("peak %d (max 3), in use at the end %d", peak.Load(), h.InUse())
	}
}

func TestZeroConfigMeansNoLimit(t *testing.T) {
	h := mustNew(t, bulkhead.Config{})
	if h != nil {
		t.Fatal("zero Config built a bulkhead")
	}
	if err := h.Acquire(context.Background()); err != nil || !h.TryAcquire() {
		t.Fatal("nil bulkhead rejected")
	}
	h.Release()
}

func TestInvalidConfigFailsWithTheFieldName(t *testing.T) {
	for _, tc := range []struct {
		field string
		cfg   bulkhead.Config
	}{
		{"MaxConcurrent", bulkhead.Config{MaxConcurrent: -1}},
		{"MaxWait", bulkhead.Config{MaxConcurrent: 1, MaxWait: -1}},
		{"MaxWait", bulkhead.Config{MaxWait: time.Second}},
	} {
		_, err := bulkhead.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), "Config."+tc.field) {
			t.Errorf("New(%+v) = %v, want an error naming Config.%s", tc.cfg, err, tc.field)
		}
	}
}
