package drill

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// Scenarios returns the drill's scenarios, in the order they run.
func Scenarios() []Scenario {
	list := []Scenario{
		{Name: "recovery-under-backpressure", Proto: outboundtest.HTTP1,
			Title:  "Outage and recovery while local back-pressure rejects the HALF_OPEN trial attempts",
			Expect: "The breaker opens during the outage and no call reaches the upstream while it is OPEN; in HALF_OPEN the rate limiter and the bulkhead reject trial attempts, and each rejection gives its trial slot back, so once the upstream is back the breaker closes again.",
			run:    recovery},
		{Name: "503-storm", Proto: outboundtest.H2C,
			Title:  "An upstream that answers nothing but 503",
			Expect: "The breaker sees the answers, not only transport errors: it opens, and later calls fail fast without reaching the upstream.",
			run:    storm503},
	}
	for _, p := range []outboundtest.Proto{outboundtest.HTTP1, outboundtest.H2C, outboundtest.H2TLS} {
		list = append(list,
			Scenario{Name: "reset-before-processing-" + protoSuffix(p), Proto: p,
				Title:  "The connection is reset as the request arrives, before the upstream processes it",
				Expect: "The GET is retried and succeeds. The POST, whose bytes left, may have been processed as far as the client can tell: it is not re-sent and its commit status is unknown (the upstream executed it 0 times).",
				run:    resetBefore},
			Scenario{Name: "reset-after-processing-" + protoSuffix(p), Proto: p,
				Title:  "The connection is reset after the upstream processed the request",
				Expect: "The GET is retried. The POST is not re-sent: commit status unknown, executed once. A POST with an Idempotency-Key is retried.",
				run:    resetAfter},
		)
	}
	list = append(list,
		Scenario{Name: "refused-stream", Proto: outboundtest.H2C,
			Title:  "HTTP/2 RST_STREAM REFUSED_STREAM on a POST",
			Expect: "REFUSED_STREAM proves the stream was not processed: the POST is retried and committed, executed exactly once.",
			run:    refusedStream},
		Scenario{Name: "goaway-below-and-above", Proto: outboundtest.H2TLS,
			Title:  "HTTP/2 GOAWAY while three POSTs are in flight; the last-stream-id covers the first",
			Expect: "The two streams above the last-stream-id were not processed: retried and committed, executed once each. The one at or below it may have been processed: not re-sent, commit status unknown, executed once.",
			run:    goAway},
		Scenario{Name: "proxy-hard-stop", Proto: outboundtest.H2TLS,
			Title:  "A proxy stopping hard: a GOAWAY that covers every stream, then REFUSED_STREAM on streams it already forwarded (HAProxy's hard-stop-after)",
			Expect: "The REFUSED_STREAM is contradicted by the GOAWAY before it and proves nothing: the POST is not re-sent, commit status unknown, executed once; the GET is retried on a fresh connection. The breaker records nothing: a proxy's shutdown is not the upstream's failure.",
			run:    hardStop},
		Scenario{Name: "retry-after-beyond-deadline", Proto: outboundtest.HTTP1,
			Title:  "503 with Retry-After: 30 on a call with a 2 s deadline",
			Expect: "The wait cannot fit before the deadline: the 503 comes back at once, after one attempt.",
			run:    retryAfterBeyondDeadline},
		Scenario{Name: "one-shot-streamed-put", Proto: outboundtest.H2C,
			Title:  "A 16 MiB streamed PUT with a one-shot body, answered 503",
			Expect: "A one-shot body is never re-sent, even for PUT, and never buffered: one attempt, executed once, the heap stays flat.",
			run:    oneShotPut},
		Scenario{Name: "overload", Proto: outboundtest.HTTP1,
			Title:  "32 callers against an upstream that serves 8 at a time, 20 ms each, and queues the rest",
			Expect: "The adaptive concurrency limit comes down to about the upstream's capacity, so answers wait little in its queue; the calls it refuses are local rejections, not sent, and the breaker records none of them.",
			run:    overload},
		Scenario{Name: "overload-mixed-criticality", Proto: outboundtest.HTTP1,
			Title:  "16 callers against an upstream that serves 8 at a time, 20 ms each: 4 critical, 12 sheddable",
			Expect: "Twice the upstream's capacity asks; the bulkhead keeps room for the critical calls, so nearly all of them are answered while the sheddable calls absorb the refusals — local rejections, not sent, which the breaker does not record.",
			run:    overloadMixed},
		Scenario{Name: "one-bad-replica-of-three", Proto: outboundtest.HTTP1,
			Title:  "Three replicas behind one name (127.0.0.2–4), the first answering 503 until it heals",
			Expect: "With Config.Endpoints, the bad replica is ejected after five failures in a row; every call succeeds (a retry goes to another replica), the upstream's breaker stays CLOSED, and once it has healed and its ejection is over the replica gets calls again.",
			run:    badReplica},
		Scenario{Name: "dead-upstream-burst", Proto: outboundtest.HTTP1,
			Title:  "A burst of 60 calls against an upstream that fails everything",
			Expect: "The retry budget (or the breaker) stops the retry storm: a handful of retries in all, not two or three per call.",
			run:    deadBurst},
	)
	return list
}

