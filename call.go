package outbound

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/internal/clock"
	"github.com/outboundhq/outbound/internal/mutate"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// call is one call in progress.
type call struct {
	t      *Transport
	req    *http.Request
	ctx    context.Context
	cancel context.CancelFunc // of the call's own timeout, if any
	out    *outcome.Outcome
	header http.Header
	info   CallInfo
	route  *attempt.Route
	err    error // set when the call cannot be made at all (an invalid URL)

	budget       *retry.Budget
	maxAttempts  int
	ownCtx       bool // ctx is req.Context(): no hook or timeout replaced it
	headerCloned bool // header is a copy of req.Header (an Idempotency-Key added)
	idempotent   bool
	hasKey       bool
	replayable   bool           // no body, NoBody, or GetBody
	body         *trackedBody   // the body of the attempt in progress, if any
	held         *http.Response // the last answer, kept while its retry is not certain

	hedging    *Hedging // nil: no hedging
	hedgedCtx  bool     // the last attempt's context is its own (a hedged round's): it ends with the body
	hedgeable  bool     // the call may be hedged (see Hedging)
	hedgesSent int
	allowance  *hedgeAllowance // the upstream's hedges, when hedging
	order      *attemptOrder   // the order of the upstream's attempts, when hedging
	lat        *latency        // the upstream's latencies, for adaptive hedging

	deadline  *Deadline // how its attempts send their deadline (Config.Deadline), if its host gets it
	sheddable bool      // its context says criticality.Sheddable

	elsewhere attempt.Elsewhere // the endpoints its attempts went to (Config.Endpoints)
	endpoint  string            // the endpoint of its attempt in progress, outside hedged rounds (no allocation per attempt)
}

func newCall(t *Transport, req *http.Request) *call {
	c := &call{t: t, req: req, ctx: req.Context(), header: req.Header, ownCtx: true, maxAttempts: t.maxAttempts}
	var key string
	if c.route, c.err = t.attempts.Route(req); c.err == nil {
		key = c.route.Key()
	} else if req.URL != nil {
		key = req.URL.Scheme + "://" + req.URL.Host
	}
	c.info = CallInfo{Upstream: key, Method: req.Method}
	if u := req.URL; u != nil {
		c.info.Scheme, c.info.Host = u.Scheme, u.Hostname()
		c.info.Port, _ = strconv.Atoi(u.Port())
		if c.info.Port == 0 {
			switch u.Scheme {
			case "http":
				c.info.Port = 80
			case "https":
				c.info.Port = 443
			}
		}
	}
	opts := optionsOf(c.ctx)
	if opts.maxAttempts > 0 {
		c.maxAttempts = opts.maxAttempts
	}
	if f := t.hooks.CallStart; f != nil {
		c.ctx = safeCtx(f, c.ctx, c.info)
		c.ownCtx = false
	}
	if _, has := c.ctx.Deadline(); !has && t.timeout > 0 {
		c.ctx, c.cancel = context.WithTimeout(c.ctx, t.timeout)
		c.ownCtx = false
	}
	oa := &outcomeAndAttempt{Outcome: outcome.Outcome{Upstream: key, Method: req.Method}}
	oa.Attempts = oa.first[:0]
	c.out = &oa.Outcome
	var us *upstreamState // nil for a call refused before its upstream exists: it keeps nothing for it
	if c.err == nil {
		us = c.route.State().(*upstreamState)
		c.budget = us.budget
	}
	c.idempotent = retry.Idempotent(req.Method)
	c.out.IdempotencyKey = req.Header.Get("Idempotency-Key")
	c.hasKey = c.out.IdempotencyKey != ""
	c.replayable = req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	if t.idemKeys && !c.idempotent && !c.hasKey && c.replayable {
		c.header = req.Header.Clone()
		c.headerCloned = true
		if c.header == nil {
			c.header = http.Header{}
		}
		c.out.IdempotencyKey = newIdempotencyKey()
		c.header.Set("Idempotency-Key", c.out.IdempotencyKey)
		c.hasKey = true
	}
	c.deadline = t.deadline.forHost(c.info.Host)
	level := criticality.Of(c.ctx)
	c.sheddable = level == criticality.Sheddable
	if sc := t.sendCriticality; sc != nil && named(sc.Hosts, c.info.Host) {
		if !c.headerCloned {
			c.header, c.headerCloned = req.Header.Clone(), true
			if c.header == nil {
				c.header = http.Header{}
			}
		}
		c.header.Set(sc.Header, level.String())
	}
	c.hedging = t.hedging
	if opts.setHedging {
		c.hedging = opts.hedging
		if c.hedging.validate() != nil {
			c.hedging = nil // out of range: WithHedging cannot return an error
		}
	}
	if _, ok := c.ctx.Deadline(); ok && t.finishQ > 0 && c.route != nil {
		c.lat = us.latencies() // the time an attempt needs (Config.FinishQuantile)
	}
	if h := c.hedging; h != nil && c.route != nil {
		c.hedgeable = c.replayable && (c.idempotent || h.Keyed && c.hasKey)
		c.allowance = &us.hedges
		c.order = &us.order
		if h.Delay == 0 && c.hedgeable {
			c.lat = us.latencies()
		}
	}
	return c
}

