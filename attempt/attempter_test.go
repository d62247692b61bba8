package attempt_test

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
)

var smallBreaker = circuit.Config{WindowSize: 10, MinimumCalls: 10, WaitInOpen: time.Hour}

// An upstream that answers nothing but 503 must open its circuit.
func TestAnUpstreamAnsweringOnly503OpensItsBreaker(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.Respond(503))
			tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Circuit: smallBreaker}})
			for i := range 10 {
				if o := roundTrip(tr, newRequest(t, context.Background(), s, noBody, "x")); o.status != 503 {
					t.Fatalf("call %d: %+v", i, o)
				}
			}
			o := roundTrip(tr, newRequest(t, context.Background(), s, noBody, "after"))
			if o.category != classify.LocalRejection || !errors.Is(o.err, circuit.ErrOpen) {
				t.Fatalf("after ten 503s: %+v, want a rejection by the open circuit", o)
			}
			if s.Received("after") != 0 {
				t.Fatal("the open circuit let the call through")
			}
		})
	}
}

func TestConfiguredStatusesCountAsFailures(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	s.SetDefault(outboundtest.Respond(429))
	tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Circuit: smallBreaker},
		IsFailure: func(r *http.Response) bool { return r.StatusCode == 429 || attempt.DefaultIsFailure(r) }})
	for range 10 {
		roundTrip(tr, newRequest(t, context.Background(), s, noBody, "x"))
	}
	if st := pipelineOf(t, tr, s.URL).Breaker().State(); st != circuit.Open {
		t.Fatalf("state after ten 429s counted as failures: %v", st)
	}
}

// A local bulkhead that rejects a burst against a healthy upstream never
// opens its breaker: the upstream never saw the rejected attempts.
func TestALocalBulkheadRejectingABurstNeverOpensAHealthyUpstreamsBreaker(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	s.SetDefault(outboundtest.Slow(50*time.Millisecond, 200))
	tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Circuit: smallBreaker,
		Bulkhead: bulkhead.Config{MaxConcurrent: 2}}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	rejected := 0
	for range 50 {
		wg.Go(func() {
			o := roundTrip(tr, newRequest(t, context.Background(), s, noBody, "burst"))
			if o.category == classify.LocalRejection {
				mu.Lock()
				rejected++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	m := pipelineOf(t, tr, s.URL).Breaker().Metrics()
	if rejected < 40 || m.State != circuit.Closed || m.Failed != 0 {
		t.Fatalf("%d rejected; breaker %+v: want most rejected and a closed breaker with no failure", rejected, m)
	}
}

// Rule A5: the bulkhead permit covers the whole exchange, until the body is
// closed or read to the end.
func TestBulkheadPermitLastsUntilTheBodyIsClosedOrReadToTheEnd(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}}})
			bh := func() *bulkhead.Bulkhead { return pipelineOf(t, tr, s.URL).Bulkhead() }

			resp, err := tr.RoundTrip(newRequest(t, context.Background(), s, noBody, "a"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tr.RoundTrip(newRequest(t, context.Background(), s, noBody, "b")); !errors.Is(err, bulkhead.ErrFull) {
				t.Fatalf("second call while the first body is unread: %v, want ErrFull", err)
			}
			if _, err := io.ReadAll(resp.Body); err != nil { // EOF gives the slot back, without Close
				t.Fatal(err)
			}
			if n := bh().InUse(); n != 0 {
				t.Fatalf("slots in use after reading to EOF: %d", n)
			}
			resp.Body.Close()

			resp, err = tr.RoundTrip(newRequest(t, context.Background(), s, noBody, "c"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close() // closing early gives it back too
			resp.Body.Close()
			if n := bh().InUse(); n != 0 {
				t.Fatalf("slots in use after Close: %d", n)
			}
		})
	}
}

