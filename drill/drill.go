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
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"reflect"
	"runtime"
	"slices"
	"strconv"
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

	series atomic.Pointer[series] // counts the calls, while the scenario samples (see sample)

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
	e.mu.Lock()
	if e.res.Config == nil { // the scenario's first client: its members are alike
		e.res.Config = describeConfig(cfg)
	}
	e.mu.Unlock()
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
	if s := e.series.Load(); s != nil {
		s.add(r.level, res)
	}
	return res
}

func (e *env) record(since time.Duration, out *outcome.Outcome) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.res.Calls++
	e.res.Commits[out.Commit.String()]++
	e.res.Retries += max(len(out.Attempts)-1, 0)
	for _, ev := range marksOf(e.res.Calls, since, out) {
		if ev.Guard != "" {
			e.res.Rejections[ev.Guard]++
		}
		e.res.Attempts[ev.Category]++
		if !e.quiet {
			e.res.Events = append(e.res.Events, ev)
		}
	}
}

// marksOf lays the attempts of call, which started at since, out on the
// scenario's clock, in the order they started. The outcome gives each
// attempt's duration and the wait after it, not when it started: a call
// without hedges is a sequence, each attempt starting after the one before
// and its wait. A hedged round's attempts are in the outcome as they
// landed, the one that decided the round (whose Decision says what came
// next) last; the round starts with its first attempt, the only one that is
// no hedge, and a hedge is placed to end with it, as one the first's answer
// cancelled does — the latest it can have started, if it ended later.
func marksOf(call int, since time.Duration, out *outcome.Outcome) []Mark {
	var marks []Mark
	at := since // summed as a duration, rounded once: no float drift
	as := out.Attempts
	for i := 0; i < len(as); {
		j := i // the round is as[i..j]: it ends with an attempt that decided a retry, or the call's last
		for j < len(as)-1 && as[j].Decision == 0 {
			j++
		}
		round := make([]outcome.Attempt, 0, j-i+1)
		for _, a := range as[i : j+1] { // the first attempt first, then the hedges
			if !a.Hedge {
				round = append(round, a)
			}
		}
		first := time.Duration(-1)
		if len(round) > 0 {
			first = round[0].Duration
		}
		for _, a := range as[i : j+1] {
			if a.Hedge {
				round = append(round, a)
			}
		}
		var length time.Duration
		for _, a := range round {
			start := at
			if a.Hedge && first >= 0 {
				start += max(first-a.Duration, 0)
			}
			length = max(length, start-at+a.Duration)
			ev := Mark{AtMs: ms(start), Millis: ms(a.Duration), Call: call, Category: a.Category.String(), Status: a.Status, Endpoint: a.Endpoint,
				Failure: a.Category == classify.Answered && a.Status >= 500 || a.Category == classify.Ambiguous,
				Attempt: len(marks) + 1, Hedge: a.Hedge, Lost: a.Lost}
			if a.Guard != 0 {
				ev.Guard = a.Guard.String()
			}
			marks = append(marks, ev)
		}
		at += length + as[j].Wait
		i = j + 1
	}
	if len(marks) > 0 {
		marks[len(marks)-1].Commit = out.Commit.String()
	}
	return marks
}

// maxSamples bounds a scenario's series: when it is full, neighbouring
// samples are merged in pairs and the interval doubles, so that a run of any
// length keeps between maxSamples/2 and maxSamples samples.
const maxSamples = 240

// sampleEvery is a series' first interval.
const sampleEvery = 25 * time.Millisecond

// sample starts the scenario's series: at every interval, on the
// scenario's clock, snap says the bulkhead's limit and the attempts in
// flight, and the calls that ended in the interval are counted. stop takes
// the last sample and puts the series in the report.
func (e *env) sample(snap func() (limit, inFlight int)) (stop func()) {
	s := &series{every: sampleEvery, from: e.now()}
	e.series.Store(s)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(s.every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				limit, inFlight := snap()
				if every := s.tick(e.now(), limit, inFlight); every != 0 {
					t.Reset(every)
				}
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
		e.series.Store(nil)
		limit, inFlight := snap()
		s.tick(e.now(), limit, inFlight)
		e.mu.Lock()
		e.res.Series = s.result()
		e.mu.Unlock()
	}
}

// series is a scenario's series as it is sampled.
type series struct {
	mu      sync.Mutex
	every   time.Duration // the interval now
	from    float64       // the start of the current interval, in ms on the scenario's clock
	cur     Sample        // the current interval's counts
	curLat  latencies
	samples []Sample
	lat     []latencies // of each sample
}

