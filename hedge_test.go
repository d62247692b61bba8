package outbound_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// hedgeAfter is a fixed hedging delay far below the faults' slowness.
var hedgeAfter = &outbound.Hedging{Delay: 20 * time.Millisecond}

func hedgingTransport(t *testing.T, s *outboundtest.Server, cfg outbound.Config) *outbound.Transport {
	t.Helper()
	cfg.HTTPTransport = s.Transport()
	if cfg.Hedging == nil {
		cfg.Hedging = hedgeAfter
	}
	tr, err := outbound.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

func hedgedDo(t *testing.T, tr *outbound.Transport, req *http.Request) (*http.Response, *outcome.Outcome, error) {
	t.Helper()
	resp, out, err := tr.Do(req)
	if resp != nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, out, err
}

func hedges(out *outcome.Outcome) (sent, lost int) {
	for _, a := range out.Attempts {
		if a.Hedge {
			sent++
		}
		if a.Lost {
			lost++
		}
	}
	return sent, lost
}

// A POST without an Idempotency-Key, a POST with a one-shot body, and a
// keyed POST without Hedging.Keyed are never hedged, whatever the upstream
// does: it executes each exactly once, however slow or broken its answer.
func TestCallsThatCannotBeRetriedSafelyAreNeverHedged(t *testing.T) {
	faults := map[string]outboundtest.Fault{
		"slow answer":      outboundtest.Slow(300*time.Millisecond, 200),
		"slow 503":         outboundtest.Slow(300*time.Millisecond, 503),
		"reset after read": outboundtest.ResetAfterRead(),
		"hang":             outboundtest.Hang(),
		"truncated body":   outboundtest.TruncatedBody(100, 10),
	}
	for _, p := range testkit.Protos {
		s := testkit.NewServer(t, p)
		tr := hedgingTransport(t, s, outbound.Config{MaxAttempts: 1})
		for name, f := range faults {
			for _, kind := range []string{"POST without a key", "POST one-shot with a key", "keyed POST without the opt-in"} {
				id := fmt.Sprintf("%v/%s/%s", p, name, kind)
				body := testkit.Replayable
				if kind == "POST one-shot with a key" {
					body = testkit.OneShot
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				req := testkit.NewRequest(t, ctx, s, body, id)
				if kind != "POST without a key" {
					req.Header.Set("Idempotency-Key", `"`+id+`"`)
				}
				s.Enqueue(f)
				_, out, _ := hedgedDo(t, tr, req)
				cancel()
				if sent, _ := hedges(out); sent != 0 {
					t.Errorf("%s: %d hedges", id, sent)
				}
				if n := s.Received(id); n != 1 {
					t.Errorf("%s: the upstream received it %d times, want 1", id, n)
				}
			}
		}
	}
}

// A keyed POST is hedged when Hedging.Keyed says so, and a GET always.
func TestAKeyedPostIsHedgedWithTheOptInAndAGetAlways(t *testing.T) {
	for _, p := range testkit.Protos {
		s := testkit.NewServer(t, p)
		tr := hedgingTransport(t, s, outbound.Config{Hedging: &outbound.Hedging{Delay: 20 * time.Millisecond, Keyed: true}})
		for _, kind := range []testkit.BodyKind{testkit.NoBody, testkit.Replayable} {
			id := fmt.Sprintf("%v/%v", p, kind)
			req := testkit.NewRequest(t, context.Background(), s, kind, id)
			if kind == testkit.Replayable {
				req.Header.Set("Idempotency-Key", `"`+id+`"`)
			}
			s.Enqueue(outboundtest.Slow(time.Second, 200))
			resp, out, err := hedgedDo(t, tr, req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("%s: %v %v", id, resp, err)
			}
			if sent, lost := hedges(out); sent != 1 || lost != 1 {
				t.Fatalf("%s: %d hedges sent, %d attempts lost, want 1 and 1: %+v", id, sent, lost, out.Attempts)
			}
		}
	}
}

// The hedge of a slow GET answers first: the first attempt is cancelled,
// its bulkhead slot and rate token... its permits come back, and the breaker
// records only the winner.
func TestAHedgedGetsLoserIsCancelledItsPermitReturnedAndNotRecordedByTheBreaker(t *testing.T) {
	for _, p := range testkit.Protos {
		s := testkit.NewServer(t, p)
		var ev testkit.Events
		tr := hedgingTransport(t, s, outbound.Config{Admission: admission.Config{OnEvent: ev.On,
			Bulkhead: bulkhead.Config{MaxConcurrent: 4}}})
		s.Enqueue(outboundtest.Slow(5*time.Second, 200))
		start := time.Now()
		resp, out, err := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, p.String()))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v: %v %v", p, resp, err)
		}
		if time.Since(start) > 4*time.Second {
			t.Fatalf("%v: the call waited for the slow attempt", p)
		}
		if len(out.Attempts) != 2 || !out.Attempts[0].Lost || out.Attempts[0].Hedge || out.Attempts[0].Decision != 0 ||
			!out.Attempts[1].Hedge || out.Attempts[1].Lost || out.Attempts[1].Category != classify.Answered || out.Commit != outcome.Committed {
			t.Fatalf("%v: outcome %+v", p, out)
		}
		st, _ := tr.Upstream(tr.UpstreamKey(testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "x")))
		if st.InFlight != 0 {
			t.Fatalf("%v: %d bulkhead slots still held", p, st.InFlight)
		}
		if m := st.Breaker; m.Calls != 1 || m.Failed != 0 {
			t.Fatalf("%v: breaker %+v, want the winner only", p, m)
		}
		if n := ev.Count("circuit-release"); n != 1 {
			t.Fatalf("%v: %d circuit permissions released without an outcome, want 1 (the loser)", p, n)
		}
	}
}

