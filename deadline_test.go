package outbound_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// deadlineServer answers 503 to the first fails requests, then 200, and
// keeps the value of header of each request it got.
func deadlineServer(t *testing.T, header string, fails int) (*httptest.Server, func() []string) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get(header))
		n := len(got)
		mu.Unlock()
		if n <= fails {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), got...) }
}

func deadlineClient(t *testing.T, cfg outbound.Config) *outbound.Transport {
	t.Helper()
	cfg.Backoff = retry.Backoff{Initial: time.Millisecond, Max: time.Millisecond, Jitter: -1}
	c, err := outbound.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestThePropagatedDeadlineNeverExceedsTheTimeLeft: each attempt says how
// long it has left — never more than was left when it started (the hook
// sees it start before the header is written), the attempt's own timeout
// when that is sooner, less for each retry — and the caller's request is
// not changed.
func TestThePropagatedDeadlineNeverExceedsTheTimeLeft(t *testing.T) {
	for _, tc := range []struct {
		name           string
		call, attempt  time.Duration
		wantAtMostMs   int64
		format         func(time.Duration) string
		parse          func(string) (int64, error)
		header         string
		wantAttempts   int
		firstAtLeastMs int64
	}{
		{name: "call deadline, milliseconds", call: 5 * time.Second, wantAtMostMs: 5000, header: "X-Envoy-Expected-Rq-Timeout-Ms",
			parse: func(v string) (int64, error) { return strconv.ParseInt(v, 10, 64) }, wantAttempts: 3, firstAtLeastMs: 4000},
		{name: "attempt timeout sooner, grpc-timeout", call: 5 * time.Second, attempt: 800 * time.Millisecond, wantAtMostMs: 800,
			format: outbound.GRPCTimeout, header: "Grpc-Timeout", wantAttempts: 3, firstAtLeastMs: 300,
			parse: func(v string) (int64, error) {
				n, err := strconv.ParseInt(strings.TrimSuffix(v, "u"), 10, 64)
				return n / 1000, err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, got := deadlineServer(t, tc.header, 2)
			var mu sync.Mutex
			var starts []time.Time
			c := deadlineClient(t, outbound.Config{AttemptTimeout: tc.attempt,
				Deadline: &outbound.Deadline{Header: tc.header, Format: tc.format, Hosts: []string{"127.0.0.1"}},
				Hooks: outbound.Hooks{AttemptStart: func(ctx context.Context, _ outbound.AttemptInfo) context.Context {
					mu.Lock()
					starts = append(starts, time.Now())
					mu.Unlock()
					return ctx
				}}})
			ctx, cancel := context.WithTimeout(context.Background(), tc.call)
			defer cancel()
			end, _ := ctx.Deadline()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			out, status, err := do(t, c, req)
			if err != nil || status != 200 || len(out.Attempts) != tc.wantAttempts {
				t.Fatalf("status %d, %d attempts, err %v", status, len(out.Attempts), err)
			}
			if len(req.Header) != 0 {
				t.Errorf("the caller's request was changed: %v", req.Header)
			}
			values := got()
			var prev int64 = 1 << 62
			for i, v := range values {
				ms, err := tc.parse(v)
				if err != nil {
					t.Fatalf("attempt %d sent %q: %v", i+1, v, err)
				}
				left := end.Sub(starts[i]).Milliseconds()
				if tc.attempt > 0 {
					left = min(left, tc.attempt.Milliseconds())
				}
				if ms > left || ms > tc.wantAtMostMs || ms > prev {
					t.Errorf("attempt %d sent %q (%d ms): more than the %d ms it had left when it started, or than the one before (%d)", i+1, v, ms, left, prev)
				}
				if i == 0 && ms < tc.firstAtLeastMs {
					t.Errorf("attempt 1 sent %d ms, far less than it had", ms)
				}
				prev = ms
			}
		})
	}
}

// TestThePropagatedDeadlineIsAbsentForHostsNotAllowed: a host the
// configuration does not name gets no deadline, nor does a call without
// one; "*.domain" names the hosts under it, not the domain itself.
func TestThePropagatedDeadlineIsAbsentForHostsNotAllowed(t *testing.T) {
	srv, got := deadlineServer(t, "Request-Timeout", 0)
	c := deadlineClient(t, outbound.Config{Deadline: &outbound.Deadline{Header: "Request-Timeout", Format: outbound.Seconds,
		Hosts: []string{"api.internal", "*.svc.cluster.local", "*.127.0.0.1"}}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if _, status, err := do(t, c, req); err != nil || status != 200 {
		t.Fatal(status, err)
	}
	if v := got(); len(v) != 1 || v[0] != "" {
		t.Errorf("a host not named got %q", v)
	}

	allowed := deadlineClient(t, outbound.Config{Deadline: &outbound.Deadline{Header: "Request-Timeout", Format: outbound.Seconds, Hosts: []string{"127.0.0.1"}}})
	req, _ = http.NewRequest(http.MethodGet, srv.URL, nil) // no deadline
	if _, _, err := do(t, allowed, req); err != nil {
		t.Fatal(err)
	}
	if v := got(); len(v) != 2 || v[1] != "" {
		t.Errorf("a call without a deadline sent %q", v[1:])
	}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if _, _, err := do(t, allowed, req); err != nil {
		t.Fatal(err)
	}
	if v := got(); len(v) != 3 || !strings.HasPrefix(v[2], "4.") && !strings.HasPrefix(v[2], "5.") {
		t.Errorf("the host named got %q, want about 4.9xx seconds", v[2:])
	}

	for host, want := range map[string]bool{"api.internal": true, "API.Internal": true, "a.svc.cluster.local": true,
		"b.a.svc.cluster.local": true, "svc.cluster.local": false, "evilsvc.cluster.local": false, "api.internal.evil": false, "example.com": false} {
		if got := outbound.DeadlineSentTo(c, host); got != want {
			t.Errorf("host %q gets the deadline: %v, want %v", host, got, want)
		}
	}
}

func TestDeadlineFormatsRoundDown(t *testing.T) {
	for _, tc := range []struct {
		d                time.Duration
		ms, grpc, second string
	}{
		{0, "0", "0n", "0.000"},
		{-time.Second, "0", "0n", "0.000"},
		{1499*time.Millisecond + 999*time.Microsecond, "1499", "1499999u", "1.499"},
		{99999999 * time.Nanosecond, "99", "99999999n", "0.099"},
		{36 * time.Hour, "129600000", "129600S", "129600.000"},
		{30000 * time.Hour, "108000000000", "1800000M", "108000000.000"},
		{time.Duration(1<<63 - 1), "9223372036854", "2562047H", "9223372036.854"},
	} {
		if got := outbound.Milliseconds(tc.d); got != tc.ms {
			t.Errorf("Milliseconds(%v) = %q, want %q", tc.d, got, tc.ms)
		}
		if got := outbound.GRPCTimeout(tc.d); got != tc.grpc {
			t.Errorf("GRPCTimeout(%v) = %q, want %q", tc.d, got, tc.grpc)
		}
		if got := outbound.Seconds(tc.d); got != tc.second {
			t.Errorf("Seconds(%v) = %q, want %q", tc.d, got, tc.second)
		}
	}
}

func TestAnInvalidDeadlineConfigurationNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		d     outbound.Deadline
		field string
	}{
		{outbound.Deadline{Hosts: []string{"a"}}, "Deadline.Header"},
		{outbound.Deadline{Header: "Bad Header", Hosts: []string{"a"}}, "Deadline.Header"},
		{outbound.Deadline{Header: "X-Timeout"}, "Deadline.Hosts"},
		{outbound.Deadline{Header: "X-Timeout", Hosts: []string{"*."}}, "Deadline.Hosts"},
		{outbound.Deadline{Header: "X-Timeout", Hosts: []string{"a.*.b"}}, "Deadline.Hosts"},
	} {
		if _, err := outbound.New(outbound.Config{Deadline: &tc.d}); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: %v, want an error naming %s", tc.d, err, tc.field)
		}
	}
}

