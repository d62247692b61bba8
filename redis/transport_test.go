package outboundredis_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/internal/redistest"
	"github.com/outboundhq/outbound/outcome"
	outboundredis "github.com/outboundhq/outbound/redis"
)

// Through a Transport, the fleet's limit is the rate guard of every
// upstream, and a Redis that goes down is never an upstream failure: the
// calls it refuses are local rejections, proven not sent, and the breaker
// of a healthy upstream stays CLOSED with nothing recorded.
func TestARedisDownIsALocalRejectionNeverAnUpstreamFailure(t *testing.T) {
	srv := redistest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	l := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1000,
		Degraded: outboundredis.Degraded{Reject: true, RetryEvery: time.Hour}})
	tr, err := outbound.New(outbound.Config{
		Admission: admission.Config{
			Circuit:   circuit.Config{WindowSize: 4, MinimumCalls: 4},
			RateGuard: l.For,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	c := &http.Client{Transport: tr}
	get := func() (*http.Response, error) { return c.Get(up.URL) }
	resp, err := get()
	if err != nil {
		t.Fatalf("with Redis up: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	srv.Kill()
	for range 20 {
		resp, err := get()
		if err == nil {
			resp.Body.Close()
			t.Fatal("a call went through with Redis down and Degraded.Reject set")
		}
		out, _ := outbound.OutcomeOf(err)
		if !errors.Is(err, outboundredis.ErrUnavailable) || out == nil || out.Commit != outcome.NotCommitted {
			t.Fatalf("err = %v (outcome %+v), want a local rejection, not committed, carrying ErrUnavailable", err, out)
		}
	}
	b, ok := tr.Breaker(tr.UpstreamKey(mustRequest(t, up.URL)))
	if !ok {
		t.Fatal("no breaker for the upstream")
	}
	if m := b.Metrics(); m.State != circuit.Closed || m.Calls != 1 || m.Failed != 0 {
		t.Fatalf("breaker %+v: Redis being down was recorded against the upstream", m)
	}
}

func mustRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
