// Package circuit is the circuit-breaker guard of the admission pipeline, with
// Resilience4j's semantics: CLOSED, OPEN and HALF_OPEN, plus the operator
// states DISABLED, FORCED_OPEN and METRICS_ONLY; a count-based or time-based
// sliding window; failure-rate and slow-call-rate thresholds; a minimum number
// of calls; a wait in OPEN after which the breaker moves to HALF_OPEN by
// itself; a number of trial calls in HALF_OPEN.
//
// Two things differ from Resilience4j, on purpose:
//   - HALF_OPEN cannot get stuck. A trial permit that is never resolved would
//     hold its slot forever; MaxWaitInHalfOpen (finite by default) sends the
//     breaker back to OPEN, and then to a fresh HALF_OPEN.
//   - Every permit belongs to a generation (one per state transition). A
//     result reported for a permit of an earlier generation is ignored, so a
//     slow call admitted while CLOSED cannot decide a later HALF_OPEN.
//
// A permit is resolved exactly once: Success, Failure, or Release (the call
// says nothing about the upstream: it was rejected by a later local guard, or
// the caller cancelled it). Resolving it again does nothing, so
// `defer p.Release()` right after Allow is always safe.
//
// The hot path is lock-free for admission: Allow in CLOSED is one atomic load
// and returns a value, not a pointer. Recording an outcome takes a short
// mutex so that the window and the decision to open are exact. While OPEN,
// Allow reads no clock: timers move the breaker on.
package circuit

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"github.com/outboundhq/outbound/internal/clock"
)

// State is a breaker state.
type State uint8

const (
	Closed      State = iota // calls pass; outcomes fill the window
	Open                     // calls are rejected until WaitInOpen has passed
	HalfOpen                 // a limited number of trial calls decide
	Disabled                 // calls pass; nothing is recorded (operator state)
	ForcedOpen               // calls are rejected until an operator says otherwise
	MetricsOnly              // calls pass; outcomes are recorded; never opens
)

