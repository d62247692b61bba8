package attempt_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/outboundtest"
)

// hiddenRetryCases are faults after which Go's http.Transport re-sends a
// request by itself, without the caller or any guard seeing it.
var hiddenRetryCases = []struct {
	name   string
	protos []outboundtest.Proto
	kind   bodyKind
	fault  outboundtest.Fault
}{
	{"reused HTTP/1.1 connection closed by the server, GET", []outboundtest.Proto{outboundtest.HTTP1}, noBody, outboundtest.CloseBeforeRead()},
	{"reused HTTP/1.1 connection closed by the server, POST with GetBody and Idempotency-Key", []outboundtest.Proto{outboundtest.HTTP1}, replayable, outboundtest.CloseBeforeRead()},
	{"REFUSED_STREAM", h2protos, noBody, outboundtest.RefusedStream()},
	{"GOAWAY above the stream", h2protos, noBody, outboundtest.GoAway(1, 0, false)},
}

// TestUpstreamReceivesExactlyTheAttemptsTheGuardsAdmitted checks, in every
// case where Go's transport would re-send a request by itself, that the
// number of requests the upstream received equals the number of attempts the
// admission pipeline admitted. The bare http.Transport is run on the same
// fault first, to show that the case does trigger its hidden retry.
func TestUpstreamReceivesExactlyTheAttemptsTheGuardsAdmitted(t *testing.T) {
	for _, tc := range hiddenRetryCases {
		for _, p := range tc.protos {
			t.Run(tc.name+"/"+p.String(), func(t *testing.T) {
				s := newServer(t, p)

				bare := s.Transport()
				t.Cleanup(bare.CloseIdleConnections)
				if got := sendAfterWarmUp(t, s, bare, tc.kind, tc.fault, "bare"); got < 2 {
					t.Fatalf("the bare transport sent the request %d time(s): the case no longer triggers a hidden retry", got)
				}

				ev := &events{}
				tr := newTransport(t, s, attemptConfigWithEvents(ev))
				received := sendAfterWarmUp(t, s, tr, tc.kind, tc.fault, "ours")
				admitted := ev.Count("circuit-enter") - 1 // minus the warm-up
				if received != 1 || admitted != 1 {
					t.Fatalf("upstream received %d, guards admitted %d; want 1 and 1", received, admitted)
				}
			})
		}
	}
}

func attemptConfigWithEvents(ev *events) attempt.Config {
	var cfg attempt.Config
	cfg.Admission.OnEvent = ev.On
	return cfg
}

// sendAfterWarmUp opens a connection with one good request, queues fault
// for the next request, sends it and returns how many times the upstream
// received it.
func sendAfterWarmUp(t *testing.T, s *outboundtest.Server, tr http.RoundTripper, k bodyKind, fault outboundtest.Fault, id string) int {
	t.Helper()
	if o := roundTrip(tr, newRequest(t, context.Background(), s, noBody, id+"-warm")); o.status != 200 {
		t.Fatalf("warm-up: %+v", o)
	}
	s.Enqueue(fault)
	req := newRequest(t, context.Background(), s, k, id)
	if k == replayable {
		req.Header.Set("Idempotency-Key", "key-"+id)
	}
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return s.Received(id)
}