// Rule B5 over HTTP: an attempt the caller cancels is neither a success nor
// a failure for the breaker. Cancelled in flight it is Ambiguous; under load
// the deadline may also end it while it is still connecting (NotSent).
func TestACallerCancelledAttemptIsNeitherSuccessNorFailure(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.Hang())
			var ev events
			tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Circuit: smallBreaker, OnEvent: ev.On}})
			for range 12 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				o := roundTrip(tr, newRequest(t, ctx, s, noBody, "x"))
				cancel()
				if o.category != classify.Ambiguous && o.category != classify.NotSent || !errors.Is(o.err, context.DeadlineExceeded) {
					t.Fatalf("cancelled attempt: %+v", o)
				}
			}
			// Counted in the events: the upstream, clean, may be forgotten
			// with its last connection.
			if n := ev.Count("circuit-exit(success)") + ev.Count("circuit-exit(failure)"); n != 0 {
				t.Fatalf("the breaker recorded %d cancelled attempts", n)
			}
		})
	}
}

// A provisional answer (one attempt of a hedged round) is judged when its
// body is closed, even an empty failure — which a plain attempt judges at
// once — and an answer whose attempt the caller cancelled before closing it
// is released: the call, not the answer, says whether it counts. An empty
// success over HTTP/1 (http.NoBody) is judged at once, as without
// Provisional, so that one never closed holds no permit; over HTTP/2 every
// answer waits for its Close, provisional or not.
func TestAProvisionalAnswerIsJudgedWhenClosedAndReleasedIfCancelledFirst(t *testing.T) {
	for _, p := range protos {
		for name, answer := range map[string]outboundtest.Fault{
			"with a body": outboundtest.Respond(503), "with no body": outboundtest.Respond(503).WithBody(nil)} {
			t.Run(p.String()+"/"+name, func(t *testing.T) {
				s := newServer(t, p)
				s.SetDefault(answer)
				var ev events
				tr := newTransport(t, s, attempt.Config{Admission: admission.Config{OnEvent: ev.On}})
				attemptOn := func(ctx context.Context, status int) *http.Response {
					req := newRequest(t, ctx, s, noBody, "x")
					r, err := tr.Route(req)
					if err != nil {
						t.Fatal(err)
					}
					resp, err := tr.AttemptOn(ctx, r, req, attempt.Options{AsIs: true, Provisional: true})
					if err != nil || resp.StatusCode != status {
						t.Fatalf("%v %v", resp, err)
					}
					return resp
				}
				resp := attemptOn(context.Background(), 503)
				if n := ev.Count("circuit-exit(failure)"); n != 0 {
					t.Fatalf("judged before its body was closed: %d failures", n)
				}
				resp.Body.Close()
				if n := ev.Count("circuit-exit(failure)"); n != 1 {
					t.Fatalf("closed: %d failures, want 1", n)
				}
				ctx, cancel := context.WithCancel(context.Background())
				resp = attemptOn(ctx, 503)
				cancel()
				resp.Body.Close()
				if n := ev.Count("circuit-exit(failure)") + ev.Count("circuit-exit(success)"); n != 1 {
					t.Fatalf("cancelled, then closed: the breaker recorded %d attempts, want only the first", n)
				}
				if p == outboundtest.HTTP1 {
					s.SetDefault(outboundtest.Respond(200).WithBody(nil))
					attemptOn(context.Background(), 200) // never closed
					if n := ev.Count("circuit-exit(success)"); n != 1 {
						t.Fatalf("an empty success: %d successes before its Close, want 1", n)
					}
				}
			})
		}
	}
}

func TestAnAttemptTimeoutIsAnUpstreamFailure(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	s.SetDefault(outboundtest.Hang())
	tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Circuit: smallBreaker}})
	for range 3 {
		ctx, cancel := context.WithTimeoutCause(context.Background(), 20*time.Millisecond, classify.ErrAttemptTimeout)
		roundTrip(tr, newRequest(t, ctx, s, noBody, "x"))
		cancel()
	}
	if m := pipelineOf(t, tr, s.URL).Breaker().Metrics(); m.Failed != 3 {
		t.Fatalf("attempt timeouts recorded as %d failures, want 3: %+v", m.Failed, m)
	}
}

