// Package circuit is the circuit-breaker guard of the admission pipeline, with
// Resilience4j's semantics: CLOSED, OPEN and HALF_OPEN, plus the operator
// states DISABLED, FORCED_OPEN and METRICS_ONLY; a count-based or time-based
// sliding window; failure-rate and slow-call-rate thresholds; a minimum number
// of calls; a wait in OPEN after which the breaker moves to HALF_OPEN by
// itself; a number of trial calls in HALF_OPEN.
//
// The differences from Resilience4j are deliberate, and each is listed, with
// its reason, in docs/DESIGN.md of the repository ("Differences from
// Resilience4j"); the two that matter most:
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
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unique"
	"unsafe"

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

// Cause says why a transition happened.
type Cause uint8

const (
	CauseFailureRate     Cause = iota + 1 // the failure rate reached its threshold
	CauseSlowCallRate                     // the slow-call rate reached its threshold
	CauseWaitElapsed                      // WaitInOpen passed
	CauseTrialsPassed                     // the HALF_OPEN trial calls were healthy
	CauseHalfOpenTimeout                  // MaxWaitInHalfOpen passed before the trials decided
	CauseManual                           // SetState
	CauseOpenFor                          // OpenFor: opened for a set time, as the upstream asked
)

func (r Cause) String() string {
	switch r {
	case CauseFailureRate:
		return "failure rate"
	case CauseSlowCallRate:
		return "slow-call rate"
	case CauseWaitElapsed:
		return "wait in open elapsed"
	case CauseTrialsPassed:
		return "trial calls passed"
	case CauseHalfOpenTimeout:
		return "half-open max wait elapsed"
	case CauseManual:
		return "set by operator"
	case CauseOpenFor:
		return "opened for a set time"
	}
	return fmt.Sprintf("Cause(%d)", uint8(r))
}

// Transition describes one state change.
type Transition struct {
	From, To   State
	Cause      Cause
	Generation uint64 // generation of the new state

	// Rates in the window at the moment of the decision, in percent
	// (meaningful for CauseFailureRate, CauseSlowCallRate and
	// CauseTrialsPassed).
	FailureRate, SlowCallRate float64

	// Wait is how long the breaker stays OPEN, for a transition to OPEN
	// (its wait in OPEN after backing off, or what OpenFor asked), and zero
	// for the others.
	Wait time.Duration
}

func (t Transition) String() string {
	return fmt.Sprintf("%v->%v (%v)", t.From, t.To, t.Cause)
}

var (
	// ErrOpen is returned by Allow while the breaker is OPEN or FORCED_OPEN.
	ErrOpen = errors.New("circuit: breaker is open")
	// ErrHalfOpenFull is returned by Allow in HALF_OPEN when every trial
	// slot is taken.
	ErrHalfOpenFull = errors.New("circuit: half-open trial calls all taken")
	// ErrIllegalTransition matches the error of SetState for a transition
	// that Resilience4j refuses too: CLOSED to HALF_OPEN, and METRICS_ONLY
	// to OPEN or HALF_OPEN.
	ErrIllegalTransition = errors.New("circuit: illegal state transition")
)

// TransitionError is SetState's refusal of an illegal transition; errors.Is
// matches it with ErrIllegalTransition.
type TransitionError struct{ From, To State }

func (e *TransitionError) Error() string {
	return fmt.Sprintf("circuit: illegal state transition from %v to %v", e.From, e.To)
}

// Is matches ErrIllegalTransition.
func (e *TransitionError) Is(target error) bool { return target == ErrIllegalTransition }

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
	// like the fields below but notPermitted. (Next to clean: the two fit
	// one word, and an idle breaker stays in the 112-byte size class.)
	issued int32

	// notPermitted counts the calls refused in the current state (OPEN,
	// FORCED_OPEN, or HALF_OPEN with every trial slot taken), made the
	// first time the breaker refuses one (see counter).
	notPermitted atomic.Pointer[counter]

	slowDur int64 // nanoseconds; a copy of the setting, read on every outcome

	mu       sync.Mutex
	set      unique.Handle[settings] // one copy for all breakers with equal settings
	onChange func(Transition)

	// count is the count-based window. In HALF_OPEN its counters (n, fail,
	// slo) count the trial calls instead: the window is emptied when the
	// breaker enters HALF_OPEN and again when it leaves it.
	count countWindow
	ext   *windowExt // the rest of a time-based or long count-based window
}

