package outbound_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// The tests of this file pin "never worse than net/http": retries forced by
// a connection's life are transparent, faults of the client are never the
// upstream's, the commit status never lies, and timeouts and the
// http.Transport's settings behave as net/http's do.

// The tests of this file pin what a caller of net/http expects and gets the
// same way: timeouts reported as net/http reports them, answers that come
// back, the outcome of every error, and the http.Transport's settings
// honoured.

// TestAttemptTimeoutReturnsTheSlotOfABodyNeverClosed: the caller holds an
// answer's body open and never closes it; AttemptTimeout still ends the
// exchange, returns the bulkhead slot and records the failure.
func TestAttemptTimeoutReturnsTheSlotOfABodyNeverClosed(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.EndlessBody())
			exited := make(chan string, 4)
			c := newClient(t, s, outbound.Config{AttemptTimeout: 100 * time.Millisecond,
				Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}, OnEvent: func(e admission.Event) {
					if e.Guard == classify.GuardCircuit && (e.Kind == admission.Success || e.Kind == admission.Failure || e.Kind == admission.Release) {
						exited <- e.String()
					}
				}}})
			resp, _, err := c.Do(newRequest(t, context.Background(), s, noBody, "held"))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close() // only at the end of the test
			if e := <-exited; e != "circuit-exit(failure)" {
				t.Fatalf("the attempt ended with %s", e)
			}
			if b := breakerPipeline(t, c, s).Bulkhead(); b.InUse() != 0 {
				t.Fatalf("bulkhead slots in use: %d", b.InUse())
			}
			if _, err := io.ReadAll(resp.Body); !errors.Is(err, classify.ErrAttemptTimeout) {
				t.Fatalf("reading the body afterwards: %v", err)
			}
		})
	}
}

func TestTimeoutsAreReportedAsNetHTTPReportsThem(t *testing.T) {
	isTimeout := func(err error) string {
		var ne net.Error
		return fmt.Sprintf("net.Error %t, os.IsTimeout %t, DeadlineExceeded %t",
			errors.As(err, &ne) && ne.Timeout(), os.IsTimeout(err), errors.Is(err, context.DeadlineExceeded))
	}
	want := "net.Error true, os.IsTimeout true, DeadlineExceeded true"
	s := newServer(t, outboundtest.HTTP1)
	s.SetDefault(outboundtest.Hang())

	bare := &http.Client{Transport: s.Transport(), Timeout: 50 * time.Millisecond}
	_, err := bare.Get(s.URL)
	if got := isTimeout(err); got != want {
		t.Fatalf("bare net/http: %s", got)
	}
	for name, cfg := range map[string]outbound.Config{
		"Timeout":        {Timeout: 50 * time.Millisecond},
		"AttemptTimeout": {AttemptTimeout: 50 * time.Millisecond, MaxAttempts: 1},
	} {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, s, cfg)
			req := newRequest(t, context.Background(), s, noBody, "x")
			_, out, err := c.Do(req)
			if got := isTimeout(err); got != want {
				t.Fatalf("Do: %s: %v", got, err)
			}
			if name == "Timeout" && out.End != outcome.DeadlineExceeded {
				t.Fatalf("end %v", out.End)
			}
			_, err = (&http.Client{Transport: c}).Get(s.URL)
			if got := isTimeout(err); got != want {
				t.Fatalf("through http.Client: %s: %v", got, err)
			}
		})
	}
}

func TestEndReasonsNameWhatHappened(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	s.SetDefault(outboundtest.Hang())
	c := newClient(t, s, outbound.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, out, _ := c.Do(newRequest(t, ctx, s, noBody, "deadline")); out.End != outcome.DeadlineExceeded {
		t.Fatalf("deadline during an attempt: end %v", out.End)
	}
	ctx, cancel = context.WithCancel(context.Background())
	c2 := newClient(t, s, outbound.Config{Hooks: outbound.Hooks{AttemptStart: func(ctx context.Context, _ outbound.AttemptInfo) context.Context {
		time.AfterFunc(20*time.Millisecond, cancel)
		return ctx
	}}})
	if _, out, err := c2.Do(newRequest(t, ctx, s, noBody, "cancel")); out.End != outcome.Cancelled || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled during an attempt: end %v, %v", out.End, err)
	}
}

