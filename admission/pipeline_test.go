package admission_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/internal/mutate"
	"github.com/outboundhq/outbound/internal/shard"
)

// recorder keeps the events of a pipeline as Event.String writes them.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) on(e admission.Event) {
	r.mu.Lock()
	r.events = append(r.events, e.String())
	r.mu.Unlock()
}

// take returns the events recorded since the last take.
func (r *recorder) take() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := strings.Join(r.events, ", ")
	r.events = nil
	return s
}

func (r *recorder) want(t *testing.T, want string) {
	t.Helper()
	if got := r.take(); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
}

// smallCircuit decides after 4 calls, waits 10 s in OPEN, allows 2 trials.
var smallCircuit = circuit.Config{WindowSize: 4, MinimumCalls: 4, WaitInOpen: 10 * time.Second,
	PermittedCallsInHalfOpen: 2}

func newPipeline(t *testing.T, cfg admission.Config) (*admission.Pipeline, *recorder) {
	t.Helper()
	r := &recorder{}
	cfg.Upstream = "up"
	cfg.OnEvent = r.on
	return mustPipeline(t, cfg), r
}

func acquire(t *testing.T, p *admission.Pipeline) admission.Permit {
	t.Helper()
	pm, err := p.Acquire(context.Background())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return pm
}

func fail(t *testing.T, p *admission.Pipeline, n int) {
	t.Helper()
	for range n {
		pm := acquire(t, p)
		pm.Failure(time.Millisecond)
	}
}

func TestAppliesCircuitThenRateLimiterThenBulkheadPerAttempt(t *testing.T) {
	p, r := newPipeline(t, admission.Config{Circuit: smallCircuit,
		Rate: ratelimit.Config{PerSecond: 100}, Bulkhead: bulkhead.Config{MaxConcurrent: 5}})
	for _, end := range []string{"success", "failure"} {
		pm := acquire(t, p)
		r.want(t, "circuit-enter, rate-enter, bulkhead-enter")
		if end == "success" {
			pm.Success(time.Millisecond)
		} else {
			pm.Failure(time.Millisecond)
		}
		r.want(t, "bulkhead-exit, rate-exit, circuit-exit("+end+")")
	}
}

func TestOpenCircuitDoesNotConsumeRateOrBulkheadPermit(t *testing.T) {
	p, r := newPipeline(t, admission.Config{Circuit: smallCircuit,
		Rate: ratelimit.Config{PerSecond: 1.0 / 3600, Burst: 10}, Bulkhead: bulkhead.Config{MaxConcurrent: 1}})
	fail(t, p, 4)
	r.take()
	tokens := p.Limiter().Available()
	for range 100 {
		_, err := p.Acquire(context.Background())
		var rej *admission.RejectedError
		if !errors.As(err, &rej) || rej.Guard != classify.GuardCircuit || !errors.Is(err, circuit.ErrOpen) ||
			!errors.Is(err, admission.ErrRejected) {
			t.Fatalf("err = %v, want a circuit rejection", err)
		}
	}
	if got := r.take(); got != strings.TrimSuffix(strings.Repeat("circuit-reject, ", 100), ", ") {
		t.Fatalf("events: %s", got)
	}
	if got := p.Limiter().Available(); got != tokens {
		t.Fatalf("tokens %d -> %d: an open circuit spent rate tokens", tokens, got)
	}
	if got := p.Bulkhead().InUse(); got != 0 {
		t.Fatalf("bulkhead in use %d", got)
	}
}

