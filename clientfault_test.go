package outbound_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// The tests of this file pin "never worse than net/http": retries forced by
// a connection's life are transparent, faults of the client are never the
// upstream's, the commit status never lies, and timeouts and the
// http.Transport's settings behave as net/http's do.

// The tests of this file pin that a fault of the client itself — an invalid
// request, a body it closes or that fails, a certificate it does not trust —
// is never an upstream failure and is not retried as one.

func TestAnInvalidRequestIsRefusedLocallyAndNeverBlamesTheUpstream(t *testing.T) {
	invalid := map[string]func(*http.Request){
		"nil body with ContentLength": func(r *http.Request) { r.Method, r.Body, r.ContentLength = http.MethodPost, nil, 10 },
		"header with a newline":       func(r *http.Request) { r.Header.Set("X-Bad", "a\nb") },
		"header name with a space":    func(r *http.Request) { r.Header["X Bad"] = []string{"v"} },
		"invalid method":              func(r *http.Request) { r.Method = "GE T" },
		"control character in query":  func(r *http.Request) { r.URL.RawQuery = "a=\x01" },
	}
	for _, p := range []outboundtest.Proto{outboundtest.HTTP1, outboundtest.H2C} {
		for name, spoil := range invalid {
			t.Run(fmt.Sprintf("%v/%s", p, name), func(t *testing.T) {
				s := newServer(t, p)
				var ev testkit.Events
				c := newClient(t, s, outbound.Config{Admission: admission.Config{OnEvent: ev.On,
					Circuit: circuit.Config{MinimumCalls: 2, WindowSize: 2}}})
				for range 8 {
					req := newRequest(t, context.Background(), s, noBody, "bad")
					spoil(req)
					_, out, err := c.Do(req)
					if !errors.Is(err, classify.ErrInvalidRequest) || !errors.Is(err, outcome.ErrNotCommitted) {
						t.Fatalf("err %v", err)
					}
					if len(out.Attempts) != 1 || out.Reason != retry.InvalidRequest || out.Attempts[0].Evidence != classify.EvidenceInvalidRequest {
						t.Fatalf("%v", out)
					}
					if v := "a\nb"; strings.Contains(err.Error(), v) {
						t.Fatalf("the error shows a header value: %v", err)
					}
				}
				if m := breakerOf(t, c, s); m.State != circuit.Closed || m.Failed != 0 || ev.Count("circuit-enter") != 0 {
					t.Fatalf("breaker %+v, %d admissions", m, ev.Count("circuit-enter"))
				}
				if s.Received("bad") != 0 {
					t.Fatalf("the upstream received %d invalid requests", s.Received("bad"))
				}
				if _, status, err := do(t, c, newRequest(t, context.Background(), s, noBody, "good")); err != nil || status != 200 {
					t.Fatalf("the next valid GET: %d, %v", status, err)
				}
			})
		}
	}
}

func TestClosingABodyDuringAReadIsNeverAnUpstreamFailure(t *testing.T) {
	for _, p := range []outboundtest.Proto{outboundtest.HTTP1, outboundtest.H2C} {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.EndlessBody())
			var ev testkit.Events
			c := newClient(t, s, outbound.Config{Admission: admission.Config{OnEvent: ev.On}})
			for range 100 {
				resp, _, err := c.Do(newRequest(t, context.Background(), s, noBody, "x"))
				if err != nil {
					t.Fatal(err)
				}
				reading := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					buf := make([]byte, 512)
					close(reading)
					for {
						if _, err := resp.Body.Read(buf); err != nil {
							return
						}
					}
				}()
				<-reading
				resp.Body.Close()
				<-done
			}
			if n := ev.Count("circuit-exit(failure)"); n != 0 {
				t.Fatalf("%d breaker failures", n)
			}
			// Kept or forgotten with its last connection, clean.
			if m, ok := c.Breakers()[s.URL]; ok && (m.Failed != 0 || m.State != circuit.Closed) {
				t.Fatalf("breaker %+v", m)
			}
		})
	}
}

func TestAnUntrustedCertificateIsNotRetried(t *testing.T) {
	s := newServer(t, outboundtest.H2TLS)
	var ev testkit.Events
	c, err := outbound.New(outbound.Config{Admission: admission.Config{OnEvent: ev.On},
		Backoff: retry.Backoff{Initial: 1, Max: 1, Jitter: -1}}) // the system's roots: the server's CA is unknown
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 1; i <= 3; i++ {
		_, out, err := c.Do(newRequest(t, context.Background(), s, noBody, "x"))
		var cv *tls.CertificateVerificationError
		if !errors.As(err, &cv) || !errors.Is(err, outcome.ErrNotCommitted) || len(out.Attempts) != 1 || out.Reason != retry.WouldRecur {
			t.Fatalf("call %d: err %v: %v", i, err, out)
		}
		if s.Conns() != i {
			t.Fatalf("call %d: %d handshakes so far", i, s.Conns())
		}
	}
	if tokens := budgetOf(t, c, s.URL).Tokens(); tokens != 10 {
		t.Fatalf("budget: %v tokens left", tokens)
	}
	if n := ev.Count("circuit-exit(failure)"); n != 0 {
		t.Fatalf("%d breaker failures", n)
	}
}

// A call whose body fails to read ends with the body's error and an honest
// commit status (part of the request left), is not retried even when it
// could be, and costs the upstream nothing: no breaker failure, no budget.
func TestACallWhoseBodyFailsEndsWithTheCallersErrorAndBlamesNoUpstream(t *testing.T) {
	for _, p := range testkit.Protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.Hang())
			var ev testkit.Events
			c := newClient(t, s, outbound.Config{Admission: admission.Config{OnEvent: ev.On}})
			for range 3 {
				req := newRequest(t, context.Background(), s, noBody, "put")
				req.Method, req.ContentLength = http.MethodPut, 100
				req.Body = testkit.FailingBody()
				req.GetBody = func() (io.ReadCloser, error) { return testkit.FailingBody(), nil }
				_, out, err := c.Do(req)
				if !errors.Is(err, testkit.ErrBodyFailed) || !errors.Is(err, outcome.ErrUnknown) || len(out.Attempts) != 1 || out.Reason != retry.OwnFailure {
					t.Fatalf("err %v: %v", err, out)
				}
			}
			if tokens := budgetTokens(c, s.URL); tokens != 10 {
				t.Fatalf("budget: %v tokens left", tokens)
			}
			if n := ev.Count("circuit-exit(failure)") + ev.Count("circuit-exit(success)"); n != 0 {
				t.Fatalf("the breaker recorded %d of them", n)
			}
		})
	}
}