// A hedge the bulkhead refuses is not sent: the upstream receives the first
// attempt only, the rate token of the hedge comes back, and the outcome
// shows the hedge as a local rejection.
func TestAHedgeTheBulkheadRejectsIsNotSentAndRefundsItsToken(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.H2C)
	tr := hedgingTransport(t, s, outbound.Config{Admission: admission.Config{
		Rate:     ratelimit.Config{PerSecond: 1.0 / 3600, Burst: 10},
		Bulkhead: bulkhead.Config{MaxConcurrent: 1}}})
	s.Enqueue(outboundtest.Slow(200*time.Millisecond, 200))
	resp, out, err := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "one"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	if n := s.Received("one"); n != 1 {
		t.Fatalf("the upstream received %d, want 1", n)
	}
	if len(out.Attempts) != 2 || !out.Attempts[0].Hedge || out.Attempts[0].Category != classify.LocalRejection ||
		out.Attempts[0].Guard != classify.GuardBulkhead {
		t.Fatalf("outcome %+v, want the hedge rejected by the bulkhead, then the answer", out.Attempts)
	}
	st, _ := tr.Upstream(tr.UpstreamKey(testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "x")))
	if st.RateTokens != 9 {
		t.Fatalf("rate tokens %d, want 9: the refused hedge kept its token", st.RateTokens)
	}
}

// With the budget at half or below, no hedge is sent, and the attempt in
// flight runs to its answer: an exhausted budget never cancels one.
func TestAnExhaustedBudgetSendsNoHedgeAndNeverCancelsAnAttemptInFlight(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.HTTP1)
	// Two attempts, so that the call could be hedged (a call of one attempt
	// never is): with MaxAttempts 1 this test passed whatever the budget.
	tr := hedgingTransport(t, s, outbound.Config{MaxAttempts: 2, Budget: retry.BudgetConfig{MaxTokens: 4, TokenRatio: 0.1},
		Admission: admission.Config{Circuit: circuit.Config{StartState: circuit.Disabled}}})
	s.SetDefault(outboundtest.Respond(503))
	for i := range 2 { // three failures drain the budget to 1 of 4 (a retry after the first)
		hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, fmt.Sprint("drain", i)))
	}
	s.SetDefault(outboundtest.Respond(200))
	s.Enqueue(outboundtest.Slow(200*time.Millisecond, 200))
	resp, out, err := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "slow"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	if sent, lost := hedges(out); sent != 0 || lost != 0 || len(out.Attempts) != 1 {
		t.Fatalf("%d hedges, %d lost, attempts %+v: want the one attempt, answered", sent, lost, out.Attempts)
	}
}

