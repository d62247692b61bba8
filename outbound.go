// Package outbound makes outbound HTTP calls that fail correctly.
//
// Every physical attempt of a call passes the upstream's circuit breaker,
// client-side throttle (off unless configured), rate limiter and bulkhead
// (package admission), goes out as exactly one
// attempt on the wire with no hidden transport retry (package attempt), and
// when it fails is classified by what it proves (package classify). Another
// attempt is made only when that is provably safe and fits the deadline
// (package retry), and the caller learns the call's commit status —
// committed, not committed, or unknown — as a first-class result (package
// outcome).
//
// One type does it all: a Transport, made by New. Its Do returns the
// response with the call's outcome; as the http.RoundTripper of any
// *http.Client or SDK, it makes the same calls, and OutcomeOf finds the
// outcome of a failed one from its error.
package outbound

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// Config configures a Transport. The zero value is usable: Resilience4j-like
// breaker defaults, no rate limit, no bulkhead, up to 3 attempts with
// exponential backoff, a retry budget, no timeout beyond the request's
// context.
type Config struct {
	// HTTPTransport supplies the settings of new connections: dialer, TLS
	// dialer, proxy, TLS configuration, protocols, timeouts, and the limits
	// MaxIdleConns, MaxIdleConnsPerHost, MaxConnsPerHost and
	// IdleConnTimeout, which apply as in net/http. Nil means a clone of
	// http.DefaultTransport. It is cloned, not used: its own connection pool
	// is never touched (one attempt must be one request on the wire). Its
	// Proxy is called with the caller's request, once per call, and
	// connections are pooled per proxy as well as per address.
	HTTPTransport *http.Transport

	// Admission is the template of every upstream's guards: circuit
	// breaker, rate limiter, bulkhead, and the event observer (which
	// Hooks.Guard joins). Its Upstream is filled in per upstream.
	Admission admission.Config

	// UpstreamKey names the upstream a request belongs to: one set of
	// guards and one retry budget per key. Nil means attempt.DefaultUpstreamKey
	// (scheme://host:port, one spelling per host).
	UpstreamKey func(*http.Request) string

	// IsFailure says which answers the breaker records as upstream
	// failures. Nil means 500, 502, 503 and 504.
	IsFailure func(*http.Response) bool

	// BreakerRecords says which failed attempts the breaker records as
	// upstream failures, by what the failure proves (its stage, category,
	// evidence and cause): for example to count Ambiguous failures and
	// refused connections but not a DNS name that does not exist, or to
	// count a refused TLS certificate. It is asked for every attempt that
	// reached for the upstream and failed without an answer, and for an
	// answer whose body failed; an attempt it declines is released
	// (neither success nor failure). It is not asked for attempts the
	// caller cancelled, that were refused locally, or that waited in vain
	// for a connection. Nil means attempt.DefaultBreakerRecords.
	BreakerRecords func(*classify.Error) bool

	// DistrustRefusedStream names the upstreams (by key) whose HTTP/2
	// RST_STREAM(REFUSED_STREAM) is not taken as proof that the request
	// was not processed: the attempt is then Ambiguous, the call's commit
	// status Unknown unless a later attempt is answered, and only an
	// idempotent or keyed request is sent again. Set it for upstreams
	// behind HAProxy or another proxy you do not control: HAProxy (2.6,
	// measured) answers REFUSED_STREAM for a request its backend executed
	// and then failed to answer, on a healthy connection, because it has
	// sent no response headers yet. Whatever it says, a REFUSED_STREAM from
	// a connection that was going away (after a GOAWAY that covered the
	// stream: a proxy's hard stop) is never taken as proof. Nil means that
	// every upstream's REFUSED_STREAM is trusted, as net/http trusts it.
	DistrustRefusedStream func(upstream string) bool

	// OpenOnRetryAfter, if set, lets the upstream say when it is down: an
	// answer whose status it accepts (say 503, or 429) and that carries a
	// Retry-After opens the upstream's breaker for that long — at most
	// MaxRetryAfter — instead of waiting for failures to accumulate (the
	// circuit.Breaker's OpenFor). Trial calls follow as usual. The call
	// that got the answer ends with it at once (reason
	// outcome.CircuitOpened) rather than waiting to retry, since every call
	// to the upstream is refused until then. Nil means off.
	OpenOnRetryAfter func(status int) bool

	// RetryableStatus says which answers may be retried (idempotent requests
	// only). Nil means 408, 429, 500, 502, 503 and 504.
	RetryableStatus func(status int) bool

	// MaxAttempts bounds the attempts of one call, the first included.
	// Zero means DefaultMaxAttempts; 1 disables retries.
	MaxAttempts int

	// Backoff is the wait between attempts.
	Backoff retry.Backoff

	// MaxRetryAfter is the longest Retry-After the client honours; an
	// answer asking for longer is returned to the caller. Zero means 30s.
	MaxRetryAfter time.Duration

	// Budget is the per-upstream retry budget.
	Budget retry.BudgetConfig

	// Timeout bounds a whole call (every attempt, wait and the reading of
	// the final body) when the request's context has no deadline. Zero
	// means none.
	Timeout time.Duration

	// AttemptTimeout bounds each attempt, from admission until its response
	// body is closed or read to the end. An attempt that exceeds it counts
	// as an upstream failure. Zero means none.
	AttemptTimeout time.Duration

	// IdempotencyKeys, when true, gives every request with a
	// non-idempotent method (POST, PATCH, …), a replayable body and no
	// Idempotency-Key header a generated key (a UUID as a String structured
	// field, per the IETF httpapi Idempotency-Key draft), which makes it
	// retryable after an ambiguous failure or a retryable status. Enable it
	// only for upstreams that honour the header. The same key is sent with
	// every attempt of a call.
	IdempotencyKeys bool

	// Hedging, if set, sends a hedge — another attempt beside one that has
	// not answered within a delay — for the calls that could be retried
	// after an ambiguous failure, and takes the first answer (see
	// Hedging). Nil means no hedging; WithHedging sets it per call.
	Hedging *Hedging

	// FinishQuantile is the share of the upstream's recent answers that
	// must fit in the time left before a call's deadline for an attempt to
	// begin: with less left, the attempt would most likely not finish, the
	// upstream's work for it would be lost, and the call ends at once, not
	// sent (outcome.CannotFinish); a retry whose wait and attempt do not
	// fit is not made. Zero means DefaultFinishQuantile, the median;
	// negative begins every attempt. Calls without a deadline, and an
	// upstream with fewer than 64 recent answers, are not judged.
	FinishQuantile float64

	// Deadline, if set, sends each attempt to the hosts it names how long
	// it has left, in a header (see Deadline). Nil means no host gets it.
	Deadline *Deadline

	// SendCriticality, if set, sends each call's criticality (package
	// criticality) to the hosts it names, in a header. Nil means no host
	// gets it.
	SendCriticality *SendCriticality

	// IdleConnTimeout closes a connection that has carried no request for
	// this long. Zero means the Transport's IdleConnTimeout, and if that is
	// zero too, 90 seconds: net/http then keeps idle connections forever,
	// but here an idle connection also keeps its upstream's state.
	IdleConnTimeout time.Duration

	// MaxConnAge and MaxConnRequests retire a connection once it is that
	// old or has carried that many requests: it takes no new request and
	// is closed when those in flight have ended, so that connections
	// spread again over an upstream's replicas after they change (net/http
	// keeps a connection for as long as it works: golang/go#54429). Zero
	// means no limit, the default.
	MaxConnAge      time.Duration
	MaxConnRequests int

	// Endpoints, if set, spreads the attempts to a host over every address
	// it resolves to (a headless service, a name with several A records),
	// each with its own connections, picks the less loaded of two at
	// random per attempt, sends a retry or a hedge to another endpoint
	// than the call's earlier attempts, and ejects an endpoint whose
	// attempts keep failing, for a while — while the breaker, rate limiter
	// and bulkhead stay one per upstream. Nil: a host is dialed by name,
	// as net/http does. See attempt.Endpoints for its settings and what is
	// still dialed by name.
	Endpoints *attempt.Endpoints

	// UpstreamIdleTime is how long an upstream's state (breaker, rate
	// limiter, bulkhead, retry budget, connection pool) is kept without a
	// call before it is forgotten, if it holds nothing worth keeping: a
	// breaker outside the state it started in is never forgotten (an outage
	// must not be forgotten to get round the breaker), nor are permits in
	// use, tokens owed to the rate limiter or open connections. Zero means
	// 5 minutes; negative, forever. Hooks.UpstreamForgotten is told.
	UpstreamIdleTime time.Duration

	// MaxUpstreams caps the upstreams whose state is kept. A call to a new
	// upstream beyond it makes room by forgetting the least recently used
	// upstreams that hold nothing, and fails with classify.ErrTooManyUpstreams,
	// without being sent, when there are none. Zero means no cap.
	MaxUpstreams int

	// Hooks observe calls, attempts, retry decisions and the guards. See
	// Hooks, SlogHooks and ComposeHooks; the OpenTelemetry module builds
	// them too.
	Hooks Hooks
}

