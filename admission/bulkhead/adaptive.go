package bulkhead

import (
	"context"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/criticality"
)

// The adaptive mode (Config.Adaptive) learns the limit from the latency of
// answered attempts, in windows of at least minWindow answers (and at least
// twice the limit's worth, about two round trips of every slot, up to
// maxWindowSize: a window of one round trip closed just after the limit
// moved holds the short answers of the attempts just sent, not yet their
// long ones, and reads low). Each window's mean latency is compared with the
// uncongested latency, the lowest window mean
// of the last baselineWindows windows (corrected for the noise of those
// means):
//
//   - more than Tolerance above it, the upstream is queueing: with a queue
//     of q attempts ahead of its capacity C, latency grows as (C+q)/C, so
//     the limit is scaled down by the ratio, to within half the tolerance
//     above the capacity, in one window;
//   - less than a quarter of the tolerance above it, and the limit was
//     reached in the window (the demand is there), the limit grows: it
//     doubles until a queue first shows (from the default of 20, a capacity
//     of 800 is found in 7 windows), then creeps, faster with every window
//     in a row that grew it (see next2); a limit that is never reached
//     never grows, so it cannot creep upward at a constant load below it;
//   - in between, it holds.
//
// Two kinds of window run below the limit on purpose: after the first queue
// seen, probes at halves of the limit, in case the slow start began above
// the capacity (every window then queued, and the baseline is a queue's);
// and every refreshEvery windows one at half the limit, so that the ring
// always holds an uncongested window (one round trip's worth of answers
// is enough for that one).
//
// A sample is counted at most maxSampleRatio times the uncongested latency,
// so a slow tail (a few answers 100 times slower, which is not queueing)
// moves a window's mean little, while a real queue still shows in every
// answer. Only answered attempts feed it: a local rejection, an attempt that
// was never sent, one the caller cancelled or a hedge cancelled as the loser
// is released without a latency (Release), and a failure without an answer
// (a timeout) says nothing about the queue either: an upstream that drops
// every request for a while leaves the limit where it was.
const (
	minWindow       = 50
	defaultInitial  = 20
	baselineWindows = 64
	maxSampleRatio  = 3
	refreshEvery    = baselineWindows * 3 / 4
	growth          = 2

	// The packing of adaptive.slots, so that an answer gives its slot back
	// and adds itself to the window in progress in one addition: the slots
	// in use in the low slotBits bits, the answers of the window above
	// them, and the sum of their latencies (each at most maxUnits units) in
	// the top bits. The limit never exceeds MaxAdaptive, so the slots never
	// reach the count. A window closes at maxWindowSize answers at most,
	// with those that arrive while it closes (each of their callers waits
	// for the close): the count has room for 2^countBits of them, the sum
	// for 2^17 at the cap. A sum that overflowed would only wrap at the top
	// of the word and spoil one window's mean, never the slot count.
	slotBits   = 17
	slotMask   = 1<<slotBits - 1
	countShift = slotBits
	countBits  = 18
	countMask  = 1<<countBits - 1
	sumShift   = countShift + countBits
	maxUnits   = 1<<12 - 1

	maxWindowSize = 1 << 13

	// The squared latencies, for the noise of a window's mean, come from
	// every answer of a window of up to maxSquared answers, and from one
	// answer in 2^k, evenly spread, of a longer one (at most maxSquared
	// of them): an addition of its own, which the answers of a long window
	// mostly skip.
	maxSquared = 512

	// MaxAdaptive is the highest MaxConcurrent of an adaptive Bulkhead.
	MaxAdaptive = 1 << 16
)

