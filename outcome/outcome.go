// Package outcome is what a finished call tells its caller: whether the
// upstream committed the call, and what each attempt proved.
//
// Commit status is a first-class result:
//
//   - Committed: the upstream answered (any status). The response is the
//     result.
//   - NotCommitted: every attempt is proven not to have been processed (a
//     local rejection, no connection, nothing written, HTTP/2 REFUSED_STREAM
//     or a stream above a GOAWAY's last id). Safe to send again later.
//   - Unknown: an attempt may have been processed and no answer came back.
//     The call may or may not have happened. Do not blindly send it again
//     (unless it is idempotent or carries an Idempotency-Key the upstream
//     honours): reconcile — look the resource up, query the operation's
//     status, or let a later idempotent retry with the same key settle it.
package outcome

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/retry"
)

// Commit is a call's commit status.
type Commit uint8

const (
	Committed    Commit = iota + 1 // the upstream answered
	NotCommitted                   // proven not processed by the upstream
	Unknown                        // may have been processed; no answer
)

func (c Commit) String() string {
	switch c {
	case Committed:
		return "committed"
	case NotCommitted:
		return "not committed"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("Commit(%d)", uint8(c))
}

// End says how a call ended.
type End uint8

const (
	Decided          End = iota + 1 // by the retry decision after its last attempt (Outcome.Reason)
	ContextDone                     // the call's context ended while it waited to retry
	BodyUnavailable                 // GetBody failed: the body of the next attempt could not be made
	DeadlineExceeded                // the call's deadline expired during an attempt
	Cancelled                       // the caller cancelled the call during an attempt
	AnswerTooLarge                  // a retry was allowed, but the answer was too large to keep until it was certain: it is the call's answer
	CircuitOpened                   // a retry was allowed, but the answer opened the upstream's breaker for its Retry-After: it is the call's answer
	CannotFinish                    // the time left before the deadline was less than the upstream's answers take: no attempt was begun
)

var endNames = [...]string{Decided: "decided", ContextDone: "context done while waiting to retry",
	BodyUnavailable: "GetBody failed", DeadlineExceeded: "deadline expired during an attempt",
	Cancelled: "cancelled by the caller", AnswerTooLarge: "answer too large to keep while retrying",
	CircuitOpened: "the answer opened the circuit until its Retry-After",
	CannotFinish:  "too little time left before the deadline for an attempt"}

func (e End) String() string {
	if int(e) < len(endNames) && endNames[e] != "" {
		return endNames[e]
	}
	return fmt.Sprintf("End(%d)", uint8(e))
}

// Why names how the call ended in words: its End, or for a decided call the
// decision's Reason.
func (o *Outcome) Why() string {
	if o.End == Decided {
		return o.Reason.String()
	}
	return o.End.String()
}

// Sentinels matched by *CallError with errors.Is.
var (
	// ErrUnknown: the call may or may not have been processed.
	ErrUnknown = errors.New("commit status unknown: the upstream may have processed the call")
	// ErrNotCommitted: the upstream did not process the call.
	ErrNotCommitted = errors.New("not committed: the upstream did not process the call")
	// ErrCannotFinish: the call was not sent, for the time left before its
	// deadline was less than the upstream's recent answers took (End
	// CannotFinish).
	ErrCannotFinish = errors.New("too little time left before the deadline: the upstream's recent answers took longer")
)

// Attempt is one physical attempt of a call.
type Attempt struct {
	Stage    classify.Stage
	Category classify.Category
	Evidence classify.Evidence
	Status   int            // for an answer
	Guard    classify.Guard // for a local rejection: the guard that refused
	Duration time.Duration  // until the response headers, or the failure
	Err      error          // nil for an answer
	// Lifecycle reports that the failure came from the connection's life,
	// not from the upstream's health (see classify.Lifecycle): it is not a
	// breaker failure, and its retry, Decision retry.Transparent, is not
	// counted against the attempts and costs no retry budget.
	Lifecycle bool

	// Hedge reports that the attempt was a hedge, sent beside another of
	// the call that had not answered yet; Lost, that it was cancelled
	// because another attempt of the call answered first.
	Hedge, Lost bool

	// Endpoint is the address ("ip:port") the attempt was sent to when the
	// Transport spreads a host over its addresses (Config.Endpoints), and
	// the host resolved to several; "" otherwise.
	Endpoint string

	// Decision is what was decided after this attempt, and Wait how long
	// the call waited before the next one. It is 0 when no decision was
	// made: the call ended otherwise (Outcome.End), or the attempt lost to
	// another of the call (Lost).
	Decision retry.Reason
	Wait     time.Duration
}

// Outcome is the record of a finished call.
type Outcome struct {
	Upstream string
	Method   string
	Commit   Commit
	Attempts []Attempt
	// End is how the call ended: Decided, by the retry decision after its
	// last attempt (Reason), or by one of the other Ends, with Reason 0. A
	// call that ends with an answer returns the last answer it got, even
	// when later attempts failed without reaching the upstream.
	End End
	// Reason is the retry decision that ended the call, when End is
	// Decided (retry.RefusedLocally for a call refused before its first
	// attempt).
	Reason retry.Reason
	// HedgesWithheld counts the hedges the call would have sent — an
	// attempt ran past the hedging delay, and the call could send another —
	// that the upstream withheld: its hedge allowance was spent, or its
	// retry budget held half or less (Hooks.BudgetExhausted is told each). A hedge a local guard refused was sent to the guards: it
	// is in Attempts, a LocalRejection.
	HedgesWithheld int
	// IdempotencyKey is the Idempotency-Key header every attempt carried,
	// the caller's or one generated (Config.IdempotencyKeys), "" if none: the
	// key to reconcile an unknown outcome with, or to send the call again
	// with.
	IdempotencyKey string
}

// CommitOf returns the commit status of a call that made these attempts:
// Committed if the last was answered; else Unknown if any may have been
// processed (an ambiguous failure, or an answer that was retried); else
// NotCommitted.
func CommitOf(attempts []Attempt) Commit {
	if n := len(attempts); n > 0 && attempts[n-1].Category == classify.Answered {
		return Committed
	}
	for _, a := range attempts {
		if a.Category == classify.Ambiguous || a.Category == classify.Answered {
			return Unknown
		}
	}
	return NotCommitted
}

// String renders the outcome on one line per attempt.
func (o *Outcome) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %s after %d attempt(s)", o.Method, o.Upstream, o.Commit, len(o.Attempts))
	for i, a := range o.Attempts {
		fmt.Fprintf(&b, "\n  #%d %v at %v (%v)", i+1, a.Category, a.Stage, a.Evidence)
		if a.Status != 0 {
			fmt.Fprintf(&b, " status %d", a.Status)
		}
		if a.Guard != 0 {
			fmt.Fprintf(&b, " by the %v guard", a.Guard)
		}
		if a.Endpoint != "" {
			fmt.Fprintf(&b, " from %s", a.Endpoint)
		}
		fmt.Fprintf(&b, " in %v -> ", a.Duration.Round(time.Microsecond))
		switch {
		case a.Decision != 0:
			b.WriteString(a.Decision.String())
		case a.Lost:
			b.WriteString("lost to another attempt")
		case i == len(o.Attempts)-1:
			b.WriteString(o.End.String())
		}
		if a.Wait > 0 {
			fmt.Fprintf(&b, ", waited %v", a.Wait.Round(time.Millisecond))
		}
	}
	return b.String()
}

