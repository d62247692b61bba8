// Package admission is the first step of every attempt: before an attempt may
// touch the wire it passes the circuit breaker, then the client-side throttle
// (off unless configured), then the rate limiter, then the bulkhead, always in
// that order, and gives its permits back in reverse.
//
// The order is the point. An open circuit rejects before a rate token or a
// bulkhead slot is spent, so a dead upstream does not use up the quota and the
// concurrency that healthy upstreams need. A local rejection (rate limiter or
// bulkhead) is never recorded as an upstream failure: the upstream never saw
// the request, and counting our own back-pressure as its failure would open
// the breaker of a healthy dependency. And when a later guard rejects, what the
// earlier ones handed out comes back at once: the rate token is refunded when
// the bulkhead rejects, and the circuit permission is released without an
// outcome when either of them rejects, so a HALF_OPEN breaker cannot lose its
// trial slots to local back-pressure.
//
// Everything an attempt holds is one Permit value, resolved exactly once.
package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/internal/clock"
	"github.com/outboundhq/outbound/internal/clocked"
	"github.com/outboundhq/outbound/internal/mutate"
)

// The throttle's and the limiter's methods that take a clock reading
// instead of reading the clock (package clocked).
var (
	throttleAllow  = clocked.ThrottleAllow.(func(*throttle.Throttle, int64, context.Context) bool)
	throttleAccept = clocked.ThrottleAccept.(func(*throttle.Throttle, int64))
	throttleFail   = clocked.ThrottleFail.(func(*throttle.Throttle, int64))
	limiterTake    = clocked.LimiterTake.(func(*ratelimit.Limiter, int64) bool)
)

// Config configures a Pipeline: one per upstream. Each guard's zero Config
// gives its documented defaults; a zero ratelimit.Config or bulkhead.Config
// means "no such guard".
type Config struct {
	// Upstream names what the pipeline protects; it is carried by events
	// and errors.
	Upstream string

	Circuit  circuit.Config
	Rate     ratelimit.Config
	Bulkhead bulkhead.Config

	// Throttle is client-side throttling, between the circuit breaker and
	// the rate limiter: a throttled attempt spends no rate token and no
	// bulkhead slot, and is a local rejection like theirs. Off unless
	// Throttle.Enabled.
	Throttle throttle.Config

	// RateGuard, if set, supplies a rate guard kept outside the pipeline
	// (a limit shared by a fleet of processes, say): New calls it with
	// Upstream and puts what it returns where the rate limiter goes,
	// between the circuit breaker and the bulkhead, under the same rules.
	// A nil RateGuard returned means no rate guard. Set Rate or RateGuard,
	// not both.
	RateGuard func(upstream string) RateGuard

	// OnEvent, if set, receives every event: enter, reject and exit per
	// guard, refunds, releases, and breaker transitions. It is called
	// outside every lock, possibly concurrently from several attempts, and
	// transitions may arrive late, from a timer. A panic in it is
	// recovered and the event dropped; it cannot break admission.
	OnEvent func(Event)
}

// A RateGuard is a rate limiter the pipeline does not own, such as a limit
// shared by many processes. In the pipeline it is the rate guard, and the
// rules are those of the local one: a token taken for an attempt that never
// reaches the wire (the bulkhead rejected it, or it was cancelled before it
// was sent) is refunded, and a refusal — whatever its cause, an unreachable
// store included — is a local rejection: the circuit permission is released
// and the breaker records nothing.
type RateGuard interface {
	// Take takes one token. It returns nil; ratelimit.ErrLimited when the
	// limit refuses; or another error when it cannot decide (ctx ended, its
	// store cannot be reached). On error no token is held. Take runs on
	// every attempt's path: it must return promptly, within a bound of its
	// own, whatever ctx allows.
	Take(ctx context.Context) error

	// Refund gives back one token Take handed out, for an attempt that
	// never reached the wire.
	Refund()
}

// Pipeline admits attempts to one upstream. It is safe for concurrent use.
type Pipeline struct {
	upstream string
	breaker  *circuit.Breaker
	limiter  *ratelimit.Limiter
	shared   RateGuard // in place of limiter, when set
	bulkhead *bulkhead.Bulkhead
	throttle *throttle.Throttle
	onEvent  func(Event)

	// Preallocated rejections, so that fast failure does not allocate.
	errOpen, errHalfOpenFull, errLimited, errFull, errThrottled *RejectedError
}

