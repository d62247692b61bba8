package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
)

// answeringDial dials an in-memory HTTP/1.1 upstream, so that a test runs
// in a synctest bubble: it answers each request after delay (in the
// bubble's time) with the status line answer gives for the address dialed,
// and closes the connection after the answer when closing is set.
func answeringDial(delay time.Duration, closing bool, answer func(addr string) string) func(context.Context, string, string) (net.Conn, error) {
	return testkit.PipeDial(func(addr string) string {
		time.Sleep(delay) // the upstream's work
		head := "HTTP/1.1 " + answer(addr) + "\r\nContent-Length: 2\r\n"
		if closing {
			head += "Connection: close\r\n"
		}
		return head + "\r\nok"
	})
}

// pipeDial dials an in-memory HTTP/1.1 upstream that answers "ok" for any
// host.
var pipeDial = answeringDial(0, false, func(string) string { return "200 OK" })

// An idle upstream's retry budget is forgotten with the rest of its state,
// and the hooks are told; looking a budget up creates none.
func TestAForgottenUpstreamTakesItsRetryBudgetWithIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var forgotten []string
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: pipeDial},
			UpstreamIdleTime: time.Minute, Hooks: outbound.Hooks{UpstreamForgotten: func(u string) { forgotten = append(forgotten, u) }}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		if _, ok := tr.Upstream("http://upstream.test:80"); ok {
			t.Fatal("a budget before any call")
		}
		req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if _, ok := tr.Upstream("http://upstream.test:80"); !ok {
			t.Fatal("no budget after a call")
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if _, ok := tr.Upstream("http://upstream.test:80"); ok || len(forgotten) != 1 || forgotten[0] != "http://upstream.test:80" {
			t.Fatalf("after 10 idle minutes: budget kept %v, forgotten %v", ok, forgotten)
		}
	})
}

// slowDial dials an in-memory HTTP/1.1 upstream that answers each request
// after delay, with status 503 for the host "sick.test" and 200 for any
// other; hits counts the requests to sick.test.
func slowDial(delay time.Duration, hits *atomic.Int64) func(context.Context, string, string) (net.Conn, error) {
	return answeringDial(delay, false, func(addr string) string {
		if strings.HasPrefix(addr, "sick.test") {
			hits.Add(1)
			return "503 Service Unavailable"
		}
		return "200 OK"
	})
}

func getURL(t *testing.T, tr *outbound.Transport, url string) (*http.Response, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// Regression: an upstream was forgotten while an attempt held its circuit
// permit — only bulkhead slots were checked — so, without a bulkhead, each
// failure of calls longer than UpstreamIdleTime went to a breaker already
// discarded, and the breaker never opened. An upstream is kept while any
// of its permits is held.
func TestAnUpstreamIsNeverForgottenWhileAnAttemptHoldsItsPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hits atomic.Int64
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: slowDial(10*time.Minute, &hits)},
			UpstreamIdleTime: time.Minute, MaxAttempts: 1,
			Admission: admission.Config{Circuit: circuit.Config{WindowSize: 3, MinimumCalls: 3, WaitInOpen: time.Hour}}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for range 6 {
			getURL(t, tr, "http://sick.test/")
		}
		if n := hits.Load(); n != 3 {
			t.Fatalf("the upstream got %d calls, want 3: the breaker should open after three failures", n)
		}
	})
}

// Regression: MaxUpstreams made room by forgetting, among upstreams that
// held no permit, one chosen at random among those last used in the same
// sweep — a CLOSED breaker in active use too: against a 503-only upstream,
// 200 of 200 calls got through when 16 other hosts were called between
// them, its breaker's window erased each time. A breaker with failures in
// its window is not forgotten to make room.
func TestMaxUpstreamsNeverForgetsABreakerWithFailuresInItsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hits atomic.Int64
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: slowDial(0, &hits)},
			MaxUpstreams: 4, MaxAttempts: 1,
			Admission: admission.Config{Circuit: circuit.Config{WindowSize: 10, MinimumCalls: 5, WaitInOpen: time.Hour}}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for range 20 {
			getURL(t, tr, "http://sick.test/")
			for h := range 16 {
				if _, err := getURL(t, tr, fmt.Sprintf("http://h%d.test/", h)); err != nil {
					t.Fatalf("a healthy host: %v", err)
				}
			}
		}
		if n := hits.Load(); n != 5 {
			t.Fatalf("the sick upstream got %d calls of 20, want 5: its breaker should open after five failures", n)
		}
	})
}

