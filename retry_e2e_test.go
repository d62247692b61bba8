package outbound_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// zeros is an endless stream of zero bytes: a body that exists nowhere in
// memory as a whole.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// A 64 MiB streamed PUT with a one-shot body, answered 503: it is not
// retried (its body cannot be produced again) and is never buffered — the
// heap stays flat while it streams.
func TestAOneShotStreamedPutAnswered503IsNotRetriedAndNotBuffered(t *testing.T) {
	for _, p := range []outboundtest.Proto{outboundtest.HTTP1, outboundtest.H2C} {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.Respond(503))
			c := newClient(t, s, outbound.Config{})
			const size = 64 << 20
			req, err := http.NewRequest(http.MethodPut, s.URL+"/blob", io.NopCloser(io.LimitReader(zeros{}, size)))
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = size
			req.Header.Set(outboundtest.IDHeader, "blob")

			runtime.GC()
			var base runtime.MemStats
			runtime.ReadMemStats(&base)
			stop := make(chan struct{})
			var peak atomic.Uint64
			var wg sync.WaitGroup
			wg.Go(func() {
				var m runtime.MemStats
				for {
					runtime.ReadMemStats(&m)
					if m.HeapAlloc > peak.Load() {
						peak.Store(m.HeapAlloc)
					}
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
			})
			out, status, err := do(t, c, req)
			close(stop)
			wg.Wait()

			if err != nil || status != 503 || len(out.Attempts) != 1 || out.Reason != retry.OneShotBody {
				t.Fatalf("status %d err %v outcome %v", status, err, out)
			}
			if got := s.Executions("blob"); got != 1 {
				t.Fatalf("executions %d", got)
			}
			grew := int64(peak.Load()) - int64(base.HeapAlloc)
			t.Logf("heap grew by at most %d KiB while streaming 64 MiB", grew>>10)
			if grew > 16<<20 {
				t.Fatalf("heap grew by %d MiB while streaming a 64 MiB body: it was buffered", grew>>20)
			}
		})
	}
}

// A 503 with Retry-After: 30 on a call with a 2 s deadline comes back to the
// caller at once: the wait cannot fit, so it is not started.
func TestA503WithRetryAfterBeyondTheDeadlineIsReturnedAtOnce(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.Respond(503, "Retry-After", "30"))
			c := newClient(t, s, outbound.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			out, status, err := do(t, c, newRequest(t, ctx, s, noBody, "x"))
			if ctx.Err() != nil {
				t.Fatal("the call returned only after its deadline")
			}
			if err != nil || status != 503 || len(out.Attempts) != 1 || out.Reason != retry.RetryAfterBeyondDeadline {
				t.Fatalf("status %d err %v outcome %v", status, err, out)
			}
		})
	}
}

func TestARetryAfterInsideTheDeadlineIsWaitedFor(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	s.Enqueue(outboundtest.Respond(429, "Retry-After", "1"))
	c := newClient(t, s, outbound.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, status, err := do(t, c, newRequest(t, ctx, s, noBody, "x"))
	if err != nil || status != 200 || len(out.Attempts) != 2 || out.Attempts[0].Wait != time.Second {
		t.Fatalf("status %d err %v outcome %v", status, err, out)
	}
}

// With the upstream down, a burst of calls makes at most the budgeted number
// of retries: the upstream counts the attempts.
func TestABurstAgainstADeadUpstreamStaysWithinTheRetryBudget(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	s.SetDefault(outboundtest.Respond(503))
	c := newClient(t, s, outbound.Config{MaxAttempts: 5, Budget: retry.BudgetConfig{MaxTokens: 10, TokenRatio: 0.1}})
	const calls = 60
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() { do(t, c, newRequest(t, context.Background(), s, noBody, "burst")) })
	}
	wg.Wait()
	retries := s.Received("burst") - calls
	t.Logf("%d calls, %d retries", calls, retries)
	// Without a budget: 4 retries per call, 240. With 10 tokens, retries
	// stop once half are spent; a few in flight at that moment get through.
	if retries > 10 {
		t.Fatalf("%d retries against a dead upstream", retries)
	}
}

