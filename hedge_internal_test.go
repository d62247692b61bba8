package outbound

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The estimate finds a quantile within its bucket's 4.4%, and follows the
// upstream: older samples weigh half after each window.
func TestTheLatencyEstimateFindsTheQuantileAndFollowsTheUpstream(t *testing.T) {
	var l latency
	if _, ok := l.quantile(0.95); ok {
		t.Fatal("a quantile with no samples")
	}
	for i := range 1000 {
		d := time.Millisecond + time.Duration(i%100)*10*time.Microsecond // 1.00 to 1.99 ms, evenly
		if i%50 == 0 {
			d = 200 * time.Millisecond // 2% slow
		}
		l.record(d)
	}
	q, ok := l.quantile(0.95)
	// 95% of all is 96.9% of the fast ones: about 1.97 ms.
	if !ok || q < 1800*time.Microsecond || q > 2100*time.Microsecond {
		t.Fatalf("p95 = %v, %v; want about 1.97 ms", q, ok)
	}
	if q, _ := l.quantile(0.99); q < 150*time.Millisecond {
		t.Fatalf("p99 = %v, want in the slow 2%%", q)
	}
	for range 3000 { // the upstream becomes uniformly fast
		l.record(100 * time.Microsecond)
	}
	if q, _ := l.quantile(0.95); q > 200*time.Microsecond {
		t.Fatalf("p95 = %v after 3000 fast answers, want about 100 µs: the estimate does not follow", q)
	}
	// A sparse tail survives the halvings: 2% of answers spread over
	// 100–300 ms (most of its buckets holding one sample per window) still
	// hold the 99th percentile.
	var tail latency
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		d := time.Millisecond + time.Duration(r.Int64N(int64(time.Millisecond)))
		if r.IntN(50) == 0 {
			d = 100*time.Millisecond + time.Duration(r.Int64N(int64(200*time.Millisecond)))
		}
		tail.record(d)
	}
	if q, _ := tail.quantile(0.99); q < 100*time.Millisecond {
		t.Fatalf("p99 = %v with a 2%% tail at 100–300 ms: the halvings erased the tail", q)
	}
}

// The hedge allowance starts with its burst, spends one hedge per take,
// atomically (concurrent takers cannot all take the last), earns twice the
// ExtraLoad per round up to the burst, and takes back a hedge given back.
func TestTheHedgeAllowanceHoldsABurstAndEarnsTwiceTheExtraLoadPerRound(t *testing.T) {
	var a hedgeAllowance
	var wg sync.WaitGroup
	var took atomic.Int64
	for range 4 * hedgeBurst {
		wg.Go(func() {
			if a.tryTake() {
				took.Add(1)
			}
		})
	}
	wg.Wait()
	if took.Load() != hedgeBurst {
		t.Fatalf("took %d hedges at once; want the burst, %d", took.Load(), hedgeBurst)
	}
	for range 9 { // 9 rounds at 0.05: 0.9 of a hedge
		a.earn(0.05)
	}
	if a.tryTake() {
		t.Fatal("a hedge taken with 0.9 earned")
	}
	a.earn(0.05)
	if !a.tryTake() || a.tryTake() {
		t.Fatal("ten rounds at 0.05 must earn exactly one hedge")
	}
	a.giveBack()
	if !a.tryTake() {
		t.Fatal("a hedge given back must be takeable again")
	}
	for range 100 * hedgeBurst {
		a.earn(0.5)
	}
	for range hedgeBurst {
		if !a.tryTake() {
			t.Fatal("the allowance earned less than its burst")
		}
	}
	if a.tryTake() {
		t.Fatal("the allowance earned more than its burst")
	}
}
