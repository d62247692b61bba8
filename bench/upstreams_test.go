package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/retry"
)

var upstreamScales = flag.String("upstreams.scales", "1000",
	"comma-separated numbers of distinct upstreams for TestManyUpstreams (e.g. 1000,10000,50000)")

// idleTime is the idle connection timeout of both clients and outbound's
// UpstreamIdleTime in TestManyUpstreams: short, so that the test can wait it
// out.
const idleTime = time.Second

// TestManyUpstreams calls N distinct upstreams, once each, through outbound
// and through a bare net/http client with the same settings (those of
// http.DefaultTransport, with an idle time of 1 s), in the same run: live
// upstreams (distinct host names that a dialer sends to one loopback
// server) and dead ones (every dial refused). It reports, per client, the
// heap held per upstream, the goroutines and the open file descriptors
// right after the calls and after the idle time, and checks the targets:
// after the idle time, outbound holds at most net/http's heap per upstream
// + 256 B (and 1 KiB at most), its goroutines and descriptors are back to
// where they started, and while connections are held there are no more
// than MaxIdleConns of them.
//
//	go test ./bench -run TestManyUpstreams -v -upstreams.scales 1000,10000,50000
func TestManyUpstreams(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out an idle time")
	}
	var scales []int
	for _, s := range strings.Split(*upstreamScales, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			t.Fatalf("-upstreams.scales: %q", s)
		}
		scales = append(scales, n)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	var report strings.Builder
	fmt.Fprintf(&report, "%-6s %-5s %-9s %14s %12s %10s %8s %14s %10s %8s\n", "N", "STATE", "CLIENT",
		"B/UP AFTER", "CONNS AFTER", "GOROUT +", "FDS +", "B/UP IDLE", "GOROUT +", "FDS +")
	for _, n := range scales {
		for _, live := range []bool{true, false} {
			var bare, ob, obDefault usage
			sides := []string{"net/http", "outbound"}
			if live {
				// With the default UpstreamIdleTime (5 minutes): an upstream
				// called once is forgotten with its last connection, not
				// after the idle time.
				sides = append(sides, "outbound5m")
			}
			for _, side := range sides {
				u := measureUpstreams(t, side, srv.Listener.Addr().String(), n, live)
				state := map[bool]string{true: "live", false: "dead"}[live]
				fmt.Fprintf(&report, "%-6d %-5s %-9s %14.0f %12d %10d %8d %14.0f %10d %8d\n", n, state, side,
					u.afterBytes, u.afterConns, u.afterGoroutines, u.afterFDs, u.idleBytes, u.idleGoroutines, u.idleFDs)
				switch side {
				case "net/http":
					bare = u
				case "outbound":
					ob = u
				default:
					obDefault = u
				}
			}
			name := fmt.Sprintf("%d %s", n, map[bool]string{true: "live", false: "dead"}[live])
			if ob.idleBytes > bare.idleBytes+256 || ob.idleBytes > 1024 {
				t.Errorf("%s: outbound holds %.0f B per idle upstream, net/http %.0f B", name, ob.idleBytes, bare.idleBytes)
			}
			if live && obDefault.idleBytes > bare.idleBytes+256 {
				t.Errorf("%s: with the default UpstreamIdleTime, outbound holds %.0f B per upstream once its connection closed, net/http %.0f B",
					name, obDefault.idleBytes, bare.idleBytes)
			}
			if ob.idleGoroutines > 2 || ob.idleFDs > 2 {
				t.Errorf("%s: after the idle time outbound holds %d goroutines and %d descriptors more than at the start", name, ob.idleGoroutines, ob.idleFDs)
			}
			if ob.afterConns > 100 {
				t.Errorf("%s: %d connections held after the calls, more than MaxIdleConns (100)", name, ob.afterConns)
			}
		}
	}
	t.Log("\n" + report.String())
}

// usage is what a client holds: per upstream in bytes, connections,
// goroutines and descriptors above the start.
type usage struct {
	afterBytes, idleBytes     float64
	afterConns                int64
	afterGoroutines, afterFDs int
	idleGoroutines, idleFDs   int
}

func measureUpstreams(t *testing.T, side, addr string, n int, live bool) usage {
	var open atomic.Int64
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		if !live {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused")}
		}
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		open.Add(1)
		return &countClose{Conn: c, open: &open}, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext, tr.IdleConnTimeout = dial, idleTime
	var rt http.RoundTripper = tr
	var closeAll func()
	if side != "net/http" {
		// A tiny backoff: a dead upstream's call makes its three attempts
		// without waiting; the test measures memory, not retries.
		cfg := outbound.Config{HTTPTransport: tr, UpstreamIdleTime: idleTime,
			Backoff: retry.Backoff{Initial: time.Microsecond, Max: time.Microsecond}}
		if side == "outbound5m" {
			cfg.UpstreamIdleTime = 0 // the default
		}
		o, err := outbound.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rt, closeAll = o, o.Close
	} else {
		closeAll = tr.CloseIdleConnections
	}
	defer closeAll()

	start := snapshot()
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://u%d.test/", i), nil)
				if resp, err := rt.RoundTrip(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				} else if live {
					t.Errorf("live upstream %d: %v", i, err)
				}
			}
		})
	}
	wg.Wait()
	after := snapshot()
	conns := open.Load()
	time.Sleep(2*idleTime + idleTime/2) // the idle time, and outbound's sweeps after it: what the test measures
	idle := snapshot()
	runtime.KeepAlive(rt)
	return usage{
		afterBytes: float64(after.heap-start.heap) / float64(n), idleBytes: float64(idle.heap-start.heap) / float64(n),
		afterConns: conns, afterGoroutines: after.goroutines - start.goroutines, afterFDs: after.fds - start.fds,
		idleGoroutines: idle.goroutines - start.goroutines, idleFDs: idle.fds - start.fds,
	}
}

type countClose struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countClose) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

type snap struct {
	heap            int64
	goroutines, fds int
}

func snapshot() snap {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	fds := 0
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		fds = len(ents)
	}
	return snap{heap: int64(m.HeapAlloc), goroutines: runtime.NumGoroutine(), fds: fds}
}