func protoSuffix(p outboundtest.Proto) string {
	return map[outboundtest.Proto]string{outboundtest.HTTP1: "http1", outboundtest.H2C: "h2c", outboundtest.H2TLS: "h2tls"}[p]
}

// callsUntilOpen is the most calls a scenario makes to open a breaker with
// the user's configuration: a window of at most this many calls opens.
const callsUntilOpen = 1000

func recovery(e *env) {
	e.newClient(outbound.Config{
		Admission: admission.Config{
			Circuit: circuit.Config{WindowSize: 4, MinimumCalls: 4, WaitInOpen: 300 * time.Millisecond,
				PermittedCallsInHalfOpen: 2, MaxWaitInHalfOpen: -1}, // no reclaim by time: the releases alone must do it
			Rate:     ratelimit.Config{PerSecond: 10, Burst: 4},
			Bulkhead: bulkhead.Config{MaxConcurrent: 1},
		},
		MaxAttempts: 1,
	})
	// The outage: calls until the breaker opens.
	e.srv.Pause()
	for i := 0; i < callsUntilOpen && e.state() != circuit.Open; i++ {
		e.call(req{method: "GET", id: fmt.Sprintf("outage-%d", i)})
	}
	e.check("the breaker opens during the outage", "OPEN", e.state().String(), e.state() == circuit.Open)
	if e.state() != circuit.Open {
		e.srv.Resume()
		return
	}
	before := e.srv.TotalReceived()
	for i := range 3 {
		e.call(req{method: "GET", id: fmt.Sprintf("open-%d", i)})
	}
	e.checkInt("calls reaching the upstream while OPEN", e.srv.TotalReceived()-before, eq(0), "0")

	// The wait passes; the upstream comes back, slow, and traffic returns
	// in a burst that the local bulkhead and rate limiter cannot take.
	halfOpen := e.waitState(circuit.HalfOpen, e.waitInOpen()+2*time.Second)
	e.check("the breaker moves to HALF_OPEN after its wait", "HALF_OPEN", e.state().String(), halfOpen)
	e.srv.Resume()
	e.srv.SetDefault(outboundtest.Slow(200*time.Millisecond, 200))
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() { e.call(req{method: "GET", id: fmt.Sprintf("burst-%d", i)}) })
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	if a := e.cfg.Admission; a.Rate.PerSecond > 0 || a.Bulkhead.MaxConcurrent > 0 {
		e.mu.Lock()
		local := e.res.Rejections["rate"] + e.res.Rejections["bulkhead"]
		e.mu.Unlock()
		want := 3 // the drill's own configuration rejects at least 3; a user's, at least one
		if e.user != nil {
			want = 1
		}
		e.checkInt("trial attempts rejected by the local rate limiter or bulkhead", local, atLeast(want), fmt.Sprintf(">= %d", want))
	}

	// Healthy traffic at the pace the rate limiter allows, until the
	// breaker closes (or, with a longer wait than the drill's, as far as
	// the pace allows).
	e.srv.SetDefault(outboundtest.Respond(200))
	pace := 120 * time.Millisecond
	if r := e.cfg.Admission.Rate.PerSecond; r > 0 {
		pace = max(pace, time.Duration(1.2*float64(time.Second)/r))
	}
	calls, until := 6, time.Now().Add(2*e.waitInOpen()+3*time.Second)
	if e.user != nil {
		calls = 200 // enough for any number of trial calls, within the time
	}
	for i := 0; i < calls && e.state() != circuit.Closed && time.Now().Before(until); i++ {
		time.Sleep(pace)
		e.call(req{method: "GET", id: fmt.Sprintf("after-%d", i)})
	}
	st := e.state()
	e.check("the breaker closes again once the upstream is back", "CLOSED", st.String(), st == circuit.Closed)
	m := e.breaker().Metrics()
	e.checkInt("trial permits still held at the end", m.TrialsInFlight, eq(0), "0")
}