// refused counts a refused call.
func (b *Breaker) refused() {
	c := b.notPermitted.Load()
	if c == nil {
		b.notPermitted.CompareAndSwap(nil, newCounter())
		c = b.notPermitted.Load()
	}
	c.add()
}

// counter is a count that many processors add to at once: a storm of calls
// refused by an OPEN breaker, from every core. One shared atomic written on
// every refusal is one cache line bouncing between the cores, which made a
// refusal several times slower than one without counting. So the count is spread over cells, as Java's LongAdder (which Resilience4j
// counts with) spreads it by thread: a goroutine adds to the cell its
// stack's address picks, so that it keeps writing the same cell, in its own
// core's cache, and two goroutines share one only by chance. The
// sum is exact once the adds are done; a reset races only with adds made at
// the moment of a transition. The cells, 4 per processor up to 16, are made
// when the breaker first refuses a call.
type counter struct {
	cells []paddedInt
	mask  uintptr
}

type paddedInt struct {
	n atomic.Int64
	_ [128 - 8]byte // two cache lines: x86 fetches them in pairs
}

func newCounter() *counter {
	n := 4
	for n < 4*runtime.GOMAXPROCS(0) && n < 16 {
		n *= 2
	}
	return &counter{cells: make([]paddedInt, n), mask: uintptr(n - 1)}
}

// add counts one. The address of a local variable says, cheaply, which
// goroutine runs it (stacks are 2 KiB at least, and goroutines whose stacks
// share a block share a cell); it is only hashed, never dereferenced.
func (c *counter) add() {
	var here byte
	g := uintptr(unsafe.Pointer(&here))
	c.cells[(g>>13^g>>17)&c.mask].n.Add(1)
}

func (c *counter) sum() int64 {
	if c == nil {
		return 0
	}
	var n int64
	for i := range c.cells {
		n += c.cells[i].n.Load()
	}
	return n
}

// windowExt holds what only some breakers need, so that the common idle
// breaker (a count window of up to 128 calls, never opened) is one small
// allocation: the window of a time-based or long count-based breaker, and
// what a breaker needs once it has opened. Guarded by mu.
type windowExt struct {
	time timeWindow // of a time-based window
	bits []uint64   // of a count-based window of more than 128 calls

	timer     *time.Timer // of the OPEN or HALF_OPEN state
	openUntil int64       // when the current OPEN state ends (clock.Now)
	openings  int32       // since the breaker was last CLOSED: the wait in OPEN backs off with it
}

// extLocked returns b.ext, making it if needed; b.mu must be held.
func (b *Breaker) extLocked() *windowExt {
	if b.ext == nil {
		b.ext = &windowExt{}
	}
	return b.ext
}