// A hedge the budget withholds is not silent: the BudgetExhausted hook is
// told, and the outcome counts it; a call that needed no hedge counts none.
func TestAHedgeTheBudgetWithholdsIsToldToTheHooksAndCountedInTheOutcome(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.HTTP1)
	var told atomic.Int64
	tr := hedgingTransport(t, s, outbound.Config{MaxAttempts: 2, Budget: retry.BudgetConfig{MaxTokens: 4, TokenRatio: 0.1},
		Admission: admission.Config{Circuit: circuit.Config{StartState: circuit.Disabled}},
		Hooks:     outbound.Hooks{BudgetExhausted: func(context.Context, string) { told.Add(1) }}})
	s.Enqueue(outboundtest.Slow(100*time.Millisecond, 200))
	_, out, _ := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "full"))
	if sent, _ := hedges(out); sent != 1 || out.HedgesWithheld != 0 || told.Load() != 0 {
		t.Fatalf("with a full budget: %d hedges sent, %d withheld, hook told %d times", sent, out.HedgesWithheld, told.Load())
	}
	// A hedge costs no retry token (4 of 4 left); three 503s drain the
	// budget to 1, the retry after the first of them allowed, after the
	// third not (it is half or below), which tells the hook once.
	s.SetDefault(outboundtest.Respond(503))
	for i := range 2 {
		hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, fmt.Sprint("drain", i)))
	}
	s.SetDefault(outboundtest.Respond(200))
	told.Store(0)
	_, out, _ = hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "fast"))
	if out.HedgesWithheld != 0 || told.Load() != 0 {
		t.Fatalf("an answer before the delay: %d withheld, hook told %d times", out.HedgesWithheld, told.Load())
	}
	s.Enqueue(outboundtest.Slow(100*time.Millisecond, 200))
	resp, out, err := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "slow"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	if sent, _ := hedges(out); sent != 0 || out.HedgesWithheld != 1 || told.Load() != 1 {
		t.Fatalf("with the budget spent: %d hedges sent, %d withheld, hook told %d times; want 0, 1, 1", sent, out.HedgesWithheld, told.Load())
	}
}

// Against an upstream where every answer is slow, every call would be
// hedged; the upstream's hedge allowance caps the hedges at twice the
// ExtraLoad of the rounds (0.05 by default, also with a fixed Delay), plus
// its burst: amplification at most 1.1 once the burst is spent.
func TestASaturatedUpstreamSeesAmplificationAtMostOnePlusTwiceTheExtraLoad(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.H2C)
	s.SetDefault(outboundtest.Slow(30*time.Millisecond, 200))
	tr := hedgingTransport(t, s, outbound.Config{Hedging: &outbound.Hedging{Delay: time.Millisecond},
		Admission: admission.Config{Circuit: circuit.Config{StartState: circuit.Disabled}}})
	const calls = 400
	results := make(chan *outcome.Outcome, calls)
	for i := range calls {
		go func() {
			_, out, _ := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, fmt.Sprint(i)))
			results <- out
		}()
	}
	attempts, withheld := 0, 0
	for range calls {
		out := <-results
		attempts += len(out.Attempts)
		withheld += out.HedgesWithheld
	}
	if limit := calls*(1+2*0.05) + outbound.HedgeBurst + 1; float64(attempts) > limit {
		t.Fatalf("%d attempts for %d calls, want at most %.0f", attempts, calls, limit)
	}
	if attempts == calls || withheld == 0 {
		t.Fatalf("%d attempts, %d hedges withheld: the test does not exercise the allowance", attempts, withheld)
	}
}