// New validates cfg and builds the guards. Errors name the offending field.
func New(cfg Config) (*Pipeline, error) {
	p := &Pipeline{upstream: cfg.Upstream, onEvent: cfg.OnEvent}
	cc := cfg.Circuit
	if user := cc.OnStateChange; p.onEvent != nil {
		cc.OnStateChange = func(t circuit.Transition) {
			p.emit(Event{Upstream: p.upstream, Guard: classify.GuardCircuit, Kind: Transition, Transition: t})
			if user != nil {
				user(t)
			}
		}
	}
	var err error
	if p.breaker, err = circuit.New(cc); err != nil {
		return nil, cfgerr.In("admission", "Circuit", err)
	}
	if p.limiter, err = ratelimit.New(cfg.Rate); err != nil {
		return nil, cfgerr.In("admission", "Rate", err)
	}
	if cfg.RateGuard != nil {
		if p.limiter != nil {
			return nil, cfgerr.New("admission", "RateGuard", "cannot be set together with Rate: the pipeline has one rate guard")
		}
		p.shared = cfg.RateGuard(cfg.Upstream)
	}
	if p.bulkhead, err = bulkhead.New(cfg.Bulkhead); err != nil {
		return nil, cfgerr.In("admission", "Bulkhead", err)
	}
	if p.throttle, err = throttle.New(cfg.Throttle); err != nil {
		return nil, cfgerr.In("admission", "Throttle", err)
	}
	rejected := func(g classify.Guard, err error) *RejectedError {
		return &RejectedError{Upstream: cfg.Upstream, Guard: g, Err: err}
	}
	p.errOpen = rejected(classify.GuardCircuit, circuit.ErrOpen)
	p.errHalfOpenFull = rejected(classify.GuardCircuit, circuit.ErrHalfOpenFull)
	p.errLimited = rejected(classify.GuardRate, ratelimit.ErrLimited)
	p.errFull = rejected(classify.GuardBulkhead, bulkhead.ErrFull)
	p.errThrottled = rejected(classify.GuardThrottle, throttle.ErrThrottled)
	return p, nil
}

// Upstream returns the name given in Config.Upstream.
func (p *Pipeline) Upstream() string { return p.upstream }

// Breaker returns the pipeline's circuit breaker.
func (p *Pipeline) Breaker() *circuit.Breaker { return p.breaker }

// Limiter returns the pipeline's own rate limiter; nil means no limit, or a
// RateGuard in its place (see RateGuard).
func (p *Pipeline) Limiter() *ratelimit.Limiter { return p.limiter }

// RateGuard returns the rate guard Config.RateGuard supplied, or nil.
func (p *Pipeline) RateGuard() RateGuard { return p.shared }

// Bulkhead returns the pipeline's bulkhead; nil means no limit.
func (p *Pipeline) Bulkhead() *bulkhead.Bulkhead { return p.bulkhead }

// Throttle returns the pipeline's client-side throttle; nil means none.
func (p *Pipeline) Throttle() *throttle.Throttle { return p.throttle }

// Learned reports whether p's guards hold what recent outcomes taught them,
// which a new pipeline would not know: failed or slow calls in the
// breaker's window, attempts refused or failed in the throttle's window, or
// an adaptive limit that has closed a sampling window. The breaker's state
// and the tokens and slots held are not in it.
func (p *Pipeline) Learned() bool {
	if m := p.breaker.Metrics(); m.Failed > 0 || m.Slow > 0 {
		return true
	}
	if r, a := p.throttle.Counts(); r > a {
		return true
	}
	return p.bulkhead.Windows() > 0
}

