package outbound_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/retry"
)

// hostile makes one call against an upstream given fault f, under a 10 s
// bound, and returns what the caller saw. Every hostile case must end well
// inside the bound, classified, without a panic (and, through TestMain,
// without a leaked goroutine).
func hostile(t *testing.T, p outboundtest.Proto, cfg outbound.Config, setup func(s *outboundtest.Server), method string) (*http.Response, []byte, error, *outboundtest.Server) {
	t.Helper()
	s := newServer(t, p)
	c := newClient(t, s, cfg)
	setup(s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, method, s.URL+"/x", nil)
	resp, _, err := c.Do(req)
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if ctx.Err() != nil {
		t.Fatalf("the call ran into the 10 s bound: %v", err)
	}
	return resp, body, err, s
}

func category(err error) classify.Category {
	var ce *classify.Error
	if errors.As(err, &ce) {
		return ce.Category
	}
	return 0
}

func TestAnAbsurdRetryAfterIsCappedAndTheAnswerReturnedAtOnce(t *testing.T) {
	for _, v := range []string{"99999999999999999999999999", "86400", "Fri, 31 Dec 9999 23:59:59 GMT"} {
		s := newServer(t, outboundtest.HTTP1)
		c := newClient(t, s, outbound.Config{})
		s.Enqueue(outboundtest.Respond(503, "Retry-After", v))
		out, status, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x"))
		if err != nil || status != 503 || out.Reason != retry.RetryAfterTooLong || len(out.Attempts) != 1 {
			t.Fatalf("Retry-After %q: status %d err %v outcome %v", v, status, err, out)
		}
	}
}

func TestANegativeOrMalformedRetryAfterIsIgnored(t *testing.T) {
	// (Surrounding spaces are not in this list: header parsing trims them.)
	for _, v := range []string{"-5", "soon", "1.5", "0x10", "3 4", "3, 4", "+2"} {
		s := newServer(t, outboundtest.HTTP1)
		c := newClient(t, s, outbound.Config{})
		s.Enqueue(outboundtest.Respond(503, "Retry-After", v))
		out, status, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x"))
		if err != nil || status != 200 || len(out.Attempts) != 2 || out.Attempts[0].Wait > time.Second {
			t.Fatalf("Retry-After %q: status %d err %v outcome %v", v, status, err, out)
		}
	}
}

// Go's client reads at most 10 MiB of response headers by default
// (Transport.MaxResponseHeaderBytes); 16 MiB is refused, and classified.
func TestResponseHeadersFarOverTheLimitAreRefusedAndClassified(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			_, _, err, _ := hostile(t, p, outbound.Config{MaxAttempts: 1},
				func(s *outboundtest.Server) { s.Enqueue(outboundtest.HugeHeaders(16 << 20)) }, http.MethodPost)
			if err == nil || category(err) != classify.Ambiguous {
				t.Fatalf("16 MiB of headers: %v (category %v)", err, category(err))
			}
		})
	}
}

func TestAnEndlessBodyIsCutByTheAttemptTimeout(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			_, body, err, _ := hostile(t, p, outbound.Config{AttemptTimeout: 300 * time.Millisecond},
				func(s *outboundtest.Server) { s.SetDefault(outboundtest.EndlessBody()) }, http.MethodGet)
			if err == nil || category(err) != classify.Answered {
				t.Fatalf("endless body: read %d bytes, err %v (category %v)", len(body), err, category(err))
			}
		})
	}
}

func TestAGoAwayWithAHugeDebugPayloadIsClassified(t *testing.T) {
	for _, p := range []outboundtest.Proto{outboundtest.H2C, outboundtest.H2TLS} {
		t.Run(p.String(), func(t *testing.T) {
			_, _, err, s := hostile(t, p, outbound.Config{MaxAttempts: 1},
				func(s *outboundtest.Server) { s.Enqueue(outboundtest.GoAway(1, 0, false).WithDebugData(1 << 20)) }, http.MethodPost)
			if err == nil || category(err) == 0 {
				t.Fatalf("GOAWAY with 1 MiB of debug data: %v", err)
			}
			if category(err) == classify.NotSent && s.Executions("") != 0 {
				t.Fatal("NotSent but executed")
			}
		})
	}
}

func TestAServerThatAcceptsAndNeverAnswersIsCutByTheAttemptTimeout(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			_, _, err, _ := hostile(t, p, outbound.Config{AttemptTimeout: 200 * time.Millisecond, MaxAttempts: 2},
				func(s *outboundtest.Server) { s.SetDefault(outboundtest.Hang()) }, http.MethodGet)
			if category(err) != classify.Ambiguous || !errors.Is(err, classify.ErrAttemptTimeout) {
				t.Fatalf("hung upstream: %v (category %v)", err, category(err))
			}
		})
	}
}

func TestAServerThatTricklesOneBytePerSecondIsCutByTheAttemptTimeout(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			_, body, err, _ := hostile(t, p, outbound.Config{AttemptTimeout: 500 * time.Millisecond},
				func(s *outboundtest.Server) { s.SetDefault(outboundtest.Trickle(time.Second, 100)) }, http.MethodGet)
			if err == nil || category(err) != classify.Answered || len(body) > 2 {
				t.Fatalf("trickle: read %d bytes, err %v (category %v)", len(body), err, category(err))
			}
		})
	}
}

func TestInvalidStatusLinesAreClassified(t *testing.T) {
	for _, p := range protos {
		t.Run(p.String(), func(t *testing.T) {
			_, _, err, _ := hostile(t, p, outbound.Config{MaxAttempts: 1},
				func(s *outboundtest.Server) { s.Enqueue(outboundtest.BadStatusLine()) }, http.MethodPost)
			if category(err) != classify.Ambiguous {
				t.Fatalf("invalid status line: %v (category %v)", err, category(err))
			}
		})
	}
}

func TestATLSPeerThatStallsTheHandshakeIsCutAndNotSent(t *testing.T) {
	_, _, err, _ := hostile(t, outboundtest.H2TLS, outbound.Config{AttemptTimeout: 300 * time.Millisecond, MaxAttempts: 1},
		func(s *outboundtest.Server) { s.EnqueueConn(outboundtest.StallOnAccept()) }, http.MethodPost)
	var ce *classify.Error
	if !errors.As(err, &ce) || ce.Category != classify.NotSent || ce.Stage != classify.StageTLS {
		t.Fatalf("stalled handshake: %v", err)
	}
}
