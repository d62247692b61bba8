package bulkhead_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/internal/shard"
)

var (
	shed = criticality.With(context.Background(), criticality.Sheddable)
	dflt = context.Background()
	crit = criticality.With(context.Background(), criticality.Critical)
)

// fill takes slots for ctx until one is refused, and returns how many it took.
func fill(h *bulkhead.Bulkhead, ctx context.Context) int {
	n := 0
	for h.Acquire(ctx) == nil {
		n++
	}
	return n
}

// TestSheddableCallsAreRefusedBeforeCriticalOnesAtTheBulkhead: of ten
// slots, a sheddable call leaves a tenth (one) free and a default call
// none — until a critical call has asked near the limit: from then on a
// default call leaves that tenth for critical calls too. The same with the
// slots striped over per-processor cells, and with an adaptive limit of
// ten.
func TestSheddableCallsAreRefusedBeforeCriticalOnesAtTheBulkhead(t *testing.T) {
	for _, mode := range []string{"fixed", "striped", "adaptive"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "striped" {
				defer shard.Force(true)()
			}
			cfg := bulkhead.Config{MaxConcurrent: 10}
			if mode == "adaptive" {
				cfg = bulkhead.Config{MaxConcurrent: 10, Adaptive: true, MinConcurrent: 10, InitialConcurrent: 10}
			}
			h, err := bulkhead.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if mode == "striped" && !bulkhead.Striped(h) {
				t.Fatal("not striped")
			}
			if n := fill(h, shed); n != 9 {
				t.Fatalf("sheddable calls took %d of 10 slots, want 9 (one left)", n)
			}
			if n := fill(h, dflt); n != 1 {
				t.Fatalf("then default calls took %d, want the last one: no room is kept before a critical call", n)
			}
			if n := fill(h, crit); n != 0 {
				t.Fatalf("then critical calls took %d of none", n)
			}
			for range 10 {
				h.Release()
			}

			// A critical call has asked near the limit: room is kept for them.
			if n := fill(h, dflt); n != 9 {
				t.Fatalf("default calls took %d, want 9 (one left for critical calls)", n)
			}
			if n := fill(h, shed); n != 0 {
				t.Fatalf("then sheddable calls took %d, want none", n)
			}
			if n := fill(h, crit); n != 1 {
				t.Fatalf("then critical calls took %d, want the last one", n)
			}
			if h.InUse() != 10 {
				t.Fatalf("%d in use, want 10", h.InUse())
			}
		})
	}
}

// TestAFreedSlotGoesToAWaitingCriticalCallFirst: with every slot of four
// taken, a default call and then a critical one wait; the slot freed goes
// to the critical call, although it came second. The next one freed is
// kept for critical calls (a tenth of four, at least one); the one after
// goes to the default call.
func TestAFreedSlotGoesToAWaitingCriticalCallFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 4, MaxWait: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			if err := h.Acquire(crit); err != nil {
				t.Fatal(err)
			}
		}
		got := make(chan string, 2)
		go func() {
			if h.Acquire(dflt) == nil {
				got <- "default"
			}
		}()
		synctest.Wait()
		go func() {
			if h.Acquire(crit) == nil {
				got <- "critical"
			}
		}()
		synctest.Wait()
		if h.Waiting() != 2 {
			t.Fatalf("%d waiting, want 2", h.Waiting())
		}
		h.Release()
		synctest.Wait()
		if len(got) != 1 || <-got != "critical" {
			t.Fatal("the freed slot did not go to the critical call")
		}
		h.Release()
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("the default call took the slot kept for critical calls")
		}
		h.Release()
		synctest.Wait()
		if len(got) != 1 || <-got != "default" {
			t.Fatal("the default call did not get the next slot")
		}
	})
}