// DefaultFinishQuantile is Config.FinishQuantile when zero: an attempt
// begins only with at least the upstream's median latency left.
const DefaultFinishQuantile = 0.5

// DefaultMaxAttempts is the attempts of one call, the first included, when
// Config.MaxAttempts is zero.
const DefaultMaxAttempts = 3

// DefaultRetryableStatus reports whether status is 408, 429, 500, 502, 503
// or 504.
func DefaultRetryableStatus(status int) bool {
	switch status {
	case 408, 429, 500, 502, 503, 504:
		return true
	}
	return false
}

// Transport is an http.RoundTripper that makes a call in as many attempts as
// are provably safe. It keeps the RoundTripper contract: the request is not
// modified, its body is closed, and any final answer comes back as
// (resp, nil). A call that ends without an answer returns an *outcome.CallError
// carrying the call's outcome. It is safe for concurrent use.
type Transport struct {
	attempts       *attempt.Attempter
	retryable      func(int) bool
	maxAttempts    int
	backoff        retry.Backoff
	maxRetryAfter  time.Duration
	budgetCfg      retry.BudgetConfig
	timeout        time.Duration
	attemptTimeout time.Duration
	idemKeys       bool
	hooks          Hooks

	openOnRetryAfter func(int) bool
	hedging          *Hedging
	deadline         *Deadline
	sendCriticality  *SendCriticality
	finishQ          float64 // Config.FinishQuantile; 0: every attempt is begun
}