// add counts a call that ended now, of criticality level.
func (s *series) add(level criticality.Level, r result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var c LevelCounts
	switch {
	case r.err == nil:
		c.Answered = 1
		s.curLat.add(ms(r.elapsed))
	case errors.Is(r.err, admission.ErrRejected) && r.out != nil && r.out.Commit == outcome.NotCommitted:
		c.Rejected = 1
	default:
		c.Failed = 1
	}
	s.cur.Answered += c.Answered
	s.cur.Rejected += c.Rejected
	s.cur.Failed += c.Failed
	if level != criticality.Default {
		if s.cur.ByLevel == nil {
			s.cur.ByLevel = map[string]LevelCounts{}
		}
		s.cur.ByLevel[level.String()] = addCounts(s.cur.ByLevel[level.String()], c)
	}
}

func addCounts(a, b LevelCounts) LevelCounts {
	return LevelCounts{Answered: a.Answered + b.Answered, Rejected: a.Rejected + b.Rejected, Failed: a.Failed + b.Failed}
}

// tick ends the current interval at at (ms on the scenario's clock) with
// a sample of the bulkhead's limit and the attempts in flight. When the
// series is full it halves it, and returns the interval that doubled; it
// returns 0 otherwise.
func (s *series) tick(at float64, limit, inFlight int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if at <= s.from && len(s.samples) > 0 {
		return 0
	}
	smp := s.cur
	smp.AtMs, smp.Millis, smp.Limit, smp.InFlight = at, at-s.from, limit, inFlight
	s.samples, s.lat = append(s.samples, smp), append(s.lat, s.curLat)
	s.cur, s.curLat, s.from = Sample{}, latencies{}, at
	if len(s.samples) < maxSamples {
		return 0
	}
	for i := range len(s.samples) / 2 {
		a, b := s.samples[2*i], s.samples[2*i+1]
		b.Millis += a.Millis
		b.Answered += a.Answered
		b.Rejected += a.Rejected
		b.Failed += a.Failed
		if len(a.ByLevel) > 0 {
			m := maps.Clone(b.ByLevel)
			if m == nil {
				m = map[string]LevelCounts{}
			}
			for k, c := range a.ByLevel {
				m[k] = addCounts(m[k], c)
			}
			b.ByLevel = m
		}
		s.samples[i] = b
		s.lat[i] = s.lat[2*i]
		s.lat[i].merge(&s.lat[2*i+1])
	}
	s.samples, s.lat = s.samples[:len(s.samples)/2], s.lat[:len(s.lat)/2]
	s.every *= 2
	return s.every
}

// result returns the samples with their latency percentiles.
func (s *series) result() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.samples)
	for i := range out {
		out[i].P50Ms, out[i].P99Ms = s.lat[i].quantile(0.5), s.lat[i].quantile(0.99)
	}
	return out
}

// latencies is a histogram of latencies in ms, in buckets that grow by
// latencyGrowth from latencyLow: a quantile is off by less than 5%, and the
// histogram's size does not depend on the number of calls.
type latencies struct {
	n        int
	min, max float64
	counts   [latencyBuckets]int32
}

const (
	latencyBuckets = 160 // up to 0.05 ms × 1.1^160, about 200 s
	latencyLow     = 0.05
	latencyGrowth  = 1.1
)

func (l *latencies) add(v float64) {
	b := 0
	if v > latencyLow {
		b = min(int(math.Log(v/latencyLow)/math.Log(latencyGrowth)), latencyBuckets-1)
	}
	l.counts[b]++
	if l.n == 0 || v < l.min {
		l.min = v
	}
	l.max = max(l.max, v)
	l.n++
}

func (l *latencies) merge(o *latencies) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		l.counts[i] += c
	}
	if l.n == 0 || o.min < l.min {
		l.min = o.min
	}
	l.max = max(l.max, o.max)
	l.n += o.n
}

// quantile returns the q-quantile (0 < q < 1): the middle of its bucket,
// within the least and the most seen; 0 for none.
func (l *latencies) quantile(q float64) float64 {
	if l.n == 0 {
		return 0
	}
	rank := int32(math.Ceil(q * float64(l.n)))
	var seen int32
	for i, c := range l.counts {
		if seen += c; seen >= rank {
			v := latencyLow * math.Pow(latencyGrowth, float64(i)+0.5)
			return math.Round(min(max(v, l.min), l.max)*1000) / 1000
		}
	}
	return l.max
}

