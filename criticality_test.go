package outbound_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/retry"
)

// failingFirst answers 503 to the first attempt of each call and 200 to
// the others: a call is told by its URL's path.
func failingFirst(t *testing.T) *httptest.Server {
	var mu sync.Mutex
	seen := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		again := seen[r.URL.Path]
		seen[r.URL.Path] = true
		mu.Unlock()
		if !again {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestASheddableCallIsNotRetriedWhileTheRetryBudgetIsLow: with the budget
// at 70 % — enough for any other call's retry (above half) — a sheddable
// call's 503 is not retried, and a default call's is.
func TestASheddableCallIsNotRetriedWhileTheRetryBudgetIsLow(t *testing.T) {
	srv := failingFirst(t)
	c := deadlineClient(t, outbound.Config{Budget: retry.BudgetConfig{MaxTokens: 10}})
	warm, _ := http.NewRequest(http.MethodGet, srv.URL+"/warm", nil) // the upstream's state exists
	if _, _, err := do(t, c, warm); err != nil {
		t.Fatal(err)
	}
	b, ok := outbound.BudgetOf(c, "http://"+srv.Listener.Addr().String())
	if !ok {
		t.Fatal("no budget")
	}
	for b.Above(0.75) {
		b.OnFailure()
	}
	if !b.Allows() {
		t.Fatalf("budget at %v: below half", b.Tokens())
	}
	req, _ := http.NewRequestWithContext(criticality.With(context.Background(), criticality.Sheddable), http.MethodGet, srv.URL+"/sheddable", nil)
	out, status, _ := do(t, c, req)
	if status != 503 || len(out.Attempts) != 1 || out.Reason != retry.BudgetExhausted {
		t.Fatalf("sheddable: status %d, %d attempts, %v; want the 503, not retried (budget)", status, len(out.Attempts), out.Reason)
	}
	if !b.Allows() {
		t.Fatalf("budget at %v after the sheddable call: below half", b.Tokens())
	}
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/default", nil)
	if out, status, _ := do(t, c, req); status != 200 || len(out.Attempts) != 2 {
		t.Fatalf("default: status %d, %d attempts; want the retry's 200", status, len(out.Attempts))
	}
}

// TestCriticalityNeverChangesBreakerStatistics: the same answers to
// sheddable, default and critical calls leave the same breaker window.
func TestCriticalityNeverChangesBreakerStatistics(t *testing.T) {
	var seen []string
	for _, l := range []criticality.Level{criticality.Sheddable, criticality.Default, criticality.Critical} {
		srv := failingFirst(t)
		c := deadlineClient(t, outbound.Config{MaxAttempts: 1})
		for i := range 20 {
			req, _ := http.NewRequestWithContext(criticality.With(context.Background(), l), http.MethodGet, fmt.Sprintf("%s/%d", srv.URL, i/2), nil)
			do(t, c, req)
		}
		m := c.Breakers()["http://"+srv.Listener.Addr().String()]
		seen = append(seen, fmt.Sprintf("%v calls %d failed %d rate %.0f", m.State, m.Calls, m.Failed, m.FailureRate))
	}
	if seen[0] != seen[1] || seen[1] != seen[2] || seen[0] != "CLOSED calls 20 failed 10 rate -1" {
		t.Fatalf("breakers after sheddable, default, critical calls: %q", seen)
	}
}

// TestTheCriticalityIsSentOnlyToTheHostsNamed: a sheddable call says so to
// a host SendCriticality names, an unmarked one says "default", and a host
// not named gets nothing; the caller's request is not changed.
func TestTheCriticalityIsSentOnlyToTheHostsNamed(t *testing.T) {
	srv, got := deadlineServer(t, "X-Criticality", 0)
	named := deadlineClient(t, outbound.Config{SendCriticality: &outbound.SendCriticality{Header: "X-Criticality", Hosts: []string{"127.0.0.1"}}})
	other := deadlineClient(t, outbound.Config{SendCriticality: &outbound.SendCriticality{Header: "X-Criticality", Hosts: []string{"*.internal"}}})
	for _, c := range []*outbound.Transport{named, other} {
		for _, ctx := range []context.Context{criticality.With(context.Background(), criticality.Sheddable), context.Background()} {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			if _, _, err := do(t, c, req); err != nil {
				t.Fatal(err)
			}
			if len(req.Header) != 0 {
				t.Fatalf("the caller's request was changed: %v", req.Header)
			}
		}
	}
	if v := fmt.Sprint(got()); v != "[sheddable default  ]" {
		t.Fatalf("sent %s, want sheddable and default to the host named, nothing to the other", v)
	}
	if _, err := outbound.New(outbound.Config{SendCriticality: &outbound.SendCriticality{Header: "X-Criticality"}}); err == nil ||
		!strings.Contains(err.Error(), "SendCriticality.Hosts") {
		t.Fatalf("no hosts: %v", err)
	}
}

// TestCriticalityNeverChangesEjectionStatistics: the same answers to
// sheddable, default and critical calls eject an endpoint after the same
// failures, for the same time, and let it back at the same time.
func TestCriticalityNeverChangesEjectionStatistics(t *testing.T) {
	var seen []string
	for _, l := range []criticality.Level{criticality.Sheddable, criticality.Default, criticality.Critical} {
		synctest.Test(t, func(t *testing.T) {
			ips := testkit.Loopbacks(3)
			all := testkit.AddrPorts(ips, 80)
			sick := all[0]
			f := testkit.NewFleet(all...)
			f.Set(sick, 503)
			var told []string
			start := time.Now()
			tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: f.Dial}, MaxAttempts: 1,
				Endpoints: &attempt.Endpoints{Resolver: testkit.Names{"svc.test": ips},
					Ejection: attempt.Ejection{ConsecutiveFailures: 3, BaseTime: 10 * time.Second, MaxShare: 0.5},
					OnEject: func(_, ep string, d time.Duration) {
						told = append(told, fmt.Sprintf("%s for %v at %v", ep, d, time.Since(start).Truncate(time.Second)))
					}}})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			ctx := criticality.With(context.Background(), l)
			var got []int
			for range 3 {
				for range 100 {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc.test/", nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						resp.Body.Close()
					}
				}
				got = append(got, f.Received(sick))
				time.Sleep(11 * time.Second)
			}
			seen = append(seen, fmt.Sprintf("received %v, told %q", got, told))
		})
	}
	want := `received [3 6 6], told ["127.0.0.2:80 for 10s at 0s" "127.0.0.2:80 for 0s at 11s" "127.0.0.2:80 for 20s at 11s"]`
	if seen[0] != seen[1] || seen[1] != seen[2] || seen[0] != want {
		t.Fatalf("ejections after sheddable, default, critical calls:\n%s\nwant each\n%s", strings.Join(seen, "\n"), want)
	}
}