type adaptive struct {
	min, max int64
	tol      float64

	limit atomic.Int64
	// The slots in use, and the answers of the window in progress with the
	// sum of their latencies, capped, in units of unit (see slotBits).
	slots   atomic.Int64
	reached atomic.Bool // the limit was reached in the window in progress

	skip    atomic.Int64 // answers not to count: attempts admitted before the last window closed
	squares atomic.Int64 // the sum of the squared latencies of the answers sampled (see sqEvery)
	sqEvery atomic.Int64 // 2^k - 1: the answers whose count in the window it masks to 0 add their squares
	first   atomic.Int64 // the latencies (ns) added while unit was 0
	unit    atomic.Int64 // 1 + the shift that takes latencies (ns) to about 1024ths of base; 0 before the first window
	size    atomic.Int64 // answers that close the window
	base    atomic.Int64 // the uncongested latency (ns); 0 before the first window
	wins    atomic.Int64 // windows closed

	mu        sync.Mutex
	means     [baselineWindows]int64   // the last windows' mean latencies, a ring
	errs      [baselineWindows]float64 // and the relative standard errors of those means
	next      int
	probe     int64 // probing down (see next2): the last limit above the capacity, 0 if not
	probeMean int64 // the mean latency at probe
	// The limit of the last probe window whose latency was lower than the
	// one before it, and that latency: above the capacity if halving it
	// lowers the latency again.
	candidate, candidateMean int64
	resume                   int64   // the limit to return to after a refresh window, 0 if none
	clean                    int     // windows in a row that grew the limit
	noise                    float64 // the relative standard error of the baseline window's mean
	queued                   bool    // a window has shown a queue: the limit left its slow start
}

func newAdaptive(cfg Config) *adaptive {
	a := &adaptive{min: int64(cfg.MinConcurrent), max: int64(cfg.MaxConcurrent), tol: cfg.Tolerance}
	if a.min == 0 {
		a.min = 1
	}
	if a.tol == 0 {
		a.tol = 0.05
	}
	initial := int64(cfg.InitialConcurrent)
	if initial == 0 {
		initial = min(a.max, max(a.min, defaultInitial))
	}
	a.limit.Store(initial)
	a.resize(windowSize(initial, 2))
	return a
}

// resize sets the answers that close the window in progress, and which of
// them add their squares.
func (a *adaptive) resize(n int64) {
	a.size.Store(n)
	a.sqEvery.Store(1<<max(bits.Len64(uint64(n-1))-bits.Len64(maxSquared-1), 0) - 1)
}

// tryFor is tryAcquire for a call of the criticality ctx carries, looked
// up only near the limit (see Bulkhead.reserve).
func (a *adaptive) tryFor(h *Bulkhead, ctx context.Context) (bool, criticality.Level) {
	l := criticality.Default
	looked := false
	for {
		v, lim := a.slots.Load(), a.limit.Load()
		n := v & slotMask
		var r int64
		if lim-n <= tenth(lim) {
			if !looked {
				l, looked = criticality.Of(ctx), true
			}
			r = h.reserve(l, lim)
		}
		if n >= lim-r {
			// Refused at the limit, or within the room kept for critical
			// calls: either way the limit binds, and may grow.
			a.markReached()
			return false, l
		}
		if a.slots.CompareAndSwap(v, v+1) {
			if n+1 >= lim {
				a.markReached()
			}
			return true, l
		}
	}
}

func (a *adaptive) tryAcquire() bool {
	for {
		v, l := a.slots.Load(), a.limit.Load()
		n := v & slotMask
		if n >= l {
			a.markReached()
			return false
		}
		if a.slots.CompareAndSwap(v, v+1) {
			if n+1 >= l {
				a.markReached()
			}
			return true
		}
	}
}

func (a *adaptive) markReached() {
	if !a.reached.Load() {
		a.reached.Store(true)
	}
}

