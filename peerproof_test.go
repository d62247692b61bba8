package outbound_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// The tests of this file pin what a proof of non-processing is worth when
// the peer that gives it cannot give it: HAProxy's hard stop resets, with
// REFUSED_STREAM, streams it has already forwarded, after a GOAWAY that
// covered them (outboundtest.HardStop); HAProxy also answers REFUSED_STREAM
// for a request its backend executed and failed to answer.

// sensitiveBreaker opens after 2 failures among 3 calls: if the breaker
// recorded a proxy's shutdown, these tests would see it open.
var sensitiveBreaker = circuit.Config{WindowSize: 3, MinimumCalls: 3, FailureRateThreshold: 50}

func TestARefusedStreamAfterAGoAwayThatCoversItIsUnknownAndNeverResent(t *testing.T) {
	for _, p := range []outboundtest.Proto{outboundtest.H2C, outboundtest.H2TLS} {
		for _, tc := range []struct {
			kind   bodyKind
			reason retry.Reason
		}{{replayable, retry.NotIdempotent}, {oneShot, retry.OneShotBody}} {
			t.Run(p.String()+"/"+tc.kind.String(), func(t *testing.T) {
				s := newServer(t, p)
				c := newClient(t, s, outbound.Config{})
				if _, _, err := do(t, c, newRequest(t, context.Background(), s, noBody, "warm")); err != nil {
					t.Fatal(err)
				}
				s.Enqueue(outboundtest.HardStop(1))
				out, _, err := do(t, c, newRequest(t, context.Background(), s, tc.kind, "x"))
				if !errors.Is(err, outcome.ErrUnknown) || out.Commit != outcome.Unknown {
					t.Fatalf("err %v, commit %v, want Unknown: the proxy forwarded it", err, out.Commit)
				}
				if n := s.Executions("x"); n != 1 || len(out.Attempts) != 1 {
					t.Fatalf("executed %d times in %d attempts, want once in 1: %v", n, len(out.Attempts), out)
				}
				if a := out.Attempts[0]; a.Evidence != classify.EvidenceResetWhileDraining || out.Reason != tc.reason {
					t.Fatalf("attempt %v, reason %v, want a reset while draining and %v", a, out.Reason, tc.reason)
				}
			})
		}
		t.Run(p.String()+"/GET", func(t *testing.T) {
			s := newServer(t, p)
			c := newClient(t, s, outbound.Config{})
			if _, _, err := do(t, c, newRequest(t, context.Background(), s, noBody, "warm")); err != nil {
				t.Fatal(err)
			}
			s.Enqueue(outboundtest.HardStop(1))
			out, status, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x"))
			if err != nil || status != 200 || len(out.Attempts) != 2 || out.Attempts[0].Decision != retry.Transparent {
				t.Fatalf("status %d, err %v: %v; want a transparent retry on a fresh connection", status, err, out)
			}
		})
	}
}

func TestRefusedStreamsFromADrainingConnectionLeaveTheBreakerClosedAndTheBudgetUntouched(t *testing.T) {
	for _, p := range []outboundtest.Proto{outboundtest.H2C, outboundtest.H2TLS} {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			var ev testkit.Events
			c := newClient(t, s, outbound.Config{Admission: admission.Config{Circuit: sensitiveBreaker, OnEvent: ev.On}})
			warm := newRequest(t, context.Background(), s, noBody, "warm")
			if _, _, err := do(t, c, warm); err != nil {
				t.Fatal(err)
			}
			b := budgetOf(t, c, c.UpstreamKey(warm))
			for range 3 {
				b.OnFailure() // 7 tokens left: a token spent would show
			}
			// Three calls in flight on the connection when the proxy stops
			// hard: it resets all three.
			s.Enqueue(outboundtest.HardStop(3))
			var wg sync.WaitGroup
			outs := make([]*outcome.Outcome, 3)
			for i := range outs {
				wg.Go(func() {
					resp, out, err := c.Do(newRequest(t, context.Background(), s, noBody, "call"))
					if err == nil {
						resp.Body.Close()
					}
					outs[i] = out
				})
			}
			wg.Wait()
			drained := 0
			for _, out := range outs {
				if out.Commit != outcome.Committed {
					t.Fatalf("a GET failed: %v", out)
				}
				for _, a := range out.Attempts {
					if a.Evidence == classify.EvidenceResetWhileDraining {
						drained++
					}
				}
			}
			if drained != 3 {
				t.Fatalf("%d attempts reset while draining, want 3: %v", drained, outs)
			}
			if n := ev.Count("circuit-exit(failure)"); n != 0 {
				t.Fatalf("the breaker recorded %d failures", n)
			}
			if st := breakerOf(t, c, s).State; st != circuit.Closed {
				t.Fatalf("breaker %v, want CLOSED", st)
			}
			if tokens := b.Tokens(); tokens < 7 {
				t.Fatalf("budget: %v tokens, want at least the 7 left before", tokens)
			}
		})
	}
}

