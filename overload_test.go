package outbound_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// An upstream that is healthy but overloaded sheds what it cannot take with
// 429. The throttle then refuses most calls locally; those refusals are the
// client's own, and the breaker never sees them: it stays CLOSED, with no
// failure recorded, however many there are.
func TestThrottlingRejectionsLeaveTheBreakerClosedOnAHealthyButOverloadedUpstream(t *testing.T) {
	for _, p := range testkit.Protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.Respond(429))
			var ev testkit.Events
			c := newClient(t, s, outbound.Config{MaxAttempts: 1, Admission: admission.Config{OnEvent: ev.On,
				Circuit:  circuit.Config{WindowSize: 10, MinimumCalls: 5, FailureRateThreshold: 10},
				Throttle: throttle.Config{Enabled: true}}})
			throttled := 0
			for i := range 300 {
				if i%10 == 0 {
					s.Enqueue(outboundtest.Respond(200)) // the share it can take
				}
				resp, out, err := c.Do(newRequest(t, context.Background(), s, noBody, "x"))
				if err == nil {
					resp.Body.Close()
					continue
				}
				if !errors.Is(err, throttle.ErrThrottled) || !errors.Is(err, outcome.ErrNotCommitted) ||
					out.Reason != retry.RefusedLocally || out.Attempts[0].Guard != classify.GuardThrottle {
					t.Fatalf("call %d: err %v: %v", i, err, out)
				}
				throttled++
			}
			if throttled < 100 {
				t.Fatalf("only %d of 300 calls throttled: the test shows nothing", throttled)
			}
			if m := breakerOf(t, c, s); m.State != circuit.Closed || m.Failed != 0 || m.Openings != 0 {
				t.Fatalf("%d throttled calls, breaker %+v", throttled, m)
			}
			if n := ev.Count("circuit-exit(failure)"); n != 0 {
				t.Fatalf("%d breaker failures", n)
			}
		})
	}
}