func TestBulkheadRejectionReleasesTheRateLimiterAndIsNotACircuitError(t *testing.T) {
	p, r := newPipeline(t, admission.Config{Circuit: smallCircuit,
		Rate: ratelimit.Config{PerSecond: 1.0 / 3600, Burst: 10}, Bulkhead: bulkhead.Config{MaxConcurrent: 1}})
	held := acquire(t, p)
	r.take()
	tokens := p.Limiter().Available()
	for range 1000 {
		_, err := p.Acquire(context.Background())
		if !errors.Is(err, bulkhead.ErrFull) {
			t.Fatalf("err = %v, want ErrFull", err)
		}
	}
	first := strings.SplitN(r.take(), ", ", 6)
	if got := strings.Join(first[:5], ", "); got != "circuit-enter, rate-enter, bulkhead-reject, rate-exit(refund), circuit-release" {
		t.Fatalf("events of a bulkhead rejection: %s", got)
	}
	if got := p.Limiter().Available(); got != tokens {
		t.Fatalf("tokens %d -> %d: bulkhead rejections kept rate tokens", tokens, got)
	}
	if m := p.Breaker().Metrics(); m.State != circuit.Closed || m.Calls != 0 {
		t.Fatalf("breaker saw local rejections: %+v", m)
	}
	held.Success(0)
}

func TestRateLimiterRejectionReleasesTheCircuitPermission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, r := newPipeline(t, admission.Config{Circuit: smallCircuit, Rate: ratelimit.Config{PerSecond: 1.0 / 3600, Burst: 4}})
		fail(t, p, 4) // spends every token and opens the breaker
		time.Sleep(10 * time.Second)
		synctest.Wait()
		r.take()
		for range 5 {
			if _, err := p.Acquire(context.Background()); !errors.Is(err, ratelimit.ErrLimited) {
				t.Fatalf("err = %v, want ErrLimited", err)
			}
		}
		if got := strings.SplitN(r.take(), ", ", 4)[:3]; strings.Join(got, ", ") != "circuit-enter, rate-reject, circuit-release" {
			t.Fatalf("events of a rate rejection: %v", got)
		}
		if m := p.Breaker().Metrics(); m.State != circuit.HalfOpen || m.TrialsInFlight != 0 {
			t.Fatalf("trial slots lost to rate rejections: %+v", m)
		}
	})
}

// TestHalfOpenTrialsRejectedLocallyDoNotStopTheBreakerFromClosing is the
// recovery under back-pressure end to end: the upstream fails, the breaker
// opens, the wait passes, the HALF_OPEN trial attempts are rejected by local
// guards, the upstream recovers, and the breaker closes. With the circuit
// permission kept on a local rejection, the same scenario stays stuck.
func TestHalfOpenTrialsRejectedLocallyDoNotStopTheBreakerFromClosing(t *testing.T) {
	cfg := admission.Config{
		Circuit: circuit.Config{WindowSize: 4, MinimumCalls: 4, WaitInOpen: 10 * time.Second,
			PermittedCallsInHalfOpen: 2, MaxWaitInHalfOpen: -1}, // no reclaim: the release alone must do it
		Rate:     ratelimit.Config{PerSecond: 1.0 / 600, Burst: 4}, // a token every 10 minutes
		Bulkhead: bulkhead.Config{MaxConcurrent: 1},
	}
	scenario := func(t *testing.T) circuit.State {
		var final circuit.State
		synctest.Test(t, func(t *testing.T) {
			p := mustPipeline(t, cfg)
			fail(t, p, 4) // the upstream fails: OPEN, and the burst is spent
			time.Sleep(10 * time.Second)
			synctest.Wait()
			if s := p.Breaker().State(); s != circuit.HalfOpen {
				t.Fatalf("state after the wait = %v", s)
			}
			// Traffic returns; the rate limiter rejects every trial attempt.
			for range 5 {
				_, _ = p.Acquire(context.Background())
			}
			// A token comes back; one trial is admitted and is slow: it holds
			// the bulkhead while the next trial attempts are rejected by it.
			time.Sleep(10 * time.Minute)
			slow, err := p.Acquire(context.Background())
			if err == nil {
				for range 3 {
					time.Sleep(10 * time.Minute)
					_, _ = p.Acquire(context.Background()) // token, but the bulkhead is full
				}
				slow.Success(time.Millisecond) // the upstream has recovered
			}
			// Recovered upstream, tokens refilled: healthy traffic resumes.
			for range 20 {
				time.Sleep(10 * time.Minute)
				if pm, err := p.Acquire(context.Background()); err == nil {
					pm.Success(time.Millisecond)
				}
			}
			final = p.Breaker().State()
		})
		return final
	}
	if got := scenario(t); got != circuit.Closed {
		t.Fatalf("breaker after recovery = %v, want CLOSED", got)
	}
	t.Run("without releasing the permission it stays stuck", func(t *testing.T) {
		if !mutate.Enabled {
			t.Skip("needs the deliberate faults: go test -tags mutate (scripts/test does)")
		}
		mutate.KeepCircuitPermitOnLocalRejection.Store(true)
		defer mutate.KeepCircuitPermitOnLocalRejection.Store(false)
		if got := scenario(t); got != circuit.HalfOpen {
			t.Fatalf("with the permission kept on a local rejection the breaker ended %v; the scenario no longer shows the bug", got)
		}
	})
}

