package outboundtest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound/outboundtest"
)

// outcome is what a plain net/http client observes for one GET, and what the
// server counted for it.
type outcome struct {
	err        bool   // Do returned an error
	status     int    // else the status
	body       string // and, if not "", the body read before any error
	bodyErr    bool   // reading the body failed
	recv, exec int
}

// TestFaultOutcomes pins, for each fault and protocol, what a net/http client
// sees and what the server counts. Each case uses a fresh client, so HTTP/1
// never reuses a connection (reused connections add retries of their own).
func TestFaultOutcomes(t *testing.T) {
	cases := []struct {
		fault   outboundtest.Fault
		timeout time.Duration // client deadline, for faults that never end
		limit   int64         // read at most this much body, for endless ones
		want    func(p outboundtest.Proto) outcome
	}{
		{fault: outboundtest.Respond(202, "X-A", "1").WithBody([]byte("accepted")),
			want: always(outcome{status: 202, body: "accepted", recv: 1, exec: 1})},
		{fault: outboundtest.Slow(10*time.Millisecond, 201),
			want: always(outcome{status: 201, body: "ok\n", recv: 1, exec: 1})},
		{fault: outboundtest.Hang(), timeout: 50 * time.Millisecond,
			want: always(outcome{err: true, recv: 1, exec: 1})},
		{fault: outboundtest.CloseBeforeRead(),
			want: always(outcome{err: true, recv: 1, exec: 0})},
		{fault: outboundtest.ResetBeforeRead(),
			want: always(outcome{err: true, recv: 1, exec: 0})},
		{fault: outboundtest.ResetAfterRead(),
			want: always(outcome{err: true, recv: 1, exec: 1})},
		{fault: outboundtest.PartialHeaders(),
			want: always(outcome{err: true, recv: 1, exec: 1})},
		{fault: outboundtest.TruncatedBody(100, 10),
			want: always(outcome{status: 200, body: "xxxxxxxxxx", bodyErr: true, recv: 1, exec: 1})},
		{fault: outboundtest.Trickle(time.Millisecond, 5),
			want: always(outcome{status: 200, body: "xxxxx", recv: 1, exec: 1})},
		// The client accepts 64 KiB of response headers (see below).
		{fault: outboundtest.HugeHeaders(1 << 20),
			want: always(outcome{err: true, recv: 1, exec: 1})},
		{fault: outboundtest.BadStatusLine(),
			want: always(outcome{err: true, recv: 1, exec: 1})},
		{fault: outboundtest.EndlessBody(), limit: 1 << 20,
			want: always(outcome{status: 200, recv: 1, exec: 1})},
		{fault: outboundtest.CloseMidStream(),
			want: always(outcome{status: 200, body: "partial body", bodyErr: true, recv: 1, exec: 1})},
		// net/http re-sends a GET refused with REFUSED_STREAM; the copy
		// takes the default fault.
		{fault: outboundtest.RefusedStream(),
			want: byProto(outcome{status: 501, recv: 1, exec: 0}, outcome{status: 200, recv: 2, exec: 1})},
		{fault: outboundtest.ResetStream(http2.ErrCodeCancel),
			want: byProto(outcome{status: 501, recv: 1, exec: 0}, outcome{err: true, recv: 1, exec: 1})},
		{fault: outboundtest.GoAway(1, 1, true),
			want: byProto(outcome{status: 501, recv: 1, exec: 0}, outcome{status: 200, body: "ok\n", recv: 1, exec: 1})},
	}
	forEachProto(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		for _, tc := range cases {
			t.Run(tc.fault.String(), func(t *testing.T) {
				tr := s.Transport()
				tr.MaxResponseHeaderBytes = 64 << 10
				defer tr.CloseIdleConnections()
				id := p.String() + "/" + tc.fault.String()
				ctx := context.Background()
				if tc.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.timeout)
					defer cancel()
				}
				s.Enqueue(tc.fault)
				got := getOutcome(t, ctx, &http.Client{Transport: tr}, s.URL, id, tc.limit)
				got.recv, got.exec = s.Received(id), s.Executions(id)
				want := tc.want(p)
				if want.body == "" {
					got.body = ""
				}
				if got != want {
					t.Errorf("got %+v\nwant %+v", got, want)
				}
			})
		}
	})
}