// New validates cfg and returns a CLOSED Breaker. Errors name the offending
// field.
func New(cfg Config) (*Breaker, error) {
	s, err := cfg.settings()
	if err != nil {
		return nil, err
	}
	b := &Breaker{set: unique.Make(s), slowDur: s.slowDur, onChange: cfg.OnStateChange}
	b.word.Store(uint64(s.start))
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

// Allow asks for permission to make one call. On success the returned Permission
// must be resolved once with Success, Failure or Release.
func (b *Breaker) Allow() (Permission, error) {
	w := b.word.Load()
	if State(w&stateMask) == Closed {
		return Permission{b: b, word: w}, nil
	}
	return b.allowOther(w)
}

// TryAllow is Allow's fast path: it grants a permit at once while the
// breaker is CLOSED, and otherwise returns no permit and false (then call
// Allow).
func (b *Breaker) TryAllow() (Permission, bool) {
	w := b.word.Load()
	if State(w&stateMask) != Closed {
		return Permission{}, false
	}
	return Permission{b: b, word: w}, true
}

func (b *Breaker) allowOther(w uint64) (Permission, error) {
	switch State(w & stateMask) {
	case Closed, MetricsOnly, Disabled:
		return Permission{b: b, word: w}, nil
	case HalfOpen:
		return b.allowTrial(w)
	}
	b.refused()
	return Permission{}, ErrOpen
}

func (b *Breaker) allowTrial(w uint64) (Permission, error) {
	b.mu.Lock()
	if b.word.Load() != w {
		b.mu.Unlock()
		return b.Allow() // moved on meanwhile
	}
	if b.issued >= b.set.Value().permitted {
		b.mu.Unlock()
		b.refused()
		return Permission{}, ErrHalfOpenFull
	}
	b.issued++
	b.mu.Unlock()
	return Permission{b: b, word: w}, nil
}

// Permission is the permission for one call. The zero Permission belongs to no
// breaker and resolving it does nothing. Resolve a Permission through one
// variable only: a copy of a held Permission is the same permission, and
// resolving both records its outcome twice. A Permission must not be resolved
// from two goroutines at once.
type Permission struct {
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
func (p *Permission) Success(elapsed time.Duration) { p.resolve(success, elapsed) }

// Failure records a failed call that took elapsed.
func (p *Permission) Failure(elapsed time.Duration) { p.resolve(failure, elapsed) }

// Release gives the permission back without an outcome: the call was stopped
// by a later local guard or cancelled by the caller, and says nothing about
// the upstream. In HALF_OPEN the trial slot becomes free again.
func (p *Permission) Release() { p.resolve(release, 0) }

// Resolved reports whether the permit has been resolved.
func (p *Permission) Resolved() bool { return p.b == nil }

func (p *Permission) resolve(o outcome, elapsed time.Duration) {
	b := p.b
	if b == nil {
		return
	}
	p.b = nil
	if o == success && int64(elapsed) <= b.slowDur && b.clean.Load() {
		return // see Breaker.clean
	}
	b.finish(p.word, o, elapsed)
}

func (b *Breaker) finish(word uint64, o outcome, elapsed time.Duration) {
	st := State(word & stateMask)
	if st == Disabled || (o == release && st != HalfOpen) {
		return
	}
	failed, slow := o == failure, int64(elapsed) > b.slowDur // above the threshold, as in Resilience4j
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
		if h.n >= b.set.Value().halfMin {
			r, fr, sr := b.verdict(h.n, h.fail, h.slo)
			if r != 0 {
				tr = b.moveLocked(Open, r, fr, sr)
			} else {
				tr = b.moveLocked(Closed, CauseTrialsPassed, fr, sr)
			}
		}
	}
	b.mu.Unlock()
	b.notify(tr)
}

// verdict returns the reason to open, or 0, and the rates in percent.
func (b *Breaker) verdict(n, fail, slow int32) (Cause, float64, float64) {
	fr := float64(fail) * 100 / float64(n)
	sr := float64(slow) * 100 / float64(n)
	switch {
	case fr >= b.set.Value().failPct:
		return CauseFailureRate, fr, sr
	case sr >= b.set.Value().slowPct:
		return CauseSlowCallRate, fr, sr
	}
	return 0, fr, sr
}

// moveLocked starts a new generation in state to. b.mu must be held. An
// OPEN state waits the next wait of the backoff (see openWait).
func (b *Breaker) moveLocked(to State, r Cause, fr, sr float64) Transition {
	var wait time.Duration
	if to == Open {
		b.extLocked().openings++
		wait = b.openWait()
	}
	return b.moveForLocked(to, r, fr, sr, wait)
}

// moveForLocked is moveLocked with the wait of an OPEN state given.
func (b *Breaker) moveForLocked(to State, r Cause, fr, sr float64, wait time.Duration) Transition {
	old := b.word.Load()
	gen := old>>8 + 1
	b.word.Store(gen<<8 | uint64(to))
	b.clean.Store(false)
	b.notPermitted.Store(nil) // a new state counts afresh; the cells are made again at its first refusal
	if b.ext != nil && b.ext.timer != nil {
		b.ext.timer.Stop()
		b.ext.timer = nil
	}
	if from := State(old & stateMask); to == Closed || to == MetricsOnly || to == HalfOpen || from == HalfOpen {
		b.clearWindow()
	}
	switch to {
	case Closed:
		if b.ext != nil {
			b.ext.openings = 0
		}
	case Open:
		x := b.extLocked()
		x.openUntil = clock.Now() + int64(wait)
		x.timer = time.AfterFunc(wait, func() { b.onTimer(gen) })
	case HalfOpen:
		b.issued = 0
		if b.set.Value().maxHalf > 0 {
			b.extLocked().timer = time.AfterFunc(b.set.Value().maxHalf, func() { b.onTimer(gen) })
		}
	}
	tr := Transition{From: State(old & stateMask), To: to, Cause: r, Generation: gen, FailureRate: fr, SlowCallRate: sr}
	if to == Open {
		tr.Wait = wait
	}
	return tr
}

// openWait returns the wait of the b.ext.openings-th opening since the breaker
// was CLOSED: WaitInOpen × WaitInOpenMultiplier^(openings−1), at most
// MaxWaitInOpen, spread by WaitInOpenJitter. b.mu must be held.
func (b *Breaker) openWait() time.Duration {
	s := b.set.Value()
	wait := float64(s.waitOpen)
	for i := int32(1); i < b.ext.openings && wait < float64(s.maxOpen); i++ {
		wait *= s.openMultiplier
	}
	if s.openMultiplier > 1 {
		wait = min(wait, float64(s.maxOpen))
	}
	if s.openJitter > 0 {
		wait *= 1 + s.openJitter*(2*rand.Float64()-1)
	}
	return time.Duration(max(wait, 1))
}

// bits returns the count window's bitsets.
func (b *Breaker) bits() []uint64 {
	if b.ext != nil && b.ext.bits != nil {
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
			if clock.Now() < b.ext.openUntil {
				break // OpenFor extended the wait after the timer fired: it fires again then
			}
			tr = b.moveLocked(HalfOpen, CauseWaitElapsed, 0, 0)
		case HalfOpen:
			tr = b.moveLocked(Open, CauseHalfOpenTimeout, 0, 0)
		}
	}
	b.mu.Unlock()
	b.notify(tr)
}

