package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

var deadlinesRun = flag.Bool("deadlines", false, "run TestDeadlines: callers whose deadlines are shorter than the upstream's slow path (about 30 s)")

const (
	deadlineFast      = 10 * time.Millisecond  // most answers, and the median
	deadlineSlow      = 250 * time.Millisecond // the slow path: longer than any caller waits
	deadlineSlowShare = 0.2
	deadlineFailShare = 0.1 // of the fast answers: a 503, which a GET retries
	deadlineMaxLeft   = 100 * time.Millisecond
	deadlineHeader    = "X-Expected-Rq-Timeout-Ms"
	callerDeadlineHd  = "X-Test-Caller-Deadline" // the caller's deadline, for the server's accounts only
)

// deadlineUpstream does each request's work — a fast or a slow path, drawn
// at random — without watching its connection (as work handed to a
// database does not), stopping only at the deadline the request carries in
// deadlineHeader, if any. It counts the work it did after the caller's
// deadline.
type deadlineUpstream struct {
	srv               *httptest.Server
	requests, tooLate atomic.Int64
	wasted, work      atomic.Int64 // ns
	stoppedByDeadline atomic.Int64
}

func newDeadlineUpstream(tb testing.TB) *deadlineUpstream {
	u := &deadlineUpstream{}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		u.requests.Add(1)
		ns, _ := strconv.ParseInt(r.Header.Get(callerDeadlineHd), 10, 64)
		caller := time.Unix(0, ns)
		work, status := deadlineFast, http.StatusOK
		switch x := rand.Float64(); {
		case x < deadlineSlowShare:
			work = deadlineSlow
		case x < deadlineSlowShare+deadlineFailShare:
			status = http.StatusServiceUnavailable
		}
		stop := arrived.Add(work)
		if v := r.Header.Get(deadlineHeader); v != "" {
			if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
				if own := arrived.Add(time.Duration(ms) * time.Millisecond); own.Before(stop) {
					stop, status = own, http.StatusGatewayTimeout // gave up: no answer in time
					u.stoppedByDeadline.Add(1)
				}
			}
		}
		time.Sleep(time.Until(stop))
		end := time.Now()
		u.work.Add(int64(end.Sub(arrived)))
		if end.After(caller) {
			from := arrived
			if caller.After(arrived) {
				from = caller
			}
			u.wasted.Add(int64(end.Sub(from)))
		}
		w.WriteHeader(status)
	}))
	tb.Cleanup(u.srv.Close)
	return u
}

// TestDeadlines sends calls whose deadlines are spread evenly between 2 and
// 100 ms to an upstream whose answers take 10 ms (one in ten a 503), or
// 250 ms on its slow path (one in five), from 16 callers, through bare
// net/http and through outbound with neither, either or both of the
// deadline sent on (Config.Deadline) and the early exit
// (Config.FinishQuantile), and reports the upstream's work after the
// callers gave up, and the attempts begun with less than its median latency
// left (as a share of the requests it received).
func TestDeadlines(t *testing.T) {
	if !*deadlinesRun {
		t.Skip("run with -deadlines (bench/run.sh does)")
	}
	type client struct {
		name string
		cfg  *outbound.Config // nil: bare net/http
	}
	send := &outbound.Deadline{Header: deadlineHeader, Hosts: []string{"127.0.0.1"}}
	clients := []client{
		{"net/http", nil},
		{"outbound, neither", &outbound.Config{FinishQuantile: -1}},
		{"outbound, deadline sent", &outbound.Config{FinishQuantile: -1, Deadline: send}},
		{"outbound, early exit", &outbound.Config{}},
		{"outbound, both", &outbound.Config{Deadline: send}},
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%-25s %7s %8s %9s %12s %14s %16s %13s\n", "CLIENT", "CALLS", "SUCCESS", "REQUESTS", "NOT BEGUN",
		"WORK/CALL", "WASTED/CALL", "BEGUN LATE")
	for _, c := range clients {
		up := newDeadlineUpstream(t)
		var late atomic.Int64 // attempts begun with less than the median latency left
		lateIf := func(ctx context.Context) {
			if dl, ok := ctx.Deadline(); ok && time.Until(dl) < deadlineFast {
				late.Add(1)
			}
		}
		var rt http.RoundTripper = &http.Transport{MaxIdleConnsPerHost: 64}
		bare := c.cfg == nil
		if !bare {
			cfg := *c.cfg
			cfg.Hooks.AttemptStart = func(ctx context.Context, _ outbound.AttemptInfo) context.Context { lateIf(ctx); return ctx }
			cfg.HTTPTransport = &http.Transport{MaxIdleConnsPerHost: 64}
			cfg.Backoff = retry.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}
			tr, err := outbound.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			rt = tr
		}
		var whyMu sync.Mutex
		why := map[string]int{}
		run := func(d time.Duration) (calls, ok, notBegun int64) {
			var wg sync.WaitGroup
			stop := time.Now().Add(d)
			for range 16 {
				wg.Go(func() {
					for time.Now().Before(stop) {
						left := 2*time.Millisecond + rand.N(deadlineMaxLeft-2*time.Millisecond)
						ctx, cancel := context.WithTimeout(context.Background(), left)
						dl, _ := ctx.Deadline()
						req, _ := http.NewRequestWithContext(ctx, http.MethodGet, up.srv.URL, nil)
						req.Header.Set(callerDeadlineHd, strconv.FormatInt(dl.UnixNano(), 10))
						if bare {
							lateIf(ctx)
						}
						var resp *http.Response
						var err error
						if tr, ok := rt.(*outbound.Transport); ok {
							var o *outcome.Outcome
							resp, o, err = tr.Do(req)
							if o != nil && (err != nil || resp.StatusCode != 200) {
								whyMu.Lock()
								why[o.Why()]++
								whyMu.Unlock()
							}
						} else {
							resp, err = rt.RoundTrip(req)
						}
						atomic.AddInt64(&calls, 1)
						if err == nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if resp.StatusCode == 200 {
								atomic.AddInt64(&ok, 1)
							}
						} else if o, isOut := outbound.OutcomeOf(err); isOut && len(o.Attempts) == 0 {
							atomic.AddInt64(&notBegun, 1)
						}
						cancel()
					}
				})
			}
			wg.Wait()
			return
		}
		run(time.Second) // warm-up: connections, and the upstream's latencies
		time.Sleep(deadlineSlow)
		up.requests.Store(0)
		late.Store(0)
		up.wasted.Store(0)
		up.work.Store(0)
		calls, ok, notBegun := run(5 * time.Second)
		time.Sleep(deadlineSlow) // the last requests' work ends
		fmt.Fprintf(&out, "%-25s %7d %7.2f%% %9d %11.2f%% %14s %16s %12.2f%%\n", c.name, calls, 100*float64(ok)/float64(calls), up.requests.Load(),
			100*float64(notBegun)/float64(calls),
			(time.Duration(up.work.Load()) / time.Duration(calls)).Round(10*time.Microsecond),
			(time.Duration(up.wasted.Load()) / time.Duration(calls)).Round(10*time.Microsecond),
			100*float64(late.Load())/float64(up.requests.Load()))
		if len(why) > 0 {
			fmt.Fprintln(&out, "    calls without a 200, why:", why)
		}
	}
	t.Log("\n" + out.String())
}
