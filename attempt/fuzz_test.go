package attempt_test

import (
	"net/http"
	"testing"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/attempt"
)

// FuzzStatusClassification: any status code an upstream may send (three
// digits or not) is classified without surprise: breaker failures are
// exactly 500, 502, 503, 504; retryable answers exactly 408, 429, 500, 502,
// 503, 504.
func FuzzStatusClassification(f *testing.F) {
	for _, s := range []int{200, 404, 429, 500, 503, 999, 0, -1} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, status int) {
		failure := attempt.DefaultIsFailure(&http.Response{StatusCode: status})
		retryable := outbound.DefaultRetryableStatus(status)
		wantFailure := status == 500 || status == 502 || status == 503 || status == 504
		if failure != wantFailure || retryable != (wantFailure || status == 408 || status == 429) {
			t.Fatalf("status %d: failure %v, retryable %v", status, failure, retryable)
		}
	})
}