// release gives a slot back; answered says that elapsed is the latency of
// an answer, which the limit learns from. It reports by how much the limit
// grew (the waiters to wake beyond the one the slot is for).
func (a *adaptive) release(elapsed time.Duration, answered bool) int64 {
	if !answered || a.skip.Load() > 0 && a.skip.Add(-1) >= 0 {
		// No latency, or the answer of an attempt in flight when the last
		// window closed: admitted under the limit before, it tells of
		// that one.
		a.giveBack(-1)
		return 0
	}
	ns := max(int64(elapsed), 1)
	if b := a.base.Load(); b > 0 {
		ns = min(ns, maxSampleRatio*b)
	}
	d := int64(1)<<countShift - 1 // one more answer, its slot given back
	u := a.unit.Load()
	if u == 0 {
		a.first.Add(ns)
	} else {
		d += units(ns, u) << sumShift
	}
	n := a.giveBack(d) >> countShift & countMask
	if u > 0 && n&a.sqEvery.Load() == 0 {
		// Truncated, not rounded as the sum is: the simulations of
		// bench/overload_test.go are tuned on this estimate of the noise,
		// and one in two answers squared was not enough for it in their
		// short windows.
		x := ns >> (u - 1)
		a.squares.Add(x * x)
	}
	if n < a.size.Load() {
		return 0
	}
	return a.closeWindow()
}

// giveBack adds d to slots (a slot given back, -1, with an answer for the
// window or not) and returns the sum.
func (a *adaptive) giveBack(d int64) int64 {
	v := a.slots.Add(d)
	if (v+1)&slotMask == 0 { // the slots were at 0: borrowed from the count
		panic("bulkhead: released more than held")
	}
	return v
}

// inUse returns the slots in use.
func (a *adaptive) inUse() int64 { return a.slots.Load() & slotMask }

// takeWindow empties the window in progress, leaving the slots in use, and
// returns its answers and the sum of their latencies in units.
func (a *adaptive) takeWindow() (n, sum int64) {
	for {
		v := a.slots.Load()
		if a.slots.CompareAndSwap(v, v&slotMask) {
			return v >> countShift & countMask, int64(uint64(v) >> sumShift)
		}
	}
}

// units is ns in units of unit u (> 0), rounded, at most maxUnits.
func units(ns, u int64) int64 {
	return min((ns+(1<<(u-1))>>1)>>(u-1), maxUnits)
}

// windowSize is the number of answers of a window at limit l that lasts
// about trips round trips of every slot.
func windowSize(l, trips int64) int64 { return min(max(trips*l, minWindow), maxWindowSize) }

// closeWindow ends the window in progress and adjusts the limit.
func (a *adaptive) closeWindow() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.slots.Load()>>countShift&countMask < a.size.Load() {
		return 0 // another release closed it
	}
	n, inUnits := a.takeWindow()
	unit, every := a.unit.Load(), a.sqEvery.Load()
	sum := a.first.Swap(0)
	if unit > 0 {
		sum += inUnits << (unit - 1)
	}
	sq := a.squares.Swap(0)
	reached := a.reached.Swap(false)
	mean := max(sum/n, 1)
	l := a.limit.Load()
	var se float64 // the standard error of the window's mean, relative to it
	if unit > 0 {
		u := float64(int64(1) << (unit - 1))
		sampled := max(n/(every+1), 1)
		v := max(float64(sq)/float64(sampled)*u*u-float64(mean)*float64(mean), 0)
		se = math.Sqrt(v/float64(n)) / float64(mean)
	}
	a.means[a.next], a.errs[a.next] = mean, se
	a.next = (a.next + 1) % baselineWindows
	before := a.base.Load()
	base := mean
	a.noise = se
	for i, m := range a.means {
		if m > 0 && m < base {
			// The lowest of baselineWindows noisy means is about two
			// of its standard errors below the true one. That window's
			// error, not the latest's: the latest may be noisy because
			// of a queue (some answers wait, some do not).
			base, a.noise = m, a.errs[i]
		}
	}
	a.base.Store(base)
	w := a.wins.Add(1)

	a.unit.Store(1 + int64(max(bits.Len64(uint64(base)), 10)-10))
	nl := a.next2(l, mean, base, before, reached)
	if a.queued && a.probe == 0 && a.resume == 0 && w%refreshEvery == 0 {
		// At the limit it settles at, every answer waits a little in the
		// queue: the uncongested latency is seen only below it. Once in a
		// while one window runs at half the limit, so that the lowest
		// latency in the ring stays an uncongested one and the limit
		// cannot creep up as older windows leave the ring. (A tolerance
		// lower is not enough: once the limit is that far above the
		// capacity, the check is congested too, and the creep feeds
		// itself.) It costs a fraction 1/(2·refreshEvery) of the goodput.
		a.resume = nl
		nl /= 2
	}
	nl = min(max(nl, a.min), a.max)
	a.limit.Store(nl)
	trips := int64(2)
	if a.resume > 0 { // a refresh window: one round trip is enough to see the uncongested latency
		trips = 1
	}
	a.resize(windowSize(nl, trips))
	if nl != l {
		a.skip.Store(a.inUse())
	}
	return max(nl-l, 0)
}