// upstreamState is what the Transport keeps per upstream beside the attempt
// layer's guards and connections, in the same place and for as long
// (attempt.Config.UpstreamState): the retry budget, and the latencies that
// adaptive hedging learns from.
type upstreamState struct {
	budget  *retry.Budget
	lat     atomic.Pointer[latency]
	hedges  hedgeAllowance
	order   attemptOrder
	finishQ float64 // Config.FinishQuantile, for lat; 0: none
}

// Learned reports whether s holds what recent outcomes taught and a new
// state would not know: a retry budget below full, or hedges spent beyond
// what rounds earned back. The latencies are not in it: they make hedging
// sooner, not safer, and an upstream whose only news is its latency must
// not refuse another its room (MaxUpstreams).
func (s *upstreamState) Learned() bool { return !s.budget.Full() || s.hedges.spent.Load() > 0 }

// New validates cfg and returns a Transport. Errors name the offending field.
func New(cfg Config) (*Transport, error) {
	if g := cfg.Hooks.Guard; g != nil {
		user := cfg.Admission.OnEvent
		cfg.Admission.OnEvent = func(e admission.Event) {
			if user != nil {
				user(e)
			}
			g(e)
		}
	}
	if err := validate(&cfg); err != nil {
		return nil, err
	}
	if _, err := retry.NewBudget(cfg.Budget); err != nil {
		return nil, cfgerr.In("outbound", "Budget", err)
	}
	hedgeRoom(&cfg)
	if e, hook := cfg.Endpoints, cfg.Hooks.EndpointEjected; e != nil && hook != nil {
		ec := *e
		ec.OnEject = chain3(e.OnEject, hook)
		cfg.Endpoints = &ec
	}
	budget := cfg.Budget
	finishQ := cfg.FinishQuantile
	switch {
	case finishQ == 0:
		finishQ = DefaultFinishQuantile
	case finishQ < 0:
		finishQ = 0
	}
	at, err := attempt.New(attempt.Config{HTTPTransport: cfg.HTTPTransport, Admission: cfg.Admission,
		UpstreamKey: cfg.UpstreamKey, IsFailure: cfg.IsFailure, IdleConnTimeout: cfg.IdleConnTimeout,
		UpstreamIdleTime: cfg.UpstreamIdleTime, MaxUpstreams: cfg.MaxUpstreams, OnForget: cfg.Hooks.UpstreamForgotten, // which recovers its panics
		MaxConnAge: cfg.MaxConnAge, MaxConnRequests: cfg.MaxConnRequests, Endpoints: cfg.Endpoints,
		BreakerRecords: cfg.BreakerRecords, DistrustRefusedStream: cfg.DistrustRefusedStream,
		UpstreamState: func(string) any {
			b, _ := retry.NewBudget(budget) // validated above
			return &upstreamState{budget: b, finishQ: finishQ}
		}})
	if err != nil {
		return nil, cfgerr.In("outbound", "", err)
	}
	t := &Transport{attempts: at, retryable: cfg.RetryableStatus, maxAttempts: cfg.MaxAttempts,
		backoff: cfg.Backoff, maxRetryAfter: cfg.MaxRetryAfter, budgetCfg: cfg.Budget,
		timeout: cfg.Timeout, attemptTimeout: cfg.AttemptTimeout, idemKeys: cfg.IdempotencyKeys, hooks: cfg.Hooks,
		openOnRetryAfter: cfg.OpenOnRetryAfter, finishQ: finishQ}
	t.hedging = cfg.Hedging.clone()
	t.deadline = cfg.Deadline.clone()
	t.sendCriticality = cfg.SendCriticality.clone()
	if t.retryable == nil {
		t.retryable = DefaultRetryableStatus
	}
	if t.maxAttempts == 0 {
		t.maxAttempts = DefaultMaxAttempts
	}
	if t.maxRetryAfter == 0 {
		t.maxRetryAfter = 30 * time.Second
	}
	return t, nil
}

