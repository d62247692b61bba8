package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outcome"
)

// Wrap any *http.Client, or hand the transport to an SDK that takes one.
func ExampleNew() {
	t, err := outbound.New(outbound.Config{
		Admission: admission.Config{
			Rate:     ratelimit.Config{PerSecond: 200},   // per upstream
			Bulkhead: bulkhead.Config{MaxConcurrent: 32}, // per upstream
		},
		Timeout:        10 * time.Second, // the whole call, when the context has no deadline
		AttemptTimeout: 2 * time.Second,
	})
	if err != nil {
		log.Fatal(err) // errors name the field: "outbound: Config.MaxAttempts must be …"
	}
	client := &http.Client{Transport: t}
	_ = client // use it as any *http.Client
}

// Handling "unknown": the call may or may not have happened.
func ExampleTransport_Do() {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.Enqueue(outboundtest.ResetAfterRead()) // processed, then the connection dies

	c, _ := outbound.New(outbound.Config{})
	defer c.Close()
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/payments", strings.NewReader(`{"amount":10}`))

	resp, out, err := c.Do(req)
	switch {
	case err == nil:
		defer resp.Body.Close()
		fmt.Println("answered:", resp.StatusCode)
	case errors.Is(err, outcome.ErrNotCommitted):
		fmt.Println("not processed: safe to try again later")
	case errors.Is(err, outcome.ErrUnknown):
		// Do not blindly send it again: look the payment up, or retry with
		// the same Idempotency-Key if the upstream honours one.
		fmt.Println("unknown: reconcile before retrying")
	}
	fmt.Println("commit:", out.Commit, "attempts:", len(out.Attempts))
	// Output:
	// unknown: reconcile before retrying
	// commit: unknown attempts: 1
}

// With IdempotencyKeys, a POST with a replayable body carries a generated
// Idempotency-Key, the same on every attempt, which makes it retryable after
// an ambiguous failure, for upstreams that honour the key.
func ExampleConfig_idempotencyKeys() {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.Enqueue(outboundtest.ResetAfterRead())

	c, _ := outbound.New(outbound.Config{IdempotencyKeys: true})
	defer c.Close()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.URL+"/orders", strings.NewReader(`{}`))

	resp, out, err := c.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, out.Commit, "after", len(out.Attempts), "attempts")
	// Output: 200 committed after 2 attempts
}