// TestAPeerThatRefusesEveryStreamOnEveryFreshConnectionEndsTheCallAfterABoundedNumberOfAttempts:
// a peer that stops hard on every connection it is given (a GOAWAY, then
// REFUSED_STREAM on the stream) never proves the upstream sick, so it
// neither opens the breaker nor spends the budget; what bounds the call is
// the attempts: one transparent retry per counted attempt, 2×MaxAttempts in
// all.
func TestAPeerThatRefusesEveryStreamOnEveryFreshConnectionEndsTheCallAfterABoundedNumberOfAttempts(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	var ev testkit.Events
	c := newClient(t, s, outbound.Config{MaxAttempts: 3, Admission: admission.Config{Circuit: sensitiveBreaker, OnEvent: ev.On}})
	s.SetDefault(outboundtest.HardStop(1))
	out, _, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x"))
	if !errors.Is(err, outcome.ErrUnknown) || out.Reason != retry.AttemptsExhausted || len(out.Attempts) != 6 {
		t.Fatalf("err %v after %d attempts: %v", err, len(out.Attempts), out)
	}
	if n := s.Conns(); n < 6 {
		t.Fatalf("%d connections for 6 attempts: each retry goes to a fresh one", n)
	}
	if n := ev.Count("circuit-exit(failure)"); n != 0 {
		t.Fatalf("the breaker recorded %d failures", n)
	}
	if tokens := budgetTokens(c, out.Upstream); tokens != 10 {
		t.Fatalf("budget: %v tokens, want 10", tokens)
	}
}

// TestARefusedStreamFromADistrustedUpstreamIsNeverResent: behind HAProxy, a
// backend that executes a request and then fails to answer it makes HAProxy
// answer REFUSED_STREAM on a healthy connection (outboundtest.ResetStream
// with REFUSED_STREAM: executed, then refused). Config.DistrustRefusedStream
// names such upstreams: the POST is Unknown, executed once. An upstream
// trusted (the default) still has a refused POST sent again.
func TestARefusedStreamFromADistrustedUpstreamIsNeverResent(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	distrusting := newClient(t, s, outbound.Config{DistrustRefusedStream: func(string) bool { return true }})
	s.Enqueue(outboundtest.ResetStream(http2.ErrCodeRefusedStream))
	out, _, err := do(t, distrusting, newRequest(t, context.Background(), s, replayable, "executed"))
	if !errors.Is(err, outcome.ErrUnknown) || len(out.Attempts) != 1 || out.Attempts[0].Evidence != classify.EvidenceRefusedUntrusted {
		t.Fatalf("err %v: %v", err, out)
	}
	if n := s.Executions("executed"); n != 1 {
		t.Fatalf("executed %d times", n)
	}
	trusting := newClient(t, s, outbound.Config{})
	s.Enqueue(outboundtest.RefusedStream())
	out, status, err := do(t, trusting, newRequest(t, context.Background(), s, replayable, "refused"))
	if err != nil || status != 200 || len(out.Attempts) != 2 || s.Executions("refused") != 1 {
		t.Fatalf("status %d, err %v, executed %d: %v", status, err, s.Executions("refused"), out)
	}
}