// A hedge that lost the race counts for nothing with the breaker, even one
// that answered: a hedge's 503 beside a first attempt's 200 is no breaker
// failure (before, with a budget that allowed many hedges, those 503s
// opened the breaker on calls that all succeeded), with or without a body
// to its answer, over both protocols. A round that no final answer decides
// still records its answers' failures.
func TestAHedgeLosersAnswerIsNoBreakerFailure(t *testing.T) {
	for _, proto := range []outboundtest.Proto{outboundtest.HTTP1, outboundtest.H2C} {
		for name, hedgeAnswer := range map[string]outboundtest.Fault{
			"503 with a body":  outboundtest.Respond(503),
			"503 with no body": outboundtest.Respond(503).WithBody(nil),
		} {
			t.Run(proto.String()+"/"+name, func(t *testing.T) {
				s := testkit.NewServer(t, proto)
				tr := hedgingTransport(t, s, outbound.Config{Admission: admission.Config{Circuit: circuit.Config{
					WindowSize: 10, MinimumCalls: 4, FailureRateThreshold: 50}}})
				for i := range 6 {
					s.Enqueue(outboundtest.Slow(80*time.Millisecond, 200), hedgeAnswer)
					resp, out, err := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, fmt.Sprint(i)))
					if err != nil || resp.StatusCode != 200 {
						t.Fatalf("call %d: %v %v, outcome %+v", i, resp, err, out)
					}
					if sent, _ := hedges(out); sent != 1 {
						t.Fatalf("call %d: %d hedges; the test needs one, answered 503", i, sent)
					}
				}
				m := tr.Breakers()[s.URL]
				if m.Failed != 0 || m.State != circuit.Closed {
					t.Fatalf("breaker %+v after six calls that succeeded, each beside a hedge answered 503", m)
				}
				// No final answer: both 503s are the upstream's.
				s.Enqueue(outboundtest.Slow(80*time.Millisecond, 503), hedgeAnswer)
				ctx := outbound.WithMaxAttempts(context.Background(), 2)
				hedgedDo(t, tr, testkit.NewRequest(t, ctx, s, testkit.NoBody, "both-503"))
				if m := tr.Breakers()[s.URL]; m.Failed != 2 {
					t.Fatalf("breaker %+v: want the round's two 503s recorded", m)
				}
			})
		}
	}
}

// With an adaptive bulkhead, a hedging Transport keeps room under the
// limit for one call and its hedges: the limit's floor is 1 + MaxHedges.
// Before, a single caller's limit settled at 1 or 2 against a slow tail and
// the bulkhead refused the hedges themselves; here the limit starts at 1,
// and the hedge gets its slot.
func TestAnAdaptiveLimitLeavesRoomForOneCallAndItsHedges(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.H2C)
	tr := hedgingTransport(t, s, outbound.Config{Admission: admission.Config{Bulkhead: bulkhead.Config{
		MaxConcurrent: 8, Adaptive: true, InitialConcurrent: 1}}})
	s.Enqueue(outboundtest.Slow(100*time.Millisecond, 200))
	resp, out, err := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "slow"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
	for _, a := range out.Attempts {
		if a.Category == classify.LocalRejection {
			t.Fatalf("attempt %+v refused locally: the hedge found no room under the limit", a)
		}
	}
	if sent, lost := hedges(out); sent != 1 || lost != 1 {
		t.Fatalf("%d hedges, %d lost: want the hedge sent, winning over the slow first attempt", sent, lost)
	}
}

