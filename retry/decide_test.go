package retry_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/retry"
)

// base is an input that would retry: an idempotent GET, NotSent, time and
// attempts to spare.
func base() retry.Input {
	return retry.Input{Method: http.MethodGet, BodyReplayable: true, Category: classify.NotSent,
		Attempts: 1, MaxAttempts: 3, Backoff: 100 * time.Millisecond,
		HasDeadline: true, Remaining: 10 * time.Second, BudgetAllows: true}
}

func TestAnsweredStatusesDoNotRetryANonIdempotentOperation(t *testing.T) {
	for _, status := range []int{200, 400, 409, 429, 500, 502, 503, 504} {
		for _, method := range []string{http.MethodPost, http.MethodPatch, "CONNECT", "LOCK"} {
			in := base()
			in.Method, in.Category, in.Status, in.RetryableStatus = method, classify.Answered, status, true
			if d := retry.Decide(in); d.Retry {
				t.Fatalf("%s answered %d was retried: %+v", method, status, d)
			}
		}
	}
}

func TestAnAmbiguousFailureDoesNotRetryANonIdempotentOperation(t *testing.T) {
	in := base()
	in.Method, in.Category = http.MethodPost, classify.Ambiguous
	if d := retry.Decide(in); d.Retry || d.Reason != retry.NotIdempotent {
		t.Fatalf("decision %+v, want no retry (not idempotent)", d)
	}
	in.IdempotencyKey = true
	if d := retry.Decide(in); !d.Retry {
		t.Fatalf("with an Idempotency-Key: %+v, want a retry", d)
	}
}

func TestDeniesOneShotBodyEvenForPut(t *testing.T) {
	for _, cat := range []classify.Category{classify.NotSent, classify.Ambiguous, classify.Answered} {
		in := base()
		in.Method, in.BodyReplayable, in.Category, in.RetryableStatus = http.MethodPut, false, cat, true
		if d := retry.Decide(in); d.Retry || d.Reason != retry.OneShotBody {
			t.Fatalf("PUT with a one-shot body after %v: %+v, want no retry (one-shot body)", cat, d)
		}
	}
}

func TestHonorsRetryAfterOnlyInsideDeadline(t *testing.T) {
	in := base()
	in.Category, in.Status, in.RetryableStatus, in.HasRetryAfter = classify.Answered, 503, true, true
	in.RetryAfter, in.Remaining = 30*time.Second, 2*time.Second
	if d := retry.Decide(in); d.Retry || d.Reason != retry.RetryAfterBeyondDeadline {
		t.Fatalf("Retry-After 30s with 2s left: %+v, want the answer returned at once", d)
	}
	in.RetryAfter = time.Second
	if d := retry.Decide(in); !d.Retry || d.Wait != time.Second {
		t.Fatalf("Retry-After 1s with 2s left: %+v, want a retry after 1s", d)
	}
	in.RetryAfterCapped = true
	if d := retry.Decide(in); d.Retry || d.Reason != retry.RetryAfterTooLong {
		t.Fatalf("capped Retry-After: %+v, want no retry", d)
	}
}

func TestProtocolProofOfNonProcessingWinsOverEverything(t *testing.T) {
	in := base()
	in.Method, in.Category = http.MethodPost, classify.NotSent // no key, not idempotent
	if d := retry.Decide(in); !d.Retry {
		t.Fatalf("POST proven not processed: %+v, want a retry", d)
	}
	in.BodyReplayable = false // except the one-shot body rule
	if d := retry.Decide(in); d.Retry || d.Reason != retry.OneShotBody {
		t.Fatalf("POST proven not processed, one-shot body: %+v, want no retry", d)
	}
}

func TestBackoffMustFitBeforeTheDeadline(t *testing.T) {
	in := base()
	in.Backoff, in.Remaining = time.Second, time.Second
	if d := retry.Decide(in); d.Retry || d.Reason != retry.DeadlineTooClose {
		t.Fatalf("%+v", d)
	}
	in.HasDeadline = false
	if d := retry.Decide(in); !d.Retry {
		t.Fatalf("no deadline: %+v", d)
	}
}

// TestTheBackoffAndTheAttemptAfterItMustFitBeforeTheDeadline: with the
// time an attempt takes known (Expected), a retry is made only if its wait
// and its attempt fit in what is left; a transparent retry (no wait) only
// if its attempt does.
func TestTheBackoffAndTheAttemptAfterItMustFitBeforeTheDeadline(t *testing.T) {
	in := base()
	in.Backoff, in.Remaining, in.Expected = 100*time.Millisecond, 300*time.Millisecond, 150*time.Millisecond
	if d := retry.Decide(in); !d.Retry {
		t.Fatalf("100 ms + 150 ms in 300 ms: %+v", d)
	}
	in.Expected = 200 * time.Millisecond
	if d := retry.Decide(in); d.Retry || d.Reason != retry.DeadlineTooClose {
		t.Fatalf("100 ms + 200 ms in 300 ms: %+v", d)
	}
	in.Lifecycle, in.Category = true, classify.NotSent
	in.Remaining = 199 * time.Millisecond
	if d := retry.Decide(in); d.Retry || d.Reason != retry.DeadlineTooClose {
		t.Fatalf("transparent, 200 ms needed in 199 ms: %+v", d)
	}
	in.Remaining = 201 * time.Millisecond
	if d := retry.Decide(in); !d.Retry || d.Reason != retry.Transparent {
		t.Fatalf("transparent, 200 ms needed in 201 ms: %+v", d)
	}
}