func storm503(e *env) {
	e.newClient(outbound.Config{
		Admission:   admission.Config{Circuit: circuit.Config{WindowSize: 10, MinimumCalls: 10, WaitInOpen: time.Minute}},
		MaxAttempts: 1,
	})
	e.srv.SetDefault(outboundtest.Respond(503))
	for i := 0; i < callsUntilOpen && e.state() != circuit.Open; i++ {
		e.call(req{method: "GET", id: fmt.Sprintf("c%d", i)})
	}
	e.check("the breaker opens", "OPEN", e.state().String(), e.state() == circuit.Open)
	if e.state() != circuit.Open {
		return
	}
	if e.user == nil {
		e.checkInt("calls that reached the upstream", e.srv.TotalReceived(), eq(10), "10 (the window), then none")
	}
	before := e.srv.TotalReceived()
	for i := range 20 {
		e.call(req{method: "GET", id: fmt.Sprintf("open-%d", i)})
	}
	e.checkInt("of 20 calls after it opened, those that reached the upstream", e.srv.TotalReceived()-before, eq(0), "0")
}

// checkRetried records whether a call the library may retry was retried and
// answered: with a configuration that allows a single attempt, it cannot
// be, and the check says so.
func (e *env) checkRetried(what string, r result) {
	want := fmt.Sprintf("200 after 2 attempts (MaxAttempts %d)", e.maxAttempts())
	e.check(what, want, fmt.Sprintf("%d after %d attempt(s)", r.status, len(r.out.Attempts)),
		r.status == 200 && len(r.out.Attempts) == 2)
}

func resetBefore(e *env) {
	e.newClient(outbound.Config{Backoff: noBackoff})
	e.srv.Enqueue(outboundtest.ResetBeforeRead())
	get := e.call(req{method: "GET", id: "get"})
	e.checkRetried("the GET is retried and answered", get)
	e.srv.Enqueue(outboundtest.ResetBeforeRead())
	post := e.call(req{method: "POST", id: "post", body: `{"order":1}`})
	e.check("the POST is not re-sent", "1 attempt", fmt.Sprint(len(post.out.Attempts)), len(post.out.Attempts) == 1)
	e.check("the POST's commit status", "unknown (bytes left; the client cannot know)", post.out.Commit.String(),
		post.out.Commit == outcome.Unknown && errors.Is(post.err, outcome.ErrUnknown))
	e.checkInt("executions of the POST", e.srv.Executions("post"), atMost(1), "at most 1")
}

