package attempt_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/attempt"
)

// pipeUpstream is an HTTP/1.1 upstream on in-memory connections, so that
// it runs inside a synctest bubble: each answer is "ok", after the delay
// given in the request's path ("/wait/25s").
type pipeUpstream struct {
	dials, closes atomic.Int32
}

func (u *pipeUpstream) dial(context.Context, string, string) (net.Conn, error) {
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

func (u *pipeUpstream) get(t *testing.T, tr *attempt.Transport, path string) {
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

// The idle timeout counts from the moment a connection last had nothing in
// flight: a connection used again within it stays open, one left idle for
// it is closed, and one carrying a request longer than it is not closed
// under the request.
func TestIdleConnTimeoutCountsFromTheLastRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		tr, err := attempt.New(attempt.Config{
			Transport:       &http.Transport{DialContext: u.dial},
			IdleConnTimeout: 10 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()

		u.get(t, tr, "/")
		time.Sleep(5 * time.Second)
		u.get(t, tr, "/") // idle since 5s
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if n := u.closes.Load(); n != 0 {
			t.Fatalf("closed after 9s idle (timeout 10s), counting from the first request")
		}
		u.get(t, tr, "/wait/25s") // in flight for 2.5 timeouts
		if d, c := u.dials.Load(), u.closes.Load(); d != 1 || c != 0 {
			t.Fatalf("%d dials and %d closes, want the one connection throughout", d, c)
		}
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if n := u.closes.Load(); n != 0 {
			t.Fatal("closed 9s after a long request ended")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := u.closes.Load(); n != 1 {
			t.Fatalf("%d connections closed after 11s idle, want 1", n)
		}
		u.get(t, tr, "/")
		if n := u.dials.Load(); n != 2 {
			t.Fatalf("%d dials, want a new connection after the idle one was closed", n)
		}
	})
}