// outcomeAndAttempt allocates a call's outcome together with room for its
// first attempt: most calls make one.
type outcomeAndAttempt struct {
	outcome.Outcome
	first [1]outcome.Attempt
}

// run makes the attempts. n counts the attempts that MaxAttempts bounds;
// transparent retries (retry.Transparent) are physical attempts that do not
// count, and the attempt after one may not be transparent itself.
func (c *call) run() (*http.Response, error) {
	if c.err != nil {
		return nil, c.fail(c.err)
	}
	h := &c.t.hooks
	var notBefore time.Time // after a lifecycle failure: no connection as old as the one that failed
	transparent := false    // the attempt about to be made is a transparent retry
	if c.cannotFinish() {
		return c.end(nil, outcome.CannotFinish, outcome.ErrCannotFinish, noop)
	}
	for n, physical := 1, 1; ; physical++ {
		body, err := c.attemptBody()
		if err != nil {
			return c.end(nil, outcome.BodyUnavailable, err, noop)
		}
		ai := AttemptInfo{CallInfo: c.info, Attempt: physical}
		// asIs: the attempt changes nothing in the caller's request, which
		// is then sent itself, not a copy. It is tracked where the context,
		// header and body are chosen: contexts and bodies cannot always be
		// compared.
		actx, asIs := c.ctx, c.ownCtx && !c.headerCloned && body == nil
		if h.AttemptStart != nil {
			actx, asIs = safeCtx(h.AttemptStart, actx, ai), false
		}
		acancel := context.CancelFunc(noop)
		if c.t.attemptTimeout > 0 {
			actx, acancel = context.WithTimeoutCause(actx, c.t.attemptTimeout, classify.ErrAttemptTimeout)
			asIs = false
		}
		header, own := c.attemptHeader(actx)
		asIs = asIs && own
		var resp *http.Response
		var a outcome.Attempt
		if delay, ok := c.hedgeDelay(n); ok {
			l, sent := c.hedged(&flight{ai: ai, actx: actx, cancel: acancel}, body, notBefore, delay, physical, c.maxAttempts-n)
			c.hedgesSent += sent
			n += sent // hedges are attempts: MaxAttempts bounds them too
			physical += sent
			c.hedgedCtx = true
			resp, err, a, actx, acancel, ai = l.resp, l.err, l.a, l.f.actx, l.f.cancel, l.f.ai
		} else {
			start := clock.Now()
			c.endpoint = ""
			resp, err = c.t.attempts.AttemptOn(actx, c.route, c.req,
				attempt.Options{AsIs: asIs, Header: header, Body: body, NotBefore: notBefore, OneShot: !c.replayable,
					Unretryable: !c.replayable || !c.idempotent && !c.hasKey, Elsewhere: &c.elsewhere, Endpoint: &c.endpoint})
			a = record(resp, err, time.Duration(clock.Now()-start))
			a.Endpoint = c.endpoint
			c.observe(a)
		}
		opened := resp != nil && c.t.openOnRetryAfter != nil && c.openOnRetryAfter(resp)
		if a.Category == classify.Ambiguous {
			c.dropHeld() // this attempt may have reached the upstream: the earlier answer is no longer the call's
		}
		final := c.final(resp, err)

		d, ended := c.verdict(n, a, resp, final, transparent)
		if d.Retry && opened {
			// Every call to the upstream is refused until then: waiting
			// to retry would hold the caller for the whole pause, for an
			// attempt the breaker lets through only as a trial, if at all.
			d, ended = retry.Decision{}, outcome.CircuitOpened
		}
		if d.Retry && resp != nil && !c.hold(resp) {
			d, ended = retry.Decision{}, outcome.AnswerTooLarge
		}
		a.Decision, a.Wait = d.Reason, d.Wait
		c.out.Attempts = append(c.out.Attempts, a)
		if h.AttemptDone != nil {
			safe3(h.AttemptDone, actx, ai, a)
		}
		if !final && d.Reason != 0 && h.RetryDecided != nil {
			safe3(h.RetryDecided, actx, ai, d)
		}
		if d.Reason == retry.BudgetExhausted && h.BudgetExhausted != nil {
			safe2(h.BudgetExhausted, actx, c.info.Upstream)
		}

		if !d.Retry {
			c.out.Reason = d.Reason
			return c.end(resp, ended, err, acancel)
		}
		acancel()
		transparent = d.Reason == retry.Transparent
		if !transparent {
			n++
		}
		notBefore = time.Time{}
		if a.Lifecycle {
			// The connection's life ended the attempt (a GOAWAY, a
			// shutdown, the keep-alive race): the next one goes to a
			// connection newer than that one.
			notBefore = time.Now().Add(-a.Duration)
		}
		if !c.sleep(d.Wait) {
			return c.end(nil, outcome.ContextDone, c.ctx.Err(), noop)
		}
	}
}

