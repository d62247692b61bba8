package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/priority"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/criticality"
)

// The overload harness over loopback: the upstream of overload_test.go (a
// capacity of workers, a FIFO queue, latency growing with it), on the real
// clock behind a real HTTP/1.1 server on 127.0.0.1, driven by closed-loop
// callers through real clients: bare net/http (no limit), outbound's
// Transport with a fixed bulkhead at the capacity (the best fixed limit) and
// with an adaptive one, and failsafe-go's adaptive limiter around net/http.
// The in-process simulation is the fast, exact version; this one has a
// network stack, connection handling and real scheduling in the loop.

const (
	loopCapacity = 20
	loopService  = 20 * time.Millisecond
	// loopIteration is the offered load's time per benchmark iteration:
	// -benchtime 400x runs each client for 4 s.
	loopIteration = 10 * time.Millisecond
)

// loopResult is what one run measured after its warm-up.
type loopResult struct {
	goodput  float64 // answers per second
	critical float64 // of them, to critical callers
	p99      time.Duration
	limits   []int // sampled 20 times over the run
}

// loopClient is one client of the harness: call makes one call and reports
// whether it was answered (false: refused locally); limit is its limit now.
type loopClient struct {
	call  func(context.Context, string) (bool, error)
	limit func() int
}

var loopClients = []string{"none", "fixed", "outbound-adaptive", "failsafe-adaptive"}

func newLoopClient(tb testing.TB, name, url string) loopClient {
	inner := func() *http.Transport {
		tr := &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 90 * time.Second}
		tb.Cleanup(tr.CloseIdleConnections)
		return tr
	}
	get := func(ctx context.Context, rt http.RoundTripper, u string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	switch name {
	case "none":
		tr := inner()
		return loopClient{
			call:  func(ctx context.Context, u string) (bool, error) { return true, get(ctx, tr, u) },
			limit: func() int { return 0 },
		}
	case "fixed", "outbound-adaptive":
		bh := bulkhead.Config{MaxConcurrent: loopCapacity}
		if name == "outbound-adaptive" {
			bh = bulkhead.Config{Adaptive: true, MaxConcurrent: 200}
		}
		t, err := outbound.New(outbound.Config{HTTPTransport: inner(), MaxAttempts: 1,
			Admission: admission.Config{Bulkhead: bh}})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(t.Close)
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		key := t.UpstreamKey(req)
		return loopClient{
			call: func(ctx context.Context, u string) (bool, error) {
				err := get(ctx, t, u)
				if errors.Is(err, bulkhead.ErrFull) {
					return false, nil
				}
				return true, err
			},
			limit: func() int { s, _ := t.Upstream(key); return s.Limit },
		}
	case "failsafe-prioritized": // critical calls at High, the others at Low, queueing while full
		tr := inner()
		p := adaptivelimiter.NewPrioritizer()
		tb.Cleanup(p.ScheduleCalibrations(context.Background(), 100*time.Millisecond))
		l := adaptivelimiter.NewBuilder[any]().WithLimits(1, 200, 20).WithQueueing(2, 4).BuildPrioritized(p)
		return loopClient{
			call: func(ctx context.Context, u string) (bool, error) {
				prio := priority.Low
				if criticality.Of(ctx) == criticality.Critical {
					prio = priority.High
				}
				permit, err := l.AcquirePermitWithPriority(ctx, prio)
				if err != nil {
					return false, nil
				}
				err = get(ctx, tr, u)
				if err != nil {
					permit.Drop()
					return true, err
				}
				permit.Record()
				return true, nil
			},
			limit: l.Limit,
		}
	case "failsafe-adaptive":
		tr := inner()
		l := adaptivelimiter.NewBuilder[any]().WithLimits(1, 200, 20).Build()
		return loopClient{
			call: func(ctx context.Context, u string) (bool, error) {
				p, ok := l.TryAcquirePermit()
				if !ok {
					return false, nil
				}
				err := get(ctx, tr, u)
				if err != nil {
					p.Drop()
					return true, err
				}
				p.Record()
				return true, nil
			},
			limit: l.Limit,
		}
	}
	tb.Fatalf("no client %q", name)
	return loopClient{}
}

// serveQueueing starts an HTTP/1.1 server on loopback whose every request is
// one call of u, and returns its URL.
func serveQueueing(tb testing.TB, u *queueing) string {
	return serveLoopback(tb, func(w http.ResponseWriter, _ *http.Request) {
		u.call()
		w.WriteHeader(http.StatusNoContent)
	})
}

// serveLoopback starts an HTTP/1.1 server on loopback with handler h, stopped
// at the end of the test, and returns its URL.
func serveLoopback(tb testing.TB, h http.HandlerFunc) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String() + "/"
}

