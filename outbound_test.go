package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

var protos = testkit.Protos

func newServer(t *testing.T, p outboundtest.Proto) *outboundtest.Server {
	return testkit.NewServer(t, p)
}

func newClient(t *testing.T, s *outboundtest.Server, cfg outbound.Config) *outbound.Transport {
	t.Helper()
	cfg.HTTPTransport = s.Transport()
	if cfg.Backoff == (retry.Backoff{}) {
		cfg.Backoff = retry.Backoff{Initial: 1, Max: 1, Jitter: -1} // tests do not wait between attempts
	}
	c, err := outbound.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

type bodyKind = testkit.BodyKind

const (
	noBody     = testkit.NoBody
	replayable = testkit.Replayable
	oneShot    = testkit.OneShot
)

func newRequest(t *testing.T, ctx context.Context, s *outboundtest.Server, k bodyKind, id string) *http.Request {
	t.Helper()
	return testkit.NewRequest(t, ctx, s, k, id)
}

// do makes a call, reads the whole body and returns the outcome.
func do(t *testing.T, c *outbound.Transport, req *http.Request) (*outcome.Outcome, int, error) {
	t.Helper()
	resp, out, err := c.Do(req)
	if (resp == nil) == (err == nil) {
		t.Fatalf("Do returned resp %v and err %v", resp, err)
	}
	if out == nil {
		t.Fatal("no outcome")
	}
	if err != nil {
		if o, ok := outbound.OutcomeOf(err); !ok || o != out {
			t.Fatalf("the error does not carry the outcome: %v", err)
		}
		return out, 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return out, resp.StatusCode, nil
}

// faultCatalogue is every fault of the upstream, as queued for the first
// attempt; later attempts get Respond(200).
var faultCatalogue = []struct {
	name   string
	h2only bool
	fault  func(s *outboundtest.Server)
}{
	{"ok", false, func(s *outboundtest.Server) {}},
	{"503", false, func(s *outboundtest.Server) { s.Enqueue(outboundtest.Respond(503)) }},
	{"503 Retry-After 1", false, func(s *outboundtest.Server) { s.Enqueue(outboundtest.Respond(503, "Retry-After", "0")) }},
	{"reset on accept", false, func(s *outboundtest.Server) { s.EnqueueConn(outboundtest.ResetOnAccept()) }},
	{"close on accept", false, func(s *outboundtest.Server) { s.EnqueueConn(outboundtest.CloseOnAccept()) }},
	{"reset before read", false, func(s *outboundtest.Server) { s.Enqueue(outboundtest.ResetBeforeRead()) }},
	{"close before read", false, func(s *outboundtest.Server) { s.Enqueue(outboundtest.CloseBeforeRead()) }},
	{"reset after read", false, func(s *outboundtest.Server) { s.Enqueue(outboundtest.ResetAfterRead()) }},
	{"partial headers", false, func(s *outboundtest.Server) { s.Enqueue(outboundtest.PartialHeaders()) }},
	{"truncated body", false, func(s *outboundtest.Server) { s.Enqueue(outboundtest.TruncatedBody(100, 10)) }},
	{"REFUSED_STREAM", true, func(s *outboundtest.Server) { s.Enqueue(outboundtest.RefusedStream()) }},
	{"RST_STREAM INTERNAL_ERROR", true, func(s *outboundtest.Server) { s.Enqueue(outboundtest.ResetStream(0x2)) }},
	{"GOAWAY below the stream", true, func(s *outboundtest.Server) { s.Enqueue(outboundtest.GoAway(1, 0, false)) }},
	{"GOAWAY at the stream", true, func(s *outboundtest.Server) { s.Enqueue(outboundtest.GoAway(1, 1, false)) }},
	{"close mid-stream", true, func(s *outboundtest.Server) { s.Enqueue(outboundtest.CloseMidStream()) }},
}

// TestNoNonIdempotentCallIsExecutedTwiceAndCommitStatusMatchesExecutions
// runs every fault of the catalogue over every protocol, for a GET, a POST
// with a replayable body and a POST with a one-shot body, and checks that a
// POST is never executed twice and that the commit status the caller learns
// agrees with what the upstream counted.
func TestNoNonIdempotentCallIsExecutedTwiceAndCommitStatusMatchesExecutions(t *testing.T) {
	for _, p := range protos {
		for _, fc := range faultCatalogue {
			if fc.h2only && p == outboundtest.HTTP1 {
				continue
			}
			for _, k := range []bodyKind{noBody, replayable, oneShot} {
				t.Run(fmt.Sprintf("%v/%s/%v", p, fc.name, k), func(t *testing.T) {
					t.Parallel()
					s := newServer(t, p)
					c := newClient(t, s, outbound.Config{})
					fc.fault(s)
					id := "call"
					out, status, err := do(t, c, newRequest(t, context.Background(), s, k, id))
					execs := s.Executions(id)
					t.Logf("%v status %d execs %d\n%v", out.Commit, status, execs, out)
					if k != noBody && execs > 1 {
						t.Fatalf("a POST was executed %d times", execs)
					}
					switch out.Commit {
					case outcome.Committed:
						if err != nil || status == 0 {
							t.Fatalf("committed without an answer: %v", err)
						}
					case outcome.NotCommitted:
						if execs != 0 || !errors.Is(err, outcome.ErrNotCommitted) {
							t.Fatalf("not committed, but executed %d times (err %v)", execs, err)
						}
					case outcome.Unknown:
						if !errors.Is(err, outcome.ErrUnknown) {
							t.Fatalf("unknown without ErrUnknown: %v", err)
						}
					default:
						t.Fatalf("no commit status: %v", out)
					}
					for _, a := range out.Attempts[:len(out.Attempts)-1] {
						if k != noBody && a.Category != classify.NotSent {
							t.Fatalf("a POST was retried after %v", a.Category)
						}
					}
				})
			}
		}
	}
}

// Calls whose attempts were proven not processed, then succeeded, are
// committed with exactly one execution, whatever the method. A one-shot body
// goes out again only if the failed attempt never read it (a refused
// connection); once written, it is never re-sent.
func TestNotSentThenAnsweredIsCommittedWithExactlyOneExecution(t *testing.T) {
	cases := []struct {
		name   string
		protos []outboundtest.Proto
		setup  func(s *outboundtest.Server, cfg *outbound.Config)
	}{
		{"REFUSED_STREAM", []outboundtest.Proto{outboundtest.H2C, outboundtest.H2TLS},
			func(s *outboundtest.Server, _ *outbound.Config) { s.Enqueue(outboundtest.RefusedStream()) }},
		{"GOAWAY above the stream", []outboundtest.Proto{outboundtest.H2C, outboundtest.H2TLS},
			func(s *outboundtest.Server, _ *outbound.Config) { s.Enqueue(outboundtest.GoAway(1, 0, false)) }},
		{"connection refused, then the upstream is back", protos,
			func(s *outboundtest.Server, cfg *outbound.Config) {
				s.Pause()
				cfg.Admission.OnEvent = func(e admission.Event) {
					if e.String() == "circuit-exit(failure)" {
						s.Resume() // the upstream comes back before the retry
					}
				}
			}},
	}
	for _, tc := range cases {
		for _, p := range tc.protos {
			for _, k := range []bodyKind{replayable, oneShot} {
				t.Run(fmt.Sprintf("%s/%v/%v", tc.name, p, k), func(t *testing.T) {
					s := newServer(t, p)
					var cfg outbound.Config
					tc.setup(s, &cfg)
					c := newClient(t, s, cfg)
					out, status, err := do(t, c, newRequest(t, context.Background(), s, k, "x"))
					if k == oneShot && !strings.HasPrefix(tc.name, "connection refused") {
						// The one-shot body was written before the proof came:
						// it cannot be produced again (D2 wins over D3).
						if !errors.Is(err, outcome.ErrNotCommitted) || out.Reason != retry.OneShotBody || s.Executions("x") != 0 {
							t.Fatalf("one-shot body: err %v, outcome %v", err, out)
						}
						return
					}
					if err != nil || status != 200 || out.Commit != outcome.Committed {
						t.Fatalf("status %d, err %v, outcome %v", status, err, out)
					}
					if len(out.Attempts) != 2 || out.Attempts[0].Category != classify.NotSent || s.Executions("x") != 1 {
						t.Fatalf("executed %d times; outcome %v", s.Executions("x"), out)
					}
				})
			}
		}
	}
}

func TestAnAmbiguousPostReportsCommitStatusUnknown(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			c := newClient(t, s, outbound.Config{})
			s.Enqueue(outboundtest.ResetAfterRead())
			out, _, err := do(t, c, newRequest(t, context.Background(), s, replayable, "x"))
			if !errors.Is(err, outcome.ErrUnknown) || out.Commit != outcome.Unknown || out.Reason != retry.NotIdempotent {
				t.Fatalf("err %v, outcome %v", err, out)
			}
			var ce *classify.Error
			if !errors.As(err, &ce) || ce.Category != classify.Ambiguous {
				t.Fatalf("the attempt's classification is not reachable: %v", err)
			}
			if len(out.Attempts) != 1 || s.Executions("x") != 1 {
				t.Fatalf("attempts %d, executions %d", len(out.Attempts), s.Executions("x"))
			}
		})
	}
}

func TestAnIdempotentCallIsRetriedAfterAnAmbiguousFailure(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	c := newClient(t, s, outbound.Config{})
	s.Enqueue(outboundtest.ResetAfterRead())
	out, status, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x"))
	if err != nil || status != 200 || len(out.Attempts) != 2 || out.Attempts[0].Decision != retry.Retryable {
		t.Fatalf("status %d err %v outcome %v", status, err, out)
	}
}

func admissionWithBadRate() admission.Config {
	var a admission.Config
	a.Rate.PerSecond = -1
	return a
}