func getOutcome(t *testing.T, ctx context.Context, c *http.Client, url, id string, limit int64) outcome {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set(outboundtest.IDHeader, id)
	resp, err := c.Do(req)
	if err != nil {
		t.Logf("client error: %v", err)
		return outcome{err: true}
	}
	defer resp.Body.Close()
	var body []byte
	if limit > 0 {
		body = make([]byte, limit)
		_, err = io.ReadFull(resp.Body, body)
		body = nil
	} else {
		body, err = io.ReadAll(resp.Body)
	}
	if err != nil {
		t.Logf("body error: %v", err)
	}
	return outcome{status: resp.StatusCode, body: string(body), bodyErr: err != nil}
}

func always(o outcome) func(outboundtest.Proto) outcome {
	return func(outboundtest.Proto) outcome { return o }
}

func byProto(http1, http2 outcome) func(outboundtest.Proto) outcome {
	return func(p outboundtest.Proto) outcome {
		if p == outboundtest.HTTP1 {
			return http1
		}
		return http2
	}
}

// Slow and Hang stop waiting as soon as the client gives up, not when the
// server closes.
func TestSlowAndHangStopWhenTheClientGoesAway(t *testing.T) {
	forEachProto(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		c := newClient(t, s)
		for _, f := range []outboundtest.Fault{outboundtest.Slow(time.Hour, 200), outboundtest.Hang()} {
			s.Enqueue(f)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, _, err := doCtx(ctx, c, "GET", s.URL, "x", nil)
				done <- err
			}()
			if !eventually(func() bool { return s.TotalExecutions() > 0 }) {
				t.Fatal("the request never arrived")
			}
			cancel()
			if err := <-done; err == nil {
				t.Fatal("cancelled request succeeded")
			}
			// What is left is at most the HTTP/2 connection's reader,
			// idle.
			if !eventually(func() bool {
				return !strings.Contains(serverStacks(), "serveStream") && !strings.Contains(serverStacks(), "serveRequest1")
			}) {
				t.Fatalf("%v still serves the request after the client left:\n%s", f, serverStacks())
			}
			s.Reset()
		}
	})
}

// Queued serves at most its capacity at once, the others waiting for a
// worker, and answers 200; a request whose client goes away leaves the
// queue and gives its worker back.
func TestQueuedServesAtMostItsCapacityAtOnce(t *testing.T) {
	forEachProto(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		c := newClient(t, s)
		s.SetDefault(outboundtest.Queued(2, time.Millisecond))
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				if resp, _, err := doCtx(context.Background(), c, "GET", s.URL, fmt.Sprint(i), nil); err != nil || resp.StatusCode != 200 {
					t.Errorf("request %d: %v %v", i, resp, err)
				}
			})
		}
		wg.Wait()
		if n := outboundtest.QueuedBusy(s, 2); n != 0 {
			t.Fatalf("%d workers still taken after every answer", n)
		}

		s.SetDefault(outboundtest.Queued(2, time.Hour))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 3)
		for i := range 3 {
			go func() { _, _, err := doCtx(ctx, c, "GET", s.URL, fmt.Sprint("q", i), nil); done <- err }()
		}
		if !eventually(func() bool { return s.TotalExecutions() == 9 && outboundtest.QueuedBusy(s, 2) == 2 }) {
			t.Fatalf("three requests to a capacity of two: %d executed, %d workers taken", s.TotalExecutions(), outboundtest.QueuedBusy(s, 2))
		}
		if n := outboundtest.QueuedBusy(s, 2); n != 2 {
			t.Fatalf("%d workers taken by three requests, capacity two", n)
		}
		cancel()
		for range 3 {
			if err := <-done; err == nil {
				t.Fatal("a cancelled request succeeded")
			}
		}
		if !eventually(func() bool { return outboundtest.QueuedBusy(s, 2) == 0 }) {
			t.Fatalf("%d workers still taken after the clients left", outboundtest.QueuedBusy(s, 2))
		}
		if !eventually(func() bool {
			return !strings.Contains(serverStacks(), "serveStream") && !strings.Contains(serverStacks(), "serveRequest1")
		}) {
			t.Fatalf("the server still serves the requests after the clients left:\n%s", serverStacks())
		}
	})
}
