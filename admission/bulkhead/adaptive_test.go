package bulkhead_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission/bulkhead"
)

func newAdaptive(t *testing.T, cfg bulkhead.Config) *bulkhead.Bulkhead {
	t.Helper()
	cfg.Adaptive = true
	h, err := bulkhead.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// queue is an upstream of capacity c with a queue: an attempt sent while n
// are in flight waits for its turn, so its latency is base·max(1, n/c).
type queue struct {
	c    int
	base time.Duration
}

func (q queue) latency(n int) time.Duration {
	return time.Duration(float64(q.base) * max(1, float64(n)/float64(q.c)))
}

// drive offers `offered` concurrent attempts to h for the given number of
// sampling windows, each attempt answered with q's latency at the
// concurrency h let through, and returns the limits after each window but
// the refresh windows (one at half the limit every RefreshEvery).
func drive(h *bulkhead.Bulkhead, q queue, offered, windows int) []int {
	var limits []int
	start := h.Windows()
	for h.Windows() < start+windows {
		n := 0
		for n < offered && h.TryAcquire() {
			n++
		}
		before := h.Windows()
		for range n {
			h.ReleaseAfter(q.latency(n))
		}
		if w := h.Windows(); w != before && w%bulkhead.RefreshEvery != 0 {
			limits = append(limits, h.Limit())
		}
	}
	return limits
}

func within(l, c int, frac float64) bool {
	return float64(l) >= float64(c)*(1-frac) && float64(l) <= float64(c)*(1+frac)
}

func TestTheAdaptiveLimitConvergesToTheUpstreamsCapacityWithinTenWindows(t *testing.T) {
	for _, c := range []int{10, 50, 200, 800} {
		for _, initial := range []int{0, min(3*c, 500)} { // the default (20), and above the capacity
			h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 1000, InitialConcurrent: initial})
			q := queue{c: c, base: 10 * time.Millisecond}
			limits := drive(h, q, 4*c, 10)
			if l := limits[len(limits)-1]; !within(l, c, 0.1) {
				t.Errorf("capacity %d, starting at %d: limit %d after 10 windows (%v)", c, initial, l, limits)
			}
			// And it stays there.
			for _, l := range drive(h, q, 4*c, 50) {
				if !within(l, c, 0.1) {
					t.Fatalf("capacity %d: the limit left ±10%% of it: %d", c, l)
				}
			}
		}
	}
}

func TestTheAdaptiveLimitFollowsAStepChangeOfCapacity(t *testing.T) {
	h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 1000})
	for _, c := range []int{200, 50, 400, 100} {
		limits := drive(h, queue{c: c, base: 10 * time.Millisecond}, 4*c, 10)
		if l := limits[len(limits)-1]; !within(l, c, 0.1) {
			t.Fatalf("capacity now %d: limit %d after 10 windows (%v)", c, l, limits)
		}
	}
}

// No upward creep: a limit the demand never reaches never grows.
func TestTheAdaptiveLimitNeverGrowsWhileItIsNotReached(t *testing.T) {
	h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 1000, InitialConcurrent: 100})
	for _, l := range drive(h, queue{c: 1000, base: 10 * time.Millisecond}, 60, 500) {
		if l != 100 {
			t.Fatalf("the limit moved to %d with 60 attempts in flight at most and no queueing", l)
		}
	}
}

// A slow tail (2% of the answers 100 times slower) is not a queue.
func TestASlowTailDoesNotBringTheAdaptiveLimitDown(t *testing.T) {
	h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 1000})
	q := queue{c: 200, base: 10 * time.Millisecond}
	drive(h, q, 800, 10)
	for w := 0; w < 50; {
		n := 0
		for n < 800 && h.TryAcquire() {
			n++
		}
		before := h.Windows()
		for i := range n {
			d := q.latency(n)
			if i%50 == 0 {
				d *= 100
			}
			h.ReleaseAfter(d)
		}
		if h.Windows() != before {
			w++
			if l := h.Limit(); l < 180 && h.Windows()%bulkhead.RefreshEvery != 0 {
				t.Fatalf("a 2%% slow tail brought the limit down to %d (capacity 200)", l)
			}
		}
	}
}

// Only answers feed the limit: attempts given back with Release (refused
// later, never sent, cancelled, lost without an answer) change nothing.
func TestReleasesWithoutAnAnswerNeverChangeTheAdaptiveLimit(t *testing.T) {
	h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 100, InitialConcurrent: 10})
	for range 10_000 {
		for h.TryAcquire() {
		}
		for range h.Limit() {
			h.Release()
		}
	}
	if h.Windows() != 0 || h.Limit() != 10 || h.InUse() != 0 {
		t.Fatalf("after releases only: %d windows, limit %d, %d in use", h.Windows(), h.Limit(), h.InUse())
	}
}

// An upstream that answers nothing for a while (every attempt times out:
// Release) leaves the limit where it was, and answers move it again.
func TestTheAdaptiveLimitRecoversAfterTheUpstreamDropsEveryRequest(t *testing.T) {
	h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 1000})
	q := queue{c: 200, base: 10 * time.Millisecond}
	drive(h, q, 800, 10)
	before := h.Limit()
	for range 1000 {
		for h.TryAcquire() {
		}
		for range h.Limit() {
			h.Release()
		}
	}
	if h.Limit() != before {
		t.Fatalf("drops moved the limit from %d to %d", before, h.Limit())
	}
	limits := drive(h, queue{c: 300, base: 10 * time.Millisecond}, 1200, 10)
	if l := limits[len(limits)-1]; !within(l, 300, 0.1) {
		t.Fatalf("after the drops, capacity 300: limit %d (%v)", l, limits)
	}
}