func resetAfter(e *env) {
	e.newClient(outbound.Config{Backoff: noBackoff})
	e.srv.Enqueue(outboundtest.ResetAfterRead())
	get := e.call(req{method: "GET", id: "get"})
	e.checkRetried("the GET is retried and answered", get)
	e.srv.Enqueue(outboundtest.ResetAfterRead())
	post := e.call(req{method: "POST", id: "post", body: `{"order":1}`})
	e.check("the POST's commit status", "unknown", post.out.Commit.String(), post.out.Commit == outcome.Unknown)
	e.checkInt("executions of the POST", e.srv.Executions("post"), eq(1), "exactly 1")
	e.srv.Enqueue(outboundtest.ResetAfterRead())
	keyed := e.call(req{method: "POST", id: "keyed", body: `{"order":2}`, header: []string{"Idempotency-Key", `"k-1"`}})
	e.checkRetried("the POST with an Idempotency-Key is retried and answered", keyed)
}

func refusedStream(e *env) {
	e.newClient(outbound.Config{Backoff: noBackoff})
	e.srv.Enqueue(outboundtest.RefusedStream())
	post := e.call(req{method: "POST", id: "post", body: `{"order":1}`})
	e.checkRetried("the POST is retried after the proof", post)
	e.check("its commit status", "committed", post.out.Commit.String(), post.out.Commit == outcome.Committed)
	e.checkInt("executions of the POST", e.srv.Executions("post"), eq(1), "exactly 1")
}

func goAway(e *env) {
	e.newClient(outbound.Config{Backoff: noBackoff})
	e.call(req{method: "GET", id: "warm-up"}) // one connection for the three streams
	e.srv.Enqueue(outboundtest.GoAway(3, 1, false))
	var wg sync.WaitGroup
	results := make([]result, 3)
	for i := range 3 {
		wg.Go(func() { results[i] = e.call(req{method: "POST", id: fmt.Sprintf("post-%d", i), body: `{"order":1}`}) })
	}
	wg.Wait()
	committed, unknown := 0, 0
	for i, r := range results {
		switch r.out.Commit {
		case outcome.Committed:
			committed++
		case outcome.Unknown:
			unknown++
		}
		e.checkInt(fmt.Sprintf("executions of POST %d", i), e.srv.Executions(fmt.Sprintf("post-%d", i)), eq(1), "exactly 1")
	}
	e.checkInt("POSTs above the last-stream-id, retried and committed", committed, eq(2), fmt.Sprintf("2 (MaxAttempts %d)", e.maxAttempts()))
	e.checkInt("POSTs at or below it, commit status unknown", unknown, eq(1), "1")
}

func hardStop(e *env) {
	e.newClient(outbound.Config{Backoff: noBackoff})
	e.call(req{method: "GET", id: "warm-up"}) // one connection for both streams
	e.srv.Enqueue(outboundtest.HardStop(2))
	var post, get result
	var wg sync.WaitGroup
	wg.Go(func() { post = e.call(req{method: "POST", id: "post", body: `{"order":1}`}) })
	wg.Go(func() { get = e.call(req{method: "GET", id: "get"}) })
	wg.Wait()
	e.check("the POST's commit status", "unknown", post.out.Commit.String(), post.out.Commit == outcome.Unknown)
	e.checkInt("executions of the POST", e.srv.Executions("post"), eq(1), "exactly 1")
	e.checkRetried("the GET is retried and answered", get)
	failed := -1
	if b := e.breaker(); b != nil {
		failed = b.Metrics().Failed
	}
	e.checkInt("failures in the breaker's window", failed, eq(0), "0")
}

func retryAfterBeyondDeadline(e *env) {
	e.newClient(outbound.Config{})
	e.srv.Enqueue(outboundtest.Respond(503, "Retry-After", "30"))
	r := e.call(req{method: "GET", id: "get", timeout: 2 * time.Second})
	e.check("the 503 comes back", "503 after 1 attempt", fmt.Sprintf("%d after %d attempt(s)", r.status, len(r.out.Attempts)),
		r.status == 503 && len(r.out.Attempts) == 1)
	why := r.out.Reason == retry.RetryAfterBeyondDeadline || r.out.Reason == retry.RetryAfterTooLong || r.out.End == outcome.CircuitOpened
	e.check("why it was not retried", retry.RetryAfterBeyondDeadline.String()+" (or longer than the cap)", r.out.Why(), why)
	e.check("it came back at once, well before the 2 s deadline", "< 500ms", r.elapsed.Round(time.Millisecond).String(), r.elapsed < 500*time.Millisecond)
}

