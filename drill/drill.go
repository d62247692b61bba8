// Package drill runs scripted failure scenarios against the fault upstream
// of package outboundtest, started on loopback for each scenario, through a
// client built from the library, and judges each against what a correct
// client must do: an outage and the recovery under local back-pressure, a
// 503 storm, resets before and after processing, HTTP/2 REFUSED_STREAM and
// GOAWAY, a Retry-After beyond the deadline, a streamed one-shot PUT, a
// burst against a dead upstream.
//
// By default each scenario builds its client from a configuration of its
// own, chosen to show the behaviour quickly; that is what `outbound drill`
// runs. Given Options.Config, every scenario uses that configuration
// instead, so a test of yours can ask whether your configuration survives
// these situations:
//
//	cfg := outbound.Config{MaxAttempts: 3, Admission: admission.Config{...}}
//	r, err := drill.Run(ctx, drill.Options{Config: &cfg})
//	if !r.Passed { ... r.Scenarios[i].Checks says what failed ... }
//
// With your configuration the scenarios last as long as its waits: the
// outage scenario waits out the breaker's WaitInOpen (60 s by default).
package drill

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// Scenario is one scripted situation.
type Scenario struct {
	Name   string
	Title  string
	Expect string
	Proto  outboundtest.Proto
	run    func(e *env)
}

// Options select and observe a drill run.
type Options struct {
	// Only, if not empty, runs the scenarios with these names.
	Only []string
	// Config, if set, is the configuration every scenario's client is
	// built from, instead of the scenario's own: its Transport gives the
	// dialer and timeouts, but the drill sets what reaches the fault
	// upstream (its TLS roots and protocols, no proxy); its Hooks and
	// Admission.OnEvent are called as well as the drill's.
	Config *outbound.Config
	// Progress, if set, is called before each scenario.
	Progress func(i, n int, s Scenario)
	// Version is recorded in the report.
	Version string
	// Hooks, if set, observe every scenario's client (for metrics).
	Hooks outbound.Hooks
	// Observe, if set, is given every scenario's Transport when it is
	// built (for the metrics of its breakers).
	Observe func(*outbound.Transport)
	// Fleet, if set, adds the fleet scenario: several clients, each a
	// member of a fleet with a rate guard of its own, share one limit
	// against the fault upstream.
	Fleet *Fleet
}

// Fleet is a rate limit shared by a fleet of processes, for the fleet
// scenario: on Redis, New returns the For method of a limiter the redis
// module's New makes, and its Close.
type Fleet struct {
	// PerSecond and Burst are the fleet's limit.
	PerSecond float64
	Burst     int
	// New makes the rate guard of one more member of the fleet — what
	// admission.Config.RateGuard takes, as a process of the fleet would
	// have it — and the function that releases it.
	New func() (rateGuard func(upstream string) admission.RateGuard, release func())
}

// fleetScenario is the scenario Options.Fleet adds.
var fleetScenario = Scenario{Name: "fleet-shared-limit", Proto: outboundtest.HTTP1,
	Title:  "Four clients, each a member of a fleet with a rate guard of its own, share one limit",
	Expect: "The upstream receives what the fleet's limit allows and no more — not four times the limit — and the fleet uses its limit; calls the limit refuses are local rejections, never sent, and no client's breaker records them.",
	run:    fleetShared}

// Run runs the scenarios and returns the report. It returns an error only
// for what it cannot run: an unknown scenario name, or the fleet scenario
// without Options.Fleet.
func Run(ctx context.Context, opts Options) (*Report, error) {
	var list []Scenario
	if len(opts.Only) == 0 {
		list = Scenarios()
		if opts.Fleet != nil {
			list = append(list, fleetScenario)
		}
	} else {
		for _, name := range opts.Only {
			s, ok := Find(name)
			if name == fleetScenario.Name {
				if opts.Fleet == nil {
					return nil, fmt.Errorf("scenario %q needs Options.Fleet: a rate limit shared by a fleet, such as the redis module's limiter", name)
				}
				s, ok = fleetScenario, true
			}
			if !ok {
				return nil, fmt.Errorf("no scenario %q (outbound drill --list shows them)", name)
			}
			list = append(list, s)
		}
	}
	r := &Report{Version: opts.Version, GoVersion: runtime.Version(), Started: time.Now(), Passed: true}
	for i, s := range list {
		if opts.Progress != nil {
			opts.Progress(i, len(list), s)
		}
		res := runOne(ctx, s, opts)
		r.Passed = r.Passed && res.Passed
		r.Scenarios = append(r.Scenarios, res)
	}
	r.Millis = ms(time.Since(r.Started))
	return r, nil
}

