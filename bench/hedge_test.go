package bench

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
)

// slowTail is an upstream where 2% of answers take 100–300 ms and the rest
// about 1 ms, counting the requests it receives.
type slowTail struct {
	srv      *httptest.Server
	requests atomic.Int64
}

func newSlowTail(tb testing.TB, h2c bool) *slowTail {
	s := &slowTail{}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		d := time.Millisecond
		if rand.IntN(50) == 0 {
			d = 100*time.Millisecond + rand.N(200*time.Millisecond)
		}
		select {
		case <-time.After(d): // the upstream's latency
		case <-r.Context().Done(): // a cancelled hedge
			return
		}
		io.WriteString(w, "ok")
	}))
	startUpstream(tb, s.srv, h2c)
	return s
}

func slowTailTransport(h2c bool) *http.Transport {
	t := &http.Transport{MaxIdleConnsPerHost: 64}
	if h2c {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return t
}

// BenchmarkHedging calls a slow-tailed upstream from 16 callers, b.N calls
// in all, through outbound without hedging, with adaptive hedging at a 5%
// extra-load target, and through failsafe-go's hedge policy with the same
// rule (a hedge after the 95th percentile of recent latencies, remembering
// about 500, from the 64th on; one hedge), and reports the latency percentiles and the extra
// requests the upstream received.
func BenchmarkHedging(b *testing.B) {
	for _, proto := range []string{"http1", "h2c"} {
		h2c := proto == "h2c"
		clients := hedgingClients(h2c)
		for _, c := range clients {
			b.Run(proto+"/"+c.name, func(b *testing.B) {
				up := newSlowTail(b, h2c)
				var hedges atomic.Int64
				rt := c.rt(b, &hedges)
				// Warm up: connections, and outbound's latency estimate.
				for range 200 {
					call(b, rt, up.srv.URL)
				}
				up.requests.Store(0)
				hedges.Store(0)
				withheld.Store(0)
				q := callFrom16(b, rt, up.srv.URL)
				b.ReportMetric(q(0.5), "p50-ms")
				b.ReportMetric(q(0.99), "p99-ms")
				b.ReportMetric(q(0.999), "p99.9-ms")
				b.ReportMetric(100*float64(hedges.Load())/float64(b.N), "hedges-%")
				if strings.HasPrefix(c.name, "outbound-hedged") {
					b.ReportMetric(100*float64(withheld.Load())/float64(b.N), "withheld-%")
				}
				b.ReportMetric(100*float64(up.requests.Load()-int64(b.N))/float64(b.N), "extra-received-%")
			})
		}
	}
}

// withheld counts the hedges the budget withheld, in the benchmark running.
var withheld atomic.Int64

// mustOutbound returns a Transport that counts the hedges it sends, and
// those its budget withheld.
func mustOutbound(tb testing.TB, cfg outbound.Config, hedges *atomic.Int64) http.RoundTripper {
	cfg.Hooks.CallDone = func(_ context.Context, o *outcome.Outcome) { withheld.Add(int64(o.HedgesWithheld)) }
	cfg.Hooks.AttemptDone = func(_ context.Context, _ outbound.AttemptInfo, a outcome.Attempt) {
		if a.Hedge && a.Category != classify.LocalRejection {
			hedges.Add(1)
		}
	}
	t, err := outbound.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(t.Close)
	return t
}

func call(b *testing.B, rt http.RoundTripper, url string) {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Error(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// saturated is an upstream at its capacity: 4 requests are served at once,
// each for 2 ms, and the others queue (a queued request whose caller gave
// up leaves the queue). It counts the requests it receives.
type saturated struct {
	srv      *httptest.Server
	requests atomic.Int64
}

func newSaturated(tb testing.TB, h2c bool) *saturated {
	s := &saturated{}
	slots := make(chan struct{}, 4)
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		select {
		case slots <- struct{}{}:
		case <-r.Context().Done():
			return
		}
		defer func() { <-slots }()
		select {
		case <-time.After(2 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "ok")
	}))
	startUpstream(tb, s.srv, h2c)
	return s
}

// BenchmarkHedgingSaturated calls an upstream at its capacity from 16
// callers — every answer is slow because of the queue, and a hedge only
// lengthens it — through outbound without hedging, with adaptive hedging at
// a 5% extra-load target, and through failsafe-go's hedge policy with the
// same rule, and reports the amplification (requests the upstream received
// per call) and the latency percentiles.
func BenchmarkHedgingSaturated(b *testing.B) {
	for _, proto := range []string{"http1", "h2c"} {
		h2c := proto == "h2c"
		clients := hedgingClients(h2c)
		for _, c := range clients {
			b.Run(proto+"/"+c.name, func(b *testing.B) {
				up := newSaturated(b, h2c)
				rt := c.rt(b, new(atomic.Int64))
				for range 200 { // warm up: connections, and the latency estimates
					call(b, rt, up.srv.URL)
				}
				up.requests.Store(0)
				q := callFrom16(b, rt, up.srv.URL)
				b.ReportMetric(q(0.5), "p50-ms")
				b.ReportMetric(q(0.99), "p99-ms")
				b.ReportMetric(float64(up.requests.Load())/float64(b.N), "amplification")
			})
		}
	}
}

// callFrom16 makes b.N calls to url from 16 callers, timed, and returns the
// quantiles of their latencies, in milliseconds.
func callFrom16(b *testing.B, rt http.RoundTripper, url string) func(p float64) float64 {
	lat := make([]time.Duration, 0, b.N)
	var mu sync.Mutex
	var next atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				start := time.Now()
				call(b, rt, url)
				d := time.Since(start)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	slices.Sort(lat)
	return func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
}

// startUpstream starts srv, speaking h2c if asked, until the benchmark ends.
func startUpstream(tb testing.TB, srv *httptest.Server, h2c bool) {
	if h2c {
		srv.Config.Protocols = new(http.Protocols)
		srv.Config.Protocols.SetUnencryptedHTTP2(true)
	}
	srv.Start()
	tb.Cleanup(srv.Close)
}

// hedgingClient is a client of the hedging benchmarks: rt makes its
// RoundTripper, which counts the hedges it sends in hedges.
type hedgingClient struct {
	name string
	rt   func(tb testing.TB, hedges *atomic.Int64) http.RoundTripper
}

// hedgingClients are outbound without hedging, outbound with adaptive
// hedging at a 5% extra-load target and at 7% (about the load failsafe-go's
// rule comes to here, for p99 at an equal load), and failsafe-go's hedge policy with
// the same rule (a hedge after the 95th percentile of recent latencies,
// remembering about 500, from the 64th on; one hedge).
func hedgingClients(h2c bool) []hedgingClient {
	return []hedgingClient{
		{"outbound", func(tb testing.TB, hedges *atomic.Int64) http.RoundTripper {
			return mustOutbound(tb, outbound.Config{HTTPTransport: slowTailTransport(h2c)}, hedges)
		}},
		{"outbound-hedged", func(tb testing.TB, hedges *atomic.Int64) http.RoundTripper {
			return mustOutbound(tb, outbound.Config{HTTPTransport: slowTailTransport(h2c),
				Hedging: &outbound.Hedging{ExtraLoad: 0.05}}, hedges)
		}},
		{"outbound-hedged-7", func(tb testing.TB, hedges *atomic.Int64) http.RoundTripper {
			return mustOutbound(tb, outbound.Config{HTTPTransport: slowTailTransport(h2c),
				Hedging: &outbound.Hedging{ExtraLoad: 0.07}}, hedges)
		}},
		{"failsafe-hedged", func(tb testing.TB, hedges *atomic.Int64) http.RoundTripper {
			t := slowTailTransport(h2c)
			tb.Cleanup(t.CloseIdleConnections)
			return failsafehttp.NewRoundTripper(t,
				hedgepolicy.NewBuilderWithDelayQuantile[*http.Response](0.95, 500, 64).WithMaxHedges(1).
					OnHedge(func(failsafe.ExecutionEvent[*http.Response]) { hedges.Add(1) }).Build())
		}},
	}
}
