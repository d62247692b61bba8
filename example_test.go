package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// Wrap any *http.Client, or hand the transport to an SDK that takes one.
func ExampleNew() {
	upstream := outboundtest.NewServer(outboundtest.HTTP1)
	defer upstream.Close()

	t, err := outbound.New(outbound.Config{
		Admission: admission.Config{
			Rate:     ratelimit.Config{PerSecond: 200},   // per upstream (scheme://host:port)
			Bulkhead: bulkhead.Config{MaxConcurrent: 32}, // per upstream
		},
		Timeout:        10 * time.Second, // the whole call, when the context has no deadline
		AttemptTimeout: 2 * time.Second,
	})
	if err != nil {
		log.Fatal(err) // errors name the field: "outbound: Config.Admission.Rate.PerSecond must be …"
	}
	defer t.Close()
	client := &http.Client{Transport: t} // or hand t to any SDK that takes an *http.Client

	resp, err := client.Get(upstream.URL + "/orders")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)
	// Output: 200
}

// Behind HAProxy, a backend that executes a request and then fails to
// answer it makes HAProxy reset the stream with REFUSED_STREAM, on a healthy
// connection: a false proof that the request was not processed. Name such
// upstreams, and their REFUSED_STREAM proves nothing.
func ExampleConfig_distrustRefusedStream() {
	upstream := outboundtest.NewServer(outboundtest.H2C)
	defer upstream.Close()
	upstream.Enqueue(outboundtest.ResetStream(http2.ErrCodeRefusedStream)) // executed, then "refused"
	base := upstream.Transport()                                           // HTTP/2 without TLS, to the test upstream
	behindHAProxy := map[string]bool{upstream.URL: true}                   // upstream keys: scheme://host:port
	t, err := outbound.New(outbound.Config{
		HTTPTransport: base,
		// REFUSED_STREAM from these upstreams does not prove a request unprocessed.
		DistrustRefusedStream: func(upstream string) bool { return behindHAProxy[upstream] },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	req, _ := http.NewRequest(http.MethodPost, upstream.URL+"/payments", strings.NewReader(`{"amount":10}`))
	_, out, err := t.Do(req)
	fmt.Println(errors.Is(err, outcome.ErrUnknown), out.Attempts[0].Evidence)
	fmt.Println("executed:", upstream.TotalExecutions(), "attempts:", len(out.Attempts))
	// Output:
	// true REFUSED_STREAM, not trusted from this upstream
	// executed: 1 attempts: 1
}

// Handling "unknown": the call may or may not have happened.
func ExampleTransport_Do() {
	upstream := outboundtest.NewServer(outboundtest.HTTP1)
	defer upstream.Close()
	upstream.Enqueue(outboundtest.ResetAfterRead()) // processed, then the connection dies
	t, err := outbound.New(outbound.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	req, _ := http.NewRequest(http.MethodPost, upstream.URL+"/payments", strings.NewReader(`{"amount":10}`))

	resp, out, err := t.Do(req) // out: the commit status and every attempt
	switch {
	case err == nil: // committed: the upstream answered (any status)
		defer resp.Body.Close()
		fmt.Println("answered:", resp.StatusCode)
	case errors.Is(err, outcome.ErrNotCommitted): // proven not processed: safe to try again later
		fmt.Println("not processed")
	case errors.Is(err, outcome.ErrUnknown):
		// It may or may not have happened: look the resource up, query the
		// operation's status, or retry with the same Idempotency-Key.
		fmt.Println("unknown: reconcile before retrying")
	}
	fmt.Println("commit:", out.Commit, "attempts:", len(out.Attempts))
	// Output:
	// unknown: reconcile before retrying
	// commit: unknown attempts: 1
}

// Through a plain *http.Client, the outcome is in the error.
func ExampleOutcomeOf() {
	upstream := outboundtest.NewServer(outboundtest.HTTP1)
	defer upstream.Close()
	upstream.Pause() // an outage: connections are refused
	t, _ := outbound.New(outbound.Config{MaxAttempts: 1})
	defer t.Close()
	client := &http.Client{Transport: t}

	_, err := client.Get(upstream.URL + "/orders")
	if out, ok := outbound.OutcomeOf(err); ok {
		fmt.Println(out.Commit) // not committed: the connection was refused
	}
	var ce *classify.Error
	if errors.As(err, &ce) {
		fmt.Println(ce.Stage, ce.Category, ce.Evidence)
	}
	// Output:
	// not committed
	// dial NotSent no connection
}

// With IdempotencyKeys, a POST with a replayable body carries a generated
// Idempotency-Key, the same on every attempt, which makes it retryable after
// an ambiguous failure, for upstreams that honour the key.
func ExampleConfig_idempotencyKeys() {
	upstream := outboundtest.NewServer(outboundtest.HTTP1)
	defer upstream.Close()
	upstream.Enqueue(outboundtest.ResetAfterRead())

	t, _ := outbound.New(outbound.Config{IdempotencyKeys: true})
	defer t.Close()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, upstream.URL+"/orders", strings.NewReader(`{}`))

	resp, out, err := t.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, out.Commit, "after", len(out.Attempts), "attempts")
	// Output: 200 committed after 2 attempts
}

// An SDK that retries by itself: turn outbound's retries off for its calls,
// keep the guards and the classification.
func ExampleWithMaxAttempts() {
	upstream := outboundtest.NewServer(outboundtest.HTTP1)
	defer upstream.Close()
	upstream.SetDefault(outboundtest.Respond(503))
	t, _ := outbound.New(outbound.Config{})
	defer t.Close()

	ctx := context.Background()
	ctx = outbound.WithMaxAttempts(ctx, 1) // the SDK retries; outbound admits, classifies and reports
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL+"/charges", nil)
	resp, out, err := t.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", len(out.Attempts), "attempt")
	// Output: 503 after 1 attempt
}