func TestGeneratedIdempotencyKeyMakesAnAmbiguousPostRetryable(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		first := len(keys) == 1
		mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		if first { // processed, then the connection dies: ambiguous
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		w.WriteHeader(201)
	}))
	defer srv.Close()
	c, err := outbound.New(outbound.Config{IdempotencyKeys: true, Backoff: retry.Backoff{Initial: 1, Max: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("order"))
	resp, out, err := c.Do(req)
	if err != nil {
		t.Fatalf("err %v outcome %v", err, out)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] {
		t.Fatalf("status %d, keys %q: want the same key on both attempts", resp.StatusCode, keys)
	}
	if len(keys[0]) != 38 || keys[0][0] != '"' || keys[0][37] != '"' {
		t.Fatalf("key %s is not a quoted UUID (a String structured field)", keys[0])
	}
	if req.Header.Get("Idempotency-Key") != "" {
		t.Fatal("the caller's request was modified")
	}
}

// Between attempts the previous answer's body is drained and closed, so the
// connection is reused for the retry.
func TestRetriedAnswersAreDrainedAndTheirConnectionReused(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	s.Enqueue(outboundtest.Respond(503).WithBody([]byte(strings.Repeat("x", 1000))), outboundtest.Respond(502))
	c := newClient(t, s, outbound.Config{})
	out, status, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x"))
	if err != nil || status != 200 || len(out.Attempts) != 3 {
		t.Fatalf("status %d err %v outcome %v", status, err, out)
	}
	if n := s.Conns(); n != 1 {
		t.Fatalf("%d connections for 3 attempts, want 1", n)
	}
}

func TestTransportKeepsTheRoundTripperContract(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	c := newClient(t, s, outbound.Config{})
	hc := (&http.Client{Transport: c})

	body := &closeCounter{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest(http.MethodPost, s.URL, body)
	req.Header.Set("A", "1")
	s.Enqueue(outboundtest.ResetAfterRead())
	_, err := hc.Do(req)
	var oe *outcome.CallError
	if !errors.As(err, &oe) || oe.Outcome.Commit != outcome.Unknown {
		t.Fatalf("err %v: the outcome is not reachable from http.Client's error", err)
	}
	if body.closes.Load() == 0 {
		t.Fatal("request body not closed")
	}
	if len(req.Header) != 1 || req.Header.Get("A") != "1" {
		t.Fatalf("request header changed: %v", req.Header)
	}

	s.Enqueue(outboundtest.Respond(404))
	resp, err := hc.Get(s.URL)
	if err != nil || resp.StatusCode != 404 {
		t.Fatalf("a 404 must come back as a response: %v %v", resp, err)
	}
	resp.Body.Close()
}

type closeCounter struct {
	io.Reader
	closes atomic.Int32
}

func (c *closeCounter) Close() error { c.closes.Add(1); return nil }

// A configuration error names the field by its whole path from the
// Config the user wrote, in one prefix, whatever layer checks it.
func TestAConfigurationErrorNamesTheFieldFromTheTop(t *testing.T) {
	for want, cfg := range map[string]outbound.Config{
		"outbound: Config.MaxAttempts must be in [0, 100], got -1":              {MaxAttempts: -1},
		"outbound: Config.MaxRetryAfter must":                                   {MaxRetryAfter: -1},
		"outbound: Config.Timeout must":                                         {Timeout: -1},
		"outbound: Config.AttemptTimeout must":                                  {AttemptTimeout: -1},
		"outbound: Config.Backoff.Jitter must be at most 1":                     {Backoff: retry.Backoff{Jitter: 2}},
		"outbound: Config.Budget.MaxTokens must":                                {Budget: retry.BudgetConfig{MaxTokens: -1}},
		"outbound: Config.Admission.Rate.PerSecond must be in [0, 1e9], got -1": {Admission: admissionWithBadRate()},
		"outbound: Config.Admission.Circuit.WindowSize must":                    {Admission: admission.Config{Circuit: circuit.Config{WindowSize: -1}}},
		"outbound: Config.Admission.Bulkhead.MaxWait needs MaxConcurrent > 0":   {Admission: admission.Config{Bulkhead: bulkhead.Config{MaxWait: time.Second}}},
		"outbound: Config.UpstreamIdleTime must":                                {UpstreamIdleTime: time.Millisecond},
		"outbound: Config.MaxConnAge must be >= 0, got -1s":                     {MaxConnAge: -time.Second},
		"outbound: Config.MaxConnRequests must":                                 {MaxConnRequests: -1},
	} {
		if _, err := outbound.New(cfg); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("err = %v, want %q…", err, want)
		}
	}
}

// Settings that contradict each other fail at construction, instead of
// being accepted and doing something else than they say.
func TestContradictoryConfigurationsFailAtConstruction(t *testing.T) {
	for want, cfg := range map[string]outbound.Config{
		"outbound: Config.Backoff.Multiplier must be 0 (the default, 2) or at least 1, got 0.5": {Backoff: retry.Backoff{Multiplier: 0.5}},
		"outbound: Config.Backoff.Max must be at least Initial (2s), got 1s":                    {Backoff: retry.Backoff{Initial: 2 * time.Second, Max: time.Second}},
		"outbound: Config.Backoff.Max must be at least Initial (100ms, the default), got 50ms":  {Backoff: retry.Backoff{Max: 50 * time.Millisecond}},
		"outbound: Config.AttemptTimeout must not be longer than Timeout (2s)":                  {Timeout: 2 * time.Second, AttemptTimeout: 5 * time.Second},
		"outbound: Config.Admission.Circuit.MaxWaitInOpen must be 0 or at least WaitInOpen": {Admission: admission.Config{
			Circuit: circuit.Config{WaitInOpen: time.Minute, MaxWaitInOpen: time.Second, WaitInOpenMultiplier: 2}}},
	} {
		if _, err := outbound.New(cfg); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("err = %v, want %q…", err, want)
		}
	}
	for _, cfg := range []outbound.Config{
		{Timeout: 2 * time.Second, AttemptTimeout: 2 * time.Second},
		{AttemptTimeout: time.Minute}, // no Timeout: the caller's deadline rules
		{Backoff: retry.Backoff{Initial: time.Second, Max: time.Second, Multiplier: 1}},
	} {
		tr, err := outbound.New(cfg)
		if err != nil {
			t.Errorf("%+v: %v, want it accepted", cfg, err)
			continue
		}
		tr.Close()
	}
}

