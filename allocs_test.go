package outbound_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/outcome"
)

// The target is end-to-end throughput within 2% of a bare net/http client with classification on; allocations are what this
// library adds per request on top of net/http's own. A plain GET through
// every guard must not allocate more than the same GET through a bare
// http.Transport (the in-process server's allocations count on both sides).
func TestAPlainCallAllocatesNoMoreThanBareNetHTTP(t *testing.T) {
	if testing.Short() {
		t.Skip("measures allocations over many requests")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	bare := &http.Transport{}
	defer bare.CloseIdleConnections()
	ours, err := outbound.New(outbound.Config{
		HTTPTransport: &http.Transport{},
		Admission: admission.Config{
			Rate:     ratelimit.Config{PerSecond: 1e6, Burst: 1e6},
			Bulkhead: bulkhead.Config{MaxConcurrent: 100},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close()

	perRequest := func(rt http.RoundTripper) float64 {
		get := func() {
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		get() // the connection is dialled outside the measure
		return testing.AllocsPerRun(300, get)
	}
	b, o := perRequest(bare), perRequest(ours)
	t.Logf("allocations per request, client and server: bare %.1f, outbound %.1f", b, o)
	if o > b {
		t.Fatalf("outbound allocates %.1f per request, bare net/http %.1f", o, b)
	}
}

type uncomparableCtx struct {
	context.Context
	tags []string
}

// Regression: a call whose context is a value that cannot be compared (it
// holds a slice) once panicked in the attempt layer, which compared it with
// the request's to decide whether to copy the request.
func TestACallWithAnUncomparableContextDoesNotPanic(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	req, _ := http.NewRequestWithContext(uncomparableCtx{Context: context.Background(), tags: []string{"a"}}, http.MethodGet, srv.URL, nil)
	resp, out, err := tr.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if out.Commit != outcome.Committed {
		t.Fatalf("commit %v, want committed", out.Commit)
	}
}

// A call whose attempt changes nothing in the request (no hook, no timeout,
// no added header, no body) sends the caller's request itself, not a copy:
// the answer's Request is the caller's. One added header makes it a copy.
func TestAnUnchangedRequestIsSentWithoutACopy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer srv.Close()
	for _, keys := range []bool{false, true} {
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{}, IdempotencyKeys: keys})
		if err != nil {
			t.Fatal(err)
		}
		method := http.MethodGet
		if keys {
			method = http.MethodPost // gets an Idempotency-Key, so a copy
		}
		req, _ := http.NewRequest(method, srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		tr.Close()
		if sent := resp.Request == req; sent == keys {
			t.Fatalf("idempotency keys %v: caller's request sent itself = %v", keys, sent)
		}
	}
}