// Hooks see every decision; ComposeHooks combines several.
func ExampleHooks() {
	upstream := outboundtest.NewServer(outboundtest.HTTP1)
	defer upstream.Close()
	upstream.SetDefault(outboundtest.Respond(503))
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	otherHooks := outbound.Hooks{}

	var cfg outbound.Config
	cfg.Backoff = retry.Backoff{Initial: time.Millisecond, Max: time.Millisecond}
	cfg.Hooks = outbound.Hooks{
		RetryDecided: func(ctx context.Context, a outbound.AttemptInfo, d retry.Decision) {
			if !d.Retry {
				fmt.Printf("attempt %d not retried: %v\n", a.Attempt, d.Reason)
			}
		},
	}
	cfg.Hooks = outbound.ComposeHooks(cfg.Hooks, outbound.SlogHooks(logger), otherHooks)
	t, _ := outbound.New(cfg)
	defer t.Close()

	resp, err := t.RoundTrip(must(http.NewRequest(http.MethodGet, upstream.URL+"/x", nil)))
	if err == nil {
		resp.Body.Close()
	}
	// Output: attempt 3 not retried: attempts exhausted
}

func must(req *http.Request, err error) *http.Request {
	if err != nil {
		log.Fatal(err)
	}
	return req
}

// Logging the decisions with log/slog.
func ExampleSlogHooks() {
	upstream := outboundtest.NewServer(outboundtest.HTTP1)
	defer upstream.Close()
	upstream.Enqueue(outboundtest.ResetAfterRead())
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, "duration", "wait", "upstream", "error":
				return slog.Attr{} // left out: they change from run to run
			}
			return a
		}}))

	t, _ := outbound.New(outbound.Config{Hooks: outbound.SlogHooks(logger)})
	defer t.Close()
	req, _ := http.NewRequest(http.MethodPut, upstream.URL+"/orders/1", strings.NewReader(`{}`))
	resp, _, err := t.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	// Output:
	// level=INFO msg="outbound attempt" method=PUT attempt=1 stage=await-response category=Ambiguous evidence="request bytes written, no status"
	// level=INFO msg="outbound retry scheduled" method=PUT attempt=1 reason=retryable
}

