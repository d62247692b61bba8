package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/drill/metrics"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/retry"
)

func TestRegistryCountsAttemptsRetriesCallsAndBreakerState(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.H2C)
	defer s.Close()
	reg := metrics.New()
	tr, err := outbound.New(outbound.Config{HTTPTransport: s.Transport(), Hooks: reg.Hooks(),
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
	up := `outbound_upstream="` + s.URL + `"`
	port := s.URL[strings.LastIndex(s.URL, ":")+1:]
	for _, want := range []string{
		"# TYPE outbound_attempts_total counter",
		`outbound_attempts_total{outbound_category="NotSent",` + up + `} 1`,
		`outbound_attempts_total{outbound_category="Answered",` + up + `} 3`,
		`outbound_attempts_total{outbound_category="LocalRejection",` + up + `} 4`,
		`outbound_rejections_total{outbound_guard="circuit",` + up + `} 4`,
		`outbound_retries_total{` + up + `} 1`,
		`outbound_calls_total{outbound_commit_status="committed",` + up + `} 3`,
		`outbound_calls_total{outbound_commit_status="not committed",` + up + `} 4`,
		`outbound_breaker_state{outbound_state="OPEN",` + up + `} 1`,
		`outbound_breaker_state{outbound_state="CLOSED",` + up + `} 0`,
		`outbound_breaker_generation{` + up + `} 1`,
		`outbound_breaker_failure_rate_percent{` + up + `} 75`,
		`outbound_breaker_slow_call_rate_percent{` + up + `} 0`,
		`outbound_breaker_buffered_calls{` + up + `} 4`,
		`outbound_breaker_failed_calls{` + up + `} 3`,
		`outbound_breaker_slow_calls{` + up + `} 0`,
		`outbound_breaker_not_permitted_calls{` + up + `} 4`,
		"# TYPE http_client_request_duration_seconds histogram",
		`http_client_request_duration_seconds_count{error_type="503",http_request_method="POST",http_response_status_code="503",server_address="127.0.0.1",server_port="` + port + `",url_scheme="http"} 2`,
		`http_client_request_duration_seconds_count{error_type="NotSent",http_request_method="POST",server_address="127.0.0.1",server_port="` + port + `",url_scheme="http"} 1`,
		`http_client_request_duration_seconds_bucket{http_request_method="POST",http_response_status_code="200",server_address="127.0.0.1",server_port="` + port + `",url_scheme="http",le="+Inf"} 1`,
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
	if text := reg.Text(); !strings.Contains(text, `outbound_retry_budget_exhausted_total{outbound_upstream="a\"b\\c\nd"} 1`) {
		t.Fatal(text)
	}
}

func TestRegistryReportsTheConcurrencyLimitInFlightAndTheThrottle(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.H2C)
	defer s.Close()
	reg := metrics.New()
	tr, err := outbound.New(outbound.Config{HTTPTransport: s.Transport(), Hooks: reg.Hooks(), MaxAttempts: 1,
		Admission: admission.Config{Bulkhead: bulkhead.Config{Adaptive: true, MaxConcurrent: 64, InitialConcurrent: 8},
			Throttle: throttle.Config{Enabled: true, K: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	reg.Observe(tr)
	s.SetDefault(outboundtest.Respond(429))
	req, _ := http.NewRequest(http.MethodGet, s.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	text := reg.Text()
	up := `{outbound_upstream="` + s.URL + `"}`
	for _, want := range []string{
		"# TYPE outbound_concurrency_limit gauge",
		"outbound_concurrency_limit" + up + " 8",
		"outbound_concurrency_in_flight" + up + " 0",
		"outbound_throttle_rejection_probability" + up + " 0.5", // 1 request, not accepted: (1-0)/(1+1)
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %s\n%s", want, text)
		}
	}
}

// An ejection is counted by endpoint and upstream; the end of one is not.
func TestRegistryCountsEndpointEjections(t *testing.T) {
	reg := metrics.New()
	h := reg.Hooks()
	h.EndpointEjected("http://svc.test:80", "127.0.0.2:80", 30*time.Second)
	h.EndpointEjected("http://svc.test:80", "127.0.0.2:80", 0)
	h.EndpointEjected("http://svc.test:80", "127.0.0.2:80", time.Minute)
	want := `outbound_endpoint_ejections_total{outbound_endpoint="127.0.0.2:80",outbound_upstream="http://svc.test:80"} 2`
	if !strings.Contains(reg.Text(), want) {
		t.Fatalf("no %s in:\n%s", want, reg.Text())
	}
}
