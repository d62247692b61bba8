package outbound_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/outcome"
)

// answering returns a dialer of in-memory HTTP/1.1 upstreams that answer
// every request with the raw response answer() gives, and a count of the
// requests they read.
func answering(answer func() string) (func(context.Context, string, string) (net.Conn, error), *atomic.Int64) {
	var n atomic.Int64
	return testkit.PipeDial(func(string) string {
		n.Add(1)
		return answer()
	}), &n
}

func get(t *testing.T, tr *outbound.Transport) (*http.Response, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

func upstreamBreaker(t *testing.T, tr *outbound.Transport) circuit.Metrics {
	t.Helper()
	m, ok := tr.Breakers()["http://upstream.test:80"]
	if !ok {
		t.Fatalf("no breaker for the upstream among %v", tr.Breakers())
	}
	return m
}

// A 503 with a Retry-After, on a status the configuration opts in, opens the
// upstream's breaker for the time it asks — no longer than MaxRetryAfter —
// and trial calls follow as usual.
func TestARetryAfterOnAnOptedInStatusOpensTheBreakerUntilThen(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter string
		open       time.Duration
	}{
		{"as long as asked", "20", 20 * time.Second},
		{"no longer than MaxRetryAfter", "3600", time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var status atomic.Value
				status.Store("503 Service Unavailable")
				dial, served := answering(func() string {
					return "HTTP/1.1 " + status.Load().(string) + "\r\nRetry-After: " + tc.retryAfter + "\r\nContent-Length: 0\r\n\r\n"
				})
				tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: dial}, MaxAttempts: 1,
					MaxRetryAfter:    time.Minute,
					OpenOnRetryAfter: func(s int) bool { return s == http.StatusServiceUnavailable }})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				if resp, err := get(t, tr); err != nil || resp.StatusCode != 503 {
					t.Fatalf("first call: %v %v", resp, err)
				}
				if m := upstreamBreaker(t, tr); m.State != circuit.Open {
					t.Fatalf("after a 503 with Retry-After %s: %v, want OPEN", tc.retryAfter, m.State)
				}
				time.Sleep(tc.open - time.Second)
				if _, err := get(t, tr); !errors.Is(err, circuit.ErrOpen) {
					t.Fatalf("%v after the answer: %v, want the circuit open", tc.open-time.Second, err)
				}
				if served.Load() != 1 {
					t.Fatalf("the upstream saw %d requests while the breaker was open, want 1", served.Load())
				}
				time.Sleep(time.Second)
				synctest.Wait()
				if m := upstreamBreaker(t, tr); m.State != circuit.HalfOpen {
					t.Fatalf("%v after the answer: %v, want HALF_OPEN", tc.open, m.State)
				}
				status.Store("200 OK")
				if resp, err := get(t, tr); err != nil || resp.StatusCode != 200 {
					t.Fatalf("trial call: %v %v", resp, err)
				}
				if served.Load() != 2 {
					t.Fatalf("the upstream saw %d requests, want the trial call too", served.Load())
				}
			})
		})
	}
}

// The call whose answer opened the breaker ends with that answer at once:
// waiting out the Retry-After would hold the caller for the whole pause,
// then race the breaker's own return to HALF_OPEN.
func TestTheCallWhoseAnswerOpenedTheBreakerEndsWithItAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dial, served := answering(func() string {
			return "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 20\r\nContent-Length: 4\r\n\r\nbusy"
		})
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: dial}, Timeout: time.Minute,
			OpenOnRetryAfter: func(s int) bool { return s == http.StatusServiceUnavailable }})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		start := time.Now()
		req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
		resp, out, err := tr.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || string(body) != "busy" || out.End != outcome.CircuitOpened || len(out.Attempts) != 1 ||
			time.Since(start) != 0 || served.Load() != 1 {
			t.Fatalf("%d %q after %v: reason %v, %d attempts, %d served; want the 503 at once, reason %v",
				resp.StatusCode, body, time.Since(start), out.Why(), len(out.Attempts), served.Load(), outcome.CircuitOpened)
		}
		if m := upstreamBreaker(t, tr); m.State != circuit.Open {
			t.Fatalf("breaker %v", m.State)
		}
	})
}