func TestAnAdaptiveBulkheadNeverAdmitsMoreThanItsLimit(t *testing.T) {
	h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 100, MinConcurrent: 5, InitialConcurrent: 7})
	for range 3 {
		n := 0
		for h.TryAcquire() {
			n++
		}
		if n != h.Limit() || h.InUse() != n {
			t.Fatalf("admitted %d with limit %d, %d in use", n, h.Limit(), h.InUse())
		}
		if err := h.Acquire(context.Background()); !errors.Is(err, bulkhead.ErrFull) {
			t.Fatalf("full: %v", err)
		}
		for range n {
			h.Release()
		}
	}
}

// A waiter is woken when the limit grows, not only when a slot is freed.
func TestAWaiterIsWokenWhenTheAdaptiveLimitGrows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const w = bulkhead.MinWindow
		h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 2 * w, InitialConcurrent: w, MaxWait: time.Hour})
		for range w {
			if !h.TryAcquire() {
				t.Fatal("not admitted below the limit")
			}
		}
		got := make(chan error, 2)
		for range 2 {
			go func() { got <- h.Acquire(context.Background()) }()
		}
		synctest.Wait()
		// Answers at a steady latency with the limit reached (each slot
		// taken again at once, by this goroutine or a waiter): the first
		// window closes, sets the uncongested latency and grows the limit,
		// by more than the one slot each answer frees.
		before := h.Limit()
		for i := 0; h.Windows() == 0; i++ {
			if i > 4*w {
				t.Fatalf("no window closed after %d answers", i)
			}
			before = h.Limit()
			h.ReleaseAfter(time.Millisecond)
			h.TryAcquire()
		}
		if h.Windows() != 1 || h.Limit() <= before {
			t.Fatalf("windows %d, limit %d (was %d)", h.Windows(), h.Limit(), before)
		}
		synctest.Wait()
		for range 2 {
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestAdaptiveConfigurationErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		cfg   bulkhead.Config
		field string
	}{
		{bulkhead.Config{Adaptive: true}, "Adaptive"},
		{bulkhead.Config{MaxConcurrent: 10, MinConcurrent: 2}, "MinConcurrent"},
		{bulkhead.Config{MaxConcurrent: 10, InitialConcurrent: 2}, "InitialConcurrent"},
		{bulkhead.Config{MaxConcurrent: 10, Tolerance: 0.2}, "Tolerance"},
		{bulkhead.Config{MaxConcurrent: 10, Adaptive: true, MinConcurrent: 11}, "MinConcurrent"},
		{bulkhead.Config{MaxConcurrent: 10, Adaptive: true, MinConcurrent: 5, InitialConcurrent: 4}, "InitialConcurrent"},
		{bulkhead.Config{MaxConcurrent: 10, Adaptive: true, InitialConcurrent: 11}, "InitialConcurrent"},
		{bulkhead.Config{MaxConcurrent: 10, Adaptive: true, Tolerance: -1}, "Tolerance"},
		{bulkhead.Config{MaxConcurrent: bulkhead.MaxAdaptive + 1, Adaptive: true}, "MaxConcurrent"},
	} {
		_, err := bulkhead.New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.field)
		}
	}
}

func TestAnAdaptiveBulkheadTakesMaxConcurrentUpToMaxAdaptive(t *testing.T) {
	h := newAdaptive(t, bulkhead.Config{MaxConcurrent: bulkhead.MaxAdaptive, InitialConcurrent: bulkhead.MaxAdaptive})
	if h.Limit() != bulkhead.MaxAdaptive {
		t.Fatalf("limit %d, want %d", h.Limit(), bulkhead.MaxAdaptive)
	}
}

// The slots in use share a word with the window's answers and the sum of
// their latencies: the largest latencies, over whole windows of the most
// answers, with the most slots held, leave the count exact.
func TestTheWindowsAnswersNeverChangeTheSlotsInUse(t *testing.T) {
	const held = bulkhead.MaxAdaptive
	h := newAdaptive(t, bulkhead.Config{MaxConcurrent: bulkhead.MaxAdaptive, InitialConcurrent: held, MinConcurrent: held})
	n := 0
	for n < held && h.TryAcquire() {
		n++
	}
	if n != held || h.InUse() != held {
		t.Fatalf("took %d, InUse %d, want %d", n, h.InUse(), held)
	}
	// The first window sets the uncongested latency; the next ones answer
	// a thousand times slower (counted at the cap, the largest sums).
	for i := 0; h.Windows() < 4; i++ {
		lat := time.Millisecond
		if h.Windows() > 0 {
			lat = time.Second
		}
		h.ReleaseAfter(lat)
		n--
		if h.TryAcquire() {
			n++
		}
		if h.InUse() != n {
			t.Fatalf("answer %d: InUse %d, want %d", i, h.InUse(), n)
		}
	}
	for range n {
		h.Release()
	}
	if h.InUse() != 0 {
		t.Fatalf("InUse %d after every slot came back", h.InUse())
	}
}

func TestReleasingMoreThanHeldPanicsInAdaptiveMode(t *testing.T) {
	for _, release := range []func(*bulkhead.Bulkhead){
		func(h *bulkhead.Bulkhead) { h.Release() },
		func(h *bulkhead.Bulkhead) { h.ReleaseAfter(time.Millisecond) },
	} {
		h := newAdaptive(t, bulkhead.Config{MaxConcurrent: 4})
		if !h.TryAcquire() {
			t.Fatal("no slot")
		}
		release(h)
		func() {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			release(h)
		}()
	}
}