func oneShotPut(e *env) {
	e.newClient(outbound.Config{})
	e.srv.SetDefault(outboundtest.Respond(503))
	const size = 16 << 20
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	peak := before.HeapAlloc
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapAlloc)
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	r := e.call(req{method: "PUT", id: "blob", stream: size})
	close(stop)
	wg.Wait()
	e.check("the PUT is not retried", "503 after 1 attempt", fmt.Sprintf("%d after %d attempt(s)", r.status, len(r.out.Attempts)),
		r.status == 503 && len(r.out.Attempts) == 1)
	e.check("why", retry.OneShotBody.String(), r.out.Why(), r.out.Reason == retry.OneShotBody)
	e.checkInt("executions", e.srv.Executions("blob"), eq(1), "1")
	grew := int(peak-before.HeapAlloc) >> 10
	e.checkInt("heap growth while streaming 16 MiB (KiB)", grew, atMost(4<<10), "< 4096 KiB: not buffered")
}

// bulkhead says the limit of the bulkhead of the scenario's upstream and
// the attempts holding a slot, for its series (0 before its first call).
func (e *env) bulkhead() (limit, inFlight int) {
	st, _ := e.client.Upstream(e.srv.URL)
	return st.Limit, st.InFlight
}

func overload(e *env) {
	const capacity, service, callers, seconds = 8, 20 * time.Millisecond, 32, 3
	e.newClient(outbound.Config{MaxAttempts: 1, Admission: admission.Config{
		Bulkhead: bulkhead.Config{Adaptive: true, MaxConcurrent: 64},
		Throttle: throttle.Config{Enabled: true},
	}})
	e.quiet = true
	e.srv.SetDefault(outboundtest.Queued(capacity, service))
	stop := e.sample(e.bulkhead)
	end := time.Now().Add(seconds * time.Second)
	settled := time.Now().Add(seconds * time.Second / 2) // the limit has come down by then
	var mu sync.Mutex
	var latencies []time.Duration // of the calls answered after settled
	answered := 0
	var local, other int
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			for n := 0; time.Now().Before(end) && e.ctx.Err() == nil; n++ {
				late := time.Now().After(settled)
				r := e.call(req{method: "GET", id: fmt.Sprintf("w%dc%d", w, n)})
				mu.Lock()
				switch {
				case r.err == nil:
					answered++
					if late {
						latencies = append(latencies, r.elapsed)
					}
				case errors.Is(r.err, admission.ErrRejected) && r.out.Commit == outcome.NotCommitted:
					local++
				default:
					other++
				}
				mu.Unlock()
				if r.err != nil {
					time.Sleep(service / 2) // a refused caller's pace, not a wait for a state
				}
			}
		})
	}
	wg.Wait()
	stop()
	e.checkInt("calls answered", answered, atLeast(1), ">= 1")
	e.checkInt("calls that failed other than by a local rejection", other, eq(0), "0")
	if st, ok := e.client.Upstream(e.srv.URL); ok && e.cfg.Admission.Bulkhead.Adaptive {
		e.checkInt("the adaptive concurrency limit at the end", st.Limit, atMost(2*capacity),
			fmt.Sprintf("<= %d (twice the upstream's capacity of %d; without a limit %d callers are in flight)", 2*capacity, capacity, callers))
		slices.Sort(latencies)
		if len(latencies) > 0 {
			// The median, not a higher percentile: the drill also runs
			// beside other tests, whose load on the CPU stretches the tail
			// (a 90th percentile of 41 ms was seen under -race in CI).
			p50 := latencies[len(latencies)/2]
			e.check("the median latency of the calls answered in the second half", fmt.Sprintf("< %v (without a limit about %v)", 2*service, callers/capacity*service),
				p50.Round(time.Millisecond).String(), p50 < 2*service)
		}
	}
	m := e.breaker().Metrics()
	e.checkInt("failures the breaker recorded", m.Failed, eq(0), "0 (the client's own refusals are not the upstream's failures)")
	e.check("the breaker", "CLOSED", m.State.String(), m.State == circuit.Closed)
}

