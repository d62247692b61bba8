package circuit_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission/circuit"
)

// The tests of this file pin the behaviours checked against Resilience4j's
// own tests (CircuitBreakerStateMachineTest, CircuitBreakerMetrics) where
// the breaker once differed without saying so, and what its users rely on
// beyond them.

// A call is slow only above SlowCallDuration, as in Resilience4j's
// CircuitBreakerMetrics (duration > threshold).
func TestACallLastingExactlySlowCallDurationIsNotSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := small() // SlowCallDuration 1 s, window 4
		b := newBreaker(t, cfg)
		for range 4 {
			p, _ := b.Allow()
			p.Success(time.Second)
		}
		if m := b.Metrics(); m.Slow != 0 || m.State != circuit.Closed {
			t.Fatalf("four calls of exactly the slow-call duration: %+v", m)
		}
		p, _ := b.Allow()
		p.Success(time.Second + 1)
		if m := b.Metrics(); m.Slow != 1 {
			t.Fatalf("a call 1 ns above it: %+v", m)
		}
	})
}

// HALF_OPEN decides once the smaller of MinimumCalls and the permitted trial
// calls have finished (Resilience4j's CircuitBreakerMetrics.forHalfOpen):
// with 4 trial calls and a minimum of 2, two failed trials reopen it at once,
// and two good ones close it at once.
func TestHalfOpenDecidesAfterTheSmallerOfMinimumCallsAndPermittedCalls(t *testing.T) {
	for _, tc := range []struct {
		trials string
		want   circuit.State
	}{{"ff", circuit.Open}, {"ss", circuit.Closed}, {"sf", circuit.Open}} {
		t.Run(tc.trials, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBreaker(t, circuit.Config{WindowSize: 4, MinimumCalls: 2, PermittedCallsInHalfOpen: 4, WaitInOpen: time.Second})
				record(t, b, "ff")
				wantState(t, b, circuit.Open)
				time.Sleep(time.Second)
				synctest.Wait()
				wantState(t, b, circuit.HalfOpen)
				var held []circuit.Permission
				for range 4 { // all four trial slots handed out
					p, err := b.Allow()
					if err != nil {
						t.Fatal(err)
					}
					held = append(held, p)
				}
				for i, c := range tc.trials {
					if c == 'f' {
						held[i].Failure(time.Millisecond)
					} else {
						held[i].Success(time.Millisecond)
					}
				}
				wantState(t, b, tc.want)
				held[2].Failure(time.Millisecond) // a later generation's result: ignored
				wantState(t, b, tc.want)
			})
		})
	}
}

// SetState refuses what Resilience4j's StateTransition refuses: CLOSED to
// HALF_OPEN, METRICS_ONLY to OPEN or HALF_OPEN. The refusal changes nothing
// and publishes nothing; every other transition is made.
func TestSetStateRefusesTheTransitionsResilience4jRefuses(t *testing.T) {
	states := []circuit.State{circuit.Closed, circuit.Open, circuit.HalfOpen, circuit.Disabled, circuit.ForcedOpen, circuit.MetricsOnly}
	illegal := map[[2]circuit.State]bool{
		{circuit.Closed, circuit.HalfOpen}:      true,
		{circuit.MetricsOnly, circuit.Open}:     true,
		{circuit.MetricsOnly, circuit.HalfOpen}: true,
	}
	for _, from := range states {
		for _, to := range states {
			t.Run(fmt.Sprintf("%v->%v", from, to), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					var mu sync.Mutex
					var seen []circuit.Transition
					cfg := small()
					cfg.OnStateChange = func(tr circuit.Transition) { mu.Lock(); seen = append(seen, tr); mu.Unlock() }
					b := newBreaker(t, cfg)
					switch from { // reach from
					case circuit.Closed:
					case circuit.HalfOpen:
						if err := b.SetState(circuit.Open); err != nil {
							t.Fatal(err)
						}
						time.Sleep(cfg.WaitInOpen)
						synctest.Wait()
					default:
						if err := b.SetState(from); err != nil {
							t.Fatal(err)
						}
					}
					wantState(t, b, from)
					mu.Lock()
					seen = nil
					mu.Unlock()
					gen := b.Metrics().Generation
					err := b.SetState(to)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case illegal[[2]circuit.State{from, to}]:
						var te *circuit.TransitionError
						if !errors.Is(err, circuit.ErrIllegalTransition) || !errors.As(err, &te) || te.From != from || te.To != to {
							t.Fatalf("err %v, want an illegal transition", err)
						}
						if b.State() != from || b.Metrics().Generation != gen || len(seen) != 0 {
							t.Fatalf("a refused transition changed the breaker: %v, generation %d, events %v", b.State(), b.Metrics().Generation, seen)
						}
					case err != nil:
						t.Fatalf("a legal transition refused: %v", err)
					default:
						wantState(t, b, to)
					}
				})
			})
		}
	}
}

