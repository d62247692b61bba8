// Package soak drives many concurrent calls of mixed kinds through the
// library against the fault upstream while its faults change over time, and
// checks the library's invariants after every phase: no permit outstanding,
// no HALF_OPEN slot lost, a recovered upstream's breaker closed again, no
// non-idempotent call and no one-shot body executed twice, every commit
// status consistent with the executions the upstream counted, goroutines,
// file descriptors and heap back to their level. Beside them, a churning
// population of 10,000 upstream keys comes and goes (each forgotten when
// idle), and the heap must stay flat across the phases.
//
// It runs only with -soak:
//
//	go test ./soak -soak -soak.duration=45s    # the short mode, run by scripts/test
//	go test ./soak -soak -soak.duration=30m -timeout=0 -v
//	go test ./soak -soak -soak.profiles=DIR ...   # a heap profile after each phase
package soak

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/mutate"
	"github.com/outboundhq/outbound/internal/shard"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

var (
	enabled  = flag.Bool("soak", false, "run the soak test")
	duration = flag.Duration("soak.duration", 45*time.Second, "how long the soak runs")
	phaseLen = flag.Duration("soak.phase", 1500*time.Millisecond, "how long each fault phase lasts")
	workers  = flag.Int("soak.workers", 24, "concurrent callers")
	profiles = flag.String("soak.profiles", "", "a directory to write a heap profile to after each phase")
)

func TestSoak(t *testing.T) {
	if !*enabled {
		t.Skip("the soak runs with -soak (scripts/test runs it for 45s; see the package documentation)")
	}
	st, violations := run(*duration, *phaseLen, *workers)
	t.Log(st)
	for _, v := range violations {
		t.Error(v)
	}
}

// TestSoakCatchesBrokenInvariants breaks, one at a time, the release of a
// circuit permission on a local rejection, the refund of a rate token on a
// bulkhead rejection, and the one-shot body rule, and checks that a short
// soak fails each time.
func TestSoakCatchesBrokenInvariants(t *testing.T) {
	if !*enabled {
		t.Skip("runs with -soak")
	}
	if !mutate.Enabled {
		t.Skip("needs the deliberate faults: go test -tags mutate (scripts/test does)")
	}
	for name, m := range map[string]*mutate.Switch{
		"circuit permission kept on a local rejection": &mutate.KeepCircuitPermitOnLocalRejection,
		"rate token kept on a bulkhead rejection":      &mutate.SkipRateRefundOnBulkheadRejection,
		"one-shot body re-sent":                        &mutate.ResendOneShotBodies,
	} {
		t.Run(name, func(t *testing.T) {
			m.Store(true)
			defer m.Store(false)
			_, violations := run(12*time.Second, *phaseLen, *workers)
			if len(violations) == 0 {
				t.Fatalf("the soak passed with %q", name)
			}
			t.Logf("caught: %s", strings.Join(violations[:min(2, len(violations))], " "))
		})
	}
}

// upstream is one fault server and the client that reaches it.
type upstream struct {
	name   string // the protocol, and whether the guards are striped
	srv    *outboundtest.Server
	client *outbound.Transport
	events *eventCount
}

// eventCount counts admission events per kind.
type eventCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *eventCount) on(e admission.Event) {
	c.mu.Lock()
	c.n[e.String()]++
	c.mu.Unlock()
}

func (c *eventCount) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.n))
	for k, v := range c.n {
		m[k] = v
	}
	return m
}

// kind of call.
type kind int

const (
	get kind = iota
	postReplayable
	postOneShot
	putOneShot
	postWithKey
)

var kindNames = [...]string{"GET", "POST", "POST one-shot", "PUT one-shot", "POST with key"}

// record is what the client reported for one call.
type record struct {
	up     *upstream
	id     string
	kind   kind
	commit outcome.Commit
	cats   []classify.Category
	out    *outcome.Outcome
}

// stats are the soak's figures.
type stats struct {
	calls, executions      int
	byCategory             map[string]int
	byCommit               map[string]int
	phases, checks         int
	peakGoroutines         int
	peakHeap               uint64
	baseGoroutines, baseFD int
	churn                  *churn
}

func (s stats) String() string {
	return fmt.Sprintf("phases %d, calls %d, attempts by category %v, commits %v, executions counted by the upstreams %d, "+
		"peak goroutines %d (start %d), peak heap %d MiB, invariant checks passed %d, start fds %d",
		s.phases, s.calls, s.byCategory, s.byCommit, s.executions, s.peakGoroutines, s.baseGoroutines, s.peakHeap>>20, s.checks, s.baseFD) +
		"; " + s.churn.String()
}