// Acquire admits one attempt: circuit, then the throttle, the rate limiter
// and the bulkhead. On
// success the Permit holds all three and must be resolved exactly once; on
// failure nothing is held and the error is a *RejectedError naming the guard
// (errors.Is(err, ErrRejected) holds, and the guard's own sentinel or the
// context's error is reachable with errors.Is).
func (p *Pipeline) Acquire(ctx context.Context) (Permit, error) {
	cp, ok := p.breaker.TryAllow()
	if !ok {
		var err error
		if cp, err = p.breaker.Allow(); err != nil {
			p.event(classify.GuardCircuit, Reject, err)
			if err == circuit.ErrOpen {
				return Permit{}, p.errOpen
			}
			return Permit{}, p.errHalfOpenFull
		}
	}
	p.event(classify.GuardCircuit, Enter, nil)
	var took bool // a rate token, on the clock read for the throttle
	var at int64
	if p.throttle != nil {
		// One clock reading for the throttle and the rate limiter, and for
		// the throttle again when the attempt ends (at + its duration).
		at = clock.Now()
		if !throttleAllow(p.throttle, at, ctx) {
			p.event(classify.GuardThrottle, Reject, throttle.ErrThrottled)
			p.releaseCircuit(&cp)
			return Permit{}, p.errThrottled
		}
		p.event(classify.GuardThrottle, Enter, nil)
		took = p.limiter != nil && limiterTake(p.limiter, at)
	}
	if p.limiter != nil && !took && !p.limiter.TryAcquire() {
		if err := p.limiter.Acquire(ctx); err != nil {
			p.event(classify.GuardRate, Reject, err)
			p.refundThrottle()
			p.releaseCircuit(&cp)
			return Permit{}, p.rejection(classify.GuardRate, err)
		}
	}
	if p.shared != nil {
		if err := p.take(ctx); err != nil {
			p.event(classify.GuardRate, Reject, err)
			p.refundThrottle()
			p.releaseCircuit(&cp)
			return Permit{}, p.rejection(classify.GuardRate, err)
		}
	}
	if p.limiter != nil || p.shared != nil {
		p.event(classify.GuardRate, Enter, nil)
	}
	if p.bulkhead != nil {
		if err := p.bulkhead.Acquire(ctx); err != nil {
			p.event(classify.GuardBulkhead, Reject, err)
			if !mutate.SkipRateRefundOnBulkheadRejection.Load() {
				p.refundRate()
			}
			p.refundThrottle()
			p.releaseCircuit(&cp)
			return Permit{}, p.rejection(classify.GuardBulkhead, err)
		}
	}
	if p.bulkhead != nil {
		p.event(classify.GuardBulkhead, Enter, nil)
	}
	return Permit{p: p, circuit: cp, at: at}, nil
}

// releaseCircuit gives back the circuit permission of an attempt that a later
// local guard rejected, without an outcome.
func (p *Pipeline) releaseCircuit(cp *circuit.Permission) {
	if mutate.KeepCircuitPermitOnLocalRejection.Load() {
		return
	}
	cp.Release()
	p.event(classify.GuardCircuit, Release, nil)
}

// take takes a token of the shared rate guard; a panic in it is a refusal,
// so that the circuit permission already held comes back.
func (p *Pipeline) take(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("admission: the RateGuard of %s panicked: %v", p.upstream, r)
		}
	}()
	return p.shared.Take(ctx)
}

// refundThrottle tells of an attempt the throttle admitted and a later guard
// refused: the throttle counts an attempt only when it is resolved, so there
// is nothing to take back — the upstream never saw it.
func (p *Pipeline) refundThrottle() {
	if p.throttle != nil {
		p.event(classify.GuardThrottle, Refund, nil) // never resolved: counted neither way
	}
}

// refundRate gives back the rate token of an attempt that never reached the
// wire.
func (p *Pipeline) refundRate() {
	switch {
	case p.limiter != nil:
		p.limiter.Refund()
	case p.shared != nil:
		func() {
			defer func() { _ = recover() }() // the permits after it must still come back
			p.shared.Refund()
		}()
	default:
		return
	}
	p.event(classify.GuardRate, Refund, nil)
}

func (p *Pipeline) rejection(g classify.Guard, err error) error {
	switch err {
	case ratelimit.ErrLimited:
		return p.errLimited
	case bulkhead.ErrFull:
		return p.errFull
	case throttle.ErrThrottled:
		return p.errThrottled
	}
	return &RejectedError{Upstream: p.upstream, Guard: g, Err: err}
}

func (p *Pipeline) event(g classify.Guard, k Kind, err error) {
	if p.onEvent != nil {
		p.emit(Event{Upstream: p.upstream, Guard: g, Kind: k, Err: err})
	}
}

func (p *Pipeline) emit(e Event) {
	defer func() { _ = recover() }()
	p.onEvent(e)
}

// Permit is everything one admitted attempt holds: the circuit permission,
// the rate token and the bulkhead slot. Resolve it exactly once with Success,
// Failure, Release or Cancel; later calls do nothing, so
// `defer permit.Release()` right after Acquire is always safe, and gives
// everything back on every path (including a panic).
//
// The zero Permit holds nothing. Resolve a Permit through one variable only:
// a copy of a held Permit is the same permission, and resolving both gives
// it back twice. A Permit must not be resolved from two goroutines at once.
type Permit struct {
	p       *Pipeline // nil once resolved
	circuit circuit.Permission
	at      int64 // when it was admitted (clock.Now), with a throttle
}

