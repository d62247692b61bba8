package outbound

import (
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/retry"
)

// AttemptsOf returns t's attempt layer, for the tests that look inside it.
func AttemptsOf(t *Transport) *attempt.Attempter { return t.attempts }

// BudgetOf returns the live retry budget of the upstream named key, for
// the tests that drain it.
func BudgetOf(t *Transport, key string) (*retry.Budget, bool) {
	s, ok := t.attempts.State(key)
	if !ok {
		return nil, false
	}
	return s.(*upstreamState).budget, true
}

// HedgeBurst is how many hedges an upstream may send at once beyond what
// its rounds earned.
const HedgeBurst = hedgeBurst

// DeadlineSentTo reports whether t's attempts to host carry the deadline.
func DeadlineSentTo(t *Transport, host string) bool { return t.deadline.forHost(host) != nil }