// Setting the state the breaker is in starts it afresh but publishes no
// transition (Resilience4j's shouldNotPublishStateTransitionEventsForInternalTransitions).
func TestSetStateToTheSameStatePublishesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var seen []circuit.Transition
		cfg := small()
		cfg.OnStateChange = func(tr circuit.Transition) { seen = append(seen, tr) }
		b := newBreaker(t, cfg)
		record(t, b, "sff") // three calls in the window, below the minimum
		for _, s := range []circuit.State{circuit.Closed, circuit.Disabled, circuit.Disabled, circuit.ForcedOpen, circuit.ForcedOpen, circuit.Closed} {
			if err := b.SetState(s); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for _, tr := range seen {
			got = append(got, tr.From.String()+"->"+tr.To.String())
		}
		if want := []string{"CLOSED->DISABLED", "DISABLED->FORCED_OPEN", "FORCED_OPEN->CLOSED"}; !slices.Equal(got, want) {
			t.Fatalf("transitions %v, want %v", got, want)
		}
		b2 := newBreaker(t, small())
		record(t, b2, "sff")
		if err := b2.SetState(circuit.Closed); err != nil || b2.Metrics().Calls != 0 {
			t.Fatalf("CLOSED to CLOSED must reset the window: %v, %+v", err, b2.Metrics())
		}
	})
}

// The metrics users read, as Resilience4j reports them: the rates are -1
// while fewer calls than the minimum are buffered; not-permitted calls are
// counted while OPEN.
func TestMetricsReportRatesAndCountsAsResilience4jDoes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBreaker(t, small()) // window 4, minimum 4, 2 trial calls
		record(t, b, "sfw")
		if m := b.Metrics(); m.FailureRate != -1 || m.SlowCallRate != -1 || m.Calls != 3 || m.Failed != 1 || m.Slow != 1 {
			t.Fatalf("below the minimum: %+v", m)
		}
		record(t, b, "f") // 2 of 4 failed: OPEN
		m := b.Metrics()
		if m.State != circuit.Open || m.FailureRate != 50 || m.SlowCallRate != 25 || m.Calls != 4 || m.Openings != 1 {
			t.Fatalf("at the minimum: %+v", m)
		}
		for range 3 {
			if _, err := b.Allow(); err == nil {
				t.Fatal("admitted while OPEN")
			}
		}
		if m := b.Metrics(); m.NotPermitted != 3 {
			t.Fatalf("not permitted while OPEN: %+v", m)
		}
		time.Sleep(small().WaitInOpen)
		synctest.Wait()
		record(t, b, "s")
		if m := b.Metrics(); m.State != circuit.HalfOpen || m.NotPermitted != 0 || m.Calls != 1 || m.FailureRate != -1 {
			t.Fatalf("in HALF_OPEN with one trial of two: %+v", m)
		}
	})
}