// TestAnAttemptThatCannotFinishIsNotBegunAndTheCallIsNotCommitted: once an
// upstream's answers take about 100 ms, a call with 50 ms left is not sent
// — it ends at once, not committed, saying why — while one with 150 ms is;
// a retry whose attempt would not fit in what is left is not made; a call
// without a deadline, or with FinishQuantile negative, is not judged.
func TestAnAttemptThatCannotFinishIsNotBegunAndTheCallIsNotCommitted(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "FinishQuantile negative"}[off], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var status atomic.Value
				status.Store("200 OK")
				dial, served := answering(func() string {
					time.Sleep(100 * time.Millisecond)
					return "HTTP/1.1 " + status.Load().(string) + "\r\nContent-Length: 0\r\n\r\n"
				})
				cfg := outbound.Config{HTTPTransport: &http.Transport{DialContext: dial},
					Backoff: retry.Backoff{Initial: time.Millisecond, Max: time.Millisecond, Jitter: -1}}
				if off {
					cfg.FinishQuantile = -1
				}
				tr, err := outbound.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				call := func(left time.Duration) (*outcome.Outcome, error) {
					ctx, cancel := context.WithTimeout(context.Background(), left)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.test/", nil)
					resp, out, err := tr.Do(req)
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
					return out, err
				}
				for range 96 { // the upstream's recent answers: 100 ms each
					if _, err := call(time.Second); err != nil {
						t.Fatal(err)
					}
				}

				before, start := served.Load(), time.Now()
				out, err := call(50 * time.Millisecond)
				if off {
					if served.Load() != before+1 || !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("off: sent %d, %v; want sent, and the deadline exceeded", served.Load()-before, err)
					}
					time.Sleep(100 * time.Millisecond) // the upstream ends its work
					return
				}
				if !errors.Is(err, outcome.ErrCannotFinish) || !errors.Is(err, outcome.ErrNotCommitted) || out.End != outcome.CannotFinish ||
					out.Commit != outcome.NotCommitted || len(out.Attempts) != 0 {
					t.Fatalf("50 ms left: %v, end %v, commit %v, %d attempts; want not begun, not committed, CannotFinish", err, out.End, out.Commit, len(out.Attempts))
				}
				if served.Load() != before || time.Since(start) != 0 {
					t.Fatalf("the call was sent (%d) or waited (%v)", served.Load()-before, time.Since(start))
				}
				if out.Why() != "too little time left before the deadline for an attempt" {
					t.Errorf("Why() = %q", out.Why())
				}
				if _, err := call(150 * time.Millisecond); err != nil {
					t.Fatalf("150 ms left: %v, want an answer", err)
				}
				req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil) // no deadline
				if resp, err := tr.RoundTrip(req); err != nil {
					t.Fatalf("no deadline: %v", err)
				} else {
					resp.Body.Close()
				}

				// A retry: 180 ms left, the first attempt answers 503 after
				// 100 ms; the 80 ms left are less than an attempt takes.
				status.Store("503 Service Unavailable")
				before = served.Load()
				out, _ = call(180 * time.Millisecond)
				if served.Load() != before+1 || out.Reason != retry.DeadlineTooClose || len(out.Attempts) != 1 {
					t.Fatalf("retry: %d sent, reason %v, %d attempts; want 1 sent and no retry (DeadlineTooClose)", served.Load()-before, out.Reason, len(out.Attempts))
				}
			})
		})
	}
}