// describeConfig says, for people, what matters of a client's
// configuration, a few words per part: the fields set, by their names in
// the configuration; "defaults" for a part left zero.
func describeConfig(c outbound.Config) map[string]string {
	or := func(s, zero string) string { return cmp.Or(s, zero) }
	a := c.Admission
	d := map[string]string{
		"MaxAttempts": strconv.Itoa(c.MaxAttempts),
		"Backoff":     or(fieldsOf(c.Backoff), "defaults"),
		"Timeouts":    or(fieldsOf(struct{ Timeout, AttemptTimeout time.Duration }{c.Timeout, c.AttemptTimeout}), "none"),
		"Budget":      or(fieldsOf(c.Budget), "defaults"),
		"Breaker":     or(fieldsOf(a.Circuit), "defaults"),
		"Rate":        or(fieldsOf(a.Rate), "none"),
		"Bulkhead":    "none",
		"Throttle":    "off",
		"Hedging":     "off",
		"Endpoints":   "none: a host is dialed by name",
	}
	switch c.MaxAttempts {
	case 0:
		d["MaxAttempts"] = fmt.Sprintf("%d (the default)", outbound.DefaultMaxAttempts)
	case 1:
		d["MaxAttempts"] = "1: no retries"
	}
	if a.RateGuard != nil {
		d["Rate"] = "a rate guard of its own (RateGuard)" + prefixed(", ", fieldsOf(a.Rate))
	}
	if b := a.Bulkhead; b.MaxConcurrent > 0 {
		kind := "fixed"
		if b.Adaptive {
			kind, b.Adaptive = "adaptive", false
		}
		d["Bulkhead"] = kind + prefixed(", ", fieldsOf(b))
	}
	if t := a.Throttle; t.Enabled {
		t.Enabled = false
		d["Throttle"] = "on" + prefixed(", ", fieldsOf(t))
	}
	if h := c.Hedging; h != nil {
		d["Hedging"] = "on" + prefixed(", ", or(fieldsOf(*h), "defaults"))
		if h.Delay == 0 {
			d["Hedging"] += ", adaptive delay"
		}
	}
	if ep := c.Endpoints; ep != nil {
		d["Endpoints"] = "spread over the host's addresses" + prefixed(", ", fieldsOf(*ep))
	}
	if other := fieldsOf(struct {
		IdempotencyKeys                                 bool
		MaxRetryAfter, IdleConnTimeout, MaxConnAge      time.Duration
		MaxConnRequests, MaxUpstreams                   int
		FinishQuantile                                  float64
		IsFailure, RetryableStatus, OpenOnRetryAfter    bool
		BreakerRecords, DistrustRefusedStream, Deadline bool
	}{c.IdempotencyKeys, c.MaxRetryAfter, c.IdleConnTimeout, c.MaxConnAge, c.MaxConnRequests, c.MaxUpstreams, c.FinishQuantile,
		c.IsFailure != nil, c.RetryableStatus != nil, c.OpenOnRetryAfter != nil,
		c.BreakerRecords != nil, c.DistrustRefusedStream != nil, c.Deadline != nil}); other != "" {
		d["Other"] = other
	}
	return d
}

func prefixed(p, s string) string {
	if s == "" {
		return ""
	}
	return p + s
}

// fieldsOf lists the fields of struct v that are set, by name: "Name
// value" (a bool set is its name alone, a struct its fields in braces),
// skipping functions and interfaces, which have no words.
func fieldsOf(v any) string {
	var parts []string
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		f, fv := rv.Type().Field(i), rv.Field(i)
		if !f.IsExported() || fv.IsZero() {
			continue
		}
		for fv.Kind() == reflect.Pointer {
			fv = fv.Elem()
		}
		switch fv.Kind() {
		case reflect.Func, reflect.Interface, reflect.Chan, reflect.Map, reflect.Slice:
		case reflect.Bool:
			parts = append(parts, f.Name)
		case reflect.Struct:
			if inner := fieldsOf(fv.Interface()); inner != "" {
				parts = append(parts, f.Name+"{"+inner+"}")
			}
		case reflect.Float32, reflect.Float64:
			parts = append(parts, f.Name+" "+strconv.FormatFloat(fv.Float(), 'g', -1, 64))
		default:
			parts = append(parts, f.Name+" "+fmt.Sprint(fv.Interface()))
		}
	}
	return strings.Join(parts, ", ")
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
