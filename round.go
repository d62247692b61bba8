package outbound

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/clock"
	"github.com/outboundhq/outbound/outcome"
)

// A hedged round: the first attempt runs on the caller's goroutine; a timer
// sends a hedge beside it each time the delay passes without an answer. The
// timer's goroutine writes the round's fields only, under the round's lock;
// the call learns what the round did when it ends (Transport.hedged's
// results).

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

	endpoint string // where its attempt went (attempt.Options.Endpoint)
	arrival  attempt.Arrival
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
	held    int     // hedges the budget withheld
	decided *flight // the attempt whose final answer decided the round
	closed  bool    // no more hedges
	waited  int     // times the timer was armed again, the delay proving nothing (hedgeWaits)
}

// hedged makes one round of attempts: first, and a hedge beside it each
// time delay passes without an answer, while the round may send hedges
// (at most left) and the budget allows them. The first attempt whose answer
// is final decides the round, and the others are cancelled; if none is,
// the round ends when every attempt has ended, with the most telling result
// for the retry rules to judge (see endRound). Every attempt is in the
// outcome: those that did not decide the round come before the one that
// did. A round in which the first attempt answers before the delay costs a
// timer more than an attempt without hedging.
//
// It returns the landing that decides the round and the number of hedges
// it sent; the call counts them (the timer goroutine that sends a hedge
// writes only the round's fields).
func (c *call) hedged(first *flight, body io.ReadCloser, notBefore time.Time, delay time.Duration, physical, left int) (landing, int) {
	left = min(left, c.hedgesLeft())
	r := &round{c: c, first: first, notBefore: notBefore, delay: delay, physical: physical, left: left,
		ch: make(chan landing, left)}
	c.allowance.earn(c.hedging.extraLoad())
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
		c.lat.roundEnded(c.hedging.extraLoad(), len(r.hedges) > 0)
	}
	if len(r.hedges) == 0 { // answered (or failed) before the delay: no hedge
		r.closed = true
		r.timer.Stop()
		c.out.HedgesWithheld += r.held
		r.mu.Unlock()
		return l0, 0
	}
	if c.final(l0.resp, l0.err) && r.decided == nil {
		r.win(first)
	}
	r.mu.Unlock()
	ls := []landing{l0}
	for received := 0; ; received++ {
		r.mu.Lock()
		if received == len(r.hedges) { // every attempt has landed
			r.closed = true
			r.timer.Stop()
			c.out.HedgesWithheld += r.held
			r.mu.Unlock()
			break
		}
		r.mu.Unlock()
		ls = append(ls, <-r.ch)
	}
	return c.endRound(r, ls), len(r.hedges)
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
	c.settle(others, r.decided != nil)
	return *chosen
}

// win makes f the attempt that decided the round, and cancels the others
// in flight: their permits come back, and the breaker records them as
// neither success nor failure (the caller cancelled them). r.mu is held.
func (r *round) win(f *flight) {
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
	if r.closed || r.left == 0 || c.ctx.Err() != nil || c.cannotFinish() {
		r.mu.Unlock() // a hedge with too little time left would not finish either
		return
	}
	if r.waited < hedgeWaits && (r.arriving() || c.order.sharedSlowness(r.first.start)) {
		r.waited++
		r.arm(r.delay / hedgeWaits)
		r.mu.Unlock()
		return
	}
	if !c.budget.Allows() || c.sheddable && !c.budget.Above(sheddableBudget) || !c.allowance.tryTake() {
		// Withheld: told now, counted in the outcome when the round ends.
		// The timer is not armed again: the round sends no more hedges.
		r.held++
		r.mu.Unlock()
		if h := c.t.hooks.BudgetExhausted; h != nil {
			safe2(h, r.first.actx, c.info.Upstream)
		}
		return
	}
	ai := AttemptInfo{CallInfo: c.info, Attempt: r.physical + 1}
	r.mu.Unlock()
	f, body, ok := c.newHedge(ai)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !ok || r.closed { // no body for it, or the round ended meanwhile
		c.allowance.giveBack()
		if ok {
			f.cancel()
			if body != nil {
				body.Close()
			}
		}
		return
	}
	r.left--
	r.physical++
	f.takeOff()
	r.hedges = append(r.hedges, f)
	go func() {
		l := r.fly(f, body)
		if l.a.Category == classify.LocalRejection {
			c.allowance.giveBack() // it never left: it costs nothing, as a refused retry does not
		}
		r.mu.Lock()
		f.landed = true
		if c.final(l.resp, l.err) && r.decided == nil {
			r.win(f)
		}
		r.mu.Unlock()
		r.ch <- l
	}()
	if r.left > 0 {
		r.arm(r.delay)
	}
}

// hedgeWaits is how many times a hedge waits, each for a quarter of the
// delay, while the delay's passing proves nothing: an answer is arriving
// (round.arriving), or every attempt started since the first is unanswered
// too (attemptOrder.sharedSlowness). At most one delay more, so that an
// upstream that sends the start of its answer and stalls, or stalls as a
// whole, is still hedged.
const hedgeWaits = 4

// arriving reports whether an attempt of the round in flight has an answer
// arriving (attempt.Arrival); r.mu is held.
func (r *round) arriving() bool {
	if !r.first.landed && r.first.arrival.Arriving() {
		return true
	}
	for _, f := range r.hedges {
		if !f.landed && f.arrival.Arriving() {
			return true
		}
	}
	return false
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
	c.order.start(f.start)
	header, _ := c.attemptHeader(f.actx)
	resp, err := c.t.attempts.AttemptOn(f.actx, c.route, c.req, attempt.Options{Header: header, Body: body, NotBefore: r.notBefore, Provisional: true,
		Elsewhere: &c.elsewhere, Endpoint: &f.endpoint, Arrival: &f.arrival})
	now := clock.Now()
	a := record(resp, err, time.Duration(now-f.start))
	a.Endpoint = f.endpoint
	if a.Category == classify.Answered {
		c.order.answeredFrom(f.start)
	}
	return landing{f: f, resp: resp, err: err, a: a, at: now}
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
		f.actx, f.cancel = context.WithTimeoutCause(f.actx, c.t.attemptTimeout, classify.ErrAttemptTimeout)
	}
	return f, body, true
}

// settle ends the attempts of a round that did not decide it: their answers
// are closed, their contexts ended, and they are recorded in the outcome
// and told to the hooks. When a final answer decided the round (won), the
// others lost the race and count for nothing with the breaker, even those
// that answered (a hedge's 503 beside a first attempt's 200): each is
// cancelled before its answer is closed, which releases its permit
// (attempt.Options.Provisional). When none did, every answer is the
// upstream's verdict, and is closed first.
func (c *call) settle(ls []landing, won bool) {
	h := &c.t.hooks
	for _, l := range ls {
		if won {
			l.f.cancel()
		}
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
