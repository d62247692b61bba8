package outboundtest_test

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/outboundhq/outbound/outboundtest"
)

var allProtos = []outboundtest.Proto{outboundtest.HTTP1, outboundtest.H2C, outboundtest.H2TLS}

// forEachProto runs fn as a subtest for each protocol. The subtests do not
// run in parallel: the goroutine check of newServer looks at the whole
// process.
func forEachProto(t *testing.T, fn func(t *testing.T, p outboundtest.Proto)) {
	t.Helper()
	for _, p := range allProtos {
		t.Run(p.String(), func(t *testing.T) { fn(t, p) })
	}
}

// newServer starts a server that is closed when the test ends, and then
// checked for leftover goroutines.
func newServer(t *testing.T, p outboundtest.Proto) *outboundtest.Server {
	t.Helper()
	s := outboundtest.NewServer(p)
	t.Cleanup(func() {
		s.Close()
		if leaks := serverGoroutines(); leaks != "" {
			t.Errorf("goroutines of the server remain after Close:\n%s", leaks)
		}
	})
	return s
}

// newClient returns a client speaking s's protocol, with a pool of its own.
func newClient(t *testing.T, s *outboundtest.Server) *http.Client {
	tr := s.Transport()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// do sends a request carrying the call id and reads the whole body.
func do(c *http.Client, method, url, id string, body io.Reader) (resp *http.Response, data []byte, err error) {
	return doCtx(context.Background(), c, method, url, id, body)
}

func doCtx(ctx context.Context, c *http.Client, method, url, id string, body io.Reader) (resp *http.Response, data []byte, err error) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return nil, nil, err
	}
	if id != "" {
		req.Header.Set(outboundtest.IDHeader, id)
	}
	resp, err = c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err = io.ReadAll(resp.Body)
	return resp, data, err
}

// eventually polls cond with a bounded number of short pauses and reports
// whether it became true. It is for conditions that another goroutine makes
// true promptly, not a way to wait for time to pass.
func eventually(cond func() bool) bool {
	for range 1000 {
		if cond() {
			return true
		}
		runtime.Gosched()
		time.Sleep(2 * time.Millisecond)
	}
	return cond()
}

// serverGoroutines returns the stacks of the goroutines running code of
// package outboundtest (not its tests), "" once there are none. Goroutines
// that are ending may still show, so it polls briefly.
func serverGoroutines() string {
	var leaks string
	eventually(func() bool {
		leaks = serverStacks()
		return leaks == ""
	})
	return leaks
}

// serverStacks returns the stacks of the goroutines running code of package
// outboundtest (not its tests) at this instant.
func serverStacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out strings.Builder
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "outbound/outboundtest.") {
			out.WriteString(g + "\n\n")
		}
	}
	return out.String()
}