// end ends the call as e says: with resp, the answer of the last attempt;
// else with the answer held from an earlier one, if any (its retry did not
// happen); else with err. acancel ends the last attempt's context.
func (c *call) end(resp *http.Response, e outcome.End, err error, acancel context.CancelFunc) (*http.Response, error) {
	c.out.End = e
	if resp == nil && c.held != nil {
		// The last attempt never reached the upstream (an ambiguous one
		// drops the held answer): the earlier answer stands, and its body
		// is in memory.
		resp, c.held = c.held, nil
		acancel()
		if c.cancel != nil {
			c.cancel()
		}
		c.body.closeNow()
		c.out.Commit = outcome.Committed
		return resp, nil
	}
	if resp == nil {
		acancel()
		return nil, c.fail(err)
	}
	c.dropHeld()
	c.body.callEnded()
	c.out.Commit = outcome.Committed
	if c.t.attemptTimeout > 0 || c.cancel != nil || c.hedgedCtx { // contexts to end with the body
		resp.Body = &finalBody{ReadCloser: resp.Body, cancels: [2]context.CancelFunc{acancel, c.cancel}}
	} else {
		acancel() // noop: there is no timeout, and no wrapper is needed
	}
	return resp, nil
}

// openOnRetryAfter opens the upstream's breaker for the Retry-After of an
// answer whose status Config.OpenOnRetryAfter accepts, at most
// MaxRetryAfter: the upstream said how long it is down. It reports whether
// the breaker is OPEN for that long (not in a state an operator set).
func (c *call) openOnRetryAfter(resp *http.Response) bool {
	v := resp.Header.Get("Retry-After")
	if v == "" || !c.t.openOnRetryAfter(resp.StatusCode) {
		return false
	}
	d, capped, ok := retry.ParseRetryAfter(v, time.Now(), c.t.maxRetryAfter)
	if !ok {
		return false
	}
	if capped {
		d = c.t.maxRetryAfter
	}
	return c.route.Pipeline().Breaker().OpenFor(min(d, c.t.maxRetryAfter))
}

// contextEnd names why a call's context ended during an attempt.
func contextEnd(ctx context.Context) outcome.End {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return outcome.DeadlineExceeded
	}
	return outcome.Cancelled
}

// attemptBody returns the body of the next attempt (nil for none). The
// caller's request itself is never modified: the attempt layer sends a copy
// with it.
func (c *call) attemptBody() (io.ReadCloser, error) {
	switch {
	case c.req.Body == nil || c.req.Body == http.NoBody:
		return c.req.Body, nil
	case c.body == nil:
		c.body = &trackedBody{rc: c.req.Body}
		return c.body, nil
	case !c.body.touched() || c.req.GetBody == nil:
		// The previous attempt never sent its body: send the same one.
		// (A one-shot body that was sent only gets here through
		// mutate.ResendOneShotBodies, which the soak test uses to prove
		// that it catches a re-sent one-shot body.)
		return c.body, nil
	}
	// Decide allowed a retry, so the body is replayable.
	c.body.closeNow()
	rc, err := c.req.GetBody()
	if err != nil {
		c.body = nil
		return nil, err
	}
	c.body = &trackedBody{rc: rc}
	return c.body, nil
}

func noop() {}

// record describes an attempt from its result.
func record(resp *http.Response, err error, d time.Duration) outcome.Attempt {
	a := outcome.Attempt{Duration: d, Err: err}
	if err == nil {
		a.Stage, a.Category, a.Evidence, a.Status = classify.StageAwait, classify.Answered, classify.EvidenceStatus, resp.StatusCode
		return a
	}
	var ce *classify.Error
	if errors.As(err, &ce) {
		a.Stage, a.Category, a.Evidence, a.Lifecycle = ce.Stage, ce.Category, ce.Evidence, ce.Lifecycle
	}
	var re *admission.RejectedError
	if errors.As(err, &re) {
		a.Guard = re.Guard
	}
	return a
}

// final reports whether an attempt's result ends the call: an answer whose
// status is not one to retry.
func (c *call) final(resp *http.Response, err error) bool {
	return err == nil && !c.t.retryable(resp.StatusCode)
}