// The RoundTripper contract: never modify the request, always close the
// request body, return (resp, nil) for any status.
func TestRoundTripKeepsTheRoundTripperContract(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}}})

	t.Run("any status comes back with a nil error", func(t *testing.T) {
		for _, code := range []int{200, 404, 429, 500, 503} {
			s.Enqueue(outboundtest.Respond(code))
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), s, noBody, "s"))
			if err != nil || resp.StatusCode != code {
				t.Fatalf("status %d: resp %v err %v", code, resp, err)
			}
			resp.Body.Close()
		}
	})
	t.Run("the request is not modified", func(t *testing.T) {
		req := newRequest(t, context.Background(), s, replayable, "m")
		req.Header.Set("X-Custom", "1")
		before := snapshot(req)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if after := snapshot(req); after != before {
			t.Fatalf("request changed:\nbefore %s\nafter  %s", before, after)
		}
	})
	t.Run("the body is closed on every path", func(t *testing.T) {
		paths := map[string]func() *http.Request{
			"answered": func() *http.Request { return newRequest(t, context.Background(), s, oneShot, "b1") },
			"rejected locally": func() *http.Request {
				hold, err := tr.RoundTrip(newRequest(t, context.Background(), s, noBody, "hold"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { hold.Body.Close() })
				return newRequest(t, context.Background(), s, oneShot, "b2")
			},
			"reset after reading": func() *http.Request {
				s.Enqueue(outboundtest.ResetAfterRead())
				return newRequest(t, context.Background(), s, oneShot, "b3")
			},
		}
		for name, mk := range paths {
			req := mk()
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			if !req.Body.(*closeTracker).Closed.Load() {
				t.Errorf("%s: request body not closed (err %v)", name, err)
			}
		}
	})
	t.Run("a refused connection closes the body too", func(t *testing.T) {
		s2 := newServer(t, outboundtest.HTTP1)
		tr2 := newTransport(t, s2, attempt.Config{})
		s2.Pause()
		req := newRequest(t, context.Background(), s2, oneShot, "r")
		if _, err := tr2.RoundTrip(req); !errors.Is(err, classify.ErrNotSent) {
			t.Fatalf("err %v", err)
		}
		if !req.Body.(*closeTracker).Closed.Load() {
			t.Fatal("request body not closed")
		}
	})
}

func snapshot(r *http.Request) string {
	var b strings.Builder
	b.WriteString(r.Method + " " + r.URL.String() + " ")
	for _, k := range slices.Sorted(maps.Keys(r.Header)) {
		b.WriteString(k + "=" + strings.Join(r.Header[k], ",") + ";")
	}
	if r.Context() != context.Background() {
		b.WriteString(" ctx")
	}
	return b.String()
}

func TestAttemptLeavesAnUnsentBodyUnread(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	tr := newTransport(t, s, attempt.Config{})
	s.Pause()
	req := newRequest(t, context.Background(), s, oneShot, "u")
	if _, err := tr.Attempt(req); !errors.Is(err, classify.ErrNotSent) {
		t.Fatalf("err %v", err)
	}
	if req.Body.(*closeTracker).Closed.Load() {
		t.Fatal("Attempt closed a body it never sent")
	}
	s.Resume()
	resp, err := tr.Attempt(req) // the same one-shot body, never read, goes out now
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s.Executions("u") != 1 {
		t.Fatalf("executions %d", s.Executions("u"))
	}
}

func TestInvalidConfigFailsWithTheFieldName(t *testing.T) {
	for field, cfg := range map[string]attempt.Config{
		"Config.IdleConnTimeout": {IdleConnTimeout: -1},
		"Config.Admission":       {Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: -2}}},
	} {
		if _, err := attempt.New(cfg); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("err = %v, want it to name %s", err, field)
		}
	}
}