// Find returns the scenario named name.
func Find(name string) (Scenario, bool) {
	for _, s := range Scenarios() {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

func runOne(ctx context.Context, s Scenario, opts Options) ScenarioResult {
	e := &env{ctx: ctx, sc: s, hooks: opts.Hooks, observe: opts.Observe, user: opts.Config, fleet: opts.Fleet, start: time.Now(),
		res: ScenarioResult{Name: s.Name, Title: s.Title, Protocol: s.Proto.String(), Expect: s.Expect,
			Checks: []Check{}, Attempts: map[string]int{}, Commits: map[string]int{}, Rejections: map[string]int{},
			Transitions: []Transition{}, Events: []Mark{}}}
	e.srv = outboundtest.NewServer(s.Proto)
	defer func() {
		if e.client != nil {
			e.client.Close()
		}
		e.srv.Close()
	}()
	func() {
		defer func() {
			if p := recover(); p != nil {
				e.check("the scenario runs to its end", "no panic", fmt.Sprint(p), false)
			}
		}()
		s.run(e)
	}()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.res.Executions = e.srv.TotalExecutions() + e.otherExecutions
	e.res.Millis = ms(time.Since(e.start))
	e.res.Passed = len(e.res.Checks) > 0
	for _, c := range e.res.Checks {
		e.res.Passed = e.res.Passed && c.Passed
	}
	return e.res
}

// env is a scenario's world: the upstream, the client, and the record.
type env struct {
	ctx     context.Context
	sc      Scenario
	srv     *outboundtest.Server
	client  *outbound.Transport
	hooks   outbound.Hooks
	observe func(*outbound.Transport)
	user    *outbound.Config // Options.Config
	fleet   *Fleet           // Options.Fleet
	cfg     outbound.Config  // the configuration of the client, once built
	start   time.Time
	quiet   bool // count the calls, but keep no event per attempt

	otherExecutions int // what upstreams of the scenario's own, beside srv, executed

	openWait atomic.Int64 // the wait in OPEN of the breaker's latest opening, as it said

	mu  sync.Mutex
	res ScenarioResult
}

// newClient builds the scenario's client from own, the scenario's
// configuration, or from the user's if one was given; breaker transitions
// go to the timeline.
func (e *env) newClient(own outbound.Config) *outbound.Transport {
	c, cfg := e.build(own)
	e.client, e.cfg = c, cfg
	return c
}

// build builds a client as newClient does, for the scenario to close.
func (e *env) build(own outbound.Config) (*outbound.Transport, outbound.Config) {
	if e.user != nil {
		own = *e.user
	}
	return e.buildFrom(own)
}

// buildFrom builds a client from cfg as it is, with what the drill adds:
// the fault upstream's TLS roots and protocols, its hooks, the timeline.
func (e *env) buildFrom(cfg outbound.Config) (*outbound.Transport, outbound.Config) {
	base := e.srv.Transport()
	if cfg.HTTPTransport != nil {
		t := cfg.HTTPTransport.Clone()
		t.TLSClientConfig, t.Protocols, t.Proxy = base.TLSClientConfig, base.Protocols, nil
		base = t
	}
	cfg.HTTPTransport = base
	cfg.Hooks = outbound.ComposeHooks(cfg.Hooks, e.hooks)
	user := cfg.Admission.OnEvent
	cfg.Admission.OnEvent = func(ev admission.Event) {
		if ev.Kind == admission.Transition {
			if ev.Transition.To == circuit.Open {
				e.openWait.Store(int64(ev.Transition.Wait))
			}
			e.mu.Lock()
			e.res.Transitions = append(e.res.Transitions, Transition{AtMs: e.now(), From: ev.Transition.From.String(),
				To: ev.Transition.To.String(), Reason: ev.Transition.Cause.String()})
			e.mu.Unlock()
		}
		if user != nil {
			user(ev)
		}
	}
	c, err := outbound.New(cfg)
	if err != nil {
		panic(err)
	}
	if e.observe != nil {
		e.observe(c)
	}
	return c, cfg
}

// waitInOpen is how long the client's breaker stays OPEN after its latest
// opening, as the breaker said when it opened (backoff and jitter
// included).
func (e *env) waitInOpen() time.Duration { return time.Duration(e.openWait.Load()) }

// maxAttempts is the client's most attempts per call.
func (e *env) maxAttempts() int { return cmp.Or(e.cfg.MaxAttempts, outbound.DefaultMaxAttempts) }

func (e *env) now() float64 { return ms(time.Since(e.start)) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// req describes one call.
type req struct {
	method  string
	id      string
	body    string
	oneShot bool
	stream  int64 // a one-shot body of this many zero bytes
	header  []string
	timeout time.Duration
	client  *outbound.Transport // nil: the scenario's client
	url     string              // nil: the fault upstream's
	level   criticality.Level   // the call's criticality
}

// result is what a call came to.
type result struct {
	status  int
	out     *outcome.Outcome
	err     error
	elapsed time.Duration
}

// call makes one call and records it on the timeline.
func (e *env) call(r req) result {
	var body io.Reader
	switch {
	case r.stream > 0:
		body = io.NopCloser(io.LimitReader(zeros{}, r.stream))
	case r.body != "" && r.oneShot:
		body = io.NopCloser(strings.NewReader(r.body))
	case r.body != "":
		body = strings.NewReader(r.body)
	}
	ctx := e.ctx
	if r.level != criticality.Default {
		ctx = criticality.With(ctx, r.level)
	}
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, cmp.Or(r.url, e.srv.URL)+"/"+r.id, body)
	if err != nil {
		panic(err)
	}
	if r.stream > 0 {
		hr.ContentLength = r.stream
	}
	hr.Header.Set(outboundtest.IDHeader, r.id)
	for i := 0; i+1 < len(r.header); i += 2 {
		hr.Header.Set(r.header[i], r.header[i+1])
	}
	start := time.Now()
	since := start.Sub(e.start)
	c := cmp.Or(r.client, e.client)
	resp, out, err := c.Do(hr)
	res := result{out: out, err: err}
	if resp != nil {
		res.status = resp.StatusCode
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	res.elapsed = time.Since(start)
	e.record(since, out)
	return res
}

func (e *env) record(since time.Duration, out *outcome.Outcome) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.res.Calls++
	e.res.Commits[out.Commit.String()]++
	e.res.Retries += max(len(out.Attempts)-1, 0)
	at := since // summed as a duration, rounded once: no float drift
	for _, a := range out.Attempts {
		ev := Mark{AtMs: ms(at), Millis: ms(a.Duration), Call: e.res.Calls, Category: a.Category.String(), Status: a.Status, Endpoint: a.Endpoint,
			Failure: a.Category == classify.Answered && a.Status >= 500 || a.Category == classify.Ambiguous}
		if a.Guard != 0 {
			ev.Guard = a.Guard.String()
			e.res.Rejections[ev.Guard]++
		}
		e.res.Attempts[ev.Category]++
		if !e.quiet {
			e.res.Events = append(e.res.Events, ev)
		}
		at += a.Duration + a.Wait
	}
}

// check records a verdict.
func (e *env) check(what, want, got string, pass bool) {
	e.mu.Lock()
	e.res.Checks = append(e.res.Checks, Check{What: what, Want: want, Got: got, Passed: pass})
	e.mu.Unlock()
}

// checkInt records a verdict on a count.
func (e *env) checkInt(what string, got int, ok func(int) bool, want string) {
	e.check(what, want, fmt.Sprint(got), ok(got))
}

// waitState waits, boundedly, until the breaker of the scenario's upstream
// is in state st.
func (e *env) waitState(st circuit.State, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for e.state() != st {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// breaker returns the breaker of the scenario's upstream, or nil before its
// first call.
func (e *env) breaker() *circuit.Breaker {
	if b, ok := e.client.Breaker(e.srv.URL); ok {
		return b
	}
	return nil
}

// state is the state of the scenario's breaker: CLOSED before its first
// call.
func (e *env) state() circuit.State {
	if b := e.breaker(); b != nil {
		return b.State()
	}
	return circuit.Closed
}

// zeros is an endless stream of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// noBackoff keeps scenarios fast where the wait between attempts does not
// matter to the verdict.
var noBackoff = retry.Backoff{Initial: time.Millisecond, Max: time.Millisecond, Jitter: -1}

func eq(want int) func(int) bool   { return func(got int) bool { return got == want } }
func atMost(n int) func(int) bool  { return func(got int) bool { return got <= n } }
func atLeast(n int) func(int) bool { return func(got int) bool { return got >= n } }