func TestAttemptsAndBudgetBoundRetries(t *testing.T) {
	in := base()
	in.Attempts = 3
	if d := retry.Decide(in); d.Reason != retry.AttemptsExhausted {
		t.Fatalf("%+v", d)
	}
	in = base()
	in.BudgetAllows = false
	if d := retry.Decide(in); d.Reason != retry.BudgetExhausted {
		t.Fatalf("%+v", d)
	}
}

// TestDecisionForEveryCombination covers every combination of idempotency,
// body kind, category and Retry-After position relative to the deadline,
// against the rules of the package documentation.
func TestDecisionForEveryCombination(t *testing.T) {
	type idem struct {
		name   string
		method string
		key    bool
	}
	idems := []idem{{"GET", "GET", false}, {"PUT", "PUT", false}, {"DELETE", "DELETE", false},
		{"POST", "POST", false}, {"PATCH", "PATCH", false}, {"POST+key", "POST", true}}
	bodies := map[string]bool{"replayable": true, "one-shot already sent": false}
	type cat struct {
		name      string
		c         classify.Category
		retryable bool
	}
	cats := []cat{{"LocalRejection", classify.LocalRejection, false}, {"NotSent", classify.NotSent, false},
		{"Ambiguous", classify.Ambiguous, false}, {"Answered 503", classify.Answered, true}, {"Answered 404", classify.Answered, false}}
	type ra struct {
		name      string
		has       bool
		d         time.Duration
		capped    bool
		wantBlock retry.Reason
	}
	ras := []ra{{"no Retry-After", false, 0, false, 0}, {"Retry-After inside the deadline", true, time.Second, false, 0},
		{"Retry-After beyond the deadline", true, 30 * time.Second, false, retry.RetryAfterBeyondDeadline},
		{"Retry-After over the cap", true, time.Minute, true, retry.RetryAfterTooLong}}
	n := 0
	for _, id := range idems {
		for bname, replayable := range bodies {
			for _, c := range cats {
				for _, r := range ras {
					in := base()
					in.Method, in.IdempotencyKey, in.BodyReplayable = id.method, id.key, replayable
					in.Category, in.RetryableStatus = c.c, c.retryable
					in.HasRetryAfter, in.RetryAfter, in.RetryAfterCapped = r.has, r.d, r.capped
					in.Remaining = 2 * time.Second

					var want retry.Reason
					idempotent := id.method == "GET" || id.method == "PUT" || id.method == "DELETE" || id.key
					switch {
					case c.c == classify.Answered && !c.retryable: // rule 1
						want = retry.FinalAnswer
					case c.c == classify.LocalRejection: // rule 2
						want = retry.RefusedLocally
					case !replayable: // rule 3
						want = retry.OneShotBody
					case c.c != classify.NotSent && !idempotent: // rules 4 and 5
						want = retry.NotIdempotent
					case c.c == classify.Answered && r.wantBlock != 0: // rule 7, for answers only
						want = r.wantBlock
					default:
						want = retry.Retryable
					}
					d := retry.Decide(in)
					name := fmt.Sprintf("%s/%s/%s/%s", id.name, bname, c.name, r.name)
					if d.Reason != want || d.Retry != (want == retry.Retryable) {
						t.Errorf("%s: %+v, want %v", name, d, want)
					}
					if d.Retry && c.c == classify.Answered && r.has && d.Wait < r.d {
						t.Errorf("%s: waits %v, less than the Retry-After %v", name, d.Wait, r.d)
					}
					n++
				}
			}
		}
	}
	if n != 6*2*5*4 {
		t.Fatalf("covered %d combinations", n)
	}
}

// A failure from the connection's life is retried at once, costing neither an
// attempt nor budget — once: the attempt after it follows the normal rules.
// It never overrides the safety rules.
func TestALifecycleFailureIsRetriedTransparentlyOncePerAttempt(t *testing.T) {
	in := base()
	in.Lifecycle, in.Attempts, in.MaxAttempts, in.BudgetAllows = true, 1, 1, false
	if d := retry.Decide(in); !d.Retry || d.Reason != retry.Transparent || d.Wait != 0 {
		t.Fatalf("lifecycle failure, no attempts or budget left: %+v, want a transparent retry", d)
	}
	in.TransparentUsed = true
	if d := retry.Decide(in); d.Retry || d.Reason != retry.AttemptsExhausted {
		t.Fatalf("the transparent retry failed the same way: %+v, want the normal rules", d)
	}
	in = base()
	in.Lifecycle, in.Method, in.Category = true, http.MethodPost, classify.Ambiguous // the keep-alive race, bytes written
	if d := retry.Decide(in); d.Retry || d.Reason != retry.NotIdempotent {
		t.Fatalf("a POST that may have arrived: %+v, want no retry", d)
	}
	in = base()
	in.Lifecycle, in.BodyReplayable = true, false
	if d := retry.Decide(in); d.Retry || d.Reason != retry.OneShotBody {
		t.Fatalf("a one-shot body already sent: %+v, want no retry", d)
	}
	in = base()
	in.Lifecycle, in.Remaining = true, 0
	if d := retry.Decide(in); d.Retry {
		t.Fatalf("no time left: %+v, want no retry", d)
	}
}