// overloadMixed runs four critical callers (half the upstream's capacity)
// and twelve sheddable ones, closed-loop, through a bulkhead of the
// upstream's capacity.
func overloadMixed(e *env) {
	const capacity, service, critical, sheddable, seconds = 8, 20 * time.Millisecond, 4, 12, 3
	e.newClient(outbound.Config{MaxAttempts: 1, Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: capacity}}})
	e.srv.SetDefault(outboundtest.Queued(capacity, service))
	stop := e.sample(e.bulkhead)
	end := time.Now().Add(seconds * time.Second)
	var mu sync.Mutex
	var answered, refused [2]int // critical, sheddable
	other := 0
	var wg sync.WaitGroup
	for w := range critical + sheddable {
		level, k := criticality.Critical, 0
		if w >= critical {
			level, k = criticality.Sheddable, 1
		}
		wg.Go(func() {
			for n := 0; time.Now().Before(end) && e.ctx.Err() == nil; n++ {
				r := e.call(req{method: "GET", id: fmt.Sprintf("%v-w%dc%d", level, w, n), level: level})
				mu.Lock()
				switch {
				case r.err == nil:
					answered[k]++
				case errors.Is(r.err, admission.ErrRejected) && r.out.Commit == outcome.NotCommitted:
					refused[k]++
				default:
					other++
				}
				mu.Unlock()
				if r.err != nil {
					time.Sleep(service / 2) // a refused caller's pace
				}
			}
		})
	}
	wg.Wait()
	stop()
	e.checkInt("calls that failed other than by a local rejection", other, eq(0), "0")
	share := func(k int) float64 { return float64(answered[k]) / float64(max(answered[k]+refused[k], 1)) }
	e.check("critical calls answered", ">= 90% of those made", fmt.Sprintf("%.1f%% of %d", 100*share(0), answered[0]+refused[0]), share(0) >= 0.9)
	e.check("sheddable calls answered", "a smaller share than critical calls: they absorb the refusals",
		fmt.Sprintf("%.1f%% of %d", 100*share(1), answered[1]+refused[1]), share(1) < share(0))
	m := e.breaker().Metrics()
	e.checkInt("failures the breaker recorded", m.Failed, eq(0), "0 (the client's own refusals are not the upstream's failures)")
}

func deadBurst(e *env) {
	e.newClient(outbound.Config{
		// A breaker that would open hides the budget: keep it closed here.
		Admission:   admission.Config{Circuit: circuit.Config{WindowSize: 1000, MinimumCalls: 1000}},
		MaxAttempts: 4,
		Backoff:     noBackoff,
	})
	e.srv.SetDefault(outboundtest.Respond(503))
	var wg sync.WaitGroup
	results := make([]result, 60)
	for i := range results {
		wg.Go(func() { results[i] = e.call(req{method: "GET", id: fmt.Sprintf("c%d", i)}) })
	}
	wg.Wait()
	retries := 0 // attempts after a call's first that reached the upstream
	for _, r := range results {
		for _, a := range r.out.Attempts[1:] {
			if a.Category != classify.LocalRejection {
				retries++
			}
		}
	}
	tokens := e.cfg.Budget.MaxTokens
	if tokens == 0 {
		tokens = 10
	}
	e.checkInt("retries that reached the upstream", retries, atMost(int(tokens)),
		fmt.Sprintf("<= %v (the retry budget's tokens: retries while more than half remain), not %d", tokens, 60*(e.maxAttempts()-1)))
	e.checkInt("calls", len(results), eq(60), "60")
}