// next2 returns the limit after a window at limit l whose mean latency was
// mean, the uncongested latency being base now and before before it.
func (a *adaptive) next2(l, mean, base, before int64, reached bool) int64 {
	// The baseline is the lowest of many noisy means: about two of its
	// standard errors below the mean it estimates. Corrected for that,
	// noisy answers neither look like a queue nor hide one.
	ratio := float64(mean) / (float64(base) * (1 + 2*a.noise))
	switch {
	case a.probe > 0:
		// Probing down: a window at half the limit before it. Lower
		// latency by more than the tolerance means the limit before
		// was above the capacity, and the baseline was a queue's: halve
		// again. Otherwise the limit before was not: go back to the last
		// one that was, scaled by its latency over the baseline now known.
		if float64(mean) < float64(before)*(1-a.tol) && l/2 >= a.min {
			if a.candidate > 0 { // the probe before this one was above it
				a.probe, a.probeMean = a.candidate, a.candidateMean
			}
			a.candidate, a.candidateMean = l, mean
			return l / 2
		}
		nl := a.probe
		if r := float64(a.probeMean) / float64(base); r > 1+a.tol {
			nl = int64(math.Floor(float64(nl) * (1 + a.tol/2) / r))
		}
		a.probe, a.candidate = 0, 0
		return nl
	case a.resume > 0: // a refresh window: back to where it was
		nl := a.resume
		a.resume = 0
		return nl
	case ratio > 1+a.tol:
		nl := int64(math.Floor(float64(l) * (1 + a.tol/2) / ratio))
		if !a.queued {
			// The first queue seen. The baseline came from the slow
			// start, which may have begun above the capacity (its every
			// window queued): probe down from half the new limit.
			a.queued = true
			a.probe, a.probeMean = l, mean
			nl /= 2
		}
		a.clean = 0
		return nl
	case ratio < 1+a.tol/4 && reached:
		// Slow start: until a queue shows, it doubles. Then a quarter of
		// the tolerance, three times as much for every window in a row
		// that grew it: near the capacity it creeps up to where the queue
		// starts to show; far below it (the capacity grew) it doubles
		// again within a few windows.
		f := float64(growth)
		if a.queued {
			f = min(1+a.tol/4*math.Pow(3, float64(min(a.clean, 20))), growth)
		}
		a.clean++
		return int64(math.Ceil(float64(l) * f))
	}
	a.clean = 0
	return l
}

// Limit reports the current limit of an adaptive Bulkhead, or MaxConcurrent
// for a fixed one (0 for a nil, unlimited Bulkhead).
func (h *Bulkhead) Limit() int {
	switch {
	case h == nil:
		return 0
	case h.ad != nil:
		return int(h.ad.limit.Load())
	}
	return int(h.max)
}

// Adaptive reports whether the limit is adaptive (Config.Adaptive).
func (h *Bulkhead) Adaptive() bool { return h != nil && h.ad != nil }

// Windows reports how many sampling windows an adaptive Bulkhead has closed
// (each may have moved the limit); 0 for a fixed one.
func (h *Bulkhead) Windows() int {
	if h == nil || h.ad == nil {
		return 0
	}
	return int(h.ad.wins.Load())
}