// Only the statuses the configuration opts in open the breaker, and only
// when the configuration opts in at all.
func TestARetryAfterOpensNothingUnlessItsStatusIsOptedIn(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  func(int) bool
	}{
		{"not configured", nil},
		{"another status", func(s int) bool { return s == http.StatusTooManyRequests }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dial, _ := answering(func() string {
					return "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 20\r\nContent-Length: 0\r\n\r\n"
				})
				tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: dial}, MaxAttempts: 1,
					OpenOnRetryAfter: tc.opt})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				if _, err := get(t, tr); err != nil {
					t.Fatal(err)
				}
				if m := upstreamBreaker(t, tr); m.State != circuit.Closed || m.Failed != 1 {
					t.Fatalf("after one 503: %+v, want CLOSED with the failure recorded", m)
				}
			})
		})
	}
}

// The configuration says which failed attempts the breaker records: here,
// refused connections but not a host name that does not exist.
func TestBreakerRecordsSaysWhichFailedAttemptsTheBreakerCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var dnsFails atomic.Bool
		dial := func(context.Context, string, string) (net.Conn, error) {
			if dnsFails.Load() {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "upstream.test", IsNotFound: true}}
			}
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
		}
		var asked []classify.Stage
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: dial}, MaxAttempts: 1,
			Admission: admission.Config{Circuit: circuit.Config{MinimumCalls: 4, WindowSize: 10}},
			BreakerRecords: func(e *classify.Error) bool {
				asked = append(asked, e.Stage)
				return e.Stage != classify.StageDNS
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		dnsFails.Store(true)
		for range 5 {
			if _, err := get(t, tr); err == nil {
				t.Fatal("a call succeeded without a connection")
			}
		}
		if m := upstreamBreaker(t, tr); m.State != circuit.Closed || m.Calls != 0 {
			t.Fatalf("after 5 unknown hosts: %+v, want CLOSED and nothing recorded", m)
		}
		dnsFails.Store(false)
		for range 4 {
			_, _ = get(t, tr)
		}
		if m := upstreamBreaker(t, tr); m.State != circuit.Open || m.Failed != 4 {
			t.Fatalf("after 4 refused connections: %+v, want OPEN on 4 failures", m)
		}
		if len(asked) != 9 || asked[0] != classify.StageDNS || asked[8] != classify.StageDial {
			t.Fatalf("BreakerRecords asked about stages %v, want 5 DNS then 4 dial", asked)
		}
	})
}

// By default a refused TLS certificate is not an upstream failure (it would
// fail the same way every time), but any other failed connection is.
func TestByDefaultTheBreakerRecordsFailedConnectionsButNotLifecycleOrTLSRefusals(t *testing.T) {
	for _, tc := range []struct {
		e    classify.Error
		want bool
	}{
		{classify.Error{Stage: classify.StageDial, Category: classify.NotSent, Evidence: classify.EvidenceNoConnection}, true},
		{classify.Error{Stage: classify.StageAwait, Category: classify.Ambiguous, Evidence: classify.EvidenceBytesWritten}, true},
		{classify.Error{Stage: classify.StageTLS, Category: classify.NotSent, Evidence: classify.EvidenceTLSRefused}, false},
		{classify.Error{Stage: classify.StageWriteHeaders, Category: classify.NotSent, Evidence: classify.EvidenceGoAwayAbove, Lifecycle: true}, false},
	} {
		if got := attempt.DefaultBreakerRecords(&tc.e); got != tc.want {
			t.Errorf("%v/%v/%v lifecycle %v: recorded %v, want %v", tc.e.Stage, tc.e.Category, tc.e.Evidence, tc.e.Lifecycle, got, tc.want)
		}
	}
}