// Hedging cuts a slow tail: a GET whose first attempt has not answered
// within the delay gets a second one, and the first answer wins.
func ExampleHedging() {
	upstream := outboundtest.NewServer(outboundtest.H2C)
	defer upstream.Close()
	upstream.Enqueue(outboundtest.Slow(10*time.Second, 200)) // the first attempt is stuck

	t, err := outbound.New(outbound.Config{
		HTTPTransport: upstream.Transport(),
		// Adaptive: hedge after the latency that 95% of the upstream's
		// first attempts beat (ExtraLoad 0.05). A fixed Delay is here
		// because the upstream has no history yet.
		Hedging: &outbound.Hedging{Delay: 50 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	req, _ := http.NewRequest(http.MethodGet, upstream.URL+"/search", nil)
	resp, out, err := t.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	for _, a := range out.Attempts {
		fmt.Printf("hedge %v, lost %v, %v\n", a.Hedge, a.Lost, a.Category)
	}
	// Output:
	// hedge false, lost true, Ambiguous
	// hedge true, lost false, Answered
}

// Spread a host's attempts over every address it resolves to. Here the
// resolver is replaced, as a test would: svc.test is five replicas of an
// in-memory fleet, of which the first answers 503; the call's retry goes
// to another replica, and the outcome says where each attempt went.
func ExampleConfig_endpoints() {
	fleet := testkit.NewFleet("127.0.0.2:80", "127.0.0.3:80", "127.0.0.4:80", "127.0.0.5:80", "127.0.0.6:80")
	fleet.Set("127.0.0.2:80", 503)
	tr, err := outbound.New(outbound.Config{
		Endpoints: &attempt.Endpoints{}, // net.DefaultResolver, looked up again every 30 s
	})
	if err != nil {
		log.Fatal(err)
	}
	tr.Close()
	tr, err = outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: fleet.Dial},
		Endpoints: &attempt.Endpoints{Resolver: testkit.Names{"svc.test": testkit.Loopbacks(5)}},
		Backoff:   retry.Backoff{Initial: time.Millisecond, Max: time.Millisecond}})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	for range 20 {
		req, _ := http.NewRequest(http.MethodGet, "http://svc.test/", nil)
		resp, out, err := tr.Do(req)
		if err != nil || resp.StatusCode != 200 {
			log.Fatal(err, out)
		}
		resp.Body.Close()
		for _, a := range out.Attempts[:len(out.Attempts)-1] {
			if a.Endpoint != "127.0.0.2:80" {
				log.Fatalf("a retried attempt went to %s", a.Endpoint)
			}
		}
	}
	fmt.Println("20 calls answered 200; the 503s all came from 127.0.0.2:80")
	// Output: 20 calls answered 200; the 503s all came from 127.0.0.2:80
}

// Send the call's time left to the hosts named, and mark a call sheddable:
// under overload every local guard refuses it before the others. Here the
// upstream, on 127.0.0.1, is named too, and says what it got.
func ExampleDeadline() {
	tr, err := outbound.New(outbound.Config{
		Deadline: &outbound.Deadline{Header: "Grpc-Timeout", Format: outbound.GRPCTimeout,
			Hosts: []string{"*.svc.cluster.local"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	tr.Close()

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("grpc-timeout sent:", r.Header.Get("Grpc-Timeout") != "")
	}))
	defer upstream.Close()
	tr, err = outbound.New(outbound.Config{Deadline: &outbound.Deadline{Header: "Grpc-Timeout",
		Format: outbound.GRPCTimeout, Hosts: []string{"127.0.0.1"}}})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodGet, upstream.URL, nil)
	ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
	defer cancel()
	ctx = criticality.With(ctx, criticality.Sheddable) // a prefetch: refused first
	resp, err := tr.RoundTrip(req.WithContext(ctx))
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	// Output:
	// grpc-timeout sent: true
}