// guards says how an upstream's client guards it.
type guards int

const (
	plain    guards = iota
	striped         // the rate limiter and the bulkhead spread over per-processor cells from the start, as after contention
	adaptive        // the client-side throttle on, and the bulkhead's limit adaptive
)

// newUpstream starts a fault upstream speaking p and a client for it,
// guarded as g says.
func newUpstream(p outboundtest.Proto, g guards) *upstream {
	u := &upstream{name: p.String(), srv: outboundtest.NewServer(p), events: &eventCount{n: map[string]int{}}}
	cfg := outbound.Config{
		HTTPTransport: u.srv.Transport(),
		Admission: admission.Config{
			Circuit: circuit.Config{WindowSize: 20, MinimumCalls: 10, WaitInOpen: 200 * time.Millisecond,
				PermittedCallsInHalfOpen: 3, MaxWaitInHalfOpen: time.Second},
			Rate:     ratelimit.Config{PerSecond: 1500, Burst: 60},
			Bulkhead: bulkhead.Config{MaxConcurrent: 8},
			OnEvent:  u.events.on,
		},
		Backoff: retry.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
		// A generous budget: the soak exercises retries; the budget itself
		// is checked by the drill and the end-to-end tests.
		Budget:         retry.BudgetConfig{MaxTokens: 1000, TokenRatio: 1},
		AttemptTimeout: 500 * time.Millisecond,
		Timeout:        2 * time.Second,
	}
	if g == adaptive {
		u.name += " (throttle, adaptive limit)"
		cfg.Admission.Bulkhead = bulkhead.Config{Adaptive: true, MaxConcurrent: 8, MinConcurrent: 2, InitialConcurrent: 8}
		// A short window, so that the throttle lets the recovery through
		// within the time the check gives it.
		cfg.Admission.Throttle = throttle.Config{Enabled: true, Window: 300 * time.Millisecond}
	}
	t, err := outbound.New(cfg)
	if err != nil {
		panic(err)
	}
	u.client = t
	if g == striped {
		u.name += " (striped)"
		restore := shard.Force(true)
		// The first call builds the upstream's pipeline: striped now.
		req, _ := http.NewRequest(http.MethodGet, u.srv.URL+"/warm-up", nil)
		resp, err := t.RoundTrip(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		restore()
	}
	return u
}

// phase is a fault mix: setup configures the upstreams, and mix (if set)
// is called every few milliseconds to queue one-shot faults.
type phase struct {
	name  string
	setup func(ups []*upstream)
	mix   func(r *rand.Rand, ups []*upstream)
}

func all(ups []*upstream, f outboundtest.Fault) {
	for _, u := range ups {
		u.srv.SetDefault(f)
	}
}

var phases = []phase{
	{name: "healthy", setup: func(ups []*upstream) { all(ups, outboundtest.Respond(200)) }},
	{name: "outage", setup: func(ups []*upstream) {
		all(ups, outboundtest.Respond(200))
		for _, u := range ups {
			u.srv.Pause()
		}
	}},
	{name: "recovery", setup: func(ups []*upstream) {
		for _, u := range ups {
			u.srv.Resume()
		}
	}},
	{name: "503 storm", setup: func(ups []*upstream) { all(ups, outboundtest.Respond(503)) }},
	{name: "resets before and after processing", setup: func(ups []*upstream) { all(ups, outboundtest.Respond(200)) },
		mix: func(r *rand.Rand, ups []*upstream) {
			u := ups[r.IntN(len(ups))]
			if r.IntN(2) == 0 {
				u.srv.Enqueue(outboundtest.ResetAfterRead())
			} else {
				u.srv.Enqueue(outboundtest.ResetBeforeRead())
			}
		}},
	{name: "HTTP/2 REFUSED_STREAM, GOAWAY and resets", setup: func(ups []*upstream) { all(ups, outboundtest.Respond(200)) },
		mix: func(r *rand.Rand, ups []*upstream) {
			for _, u := range ups {
				if u.srv.Proto == outboundtest.HTTP1 {
					continue
				}
				switch r.IntN(3) {
				case 0:
					u.srv.Enqueue(outboundtest.RefusedStream())
				case 1:
					u.srv.Enqueue(outboundtest.GoAway(2, r.IntN(2), r.IntN(2) == 0))
				case 2:
					u.srv.Enqueue(outboundtest.ResetStream(http2.ErrCodeInternal))
				}
			}
		}},
	{name: "slow answers and Retry-After", setup: func(ups []*upstream) { all(ups, outboundtest.Slow(30*time.Millisecond, 200)) },
		mix: func(r *rand.Rand, ups []*upstream) {
			ups[r.IntN(len(ups))].srv.Enqueue(outboundtest.Respond(503, "Retry-After", fmt.Sprint(r.IntN(2))))
		}},
	{name: "local back-pressure", setup: func(ups []*upstream) { all(ups, outboundtest.Slow(80*time.Millisecond, 200)) }},
}

// run soaks for d and returns the figures and every invariant violated.
func run(d, phaseLen time.Duration, nworkers int) (stats, []string) {
	st := stats{byCategory: map[string]int{}, byCommit: map[string]int{}}
	// The runtime's network poller opens two descriptors (an epoll and an
	// eventfd) on the first network use and keeps them for the life of the
	// process: wake it before counting, or it shows as a leak.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	runtime.GC()
	st.baseGoroutines, st.baseFD = runtime.NumGoroutine(), openFDs()

	ups := []*upstream{newUpstream(outboundtest.HTTP1, plain), newUpstream(outboundtest.H2C, plain), newUpstream(outboundtest.H2TLS, plain),
		newUpstream(outboundtest.H2C, striped), newUpstream(outboundtest.HTTP1, adaptive)}
	var violations []string
	fail := func(format string, args ...any) { violations = append(violations, fmt.Sprintf(format, args...)) }
	ch := newChurn(ups[0].srv)
	st.churn = ch

	var seq atomic.Int64
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		ph := phases[i%len(phases)]
		ph.setup(ups)
		records := runPhase(ph, ups, phaseLen, nworkers, &seq)
		st.phases++
		for _, r := range records {
			st.calls++
			st.byCommit[r.commit.String()]++
			for _, c := range r.cats {
				st.byCategory[c.String()]++
			}
		}
		checkPhase(ph, ups, records, &st, fail)
		for _, u := range ups {
			u.srv.Reset() // the phase's counters are read: clear them and the queued faults
		}
		// The heap check measures what the library keeps: the phase's
		// records and the fault upstreams' logs of it are dropped first.
		records = nil
		ch.checkHeap(st.phases, func(ok bool, format string, args ...any) {
			if ok {
				st.checks++
			} else {
				fail(format, args...)
			}
		})
		if *profiles != "" {
			writeHeapProfile(*profiles, st.phases)
		}
		if len(violations) > 0 {
			violations = append([]string{fmt.Sprintf("after phase %d (%s):", st.phases, ph.name)}, violations...)
			break
		}
	}
	ch.close()
	for _, u := range ups {
		u.client.Close()
		u.srv.Close()
	}
	if !settle(func() bool { return runtime.NumGoroutine() <= st.baseGoroutines }) {
		fail("goroutines: %d at the start, %d at the end", st.baseGoroutines, runtime.NumGoroutine())
	}
	if !settle(func() bool { return openFDs() <= st.baseFD }) {
		fail("open file descriptors: %d at the start, %d at the end: %v", st.baseFD, openFDs(), fdTargets())
	}
	return st, violations
}