// CallError is a call that ended without a response. errors.Is matches
// ErrUnknown or ErrNotCommitted by its commit status, and, through Unwrap,
// the last attempt's *classify.Error and its cause (or the context's error).
type CallError struct {
	Outcome *Outcome
	Err     error
}

func (e *CallError) Error() string {
	o := e.Outcome
	return fmt.Sprintf("outbound: %s %s: %s after %d attempt(s) (%v): %v",
		o.Method, o.Upstream, o.Commit, len(o.Attempts), o.Why(), e.Err)
}

// Unwrap returns the last attempt's error, or the context's.
func (e *CallError) Unwrap() error { return e.Err }

// Timeout reports whether the call ended because time ran out — its
// deadline, a per-attempt timeout, or a network timeout — as net/http
// reports it: e is then a net.Error whose Timeout is true, os.IsTimeout(e)
// holds, and errors.Is(e, context.DeadlineExceeded) holds for a deadline or
// a per-attempt timeout.
func (e *CallError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// Temporary is Timeout, for the net.Error interface.
func (e *CallError) Temporary() bool { return e.Timeout() }

// Is matches the sentinel of the commit status.
func (e *CallError) Is(target error) bool {
	switch target {
	case ErrUnknown:
		return e.Outcome.Commit == Unknown
	case ErrNotCommitted:
		return e.Outcome.Commit == NotCommitted
	}
	return false
}