// An answer whose retry cannot happen after all comes back as (resp, nil),
// as net/http would have returned it: the commit status never says
// "committed" in an error.
func TestAnAnswerWhoseRetryCannotHappenIsReturned(t *testing.T) {
	t.Run("the context ends during the backoff", func(t *testing.T) {
		s := newServer(t, outboundtest.HTTP1)
		s.Enqueue(outboundtest.Respond(503))
		ctx, cancel := context.WithCancel(context.Background())
		c := newClient(t, s, outbound.Config{Backoff: retry.Backoff{Initial: time.Hour, Max: time.Hour, Jitter: -1},
			Hooks: outbound.Hooks{RetryDecided: func(context.Context, outbound.AttemptInfo, retry.Decision) { cancel() }}})
		out, status, err := do(t, c, newRequest(t, ctx, s, noBody, "x"))
		if err != nil || status != 503 || out.Commit != outcome.Committed || out.End != outcome.ContextDone {
			t.Fatalf("status %d, err %v: %v", status, err, out)
		}
	})
	t.Run("GetBody fails", func(t *testing.T) {
		s := newServer(t, outboundtest.HTTP1)
		s.Enqueue(outboundtest.Respond(503))
		c := newClient(t, s, outbound.Config{})
		req := newRequest(t, context.Background(), s, replayable, "x")
		req.Header.Set("Idempotency-Key", `"k"`)
		req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("no second body") }
		out, status, err := do(t, c, req)
		if err != nil || status != 503 || out.End != outcome.BodyUnavailable {
			t.Fatalf("status %d, err %v: %v", status, err, out)
		}
	})
	t.Run("the retry never reaches the upstream", func(t *testing.T) {
		s := newServer(t, outboundtest.HTTP1)
		s.Enqueue(outboundtest.Respond(503, "Connection", "close"))
		c := newClient(t, s, outbound.Config{MaxAttempts: 2, Hooks: outbound.Hooks{
			RetryDecided: func(context.Context, outbound.AttemptInfo, retry.Decision) { s.Pause() }}})
		out, status, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x"))
		if err != nil || status != 503 || len(out.Attempts) != 2 || out.Attempts[1].Category != classify.NotSent {
			t.Fatalf("status %d, err %v: %v", status, err, out)
		}
	})
	t.Run("the retry may have reached the upstream", func(t *testing.T) {
		s := newServer(t, outboundtest.HTTP1)
		// A fresh connection for the retry: on a reused one, a reset before
		// any byte of the answer is the keep-alive race, retried at once.
		s.Enqueue(outboundtest.Respond(503, "Connection", "close"), outboundtest.ResetAfterRead())
		c := newClient(t, s, outbound.Config{MaxAttempts: 2})
		out, _, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x"))
		if !errors.Is(err, outcome.ErrUnknown) || len(out.Attempts) != 2 {
			t.Fatalf("err %v: %v", err, out)
		}
	})
	t.Run("an answer too large to keep is not retried", func(t *testing.T) {
		s := newServer(t, outboundtest.HTTP1)
		big := strings.Repeat("x", 100<<10)
		s.Enqueue(outboundtest.Respond(503).WithBody([]byte(big)))
		c := newClient(t, s, outbound.Config{})
		resp, out, err := c.Do(newRequest(t, context.Background(), s, noBody, "x"))
		if err != nil || resp.StatusCode != 503 || out.End != outcome.AnswerTooLarge || len(out.Attempts) != 1 {
			t.Fatalf("err %v: %v", err, out)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != big {
			t.Fatalf("the body: %d bytes, %v", len(b), err)
		}
	})
}

