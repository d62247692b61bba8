package outbound

import (
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

// drainLimit bounds how much of a retried answer's body is read so that its
// connection can be reused (net/http's maxBodySlurpSize is 2 KiB).
const drainLimit = 4 << 10

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
	ownCtx       bool // ctx is req.Context(): no hook or timeout replaced it
	headerCloned bool // header is a copy of req.Header (an Idempotency-Key added)
	idempotent   bool
	hasKey       bool
	replayable   bool         // no body, NoBody, or GetBody
	body         *trackedBody // the body of the attempt in progress, if any
}

func newCall(t *Transport, req *http.Request) *call {
	c := &call{t: t, req: req, ctx: req.Context(), header: req.Header, ownCtx: true}
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
	c.budget = t.Budget(key)
	c.idempotent = retry.Idempotent(req.Method)
	c.hasKey = req.Header.Get("Idempotency-Key") != ""
	c.replayable = req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	if t.idemKeys && !c.idempotent && !c.hasKey && c.replayable {
		c.header = req.Header.Clone()
		c.headerCloned = true
		if c.header == nil {
			c.header = http.Header{}
		}
		c.header.Set("Idempotency-Key", newIdempotencyKey())
		c.hasKey = true
	}
	return c
}

// outcomeAndAttempt allocates a call's outcome together with room for its
// first attempt: most calls make one.
type outcomeAndAttempt struct {
	outcome.Outcome
	first [1]outcome.Attempt
}

func (c *call) run() (*http.Response, error) {
	if c.err != nil {
		return nil, c.fail(c.err)
	}
	h := &c.t.hooks
	for n := 1; ; n++ {
		body, err := c.attemptBody(n)
		if err != nil {
			c.out.Reason = retry.BodyUnavailable
			return nil, c.fail(err)
		}
		ai := AttemptInfo{CallInfo: c.info, Attempt: n}
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
		sendCtx := actx
		if asIs {
			sendCtx = nil // AttemptOn: send c.req as it is
		}
		start := clock.Now()
		resp, err := c.t.attempts.AttemptOn(c.route, c.req, sendCtx, c.header, body)
		a := record(resp, err, time.Duration(clock.Now()-start))
		final := err == nil && !c.t.retryable(resp.StatusCode)
		c.account(a, final)

		var d retry.Decision
		if final {
			d = retry.Decision{Reason: retry.Answered}
		} else {
			d = retry.Decide(c.input(n, a, resp))
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
			c.out.Reason = d.Reason
			c.out.Resolve()
			if resp != nil {
				if c.t.attemptTimeout > 0 || c.cancel != nil { // timeouts to end with the body
					resp.Body = &finalBody{ReadCloser: resp.Body, cancels: [2]context.CancelFunc{acancel, c.cancel}}
				} else {
					acancel() // noop: there is no timeout, and no wrapper is needed
				}
				return resp, nil
			}
			acancel()
			return nil, c.fail(err)
		}
		if resp != nil {
			_, _ = io.CopyN(io.Discard, resp.Body, drainLimit)
			resp.Body.Close()
		}
		acancel()
		if !c.sleep(d.Wait) {
			c.out.Reason = retry.ContextDone
			c.out.Resolve()
			return nil, c.fail(c.ctx.Err())
		}
	}
}

// attemptBody returns the body of attempt n (nil for none). The caller's
// request itself is never modified: the attempt layer sends a copy with it.
func (c *call) attemptBody(n int) (io.ReadCloser, error) {
	switch {
	case c.req.Body == nil || c.req.Body == http.NoBody:
		return c.req.Body, nil
	case c.body != nil && (!c.body.touched() || c.req.GetBody == nil):
		// The previous attempt never sent its body: send the same one.
		// (A one-shot body that was sent only gets here through
		// mutate.ResendOneShotBodies, which the soak test uses to prove
		// that it catches a re-sent one-shot body.)
		return c.body, nil
	case n == 1:
		c.body = &trackedBody{rc: c.req.Body}
		return c.body, nil
	}
	// Decide allowed a retry, so the body is replayable.
	c.body.Close()
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
		a.Stage, a.Category, a.Evidence = ce.Stage, ce.Category, ce.Evidence
	}
	var re *admission.RejectedError
	if errors.As(err, &re) {
		a.Guard = re.Guard
	}
	return a
}

// account feeds the retry budget: a final answer is a success; a failure or
// a retryable answer costs a token. Local rejections and attempts the caller
// cancelled say nothing about the upstream.
func (c *call) account(a outcome.Attempt, final bool) {
	switch {
	case final:
		c.budget.OnSuccess()
	case a.Category == classify.LocalRejection, c.req.Context().Err() != nil:
	default:
		c.budget.OnFailure()
	}
}

func (c *call) input(n int, a outcome.Attempt, resp *http.Response) retry.Input {
	in := retry.Input{
		Method:         c.req.Method,
		IdempotencyKey: c.hasKey,
		BodyReplayable: c.replayable || !c.body.touched() || mutate.ResendOneShotBodies.Load(),
		Category:       a.Category,
		Status:         a.Status,
		Attempts:       n,
		MaxAttempts:    c.t.maxAttempts,
		Backoff:        c.t.backoff.Delay(n),
		BudgetAllows:   c.budget.Allows(),
	}
	if a.Category == 0 { // not classified: an invalid request, or GetBody failed
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
		c.body.Close()
	} else if c.req.Body != nil {
		c.req.Body.Close()
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.out.Resolve()
	if c.out.Reason == 0 {
		c.out.Reason = retry.LocalRejection // the request could not be made at all
	}
	return &outcome.Error{Outcome: c.out, Err: err}
}

// trackedBody is a request body that knows whether it was read.
type trackedBody struct {
	rc     io.ReadCloser
	read   atomic.Bool
	closed sync.Once
}

func (b *trackedBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.rc.Read(p)
}

func (b *trackedBody) Close() error {
	var err error
	b.closed.Do(func() { err = b.rc.Close() })
	return err
}

// touched reports whether b was read (a nil body was not).
func (b *trackedBody) touched() bool { return b != nil && b.read.Load() }

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
