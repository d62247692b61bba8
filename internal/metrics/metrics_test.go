package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/internal/metrics"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/retry"
)

func TestRegistryCountsAttemptsRetriesCallsAndBreakerState(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.H2C)
	defer s.Close()
	reg := metrics.New()
	tr, err := outbound.New(outbound.Config{Transport: s.Transport(), Hooks: reg.Hooks(),
		Backoff:   retry.Backoff{Initial: 1, Max: 1},
		Admission: admission.Config{Circuit: circuit.Config{WindowSize: 4, MinimumCalls: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	reg.Observe(tr)
	call := func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.URL+"/x", strings.NewReader("{}"))
		if resp, err := tr.RoundTrip(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	s.Enqueue(outboundtest.RefusedStream())
	call() // NotSent, retried, answered
	s.SetDefault(outboundtest.Respond(503))
	for range 6 {
		// The window holds the refused attempt (a failure) and the 200:
		// two 503s make 3 failures in 4 and open the breaker; the last four
		// calls are rejected.
		call()
	}

	rec := httptest.NewRecorder()
	reg.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	text := rec.Body.String()
	up := `upstream="` + s.URL + `"`
	for _, want := range []string{
		"# TYPE outbound_attempts_total counter",
		`outbound_attempts_total{` + up + `,category="NotSent"} 1`,
		`outbound_attempts_total{` + up + `,category="Answered"} 3`,
		`outbound_attempts_total{` + up + `,category="LocalRejection"} 4`,
		`outbound_rejections_total{` + up + `,guard="circuit"} 4`,
		`outbound_retries_total{` + up + `} 1`,
		`outbound_calls_total{` + up + `,commit="committed"} 3`,
		`outbound_calls_total{` + up + `,commit="not committed"} 4`,
		`outbound_breaker_state{` + up + `,state="OPEN"} 1`,
		`outbound_breaker_state{` + up + `,state="CLOSED"} 0`,
		`outbound_breaker_generation{` + up + `} 1`,
		`outbound_breaker_failure_rate_percent{` + up + `} 75`,
		`outbound_breaker_slow_call_rate_percent{` + up + `} 0`,
		`outbound_breaker_buffered_calls{` + up + `} 4`,
		`outbound_breaker_failed_calls{` + up + `} 3`,
		`outbound_breaker_slow_calls{` + up + `} 0`,
		`outbound_breaker_not_permitted_calls{` + up + `} 4`,
		`outbound_attempt_duration_seconds_count{` + up + `,category="Answered"} 3`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %s", want)
		}
	}
	if rec.Header().Get("Content-Type") != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("content type %q", rec.Header().Get("Content-Type"))
	}
	if t.Failed() {
		t.Log(text)
	}
}

func TestLabelValuesAreEscaped(t *testing.T) {
	reg := metrics.New()
	reg.Hooks().BudgetExhausted(context.Background(), "a\"b\\c\nd")
	if text := reg.Text(); !strings.Contains(text, `outbound_retry_budget_exhausted_total{upstream="a\"b\\c\nd"} 1`) {
		t.Fatal(text)
	}
}
