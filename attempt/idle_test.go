package attempt_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/attempt"
)

// The idle timeout counts from the moment a connection last had nothing in
// flight: a connection used again within it stays open, one left idle for
// it is closed, and one carrying a request longer than it is not closed
// under the request.
func TestIdleConnTimeoutCountsFromTheLastRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		tr, err := attempt.New(attempt.Config{
			HTTPTransport:   &http.Transport{DialContext: u.dial},
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
