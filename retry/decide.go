// Package retry decides whether a call may make another attempt, and when.
//
// The decision is one pure function, Decide, of what is known after an
// attempt: the method's idempotency, whether the body can be sent again, the
// attempt's category, the status and its Retry-After, the time left before the
// call's deadline, the attempts made, and the retry budget. Its rules, in the
// order they apply:
//
//  1. An answer that is not a retryable status ends the call (a success, or an
//     answer to hand back).
//  2. A local rejection ends the call: the guards said no, or the request is
//     invalid, and asking again at once would only spin.
//  3. A failure that would recur on every attempt (a TLS handshake refused
//     for its certificate or protocol) ends the call, and so does a failure
//     of the client itself (the request's body failed to read, or the client
//     was closed: see classify.ClientFault).
//  4. A body that cannot be produced again — a one-shot body already read — is
//     never re-sent, whatever else holds. The library never buffers a
//     streaming body to make it replayable.
//  5. Proof that the upstream did not process the attempt (NotSent) allows a
//     retry for any method, even POST: a request that was not processed has
//     not failed (RFC 9113 §8.7).
//  6. Otherwise (Ambiguous, or a retryable status) only an idempotent request
//     is re-sent: an RFC 9110 idempotent method, or one carrying an
//     Idempotency-Key header. A non-idempotent request is never re-sent after
//     the upstream answered, whatever the status, nor after an ambiguous
//     failure.
//  7. A failure that came from the connection's life (a graceful GOAWAY, the
//     keep-alive race: see classify.Lifecycle) is retried at once and
//     transparently — no attempt counted, no budget spent — once per
//     attempt, if an attempt still fits before the deadline (see 10). A second one in a row follows
//     the rules below, so a server that fails every new connection cannot
//     make a loop.
//  8. Attempts are bounded.
//  9. A Retry-After is honoured only if the wait fits before the deadline;
//     otherwise the answer is returned at once instead of waiting in vain.
//     One the client caps (longer than MaxRetryAfter) is declined the same
//     way: retrying earlier than the server asked would disobey it.
//  10. The backoff must fit before the deadline, too, with the attempt after
//     it when the time an attempt takes is known (Input.Expected): an
//     attempt that cannot finish is not begun.
//  11. The retry budget must allow it (see Budget), so that a dead upstream
//     does not receive a storm of retries — except after an attempt that a
//     connection the server was taking down ended (see Drained): that one
//     neither costs a token nor asks for one, whether or not it follows a
//     transparent retry. Behind a proxy that ends every connection after N requests, a
//     call can meet two draining connections in a row while many calls do
//     at once, and a budget drained by them would lose calls that net/http's
//     own retries get through. Attempts still bound it.
package retry

import (
	"fmt"
	"net/http"
	"time"

	"github.com/outboundhq/outbound/classify"
)

// Input is what is known after an attempt.
type Input struct {
	// Method is the request's method; IdempotencyKey reports whether it
	// carries an Idempotency-Key header.
	Method         string
	IdempotencyKey bool

	// BodyReplayable reports whether the body can be sent again: no body,
	// http.NoBody, a GetBody, or a one-shot body that was never read.
	BodyReplayable bool

	// Category and Evidence of the attempt; Status and RetryAfter for an
	// answer.
	Category classify.Category
	Evidence classify.Evidence
	Status   int
	// RetryableStatus reports whether Status is one that may be retried.
	RetryableStatus bool
	// RetryAfter is the answer's parsed Retry-After, when HasRetryAfter;
	// RetryAfterCapped when the server asked for more than the client's cap.
	HasRetryAfter    bool
	RetryAfter       time.Duration
	RetryAfterCapped bool

	// Attempts made so far (at least 1) and the most allowed.
	Attempts, MaxAttempts int

	// Backoff is the wait the backoff policy proposes before the next attempt.
	Backoff time.Duration

	// Remaining is the time left before the call's deadline; HasDeadline is
	// false when the call has none.
	HasDeadline bool
	Remaining   time.Duration

	// Expected is how long an attempt is expected to take (the upstream's
	// recent answers); 0 when not known. A retry whose wait and attempt do
	// not fit in Remaining is not made.
	Expected time.Duration

	// BudgetAllows reports whether the retry budget allows a retry.
	BudgetAllows bool

	// Lifecycle reports that the attempt failed because of its
	// connection's life (classify.Error.Lifecycle); TransparentUsed, that
	// the attempt was itself a transparent retry.
	Lifecycle, TransparentUsed bool
}

// Reason says why a decision was made: Decide returns every one of them,
// and nothing else. How a call ended when no decision ended it (its context
// ended, its body could not be made again…) is the outcome's End.
type Reason uint8