// Success ends the attempt as an upstream success that took elapsed (the
// breaker uses elapsed to detect slow calls, an adaptive bulkhead to learn
// its limit); the throttle counts it accepted.
func (pm *Permit) Success(elapsed time.Duration) { pm.finish(endSuccess, elapsed) }

// Failure ends the attempt as an upstream failure that was answered (a 503,
// say) after elapsed.
func (pm *Permit) Failure(elapsed time.Duration) { pm.finish(endFailure, elapsed) }

// Declined ends the attempt as an answer after elapsed in which the upstream
// declined the attempt for its own load (HTTP 429): a success for the
// breaker (the upstream is up, and said so), a latency for an adaptive
// bulkhead, but not an accepted request for the throttle.
func (pm *Permit) Declined(elapsed time.Duration) { pm.finish(endDeclined, elapsed) }

// Lost ends the attempt as an upstream failure without an answer (a
// timeout, a connection lost) after elapsed: a failure for the breaker, and
// no latency for an adaptive bulkhead, which learns only from answers.
func (pm *Permit) Lost(elapsed time.Duration) { pm.finish(endLost, elapsed) }

// Release ends an attempt that reached the wire but whose result says
// nothing about the upstream (the caller cancelled it, for one): the breaker
// records no outcome; the rate token stays spent.
func (pm *Permit) Release() { pm.finish(endRelease, 0) }

// Cancel ends an attempt that never reached the wire: the breaker records no
// outcome and the rate token is refunded.
func (pm *Permit) Cancel() { pm.finish(endCancel, 0) }

// Held reports whether the permit is still held (admitted and not resolved).
func (pm *Permit) Held() bool { return pm.p != nil }

// releaseSlot gives the bulkhead slot of an attempt that ended as e back:
// with the latency of an answer, which an adaptive bulkhead learns from (a
// moved limit is an event), or without.
func (p *Pipeline) releaseSlot(e end, elapsed time.Duration) {
	switch {
	case !e.answered():
		p.bulkhead.Release()
	case p.onEvent == nil || !p.bulkhead.Adaptive():
		p.bulkhead.ReleaseAfter(elapsed)
	default:
		before := p.bulkhead.Limit()
		p.bulkhead.ReleaseAfter(elapsed)
		if after := p.bulkhead.Limit(); after != before {
			p.emit(Event{Upstream: p.upstream, Guard: classify.GuardBulkhead, Kind: LimitChanged, Limit: [2]int{before, after}})
		}
	}
}

// end is how a Permit was resolved.
type end uint8

const (
	endSuccess  end = iota + 1 // Success: answered, healthy
	endFailure                 // Failure: answered, an upstream failure
	endDeclined                // Declined: answered, declined for the upstream's load
	endLost                    // Lost: an upstream failure without an answer
	endRelease                 // Release: sent, says nothing of the upstream
	endCancel                  // Cancel: never sent
)

// answered reports whether the attempt ended with an answer, whose latency
// an adaptive bulkhead learns from.
func (e end) answered() bool { return e == endSuccess || e == endFailure || e == endDeclined }

func (pm *Permit) finish(k end, elapsed time.Duration) {
	p := pm.p
	if p == nil {
		return
	}
	pm.p = nil
	if p.bulkhead != nil {
		p.releaseSlot(k, elapsed)
		p.event(classify.GuardBulkhead, Exit, nil)
	}
	if k == endCancel {
		p.refundRate()
	} else if p.limiter != nil || p.shared != nil {
		p.event(classify.GuardRate, Exit, nil)
	}
	if p.throttle != nil {
		switch ended := pm.at + int64(elapsed); k {
		case endSuccess:
			throttleAccept(p.throttle, ended)
			p.event(classify.GuardThrottle, Exit, nil)
		case endFailure, endLost, endDeclined:
			throttleFail(p.throttle, ended)
			p.event(classify.GuardThrottle, Exit, nil)
		default: // it says nothing of the upstream
			p.refundThrottle()
		}
	}
	// The exit event goes first: a transition it causes follows it.
	switch k {
	case endSuccess, endDeclined:
		p.event(classify.GuardCircuit, Success, nil)
		pm.circuit.Success(elapsed)
	case endFailure, endLost:
		p.event(classify.GuardCircuit, Failure, nil)
		pm.circuit.Failure(elapsed)
	default:
		p.event(classify.GuardCircuit, Release, nil)
		pm.circuit.Release()
	}
}