// Regression: a call refused before its upstream had any state (an
// unsupported scheme, ErrTooManyUpstreams) made a retry budget all the
// same, kept for good outside MaxUpstreams (163–166 B per refused host).
func TestACallRefusedBeforeItsUpstreamExistsKeepsNoRetryBudget(t *testing.T) {
	tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: pipeDial}, MaxUpstreams: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := getURL(t, tr, "ftp://files.test/x"); err == nil {
		t.Fatal("an ftp URL was sent")
	}
	ftp, _ := http.NewRequest(http.MethodGet, "ftp://files.test/x", nil)
	if _, ok := outbound.BudgetOf(tr, tr.UpstreamKey(ftp)); ok || len(tr.Upstreams()) != 0 {
		t.Errorf("state kept for a URL that cannot be sent: upstreams %v", tr.Upstreams())
	}
	if _, err := getURL(t, tr, "http://one.test/"); err != nil {
		t.Fatal(err)
	}
	b, _ := tr.Breaker("http://one.test:80")
	b.SetState(circuit.ForcedOpen) // held: it cannot be forgotten
	if _, err := getURL(t, tr, "http://two.test/"); !errors.Is(err, classify.ErrTooManyUpstreams) {
		t.Fatalf("a second upstream: %v, want ErrTooManyUpstreams", err)
	}
	if _, ok := outbound.BudgetOf(tr, "http://two.test:80"); ok {
		t.Error("a retry budget for an upstream refused by MaxUpstreams")
	}
}

// Regression: a host in full-width letters, which net/http dials in ASCII
// (IDNA), failed NotSent at DNS: "ｌｏｃａｌｈｏｓｔ" is localhost.
func TestAnInternationalizedHostIsDialedAsNetHTTPDialsIt(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	port := s.URL[strings.LastIndex(s.URL, ":")+1:]
	url := "http://ｌｏｃａｌｈｏｓｔ:" + port + "/"
	c := newClient(t, s, outbound.Config{})
	resp, err := getURL(t, c, url)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("outbound: %v", err)
	}
	if got := c.Upstreams(); len(got) != 1 || got[0] != "http://localhost:"+port {
		t.Fatalf("upstreams %v, want localhost's", got)
	}
	bare, err := http.Get(url)
	if err != nil {
		t.Fatalf("net/http: %v", err)
	}
	bare.Body.Close()
}

// Regression: an upstream whose last connection closed was forgotten at
// once if its breaker's window held no failure, with what its throttle and
// its retry budget had learned: when its idle connection timed out
// (IdleConnTimeout), or the upstream or the caller closed it after an
// answer, the throttle started afresh and a drained retry budget was full
// again. Only an upstream that has learned nothing is forgotten with its
// last connection; the others are kept for the idle time.
func TestAnUpstreamThatLearnedSomethingIsNotForgottenWithItsLastConnection(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status string
		cfg    outbound.Config
		kept   bool
	}{
		{"a throttle refusing", "429 Too Many Requests", outbound.Config{MaxAttempts: 1,
			Admission: admission.Config{Throttle: throttle.Config{Enabled: true}}}, true},
		// 503s the breaker does not count: only the budget learns.
		{"a retry budget spent", "503 Service Unavailable", outbound.Config{MaxAttempts: 2,
			IsFailure: func(*http.Response) bool { return false }}, true},
		{"nothing learned", "200 OK", outbound.Config{Admission: admission.Config{Throttle: throttle.Config{Enabled: true}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := tc.cfg
				cfg.HTTPTransport = &http.Transport{DialContext: answeringDial(0, false, func(string) string { return tc.status })}
				cfg.IdleConnTimeout, cfg.UpstreamIdleTime = 10*time.Second, time.Hour
				var forgotten atomic.Int64
				cfg.Hooks.UpstreamForgotten = func(string) { forgotten.Add(1) }
				tr, err := outbound.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				refused := 0
				for range 30 {
					if _, err := getURL(t, tr, "http://upstream.test/"); errors.Is(err, throttle.ErrThrottled) {
						refused++
					}
				}
				if tc.cfg.Admission.Throttle.Enabled && tc.kept && refused == 0 {
					t.Fatal("30 answers of 429 and the throttle refused none")
				}
				time.Sleep(time.Minute) // the idle connection times out, the upstream does not
				synctest.Wait()
				if _, kept := tr.Upstream("http://upstream.test:80"); kept != tc.kept || (forgotten.Load() == 0) != tc.kept {
					t.Fatalf("kept %v once its connection was gone (forgotten %d times), want %v", kept, forgotten.Load(), tc.kept)
				}
			})
		})
	}
}