// verdict says what follows attempt n, and feeds the retry budget: a final
// answer is a success; a failure or a retryable answer costs a token, which
// is charged before the budget is asked, so that concurrent calls cannot all
// see the last token. Local rejections, attempts the caller cancelled,
// transparent retries (the connection's life, not the upstream's health),
// attempts a connection being taken down ended (retry.Drained), refused TLS
// handshakes (which are not retried) and the client's own faults
// cost nothing.
func (c *call) verdict(n int, a outcome.Attempt, resp *http.Response, final, transparent bool) (retry.Decision, outcome.End) {
	switch {
	case final:
		c.budget.OnSuccess()
		return retry.Decision{Reason: retry.FinalAnswer}, outcome.Decided
	case c.ctx.Err() != nil: // no decision: the call ends
		if c.req.Context().Err() == nil { // the call's own timeout: the upstream was too slow
			c.budget.OnFailure()
		}
		return retry.Decision{}, contextEnd(c.ctx)
	}
	in := c.input(n, a, resp)
	in.TransparentUsed = transparent
	d := retry.Decide(in) // with BudgetAllows false: the budget is the last rule
	switch {
	case d.Reason == retry.Transparent, a.Category == classify.LocalRejection, a.Evidence == classify.EvidenceTLSRefused,
		classify.ClientFault(a.Evidence), retry.Drained(a.Evidence, a.Lifecycle):
		return d, outcome.Decided
	}
	if a.Endpoint == "" || !c.route.Ejected(a.Endpoint) {
		// A failure of an endpoint that is ejected by now is its own, not
		// the upstream's: the endpoint gets no more attempts, and the
		// retry goes to another.
		c.budget.OnFailure()
	}
	if d.Reason == retry.BudgetExhausted { // every other rule allows a retry
		in.BudgetAllows = c.budget.Allows() && (!c.sheddable || c.budget.Above(sheddableBudget))
		d = retry.Decide(in)
	}
	return d, outcome.Decided
}

// sheddableBudget is the share of its retry budget an upstream must hold
// for a sheddable call (package criticality) to be retried or hedged: above
// that of every other call (half), so that when failures drain the budget
// the sheddable calls stop retrying first.
const sheddableBudget = 0.75

func (c *call) input(n int, a outcome.Attempt, resp *http.Response) retry.Input {
	in := retry.Input{
		Method:         c.req.Method,
		IdempotencyKey: c.hasKey,
		BodyReplayable: c.replayable || !c.body.touched() || mutate.ResendOneShotBodies.Load(),
		Category:       a.Category,
		Evidence:       a.Evidence,
		Status:         a.Status,
		Attempts:       n,
		MaxAttempts:    c.maxAttempts,
		Backoff:        c.t.backoff.Delay(n),
		Lifecycle:      a.Lifecycle,
	}
	if a.Category == 0 { // not classified: the attempt layer could not make it
		in.Category = classify.LocalRejection
	}
	if resp != nil {
		in.RetryableStatus = c.t.retryable(resp.StatusCode)
		if v := resp.Header.Get("Retry-After"); v != "" {
			in.RetryAfter, in.RetryAfterCapped, in.HasRetryAfter = retry.ParseRetryAfter(v, time.Now(), c.t.maxRetryAfter)
		}
	}
	if dl, ok := c.ctx.Deadline(); ok {
		in.HasDeadline, in.Remaining, in.Expected = true, time.Until(dl), c.needs()
	}
	return in
}

// cannotFinish reports whether an attempt begun now would most likely not
// end before the call's deadline (Config.FinishQuantile).
func (c *call) cannotFinish() bool {
	n := c.needs()
	if n <= 0 {
		return false
	}
	dl, ok := c.ctx.Deadline()
	return ok && time.Until(dl) < n
}

// needs returns how long an attempt of the call is expected to take
// (Config.FinishQuantile of its upstream's recent answers), 0 if not known.
func (c *call) needs() time.Duration {
	if c.t.finishQ <= 0 {
		return 0
	}
	return c.lat.needs()
}

// sleep waits d or until the call's context ends, and reports whether it
// waited the whole d.
func (c *call) sleep(d time.Duration) bool {
	if d <= 0 {
		return c.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// fail ends a call without an answer: the body is closed (the RoundTripper
// contract), the call's timeout released, and the outcome returned as the
// error.
func (c *call) fail(err error) error {
	if c.body != nil {
		c.body.closeNow()
	} else if c.req.Body != nil {
		c.req.Body.Close()
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.out.Commit = outcome.CommitOf(c.out.Attempts)
	if c.out.End == 0 { // the request could not be made at all: refused locally
		c.out.End, c.out.Reason = outcome.Decided, retry.RefusedLocally
	}
	return &outcome.CallError{Outcome: c.out, Err: err}
}