// TestAHedgeThatCannotFinishIsNotSent: a hedge due 60 ms into a call with
// 150 ms left would have 90 ms, less than the upstream's answers take
// (100 ms): it is not sent, while with a second left it is.
func TestAHedgeThatCannotFinishIsNotSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dial, served := answering(func() string {
			time.Sleep(100 * time.Millisecond)
			return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
		})
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: dial},
			Hedging: &outbound.Hedging{Delay: 60 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		call := func(ctx context.Context, left time.Duration) *outcome.Outcome {
			ctx, cancel := context.WithTimeout(ctx, left)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.test/", nil)
			resp, out, err := tr.Do(req)
			if err != nil {
				t.Fatalf("%v left: %v", left, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return out
		}
		for range 96 { // unhedged: the upstream's recent answers, 100 ms each
			call(outbound.WithHedging(context.Background(), nil), time.Second)
		}
		before := served.Load()
		if out := call(context.Background(), 150*time.Millisecond); len(out.Attempts) != 1 || served.Load() != before+1 {
			t.Fatalf("150 ms left: %d attempts, %d sent; want the hedge not sent", len(out.Attempts), served.Load()-before)
		}
		before = served.Load()
		if out := call(context.Background(), time.Second); len(out.Attempts) != 2 || !out.Attempts[0].Hedge && !out.Attempts[1].Hedge {
			t.Fatalf("a second left: %d attempts; want a hedge", len(out.Attempts))
		}
		time.Sleep(time.Second)
	})
}
