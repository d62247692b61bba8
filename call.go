package outbound

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/clock"
	"github.com/outboundhq/outbound/internal/mutate"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// holdLimit bounds the body of an answer that is to be retried: it is read
// into memory (which also frees its connection for reuse) and kept until the
// retry is certain, so that a retry that cannot happen after all — the
// context ends during the wait, GetBody fails, the next attempt never
// reaches the upstream — still gives the caller that answer. An answer with
// a longer body is returned instead of retried.
const holdLimit = 16 << 10

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
	lat        *latency // the upstream's latencies, for adaptive hedging
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
	c.hedging = t.hedging
	if opts.setHedging {
		c.hedging = opts.hedging
		if c.hedging.validate() != nil {
			c.hedging = nil // out of range: WithHedging cannot return an error
		}
	}
	if h := c.hedging; h != nil && c.route != nil {
		c.hedgeable = c.replayable && (c.idempotent || h.Keyed && c.hasKey)
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
	for n, physical := 1, 1; ; physical++ {
		body, err := c.attemptBody()
		if err != nil {
			return c.end(nil, retry.BodyUnavailable, err, noop)
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
			actx, acancel = context.WithTimeoutCause(actx, c.t.attemptTimeout, attempt.ErrAttemptTimeout)
			asIs = false
		}
		var resp *http.Response
		var a outcome.Attempt
		if delay, ok := c.hedgeDelay(n); ok {
			hedgesBefore := c.hedgesSent
			l := c.hedged(&flight{ai: ai, actx: actx, cancel: acancel}, body, notBefore, delay, physical, c.maxAttempts-n)
			sent := c.hedgesSent - hedgesBefore
			n += sent // hedges are attempts: MaxAttempts bounds them too
			physical += sent
			c.hedgedCtx = true
			resp, err, a, actx, acancel, ai = l.resp, l.err, l.a, l.f.actx, l.f.cancel, l.f.ai
		} else {
			start := clock.Now()
			resp, err = c.t.attempts.AttemptOn(actx, c.route, c.req,
				attempt.Options{AsIs: asIs, Header: c.header, Body: body, NotBefore: notBefore, OneShot: !c.replayable,
					Unretryable: !c.replayable || !c.idempotent && !c.hasKey})
			a = record(resp, err, time.Duration(clock.Now()-start))
			c.observe(a)
		}
		opened := resp != nil && c.t.openOnRetryAfter != nil && c.openOnRetryAfter(resp)
		if a.Category == classify.Ambiguous {
			c.dropHeld() // this attempt may have reached the upstream: the earlier answer is no longer the call's
		}
		final := err == nil && !c.t.retryable(resp.StatusCode)

		d := c.decide(n, a, resp, final, transparent)
		if d.Retry && opened {
			// Every call to the upstream is refused until then: waiting
			// to retry would hold the caller for the whole pause, for an
			// attempt the breaker lets through only as a trial, if at all.
			d = retry.Decision{Reason: retry.CircuitOpened}
		}
		if d.Retry && resp != nil && !c.hold(resp) {
			d = retry.Decision{Reason: retry.AnswerTooLarge}
		}
		a.Decision, a.Wait = d.Reason, d.Wait
		c.out.Attempts = append(c.out.Attempts, a)
		if h.AttemptDone != nil {
			safe3(h.AttemptDone, actx, ai, a)
		}
		if !final && h.RetryDecided != nil {
			safe3(h.RetryDecided, actx, ai, d)
		}
		if d.Reason == retry.BudgetExhausted && h.BudgetExhausted != nil {
			safe2(h.BudgetExhausted, actx, c.info.Upstream)
		}

		if !d.Retry {
			return c.end(resp, d.Reason, err, acancel)
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
			return c.end(nil, retry.ContextDone, c.ctx.Err(), noop)
		}
	}
}