// notify delivers tr, if it is one, outside the lock.
func (b *Breaker) notify(tr Transition) {
	if tr.Cause == 0 || b.onChange == nil {
		return
	}
	defer func() { _ = recover() }()
	b.onChange(tr)
}

// SetState moves the breaker to s at once, in a new generation: results of
// permits given out before are ignored. Use it for operator overrides
// (ForcedOpen, Disabled, MetricsOnly) and to reset (Closed, with an empty
// window). Moving to Open starts the wait for HALF_OPEN as usual.
//
// As in Resilience4j, CLOSED cannot move to HALF_OPEN, nor METRICS_ONLY to
// OPEN or HALF_OPEN: SetState then returns a *TransitionError and changes
// nothing. Setting the state the breaker is in starts it afresh (a CLOSED
// breaker with an empty window, a new wait in OPEN) but is no transition:
// OnStateChange is not called.
func (b *Breaker) SetState(s State) error {
	if s > MetricsOnly {
		return fmt.Errorf("circuit: SetState(%v): no such state", s)
	}
	b.mu.Lock()
	from := State(b.word.Load() & stateMask)
	if from == Closed && s == HalfOpen || from == MetricsOnly && (s == Open || s == HalfOpen) {
		b.mu.Unlock()
		return &TransitionError{From: from, To: s}
	}
	tr := b.moveLocked(s, CauseManual, 0, 0)
	b.mu.Unlock()
	if from != s {
		b.notify(tr)
	}
	return nil
}