// Regression: with hedging on, every attempt of a round waited for its
// answer to be closed before it was judged, even an empty success: eight
// HEAD calls whose bodies were never closed held five slots of a bulkhead
// of five, and three calls were refused (none without hedging).
func TestAnEmptyAnswerNeverClosedHoldsNoSlotWithHedging(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.HTTP1)
	tr := hedgingTransport(t, s, outbound.Config{Hedging: &outbound.Hedging{Delay: time.Second},
		Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 5}}})
	for i := range 8 {
		req := testkit.NewRequest(t, context.Background(), s, testkit.NoBody, fmt.Sprint(i))
		req.Method = http.MethodHead
		if _, _, err := tr.Do(req); err != nil { // the body is never closed
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

// Regression: the context of a hedged round's deciding attempt was ended
// when the call returned, not when its body was: the body of the answer was
// cut short (and its HTTP/1.1 connection closed under it).
func TestAHedgedCallsAnswerIsReadToTheEnd(t *testing.T) {
	big := strings.Repeat("x", 4<<20)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < len(big); i += 64 << 10 {
			io.WriteString(w, big[i:i+64<<10])
			w.(http.Flusher).Flush()
		}
	}))
	defer up.Close()
	tr, err := outbound.New(outbound.Config{Hedging: &outbound.Hedging{Delay: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for i := range 3 {
		req, _ := http.NewRequest(http.MethodGet, up.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || len(body) != len(big) {
			t.Fatalf("call %d: read %d of %d bytes: %v", i, len(body), len(big), err)
		}
	}
}

// WithHedging sets hedging per call, over the Transport's: on for a call of
// a Transport without it, off (nil) for one of a Transport with it.
func TestWithHedgingOverridesTheTransportsHedgingPerCall(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.H2C)
	for _, tc := range []struct {
		name      string
		transport *outbound.Hedging
		call      *outbound.Hedging
		want      int
	}{
		{"on for one call", nil, &outbound.Hedging{Delay: 20 * time.Millisecond}, 1},
		{"off for one call", &outbound.Hedging{Delay: 20 * time.Millisecond}, nil, 0},
	} {
		cfg := outbound.Config{HTTPTransport: s.Transport(), Hedging: tc.transport}
		tr, err := outbound.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		s.Enqueue(outboundtest.Slow(300*time.Millisecond, 200))
		ctx := outbound.WithHedging(context.Background(), tc.call)
		_, out, err := hedgedDo(t, tr, testkit.NewRequest(t, ctx, s, testkit.NoBody, tc.name))
		if err != nil {
			t.Fatal(err)
		}
		if sent, _ := hedges(out); sent != tc.want {
			t.Errorf("%s: %d hedges, want %d", tc.name, sent, tc.want)
		}
	}
}

func TestInvalidHedgingIsRefusedNamingTheField(t *testing.T) {
	for field, h := range map[string]*outbound.Hedging{
		"Config.Hedging.Delay":     {Delay: -1},
		"Config.Hedging.ExtraLoad": {ExtraLoad: 0.9},
		"Config.Hedging.MaxHedges": {MaxHedges: 11},
	} {
		_, err := outbound.New(outbound.Config{Hedging: h})
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("err = %v, want one naming %s", err, field)
		}
	}
}

// Regression: a round in which no answer was final ended with the result
// that came last in the list, so a hedge the bulkhead refused at once stood
// in for a first attempt that had timed out on the wire: the call ended
// "rejected locally" where, without hedging, it would have been retried.
func TestARefusedHedgeDoesNotHideTheFirstAttemptsFailure(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.HTTP1)
	tr := hedgingTransport(t, s, outbound.Config{AttemptTimeout: 200 * time.Millisecond, Backoff: retry.Backoff{Initial: time.Millisecond, Max: time.Millisecond},
		Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}}})
	s.Enqueue(outboundtest.Hang())
	resp, out, err := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "hang-then-ok"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("err %v, outcome %+v: the timed-out first attempt should have been retried", err, out)
	}
}