// The race behind a proxy that ends each connection after N requests: the
// transparent retry of a stream above a graceful GOAWAY lands on the next
// connection, which is drained too before it takes the stream. The second
// attempt is proven unsent as well, and the retry budget neither refuses nor
// pays for it; attempts still bound it, and other NotSent failures still ask
// the budget.
func TestASecondDrainingConnectionInARowIsRetriedWhateverTheBudget(t *testing.T) {
	for _, ev := range []classify.Evidence{classify.EvidenceGoAwayAbove, classify.EvidenceConnShuttingDown} {
		in := base()
		in.Category, in.Evidence, in.Lifecycle, in.TransparentUsed = classify.NotSent, ev, true, true
		in.Attempts, in.MaxAttempts, in.BudgetAllows = 1, 3, false
		if d := retry.Decide(in); !d.Retry || d.Reason != retry.Retryable {
			t.Fatalf("%v after a transparent retry, budget spent: %+v, want a retry", ev, d)
		}
		in.Attempts = 3
		if d := retry.Decide(in); d.Retry || d.Reason != retry.AttemptsExhausted {
			t.Fatalf("%v with no attempts left: %+v, want attempts exhausted", ev, d)
		}
	}
	for _, ev := range []classify.Evidence{classify.EvidenceNothingWritten, classify.EvidenceRefusedStream, classify.EvidenceConnNotEstablished} {
		in := base()
		in.Category, in.Evidence, in.TransparentUsed, in.Attempts, in.MaxAttempts, in.BudgetAllows = classify.NotSent, ev, true, 1, 3, false
		if d := retry.Decide(in); d.Retry || d.Reason != retry.BudgetExhausted {
			t.Fatalf("%v, budget spent: %+v, want budget exhausted", ev, d)
		}
	}
}

// A stream reset by a connection that was going away (a proxy's hard stop)
// or left unanswered at or below a graceful GOAWAY's last id may have been
// processed: only an idempotent request is sent again, and the budget
// neither refuses nor pays for it. A GOAWAY with an error code is a server in
// trouble (not a lifecycle failure): the budget decides.
func TestAConnectionBeingTakenDownCostsNoBudgetButOnlyIdempotentCallsAreResent(t *testing.T) {
	for _, ev := range []classify.Evidence{classify.EvidenceResetWhileDraining, classify.EvidenceGoAwayAtOrBelow} {
		in := base()
		in.Category, in.Evidence, in.Lifecycle, in.TransparentUsed = classify.Ambiguous, ev, true, true
		in.Attempts, in.MaxAttempts, in.BudgetAllows = 1, 3, false
		if d := retry.Decide(in); !d.Retry || d.Reason != retry.Retryable {
			t.Fatalf("GET after %v, budget spent: %+v, want a retry", ev, d)
		}
		in.Method = http.MethodPost
		if d := retry.Decide(in); d.Retry || d.Reason != retry.NotIdempotent {
			t.Fatalf("POST after %v: %+v, want no retry: it may have been processed", ev, d)
		}
	}
	in := base()
	in.Category, in.Evidence, in.Lifecycle, in.TransparentUsed = classify.Ambiguous, classify.EvidenceGoAwayAtOrBelow, false, true
	in.Attempts, in.MaxAttempts, in.BudgetAllows = 1, 3, false
	if d := retry.Decide(in); d.Retry || d.Reason != retry.BudgetExhausted {
		t.Fatalf("a GOAWAY with an error code, budget spent: %+v, want budget exhausted", d)
	}
}

func TestAnInvalidRequestIsNeverRetried(t *testing.T) {
	in := base()
	in.Category, in.Evidence = classify.LocalRejection, classify.EvidenceInvalidRequest
	if d := retry.Decide(in); d.Retry || d.Reason != retry.InvalidRequest {
		t.Fatalf("%+v", d)
	}
}

func TestARefusedTLSHandshakeIsNeverRetried(t *testing.T) {
	in := base()
	in.Category, in.Evidence = classify.NotSent, classify.EvidenceTLSRefused
	if d := retry.Decide(in); d.Retry || d.Reason != retry.WouldRecur {
		t.Fatalf("%+v", d)
	}
}

func TestAClientFaultIsNeverRetried(t *testing.T) {
	for _, ev := range []classify.Evidence{classify.EvidenceRequestBodyFailed, classify.EvidenceClientClosed} {
		in := base()
		in.Category, in.Evidence = classify.Ambiguous, ev
		if d := retry.Decide(in); d.Retry || d.Reason != retry.OwnFailure {
			t.Fatalf("%v: %+v", ev, d)
		}
	}
}
