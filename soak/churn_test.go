package soak

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/retry"
)

const (
	// churnKeys is how many distinct upstream keys the churn goes through,
	// over and over: each one comes, is forgotten when idle, and comes
	// back.
	churnKeys = 10_000
	// churnPace is the time between two churn calls: a key returns every
	// churnKeys × churnPace (20 s), long after churnIdle.
	churnPace = 2 * time.Millisecond
	churnIdle = 500 * time.Millisecond
)

// churn is a population of upstreams coming and going: calls to distinct
// host names, which one client sends to one fault upstream (so they share its
// faults: in an outage, its keys are dead ones), each forgotten once idle.
type churn struct {
	client           *outbound.Transport
	calls, forgotten atomic.Int64
	peakKept         atomic.Int64
	stop             context.CancelFunc
	done             sync.WaitGroup
	cycleLeast       []uint64 // the least heap after a phase, per cycle of phases
	heapHigh         uint64   // the most after a phase
}

func newChurn(srv *outboundtest.Server) *churn {
	c := &churn{}
	addr := srv.URL[len("http://"):]
	tr := srv.Transport()
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	tr.MaxIdleConns, tr.IdleConnTimeout = 64, churnIdle
	client, err := outbound.New(outbound.Config{HTTPTransport: tr, UpstreamIdleTime: churnIdle, Timeout: 2 * time.Second,
		Backoff: retry.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		Hooks:   outbound.Hooks{UpstreamForgotten: func(string) { c.forgotten.Add(1) }}})
	if err != nil {
		panic(err)
	}
	c.client = client
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	c.done.Go(func() {
		tick := time.NewTicker(churnPace)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://k%d.churn.test/", i%churnKeys), nil)
			if resp, err := c.client.RoundTrip(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			c.calls.Add(1)
			if i%256 == 0 {
				c.peakKept.Store(max(c.peakKept.Load(), int64(len(c.client.Upstreams()))))
			}
		}
	})
	return c
}

// checkHeap checks, after phase n (its records dropped), that the heap does
// not grow with the churn of upstreams: from the third cycle of phases on,
// the least heap after a phase of the cycle stays below twice that of the
// second cycle, plus 4 MiB. The heap after a single phase is no measure: it
// varies tenfold with what the phases before left, within bounds (idle
// connections within the pools' limits; HTTP/2 connections that net/http's
// client keeps reachable for up to 5 s after they close, if it never reused
// them). A leak raises them all, the least one too. (Not the first cycle:
// its first phases have nothing behind them.)
func (c *churn) checkHeap(n int, check func(bool, string, ...any)) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	c.heapHigh = max(c.heapHigh, m.HeapAlloc)
	cycle := (n - 1) / len(phases)
	if cycle == len(c.cycleLeast) {
		c.cycleLeast = append(c.cycleLeast, m.HeapAlloc)
	}
	c.cycleLeast[cycle] = min(c.cycleLeast[cycle], m.HeapAlloc)
	if n%len(phases) == 0 && cycle > 1 {
		least, floor := c.cycleLeast[cycle], c.cycleLeast[1]
		check(least <= 2*floor+4<<20, "the heap was at least %d MiB after each phase of cycle %d, against %d MiB in the second: it grows with the churn of upstreams",
			least>>20, cycle+1, floor>>20)
	}
	// At a call every churnPace, the upstreams of about churnIdle (plus
	// the sweeper's lag) are kept: far fewer than the keys.
	bound := int64(4 * churnIdle / churnPace)
	check(c.peakKept.Load() <= bound, "the churn keeps %d upstreams at once, more than %d", c.peakKept.Load(), bound)
}

func (c *churn) close() {
	c.stop()
	c.done.Wait()
	c.client.Close()
}

func (c *churn) String() string {
	return fmt.Sprintf("churn: %d calls to %d keys, %d upstreams forgotten, at most %d kept at once, least heap after a phase per cycle %v KiB, the most after a phase %d KiB",
		c.calls.Load(), churnKeys, c.forgotten.Load(), c.peakKept.Load(), kib(c.cycleLeast), c.heapHigh>>10)
}

func kib(bs []uint64) []uint64 {
	out := make([]uint64, len(bs))
	for i, b := range bs {
		out[i] = b >> 10
	}
	return out
}
