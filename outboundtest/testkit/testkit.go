// Package testkit holds helpers for tests that drive the fault upstream of
// package outboundtest: a server per protocol closed with the test,
// requests of the three body kinds a retry decision tells apart (none,
// replayable, one-shot) carrying their call id, a counter of admission
// events, a request body that fails as a caller's can, and an in-memory
// fleet of replicas behind one name (Fleet, Names). This module's
// tests share them; yours may use them too.
package testkit

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/outboundtest"
)

// Protos are the protocols every fault is tried on.
var Protos = []outboundtest.Proto{outboundtest.HTTP1, outboundtest.H2C, outboundtest.H2TLS}

// NewServer starts a fault upstream closed at the end of the test.
func NewServer(t testing.TB, p outboundtest.Proto) *outboundtest.Server {
	t.Helper()
	s := outboundtest.NewServer(p)
	t.Cleanup(s.Close)
	return s
}

// BodyKind is how a request carries its body.
type BodyKind int

const (
	NoBody     BodyKind = iota // GET
	Replayable                 // POST with GetBody
	OneShot                    // POST with a body that can be read once (a *CloseTracker)
)

func (k BodyKind) String() string { return [...]string{"GET", "POST-replayable", "POST-one-shot"}[k] }

// CloseTracker is a one-shot request body that records whether it was
// closed.
type CloseTracker struct {
	io.Reader
	Closed atomic.Bool
}

// Close records the close.
func (c *CloseTracker) Close() error { c.Closed.Store(true); return nil }

// NewRequest returns a request of kind k to s, carrying id in the
// outboundtest.IDHeader so that s counts its executions.
func NewRequest(t testing.TB, ctx context.Context, s *outboundtest.Server, k BodyKind, id string) *http.Request {
	t.Helper()
	var req *http.Request
	var err error
	switch k {
	case NoBody:
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/item", nil)
	case Replayable:
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/orders", strings.NewReader(`{"qty":1}`))
	case OneShot:
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/orders",
			&CloseTracker{Reader: bytes.NewReader([]byte(`{"qty":1}`))})
	}
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(outboundtest.IDHeader, id)
	return req
}

// Events counts admission events by their text ("circuit-exit(failure)").
// Its On method is an admission.Config.OnEvent.
type Events struct {
	mu sync.Mutex
	n  map[string]int
}

// On counts e.
func (e *Events) On(ev admission.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[ev.String()]++
}

// Count returns how many events named name were counted.
func (e *Events) Count(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[name]
}

// ErrBodyFailed is the error of a FailingBody.
var ErrBodyFailed = errors.New("the caller's body failed")

// FailingBody returns a request body that yields a few bytes, then fails
// with ErrBodyFailed, as a caller's body can (a file on a disk that went
// away, a pipe whose writer gave up).
func FailingBody() io.ReadCloser { return &failingBody{} }

type failingBody struct{ sent bool }

func (b *failingBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, "0123456789"), nil
	}
	return 0, ErrBodyFailed
}

func (b *failingBody) Close() error { return nil }
