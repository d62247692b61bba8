package attempt_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/attempt"
)

// BenchmarkEndToEnd compares one GET over loopback HTTP/1.1 through the
// attempt transport (breaker, rate limiter, bulkhead, byte counting and
// classification on) with the same GET through a bare http.Transport, in the
// same run. "callers-16" runs 16 concurrent callers. The bare transport keeps
// up to 100 idle connections per host so that neither side re-dials. The
// server runs in this process, so allocs/op include its allocations, the same
// for both sides.
func BenchmarkEndToEnd(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	}))
	defer srv.Close()

	bare := &http.Transport{MaxIdleConnsPerHost: 100}
	defer bare.CloseIdleConnections()
	ours, err := attempt.New(attempt.Config{
		HTTPTransport: &http.Transport{},
		Admission: admission.Config{
			Rate:     ratelimit.Config{PerSecond: 1e9, Burst: 1 << 30},
			Bulkhead: bulkhead.Config{MaxConcurrent: 1 << 20},
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer ours.Close()

	for _, side := range []struct {
		name string
		rt   http.RoundTripper
	}{{"bare", bare}, {"outbound", ours}} {
		get := func(b *testing.B) {
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			resp, err := side.rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		b.Run(side.name+"/sequential", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				get(b)
			}
		})
		b.Run(side.name+"/callers-16", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8) // 8 × GOMAXPROCS(2) = 16 callers
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					get(b)
				}
			})
		})
	}
}