// Regression: a hedge that a local guard refused kept the budget token it
// took, so hedges refused by a small bulkhead drained the budget of a
// healthy upstream until no retry was allowed. A hedge refused locally
// costs nothing: neither the retry budget nor the upstream's hedge
// allowance (whose burst 50 calls would spend otherwise, and withhold
// their hedges).
func TestAHedgeRefusedLocallyCostsNoBudget(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.H2C)
	tr := hedgingTransport(t, s, outbound.Config{Hedging: &outbound.Hedging{Delay: 2 * time.Millisecond},
		Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}}})
	for i := range 50 {
		s.Enqueue(outboundtest.Slow(10*time.Millisecond, 200))
		_, out, err := hedgedDo(t, tr, testkit.NewRequest(t, context.Background(), s, testkit.NoBody, fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		if sent, _ := hedges(out); sent != 1 || out.HedgesWithheld != 0 {
			t.Fatalf("call %d: %d hedges, %d withheld; want its hedge sent to the guards (and refused)", i, sent, out.HedgesWithheld)
		}
	}
	st, _ := tr.Upstream(tr.UpstreamKey(testkit.NewRequest(t, context.Background(), s, testkit.NoBody, "x")))
	if st.BudgetTokens < 10 {
		t.Fatalf("budget %.1f of 10 after 50 successful calls whose hedges the bulkhead refused", st.BudgetTokens)
	}
}

// The per-call options compose in either order: WithMaxAttempts(1) over or
// under WithHedging leaves one attempt, so no hedge.
func TestPerCallOptionsComposeInEitherOrder(t *testing.T) {
	s := testkit.NewServer(t, outboundtest.H2C)
	tr := hedgingTransport(t, s, outbound.Config{Hedging: nil})
	h := &outbound.Hedging{Delay: 20 * time.Millisecond}
	for name, ctx := range map[string]context.Context{
		"hedging, then max attempts": outbound.WithMaxAttempts(outbound.WithHedging(context.Background(), h), 1),
		"max attempts, then hedging": outbound.WithHedging(outbound.WithMaxAttempts(context.Background(), 1), h),
		"hedging alone":              outbound.WithHedging(context.Background(), h),
	} {
		s.Enqueue(outboundtest.Slow(300*time.Millisecond, 200))
		_, out, err := hedgedDo(t, tr, testkit.NewRequest(t, ctx, s, testkit.NoBody, name))
		if err != nil {
			t.Fatal(err)
		}
		want := 0
		if name == "hedging alone" {
			want = 1
		}
		if sent, _ := hedges(out); sent != want {
			t.Errorf("%s: %d hedges, want %d", name, sent, want)
		}
	}
}

// startingDial dials an in-memory HTTP/1.1 upstream that gives request n
// (from 1, over every connection) to answer, which writes the raw response
// as it likes.
func startingDial(answer func(n int64, w io.Writer, req *http.Request)) func(context.Context, string, string) (net.Conn, error) {
	var n atomic.Int64
	return func(context.Context, string, string) (net.Conn, error) {
		return testkit.PipeConn(func(w io.Writer, req *http.Request) bool {
			answer(n.Add(1), w, req)
			return true
		}), nil
	}
}

// pipeHedging returns a Transport hedging after delay over dial, inside a
// synctest bubble, that is closed — and the upstream's work waited out —
// when the test ends.
func pipeHedging(t *testing.T, dial func(context.Context, string, string) (net.Conn, error), delay time.Duration) *outbound.Transport {
	tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: dial},
		Hedging: &outbound.Hedging{Delay: delay}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tr.Close()
		time.Sleep(20 * delay) // the upstream ends its work (fake time)
	})
	return tr
}