// A Transport configured to start its breakers in METRICS_ONLY records every
// upstream's calls and rates but never opens: a way to roll breakers out by
// observing first. One configured Disabled records nothing.
func TestTheTransportStartsEveryBreakerInTheConfiguredState(t *testing.T) {
	for _, start := range []circuit.State{circuit.MetricsOnly, circuit.Disabled} {
		t.Run(start.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dial, served := answering(func() string {
					return "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
				})
				tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: dial}, MaxAttempts: 1,
					Admission: admission.Config{Circuit: circuit.Config{MinimumCalls: 4, WindowSize: 10, StartState: start}}})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				for range 10 {
					if resp, err := get(t, tr); err != nil || resp.StatusCode != 500 {
						t.Fatalf("%v %v, want the upstream's 500", resp, err)
					}
				}
				m := upstreamBreaker(t, tr)
				wantCalls, wantRate := 10, 100.0
				if start == circuit.Disabled {
					wantCalls, wantRate = 0, -1
				}
				if m.State != start || m.Calls != wantCalls || m.FailureRate != wantRate || served.Load() != 10 {
					t.Fatalf("after 10 failed calls: %+v, upstream served %d; want %v with %d calls at failure rate %v",
						m, served.Load(), start, wantCalls, wantRate)
				}
			})
		})
	}
}

// A start state the breaker cannot start in fails at construction, naming
// the field.
func TestAnInvalidStartStateFailsAtConstruction(t *testing.T) {
	_, err := outbound.New(outbound.Config{Admission: admission.Config{Circuit: circuit.Config{StartState: circuit.HalfOpen}}})
	if err == nil || !strings.Contains(err.Error(), "StartState") {
		t.Fatalf("StartState HALF_OPEN: %v, want an error naming StartState", err)
	}
}

// sleepyGuard is a shared rate guard whose every take waits: a slow store.
type sleepyGuard struct{ wait time.Duration }

func (g sleepyGuard) Take(context.Context) error { time.Sleep(g.wait); return nil }
func (sleepyGuard) Refund()                      {}

// Regression: the breaker timed an attempt from before its admission, so a
// slow shared rate guard (a Redis round trip) or a wait in the bulkhead's
// queue made a fast upstream count as slow, and could open its breaker.
func TestTimeSpentInALocalGuardIsNotTheUpstreamBeingSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dial, _ := answering(func() string { return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" })
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: dial}, MaxAttempts: 1,
			Admission: admission.Config{
				Circuit:   circuit.Config{WindowSize: 2, MinimumCalls: 2, SlowCallDuration: 100 * time.Millisecond},
				RateGuard: func(string) admission.RateGuard { return sleepyGuard{time.Second} },
			}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for range 2 {
			if _, err := get(t, tr); err != nil {
				t.Fatal(err)
			}
		}
		if m := upstreamBreaker(t, tr); m.Slow != 0 || m.State != circuit.Closed {
			t.Fatalf("breaker %+v: a second in the rate guard made an instant answer slow", m)
		}
	})
}

// Regression: a BreakerRecords or IsFailure that panicked left its attempt's
// permit held — with a bulkhead of one, every later call was refused. The
// default decides instead, and the permit comes back.
func TestACallbackThatPanicsCannotKeepAPermit(t *testing.T) {
	refused := func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("connection refused") }
	answered, _ := answering(func() string { return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" })
	for name, cfg := range map[string]outbound.Config{
		"BreakerRecords": {HTTPTransport: &http.Transport{DialContext: refused},
			BreakerRecords: func(*classify.Error) bool { panic("broken callback") }},
		"IsFailure": {HTTPTransport: &http.Transport{DialContext: answered},
			IsFailure: func(*http.Response) bool { panic("broken callback") }},
	} {
		cfg.MaxAttempts = 1
		cfg.Admission = admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}}
		tr, err := outbound.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			_, err := get(t, tr)
			if errors.Is(err, bulkhead.ErrFull) {
				t.Fatalf("%s: call %d refused by the bulkhead: a permit was kept", name, i)
			}
		}
		tr.Close()
	}
}

// Checking the configuration does not call the RateGuard factory: it would
// make a guard (a bucket on Redis, say) for an upstream that does not exist.
func TestNewDoesNotCallTheRateGuardFactory(t *testing.T) {
	var made []string
	tr, err := outbound.New(outbound.Config{Admission: admission.Config{RateGuard: func(u string) admission.RateGuard {
		made = append(made, u)
		return nil
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if len(made) != 0 {
		t.Fatalf("New made rate guards for %q", made)
	}
}
