package attempt

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/outboundhq/outbound/outboundtest/testkit"
)

// pipeDial dials an in-memory HTTP/1.1 upstream that answers "ok", so that
// the test runs in a synctest bubble.
var pipeDial = testkit.PipeDial(func(string) string { return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" })

// A connection closed by CloseIdleConnections or by the idle timeout is
// released at once: nothing of the Transport keeps it reachable (a pool once
// kept closed connections in the vacated slots of its slices).
func TestAClosedConnectionIsUnreachable(t *testing.T) {
	for _, how := range []string{"CloseIdleConnections", "the idle timeout"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, err := New(Config{HTTPTransport: &http.Transport{DialContext: pipeDial, MaxIdleConns: 10}, IdleConnTimeout: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				var wg sync.WaitGroup
				start := make(chan struct{})
				for range 3 { // three connections at once, then idle
					wg.Go(func() {
						<-start
						req, _ := http.NewRequest(http.MethodGet, "http://upstream.test/", nil)
						resp, err := tr.RoundTrip(req)
						if err != nil {
							t.Error(err)
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					})
				}
				close(start)
				wg.Wait()
				synctest.Wait()
				tr.mu.RLock()
				p := tr.upstreams["http://upstream.test:80"].pools[0]
				tr.mu.RUnlock()
				p.mu.Lock()
				conns := make([]weak.Pointer[conn], len(p.conns))
				clientConns := make([]weak.Pointer[http.ClientConn], len(p.conns))
				for i, c := range p.conns {
					conns[i], clientConns[i] = weak.Make(c), weak.Make(c.cc)
				}
				p.mu.Unlock()
				if len(conns) == 0 {
					t.Fatal("no connection to watch")
				}
				if how == "CloseIdleConnections" {
					tr.CloseIdleConnections()
				} else {
					time.Sleep(2 * time.Minute)
				}
				synctest.Wait()
				runtime.GC()
				for i := range conns {
					if conns[i].Value() != nil || clientConns[i].Value() != nil {
						t.Fatalf("connection %d of %d still reachable after %s", i+1, len(conns), how)
					}
				}
			})
		})
	}
}

// A Transport that knew many upstreams gives their memory back once it has
// forgotten them: a Go map keeps its buckets after deletes, so the maps are
// rebuilt when they shrink (they once kept ~100 B per forgotten upstream).
func TestForgottenUpstreamsGiveTheirMemoryBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refused := func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("refused") }
		tr, err := New(Config{HTTPTransport: &http.Transport{DialContext: refused}, UpstreamIdleTime: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		const n = 10000
		for i := range n {
			req, _ := http.NewRequest(http.MethodGet, "http://u"+strconv.Itoa(i)+".test/", nil)
			_, _ = tr.RoundTrip(req)
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(tr)
		if len(tr.Upstreams()) != 0 {
			t.Fatalf("%d upstreams still kept", len(tr.Upstreams()))
		}
		if held := int64(after.HeapAlloc) - int64(before.HeapAlloc); held > 20*n {
			t.Fatalf("%d B held per forgotten upstream", held/n)
		}
	})
}