func TestTheGeneratedIdempotencyKeyIsInTheOutcome(t *testing.T) {
	var seen atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("Idempotency-Key"))
	}))
	defer srv.Close()
	c, err := outbound.New(outbound.Config{IdempotencyKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	resp, out, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if out.IdempotencyKey == "" || out.IdempotencyKey != seen.Load() {
		t.Fatalf("outcome key %q, sent %q", out.IdempotencyKey, seen.Load())
	}
	req, _ = http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
	req.Header.Set("Idempotency-Key", `"mine"`)
	resp, out, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if out.IdempotencyKey != `"mine"` {
		t.Fatalf("outcome key %q, want the caller's", out.IdempotencyKey)
	}
}

func TestWithMaxAttemptsOverridesTheConfigurationPerCall(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	s.SetDefault(outboundtest.Respond(503))
	c := newClient(t, s, outbound.Config{MaxAttempts: 5})
	out, status, _ := do(t, c, newRequest(t, outbound.WithMaxAttempts(context.Background(), 1), s, noBody, "one"))
	if status != 503 || len(out.Attempts) != 1 || out.Reason != retry.AttemptsExhausted {
		t.Fatalf("with WithMaxAttempts(1): %v", out)
	}
	out, _, _ = do(t, c, newRequest(t, context.Background(), s, noBody, "five"))
	if len(out.Attempts) != 5 && out.Reason != retry.BudgetExhausted {
		t.Fatalf("without: %v", out)
	}
}

func TestTheProxyFuncSeesTheCallersRequest(t *testing.T) {
	target := newServer(t, outboundtest.HTTP1)
	var viaProxy atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		viaProxy.Add(1)
		io.WriteString(w, "proxied "+r.URL.String())
	}))
	defer proxy.Close()
	proxyURL, _ := url.Parse(proxy.URL)
	type key struct{}
	var mu sync.Mutex
	var seen []string
	tr := target.Transport()
	tr.Proxy = func(r *http.Request) (*url.URL, error) {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s ctx=%v", r.URL, r.Header.Get("X-Route"), r.Context().Value(key{})))
		mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/via-proxy") {
			return proxyURL, nil
		}
		return nil, nil
	}
	c, err := outbound.New(outbound.Config{HTTPTransport: tr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	get := func(path string) string {
		req, _ := http.NewRequestWithContext(context.WithValue(context.Background(), key{}, "v"), http.MethodGet, target.URL+path, nil)
		req.Header.Set("X-Route", "r")
		resp, _, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := get("/via-proxy/a?q=1"); !strings.HasPrefix(got, "proxied "+target.URL+"/via-proxy/a?q=1") {
		t.Fatalf("through the proxy: %q", got)
	}
	if got := get("/direct?q=2"); got != "ok\n" {
		t.Fatalf("direct: %q", got)
	}
	if got := get("/via-proxy/b"); !strings.HasPrefix(got, "proxied ") || viaProxy.Load() != 2 {
		t.Fatalf("through the proxy again: %q (%d proxied)", got, viaProxy.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if want := target.URL + "/via-proxy/a?q=1 r ctx=v"; len(seen) != 3 || seen[0] != want {
		t.Fatalf("the Proxy func saw %q, want first %q", seen, want)
	}
}

func TestDialTLSContextWorksOverHTTP1AndHTTP2(t *testing.T) {
	h1 := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}))
	h1.EnableHTTP2 = false
	h1.StartTLS()
	defer h1.Close()
	h2 := newServer(t, outboundtest.H2TLS)

	for name, tc := range map[string]struct {
		url   string
		roots *tls.Config
		proto int
	}{
		"HTTP/1.1": {h1.URL, &tls.Config{RootCAs: h1.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}, 1},
		"HTTP/2":   {h2.URL, h2.ClientTLSConfig(), 2},
	} {
		t.Run(name, func(t *testing.T) {
			var dials atomic.Int32
			tr := &http.Transport{ForceAttemptHTTP2: true, DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials.Add(1)
				cfg := tc.roots.Clone()
				cfg.ServerName = "127.0.0.1"
				cfg.NextProtos = []string{"h2", "http/1.1"}
				return (&tls.Dialer{Config: cfg}).DialContext(ctx, network, addr)
			}}
			c, err := outbound.New(outbound.Config{HTTPTransport: tr})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for range 3 {
				req, _ := http.NewRequest(http.MethodGet, tc.url, nil)
				resp, _, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.ProtoMajor != tc.proto {
					t.Fatalf("spoke %s", resp.Proto)
				}
			}
			if dials.Load() != 1 {
				t.Fatalf("%d dials for three calls", dials.Load())
			}
			if tc.proto == 2 { // classification on a connection whose bytes are not counted
				h2.Enqueue(outboundtest.ResetStream(http2.ErrCodeInternal), outboundtest.RefusedStream())
				req, _ := http.NewRequest(http.MethodPost, tc.url, io.NopCloser(strings.NewReader("one-shot")))
				_, out, err := c.Do(req)
				if !errors.Is(err, outcome.ErrUnknown) || out.Attempts[0].Category != classify.Ambiguous {
					t.Fatalf("a reset stream: %v: %v", err, out)
				}
				req, _ = http.NewRequest(http.MethodGet, tc.url, nil)
				resp, out, err := c.Do(req)
				if err != nil || out.Attempts[0].Evidence != classify.EvidenceRefusedStream {
					t.Fatalf("a refused stream: %v: %v", err, out)
				}
				resp.Body.Close()
			}
		})
	}
}

