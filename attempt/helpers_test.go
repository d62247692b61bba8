package attempt_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
)

var protos = testkit.Protos

func newServer(t *testing.T, p outboundtest.Proto) *outboundtest.Server {
	return testkit.NewServer(t, p)
}

func newTransport(t *testing.T, s *outboundtest.Server, cfg attempt.Config) *attempt.Attempter {
	t.Helper()
	cfg.HTTPTransport = s.Transport()
	return newTransportWith(t, cfg)
}

// newTransportWith is newTransport with cfg's own Transport.
func newTransportWith(t *testing.T, cfg attempt.Config) *attempt.Attempter {
	t.Helper()
	tr, err := attempt.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

type bodyKind = testkit.BodyKind

const (
	noBody     = testkit.NoBody
	replayable = testkit.Replayable
	oneShot    = testkit.OneShot
)

type closeTracker = testkit.CloseTracker

func newRequest(t *testing.T, ctx context.Context, s *outboundtest.Server, k bodyKind, id string) *http.Request {
	t.Helper()
	return testkit.NewRequest(t, ctx, s, k, id)
}

// outcome is what one attempt came to, as the caller sees it.
type outcome struct {
	status   int
	stage    classify.Stage
	category classify.Category
	evidence classify.Evidence
	err      error
}

// roundTrip makes one attempt and reads the whole body.
func roundTrip(tr http.RoundTripper, req *http.Request) outcome {
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return fromError(err)
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	o := outcome{status: resp.StatusCode, stage: classify.StageAwait, category: classify.Answered, evidence: classify.EvidenceStatus}
	if err != nil {
		o = fromError(err)
		o.status = resp.StatusCode
	}
	return o
}

func fromError(err error) outcome {
	var ce *classify.Error
	if !errors.As(err, &ce) {
		return outcome{err: err}
	}
	return outcome{stage: ce.Stage, category: ce.Category, evidence: ce.Evidence, err: err}
}

type events = testkit.Events

// pipelineOf returns the admission pipeline kept for key, failing the test if
// there is none.
func pipelineOf(t testing.TB, tr *attempt.Attempter, key string) *admission.Pipeline {
	t.Helper()
	p, ok := tr.Pipeline(key)
	if !ok {
		t.Fatalf("no pipeline kept for %s", key)
	}
	return p
}