// driveLoopback drives callers closed-loop callers through the client named
// name to a fresh upstream of capacity loopCapacity for d, and at change (if
// > 0) sets its capacity to changeTo. A refused caller tries again after a
// tenth of the service time. With critical > 0, the first critical callers'
// calls are critical and the others' sheddable (package criticality),
// unless name ends in "/unmarked": then the same callers' calls are not
// marked, and critical only says whose goodput is counted as critical.
func driveLoopback(tb testing.TB, name string, callers, critical int, d, change time.Duration, changeTo int) loopResult {
	u := &queueing{service: loopService, capacity: loopCapacity}
	url := serveQueueing(tb, u)
	base, unmarked := strings.CutSuffix(name, "/unmarked") // the same callers, their calls not marked
	c := newLoopClient(tb, base, url)
	warm := d * 3 / 8
	var (
		mu        sync.Mutex
		latencies []time.Duration
		answered  atomic.Int64
		crit      atomic.Int64
		failed    atomic.Int64
		wg        sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	start := time.Now()
	for i := range callers {
		cctx := ctx
		switch {
		case unmarked:
		case i < critical:
			cctx = criticality.With(ctx, criticality.Critical)
		case critical > 0:
			cctx = criticality.With(ctx, criticality.Sheddable)
		}
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				ok, err := c.call(cctx, url)
				lat := time.Since(t0)
				switch {
				case ctx.Err() != nil:
					return
				case err != nil:
					failed.Add(1)
				case !ok:
					time.Sleep(loopService / 10)
				case t0.Sub(start) >= warm:
					answered.Add(1)
					if i < critical {
						crit.Add(1)
					}
					mu.Lock()
					latencies = append(latencies, lat)
					mu.Unlock()
				}
			}
		})
	}
	var r loopResult
	tick := d / 20
	for el := time.Duration(0); el < d; el += tick {
		time.Sleep(tick)
		if change > 0 && el+tick >= change && el < change {
			u.setCapacity(changeTo)
		}
		r.limits = append(r.limits, c.limit())
	}
	cancel()
	wg.Wait()
	if n := failed.Load(); n > 0 {
		tb.Fatalf("%s: %d calls failed", name, n)
	}
	r.goodput = float64(answered.Load()) / (d - warm).Seconds()
	r.critical = float64(crit.Load()) / (d - warm).Seconds()
	slices.Sort(latencies)
	if len(latencies) > 0 {
		r.p99 = latencies[len(latencies)*99/100]
	}
	return r
}

// BenchmarkOverloadLoopback drives the loopback upstream (capacity 20,
// service 20 ms) at 0.5, 1, 2 and 4 times its capacity through each client
// in turn, for b.N×10 ms each (-benchtime 400x: 4 s), and reports, against
// the best fixed limit measured in the same run, the goodput of outbound's
// adaptive bulkhead and of failsafe-go's adaptive limiter, their p99 over
// the mean service time, and the adaptive limit at the end. The "step"
// runs halve and double the capacity mid-run (at 2× the larger load) and
// report the adaptive limit over the capacity before and after.
func BenchmarkOverloadLoopback(b *testing.B) {
	for _, load := range []float64{0.5, 1, 2, 4} {
		b.Run(fmt.Sprintf("load-%gx", load), func(b *testing.B) {
			d := time.Duration(max(b.N, 1)) * loopIteration
			res := map[string]loopResult{}
			for _, name := range loopClients {
				res[name] = driveLoopback(b, name, int(load*loopCapacity), 0, d, 0, 0)
			}
			fixed := max(res["fixed"].goodput, 1)
			ob, fs := res["outbound-adaptive"], res["failsafe-adaptive"]
			b.ReportMetric(ob.goodput/fixed, "adaptive-goodput/fixed")
			b.ReportMetric(fs.goodput/fixed, "failsafe-goodput/fixed")
			b.ReportMetric(float64(ob.p99)/float64(loopService), "adaptive-p99/service")
			b.ReportMetric(float64(fs.p99)/float64(loopService), "failsafe-p99/service")
			b.ReportMetric(float64(res["fixed"].p99)/float64(loopService), "fixed-p99/service")
			b.ReportMetric(float64(res["none"].p99)/float64(loopService), "none-p99/service")
			b.ReportMetric(float64(ob.limits[len(ob.limits)-1]), "adaptive-limit")
			b.ReportMetric(float64(fs.limits[len(fs.limits)-1]), "failsafe-limit")
		})
	}
	// Mixed criticality: half the capacity's worth of callers critical, the
	// others sheddable; the critical callers' goodput over their demand, and
	// everyone's over the capacity. A closed-loop caller's demand is what it
	// gets with the upstream to itself: the critical callers alone, without
	// a limit, measured in the same run (loopback and the ± 20 % service
	// times keep it a few percent under critical callers ÷ service time).
	for _, load := range []float64{1, 2, 4} {
		b.Run(fmt.Sprintf("mixed-%gx", load), func(b *testing.B) {
			d := time.Duration(max(b.N, 1)) * loopIteration
			demand := max(driveLoopback(b, "none", loopCapacity/2, loopCapacity/2, d, 0, 0).critical, 1)
			capacity := float64(loopCapacity) / loopService.Seconds()
			b.ReportMetric(demand*loopService.Seconds()/(loopCapacity/2), "demand/nominal")
			for _, name := range []string{"none", "fixed", "fixed/unmarked", "outbound-adaptive", "outbound-adaptive/unmarked", "failsafe-prioritized"} {
				r := driveLoopback(b, name, int(load*loopCapacity), loopCapacity/2, d, 0, 0)
				b.ReportMetric(r.critical/demand, name+"-critical/demand")
				b.ReportMetric(r.goodput/capacity, name+"-goodput/capacity")
			}
		})
	}
	b.Run("throttle-4x", func(b *testing.B) {
		d := time.Duration(max(b.N, 1)) * loopIteration
		for _, name := range []string{"none", "outbound", "failsafe"} {
			b.ReportMetric(throttleLoopback(b, name, d), name+"-received/accepted")
		}
	})
	for _, step := range []int{loopCapacity / 2, loopCapacity * 2} {
		b.Run(fmt.Sprintf("step-%d-to-%d", loopCapacity, step), func(b *testing.B) {
			d := 2 * time.Duration(max(b.N, 1)) * loopIteration
			r := driveLoopback(b, "outbound-adaptive", 2*max(loopCapacity, step), 0, d, d/2, step)
			// The samples of the second and fourth quarters: settled
			// before the change, and after it.
			before, after := r.limits[5:10], r.limits[15:]
			b.ReportMetric(median(before)/loopCapacity, "limit/capacity-before")
			b.ReportMetric(median(after)/float64(step), "limit/capacity-after")
		})
	}
}