// A hedge is not sent while the first attempt's answer is arriving — its
// first bytes have reached the client, which has not read it all yet: on a
// busy machine that is the client behind, not the upstream, and a hedge
// would add load for nothing. It waits at most one more delay, so that an
// upstream that sends the start of its answer and stalls is still hedged;
// an attempt that has received nothing is hedged at the delay, as before.
// Over a connection that has answered before (its bytes are the attempt's
// own) and a new one (net/http says when it read the first byte) alike.
func TestAHedgeWaitsAtMostOneDelayForAnAnswerThatIsArriving(t *testing.T) {
	const delay = 100 * time.Millisecond
	for _, tc := range []struct {
		name        string
		start, rest time.Duration // when the first attempt's answer starts, and when the rest follows
		took        time.Duration
		hedged      bool
	}{
		{"the answer ends within the wait: no hedge", 0, delay * 3 / 2, delay * 3 / 2, false},
		{"the answer stalls: a hedge after one more delay", 0, 10 * delay, 2 * delay, true},
		{"nothing arrives: a hedge at the delay", 10 * delay, 0, delay, true},
	} {
		for _, warm := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/warm=%v", tc.name, warm), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					first := int64(1)
					if warm {
						first = 2 // the first request warms the connection up
					}
					dial := startingDial(func(n int64, w io.Writer, _ *http.Request) {
						if n == first {
							time.Sleep(tc.start)
							io.WriteString(w, "HTTP/1.1 200 OK\r\n")
							time.Sleep(tc.rest)
						} else {
							io.WriteString(w, "HTTP/1.1 200 OK\r\n")
						}
						io.WriteString(w, "Content-Length: 2\r\n\r\nok")
					})
					tr := pipeHedging(t, dial, delay)
					if warm {
						warmup, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
						if _, _, err := hedgedDo(t, tr, warmup); err != nil {
							t.Fatal(err)
						}
					}
					start := time.Now()
					req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
					resp, out, err := hedgedDo(t, tr, req)
					if err != nil || resp.StatusCode != 200 {
						t.Fatalf("%v %v", resp, err)
					}
					took := time.Since(start)
					sent, _ := hedges(out)
					if took != tc.took || (sent == 1) != tc.hedged || sent > 1 {
						t.Fatalf("took %v with %d hedges, want %v and hedged %v; outcome %+v", took, sent, tc.took, tc.hedged, out.Attempts)
					}
					if tc.hedged && (!out.Attempts[0].Lost || out.Attempts[1].Lost) {
						t.Fatalf("the hedge did not win: %+v", out.Attempts)
					}
				})
			})
		}
	}
}

// A hedge is not sent while every attempt that started after the first one
// is unanswered too: the delay's passing then says that everything is slow
// (a busy machine, an upstream that stalls as a whole), and a hedge would
// be as slow. It waits at most one more delay. An attempt overtaken by a
// later one, or alone, is hedged at the delay.
func TestAHedgeWaitsWhileEveryAttemptStartedSinceIsUnansweredToo(t *testing.T) {
	const delay = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		y    int           // how many of Y's requests are slow (0: no Y)
		xAt  time.Duration // when X is hedged, from its start
	}{
		{"alone: at the delay", 0, delay},
		{"overtaken by a later call: at the delay", -1, delay},
		{"a later call unanswered until its own hedge: once it is answered", 1, delay * 3 / 2},
		{"everything slow: one delay more", 2, 2 * delay},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				seen := map[string]int{}
				dial := startingDial(func(_ int64, w io.Writer, req *http.Request) {
					mu.Lock()
					seen[req.URL.Path]++
					n := seen[req.URL.Path]
					mu.Unlock()
					slow := req.URL.Path == "/x" && n == 1 || req.URL.Path == "/y" && n <= tc.y
					if slow {
						time.Sleep(10 * delay)
					}
					io.WriteString(w, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				})
				tr := pipeHedging(t, dial, delay)
				if tc.y != 0 {
					go func() {
						time.Sleep(delay * 2 / 5)
						req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/y", nil)
						hedgedDo(t, tr, req)
					}()
				}
				req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/x", nil)
				_, out, err := hedgedDo(t, tr, req)
				if err != nil {
					t.Fatal(err)
				}
				if len(out.Attempts) != 2 || !out.Attempts[0].Lost {
					t.Fatalf("want a hedge that won; outcome %+v", out.Attempts)
				}
				if at := out.Attempts[0].Duration - out.Attempts[1].Duration; at != tc.xAt {
					t.Fatalf("hedged %v after the first attempt, want %v", at, tc.xAt)
				}
			})
		})
	}
}