func TestEveryPermitIsReturnedOnEveryPath(t *testing.T) {
	paths := map[string]func(t *testing.T, p *admission.Pipeline){
		"success": func(t *testing.T, p *admission.Pipeline) { pm := acquire(t, p); pm.Success(0) },
		"failure": func(t *testing.T, p *admission.Pipeline) { pm := acquire(t, p); pm.Failure(0) },
		"release": func(t *testing.T, p *admission.Pipeline) { pm := acquire(t, p); pm.Release() },
		"cancel":  func(t *testing.T, p *admission.Pipeline) { pm := acquire(t, p); pm.Cancel() },
		"panic": func(t *testing.T, p *admission.Pipeline) {
			defer func() { _ = recover() }()
			pm := acquire(t, p)
			defer pm.Release()
			panic("the call panicked")
		},
		"success then deferred release": func(t *testing.T, p *admission.Pipeline) {
			pm := acquire(t, p)
			defer pm.Release()
			pm.Success(0)
		},
		"context cancelled while waiting for the bulkhead": func(t *testing.T, p *admission.Pipeline) {
			held := acquire(t, p)
			ctx, cancel := context.WithCancel(context.Background())
			go func() { time.Sleep(time.Second); cancel() }()
			if _, err := p.Acquire(ctx); !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
			held.Success(0)
		},
		"timeout while waiting for the bulkhead": func(t *testing.T, p *admission.Pipeline) {
			held := acquire(t, p)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if _, err := p.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err = %v, want context.DeadlineExceeded", err)
			}
			held.Success(0)
		},
		"bulkhead wait exhausted": func(t *testing.T, p *admission.Pipeline) {
			held := acquire(t, p)
			if _, err := p.Acquire(context.Background()); !errors.Is(err, bulkhead.ErrFull) {
				t.Errorf("err = %v, want ErrFull", err)
			}
			held.Success(0)
		},
	}
	for name, path := range paths {
		for _, state := range []circuit.State{circuit.Closed, circuit.HalfOpen} {
			t.Run(name+"/"+state.String(), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					p, r := newPipeline(t, admission.Config{Circuit: smallCircuit,
						Rate:     ratelimit.Config{PerSecond: 1.0 / 3600, Burst: 10},
						Bulkhead: bulkhead.Config{MaxConcurrent: 1, MaxWait: 5 * time.Second}})
					spent := 0
					if state == circuit.HalfOpen {
						fail(t, p, 4)
						spent = 4
						time.Sleep(10 * time.Second)
						synctest.Wait()
					}
					r.take()
					path(t, p)
					n := checkBalanced(t, p, r.take())
					if m := p.Breaker().Metrics(); m.TrialsInFlight != 0 {
						t.Fatalf("trial slots still held: %+v", m)
					}
					// The clock moves a few seconds at most: no token refills.
					if got, want := p.Limiter().Available(), 10-spent-n["rate-exit"]; got != want {
						t.Fatalf("tokens available %d, want %d: a token was lost or refunded twice", got, want)
					}
				})
			})
		}
	}
}

