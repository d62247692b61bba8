package outboundredis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/internal/redistest"
	outboundredis "github.com/outboundhq/outbound/redis"
)

// The fleet's limit is a contract with a third party: an API provider
// counts what the whole fleet sends. The stress suite runs several OS
// processes against one limit on a real redis-server while the test does to
// Redis, or to the processes, what production does, and checks the bound
// the Limiter states (see stressBound) — in exact mode and with leasing.

// stressSpec is what one process of the stress suite is asked to do.
type stressSpec struct {
	Addr       string
	PerSecond  float64
	Burst      int
	Lease      int
	Share      float64
	Prefix     string
	Start, End int64 // Unix nanoseconds
	// Busy is how many goroutines spin without pause beside the takers;
	// MaxProcs, if not zero, is the process's GOMAXPROCS: a process short
	// of processor time.
	Busy, MaxProcs int
}

// stressTally is what a process of the stress suite reports.
type stressTally struct {
	Good, Bad          int64 // admissions for the healthy upstream and for the one whose key may be broken
	Errors             int64 // takes that failed other than as a local rejection
	Switches, KeysDown int64 // switches of the whole Limiter, of one upstream's limit
	NoAnswer, Local    int64
	Causes             []string // what each switch of the whole Limiter was for
}

const stressEnv = "OUTBOUNDREDIS_STRESS_WORKER"

// The two upstreams of the stress suite: the one whose admissions are
// counted against the bound, and one whose key a scenario may break.
const (
	goodUpstream = "https://good.example:443"
	badUpstream  = "https://bad.example:443"
)

