package bench

import (
	"context"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	fsbulkhead "github.com/failsafe-go/failsafe-go/bulkhead"
	fscircuit "github.com/failsafe-go/failsafe-go/circuitbreaker"
	fsrate "github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
)

// The settings shared by every library, chosen so that nothing rejects
// while the guards do their full work (README.md lists them per library).
const (
	ratePerSecond = 1e9     // admissions per second
	rateBurst     = 1 << 30 // tokens
	bulkheadSlots = 1 << 20 // concurrent calls, far above any caller count here
	windowSize    = 100     // calls in the breaker's count window
	failurePct    = 50      // failure rate that opens the breaker
	waitInOpen    = time.Minute
)

func outboundAdmissionConfig(upstream string) admission.Config {
	return admission.Config{
		Upstream: upstream,
		Circuit: circuit.Config{
			FailureRateThreshold: failurePct,
			WindowType:           circuit.CountBased,
			WindowSize:           windowSize,
			MinimumCalls:         windowSize,
			WaitInOpen:           waitInOpen,
		},
		Rate:     ratelimit.Config{PerSecond: ratePerSecond, Burst: rateBurst},
		Bulkhead: bulkhead.Config{MaxConcurrent: bulkheadSlots},
	}
}

func baselineLimiter() *rate.Limiter { return rate.NewLimiter(ratePerSecond, rateBurst) }

// gobreaker has no count-based sliding window: the closest is its cumulative
// counts (Interval 0, never cleared while CLOSED) with a ReadyToTrip of 50 %
// failures over at least 100 calls.
func gobreakerSettings(name string) gobreaker.Settings {
	return gobreaker.Settings{
		Name:        name,
		MaxRequests: 10,
		Timeout:     waitInOpen,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= windowSize && c.TotalFailures*100 >= c.Requests*failurePct
		},
	}
}

// failsafeBreaker is failsafe-go's count-based breaker: 50 failures in the
// last 100 executions open it.
func failsafeBreaker[R any]() fscircuit.CircuitBreaker[R] {
	return failsafeBreakerBuilder[R]().Build()
}

func failsafeBreakerBuilder[R any]() fscircuit.Builder[R] {
	return fscircuit.NewBuilder[R]().
		WithFailureThresholdRatio(windowSize*failurePct/100, windowSize).
		WithDelay(waitInOpen)
}

// failsafeLimiter is failsafe-go's bursty limiter (its token-bucket-like
// variant): 1e9 permits per second, all available at once.
func failsafeLimiter[R any]() fsrate.RateLimiter[R] {
	return fsrate.NewBursty[R](ratePerSecond, time.Second)
}

func failsafeBulkhead[R any]() fsbulkhead.Bulkhead[R] { return fsbulkhead.New[R](bulkheadSlots) }

// idlePerHost is innerTransport's MaxIdleConnsPerHost: 100, or 0 (net/http's
// default, 2) during the 16-callers-default-idle runs.
var idlePerHost = 100

// innerTransport is the http.Transport under every client of the end-to-end
// benchmark: enough idle connections per host that 16 callers never re-dial,
// and http.DefaultTransport's idle timeout, which is also the one outbound
// applies when the Transport has none (so that every client runs with the
// same settings: an idle timer per connection costs every client a little
// scheduler work). BENCH_IDLE_CONN_TIMEOUT replaces it (0: none, net/http's
// zero value). Its dials are counted in dials.
func innerTransport() *http.Transport {
	d := &net.Dialer{}
	return &http.Transport{
		MaxIdleConnsPerHost: idlePerHost,
		IdleConnTimeout:     idleConnTimeout(),
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return d.DialContext(ctx, network, addr)
		},
	}
}

func idleConnTimeout() time.Duration {
	v, ok := os.LookupEnv("BENCH_IDLE_CONN_TIMEOUT")
	if !ok {
		return 90 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		panic("BENCH_IDLE_CONN_TIMEOUT: " + err.Error())
	}
	return d
}

// dials counts the connections opened by innerTransport's transports.
var dials atomic.Int64