// end ends the call for reason: with resp, the answer of the last attempt;
// else with the answer held from an earlier one, if any (its retry did not
// happen); else with err. acancel ends the last attempt's context.
func (c *call) end(resp *http.Response, reason retry.Reason, err error, acancel context.CancelFunc) (*http.Response, error) {
	c.out.Reason = reason
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

// hold keeps resp, an answer about to be retried, until the retry is
// certain: its body is read into memory (up to holdLimit) and closed, which
// resolves its attempt and frees its connection. It reports false, and
// gives resp its whole body back, when the body is longer than holdLimit.
func (c *call) hold(resp *http.Response) bool {
	data, err := io.ReadAll(io.LimitReader(resp.Body, holdLimit+1))
	if len(data) > holdLimit {
		resp.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(data), resp.Body), Closer: resp.Body}
		return false
	}
	resp.Body.Close()
	c.dropHeld()
	resp.Body = &heldBody{r: bytes.NewReader(data), err: err}
	c.held = resp
	return true
}

func (c *call) dropHeld() {
	if c.held != nil {
		c.held.Body.Close()
		c.held = nil
	}
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

// contextReason names why a call's context ended during an attempt.
func contextReason(ctx context.Context) retry.Reason {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return retry.DeadlineExceeded
	}
	return retry.Cancelled
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

// decide says what follows attempt n, and feeds the retry budget: a final
// answer is a success; a failure or a retryable answer costs a token, which
// is charged before the budget is asked, so that concurrent calls cannot all
// see the last token. Local rejections, attempts the caller cancelled,
// transparent retries (the connection's life, not the upstream's health),
// attempts a connection being taken down ended (retry.Drained), refused TLS
// handshakes (which are not retried) and the client's own faults
// cost nothing.
func (c *call) decide(n int, a outcome.Attempt, resp *http.Response, final, transparent bool) retry.Decision {
	switch {
	case final:
		c.budget.OnSuccess()
		return retry.Decision{Reason: retry.FinalAnswer}
	case c.ctx.Err() != nil:
		if c.req.Context().Err() == nil { // the call's own timeout: the upstream was too slow
			c.budget.OnFailure()
		}
		return retry.Decision{Reason: contextReason(c.ctx)}
	}
	in := c.input(n, a, resp)
	in.TransparentUsed = transparent
	d := retry.Decide(in) // with BudgetAllows false: the budget is the last rule
	switch {
	case d.Reason == retry.Transparent, a.Category == classify.LocalRejection, a.Evidence == classify.EvidenceTLSRefused,
		classify.ClientFault(a.Evidence), retry.Drained(a.Evidence, a.Lifecycle):
		return d
	}
	c.budget.OnFailure()
	if d.Reason == retry.BudgetExhausted { // every other rule allows a retry
		in.BudgetAllows = c.budget.Allows()
		d = retry.Decide(in)
	}
	return d
}

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
		in.HasDeadline, in.Remaining = true, time.Until(dl)
	}
	return in
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
	if c.out.Reason == 0 {
		c.out.Reason = retry.LocalRejection // the request could not be made at all
	}
	return &outcome.Error{Outcome: c.out, Err: err}
}

// trackedBody is a request body that knows whether it was read, and keeps
// the caller's body open for another attempt while that is possible.
type trackedBody struct {
	rc    io.ReadCloser
	read  atomic.Bool
	state atomic.Int32 // bodyOpen, bodyCloseDeferred or bodyCallEnded
	once  sync.Once
}

const (
	bodyOpen          = iota
	bodyCloseDeferred // a transport closed it unread while the call went on
	bodyCallEnded     // the call has ended: a Close closes
)

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.rc.Read(p)
}

// Close closes the caller's body, unless it was never read and the call is
// still going on: a transport that gives up before sending it (an HTTP/2
// connection that was shutting down, an HTTP/1 connection lost before a
// byte was written) closes it unread, and the call may still send it on its
// next attempt. The close then happens when the call ends.
func (b *trackedBody) Close() error {
	if !b.read.Load() && b.state.CompareAndSwap(bodyOpen, bodyCloseDeferred) {
		return nil
	}
	return b.closeNow()
}

// callEnded is called when the call returns an answer: a close deferred
// until then happens now, and later ones at once.
func (b *trackedBody) callEnded() {
	if b != nil && b.state.Swap(bodyCallEnded) == bodyCloseDeferred {
		b.closeNow()
	}
}