func fleetShared(e *env) {
	const members, workers, seconds = 4, 8, 2
	f := e.fleet
	e.quiet = true
	var clients []*outbound.Transport
	for range members {
		guard, release := f.New()
		defer release()
		own := outbound.Config{MaxAttempts: 1, Admission: admission.Config{RateGuard: guard}}
		if e.user != nil {
			own = *e.user
			own.Admission.Rate = ratelimit.Config{} // the fleet's limit is the rate guard
			own.Admission.RateGuard = guard
		}
		c, cfg := e.buildFrom(own) // the user's configuration is in own already
		defer c.Close()
		if clients == nil {
			e.cfg = cfg
		}
		clients = append(clients, c)
	}
	e.srv.SetDefault(outboundtest.Respond(200))
	stop := e.sample(func() (limit, inFlight int) { // the members' bulkheads, if they have any
		for _, c := range clients {
			if st, ok := c.Upstream(e.srv.URL); ok {
				limit, inFlight = limit+st.Limit, inFlight+st.InFlight
			}
		}
		return limit, inFlight
	})
	end := time.Now().Add(seconds * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var local, other int
	for i, c := range clients {
		for w := range workers {
			wg.Go(func() {
				for n := 0; time.Now().Before(end) && e.ctx.Err() == nil; n++ {
					r := e.call(req{method: "GET", id: fmt.Sprintf("m%dw%dc%d", i, w, n), client: c})
					mu.Lock()
					switch {
					case r.err == nil:
					case errors.Is(r.err, admission.ErrRejected) && r.out.Commit == outcome.NotCommitted:
						local++
					default:
						other++
					}
					mu.Unlock()
					time.Sleep(5 * time.Millisecond) // a client's pace, not a wait for a state
				}
			})
		}
	}
	wg.Wait()
	stop()
	allowed := f.PerSecond*seconds + float64(f.Burst)
	got := e.srv.TotalExecutions()
	e.checkInt("requests the upstream received", got, atMost(int(allowed*1.01)),
		fmt.Sprintf("<= %.0f (the fleet's %v/s for %d s, plus its burst of %d), not %d members × that", allowed, f.PerSecond, seconds, f.Burst, members))
	e.checkInt("requests the upstream received", got, atLeast(int(0.9*f.PerSecond*seconds)),
		fmt.Sprintf(">= %.0f (the fleet uses its limit)", 0.9*f.PerSecond*seconds))
	e.checkInt("calls the limit refused, as local rejections not sent", local, atLeast(1), ">= 1 (the members asked for more than the limit)")
	e.checkInt("calls that failed otherwise", other, eq(0), "0")
	failed := 0
	for _, c := range clients {
		for _, m := range c.Breakers() {
			failed += m.Failed
		}
	}
	e.checkInt("failures the breakers recorded", failed, eq(0), "0 (a refusal of the fleet's limit is not an upstream failure)")
}

// badReplica runs three replicas of the upstream on one port of
// 127.0.0.2–4, resolved from one name, the first answering 503 until it
// heals; the client spreads over them (Config.Endpoints, kept whatever
// configuration the drill was given: the scenario is about it).
func badReplica(e *env) {
	var reps []*outboundtest.Server
	defer func() {
		for _, s := range reps {
			s.Close()
		}
	}()
	defer func() {
		e.mu.Lock()
		for _, s := range reps {
			e.otherExecutions += s.TotalExecutions()
		}
		e.mu.Unlock()
	}()
	for try := 0; try < 10 && len(reps) < 3; try++ {
		for _, s := range reps {
			s.Close()
		}
		reps = reps[:0]
		for i := range 3 {
			addr := "127.0.0.2:0"
			if i > 0 {
				addr = fmt.Sprintf("127.0.0.%d:%s", 2+i, reps[0].URL[strings.LastIndex(reps[0].URL, ":")+1:])
			}
			s, err := outboundtest.NewServerAt(outboundtest.HTTP1, addr)
			if err != nil {
				break
			}
			reps = append(reps, s)
		}
	}
	if len(reps) < 3 {
		e.check("three replicas listen on 127.0.0.2–4", "listening", "this machine's loopback does not have those addresses", false)
		return
	}
	port := reps[0].URL[strings.LastIndex(reps[0].URL, ":")+1:]
	names := replicaNames{"replicas.drill": {netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("127.0.0.4")}}
	own := outbound.Config{}
	if e.user != nil {
		own = *e.user
	}
	bad := reps[0]
	const warm = 30 // healthy calls first, some to the bad replica
	var warmed int  // what it got of them
	var mu sync.Mutex
	var firstAt int = -1       // the attempts it had got when first ejected
	var ejectedUntil time.Time // the end of its latest ejection
	own.Endpoints = &attempt.Endpoints{Resolver: names, Ejection: attempt.Ejection{BaseTime: time.Second, MaxShare: 0.34},
		OnEject: func(_, ep string, d time.Duration) {
			if d == 0 {
				return
			}
			e.mu.Lock()
			e.res.Ejections = append(e.res.Ejections, Ejection{AtMs: e.now(), Millis: ms(d), Endpoint: ep})
			e.mu.Unlock()
			mu.Lock()
			defer mu.Unlock()
			if firstAt < 0 {
				firstAt = bad.TotalReceived() - warmed
			}
			ejectedUntil = time.Now().Add(d)
		}}
	c, cfg := e.buildFrom(own)
	defer c.Close()
	e.client, e.cfg = c, cfg
	url := "http://replicas.drill:" + port
	for i := range warm { // all healthy: each replica has its latency
		e.call(req{method: "GET", id: fmt.Sprintf("warm-%d", i), url: url})
	}
	warmed = bad.TotalReceived()
	bad.SetDefault(outboundtest.Respond(503))
	// Four callers, as a service has: the attempts in flight spread the
	// picks over the replicas. They go on until the bad replica is
	// ejected, for a few seconds at most: the pick can keep a replica out
	// for a while after one slow answer of the warm-up (its latency
	// estimate fades with a time constant of 1 s, whatever the number of
	// calls), and four callers make hundreds of calls in that time.
	var failed, calls atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(sickFor)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; i < 2000 && time.Now().Before(stop); i++ {
				if r := e.call(req{method: "GET", id: fmt.Sprintf("sick-%d-%d", w, i), url: url}); r.status != 200 {
					failed.Add(1)
				}
				calls.Add(1)
				mu.Lock()
				done := firstAt >= 0
				mu.Unlock()
				if done && i >= 15 {
					return
				}
			}
		})
	}
	wg.Wait()
	e.checkInt(fmt.Sprintf("of %d calls while one replica of three answered 503, those that failed", calls.Load()), int(failed.Load()), eq(0), "0")
	mu.Lock()
	first, until := firstAt, ejectedUntil
	mu.Unlock()
	e.checkInt("attempts the bad replica got before its first ejection", first, func(n int) bool { return n >= 5 && n <= 8 },
		"5 (its failures in a row), and up to 3 more (the other callers' attempts already on their way)")
	m, ok := e.client.Breakers()[url]
	e.check("the upstream's breaker", "CLOSED, with the bad replica's failures in its window",
		fmt.Sprintf("%v, %d failed", m.State, m.Failed), ok && m.State == circuit.Closed && m.Failed > 0)
	bad.SetDefault(outboundtest.Respond(200))
	time.Sleep(time.Until(until) + 100*time.Millisecond) // its latest ejection (1 s, then 2 s… here) ends
	before, healed := bad.TotalReceived(), 0
	for stop := time.Now().Add(sickFor); healed < 60 || bad.TotalReceived() == before && time.Now().Before(stop); healed++ {
		e.call(req{method: "GET", id: fmt.Sprintf("healed-%d", healed), url: url})
	}
	e.checkInt(fmt.Sprintf("of %d calls after it healed, those the replica got", healed), bad.TotalReceived()-before,
		func(n int) bool { return n > 0 }, "some")
}

// sickFor bounds each phase of badReplica: long enough for a latency
// estimate raised 100-fold to fade (time constant 1 s).
const sickFor = 6 * time.Second

// replicaNames maps host names to addresses (attempt.Resolver).
type replicaNames map[string][]netip.Addr

func (m replicaNames) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}