// TestAGetBodyFailureEndsTheCallWithAResolvedOutcome pins a bug: when GetBody
// failed before a retry, the call ended with no commit status and no reason.
func TestAGetBodyFailureEndsTheCallWithAResolvedOutcome(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	c := newClient(t, s, outbound.Config{})
	s.Enqueue(outboundtest.ResetAfterRead())
	req, _ := http.NewRequest(http.MethodPut, s.URL+"/x", strings.NewReader("v"))
	broken := errors.New("cannot reopen the body")
	req.GetBody = func() (io.ReadCloser, error) { return nil, broken }
	_, out, err := c.Do(req)
	if !errors.Is(err, broken) || !errors.Is(err, outcome.ErrUnknown) || out.Commit != outcome.Unknown ||
		out.End != outcome.BodyUnavailable || len(out.Attempts) != 1 {
		t.Fatalf("err %v, outcome %v (reason %v)", err, out, out.Reason)
	}
}

func TestAnUnsupportedURLErrorCarriesNoPathOrQuery(t *testing.T) {
	c, err := outbound.New(outbound.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, _ := http.NewRequest(http.MethodGet, "ftp://example.com/secret-path?token=secret-query", nil)
	_, out, err := c.Do(req)
	if err == nil || strings.Contains(err.Error(), "secret") || out.Commit != outcome.NotCommitted {
		t.Fatalf("err %v, outcome %v", err, out)
	}
}