// Breakers returns a snapshot of the breaker of every upstream whose state
// is kept, by upstream key: state and generation, the buffered, failed,
// slow and not-permitted calls, and the failure and slow-call rates (-1
// below the minimum number of calls), as Resilience4j reports them.
func (t *Transport) Breakers() map[string]circuit.Metrics { return t.attempts.Breakers() }

// Breaker returns the circuit breaker of the upstream named key, for an
// operator's override (SetState, OpenFor), and whether the Transport keeps
// one: false for a key that never had a call, or whose state was
// forgotten. Looking does not create it.
func (t *Transport) Breaker(key string) (*circuit.Breaker, bool) {
	p, ok := t.attempts.Pipeline(key)
	if !ok {
		return nil, false
	}
	return p.Breaker(), true
}

// UpstreamState is a snapshot of what a Transport keeps for one upstream.
type UpstreamState struct {
	Breaker circuit.Metrics
	// InFlight is the number of attempts holding a bulkhead slot (0
	// without a bulkhead); RateTokens, how many the rate limiter would give
	// at once now (-1 without a rate limiter).
	InFlight, RateTokens int
	// Limit is the bulkhead's limit: the adaptive limit as it is now
	// (bulkhead.Config.Adaptive), or MaxConcurrent; 0 without a bulkhead.
	Limit int
	// ThrottleProbability is the probability with which the client-side
	// throttle refuses the next attempt (-1 without a throttle).
	ThrottleProbability float64
	// BudgetTokens is what the retry budget holds: retries are allowed
	// while it holds more than half of its BudgetConfig.MaxTokens.
	BudgetTokens float64
}

// Upstream returns a snapshot of the state kept for the upstream named
// key, and whether there is any: false for a key that never had a call, or
// whose state was forgotten. Looking does not create it.
func (t *Transport) Upstream(key string) (UpstreamState, bool) {
	p, ok := t.attempts.Pipeline(key)
	if !ok {
		return UpstreamState{}, false
	}
	s := UpstreamState{Breaker: p.Breaker().Metrics(), InFlight: p.Bulkhead().InUse(), RateTokens: -1,
		Limit: p.Bulkhead().Limit(), ThrottleProbability: -1}
	if th := p.Throttle(); th != nil {
		s.ThrottleProbability = th.Probability()
	}
	if l := p.Limiter(); l != nil {
		s.RateTokens = l.Available()
	}
	if st, ok := t.attempts.State(key); ok {
		s.BudgetTokens = st.(*upstreamState).budget.Tokens()
	}
	return s, true
}