// TestConcurrentHTTP2AttemptsDoNotDeadlockThePool pins a bug: the pool held
// its lock while calling ClientConn.Reserve, which may run the connection's
// state hook at once, and the hook takes the same lock. Many attempts sharing
// an HTTP/2 connection hung within a few runs.
func TestConcurrentHTTP2AttemptsDoNotDeadlockThePool(t *testing.T) {
	for _, p := range []outboundtest.Proto{outboundtest.H2C, outboundtest.H2TLS} {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			tr := newTransport(t, s, attempt.Config{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				var wg sync.WaitGroup
				for range 16 {
					wg.Go(func() {
						for range 40 {
							roundTrip(tr, newRequest(t, context.Background(), s, noBody, "c"))
						}
					})
				}
				wg.Wait()
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				buf := make([]byte, 1<<20)
				t.Fatalf("640 attempts did not finish in 30 s:\n%s", buf[:runtime.Stack(buf, true)])
			}
			if got := s.Executions("c"); got != 640 {
				t.Fatalf("executions %d, want 640", got)
			}
		})
	}
}

// A request body that fails to read is the caller's fault: the attempt says
// so (Ambiguous: part of the request left), the breaker records nothing,
// and the body's own error comes back.
func TestARequestBodyThatFailsIsTheCallersFaultNotTheUpstreams(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.Hang())
			var ev events
			tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Circuit: smallBreaker, OnEvent: ev.On}})
			for range 12 {
				req := newRequest(t, context.Background(), s, noBody, "body")
				req.Method, req.Body, req.ContentLength = http.MethodPost, testkit.FailingBody(), 100
				o := roundTrip(tr, req)
				if o.evidence != classify.EvidenceRequestBodyFailed || o.category != classify.Ambiguous || !errors.Is(o.err, testkit.ErrBodyFailed) {
					t.Fatalf("attempt with a failing body: %+v", o)
				}
			}
			if n := ev.Count("circuit-exit(success)") + ev.Count("circuit-exit(failure)"); n != 0 {
				t.Fatalf("the breaker recorded %d of the caller's failing bodies", n)
			}
		})
	}
}

// Closing the client interrupts what is in flight — a request awaiting its
// answer, an answer's body being read — and neither is the upstream's
// failure; an attempt after the close is NotSent, for the same reason.
func TestClosingTheClientInterruptsAttemptsWithoutBlamingTheUpstream(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			tr := newTransport(t, s, attempt.Config{Admission: admission.Config{Circuit: smallBreaker}})
			s.Enqueue(outboundtest.EndlessBody(), outboundtest.Hang())
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), s, noBody, "reading"))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if _, err := io.ReadFull(resp.Body, make([]byte, 10)); err != nil {
				t.Fatal(err)
			}
			awaiting := make(chan outcome, 1)
			go func() { awaiting <- roundTrip(tr, newRequest(t, context.Background(), s, noBody, "awaiting")) }()
			for s.Received("awaiting") == 0 {
				runtime.Gosched()
			}
			tr.Close()

			if o := <-awaiting; o.evidence != classify.EvidenceClientClosed || o.category != classify.Ambiguous {
				t.Fatalf("attempt awaiting its answer when the client closed: %+v", o)
			}
			_, err = io.Copy(io.Discard, resp.Body)
			if o := fromError(err); o.evidence != classify.EvidenceClientClosed || o.stage != classify.StageReadBody {
				t.Fatalf("body being read when the client closed: %+v", o)
			}
			if o := roundTrip(tr, newRequest(t, context.Background(), s, noBody, "after")); o.evidence != classify.EvidenceClientClosed || o.category != classify.NotSent {
				t.Fatalf("attempt after the close: %+v", o)
			}
			if m := pipelineOf(t, tr, s.URL).Breaker().Metrics(); m.Calls != 0 {
				t.Fatalf("the breaker recorded attempts the client's close interrupted: %+v", m)
			}
		})
	}
}