// closeNow closes the caller's body (once).
func (b *trackedBody) closeNow() error {
	if b == nil {
		return nil
	}
	b.state.Store(bodyCallEnded)
	var err error
	b.once.Do(func() { err = b.rc.Close() })
	return err
}

// touched reports whether b was read (a nil body was not).
func (b *trackedBody) touched() bool { return b != nil && b.read.Load() }

// heldBody is the body of a held answer: what was read of it, then how its
// reading ended.
type heldBody struct {
	r   *bytes.Reader
	err error // nil: the body ended normally
}

func (b *heldBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF && b.err != nil {
		err = b.err
	}
	return n, err
}

func (b *heldBody) Close() error { return nil }

// prefixedBody is a body of which a prefix was read ahead: the prefix, then
// the rest.
type prefixedBody struct {
	io.Reader
	io.Closer
}

// finalBody is the body of the call's final answer: closing it, or reading
// it to the end, ends the attempt's and the call's timeouts.
type finalBody struct {
	io.ReadCloser
	once    sync.Once
	cancels [2]context.CancelFunc
}

func (b *finalBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.release()
	}
	return n, err
}

func (b *finalBody) Close() error {
	err := b.ReadCloser.Close()
	b.release()
	return err
}

func (b *finalBody) release() {
	b.once.Do(func() {
		for _, cancel := range b.cancels {
			if cancel != nil {
				cancel()
			}
		}
	})
}

// hedgeDelay returns how long attempt n runs before a hedge is sent beside
// it, and false for no hedge.
func (c *call) hedgeDelay(n int) (time.Duration, bool) {
	if !c.hedgeable || c.hedgesLeft() == 0 || n >= c.maxAttempts {
		return 0, false
	}
	if d := c.hedging.Delay; d > 0 {
		return d, true
	}
	return c.lat.quantile(c.hedging.quantile())
}

// hedgesLeft returns how many more hedges the call may send.
func (c *call) hedgesLeft() int { return c.hedging.maxHedges() - c.hedgesSent }

// observe records the latency of an answered attempt, the first of its
// round, for adaptive hedging: the estimate is of how long first attempts
// take, since a hedge is sent when one takes longer than the delay.
func (c *call) observe(a outcome.Attempt) {
	if c.lat != nil && a.Category == classify.Answered {
		c.lat.record(a.Duration)
	}
}

// flight is one attempt of a hedged round.
type flight struct {
	ai     AttemptInfo
	actx   context.Context
	cancel context.CancelFunc // ends the attempt: its timeout, and a loser's cancellation
	body   io.ReadCloser      // a hedge's own body (GetBody's), closed when it lands
	hedge  bool
	start  int64
	landed bool // guarded by round.mu
	lost   bool // cancelled because another answered first; guarded by round.mu
}

// landing is how a flight ended.
type landing struct {
	f    *flight
	resp *http.Response
	err  error
	a    outcome.Attempt
	at   int64 // when (clock.Now)
}

// round is a hedged round in progress: the first attempt runs on the
// caller's goroutine, hedges on their own, launched by a timer.
type round struct {
	c         *call
	first     *flight
	notBefore time.Time
	delay     time.Duration
	physical  int          // the number of the round's latest attempt
	ch        chan landing // the hedges' landings

	mu      sync.Mutex
	timer   *time.Timer
	fireAt  int64 // when the armed timer should fire (clock.Now)
	left    int   // hedges this round may still send (Hedging.MaxHedges, MaxAttempts)
	hedges  []*flight
	decided *flight // the attempt whose final answer decided the round
	closed  bool    // no more hedges
}

// final reports whether l's answer ends the call.
func (c *call) final(l landing) bool { return l.err == nil && !c.t.retryable(l.resp.StatusCode) }