// Not-permitted calls are counted per state: those refused in HALF_OPEN
// (every trial slot taken) are not carried into the OPEN that failed trials
// lead to, which starts its count, like its window, from zero.
func TestNotPermittedCallsAreCountedFromZeroInEachState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBreaker(t, small()) // 2 trial calls
		record(t, b, "ffff")
		time.Sleep(small().WaitInOpen)
		synctest.Wait()
		p1, err1 := b.Allow()
		p2, err2 := b.Allow()
		if err1 != nil || err2 != nil {
			t.Fatalf("trial permits: %v %v", err1, err2)
		}
		if _, err := b.Allow(); err == nil {
			t.Fatal("a third trial admitted")
		}
		if m := b.Metrics(); m.State != circuit.HalfOpen || m.NotPermitted != 1 {
			t.Fatalf("in HALF_OPEN with both slots taken: %+v", m)
		}
		p1.Failure(time.Millisecond)
		p2.Failure(time.Millisecond)
		if m := b.Metrics(); m.State != circuit.Open || m.NotPermitted != 0 || m.Calls != 0 {
			t.Fatalf("in OPEN after failed trials: %+v", m)
		}
	})
}

// The wait in OPEN backs off, Resilience4j's waitIntervalFunctionInOpenState:
// each failed round of trial calls doubles it, up to MaxWaitInOpen, and it
// starts again from WaitInOpen once the breaker has closed.
func TestTheWaitInOpenBacksOffResetsWhenTheBreakerClosesAndIsAnnouncedByTheTransition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := circuit.Config{WindowSize: 2, MinimumCalls: 2, PermittedCallsInHalfOpen: 1,
			WaitInOpen: 10 * time.Second, WaitInOpenMultiplier: 2, MaxWaitInOpen: 100 * time.Second}
		var mu sync.Mutex
		var opened time.Time
		var waits, announced []time.Duration
		cfg.OnStateChange = func(tr circuit.Transition) {
			mu.Lock()
			defer mu.Unlock()
			switch tr.To {
			case circuit.Open:
				opened = time.Now()
				announced = append(announced, tr.Wait)
			case circuit.HalfOpen:
				waits = append(waits, time.Since(opened))
			}
		}
		b := newBreaker(t, cfg)
		probe := func(outcome string) { // wait for HALF_OPEN, then one trial call
			for b.State() != circuit.HalfOpen {
				time.Sleep(time.Second)
			}
			record(t, b, outcome)
		}
		record(t, b, "ff")
		for range 6 { // six failed probes
			probe("f")
		}
		probe("s") // the seventh succeeds: CLOSED
		wantState(t, b, circuit.Closed)
		record(t, b, "ff") // a new outage
		probe("s")
		synctest.Wait() // transitions are told from the timer's goroutine, after the state changed
		mu.Lock()
		defer mu.Unlock()
		want := []time.Duration{10, 20, 40, 80, 100, 100, 100, 10}
		if len(waits) != len(want) {
			t.Fatalf("waits %v", waits)
		}
		for i := range want {
			if waits[i] != want[i]*time.Second {
				t.Fatalf("waits in OPEN %v, want %v seconds", waits, want)
			}
			if announced[i] != waits[i] { // Transition.Wait says the wait to come
				t.Fatalf("transitions to OPEN announced waits %v, the breaker waited %v", announced, waits)
			}
		}
	})
}