// checkBalanced checks, from the event log of finished attempts, that every
// permit handed out came back exactly once, that every bulkhead rejection
// refunded its rate token, and that the bulkhead is empty. It returns the
// count of each event.
func checkBalanced(t *testing.T, p *admission.Pipeline, log string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, e := range strings.Split(log, ", ") {
		n[e]++
	}
	circuitBack := n["circuit-exit(success)"] + n["circuit-exit(failure)"] + n["circuit-release"]
	if n["circuit-enter"] != circuitBack {
		t.Errorf("circuit: %d entered, %d came back (%s)", n["circuit-enter"], circuitBack, log)
	}
	if n["rate-enter"] != n["rate-exit"]+n["rate-exit(refund)"] {
		t.Errorf("rate: %d entered, %d exited, %d refunded (%s)", n["rate-enter"], n["rate-exit"], n["rate-exit(refund)"], log)
	}
	if n["bulkhead-enter"] != n["bulkhead-exit"] {
		t.Errorf("bulkhead: %d entered, %d exited (%s)", n["bulkhead-enter"], n["bulkhead-exit"], log)
	}
	if p.Limiter() != nil && n["rate-exit(refund)"] < n["bulkhead-reject"] {
		t.Errorf("%d bulkhead rejections, only %d refunds (%s)", n["bulkhead-reject"], n["rate-exit(refund)"], log)
	}
	if got := p.Bulkhead().InUse(); got != 0 {
		t.Errorf("bulkhead still holds %d slots", got)
	}
	return n
}

func TestEventsAreDeliveredOutsideLocksAndObserversCannotBreakAdmission(t *testing.T) {
	var p *admission.Pipeline
	var mu sync.Mutex
	var seen int
	cfg := admission.Config{Upstream: "up", Circuit: smallCircuit, Bulkhead: bulkhead.Config{MaxConcurrent: 1}}
	cfg.OnEvent = func(e admission.Event) {
		_ = p.Breaker().Metrics() // would deadlock under the breaker's lock
		_ = p.Bulkhead().InUse()
		mu.Lock()
		seen++
		mu.Unlock()
		panic("observer bug: " + e.String())
	}
	p = mustPipeline(t, cfg)
	held := acquire(t, p)
	if _, err := p.Acquire(context.Background()); !errors.Is(err, bulkhead.ErrFull) {
		t.Fatalf("err = %v", err)
	}
	held.Failure(0)
	fail(t, p, 3)
	if s := p.Breaker().State(); s != circuit.Open {
		t.Fatalf("state %v, want OPEN", s)
	}
	if p.Bulkhead().InUse() != 0 || seen == 0 {
		t.Fatalf("in use %d, events seen %d", p.Bulkhead().InUse(), seen)
	}
}

func TestBreakerTransitionsAreEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, r := newPipeline(t, admission.Config{Circuit: smallCircuit})
		fail(t, p, 4)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		log := r.take()
		if !strings.HasSuffix(log, "circuit-enter, circuit-exit(failure), circuit-transition(CLOSED->OPEN), circuit-transition(OPEN->HALF_OPEN)") {
			t.Fatalf("events: %s", log)
		}
	})
}

func TestResolvingAPipelinePermitTwiceIsHarmless(t *testing.T) {
	p, r := newPipeline(t, admission.Config{Circuit: smallCircuit, Rate: ratelimit.Config{PerSecond: 10}, Bulkhead: bulkhead.Config{MaxConcurrent: 1}})
	pm := acquire(t, p)
	pm.Success(0)
	pm.Failure(0)
	pm.Cancel()
	pm.Release()
	r.want(t, "circuit-enter, rate-enter, bulkhead-enter, bulkhead-exit, rate-exit, circuit-exit(success)")
	if pm.Held() || p.Bulkhead().InUse() != 0 {
		t.Fatal("permit still held")
	}
}

