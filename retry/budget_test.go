package retry_test

import (
	"strings"
	"testing"

	"github.com/outboundhq/outbound/retry"
)

func TestBudgetStopsRetriesAgainstAnUpstreamThatFailsEverything(t *testing.T) {
	b, err := retry.NewBudget(retry.BudgetConfig{})
	if err != nil {
		t.Fatal(err)
	}
	retries := 0
	for range 100 { // 100 calls, each failing
		b.OnFailure()
		if b.Allows() {
			retries++
			b.OnFailure() // the retry fails too
		}
	}
	if retries > 5 {
		t.Fatalf("%d retries against a dead upstream, want at most 5", retries)
	}
}

func TestBudgetRefillsWithSuccesses(t *testing.T) {
	b, _ := retry.NewBudget(retry.BudgetConfig{MaxTokens: 10, TokenRatio: 1})
	for range 10 {
		b.OnFailure()
	}
	if b.Allows() || b.Tokens() != 0 {
		t.Fatalf("empty budget allows: %v tokens", b.Tokens())
	}
	for range 6 {
		b.OnSuccess()
	}
	if !b.Allows() {
		t.Fatalf("budget with %v tokens of 10 does not allow", b.Tokens())
	}
	for range 100 {
		b.OnSuccess()
	}
	if b.Tokens() != 10 {
		t.Fatalf("tokens %v above the maximum", b.Tokens())
	}
}

func TestInvalidBudgetConfigNamesTheField(t *testing.T) {
	for field, cfg := range map[string]retry.BudgetConfig{
		"MaxTokens":  {MaxTokens: -1},
		"TokenRatio": {TokenRatio: 50},
	} {
		if _, err := retry.NewBudget(cfg); err == nil || !strings.Contains(err.Error(), "BudgetConfig."+field) {
			t.Errorf("err = %v, want it to name %s", err, field)
		}
	}
}
