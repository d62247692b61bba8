package outbound_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound"
)

// pipeDial dials an in-memory HTTP/1.1 upstream that answers "ok" for any
// host, so that a test runs in a synctest bubble.
func pipeDial(context.Context, string, string) (net.Conn, error) {
	client, server := net.Pipe()
	go func() {
		defer server.Close()
		r := bufio.NewReader(server)
		for {
			req, err := http.ReadRequest(r)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if _, err := io.WriteString(server, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	}()
	return client, nil
}

// An idle upstream's retry budget is forgotten with the rest of its state,
// and the hooks are told; looking a budget up creates none.
func TestAForgottenUpstreamTakesItsRetryBudgetWithIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var forgotten []string
		tr, err := outbound.New(outbound.Config{Transport: &http.Transport{DialContext: pipeDial},
			UpstreamIdleTime: time.Minute, Hooks: outbound.Hooks{UpstreamForgotten: func(u string) { forgotten = append(forgotten, u) }}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		if _, ok := tr.Upstream("http://upstream.test:80"); ok {
			t.Fatal("a budget before any call")
		}
		req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if _, ok := tr.Upstream("http://upstream.test:80"); !ok {
			t.Fatal("no budget after a call")
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if _, ok := tr.Upstream("http://upstream.test:80"); ok || len(forgotten) != 1 || forgotten[0] != "http://upstream.test:80" {
			t.Fatalf("after 10 idle minutes: budget kept %v, forgotten %v", ok, forgotten)
		}
	})
}