func TestInvalidPipelineConfigNamesTheField(t *testing.T) {
	for field, cfg := range map[string]admission.Config{
		"admission: Config.Circuit.FailureRateThreshold must": {Circuit: circuit.Config{FailureRateThreshold: 200}},
		"admission: Config.Rate.PerSecond must":               {Rate: ratelimit.Config{PerSecond: -3}},
		"admission: Config.Bulkhead.MaxConcurrent must":       {Bulkhead: bulkhead.Config{MaxConcurrent: -1}},
	} {
		if _, err := admission.New(cfg); err == nil || !strings.HasPrefix(err.Error(), field) {
			t.Errorf("err = %v, want it to name %s", err, field)
		}
	}
}

// TestBulkheadSlotIsHeldUntilThePermitIsResolved pins the admission half of
// rule A5: the slot is not given back when the attempt "starts answering" but
// only when its permit is resolved (for HTTP, when the body is closed or read
// to the end).
func TestBulkheadSlotIsHeldUntilThePermitIsResolved(t *testing.T) {
	p, _ := newPipeline(t, admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 2}})
	a, b := acquire(t, p), acquire(t, p)
	if _, err := p.Acquire(context.Background()); !errors.Is(err, bulkhead.ErrFull) {
		t.Fatalf("third attempt: %v, want ErrFull while two permits are held", err)
	}
	a.Success(0)
	c := acquire(t, p)
	b.Release()
	c.Cancel()
	if got := p.Bulkhead().InUse(); got != 0 {
		t.Fatalf("in use %d", got)
	}
}

// A pipeline whose rate limiter and bulkhead are striped keeps its limits
// and gives everything back, with permits resolved on other goroutines
// (so released into other processors' cells) and resolved twice.
func TestAStripedPipelineKeepsItsLimitsAndLosesNothing(t *testing.T) {
	restore := shard.Force(true)
	const limit = 32
	p := mustPipeline(t, admission.Config{Upstream: "striped",
		Rate:     ratelimit.Config{PerSecond: 1e6, Burst: 100000},
		Bulkhead: bulkhead.Config{MaxConcurrent: limit}})
	restore()
	for round := range 20 {
		var held []admission.Permit
		for {
			pm, err := p.Acquire(context.Background())
			if err != nil {
				if !errors.Is(err, bulkhead.ErrFull) {
					t.Fatalf("round %d: %v, want the bulkhead full", round, err)
				}
				break
			}
			held = append(held, pm)
		}
		if len(held) != limit {
			t.Fatalf("round %d: admitted %d, want %d", round, len(held), limit)
		}
		var wg sync.WaitGroup
		for i := range held {
			wg.Go(func() { held[i].Success(0); held[i].Release() })
		}
		wg.Wait()
		if n := p.Bulkhead().InUse(); n != 0 {
			t.Fatalf("round %d: %d slots still in use", round, n)
		}
	}
}

// A throttled attempt is a local rejection: it spends no rate token and no
// bulkhead slot, gives the circuit permission back (a HALF_OPEN breaker
// keeps its trial slots), and the breaker records nothing.
func TestAThrottledAttemptIsALocalRejectionThatReleasesTheCircuitPermission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, r := newPipeline(t, admission.Config{Circuit: smallCircuit,
			Throttle: throttle.Config{Enabled: true, K: 1, MaxRejection: 1},
			Rate:     ratelimit.Config{PerSecond: 1.0 / 3600, Burst: 100},
			Bulkhead: bulkhead.Config{MaxConcurrent: 1}})
		for p.Breaker().State() != circuit.Open { // 4 failures, between throttled attempts
			if pm, err := p.Acquire(context.Background()); err == nil {
				pm.Failure(time.Millisecond)
			}
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		r.take()
		tokens := p.Limiter().Available()
		throttled := 0
		for range 50 {
			pm, err := p.Acquire(context.Background())
			if err == nil {
				pm.Release()
				continue
			}
			var re *admission.RejectedError
			if !errors.Is(err, throttle.ErrThrottled) || !errors.As(err, &re) || re.Guard != classify.GuardThrottle {
				t.Fatalf("err = %v, want a throttle rejection", err)
			}
			throttled++
		}
		if throttled == 0 {
			t.Fatal("nothing throttled: the test shows nothing")
		}
		spent := 50 - throttled
		if got := p.Limiter().Available(); got != tokens-spent {
			t.Fatalf("%d tokens left, want %d: throttled attempts spent rate tokens", got, tokens-spent)
		}
		if m := p.Breaker().Metrics(); m.State != circuit.HalfOpen || m.TrialsInFlight != 0 || m.Calls != 0 {
			t.Fatalf("after throttled trials: %+v", m)
		}
		if !strings.Contains(r.take(), "circuit-enter, throttle-reject, circuit-release") {
			t.Fatal("no throttle rejection among the events")
		}
	})
}