// Upstreams returns the keys of the upstreams whose state is kept.
func (t *Transport) Upstreams() []string { return t.attempts.Upstreams() }

// UpstreamKey returns the key of the upstream req goes to
// (Config.UpstreamKey, or scheme://host:port).
func (t *Transport) UpstreamKey(req *http.Request) string { return t.attempts.UpstreamKey(req) }

// CloseIdleConnections closes the connections that carry no request.
func (t *Transport) CloseIdleConnections() { t.attempts.CloseIdleConnections() }

// Close closes every connection, interrupting calls in flight.
func (t *Transport) Close() { t.attempts.Close() }

// RoundTrip makes the call. See Transport.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, _, err := t.Do(req)
	return resp, err
}

// Do makes the call and returns its outcome with the response or the error.
// The outcome is complete when Do returns.
func (t *Transport) Do(req *http.Request) (*http.Response, *outcome.Outcome, error) {
	c := newCall(t, req)
	resp, err := c.run()
	if f := t.hooks.CallDone; f != nil {
		safe2(f, c.ctx, c.out)
	}
	return resp, c.out, err
}

// OutcomeOf returns the outcome of the call that produced err, if err came
// from this package.
func OutcomeOf(err error) (*outcome.Outcome, bool) {
	var oe *outcome.CallError
	if errors.As(err, &oe) {
		return oe.Outcome, true
	}
	return nil, false
}

// validate checks the fields of cfg that the Transport itself uses, and
// the contradictions between them.
// hedgeRoom raises the floor of an adaptive bulkhead to one call and its
// hedges (1 + Hedging.MaxHedges, within MaxConcurrent) when the Transport
// hedges: with few callers the limit settles near the attempts in flight,
// and a slow tail reads as queueing, so that a floor of 1 refused the very
// hedges meant to cut that tail. InitialConcurrent moves up with it when it
// was valid below the new floor; values that were invalid stay so, for the
// error that names them.
func hedgeRoom(cfg *Config) {
	b := &cfg.Admission.Bulkhead
	if cfg.Hedging == nil || !b.Adaptive {
		return
	}
	floor := min(1+cfg.Hedging.maxHedges(), b.MaxConcurrent)
	if b.MinConcurrent >= floor || b.MinConcurrent > b.MaxConcurrent {
		return
	}
	if b.InitialConcurrent != 0 && b.InitialConcurrent >= b.MinConcurrent && b.InitialConcurrent < floor {
		b.InitialConcurrent = floor
	}
	b.MinConcurrent = floor
}

func validate(cfg *Config) error {
	if err := cfg.Hedging.validate(); err != nil {
		return err
	}
	if err := cfg.Deadline.validate(); err != nil {
		return err
	}
	if err := cfg.SendCriticality.validate(); err != nil {
		return err
	}
	switch {
	case cfg.MaxAttempts < 0 || cfg.MaxAttempts > 100:
		return cfgerr.New("outbound", "MaxAttempts", "must be in [0, 100], got %d", cfg.MaxAttempts)
	case cfg.FinishQuantile >= 1:
		return cfgerr.New("outbound", "FinishQuantile", "must be below 1 (negative: off), got %v", cfg.FinishQuantile)
	case cfg.MaxRetryAfter < 0:
		return cfgerr.New("outbound", "MaxRetryAfter", "must be >= 0, got %v", cfg.MaxRetryAfter)
	case cfg.Timeout < 0:
		return cfgerr.New("outbound", "Timeout", "must be >= 0, got %v", cfg.Timeout)
	case cfg.AttemptTimeout < 0:
		return cfgerr.New("outbound", "AttemptTimeout", "must be >= 0, got %v", cfg.AttemptTimeout)
	case cfg.Timeout > 0 && cfg.AttemptTimeout > cfg.Timeout:
		return cfgerr.New("outbound", "AttemptTimeout", "must not be longer than Timeout (%v): no attempt could last it, got %v",
			cfg.Timeout, cfg.AttemptTimeout)
	}
	return cfgerr.In("outbound", "Backoff", cfg.Backoff.Validate())
}