// TestStressWorker is one process of the stress suite: run by
// TestTheFleetLimitHoldsUnderStress as a child process, and skipped
// otherwise.
func TestStressWorker(t *testing.T) {
	raw := os.Getenv(stressEnv)
	if raw == "" {
		t.Skip("a child process of TestTheFleetLimitHoldsUnderStress")
	}
	var w stressSpec
	if err := json.Unmarshal([]byte(raw), &w); err != nil {
		t.Fatal(err)
	}
	if w.MaxProcs > 0 {
		runtime.GOMAXPROCS(w.MaxProcs)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{w.Addr}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var tl stressTally
	var causes sync.Mutex
	l, err := outboundredis.New(outboundredis.Config{Client: c, PerSecond: w.PerSecond, Burst: w.Burst, Prefix: w.Prefix,
		Lease: outboundredis.Lease{Max: w.Lease}, Degraded: outboundredis.Degraded{Share: w.Share},
		OnEvent: func(e outboundredis.Event) {
			if e.Mode == outboundredis.ModeDegraded && e.Upstream == "" {
				atomic.AddInt64(&tl.Switches, 1)
				causes.Lock()
				tl.Causes = append(tl.Causes, fmt.Sprint(e.Err))
				causes.Unlock()
			} else if e.Mode == outboundredis.ModeDegraded {
				atomic.AddInt64(&tl.KeysDown, 1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	good, bad := l.For(goodUpstream), l.For(badUpstream)
	time.Sleep(time.Until(time.Unix(0, w.Start)))
	end := time.Unix(0, w.End)
	stop := make(chan struct{})
	var spin sync.WaitGroup
	for range w.Busy {
		spin.Go(func() {
			for x := 0; ; x++ {
				if x%4096 == 0 {
					select {
					case <-stop:
						return
					default:
					}
				}
			}
		})
	}
	var wg sync.WaitGroup
	taker := func(g interface{ Take(context.Context) error }, n *int64) {
		for time.Now().Before(end) {
			switch err := g.Take(context.Background()); {
			case err == nil:
				atomic.AddInt64(n, 1)
			case errors.Is(err, ratelimit.ErrLimited):
				time.Sleep(200 * time.Microsecond) // a client backing off, not a timing assertion
			default:
				atomic.AddInt64(&tl.Errors, 1)
			}
		}
	}
	for range 8 {
		wg.Go(func() { taker(good, &tl.Good) })
	}
	for range 2 {
		wg.Go(func() { taker(bad, &tl.Bad) })
	}
	wg.Wait()
	close(stop)
	spin.Wait()
	l.Close()
	m := l.Metrics()
	tl.NoAnswer, tl.Local = m.NoAnswer, m.Local
	causes.Lock()
	out, _ := json.Marshal(tl)
	causes.Unlock()
	fmt.Printf("STRESS %s\n", out)
}

// runStress runs procs processes of the stress suite from start to end and
// sums their tallies.
func runStress(t *testing.T, procs int, w stressSpec) stressTally {
	t.Helper()
	spec, _ := json.Marshal(w)
	var sum stressTally
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestStressWorker$", "-test.count=1")
			cmd.Env = append(os.Environ(), stressEnv+"="+string(spec))
			out, err := cmd.CombinedOutput()
			var tl stressTally
			line := ""
			for l := range strings.Lines(string(out)) {
				if rest, ok := strings.CutPrefix(l, "STRESS "); ok {
					line = rest
				}
			}
			if err != nil || json.Unmarshal([]byte(line), &tl) != nil {
				t.Errorf("process %d: %v\n%s", i, err, out)
				return
			}
			mu.Lock()
			sum.Good += tl.Good
			sum.Bad += tl.Bad
			sum.Errors += tl.Errors
			sum.Switches += tl.Switches
			sum.KeysDown += tl.KeysDown
			sum.NoAnswer += tl.NoAnswer
			sum.Local += tl.Local
			sum.Causes = append(sum.Causes, tl.Causes...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return sum
}

// stressScenario is what the test does to Redis, or to the processes,
// during a run; at starts it, relative to the run's start.
type stressScenario struct {
	name string
	// healthy says that Redis is healthy throughout (for the healthy
	// upstream): no process may switch to degraded mode.
	healthy bool
	// restarts is how many times Redis loses its data: each adds a burst
	// to the bound.
	restarts int
	// busy and maxProcs starve the processes of processor time.
	busy, maxProcs int
	// breakBadKey puts a key of the wrong type under the bad upstream's
	// limit before the run.
	breakBadKey bool
	// atRate says that Redis answers throughout and the processes have the
	// processor: the healthy upstream must get at least 90 % of the rate.
	atRate bool
	fault  func(t *testing.T, srv *redistest.Redis, c rueidis.Client, at func(time.Duration))
}

// stressBound is the most the fleet may admit for one upstream over d: the
// rate over d, the burst (once more for each restart that lost Redis's
// data), and the slack the Limiter states — with leasing, the rate over
// Lease.Hold (tokens leased within Hold of the start are used in the run);
// in degraded mode, a token per process (each local share rounds on its
// own). A degraded episode's local share starts empty and is charged to
// Redis when it comes back, and the shares add up to the fleet's rate.
func stressBound(rate float64, burst, procs, lease, restarts int, d time.Duration) (bound, slack float64) {
	slack = float64(procs)
	if lease > 1 {
		slack += rate * 0.1 // Lease.Hold's default
	}
	return rate*d.Seconds() + float64(burst*(1+restarts)) + slack, slack
}

// TestTheFleetLimitHoldsUnderStress: four OS processes of eight takers each
// (and two on a second upstream) share one fleet limit of 2,000/s on a real
// redis-server for 5 s, in exact mode and with leasing, under each scenario:
// processes starved of processor time (GOMAXPROCS=1 and 16 spinning
// goroutines), CLIENT PAUSE, Redis stopped (SIGSTOP) for 2 s, Redis frozen
// for 150 ms every second, Redis restarted without its data, a key of the
// wrong type under the second upstream's limit, and Redis out of memory for
// writes. In each: the healthy upstream's admissions are within the bound
// (stressBound), whose slack is at most 5 % of the rate over 10 s; no
// process switches to degraded mode while Redis is healthy; the broken key
// leaves the healthy upstream at the fleet's rate (as a healthy Redis does;
// a frozen Redis refuses while frozen, and starved processes admit what they
// get the processor to do); no take fails with an error. It prints admitted and
// allowed per scenario and mode.
func TestTheFleetLimitHoldsUnderStress(t *testing.T) {
	if testing.Short() {
		t.Skip("100 s of load: not in short mode")
	}
	const rate, burst, procs = 2000.0, 200, 4
	const d = 5 * time.Second
	freeze := func(srv *redistest.Redis, for_ time.Duration) {
		srv.Pause()
		time.Sleep(for_) // the fault's length, not a timing assertion
		srv.Resume()
	}
	scenarios := []stressScenario{
		{name: "healthy", healthy: true, atRate: true},
		{name: "starved clients", healthy: true, busy: 16, maxProcs: 1},
		{name: "CLIENT PAUSE 500ms", healthy: true, fault: func(t *testing.T, _ *redistest.Redis, c rueidis.Client, at func(time.Duration)) {
			at(2 * time.Second)
			if err := c.Do(context.Background(), c.B().Arbitrary("CLIENT", "PAUSE").Args("500").Build()).Error(); err != nil {
				t.Errorf("CLIENT PAUSE: %v", err)
			}
		}},
		{name: "SIGSTOP 2s", fault: func(t *testing.T, srv *redistest.Redis, _ rueidis.Client, at func(time.Duration)) {
			at(time.Second)
			freeze(srv, 2*time.Second)
		}},
		{name: "flapping 150ms/s", healthy: true, fault: func(t *testing.T, srv *redistest.Redis, _ rueidis.Client, at func(time.Duration)) {
			for i := range 5 {
				at(time.Duration(i)*time.Second + 400*time.Millisecond)
				freeze(srv, 150*time.Millisecond)
			}
		}},
		{name: "restart, data lost", restarts: 1, fault: func(t *testing.T, srv *redistest.Redis, _ rueidis.Client, at func(time.Duration)) {
			at(2 * time.Second)
			srv.Kill()
			time.Sleep(500 * time.Millisecond) // Redis down for a while: the fault, not a timing assertion
			srv.Restart()
		}},
		{name: "WRONGTYPE key", healthy: true, atRate: true, breakBadKey: true},
		{name: "maxmemory", fault: func(t *testing.T, _ *redistest.Redis, c rueidis.Client, at func(time.Duration)) {
			at(2 * time.Second)
			set := func(v string) {
				if err := c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", v).Build()).Error(); err != nil {
					t.Errorf("CONFIG SET maxmemory %s: %v", v, err)
				}
			}
			set("1")
			time.Sleep(time.Second) // out of memory for a second: the fault, not a timing assertion
			set("0")
		}},
	}
	var report strings.Builder
	fmt.Fprintf(&report, "%-20s %-8s %8s %8s %7s %8s %8s %8s %8s\n", "SCENARIO", "MODE", "ADMITTED", "ALLOWED", "RATIO",
		"SWITCHES", "NOANSWER", "LOCAL", "OTHERKEY")
	defer func() { t.Log("\n" + report.String()) }()
	for _, sc := range scenarios {
		for _, lease := range []int{0, 16} {
			mode := "exact"
			if lease > 1 {
				mode = "leasing"
			}
			t.Run(sc.name+"/"+mode, func(t *testing.T) {
				srv := redistest.Start(t)
				c := client(t, srv.Addr())
				prefix := fmt.Sprintf("stress%d:", time.Now().UnixNano())
				if sc.breakBadKey {
					if err := c.Do(context.Background(), c.B().Lpush().Key(prefix+"{"+badUpstream+"}").Element("x").Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
				start := time.Now().Add(1500 * time.Millisecond) // every process started by then
				w := stressSpec{Addr: srv.Addr(), PerSecond: rate, Burst: burst, Lease: lease, Share: 1.0 / procs,
					Prefix: prefix, Start: start.UnixNano(), End: start.Add(d).UnixNano(), Busy: sc.busy, MaxProcs: sc.maxProcs}
				var faults sync.WaitGroup
				if sc.fault != nil {
					faults.Go(func() {
						sc.fault(t, srv, c, func(off time.Duration) { time.Sleep(time.Until(start.Add(off))) })
					})
				}
				got := runStress(t, procs, w)
				faults.Wait()
				bound, slack := stressBound(rate, burst, procs, lease, sc.restarts, d)
				other := "-"
				if sc.breakBadKey {
					other = fmt.Sprint(got.Bad)
				}
				fmt.Fprintf(&report, "%-20s %-8s %8d %8.0f %7.3f %8d %8d %8d %8s\n", sc.name, mode, got.Good, bound,
					float64(got.Good)/bound, got.Switches, got.NoAnswer, got.Local, other)
				if slack > 0.05*rate*10 {
					t.Errorf("the stated slack %.0f is above 5%% of the rate over 10 s", slack)
				}
				if float64(got.Good) > bound {
					t.Errorf("admitted %d, above the bound %.0f (rate %v/s over %v, burst %d, slack %.0f)", got.Good, bound, rate, d, burst, slack)
				}
				if sc.healthy && got.Switches != 0 {
					t.Errorf("%d switches to degraded mode while Redis was healthy, for %q", got.Switches, got.Causes)
				}
				if sc.atRate && float64(got.Good) < 0.9*rate*d.Seconds() {
					t.Errorf("admitted %d with a healthy Redis, below 90%% of the rate over %v", got.Good, d)
				}
				if sc.breakBadKey && (got.KeysDown == 0 || float64(got.Bad) > rate*d.Seconds()+float64(burst)) {
					t.Errorf("the broken key: %d switches of its limit, %d admitted", got.KeysDown, got.Bad)
				}
				if got.Errors != 0 {
					t.Errorf("%d takes failed with an error", got.Errors)
				}
			})
		}
	}
}