func runPhase(ph phase, ups []*upstream, d time.Duration, nworkers int, seq *atomic.Int64) []record {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	if ph.mix != nil {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
			tick := time.NewTicker(3 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					ph.mix(r, ups)
				}
			}
		})
	}
	var mu sync.Mutex
	var records []record
	for w := range nworkers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for ctx.Err() == nil {
				u := ups[r.IntN(len(ups))]
				k := kind(r.IntN(len(kindNames)))
				id := fmt.Sprintf("c%d", seq.Add(1))
				out := call(u, k, id)
				rec := record{up: u, id: id, kind: k, commit: out.Commit, out: out}
				for _, a := range out.Attempts {
					rec.cats = append(rec.cats, a.Category)
				}
				mu.Lock()
				records = append(records, rec)
				mu.Unlock()
				time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond) // a caller's pace
			}
		})
	}
	wg.Wait()
	return records
}

// call makes one call of kind k and returns its outcome.
func call(u *upstream, k kind, id string) *outcome.Outcome {
	var body io.Reader
	method := http.MethodPost
	switch k {
	case get:
		method = http.MethodGet
	case postReplayable, postWithKey:
		body = strings.NewReader(`{"order":1}`)
	case postOneShot:
		body = io.NopCloser(strings.NewReader(`{"order":1}`))
	case putOneShot:
		method = http.MethodPut
		body = io.NopCloser(strings.NewReader(strings.Repeat("x", 4096)))
	}
	req, _ := http.NewRequest(method, u.srv.URL+"/"+id, body)
	req.Header.Set(outboundtest.IDHeader, id)
	if k == postWithKey {
		req.Header.Set("Idempotency-Key", `"`+id+`"`)
	}
	resp, out, err := u.client.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}
	return out
}