// hedged makes one round of attempts: first, and a hedge beside it each
// time delay passes without an answer, while the round may send hedges
// (at most left) and the budget allows them. The first attempt whose answer
// is final decides the round, and the others are cancelled; if none is,
// the round ends when every attempt has ended, with the most telling result
// for the retry rules to judge (see endRound). Every attempt is in the
// outcome: those that did not decide the round come before the one that
// did. A round in which the first attempt answers before the delay costs a
// timer more than an attempt without hedging.
func (c *call) hedged(first *flight, body io.ReadCloser, notBefore time.Time, delay time.Duration, physical, left int) landing {
	left = min(left, c.hedgesLeft())
	r := &round{c: c, first: first, notBefore: notBefore, delay: delay, physical: physical, left: left,
		ch: make(chan landing, left)}
	first.takeOff()
	r.mu.Lock()
	r.arm(delay)
	r.mu.Unlock()
	l0 := r.fly(first, body)
	r.mu.Lock()
	first.landed = true
	if !first.lost { // a lost one was recorded when it was cancelled
		c.observe(l0.a)
	}
	if c.lat != nil {
		c.lat.round(c.hedging.extraLoad(), len(r.hedges) > 0)
	}
	if len(r.hedges) == 0 { // answered (or failed) before the delay: no hedge
		r.closed = true
		r.timer.Stop()
		r.mu.Unlock()
		return l0
	}
	if c.final(l0) && r.decided == nil {
		r.decide(first)
	}
	r.mu.Unlock()
	ls := []landing{l0}
	for received := 0; ; received++ {
		r.mu.Lock()
		if received == len(r.hedges) { // every attempt has landed
			r.closed = true
			r.timer.Stop()
			r.mu.Unlock()
			break
		}
		r.mu.Unlock()
		ls = append(ls, <-r.ch)
	}
	return c.endRound(r, ls)
}

// telling ranks what a result of a round tells the retry rules, most first:
// an answer, then a failure that may have reached the upstream, then one
// proven not processed, then one that never left (a local guard's refusal).
// A hedge the bulkhead refused must not stand in for a first attempt that
// timed out on the wire.
func telling(l *landing) int {
	switch {
	case l.err == nil:
		return 4
	case l.a.Category == classify.Ambiguous:
		return 3
	case l.a.Category == classify.LocalRejection:
		return 1
	}
	return 2
}

// endRound picks the landing that decides the round — the one whose final
// answer did, or else the most telling result, the later of equals — and
// settles the others.
func (c *call) endRound(r *round, ls []landing) landing {
	var chosen *landing
	var others []landing
	for i := range ls {
		l := &ls[i]
		l.a.Hedge, l.a.Lost = l.f.hedge, l.f.lost
		switch {
		case r.decided != nil:
			if l.f == r.decided {
				chosen = l
				continue
			}
			others = append(others, *l)
		case chosen == nil:
			chosen = l
		case telling(l) > telling(chosen) || telling(l) == telling(chosen) && l.at > chosen.at:
			others = append(others, *chosen)
			chosen = l
		default:
			others = append(others, *l)
		}
	}
	c.settle(others)
	return *chosen
}

// decide makes f the attempt that decided the round, and cancels the others
// in flight: their permits come back, and the breaker records them as
// neither success nor failure (the caller cancelled them). r.mu is held.
func (r *round) decide(f *flight) {
	r.decided = f
	r.closed = true
	r.timer.Stop()
	for _, o := range append([]*flight{r.first}, r.hedges...) {
		if o == f || o.landed {
			continue
		}
		o.lost = true
		o.cancel()
		if o == r.first && r.c.lat != nil { // its answer would have come later than this
			r.c.lat.record(time.Duration(clock.Now() - o.start))
		}
	}
}

// arm arms the timer of the next hedge, due d from now: early by the
// timers' usual lateness (adaptive hedging); r.mu is held.
func (r *round) arm(d time.Duration) {
	a := d
	if l := r.c.lat; l != nil {
		a = max(d-l.early(), d/2)
	}
	r.fireAt = clock.Now() + int64(a)
	if r.timer == nil {
		r.timer = time.AfterFunc(a, r.tick)
	} else {
		r.timer.Reset(a)
	}
}

