package ratelimit

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/internal/clock"
	"github.com/outboundhq/outbound/internal/shard"
)

// stripedLimiter builds a limiter that leases tokens to per-processor cells
// from the start.
func stripedLimiter(t *testing.T, cfg Config) *Limiter {
	t.Helper()
	defer shard.Force(true)()
	l := mustNew(t, cfg)
	if l.stripes.Load() == nil {
		t.Fatal("not striped")
	}
	return l
}

// At one instant (the fake clock does not move), every token admitted was
// taken from the bucket, leased or not: many callers together get exactly
// the burst, and the tokens leased to cells are all found.
func TestStripedLimiterAdmitsExactlyTheBurstAtOneInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const burst = 1000
		l := stripedLimiter(t, Config{PerSecond: 1, Burst: burst})
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for l.TryAcquire() {
					admitted.Add(1)
					runtime.Gosched()
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != burst {
			t.Fatalf("admitted %d, want exactly the burst %d", got, burst)
		}
		if got := l.Available(); got != 0 {
			t.Fatalf("Available() = %d after the burst, want 0", got)
		}
	})
}

func TestStripedLimiterRefundsToTheBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := stripedLimiter(t, Config{PerSecond: 1, Burst: 100})
		for range 100 {
			if !l.TryAcquire() {
				t.Fatal("rejected within the burst")
			}
		}
		if l.TryAcquire() {
			t.Fatal("admitted beyond the burst")
		}
		l.Refund()
		if got := l.Available(); got != 1 {
			t.Fatalf("Available() = %d after a refund, want 1", got)
		}
		if !l.TryAcquire() || l.TryAcquire() {
			t.Fatal("a refund did not give back exactly one token")
		}
	})
}

// Leased tokens count as taken: over a long run the rate holds exactly,
// whatever the cells hold at the end.
func TestStripedLimiterKeepsTheSustainedRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rate, burst, seconds = 100, 50, 20
		l := stripedLimiter(t, Config{PerSecond: rate, Burst: burst})
		admitted := 0
		for range seconds * 1000 {
			for l.TryAcquire() {
				admitted++
			}
			time.Sleep(time.Millisecond)
		}
		if max := burst + rate*seconds; admitted > max {
			t.Fatalf("admitted %d in %ds, more than burst+rate×time = %d", admitted, seconds, max)
		}
		if min := rate*seconds - int(l.stripes.Load().Batch)*l.stripes.Load().Cells(); admitted < min {
			t.Fatalf("admitted %d in %ds, want at least %d", admitted, seconds, min)
		}
	})
}

func TestLimiterStripesAfterRepeatedContention(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	l := mustNew(t, Config{PerSecond: 1e6, Burst: 10000})
	for range shard.After - 1 {
		l.contention()
	}
	if l.stripes.Load() != nil {
		t.Fatal("striped before the threshold")
	}
	l.contention()
	if l.stripes.Load() == nil {
		t.Fatal("not striped after the threshold")
	}
}

func TestLimiterWithASmallBurstNeverStripes(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	l := mustNew(t, Config{PerSecond: 100, Burst: 40}) // Burst/(8×4 cells): batches of one
	for range 10 * shard.After {
		l.contention()
	}
	if l.stripes.Load() != nil {
		t.Fatal("a limiter whose burst is too small for batches of two was striped")
	}
}

// Tokens leased to another processor's cell are taken from there once the
// caller's cell and the bucket are empty: a caller is not rejected while
// tokens sit unused elsewhere.
func TestStripedLimiterTakesTokensFromOtherCellsBeforeRejecting(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	synctest.Test(t, func(t *testing.T) {
		const burst = 64
		l := stripedLimiter(t, Config{PerSecond: 1, Burst: burst})
		s := l.stripes.Load()
		other := s.Cell() + 1 // the cell of a processor other than this one, mostly
		taken := 0
		for l.lease(s, other, clock.Now()) {
			taken++
		}
		if s.Sum() == 0 {
			t.Fatal("no tokens left in the other cell")
		}
		for l.TryAcquire() {
			taken++
		}
		if taken != burst {
			t.Fatalf("%d tokens taken, want the burst %d (%d left in cells)", taken, burst, s.Sum())
		}
	})
}

// At the moment a full burst is allowed, the tokens held in cells come on
// top of it: together they stay under Burst/8, also when GOMAXPROCS grew
// between New and striping (Go changes it at run time from the cgroup
// limit), and also when several callers lease into one cell (a hint shared
// by two processors, or a caller preempted between its cell and the bucket).
func TestStripedLimiterKeepsCellsUnderAnEighthOfTheBurst(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	synctest.Test(t, func(t *testing.T) {
		const burst = 256
		l := mustNew(t, Config{PerSecond: 1, Burst: burst})
		runtime.GOMAXPROCS(8)
		for range shard.After {
			l.contention()
		}
		s := l.stripes.Load()
		if s == nil {
			t.Fatal("not striped")
		}
		for c := range uint32(s.Cells()) {
			for range 3 { // three leases into every cell
				l.lease(s, c, clock.Now())
			}
		}
		if held := s.Sum(); held >= burst/8 {
			t.Fatalf("cells hold %d tokens (%d cells, batches of %d), want fewer than Burst/8 = %d", held, s.Cells(), s.Batch, burst/8)
		}
		time.Sleep(burst * time.Second) // the bucket is full again
		n := 0
		for l.TryAcquire() {
			n++
		}
		if n >= burst+burst/8 {
			t.Fatalf("%d admitted at one instant, want fewer than Burst+Burst/8 = %d", n, burst+burst/8)
		}
	})
}

// A hint only chooses a cell: with any values, the callers together still
// get exactly the burst at one instant.
func TestStripedLimiterAnyHintIsCorrect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const burst = 500
		l := stripedLimiter(t, Config{PerSecond: 1, Burst: burst})
		if !l.striped() {
			t.Fatal("striped() = false for a striped limiter")
		}
		n := 0
		for i := uint32(0); l.tryTakeHinted(i * 2654435761); i++ {
			n++
		}
		if n != burst {
			t.Fatalf("admitted %d, want exactly the burst %d", n, burst)
		}
	})
	var none *Limiter
	if none.striped() || !none.tryTakeHinted(7) {
		t.Fatal("a nil limiter must admit and not be striped")
	}
}

// striped reports whether the limiter leases tokens to per-processor cells
// (false for a nil Limiter).
func (l *Limiter) striped() bool { return l != nil && l.stripes.Load() != nil }

// tryTakeHinted is tryTake as a caller with a hint of its own would call it.
func (l *Limiter) tryTakeHinted(hint uint32) bool { return l == nil || l.tryTake(hint) }
