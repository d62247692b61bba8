package outcome_test

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
)

func TestCommitStatusFollowsWhatTheAttemptsProved(t *testing.T) {
	a := func(c classify.Category) outcome.Attempt { return outcome.Attempt{Category: c} }
	for _, tc := range []struct {
		name     string
		attempts []outcome.Attempt
		want     outcome.Commit
	}{
		{"answered", []outcome.Attempt{a(classify.Answered)}, outcome.Committed},
		{"not sent, then answered", []outcome.Attempt{a(classify.NotSent), a(classify.Answered)}, outcome.Committed},
		{"ambiguous, then answered", []outcome.Attempt{a(classify.Ambiguous), a(classify.Answered)}, outcome.Committed},
		{"rejected locally", []outcome.Attempt{a(classify.LocalRejection)}, outcome.NotCommitted},
		{"not sent twice", []outcome.Attempt{a(classify.NotSent), a(classify.NotSent)}, outcome.NotCommitted},
		{"ambiguous", []outcome.Attempt{a(classify.Ambiguous)}, outcome.Unknown},
		{"ambiguous, then not sent", []outcome.Attempt{a(classify.Ambiguous), a(classify.NotSent)}, outcome.Unknown},
		{"answered 503, then not sent", []outcome.Attempt{a(classify.Answered), a(classify.NotSent)}, outcome.Unknown},
		{"no attempt", nil, outcome.NotCommitted},
	} {
		if got := outcome.CommitOf(tc.attempts); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestErrorMatchesItsCommitStatusAndUnwrapsTheAttempt(t *testing.T) {
	cause := &classify.Error{Upstream: "u", Stage: classify.StageAwait, Category: classify.Ambiguous,
		Evidence: classify.EvidenceBytesWritten, Err: syscall.ECONNRESET}
	o := &outcome.Outcome{Upstream: "u", Method: "POST", Attempts: []outcome.Attempt{{Category: classify.Ambiguous}}}
	o.Commit = outcome.CommitOf(o.Attempts)
	err := error(&outcome.CallError{Outcome: o, Err: cause})
	if !errors.Is(err, outcome.ErrUnknown) || errors.Is(err, outcome.ErrNotCommitted) ||
		!errors.Is(err, classify.ErrAmbiguous) || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("errors.Is chain broken: %v", err)
	}
	if !strings.Contains(err.Error(), "POST u: unknown after 1 attempt(s)") {
		t.Fatalf("message: %v", err)
	}
	if !strings.Contains(o.String(), "#1 Ambiguous") {
		t.Fatalf("String: %s", o)
	}
}
