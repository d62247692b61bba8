package bench

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	fscircuit "github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/throttle"
)

// work is the trivial function every composition admits.
//
//go:noinline
func work() error { return nil }

var errWork = errors.New("bench: upstream failure")

//go:noinline
func fail() error { return errWork }

// admitter admits one call of fn through a library's breaker, rate limiter
// and bulkhead and returns fn's error or the rejection.
type admitter interface {
	run(fn func() error) error
}

// --- outbound -----------------------------------------------------------

type outboundAdmitter struct {
	p     *admission.Pipeline
	timed bool // measure the elapsed time for the breaker, as a caller does
}

func newOutbound(tb testing.TB) *admission.Pipeline {
	p, err := admission.New(outboundAdmissionConfig("bench"))
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// newOutboundAdaptive is newOutbound with the client-side throttle on and
// the bulkhead's limit adaptive (from the highest an adaptive bulkhead
// takes, still far above any caller count here, down to no fewer than the
// goroutines of a parallel run, which never reject).
func newOutboundAdaptive(tb testing.TB) *admission.Pipeline {
	cfg := outboundAdmissionConfig("bench")
	cfg.Bulkhead.Adaptive = true
	cfg.Bulkhead.MaxConcurrent = min(bulkheadSlots, bulkhead.MaxAdaptive)
	cfg.Bulkhead.InitialConcurrent = cfg.Bulkhead.MaxConcurrent
	cfg.Bulkhead.MinConcurrent = min(cfg.Bulkhead.MaxConcurrent, runtime.GOMAXPROCS(0)+1)
	cfg.Throttle = throttle.Config{Enabled: true}
	p, err := admission.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func (a outboundAdmitter) run(fn func() error) error {
	pm, err := a.p.Acquire(context.Background())
	if err != nil {
		return err
	}
	var start time.Time
	if a.timed {
		start = time.Now()
	}
	err = fn()
	var elapsed time.Duration
	if a.timed {
		elapsed = time.Since(start)
	}
	if err != nil {
		pm.Failure(elapsed)
	} else {
		pm.Success(elapsed)
	}
	return err
}

// --- failsafe-go --------------------------------------------------------

type failsafeAdmitter struct {
	cb   fscircuit.CircuitBreaker[any]
	exec failsafe.Executor[any]
}

func newFailsafe() failsafeAdmitter {
	cb := failsafeBreaker[any]()
	return failsafeAdmitter{cb: cb, exec: failsafe.With[any](cb, failsafeLimiter[any](), failsafeBulkhead[any]())}
}

func (a failsafeAdmitter) run(fn func() error) error { return a.exec.Run(fn) }

// --- gobreaker v2 + x/time/rate + channel, composed by hand --------------

var (
	errLimited = errors.New("bench: rate limited")
	errFull    = errors.New("bench: bulkhead full")
)

type gobreakerAdmitter struct {
	cb  *gobreaker.CircuitBreaker[struct{}]
	lim *rate.Limiter
	sem chan struct{}
}

func newGobreaker() gobreakerAdmitter {
	return gobreakerAdmitter{
		cb:  gobreaker.NewCircuitBreaker[struct{}](gobreakerSettings("bench")),
		lim: baselineLimiter(),
		sem: make(chan struct{}, bulkheadSlots),
	}
}

func (a gobreakerAdmitter) run(fn func() error) error {
	_, err := a.cb.Execute(func() (struct{}, error) {
		if !a.lim.Allow() {
			return struct{}{}, errLimited
		}
		select {
		case a.sem <- struct{}{}:
		default:
			return struct{}{}, errFull
		}
		defer func() { <-a.sem }()
		return struct{}{}, fn()
	})
	return err
}

// --- baseline: x/time/rate Allow + buffered channel, no breaker ------------

type baselineAdmitter struct {
	lim *rate.Limiter
	sem chan struct{}
}

func newBaseline() baselineAdmitter {
	return baselineAdmitter{lim: baselineLimiter(), sem: make(chan struct{}, bulkheadSlots)}
}

func (a baselineAdmitter) run(fn func() error) error {
	if !a.lim.Allow() {
		return errLimited
	}
	select {
	case a.sem <- struct{}{}:
	default:
		return errFull
	}
	err := fn()
	<-a.sem
	return err
}

// admitters are the compositions compared, in the order of the report.
var admitters = []struct {
	name string
	new  func(testing.TB) admitter
}{
	{"baseline", func(testing.TB) admitter { return newBaseline() }},
	{"outbound", func(tb testing.TB) admitter { return outboundAdmitter{p: newOutbound(tb)} }},
	{"outbound-timed", func(tb testing.TB) admitter { return outboundAdmitter{p: newOutbound(tb), timed: true} }},
	{"outbound-adaptive", func(tb testing.TB) admitter { return outboundAdmitter{p: newOutboundAdaptive(tb)} }},
	{"gobreaker", func(testing.TB) admitter { return newGobreaker() }},
	{"failsafe", func(testing.TB) admitter { return newFailsafe() }},
}

// BenchmarkAdmission admits a trivial function through a circuit breaker, a
// rate limiter and a bulkhead, none of which rejects, one caller at a time
// ("sequential") and from GOMAXPROCS goroutines ("parallel", RunParallel).
// "baseline" is x/time/rate's Allow plus a buffered channel, with no breaker.
// "outbound-timed" also measures the call's duration for the breaker's
// slow-call detection, as a caller of admission.Pipeline does;
// "outbound-adaptive" has the client-side throttle on and an adaptive
// bulkhead.
func BenchmarkAdmission(b *testing.B) {
	for _, c := range admitters {
		b.Run(c.name, func(b *testing.B) {
			b.Run("sequential", func(b *testing.B) {
				a := c.new(b)
				b.ReportAllocs()
				for b.Loop() {
					if err := a.run(work); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("parallel", func(b *testing.B) {
				a := c.new(b)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := a.run(work); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		})
	}
}

// BenchmarkFastFail measures a rejection by an open breaker. Each breaker
// is driven open by failed calls (the way it opens in production), not
// forced; every call must then be rejected by the breaker.
func BenchmarkFastFail(b *testing.B) {
	b.Run("outbound", func(b *testing.B) {
		p := newOutbound(b)
		a := outboundAdmitter{p: p}
		driveOpen(b, a, func() bool { return p.Breaker().State() == circuit.Open })
		fastFail(b, a, circuit.ErrOpen)
	})
	b.Run("gobreaker", func(b *testing.B) {
		a := newGobreaker()
		driveOpen(b, a, func() bool { return a.cb.State() == gobreaker.StateOpen })
		fastFail(b, a, gobreaker.ErrOpenState)
	})
	b.Run("failsafe", func(b *testing.B) {
		a := newFailsafe()
		driveOpen(b, a, a.cb.IsOpen)
		fastFail(b, a, fscircuit.ErrOpen)
	})
}

// fastFail checks once that a rejects with open, then measures rejections
// (any error counts: the check stays out of the measured loop).
func fastFail(b *testing.B, a admitter, open error) {
	if err := a.run(work); !errors.Is(err, open) {
		b.Fatalf("want %v, got %v", open, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if a.run(work) == nil {
			b.Fatal("admitted while open")
		}
	}
}

// driveOpen makes failed calls until open reports true.
func driveOpen(tb testing.TB, a admitter, open func() bool) {
	tb.Helper()
	for i := 0; !open(); i++ {
		if i == 10*windowSize {
			tb.Fatalf("breaker still not open after %d failed calls", i)
		}
		_ = a.run(fail)
	}
}