// An attempt a later guard refused never reached the upstream: the throttle
// takes it back out of its count, so the client's own back-pressure never
// raises the probability of throttling.
func TestALaterGuardsRejectionIsTakenOutOfTheThrottlesCount(t *testing.T) {
	p, _ := newPipeline(t, admission.Config{Circuit: smallCircuit,
		Throttle: throttle.Config{Enabled: true}, Bulkhead: bulkhead.Config{MaxConcurrent: 1}})
	held := acquire(t, p)
	for range 1000 {
		if _, err := p.Acquire(context.Background()); !errors.Is(err, bulkhead.ErrFull) {
			t.Fatalf("err = %v, want ErrFull", err)
		}
	}
	held.Success(time.Millisecond)
	if req, acc := p.Throttle().Counts(); req != 1 || acc != 1 || p.Throttle().Probability() != 0 {
		t.Fatalf("throttle counts %d requests, %d accepts after 1000 bulkhead rejections", req, acc)
	}
}

// An attempt that ended after the throttle's whole window is counted when it
// ended (its admission plus its duration, no clock read), not in the bucket
// of its admission, which has left the window by then.
func TestTheThrottleCountsAnAttemptWhenItEnded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := newPipeline(t, admission.Config{Circuit: smallCircuit,
			Throttle: throttle.Config{Enabled: true, Window: 10 * time.Second}})
		slow, failed := acquire(t, p), acquire(t, p)
		time.Sleep(15 * time.Second)
		slow.Success(15 * time.Second)
		failed.Failure(15 * time.Second)
		if req, acc := p.Throttle().Counts(); req != 2 || acc != 1 {
			t.Fatalf("throttle counts %d requests, %d accepts, want 2 and 1", req, acc)
		}
	})
}

// Only answers move an adaptive limit: a local rejection, an attempt never
// sent (Cancel), one cancelled by the caller or lost as a hedge (Release),
// and a failure without an answer (Lost) leave it as it was.
func TestLocalRejectionsNotSentAttemptsAndCancellationsNeverChangeTheAdaptiveLimit(t *testing.T) {
	p, _ := newPipeline(t, admission.Config{Circuit: circuit.Config{WindowSize: 1000, MinimumCalls: 1000},
		Rate:     ratelimit.Config{PerSecond: 1e9, Burst: 1_000_000},
		Bulkhead: bulkhead.Config{Adaptive: true, MaxConcurrent: 100, InitialConcurrent: 4}})
	h := p.Bulkhead()
	for i := range 600 { // 800 Lost: fewer than the breaker's minimum calls, which it would open at
		var held []admission.Permit
		for {
			pm, err := p.Acquire(context.Background())
			if err != nil {
				break // the bulkhead is full: a local rejection
			}
			held = append(held, pm)
		}
		for j := range held {
			switch (i + j) % 3 {
			case 0:
				held[j].Cancel()
			case 1:
				held[j].Release()
			case 2:
				held[j].Lost(time.Duration(i) * time.Millisecond)
			}
		}
	}
	if h.Windows() != 0 || h.Limit() != 4 || h.InUse() != 0 {
		t.Fatalf("windows %d, limit %d, in use %d", h.Windows(), h.Limit(), h.InUse())
	}
	// Answers do move it.
	for range 200 {
		fillAndAnswer(p)
	}
	if h.Windows() == 0 || h.Limit() <= 4 {
		t.Fatalf("answers did not move the limit: windows %d, limit %d", h.Windows(), h.Limit())
	}
}