// OpenFor opens the breaker for d, instead of its own wait in OPEN:
// Resilience4j's transitionToOpenStateFor, for an upstream that asked for a
// pause (a Retry-After). Trial calls follow in HALF_OPEN as usual. An OPEN
// breaker stays OPEN until the later of its own end and d from now. In a
// state an operator set (DISABLED, FORCED_OPEN, METRICS_ONLY) it does
// nothing; it reports whether the breaker is OPEN for d.
func (b *Breaker) OpenFor(d time.Duration) bool {
	if d <= 0 {
		return false
	}
	b.mu.Lock()
	var tr Transition
	switch State(b.word.Load() & stateMask) {
	case Open:
		if until := clock.Now() + int64(d); until > b.ext.openUntil {
			b.ext.openUntil = until
			b.ext.timer.Reset(d)
		}
	case Closed, HalfOpen:
		tr = b.moveForLocked(Open, CauseOpenFor, 0, 0, d)
	default:
		b.mu.Unlock()
		return false
	}
	b.mu.Unlock()
	b.notify(tr)
	return true
}

// Metrics is a snapshot of a breaker, with what Resilience4j's
// CircuitBreaker.Metrics reports.
type Metrics struct {
	State State
	// Calls, Failed and Slow count the outcomes in the current window: the
	// sliding window in CLOSED and METRICS_ONLY, the trial calls in
	// HALF_OPEN (Resilience4j's buffered, failed and slow calls). The
	// window is emptied when the breaker enters CLOSED, METRICS_ONLY or
	// HALF_OPEN, and when it leaves HALF_OPEN; in the other states it keeps
	// what it held when they were entered (in OPEN after CLOSED, the window
	// that opened the breaker; after failed trials, nothing).
	Calls, Failed, Slow int
	// FailureRate and SlowCallRate are the percentages of failed and of
	// slow calls among Calls, or -1 while Calls is below the minimum number
	// of calls (MinimumCalls; in HALF_OPEN, the trial calls that decide).
	FailureRate, SlowCallRate float64
	// NotPermitted counts the calls refused in the current state: while
	// OPEN or FORCED_OPEN, and in HALF_OPEN with every trial slot taken.
	NotPermitted int64
	// TrialsInFlight is the number of HALF_OPEN trial permits not yet
	// resolved.
	TrialsInFlight int
	// Openings counts the openings since the breaker was last CLOSED (the
	// wait in OPEN backs off with it, see Config.WaitInOpenMultiplier).
	Openings   int
	Generation uint64
}

// Metrics returns a snapshot. It costs a lock, never the admission path.
func (b *Breaker) Metrics() Metrics {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.word.Load()
	s := b.set.Value()
	m := Metrics{State: State(w & stateMask), Generation: w >> 8, NotPermitted: b.notPermitted.Load().sum()}
	if b.ext != nil {
		m.Openings = int(b.ext.openings)
	}
	minimum := s.minCalls
	switch {
	case m.State == HalfOpen:
		m.Calls, m.Failed, m.Slow = int(b.count.n), int(b.count.fail), int(b.count.slo)
		m.TrialsInFlight = int(b.issued - b.count.n)
		minimum = s.halfMin
	case s.windowType == TimeBased:
		tw := &b.ext.time
		tw.advance(floorDiv(clock.Now(), 1e9))
		m.Calls, m.Failed, m.Slow = int(tw.n), int(tw.fail), int(tw.slo)
	default:
		m.Calls, m.Failed, m.Slow = int(b.count.n), int(b.count.fail), int(b.count.slo)
	}
	m.FailureRate, m.SlowCallRate = -1, -1
	if m.Calls > 0 && m.Calls >= int(minimum) {
		m.FailureRate = float64(m.Failed) * 100 / float64(m.Calls)
		m.SlowCallRate = float64(m.Slow) * 100 / float64(m.Calls)
	}
	return m
}
