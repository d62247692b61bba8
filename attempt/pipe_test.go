package attempt_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/attempt"
)

// pipeUpstream is an HTTP/1.1 upstream on in-memory connections, so that
// it runs inside a synctest bubble: each answer is "ok", after the delay
// given in the request's path ("/wait/25s"). It answers for any host name.
// While down, dials are refused.
type pipeUpstream struct {
	dials, closes atomic.Int32
	down          atomic.Bool
}

var errRefused = errors.New("connection refused (pipeUpstream is down)")

// open returns the number of connections open.
func (u *pipeUpstream) open() int { return int(u.dials.Load() - u.closes.Load()) }

func (u *pipeUpstream) dial(context.Context, string, string) (net.Conn, error) {
	if u.down.Load() {
		return nil, errRefused
	}
	u.dials.Add(1)
	client, server := net.Pipe()
	go func() {
		defer u.closes.Add(1)
		defer server.Close()
		r := bufio.NewReader(server)
		for {
			req, err := http.ReadRequest(r)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if d, ok := strings.CutPrefix(req.URL.Path, "/wait/"); ok {
				wait, _ := time.ParseDuration(d)
				time.Sleep(wait)
			}
			if _, err := io.WriteString(server, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	}()
	return client, nil
}

func (u *pipeUpstream) get(t *testing.T, tr *attempt.Attempter, path string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://upstream.test"+path, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	synctest.Wait()
}

// uncomparableCtx and uncomparableBody are legal implementations of
// context.Context and io.ReadCloser by value types that hold a slice:
// comparing two of them with == panics.
type uncomparableCtx struct {
	context.Context
	tags []string
}

type uncomparableBody struct {
	r    *strings.Reader
	tags []string
}

func (b uncomparableBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b uncomparableBody) Close() error               { return nil }

// Regression: the attempt layer once compared the attempt's context and body
// with the request's to decide whether to copy the request, and panicked on
// such values (leaking the admission permit and the connection's
// reservation).
func TestAnUncomparableContextOrBodyIsSentWithoutPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		tr, err := attempt.New(attempt.Config{
			HTTPTransport: &http.Transport{DialContext: u.dial},
			Admission:     admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 4}},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		req, _ := http.NewRequest(http.MethodPost, "http://upstream.test/", nil)
		req.Body = uncomparableBody{r: strings.NewReader("payload"), tags: []string{"a"}}
		req.ContentLength = int64(len("payload"))
		req = req.WithContext(uncomparableCtx{Context: context.Background(), tags: []string{"b"}})
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r, err := tr.Route(req)
		if err != nil {
			t.Fatal(err)
		}
		if n := r.Pipeline().Bulkhead().InUse(); n != 0 {
			t.Fatalf("%d bulkhead slots held after the attempt", n)
		}
	})
}
