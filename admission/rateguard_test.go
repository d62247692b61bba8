package admission_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/classify"
)

// sharedGuard is a RateGuard with a fixed stock of tokens, or a fault that
// makes every Take fail.
type sharedGuard struct {
	mu       sync.Mutex
	tokens   int
	fault    error
	takes    int
	refunds  int
	upstream string
}

func (g *sharedGuard) Take(context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.takes++
	switch {
	case g.fault != nil:
		return g.fault
	case g.tokens == 0:
		return ratelimit.ErrLimited
	}
	g.tokens--
	return nil
}

func (g *sharedGuard) Refund() {
	g.mu.Lock()
	g.tokens++
	g.refunds++
	g.mu.Unlock()
}

func (g *sharedGuard) stock() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tokens
}

func sharedPipeline(t *testing.T, g *sharedGuard, b bulkhead.Config) (*admission.Pipeline, *recorder) {
	t.Helper()
	return newPipeline(t, admission.Config{Circuit: smallCircuit, Bulkhead: b,
		RateGuard: func(upstream string) admission.RateGuard { g.upstream = upstream; return g }})
}

func TestARateGuardTakesTheRateLimitersPlaceBetweenCircuitAndBulkhead(t *testing.T) {
	g := &sharedGuard{tokens: 10}
	p, r := sharedPipeline(t, g, bulkhead.Config{MaxConcurrent: 5})
	if g.upstream != "up" || p.RateGuard() != admission.RateGuard(g) || p.Limiter() != nil {
		t.Fatalf("the guard was made for %q (want \"up\"), pipeline has %v, local limiter %v", g.upstream, p.RateGuard(), p.Limiter())
	}
	for _, end := range []string{"success", "failure", "release"} {
		pm := acquire(t, p)
		r.want(t, "circuit-enter, rate-enter, bulkhead-enter")
		switch end {
		case "success":
			pm.Success(time.Millisecond)
			r.want(t, "bulkhead-exit, rate-exit, circuit-exit(success)")
		case "failure":
			pm.Failure(time.Millisecond)
			r.want(t, "bulkhead-exit, rate-exit, circuit-exit(failure)")
		default:
			pm.Release()
			r.want(t, "bulkhead-exit, rate-exit, circuit-release")
		}
	}
	if g.stock() != 7 || g.refunds != 0 {
		t.Fatalf("stock %d, refunds %d: three attempts that reached the wire must keep their tokens", g.stock(), g.refunds)
	}
}

func TestARateGuardsTokenIsRefundedWhenTheBulkheadRejectsOrTheAttemptIsCancelled(t *testing.T) {
	g := &sharedGuard{tokens: 10}
	p, r := sharedPipeline(t, g, bulkhead.Config{MaxConcurrent: 1})
	held := acquire(t, p)
	r.take()
	for range 100 {
		if _, err := p.Acquire(context.Background()); !errors.Is(err, bulkhead.ErrFull) {
			t.Fatalf("err = %v, want ErrFull", err)
		}
	}
	if got := strings.SplitN(r.take(), ", ", 6); strings.Join(got[:5], ", ") != "circuit-enter, rate-enter, bulkhead-reject, rate-exit(refund), circuit-release" {
		t.Fatalf("events of a bulkhead rejection: %s", got)
	}
	if g.stock() != 9 {
		t.Fatalf("stock %d, want 9: bulkhead rejections kept shared tokens", g.stock())
	}
	held.Cancel()
	if g.stock() != 10 {
		t.Fatalf("stock %d, want 10: a cancelled attempt kept its shared token", g.stock())
	}
	if m := p.Breaker().Metrics(); m.Calls != 0 {
		t.Fatalf("breaker saw local rejections: %+v", m)
	}
}

// A guard that cannot decide (its store unreachable) rejects locally: the
// breaker records nothing, and a HALF_OPEN trial slot is given back.
func TestARateGuardThatCannotDecideRejectsLocallyAndReleasesTheCircuitPermission(t *testing.T) {
	unreachable := errors.New("store unreachable")
	g := &sharedGuard{tokens: 100}
	p, r := sharedPipeline(t, g, bulkhead.Config{})
	if err := p.Breaker().SetState(circuit.Open); err != nil {
		t.Fatal(err)
	}
	if err := p.Breaker().SetState(circuit.HalfOpen); err != nil {
		t.Fatal(err)
	}
	r.take()
	g.fault = unreachable
	for range 10 {
		_, err := p.Acquire(context.Background())
		var rej *admission.RejectedError
		if !errors.As(err, &rej) || rej.Guard != classify.GuardRate || !errors.Is(err, unreachable) {
			t.Fatalf("err = %v, want a rate rejection carrying the guard's error", err)
		}
	}
	if got := strings.SplitN(r.take(), ", ", 4); strings.Join(got[:3], ", ") != "circuit-enter, rate-reject, circuit-release" {
		t.Fatalf("events of a guard that cannot decide: %s", got)
	}
	g.fault = nil
	// Both trial slots are still there and decide the breaker.
	a, b := acquire(t, p), acquire(t, p)
	a.Success(0)
	b.Success(0)
	if s := p.Breaker().State(); s != circuit.Closed {
		t.Fatalf("state %v after two successful trials, want CLOSED: the refused attempts starved HALF_OPEN", s)
	}
}

func TestRateAndRateGuardTogetherAreRefusedNamingTheField(t *testing.T) {
	_, err := admission.New(admission.Config{Rate: ratelimit.Config{PerSecond: 1},
		RateGuard: func(string) admission.RateGuard { return &sharedGuard{} }})
	if err == nil || !strings.Contains(err.Error(), "Config.RateGuard") {
		t.Fatalf("err = %v, want one naming Config.RateGuard", err)
	}
}

func TestARateGuardOfNilMeansNoRateGuard(t *testing.T) {
	p, r := newPipeline(t, admission.Config{RateGuard: func(string) admission.RateGuard { return nil }})
	pm := acquire(t, p)
	r.want(t, "circuit-enter")
	pm.Cancel()
	r.want(t, "circuit-release")
}

// panicky is a RateGuard whose every call panics.
type panicky struct{}

func (panicky) Take(context.Context) error { panic("broken guard") }
func (panicky) Refund()                    { panic("broken guard") }

// A RateGuard that panics refuses, and the circuit permission comes back: a
// HALF_OPEN trial slot is not lost to it.
func TestARateGuardThatPanicsRefusesAndGivesTheCircuitPermissionBack(t *testing.T) {
	p, _ := newPipeline(t, admission.Config{Circuit: circuit.Config{PermittedCallsInHalfOpen: 1},
		RateGuard: func(string) admission.RateGuard { return panicky{} }})
	if err := p.Breaker().SetState(circuit.Open); err != nil {
		t.Fatal(err)
	}
	if err := p.Breaker().SetState(circuit.HalfOpen); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := p.Acquire(context.Background()); !errors.Is(err, admission.ErrRejected) || !strings.Contains(err.Error(), "panicked") {
			t.Fatalf("err = %v, want a rejection saying the guard panicked", err)
		}
	}
	if m := p.Breaker().Metrics(); m.TrialsInFlight != 0 {
		t.Fatalf("%d trial permits held after the guard panicked", m.TrialsInFlight)
	}
}