func (s State) String() string {
	switch s {
	case Closed:
		return "CLOSED"
	case Open:
		return "OPEN"
	case HalfOpen:
		return "HALF_OPEN"
	case Disabled:
		return "DISABLED"
	case ForcedOpen:
		return "FORCED_OPEN"
	case MetricsOnly:
		return "METRICS_ONLY"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Reason says why a transition happened.
type Reason uint8

const (
	ReasonFailureRate     Reason = iota + 1 // the failure rate reached its threshold
	ReasonSlowCallRate                      // the slow-call rate reached its threshold
	ReasonWaitElapsed                       // WaitInOpen passed
	ReasonTrialsPassed                      // the HALF_OPEN trial calls were healthy
	ReasonHalfOpenTimeout                   // MaxWaitInHalfOpen passed before the trials decided
	ReasonManual                            // SetState
)

func (r Reason) String() string {
	switch r {
	case ReasonFailureRate:
		return "failure rate"
	case ReasonSlowCallRate:
		return "slow-call rate"
	case ReasonWaitElapsed:
		return "wait in open elapsed"
	case ReasonTrialsPassed:
		return "trial calls passed"
	case ReasonHalfOpenTimeout:
		return "half-open max wait elapsed"
	case ReasonManual:
		return "set by operator"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Transition describes one state change.
type Transition struct {
	From, To   State
	Reason     Reason
	Generation uint64 // generation of the new state

	// Rates in the window at the moment of the decision, in percent
	// (meaningful for ReasonFailureRate, ReasonSlowCallRate and
	// ReasonTrialsPassed).
	FailureRate, SlowCallRate float64
}

func (t Transition) String() string {
	return fmt.Sprintf("%v->%v (%v)", t.From, t.To, t.Reason)
}

var (
	// ErrOpen is returned by Allow while the breaker is OPEN or FORCED_OPEN.
	ErrOpen = errors.New("circuit: breaker is open")
	// ErrHalfOpenFull is returned by Allow in HALF_OPEN when every trial
	// slot is taken.
	ErrHalfOpenFull = errors.New("circuit: half-open trial calls all taken")
)

const stateMask = 0xff

// Breaker is a circuit breaker. It is safe for concurrent use.
type Breaker struct {
	word atomic.Uint64 // generation<<8 | State; changes only under mu

	// clean is true while the breaker is CLOSED or METRICS_ONLY with a full
	// count window that holds no failed and no slow call. Recording one more
	// fast success then changes nothing (every slot already says "fast
	// success"), so finish skips the lock: the healthy steady state records
	// outcomes without writing shared memory. It is also safe for a permit
	// of an earlier generation, whose result must be ignored anyway.
	clean atomic.Bool

	// issued counts the HALF_OPEN trial permits handed out. Guarded by mu,
	// like every field below.
	issued int32

	slowDur int64 // nanoseconds; a copy of the setting, read on every outcome

	mu       sync.Mutex
	set      unique.Handle[settings] // one copy for all breakers with equal settings
	onChange func(Transition)
	timer    *time.Timer

	// count is the count-based window. In HALF_OPEN its counters (n, fail,
	// slo) count the trial calls instead: the window is emptied when the
	// breaker enters HALF_OPEN and again when it leaves it.
	count countWindow
	ext   *windowExt // the rest of a time-based or long count-based window
}

// windowExt holds what only some windows need, so that the common breaker
// (a count window of up to 128 calls) is one small allocation.
type windowExt struct {
	time timeWindow // of a time-based window
	bits []uint64   // of a count-based window of more than 128 calls
}

// New validates cfg and returns a CLOSED Breaker. Errors name the offending
// field.
func New(cfg Config) (*Breaker, error) {
	s, err := cfg.settings()
	if err != nil {
		return nil, err
	}
	b := &Breaker{set: unique.Make(s), slowDur: s.slowDur, onChange: cfg.OnStateChange}
	switch {
	case s.windowType == TimeBased:
		b.ext = &windowExt{time: newTimeWindow(s.windowSize)}
	case 2*words(s.windowSize) > int32(len(b.count.inline)):
		b.ext = &windowExt{bits: make([]uint64, 2*words(s.windowSize))}
	}
	return b, nil
}

// State returns the current state.
func (b *Breaker) State() State { return State(b.word.Load() & stateMask) }

// Allow asks for permission to make one call. On success the returned Permit
// must be resolved once with Success, Failure or Release.
func (b *Breaker) Allow() (Permit, error) {
	w := b.word.Load()
	if State(w&stateMask) == Closed {
		return Permit{b: b, word: w}, nil
	}
	return b.allowOther(w)
}

// TryAllow is Allow's fast path: it grants a permit at once while the
// breaker is CLOSED and reports false otherwise (then call Allow).
func (b *Breaker) TryAllow() (Permit, bool) {
	w := b.word.Load()
	return Permit{b: b, word: w}, State(w&stateMask) == Closed
}

func (b *Breaker) allowOther(w uint64) (Permit, error) {
	switch State(w & stateMask) {
	case Closed, MetricsOnly, Disabled:
		return Permit{b: b, word: w}, nil
	case HalfOpen:
		return b.allowTrial(w)
	}
	return Permit{}, ErrOpen
}

func (b *Breaker) allowTrial(w uint64) (Permit, error) {
	b.mu.Lock()
	if b.word.Load() != w {
		b.mu.Unlock()
		return b.Allow() // moved on meanwhile
	}
	if b.issued >= b.set.Value().permitted {
		b.mu.Unlock()
		return Permit{}, ErrHalfOpenFull
	}
	b.issued++
	b.mu.Unlock()
	return Permit{b: b, word: w}, nil
}

// Permit is the permission for one call. The zero Permit belongs to no
// breaker and resolving it does nothing. Resolve a Permit through one
// variable only: a copy of a held Permit is the same permission, and
// resolving both records its outcome twice. A Permit must not be resolved
// from two goroutines at once.
type Permit struct {
	b    *Breaker // nil once resolved
	word uint64
}

type outcome uint8

const (
	success outcome = iota
	failure
	release
)

// Success records a successful call that took elapsed.
func (p *Permit) Success(elapsed time.Duration) { p.resolve(success, elapsed) }

// Failure records a failed call that took elapsed.
func (p *Permit) Failure(elapsed time.Duration) { p.resolve(failure, elapsed) }

// Release gives the permission back without an outcome: the call was stopped
// by a later local guard or cancelled by the caller, and says nothing about
// the upstream. In HALF_OPEN the trial slot becomes free again.
func (p *Permit) Release() { p.resolve(release, 0) }

// Resolved reports whether the permit has been resolved.
func (p *Permit) Resolved() bool { return p.b == nil }

func (p *Permit) resolve(o outcome, elapsed time.Duration) {
	b := p.b
	if b == nil {
		return
	}
	p.b = nil
	if o == success && int64(elapsed) < b.slowDur && b.clean.Load() {
		return // see Breaker.clean
	}
	b.finish(p.word, o, elapsed)
}

func (b *Breaker) finish(word uint64, o outcome, elapsed time.Duration) {
	st := State(word & stateMask)
	if st == Disabled || (o == release && st != HalfOpen) {
		return
	}
	failed, slow := o == failure, int64(elapsed) >= b.slowDur
	var tr Transition
	b.mu.Lock()
	if b.word.Load() != word {
		b.mu.Unlock() // an earlier generation: ignored
		return
	}
	switch st {
	case Closed, MetricsOnly:
		var n, f, s int32
		if b.set.Value().windowType == TimeBased {
			tw := &b.ext.time
			tw.add(clock.Now(), failed, slow)
			n, f, s = tw.n, tw.fail, tw.slo
		} else {
			b.count.add(b.bits(), b.set.Value().windowSize, failed, slow)
			n, f, s = b.count.n, b.count.fail, b.count.slo
			b.clean.Store(n == b.set.Value().windowSize && f == 0 && s == 0)
		}
		if st == Closed && n >= b.set.Value().minCalls {
			if r, fr, sr := b.verdict(n, f, s); r != 0 {
				tr = b.moveLocked(Open, r, fr, sr)
			}
		}
	case HalfOpen:
		h := &b.count // the trial counters
		if o == release {
			b.issued--
			break
		}
		h.n++
		if failed {
			h.fail++
		}
		if slow {
			h.slo++
		}
		if h.n >= b.set.Value().permitted {
			r, fr, sr := b.verdict(h.n, h.fail, h.slo)
			if r != 0 {
				tr = b.moveLocked(Open, r, fr, sr)
			} else {
				tr = b.moveLocked(Closed, ReasonTrialsPassed, fr, sr)
			}
		}
	}
	b.mu.Unlock()
	b.notify(tr)
}

// verdict returns the reason to open, or 0, and the rates in percent.
func (b *Breaker) verdict(n, fail, slow int32) (Reason, float64, float64) {
	fr := float64(fail) * 100 / float64(n)
	sr := float64(slow) * 100 / float64(n)
	switch {
	case fr >= b.set.Value().failPct:
		return ReasonFailureRate, fr, sr
	case sr >= b.set.Value().slowPct:
		return ReasonSlowCallRate, fr, sr
	}
	return 0, fr, sr
}

// moveLocked starts a new generation in state to. b.mu must be held.
func (b *Breaker) moveLocked(to State, r Reason, fr, sr float64) Transition {
	old := b.word.Load()
	gen := old>>8 + 1
	b.word.Store(gen<<8 | uint64(to))
	b.clean.Store(false)
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if from := State(old & stateMask); to == Closed || to == MetricsOnly || to == HalfOpen || from == HalfOpen {
		b.clearWindow()
	}
	switch to {
	case Open:
		b.timer = time.AfterFunc(b.set.Value().waitOpen, func() { b.onTimer(gen) })
	case HalfOpen:
		b.issued = 0
		if b.set.Value().maxHalf > 0 {
			b.timer = time.AfterFunc(b.set.Value().maxHalf, func() { b.onTimer(gen) })
		}
	}
	return Transition{From: State(old & stateMask), To: to, Reason: r, Generation: gen, FailureRate: fr, SlowCallRate: sr}
}

// bits returns the count window's bitsets.
func (b *Breaker) bits() []uint64 {
	if b.ext != nil {
		return b.ext.bits
	}
	return b.count.inline[:]
}

// clearWindow empties the sliding window and the trial counters. b.mu must
// be held.
func (b *Breaker) clearWindow() {
	if b.set.Value().windowType == TimeBased {
		b.ext.time.reset()
		b.count.reset(nil)
	} else {
		b.count.reset(b.bits())
	}
}

func (b *Breaker) onTimer(gen uint64) {
	var tr Transition
	b.mu.Lock()
	if w := b.word.Load(); w>>8 == gen {
		switch State(w & stateMask) {
		case Open:
			tr = b.moveLocked(HalfOpen, ReasonWaitElapsed, 0, 0)
		case HalfOpen:
			tr = b.moveLocked(Open, ReasonHalfOpenTimeout, 0, 0)
		}
	}
	b.mu.Unlock()
	b.notify(tr)
}

// notify delivers tr, if it is one, outside the lock.
func (b *Breaker) notify(tr Transition) {
	if tr.Reason == 0 || b.onChange == nil {
		return
	}
	defer func() { _ = recover() }()
	b.onChange(tr)
}

// SetState moves the breaker to s at once, in a new generation: results of
// permits given out before are ignored. Use it for operator overrides
// (ForcedOpen, Disabled, MetricsOnly) and to reset (Closed, with an empty
// window). Moving to Open starts the wait for HALF_OPEN as usual.
func (b *Breaker) SetState(s State) {
	if s > MetricsOnly {
		panic(fmt.Sprintf("circuit: SetState(%v): no such state", s))
	}
	b.mu.Lock()
	tr := b.moveLocked(s, ReasonManual, 0, 0)
	b.mu.Unlock()
	b.notify(tr)
}

// Metrics is a snapshot of a breaker.
type Metrics struct {
	State State
	// Calls, Failed and Slow count the outcomes in the current window: the
	// sliding window in CLOSED and METRICS_ONLY, the trial calls in
	// HALF_OPEN. The window is emptied when the breaker enters CLOSED,
	// METRICS_ONLY or HALF_OPEN, and when it leaves HALF_OPEN; in the other
	// states it keeps what it held when they were entered (in OPEN after
	// CLOSED, the window that opened the breaker; after failed trials,
	// nothing).
	Calls, Failed, Slow int
	// TrialsInFlight is the number of HALF_OPEN trial permits not yet
	// resolved.
	TrialsInFlight int
	Generation     uint64
}

// Metrics returns a snapshot.
func (b *Breaker) Metrics() Metrics {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	m := Metrics{State: State(w & stateMask), Generation: w >> 8}
	switch {
	case m.State == HalfOpen:
		m.Calls, m.Failed, m.Slow = int(b.count.n), int(b.count.fail), int(b.count.slo)
		m.TrialsInFlight = int(b.issued - b.count.n)
	case b.set.Value().windowType == TimeBased:
		tw := &b.ext.time
		tw.advance(floorDiv(clock.Now(), 1e9))
		m.Calls, m.Failed, m.Slow = int(tw.n), int(tw.fail), int(tw.slo)
	default:
		m.Calls, m.Failed, m.Slow = int(b.count.n), int(b.count.fail), int(b.count.slo)
	}
	return m
}
