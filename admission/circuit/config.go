package circuit

import (
	"fmt"
	"math"
	"time"

	"github.com/outboundhq/outbound/internal/cfgerr"
)

// WindowType says how the closed-state sliding window is measured.
type WindowType uint8

const (
	// CountBased keeps the outcomes of the last WindowSize calls.
	CountBased WindowType = iota
	// TimeBased keeps the outcomes of the calls of the last WindowSize
	// seconds, in one-second buckets.
	TimeBased
)

func (w WindowType) String() string {
	switch w {
	case CountBased:
		return "count-based"
	case TimeBased:
		return "time-based"
	}
	return fmt.Sprintf("WindowType(%d)", uint8(w))
}

// Config configures a Breaker. Every zero value means the default given in
// its comment; the defaults are Resilience4j's, except MaxWaitInHalfOpen,
// which Resilience4j leaves infinite.
type Config struct {
	// FailureRateThreshold is the percentage of failed calls in the window,
	// in (0, 100], at or above which the breaker opens. Default 50.
	FailureRateThreshold float64

	// SlowCallRateThreshold is the percentage of slow calls in the window,
	// in (0, 100], at or above which the breaker opens. Default 100.
	SlowCallRateThreshold float64

	// SlowCallDuration is the duration above which a call counts as slow,
	// whether it succeeded or failed: a call that lasts exactly this long
	// is not slow. Default 60s.
	SlowCallDuration time.Duration

	// WindowType selects a count-based (default) or time-based window.
	WindowType WindowType

	// WindowSize is the window's length: calls for CountBased, seconds for
	// TimeBased. Default 100 calls, or 60 seconds for TimeBased.
	WindowSize int

	// MinimumCalls is how many calls the window must hold before the rates
	// are evaluated. Default 100. For a count-based window it is capped at
	// WindowSize, as in Resilience4j.
	MinimumCalls int

	// WaitInOpen is how long the breaker stays OPEN before it moves to
	// HALF_OPEN on its own: the first time it opens after being CLOSED.
	// Default 60s.
	WaitInOpen time.Duration

	// WaitInOpenMultiplier makes the wait in OPEN back off: each opening
	// since the breaker was last CLOSED (a failed round of trial calls
	// reopens it) waits WaitInOpenMultiplier times the one before, up to
	// MaxWaitInOpen, so that a long outage is probed less and less often.
	// Zero or 1 means a fixed wait (the default); otherwise at least 1.
	WaitInOpenMultiplier float64

	// MaxWaitInOpen bounds a wait in OPEN that backs off, before
	// WaitInOpenJitter spreads it (so that clients at the cap do not probe
	// in lockstep either). Zero means 20 times WaitInOpen.
	MaxWaitInOpen time.Duration

	// WaitInOpenJitter spreads each wait in OPEN uniformly over ±
	// WaitInOpenJitter of itself, in [0, 1), so that a fleet of clients
	// does not probe a recovering upstream in lockstep. Default 0.
	WaitInOpenJitter float64

	// PermittedCallsInHalfOpen is the number of trial calls allowed in
	// HALF_OPEN. The breaker decides once the smaller of it and
	// MinimumCalls have finished, on the rates of those finished so far, as
	// Resilience4j does. Default 10.
	PermittedCallsInHalfOpen int

	// MaxWaitInHalfOpen bounds the time spent in HALF_OPEN: when it passes
	// before the trial calls have decided, the breaker goes back to OPEN
	// and will offer fresh trial slots after WaitInOpen, so a trial permit
	// that is never resolved cannot keep the breaker stuck. Default 60s.
	// A negative value means "wait forever" (Resilience4j's default) and is
	// not recommended.
	MaxWaitInHalfOpen time.Duration

	// StartState is the state a new breaker starts in: Closed (the
	// default), or a state an operator would set — Disabled (admits,
	// records nothing), MetricsOnly (records, never opens) or ForcedOpen —
	// so that breakers can be rolled out observing first.
	StartState State

	// OnStateChange, if set, is called after every state transition,
	// outside the breaker's lock, possibly concurrently and possibly after
	// a later transition has happened. A panic in it is recovered. A
	// transition to the state the breaker is already in (SetState of the
	// current state) is not one.
	OnStateChange func(Transition)
}