// checkPhase checks the invariants once the phase's calls have all ended.
func checkPhase(ph phase, ups []*upstream, records []record, st *stats, fail func(string, ...any)) {
	st.peakGoroutines = max(st.peakGoroutines, runtime.NumGoroutine())
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	st.peakHeap = max(st.peakHeap, m.HeapAlloc)
	check := func(ok bool, format string, args ...any) {
		if ok {
			st.checks++
		} else {
			fail(format, args...)
		}
	}
	for _, r := range records {
		execs := r.up.srv.Executions(r.id)
		st.executions += execs
		idempotent := r.kind == get || r.kind == postWithKey
		oneShot := r.kind == postOneShot || r.kind == putOneShot
		check(idempotent && !oneShot || execs <= 1, "%s %s (%s) executed %d times", kindNames[r.kind], r.id, r.up.name, execs)
		check(r.commit != outcome.NotCommitted || execs == 0, "%s %s reported not committed but executed %d times: %v", kindNames[r.kind], r.id, execs, r.out)
		check(r.commit != 0, "%s %s has no commit status", kindNames[r.kind], r.id)
	}
	for _, u := range ups {
		us, ok := u.client.Upstream(u.srv.URL)
		check(ok, "%s: its state was forgotten while in use", u.name)
		if !ok {
			continue
		}
		check(us.InFlight == 0, "%s: %d bulkhead slots still held", u.name, us.InFlight)
		bm := us.Breaker
		check(bm.TrialsInFlight == 0, "%s: %d HALF_OPEN trial permits still held", u.name, bm.TrialsInFlight)
		n := u.events.snapshot()
		back := n["circuit-exit(success)"] + n["circuit-exit(failure)"] + n["circuit-release"]
		check(n["circuit-enter"] == back, "%s: %d circuit permissions handed out, %d came back", u.name, n["circuit-enter"], back)
		check(n["rate-enter"] == n["rate-exit"]+n["rate-exit(refund)"], "%s: %d rate tokens taken, %d exited", u.name, n["rate-enter"], n["rate-exit"]+n["rate-exit(refund)"])
		check(n["rate-exit(refund)"] >= n["bulkhead-reject"], "%s: %d bulkhead rejections, %d rate refunds", u.name, n["bulkhead-reject"], n["rate-exit(refund)"])
		check(n["bulkhead-enter"] == n["bulkhead-exit"], "%s: %d bulkhead slots taken, %d given back", u.name, n["bulkhead-enter"], n["bulkhead-exit"])
		check(n["throttle-enter"] == n["throttle-exit"]+n["throttle-exit(refund)"], "%s: %d attempts through the throttle, %d resolved", u.name,
			n["throttle-enter"], n["throttle-exit"]+n["throttle-exit(refund)"])
		check(us.Limit >= 0 && us.Limit <= 8, "%s: bulkhead limit %d", u.name, us.Limit)
		if ph.name == "recovery" {
			// The upstream is back: within the breaker's waits, healthy calls
			// close it again.
			closed := settleFor(3*time.Second, func() bool {
				call(u, get, "probe")
				b, _ := u.client.Breaker(u.srv.URL)
				return b.State() == circuit.Closed
			})
			check(closed, "%s: the breaker of the recovered upstream is %v", u.name, u.client.Breakers()[u.srv.URL].State)
		}
	}
	check(m.HeapAlloc < 256<<20, "heap %d MiB", m.HeapAlloc>>20)
}

// settle waits, boundedly, for cond; it closes idle connections on the way.
func settle(cond func() bool) bool { return settleFor(5*time.Second, cond) }

func settleFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// fdTargets lists what the open descriptors point at, for a failure message.
func fdTargets() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out = append(out, e.Name()+"->"+target)
	}
	return out
}

func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}

// writeHeapProfile writes the heap profile after phase n to dir, to find
// what a heap above its floor holds.
func writeHeapProfile(dir string, n int) {
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("heap-%04d.pprof", n)))
	if err != nil {
		return
	}
	defer f.Close()
	_ = pprof.Lookup("heap").WriteTo(f, 0)
}