const (
	Retryable                Reason = iota + 1 // another attempt will be made
	FinalAnswer                                // an answer that is not retried (or a success)
	RefusedLocally                             // a local guard refused the attempt
	OneShotBody                                // the body cannot be sent again
	NotIdempotent                              // the upstream may have processed a non-idempotent request
	AttemptsExhausted                          // MaxAttempts reached
	RetryAfterBeyondDeadline                   // the Retry-After wait does not fit before the deadline
	RetryAfterTooLong                          // the Retry-After wait is longer than the client's cap
	DeadlineTooClose                           // the backoff, and the attempt after it, do not fit before the deadline
	BudgetExhausted                            // the retry budget is spent
	Transparent                                // retried at once, not counted: the connection's life ended the attempt
	InvalidRequest                             // the request is invalid: it cannot be sent
	WouldRecur                                 // the failure would recur on every attempt (a TLS handshake refused)
	OwnFailure                                 // the client's own fault: the request's body failed, or the client was closed
)

var reasonNames = [...]string{Retryable: "retryable", FinalAnswer: "answered", RefusedLocally: "rejected locally",
	OneShotBody: "one-shot body already sent", NotIdempotent: "not idempotent and may have been processed",
	AttemptsExhausted: "attempts exhausted", RetryAfterBeyondDeadline: "Retry-After beyond the deadline",
	RetryAfterTooLong: "Retry-After longer than the cap", DeadlineTooClose: "backoff and attempt beyond the deadline",
	BudgetExhausted: "retry budget exhausted", Transparent: "transparent retry (the connection's life, not the upstream)",
	InvalidRequest: "invalid request", WouldRecur: "would fail the same way again", OwnFailure: "the client's own fault (its request body, or the client closed)"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Decision is the verdict after an attempt.
type Decision struct {
	Retry  bool
	Wait   time.Duration // before the next attempt, when Retry
	Reason Reason
}

// Idempotent reports whether method is idempotent by RFC 9110 §9.2.2.
func Idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// Drained reports whether an attempt with evidence ev, a lifecycle failure
// or not (classify.Lifecycle), was ended by a connection the server was
// taking down: a stream above the last-stream-id of a graceful GOAWAY, no
// stream opened on a connection that could take no more, a stream reset by a
// connection that was going away (a proxy's hard stop resets what it still
// holds), or a stream at or below a graceful GOAWAY's last id left
// unanswered when the connection closed. It says nothing about the
// upstream's health: the retry budget neither pays for nor refuses the retry
// of such an attempt. The other rules still decide whether there is one: the
// last two may have been processed, so only an idempotent request is
// retried after them.
func Drained(ev classify.Evidence, lifecycle bool) bool {
	switch ev {
	case classify.EvidenceGoAwayAbove, classify.EvidenceConnShuttingDown, classify.EvidenceResetWhileDraining,
		classify.EvidenceGoAwayAtOrBelow:
		return lifecycle
	}
	return false
}

// Decide applies the rules of the package documentation, in order.
func Decide(in Input) Decision {
	no := func(r Reason) Decision { return Decision{Reason: r} }
	switch in.Category {
	case classify.Answered:
		if !in.RetryableStatus {
			return no(FinalAnswer)
		}
	case classify.LocalRejection:
		if in.Evidence == classify.EvidenceInvalidRequest {
			return no(InvalidRequest)
		}
		return no(RefusedLocally)
	}
	if in.Evidence == classify.EvidenceTLSRefused {
		return no(WouldRecur)
	}
	if classify.ClientFault(in.Evidence) {
		return no(OwnFailure)
	}
	if !in.BodyReplayable {
		return no(OneShotBody)
	}
	if in.Category != classify.NotSent && !Idempotent(in.Method) && !in.IdempotencyKey {
		return no(NotIdempotent)
	}
	if in.Lifecycle && !in.TransparentUsed && in.Category != classify.Answered {
		if in.HasDeadline && in.Remaining <= max(in.Expected, 0) {
			return no(DeadlineTooClose)
		}
		return Decision{Retry: true, Reason: Transparent}
	}
	if in.Attempts >= in.MaxAttempts {
		return no(AttemptsExhausted)
	}
	wait := max(in.Backoff, 0)
	if in.Category == classify.Answered && in.HasRetryAfter {
		if in.RetryAfterCapped {
			return no(RetryAfterTooLong)
		}
		if in.HasDeadline && in.RetryAfter >= in.Remaining {
			return no(RetryAfterBeyondDeadline)
		}
		wait = max(wait, in.RetryAfter)
	}
	if in.HasDeadline && wait+max(in.Expected, 0) >= in.Remaining {
		return no(DeadlineTooClose)
	}
	if !in.BudgetAllows && !Drained(in.Evidence, in.Lifecycle) {
		return no(BudgetExhausted)
	}
	return Decision{Retry: true, Wait: wait, Reason: Retryable}
}