// tick sends a hedge, if one may be sent, and arms the next. The hedge's
// hooks and body are made outside the round's lock; the round's counts
// change only once it is sent.
func (r *round) tick() {
	c := r.c
	r.mu.Lock()
	if l := c.lat; l != nil && len(r.hedges) == 0 {
		l.timerLate(time.Duration(clock.Now()-r.fireAt), r.delay)
	}
	if r.closed || r.left == 0 || c.ctx.Err() != nil || !c.budget.TryTake() {
		r.mu.Unlock()
		return
	}
	ai := AttemptInfo{CallInfo: c.info, Attempt: r.physical + 1}
	r.mu.Unlock()
	f, body, ok := c.newHedge(ai)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !ok || r.closed { // no body for it, or the round ended meanwhile
		c.budget.GiveBack()
		if ok {
			f.cancel()
			if body != nil {
				body.Close()
			}
		}
		return
	}
	r.left--
	c.hedgesSent++
	r.physical++
	f.takeOff()
	r.hedges = append(r.hedges, f)
	go func() {
		l := r.fly(f, body)
		if l.a.Category == classify.LocalRejection {
			c.budget.GiveBack() // it never left: it costs nothing, as a refused retry does not
		}
		r.mu.Lock()
		f.landed = true
		if c.final(l) && r.decided == nil {
			r.decide(f)
		}
		r.mu.Unlock()
		r.ch <- l
	}()
	if r.left > 0 {
		r.arm(r.delay)
	}
}

// takeOff gives f a context of its own, which the round cancels if another
// attempt decides it, and starts its clock.
func (f *flight) takeOff() {
	actx, cancel := context.WithCancel(f.actx)
	f.actx, f.cancel = actx, composeCancel(cancel, f.cancel)
	f.start = clock.Now()
}

// fly makes f's attempt and describes how it landed.
func (r *round) fly(f *flight, body io.ReadCloser) landing {
	c := r.c
	resp, err := c.t.attempts.AttemptOn(f.actx, c.route, c.req, attempt.Options{Header: c.header, Body: body, NotBefore: r.notBefore})
	now := clock.Now()
	return landing{f: f, resp: resp, err: err, a: record(resp, err, time.Duration(now-f.start)), at: now}
}

// newHedge makes a hedge's context (the AttemptStart hook, the attempt
// timeout) and body (GetBody's), and false when there is no body to send.
func (c *call) newHedge(ai AttemptInfo) (*flight, io.ReadCloser, bool) {
	var body io.ReadCloser
	if c.req.Body != nil && c.req.Body != http.NoBody {
		var err error
		if body, err = c.req.GetBody(); err != nil {
			return nil, nil, false
		}
	}
	f := &flight{ai: ai, actx: c.ctx, cancel: noop, body: body, hedge: true}
	if h := c.t.hooks.AttemptStart; h != nil {
		f.actx = safeCtx(h, f.actx, f.ai)
	}
	if c.t.attemptTimeout > 0 {
		f.actx, f.cancel = context.WithTimeoutCause(f.actx, c.t.attemptTimeout, attempt.ErrAttemptTimeout)
	}
	return f, body, true
}

// settle ends the attempts of a round that did not decide it: their answers
// are closed, their contexts ended, and they are recorded in the outcome
// and told to the hooks.
func (c *call) settle(ls []landing) {
	h := &c.t.hooks
	for _, l := range ls {
		if l.resp != nil {
			l.resp.Body.Close()
		}
		if l.f.body != nil {
			l.f.body.Close()
		}
		l.f.cancel()
		if l.a.Category == classify.Ambiguous {
			c.dropHeld() // it may have reached the upstream: an earlier answer is no longer the call's
		}
		l.a.Decision = retry.Superseded
		c.out.Attempts = append(c.out.Attempts, l.a)
		if h.AttemptDone != nil {
			safe3(h.AttemptDone, l.f.actx, l.f.ai, l.a)
		}
	}
}

// composeCancel returns a function that calls a, then b.
func composeCancel(a, b context.CancelFunc) context.CancelFunc {
	return func() { a(); b() }
}
