package outboundredis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// worker is what one process of the fleet test is asked to do.
type worker struct {
	Addrs      []string // one server, or the nodes of a cluster
	PerSecond  float64
	Burst      int
	Lease      int
	Refund     bool  // refund every second token taken
	Start, End int64 // Unix nanoseconds
	Prefix     string
}

// tally is what a worker process reports.
type tally struct {
	Kept, Refunded, Limited, Errors, RoundTrips int64
}

const workerEnv = "OUTBOUNDREDIS_FLEET_WORKER"

// TestFleetWorker is one process of the fleet: run by the tests below as a
// child process, and skipped otherwise.
func TestFleetWorker(t *testing.T) {
	spec := os.Getenv(workerEnv)
	if spec == "" {
		t.Skip("a child process of TestTheFleetLimitIsExactAcrossProcesses")
	}
	var w worker
	if err := json.Unmarshal([]byte(spec), &w); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: w.Addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l, err := outboundredis.New(outboundredis.Config{Client: c, PerSecond: w.PerSecond, Burst: w.Burst,
		Prefix: w.Prefix, Timeout: time.Second, Lease: outboundredis.Lease{Max: w.Lease},
		Degraded: outboundredis.Degraded{Reject: true}})
	if err != nil {
		t.Fatal(err)
	}
	g := l.For("https://api.example:443")
	time.Sleep(time.Until(time.Unix(0, w.Start)))
	end := time.Unix(0, w.End)
	var tl tally
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var kept, refunded, limited, errs int64
			for n := 0; time.Now().Before(end); {
				switch err := g.Take(context.Background()); {
				case err == nil:
					n++
					if w.Refund && n%2 == 0 {
						g.Refund()
						refunded++
					} else {
						kept++
					}
				case errors.Is(err, ratelimit.ErrLimited):
					limited++
					time.Sleep(200 * time.Microsecond) // a client backing off, not a timing assertion
				default:
					errs++
				}
			}
			atomic.AddInt64(&tl.Kept, kept)
			atomic.AddInt64(&tl.Refunded, refunded)
			atomic.AddInt64(&tl.Limited, limited)
			atomic.AddInt64(&tl.Errors, errs)
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Errorf("giving back leased tokens: %v", err)
	}
	tl.RoundTrips = l.Metrics().RoundTrips
	out, _ := json.Marshal(tl)
	fmt.Printf("TALLY %s\n", out)
}

// runFleet runs procs worker processes for d and sums their tallies.
func runFleet(t *testing.T, procs int, w worker, d time.Duration) tally {
	t.Helper()
	start := time.Now().Add(2 * time.Second) // every process started by then
	w.Start, w.End = start.UnixNano(), start.Add(d).UnixNano()
	spec, _ := json.Marshal(w)
	var sum tally
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestFleetWorker$", "-test.count=1")
			cmd.Env = append(os.Environ(), workerEnv+"="+string(spec))
			out, err := cmd.CombinedOutput()
			line := ""
			for l := range strings.Lines(string(out)) {
				if rest, ok := strings.CutPrefix(l, "TALLY "); ok {
					line = rest
				}
			}
			var tl tally
			if err != nil || json.Unmarshal([]byte(line), &tl) != nil {
				t.Errorf("worker %d: %v\n%s", i, err, out)
				return
			}
			mu.Lock()
			sum.Kept += tl.Kept
			sum.Refunded += tl.Refunded
			sum.Limited += tl.Limited
			sum.Errors += tl.Errors
			sum.RoundTrips += tl.RoundTrips
			mu.Unlock()
		})
	}
	wg.Wait()
	return sum
}

// Four OS processes of eight goroutines each share one limit for 10 s: the
// tokens they keep are within 1% of the rate × the time, plus the burst;
// where every second token is refunded, twice as many are taken and the
// same number kept — no token lost. On one server and on a cluster, with
// and without leasing.
func TestTheFleetLimitIsExactAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("40 s of load: not in short mode")
	}
	single := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	const rate, burst, procs, secs = 2000.0, 100, 4, 10
	for _, tc := range []struct {
		name    string
		w       worker
		refunds bool
	}{
		{"one server, no leasing", worker{Addrs: []string{single.Addr()}}, false},
		{"one server, leasing, every second token refunded", worker{Addrs: []string{single.Addr()}, Lease: 32, Refund: true}, true},
		{"cluster, no leasing, every second token refunded", worker{Addrs: cluster.Addrs(), Refund: true}, true},
		{"cluster, leasing", worker{Addrs: cluster.Addrs(), Lease: 32}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.w
			w.PerSecond, w.Burst, w.Prefix = rate, burst, fmt.Sprintf("fleet%d:", time.Now().UnixNano())
			got := runFleet(t, procs, w, secs*time.Second)
			want := rate * secs
			t.Logf("kept %d (want %.0f, +%d burst), refunded %d, refused %d, errors %d, round trips %d",
				got.Kept, want, burst, got.Refunded, got.Limited, got.Errors, got.RoundTrips)
			if got.Errors != 0 {
				t.Errorf("%d takes failed with an error", got.Errors)
			}
			if lo, hi := 0.99*want, 1.01*want+burst; float64(got.Kept) < lo || float64(got.Kept) > hi {
				t.Errorf("kept %d tokens in %d s at %v/s, want within [%.0f, %.0f]", got.Kept, secs, rate, lo, hi)
			}
			if tc.refunds && float64(got.Kept+got.Refunded) < 2*0.99*want {
				t.Errorf("with every second token refunded, %d were taken: refunds did not come back", got.Kept+got.Refunded)
			}
		})
	}
}