// With WaitInOpenJitter, each wait is spread over ± the jitter of itself, so
// that clients do not probe in lockstep.
func TestTheWaitInOpenJitterSpreadsTheProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		seen := map[time.Duration]bool{}
		for range 20 {
			var mu sync.Mutex
			var opened time.Time
			var wait time.Duration
			cfg := circuit.Config{WindowSize: 1, MinimumCalls: 1, WaitInOpen: 10 * time.Second, WaitInOpenJitter: 0.5,
				OnStateChange: func(tr circuit.Transition) {
					mu.Lock()
					defer mu.Unlock()
					if tr.To == circuit.Open {
						opened = time.Now()
					} else if tr.To == circuit.HalfOpen {
						wait = time.Since(opened)
					}
				}}
			b := newBreaker(t, cfg)
			record(t, b, "f")
			time.Sleep(20 * time.Second)
			synctest.Wait()
			mu.Lock()
			w := wait
			mu.Unlock()
			if w < 5*time.Second || w > 15*time.Second {
				t.Fatalf("a wait of %v with a jitter of ±50%% of 10 s", w)
			}
			seen[w] = true
			_ = b.SetState(circuit.Disabled) // stops its timers
		}
		if len(seen) < 10 {
			t.Fatalf("20 breakers waited only %d different times", len(seen))
		}
	})
}

// The jitter applies after the cap: once the backoff has reached
// MaxWaitInOpen, the waits of a fleet still differ. (Resilience4j caps after
// randomizing, so every client at the cap probes at exactly the same time.)
func TestTheJitterStillSpreadsTheProbesOnceTheWaitIsCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		seen := map[time.Duration]bool{}
		above := 0
		for range 20 {
			var mu sync.Mutex
			var opened time.Time
			var waits []time.Duration
			cfg := circuit.Config{WindowSize: 1, MinimumCalls: 1, PermittedCallsInHalfOpen: 1, WaitInOpen: 10 * time.Second,
				WaitInOpenMultiplier: 10, MaxWaitInOpen: 20 * time.Second, WaitInOpenJitter: 0.5,
				OnStateChange: func(tr circuit.Transition) {
					mu.Lock()
					defer mu.Unlock()
					if tr.To == circuit.Open {
						opened = time.Now()
					} else if tr.To == circuit.HalfOpen {
						waits = append(waits, time.Since(opened))
					}
				}}
			b := newBreaker(t, cfg)
			record(t, b, "f")
			for b.State() != circuit.HalfOpen {
				time.Sleep(time.Second)
			}
			record(t, b, "f") // the second opening: 100 s, capped at 20 s, then spread
			time.Sleep(40 * time.Second)
			synctest.Wait()
			mu.Lock()
			w := waits[1]
			mu.Unlock()
			if w < 10*time.Second || w > 30*time.Second {
				t.Fatalf("a capped wait of %v with a jitter of ±50%% of 20 s", w)
			}
			seen[w] = true
			if w > 20*time.Second {
				above++
			}
			_ = b.SetState(circuit.Disabled)
		}
		if len(seen) < 10 || above == 0 {
			t.Fatalf("20 breakers at the cap waited %d different times, %d above the cap", len(seen), above)
		}
	})
}

// OpenFor opens the breaker for the time asked (an upstream's Retry-After),
// trials follow as usual, and an operator's state is left alone.
func TestOpenForOpensForTheTimeAskedAndLeavesOperatorStatesAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBreaker(t, small()) // its own wait: 10 s
		start := time.Now()
		if !b.OpenFor(45 * time.Second) {
			t.Fatal("OpenFor refused in CLOSED")
		}
		b.OpenFor(5 * time.Second) // shorter than what is left: no change
		time.Sleep(45*time.Second - time.Nanosecond)
		synctest.Wait()
		wantState(t, b, circuit.Open)
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if d := time.Since(start); d != 45*time.Second || b.State() != circuit.HalfOpen {
			t.Fatalf("after %v: %v, want HALF_OPEN", d, b.State())
		}
		_ = b.SetState(circuit.ForcedOpen)
		if b.OpenFor(time.Minute) || b.State() != circuit.ForcedOpen {
			t.Fatal("OpenFor overrode FORCED_OPEN")
		}
	})
}

