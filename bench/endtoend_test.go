package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/outboundtest/testkit"
)

// callers is the number of concurrent callers of the "16-callers" runs.
const callers = 16

// client is one side of the end-to-end comparison.
type client struct {
	name string
	new  func(testing.TB) http.RoundTripper
}

func clients() []client {
	return []client{
		{"bare", func(tb testing.TB) http.RoundTripper { return closing(tb, innerTransport()) }},
		{"outbound", func(tb testing.TB) http.RoundTripper {
			t, err := outbound.New(outbound.Config{
				HTTPTransport: innerTransport(), // cloned: outbound keeps its own connections
				Admission:     outboundAdmissionConfig(""),
			})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(t.Close)
			return t
		}},
		{"failsafehttp", func(tb testing.TB) http.RoundTripper {
			// Outermost first: retry, then breaker, limiter, bulkhead. The
			// breaker counts errors and 5xx answers as failures, as
			// outbound's default does.
			cb := failsafeBreakerBuilder[*http.Response]().
				HandleIf(func(r *http.Response, err error) bool {
					return err != nil || r != nil && r.StatusCode >= 500
				}).Build()
			return failsafehttp.NewRoundTripper(closing(tb, innerTransport()),
				failsafehttp.NewRetryPolicyBuilder().Build(), // 3 attempts at most
				cb, failsafeLimiter[*http.Response](), failsafeBulkhead[*http.Response]())
		}},
		{"retryablehttp", func(tb testing.TB) http.RoundTripper {
			c := retryablehttp.NewClient()
			c.HTTPClient.Transport = closing(tb, innerTransport())
			c.RetryMax = 2 // 3 attempts at most
			c.Logger = nil // the default logs every request
			return &retryablehttp.RoundTripper{Client: c}
		}},
		{"gobreaker", func(tb testing.TB) http.RoundTripper {
			return &gobreakerTransport{
				next: closing(tb, innerTransport()),
				cb:   gobreaker.NewCircuitBreaker[*http.Response](gobreakerSettings("bench")),
				lim:  baselineLimiter(),
				sem:  make(chan struct{}, bulkheadSlots),
			}
		}},
	}
}

// gobreakerTransport is how a user composes gobreaker, x/time/rate and a
// channel semaphore around a transport: 5xx answers count as breaker
// failures, and the semaphore slot is given back when the headers arrive.
type gobreakerTransport struct {
	next http.RoundTripper
	cb   *gobreaker.CircuitBreaker[*http.Response]
	lim  *rate.Limiter
	sem  chan struct{}
}

var errStatus5xx = errors.New("bench: 5xx answer")

func (t *gobreakerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.cb.Execute(func() (*http.Response, error) {
		if !t.lim.Allow() {
			return nil, errLimited
		}
		select {
		case t.sem <- struct{}{}:
		default:
			return nil, errFull
		}
		defer func() { <-t.sem }()
		resp, err := t.next.RoundTrip(req)
		if err == nil && resp.StatusCode >= 500 {
			return resp, errStatus5xx
		}
		return resp, err
	})
	if err == errStatus5xx {
		err = nil
	}
	return resp, err
}

// BenchmarkEndToEnd sends GET requests over loopback HTTP/1.1 to
// cmd/echo-server, running in its own process, through each client: one
// caller at a time ("sequential") and from 16 goroutines ("16-callers").
// It reports requests/s; allocs/op and B/op are the client's, per request.
func BenchmarkEndToEnd(b *testing.B) {
	srv := startEchoServer(b)
	for _, c := range clients() {
		b.Run(c.name, func(b *testing.B) {
			b.Run("sequential", func(b *testing.B) {
				d0 := dials.Load()
				rt := c.new(b)
				get(b, rt, srv.URL) // dial outside the measurement
				b.ReportAllocs()
				var cpu0 int64
				for b.Loop() {
					if cpu0 == 0 {
						cpu0 = cpuTime()
					}
					if !get(b, rt, srv.URL) {
						b.FailNow()
					}
				}
				report(b, cpu0, d0)
			})
			b.Run("16-callers", func(b *testing.B) { sixteenCallers(b, c, srv.URL) })
			// With net/http's default of 2 idle connections per host: 16
			// callers then open and close connections all along, in
			// outbound's pool as in net/http's.
			b.Run("16-callers-default-idle", func(b *testing.B) {
				idlePerHost = 0
				defer func() { idlePerHost = 100 }()
				sixteenCallers(b, c, srv.URL)
			})
		})
	}
}

// sixteenCallers is the 16-callers run of BenchmarkEndToEnd.
func sixteenCallers(b *testing.B, c client, url string) {
	d0 := dials.Load()
	rt := c.new(b)
	warm(b, rt, url)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	callersDo(b, rt, url, b.N) // a failure is reported by get
	b.StopTimer()
	report(b, cpu0, d0)
}

// report adds the figures of an end-to-end run: requests/s, the client
// process's CPU time per request (user and system, all its threads) since
// cpu0, and the connections dialed since dials was d0.
func report(b *testing.B, cpu0, d0 int64) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	if cpu0 != 0 {
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	}
	b.ReportMetric(float64(dials.Load()-d0), "conns")
}

// get sends one GET and reads and closes the answer. It reports failure
// with b.Error, so it may run on any goroutine.
func get(b *testing.B, rt http.RoundTripper, url string) bool {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		b.Error(err)
		return false
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Error(err)
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Errorf("status %d, body error %v", resp.StatusCode, err)
		return false
	}
	return true
}