// TestEveryErrorCarriesNotCommittedOrUnknown walks the call's paths at
// random — faults and statuses in sequence, the three body kinds, a GetBody
// that fails, the context cancelled at any step, deadlines, an exhausted
// budget, any number of attempts — and checks that the commit status never
// lies: an error is NotCommitted or Unknown, an answer is Committed, and a
// call reported not committed was never executed.
func TestEveryErrorCarriesNotCommittedOrUnknown(t *testing.T) {
	seed := time.Now().UnixNano()
	r := rand.New(rand.NewPCG(uint64(seed), 0))
	t.Logf("seed %d", seed)
	common := []outboundtest.Fault{outboundtest.Respond(200), outboundtest.Respond(503), outboundtest.Respond(503, "Retry-After", "0"),
		outboundtest.Respond(500), outboundtest.Respond(404), outboundtest.ResetAfterRead(), outboundtest.ResetBeforeRead(),
		outboundtest.CloseBeforeRead(), outboundtest.PartialHeaders(), outboundtest.TruncatedBody(100, 10), outboundtest.Hang(),
		outboundtest.Respond(503, "Connection", "close")}
	h2only := []outboundtest.Fault{outboundtest.RefusedStream(), outboundtest.GoAway(1, 0, false), outboundtest.GoAway(1, 1, false),
		outboundtest.ResetStream(http2.ErrCodeInternal), outboundtest.GoAway(1, 0, false).WithErrCode(http2.ErrCodeInternal)}
	servers := map[outboundtest.Proto]*outboundtest.Server{}
	for _, p := range protos {
		servers[p] = newServer(t, p)
	}
	for i := range 200 {
		p := protos[r.IntN(len(protos))]
		s := servers[p]
		s.Reset()
		faults := common
		if p != outboundtest.HTTP1 {
			faults = append(append([]outboundtest.Fault(nil), common...), h2only...)
		}
		var script []string
		hangs := false
		for range 1 + r.IntN(4) {
			f := faults[r.IntN(len(faults))]
			hangs = hangs || f.String() == "Hang()"
			s.Enqueue(f)
			script = append(script, f.String())
		}
		k := bodyKind(r.IntN(3))
		cfg := outbound.Config{MaxAttempts: 1 + r.IntN(4), IdempotencyKeys: r.IntN(2) == 0}
		if hangs || r.IntN(4) == 0 {
			cfg.AttemptTimeout = 30 * time.Millisecond
		}
		ctx, cancel := context.WithCancel(context.Background())
		if r.IntN(4) == 0 {
			ctx, cancel = context.WithTimeout(context.Background(), time.Duration(5+r.IntN(60))*time.Millisecond)
		}
		// Cancel at a random step of the call: the n-th hook call.
		cancelAt, steps := -1, 0
		if r.IntN(3) == 0 {
			cancelAt = r.IntN(8)
		}
		step := func() {
			if steps == cancelAt {
				cancel()
			}
			steps++
		}
		cfg.Hooks = outbound.Hooks{
			AttemptStart: func(ctx context.Context, _ outbound.AttemptInfo) context.Context { step(); return ctx },
			AttemptDone:  func(context.Context, outbound.AttemptInfo, outcome.Attempt) { step() },
			RetryDecided: func(context.Context, outbound.AttemptInfo, retry.Decision) { step() },
		}
		c := newClient(t, s, cfg)
		req := newRequest(t, ctx, s, k, "call")
		failGetBody := k == replayable && r.IntN(3) == 0
		if failGetBody {
			req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("no body again") }
		}
		if r.IntN(4) == 0 { // an exhausted budget
			// The budget exists once the upstream is known: route it first.
			if _, err := outbound.AttemptsOf(c).Route(req); err != nil {
				t.Fatal(err)
			}
			b, ok := outbound.BudgetOf(c, c.UpstreamKey(req))
			for range 10 {
				if ok {
					b.OnFailure()
				}
			}
		}
		resp, out, err := c.Do(req)
		if resp != nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		cancel()
		c.Close()
		execs := s.Executions("call")
		where := fmt.Sprintf("case %d (%v, %v, faults %v, getBody fails %t, cancel at %d, %+v): err %v\n%v",
			i, p, k, script, failGetBody, cancelAt, cfg.MaxAttempts, err, out)
		switch {
		case (resp == nil) == (err == nil):
			t.Fatalf("resp %v and err %v: %s", resp, err, where)
		case err != nil && !errors.Is(err, outcome.ErrNotCommitted) && !errors.Is(err, outcome.ErrUnknown):
			t.Fatalf("an error that is neither not committed nor unknown: %s", where)
		case err != nil && out.Commit == outcome.Committed, err == nil && out.Commit != outcome.Committed:
			t.Fatalf("commit status %v: %s", out.Commit, where)
		case out.Commit == outcome.NotCommitted && execs != 0:
			t.Fatalf("not committed, executed %d times: %s", execs, where)
		case k == oneShot && execs > 1:
			t.Fatalf("a one-shot POST executed %d times: %s", execs, where)
		case out.End == 0 || (out.End == outcome.Decided) != (out.Reason != 0):
			t.Fatalf("end %v with reason %v: %s", out.End, out.Reason, where)
		}
	}
}