// OpenFor at the very moment the wait in OPEN ends wins over it: the
// breaker stays OPEN for the time asked, whichever of the two gets the lock
// first. (Its timer may have fired already, its callback waiting for the
// lock; that callback must not end the longer wait.)
func TestOpenForAtTheEndOfTheWaitInOpenKeepsTheBreakerOpen(t *testing.T) {
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			b := newBreaker(t, small()) // 10 s in OPEN
			record(t, b, "ffff")
			time.Sleep(small().WaitInOpen) // wakes with the breaker's timer
			b.OpenFor(30 * time.Second)
			synctest.Wait()
			if st := b.State(); st != circuit.Open {
				t.Fatalf("right after OpenFor(30 s): %v", st)
			}
			time.Sleep(30*time.Second - time.Millisecond)
			synctest.Wait()
			if st := b.State(); st != circuit.Open {
				t.Fatalf("before the 30 s asked: %v", st)
			}
			time.Sleep(time.Millisecond)
			synctest.Wait()
			if st := b.State(); st != circuit.HalfOpen {
				t.Fatalf("after the 30 s asked: %v", st)
			}
		})
	}
}

// A breaker can start DISABLED or METRICS_ONLY, from the configuration, so
// that it is rolled out observing first; OPEN and HALF_OPEN cannot be
// starting states.
func TestABreakerStartsInTheStateTheConfigurationSays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, s := range []circuit.State{circuit.Disabled, circuit.MetricsOnly, circuit.ForcedOpen} {
			cfg := small()
			cfg.StartState = s
			b := newBreaker(t, cfg)
			wantState(t, b, s)
			if s == circuit.MetricsOnly {
				record(t, b, "ffff")
				if m := b.Metrics(); m.State != circuit.MetricsOnly || m.Failed != 4 || m.FailureRate != 100 {
					t.Fatalf("METRICS_ONLY records and never opens: %+v", m)
				}
			}
		}
		for _, s := range []circuit.State{circuit.Open, circuit.HalfOpen} {
			if _, err := circuit.New(circuit.Config{StartState: s}); err == nil {
				t.Errorf("StartState %v accepted", s)
			}
		}
	})
}

// TryAllow hands out no permit when it refuses: resolving what it returned
// then cannot free a HALF_OPEN trial slot, nor decide the trials.
func TestTryAllowRefusesWithoutAPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBreaker(t, small()) // 2 trial calls
		record(t, b, "ffff")
		time.Sleep(small().WaitInOpen)
		synctest.Wait()
		held := make([]circuit.Permission, 2)
		for i := range held {
			var err error
			if held[i], err = b.Allow(); err != nil {
				t.Fatal(err)
			}
		}
		p, ok := b.TryAllow()
		if ok {
			t.Fatal("TryAllow granted a permit in HALF_OPEN")
		}
		p.Release()
		p.Failure(time.Millisecond)
		if _, err := b.Allow(); err == nil {
			t.Fatal("resolving a refused TryAllow freed a trial slot")
		}
		if m := b.Metrics(); m.State != circuit.HalfOpen || m.Calls != 0 {
			t.Fatalf("resolving a refused TryAllow was recorded: %+v", m)
		}
	})
}

// Refusals counted from many goroutines at once are all counted: the count
// is spread over cells, never sampled.
func TestNotPermittedCountsEveryRefusalFromManyGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBreaker(t, small())
		record(t, b, "ffff")
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 1000 {
					if _, err := b.Allow(); err == nil {
						t.Error("admitted while OPEN")
						return
					}
				}
			})
		}
		wg.Wait()
		if m := b.Metrics(); m.NotPermitted != 8000 {
			t.Fatalf("NotPermitted %d after 8000 refusals", m.NotPermitted)
		}
		if err := b.SetState(circuit.ForcedOpen); err != nil {
			t.Fatal(err)
		}
		if m := b.Metrics(); m.NotPermitted != 0 {
			t.Fatalf("NotPermitted %d in a new state", m.NotPermitted)
		}
	})
}
