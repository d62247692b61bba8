package admission_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/admission/throttle"
)

// One attempt passes the circuit breaker, the rate limiter and the bulkhead,
// in that order, and gives its permits back in reverse. When the bulkhead
// rejects, the rate token is refunded and the circuit permission released
// without an outcome: the upstream never saw the attempt.
func Example() {
	p, err := admission.New(admission.Config{
		Upstream: "api.example.com:443",
		Rate:     ratelimit.Config{PerSecond: 100},
		Bulkhead: bulkhead.Config{MaxConcurrent: 1},
		OnEvent:  func(e admission.Event) { fmt.Println(" ", e) },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	fmt.Println("first attempt:")
	first, _ := p.Acquire(ctx)

	fmt.Println("second attempt, while the first is in flight:")
	_, err = p.Acquire(ctx)
	fmt.Println("  rejected by the bulkhead:", errors.Is(err, bulkhead.ErrFull))

	fmt.Println("the first attempt ends:")
	first.Success(20 * time.Millisecond)
	// Output:
	// first attempt:
	//   circuit-enter
	//   rate-enter
	//   bulkhead-enter
	// second attempt, while the first is in flight:
	//   circuit-enter
	//   rate-enter
	//   bulkhead-reject
	//   rate-exit(refund)
	//   circuit-release
	//   rejected by the bulkhead: true
	// the first attempt ends:
	//   bulkhead-exit
	//   rate-exit
	//   circuit-exit(success)
}

// The permit is resolved once; `defer pm.Release()` right after Acquire gives
// everything back on every other path, a panic included.
func ExamplePermit() {
	p, _ := admission.New(admission.Config{Upstream: "inventory", Bulkhead: bulkhead.Config{MaxConcurrent: 8}})

	call := func(ctx context.Context) error {
		pm, err := p.Acquire(ctx)
		if err != nil {
			return err // rejected locally: nothing to give back
		}
		defer pm.Release() // no-op once resolved below

		start := time.Now()
		err = errors.New("upstream answered 503") // the attempt itself
		if err != nil {
			pm.Failure(time.Since(start))
			return err
		}
		pm.Success(time.Since(start))
		return nil
	}
	for range 100 {
		_ = call(context.Background())
	}
	fmt.Println("breaker:", p.Breaker().State(), "- slots in use:", p.Bulkhead().InUse())
	// Output: breaker: OPEN - slots in use: 0
}

// A RejectedError names the guard that refused the attempt.
func ExampleRejectedError() {
	p, _ := admission.New(admission.Config{Upstream: "payments"})
	p.Breaker().SetState(circuit.ForcedOpen)

	_, err := p.Acquire(context.Background())
	var rej *admission.RejectedError
	if errors.As(err, &rej) {
		fmt.Println(rej.Guard, errors.Is(err, circuit.ErrOpen), errors.Is(err, admission.ErrRejected))
	}
	fmt.Println(err)
	// Output:
	// circuit true true
	// admission: payments: rejected by the circuit guard: circuit: breaker is open
}

// Overload protection without hand tuning: a limit learned from the
// upstream's latency, and client-side throttling.
func Example_overload() {
	cfg := admission.Config{
		Bulkhead: bulkhead.Config{Adaptive: true, MaxConcurrent: 200}, // learns the limit, from 20
		Throttle: throttle.Config{Enabled: true},                      // K = 2 over 30 s, at most 90 % refused
	}
	cfg.Upstream = "api.example.com:443"
	p, err := admission.New(cfg)
	if err != nil {
		panic(err)
	}
	pm, _ := p.Acquire(context.Background())
	pm.Success(20 * time.Millisecond)
	fmt.Println("limit", p.Bulkhead().Limit(), "refusal probability", p.Throttle().Probability())
	// Output: limit 20 refusal probability 0
}
