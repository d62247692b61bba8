package attempt_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
)

// want is the expected classification of one attempt against one fault.
// Where the outcome depends on a race the fault cannot control (the kernel
// may accept our bytes before the peer's reset arrives), alt lists the other
// category allowed; the invariant "NotSent means not executed" is checked in
// every case.
type want struct {
	stage    classify.Stage
	category classify.Category
	alt      classify.Category
	execs    int
	status   int
}

type faultCase struct {
	name    string
	h2only  bool
	h1only  bool
	setup   func(s *outboundtest.Server)
	timeout time.Duration // per-attempt timeout, for faults that never answer
	want    want
}

var faultCatalogue = []faultCase{
	{name: "ok", setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.Respond(200)) },
		want: want{stage: classify.StageAwait, category: classify.Answered, execs: 1, status: 200}},
	{name: "503 with Retry-After", setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.Respond(503, "Retry-After", "30")) },
		want: want{stage: classify.StageAwait, category: classify.Answered, execs: 1, status: 503}},
	{name: "connection refused", setup: func(s *outboundtest.Server) { s.Pause() },
		want: want{stage: classify.StageDial, category: classify.NotSent, execs: 0}},
	{name: "reset on accept", setup: func(s *outboundtest.Server) { s.EnqueueConn(outboundtest.ResetOnAccept()) },
		want: want{category: classify.NotSent, alt: classify.Ambiguous, execs: 0}},
	{name: "close on accept", setup: func(s *outboundtest.Server) { s.EnqueueConn(outboundtest.CloseOnAccept()) },
		want: want{category: classify.NotSent, alt: classify.Ambiguous, execs: 0}},
	{name: "reset before reading the request", setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.ResetBeforeRead()) },
		want: want{category: classify.Ambiguous, execs: 0}},
	{name: "close before reading the request", setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.CloseBeforeRead()) },
		want: want{category: classify.Ambiguous, execs: 0}},
	{name: "reset after reading the request", setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.ResetAfterRead()) },
		want: want{stage: classify.StageAwait, category: classify.Ambiguous, execs: 1}},
	{name: "partial headers", setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.PartialHeaders()) },
		want: want{stage: classify.StageAwait, category: classify.Ambiguous, execs: 1}},
	{name: "truncated body", setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.TruncatedBody(1000, 10)) },
		want: want{stage: classify.StageReadBody, category: classify.Answered, execs: 1, status: 200}},
	{name: "slow answer past the attempt timeout", timeout: 200 * time.Millisecond,
		setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.Slow(5*time.Second, 200)) },
		want:  want{stage: classify.StageAwait, category: classify.Ambiguous, execs: 1}},
	{name: "TLS handshake stalls", timeout: 200 * time.Millisecond, h2only: true,
		setup: func(s *outboundtest.Server) {
			if s.Proto == outboundtest.H2TLS {
				s.EnqueueConn(outboundtest.StallOnAccept())
			} else {
				s.Pause() // no TLS to stall: the same expectation, from a refused dial
			}
		},
		want: want{category: classify.NotSent, execs: 0}},
	{name: "REFUSED_STREAM", h2only: true, setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.RefusedStream()) },
		want: want{stage: classify.StageAwait, category: classify.NotSent, execs: 0}},
	{name: "RST_STREAM INTERNAL_ERROR after processing", h2only: true,
		setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.ResetStream(http2.ErrCodeInternal)) },
		want:  want{stage: classify.StageAwait, category: classify.Ambiguous, execs: 1}},
	{name: "RST_STREAM PROTOCOL_ERROR after processing", h2only: true,
		setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.ResetStream(http2.ErrCodeProtocol)) },
		want:  want{stage: classify.StageAwait, category: classify.Ambiguous, execs: 1}},
	{name: "GOAWAY below the stream", h2only: true, setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.GoAway(1, 0, false)) },
		want: want{stage: classify.StageAwait, category: classify.NotSent, execs: 0}},
	{name: "GOAWAY at the stream, no answer", h2only: true, setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.GoAway(1, 1, false)) },
		want: want{stage: classify.StageAwait, category: classify.Ambiguous, execs: 1}},
	{name: "GOAWAY at the stream, answered", h2only: true, setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.GoAway(1, 1, true)) },
		want: want{stage: classify.StageAwait, category: classify.Answered, execs: 1, status: 200}},
	{name: "connection closed mid-stream", h2only: true, setup: func(s *outboundtest.Server) { s.Enqueue(outboundtest.CloseMidStream()) },
		want: want{stage: classify.StageReadBody, category: classify.Answered, execs: 1, status: 200}},
}

// TestEveryFaultIsClassifiedOnEveryProtocol runs the fault catalogue over
// HTTP/1.1, h2c and h2 with TLS, for a GET, a POST with a replayable body
// and a POST with a one-shot body, and checks stage, category and how many
// times the upstream executed the request.
func TestEveryFaultIsClassifiedOnEveryProtocol(t *testing.T) {
	for _, proto := range protos {
		for _, fc := range faultCatalogue {
			if fc.h2only && proto == outboundtest.HTTP1 || fc.h1only && proto != outboundtest.HTTP1 {
				continue
			}
			for _, k := range []bodyKind{noBody, replayable, oneShot} {
				t.Run(fmt.Sprintf("%v/%s/%v", proto, fc.name, k), func(t *testing.T) {
					t.Parallel()
					s := newServer(t, proto)
					tr := newTransport(t, s, attempt.Config{})
					fc.setup(s)
					ctx := context.Background()
					if fc.timeout > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeoutCause(ctx, fc.timeout, classify.ErrAttemptTimeout)
						defer cancel()
					}
					id := t.Name()
					got := roundTrip(tr, newRequest(t, ctx, s, k, id))
					t.Logf("%v %v (%v) status %d execs %d: %v", got.stage, got.category, got.evidence, got.status, s.Executions(id), got.err)
					checkOutcome(t, got, fc.want, s.Executions(id))
				})
			}
		}
	}
}

func checkOutcome(t *testing.T, got outcome, w want, execs int) {
	t.Helper()
	if got.category == 0 {
		t.Fatalf("unclassified error: %v", got.err)
	}
	if got.category == classify.NotSent && execs != 0 {
		t.Fatalf("NotSent but the upstream executed it %d times (%v)", execs, got.err)
	}
	if got.category != w.category && (w.alt == 0 || got.category != w.alt) {
		t.Fatalf("category %v (%v), want %v; err: %v", got.category, got.evidence, w.category, got.err)
	}
	if w.stage != 0 && got.stage != w.stage {
		t.Fatalf("stage %v, want %v; err: %v", got.stage, w.stage, got.err)
	}
	if execs != w.execs {
		t.Fatalf("executed %d times, want %d", execs, w.execs)
	}
	if got.status != w.status {
		t.Fatalf("status %d, want %d", got.status, w.status)
	}
	if got.category != classify.Answered && !errors.Is(got.err, sentinel(got.category)) {
		t.Fatalf("errors.Is(err, sentinel of %v) is false: %v", got.category, got.err)
	}
}

func sentinel(c classify.Category) error {
	switch c {
	case classify.LocalRejection:
		return classify.ErrLocalRejection
	case classify.NotSent:
		return classify.ErrNotSent
	case classify.Ambiguous:
		return classify.ErrAmbiguous
	}
	return classify.ErrAnswered
}
