package attempt_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/outboundtest"
)

// Regression: an upstream of two addresses (an UpstreamKey that names both
// one upstream) whose one pool lost its last connection while the other
// kept one forgot that pool but kept it in its list: the next attempt to
// its address found it, was told to renew it, was given it again, and spun
// for ever, past its deadline, holding its permit.
func TestAPoolForgottenBesideALiveOneIsNeverFoundAgain(t *testing.T) {
	a, b := newServer(t, outboundtest.HTTP1), newServer(t, outboundtest.HTTP1)
	base := a.Transport()
	dialer := &net.Dialer{}
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, _ := net.SplitHostPort(addr)
		to := map[string]string{"a.test": a.URL, "b.test": b.URL}[host][len("http://"):]
		return dialer.DialContext(ctx, network, to)
	}
	tr := newTransportWith(t, attempt.Config{HTTPTransport: base, IdleConnTimeout: 200 * time.Millisecond,
		UpstreamKey: func(*http.Request) string { return "svc" }})
	get := func(host string, i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/%d", host, i), nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body) // read to the end: the connection stays
			resp.Body.Close()
		}
		return err
	}
	// a's connection goes idle first and is closed by its idle timer while
	// b's is still in use: a's pool is forgotten, b's is not.
	if err := get("a.test", 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // the idle timers' order, not a timing assertion
	if err := get("b.test", 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		for i := range 20 {
			if err := get("a.test", i); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second): // a hang detector, far beyond the calls' own 2 s deadlines
		t.Fatal("calls to a.test did not end: an attempt spins on a forgotten pool")
	}
}