func median(v []int) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return float64(s[len(s)/2])
}

// throttleLoopback drives an upstream of capacity loopCapacity that sheds
// what it cannot take at once (429) with four times that many closed-loop
// callers through the client named name — bare net/http ("none"),
// outbound's throttle, or failsafe-go's adaptive throttler around net/http,
// with K = 1.05 (for failsafe-go the equivalent failure-rate threshold,
// 1 − 1/K) over a window of d/4 — and returns what the upstream received
// per request it accepted over d, after the window has filled. A refused
// caller, locally or by the upstream, backs off as long as a call takes.
func throttleLoopback(tb testing.TB, name string, d time.Duration) float64 {
	const k = 1.05
	window := max(d/4, 10*time.Millisecond)
	u := &shedding{service: loopService, capacity: loopCapacity}
	url := serveLoopback(tb, func(w http.ResponseWriter, _ *http.Request) {
		if u.call() {
			w.WriteHeader(http.StatusNoContent)
		} else {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})

	inner := &http.Transport{MaxIdleConnsPerHost: 256}
	tb.Cleanup(inner.CloseIdleConnections)
	var rt http.RoundTripper = inner
	allow, record := func() bool { return true }, func(bool) {}
	switch name {
	case "outbound":
		t, err := outbound.New(outbound.Config{HTTPTransport: inner, MaxAttempts: 1,
			Admission: admission.Config{Throttle: throttle.Config{Enabled: true, K: k, Window: window}}})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(t.Close)
		rt = t
	case "failsafe":
		th := adaptivethrottler.NewBuilder[any]().WithFailureRateThreshold(1-1/k, 10, window).Build()
		allow = th.TryAcquirePermit
		record = func(ok bool) {
			if ok {
				th.RecordSuccess()
			} else {
				th.RecordFailure()
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 4 * loopCapacity {
		wg.Go(func() {
			for ctx.Err() == nil {
				if !allow() {
					time.Sleep(loopService)
					continue
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				resp, err := rt.RoundTrip(req)
				switch {
				case ctx.Err() != nil:
					return
				case errors.Is(err, throttle.ErrThrottled):
					time.Sleep(loopService)
					continue
				case err != nil:
					failed.Add(1)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ok := resp.StatusCode == http.StatusNoContent
				record(ok)
				if !ok {
					time.Sleep(loopService)
				}
			}
		})
	}
	time.Sleep(2 * window) // the window fills
	r0, a0 := u.received.Load(), u.accepted.Load()
	time.Sleep(d)
	r, a := u.received.Load()-r0, u.accepted.Load()-a0
	cancel()
	wg.Wait()
	if n := failed.Load(); n > 0 {
		tb.Fatalf("%s: %d calls failed", name, n)
	}
	return float64(r) / float64(max(a, 1))
}