// settings is a validated Config with the defaults filled in.
type settings struct {
	failPct, slowPct float64
	slowDur          int64
	windowType       WindowType
	windowSize       int32
	minCalls         int32
	waitOpen         time.Duration
	openMultiplier   float64 // 1: a fixed wait
	maxOpen          time.Duration
	openJitter       float64
	permitted        int32
	halfMin          int32         // trial calls after which HALF_OPEN decides: min(permitted, minCalls)
	maxHalf          time.Duration // <0: forever
	start            State
}

func (c Config) settings() (settings, error) {
	s := settings{
		failPct:    orF(c.FailureRateThreshold, 50),
		slowPct:    orF(c.SlowCallRateThreshold, 100),
		slowDur:    int64(orD(c.SlowCallDuration, 60*time.Second)),
		windowType: c.WindowType,
		waitOpen:   orD(c.WaitInOpen, 60*time.Second),
		maxHalf:    orD(c.MaxWaitInHalfOpen, 60*time.Second),
	}
	rate := func(name string, v float64) error {
		if !(v > 0 && v <= 100) {
			return cfgerr.New("circuit", name, "must be in (0, 100], got %v", v)
		}
		return nil
	}
	count := func(name string, v, def int) (int32, error) {
		if v < 0 || v > math.MaxInt32/2 {
			return 0, cfgerr.New("circuit", name, "must be in [0, %d], got %d", math.MaxInt32/2, v)
		}
		if v == 0 {
			v = def
		}
		return int32(v), nil
	}
	var err error
	if err = rate("FailureRateThreshold", s.failPct); err != nil {
		return s, err
	}
	if err = rate("SlowCallRateThreshold", s.slowPct); err != nil {
		return s, err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"SlowCallDuration", c.SlowCallDuration}, {"WaitInOpen", c.WaitInOpen}} {
		if d.v < 0 {
			return s, cfgerr.New("circuit", d.name, "must be >= 0, got %v", d.v)
		}
	}
	switch c.WindowType {
	case CountBased:
		s.windowSize, err = count("WindowSize", c.WindowSize, 100)
	case TimeBased:
		s.windowSize, err = count("WindowSize", c.WindowSize, 60)
		if err == nil && s.windowSize > 3600 {
			err = cfgerr.New("circuit", "WindowSize", "of a time-based window must be at most 3600 seconds, got %d", s.windowSize)
		}
	default:
		err = cfgerr.New("circuit", "WindowType", "must be CountBased or TimeBased, got %d", uint8(c.WindowType))
	}
	if err != nil {
		return s, err
	}
	if s.minCalls, err = count("MinimumCalls", c.MinimumCalls, 100); err != nil {
		return s, err
	}
	if s.windowType == CountBased {
		s.minCalls = min(s.minCalls, s.windowSize)
	}
	if s.permitted, err = count("PermittedCallsInHalfOpen", c.PermittedCallsInHalfOpen, 10); err != nil {
		return s, err
	}
	s.halfMin = min(s.permitted, s.minCalls)
	s.openMultiplier = orF(c.WaitInOpenMultiplier, 1)
	s.maxOpen = orD(c.MaxWaitInOpen, 20*s.waitOpen)
	s.openJitter = c.WaitInOpenJitter
	switch {
	case !(s.openMultiplier >= 1) || math.IsInf(s.openMultiplier, 0):
		return s, cfgerr.New("circuit", "WaitInOpenMultiplier", "must be 0 or at least 1, got %v", c.WaitInOpenMultiplier)
	case c.MaxWaitInOpen < 0 || c.MaxWaitInOpen > 0 && c.MaxWaitInOpen < s.waitOpen:
		return s, cfgerr.New("circuit", "MaxWaitInOpen", "must be 0 or at least WaitInOpen (%v), got %v", s.waitOpen, c.MaxWaitInOpen)
	case !(s.openJitter >= 0 && s.openJitter < 1):
		return s, cfgerr.New("circuit", "WaitInOpenJitter", "must be in [0, 1), got %v", c.WaitInOpenJitter)
	}
	switch c.StartState {
	case Closed, Disabled, MetricsOnly, ForcedOpen:
		s.start = c.StartState
	default:
		return s, cfgerr.New("circuit", "StartState", "must be CLOSED, DISABLED, METRICS_ONLY or FORCED_OPEN, got %v", c.StartState)
	}
	return s, nil
}

func orF(v, def float64) float64 {
	if v == 0 {
		return def
	}
	return v
}

func orD(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}