// warm opens the connections the callers will use, outside the measurement.
func warm(b *testing.B, rt http.RoundTripper, url string) {
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range 4 {
				get(b, rt, url)
			}
		})
	}
	wg.Wait()
}

// closing closes t's idle connections when tb ends.
func closing(tb testing.TB, t *http.Transport) *http.Transport {
	tb.Cleanup(t.CloseIdleConnections)
	return t
}

// pairedBlock is the number of requests of one block of
// BenchmarkEndToEndPaired, about 50 ms on 2 cores.
const pairedBlock = 2000

// BenchmarkEndToEndPaired measures outbound against bare net/http in one
// process, in alternating blocks of about pairedBlock requests from 16
// callers — bare then outbound, then outbound then bare, and so on, each
// client first in as many pairs as the other — so that a machine that slows
// down or speeds up for a second slows both alike. (BenchmarkEndToEnd runs
// each client in its own process, seconds apart: on a shared machine the
// ratio of one such pair moves by ±10 % and more.) b.N is the number of
// requests of each client. It reports each client's requests/s and client
// CPU per request over all its blocks, and their ratios, outbound ÷ bare.
// "bare-vs-bare" pairs two bare clients, each with its own http.Transport:
// what its ratios show is the measurement's own error. "endpoints" pairs
// outbound with Endpoints over a host of five addresses (127.0.0.2–6, one
// server process) against outbound by name, which dials the first;
// "by-name" pairs the latter with itself.
func BenchmarkEndToEndPaired(b *testing.B) {
	srv := startEchoServer(b)
	cs := clients()
	bare, ob := cs[0], cs[1]
	b.Run("16-callers", func(b *testing.B) { paired(b, bare, ob, srv.URL) })
	b.Run("16-callers-default-idle", func(b *testing.B) {
		idlePerHost = 0
		defer func() { idlePerHost = 100 }()
		paired(b, bare, ob, srv.URL)
	})
	b.Run("16-callers-bare-vs-bare", func(b *testing.B) { paired(b, bare, bare, srv.URL) })
	// One host of five addresses, all healthy: outbound with Endpoints
	// against outbound by name (which dials the first), and by name
	// against itself.
	for _, c := range []client{endpointsClient(), byNameClient()} {
		b.Run("16-callers-"+strings.TrimPrefix(c.name, "outbound-"), func(b *testing.B) {
			five := startEchoServer(b, "-also", "5")
			_, port, _ := net.SplitHostPort(strings.TrimPrefix(five.URL, "http://"))
			paired(b, byNameClient(), c, "http://"+pairedHost+":"+port+"/")
		})
	}
}

// pairedHost is the name of the five addresses of the 16-callers-endpoints
// runs: 127.0.0.2 to 127.0.0.6.
const pairedHost = "five.test"

var pairedNames = testkit.Names{pairedHost: testkit.Loopbacks(5)}

// byNameClient is outbound without Endpoints: pairedHost dialed as
// net/http dials a name, at its first address.
func byNameClient() client {
	return client{"outbound-by-name", func(tb testing.TB) http.RoundTripper {
		inner := innerTransport()
		dial := inner.DialContext
		inner.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if host, port, _ := net.SplitHostPort(addr); host == pairedHost {
				addr = net.JoinHostPort(pairedNames[pairedHost][0].String(), port)
			}
			return dial(ctx, network, addr)
		}
		t, err := outbound.New(outbound.Config{HTTPTransport: inner, Admission: outboundAdmissionConfig("")})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(t.Close)
		return t
	}}
}

// endpointsClient is outbound with Endpoints over pairedHost's five
// addresses.
func endpointsClient() client {
	return client{"outbound-endpoints", func(tb testing.TB) http.RoundTripper {
		t, err := outbound.New(outbound.Config{HTTPTransport: innerTransport(), Admission: outboundAdmissionConfig(""),
			Endpoints: &attempt.Endpoints{Resolver: pairedNames}})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(t.Close)
		return t
	}}
}

// paired is one run of BenchmarkEndToEndPaired: base against c.
func paired(b *testing.B, base, c client, url string) {
	rts := [2]http.RoundTripper{base.new(b), c.new(b)}
	for _, rt := range rts {
		warm(b, rt, url)
	}
	blocks := 2 * ((b.N + 2*pairedBlock - 1) / (2 * pairedBlock)) // even
	var wall, cpu [2]time.Duration
	var done [2]int
	b.ResetTimer()
	for k := range blocks {
		for j := range 2 {
			i := j
			if k%2 == 1 {
				i = 1 - j
			}
			n := (b.N - done[i]) / (blocks - k) // what is left, in equal parts
			c0, t0 := cpuTime(), time.Now()
			if !callersDo(b, rts[i], url, n) {
				b.FailNow()
			}
			wall[i] += time.Since(t0)
			cpu[i] += time.Duration(cpuTime() - c0)
			done[i] += n
		}
	}
	b.StopTimer()
	n := float64(b.N)
	rps := [2]float64{n / wall[0].Seconds(), n / wall[1].Seconds()}
	b.ReportMetric(rps[0], "base-req/s")
	b.ReportMetric(rps[1], "req/s")
	b.ReportMetric(rps[1]/rps[0], "req/s-ratio")
	b.ReportMetric(float64(cpu[0])/n, "base-cpu-ns/op")
	b.ReportMetric(float64(cpu[1])/n, "cpu-ns/op")
	b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "cpu-ratio")
}

// callersDo sends n GETs through rt from 16 goroutines, and reports whether
// every one succeeded.
func callersDo(b *testing.B, rt http.RoundTripper, url string, n int) bool {
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if !get(b, rt, url) {
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	return !failed.Load()
}