// fillAndAnswer admits attempts until p refuses one, then answers them all
// with a success after a millisecond.
func fillAndAnswer(p *admission.Pipeline) {
	var held []admission.Permit
	for {
		pm, err := p.Acquire(context.Background())
		if err != nil {
			break
		}
		held = append(held, pm)
	}
	for j := range held {
		held[j].Success(time.Millisecond)
	}
}

// A moved adaptive limit is an event, with the limits before and after.
func TestAMovedAdaptiveLimitIsAnEvent(t *testing.T) {
	p, r := newPipeline(t, admission.Config{Circuit: circuit.Config{WindowSize: 1000, MinimumCalls: 1000},
		Bulkhead: bulkhead.Config{Adaptive: true, MaxConcurrent: 100, InitialConcurrent: 4}})
	for p.Bulkhead().Limit() == 4 {
		fillAndAnswer(p)
	}
	want := fmt.Sprintf("bulkhead-limit(4->%d)", p.Bulkhead().Limit())
	if log := r.take(); !strings.Contains(log, want) {
		t.Fatalf("no %s among the events: %s", want, log)
	}
}

// A pipeline has learned something a new one would not know once its
// breaker's window holds a failure, its throttle's window an attempt the
// upstream declined, or its adaptive limit has closed a sampling window;
// successes alone teach it nothing. (An upstream that has learned something
// is not forgotten with its last connection, nor to make room.)
func TestAPipelineHasLearnedWhatANewOneWouldNotKnow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     admission.Config
		resolve func(*admission.Permit)
	}{
		{"a failure in the breaker's window", admission.Config{}, func(pm *admission.Permit) { pm.Failure(time.Millisecond) }},
		{"a declined attempt in the throttle's window", admission.Config{Throttle: throttle.Config{Enabled: true}},
			func(pm *admission.Permit) { pm.Declined(time.Millisecond) }},
		{"an adaptive limit's window", admission.Config{Bulkhead: bulkhead.Config{Adaptive: true, MaxConcurrent: 64}},
			func(pm *admission.Permit) { pm.Success(time.Millisecond) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := newPipeline(t, tc.cfg)
			for range 200 {
				pm := acquire(t, p)
				pm.Success(time.Millisecond)
			}
			if w := p.Bulkhead().Windows(); p.Learned() != (w > 0) || tc.cfg.Bulkhead.Adaptive != (w > 0) {
				t.Fatalf("learned %v after 200 successes, with %d adaptive windows closed", p.Learned(), w)
			}
			pm := acquire(t, p)
			tc.resolve(&pm)
			if !p.Learned() {
				t.Fatal("nothing learned")
			}
		})
	}
}

// TestThePipelinePassesTheCallsCriticalityToItsGuards: through Acquire, a
// sheddable call leaves a tenth of the bulkhead's slots free, and a
// critical call takes the last ones.
func TestThePipelinePassesTheCallsCriticalityToItsGuards(t *testing.T) {
	p, err := admission.New(admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 10}})
	if err != nil {
		t.Fatal(err)
	}
	count := func(ctx context.Context) (n int) {
		for {
			if _, err := p.Acquire(ctx); err != nil {
				return n
			}
			n++
		}
	}
	if n := count(criticality.With(context.Background(), criticality.Sheddable)); n != 9 {
		t.Fatalf("sheddable calls got %d slots of 10, want 9", n)
	}
	if n := count(criticality.With(context.Background(), criticality.Critical)); n != 1 {
		t.Fatalf("then critical calls got %d, want the last one", n)
	}
}
