package outbound

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/internal/clock"
)

// Hedging configures hedged attempts: when an attempt has not answered
// within a delay, another is sent beside it, and the first answer that ends
// the call (one whose status is not retried) wins: the backup requests of
// "The Tail at Scale". Hedges are attempts, and Config.MaxAttempts (or
// WithMaxAttempts) bounds them with the others: a call of one attempt is not
// hedged. Only a call that could be retried
// after an ambiguous failure is hedged — an idempotent method, or, with
// Keyed, one that carries an Idempotency-Key — and only with a replayable
// body (none, or one with GetBody): a one-shot body is never sent twice.
//
// Every hedge is an attempt: it passes the circuit breaker, the rate limiter
// and the bulkhead (one they refuse is not sent, and gives its permits back
// as usual), is classified, and appears in the call's outcome
// (outcome.Attempt.Hedge). When an attempt's answer ends the call, the
// others are cancelled (outcome.Attempt.Lost), their permits come back, and
// the breaker records them as neither success nor failure. An upstream's
// hedges are bounded by an allowance: each hedged round earns twice
// ExtraLoad of a hedge, up to a burst of 32, and a hedge spends one (one a
// local guard refuses gives it back), so under saturation hedges add at most
// twice ExtraLoad, with a fixed Delay too. None is sent while the upstream's
// retry budget holds half or less (it is failing, not slow), and none in
// flight is ever cancelled for either. A hedge withheld is told to
// Hooks.BudgetExhausted and counted in outcome.Outcome.HedgesWithheld.
//
// The delay's passing is taken as a sign that the attempt is slow only when
// something says so: a hedge waits, a quarter of the delay at a time and at
// most one delay more, while the attempt's answer is arriving (its first
// bytes have reached the machine) or while every attempt of the upstream
// that started after it is unanswered too (a busy machine, or an upstream
// stalled as a whole, makes every attempt pass the delay together; a hedge
// would be as slow). An attempt alone is hedged at the delay.
//
// A hedge asks the upstream's connection pool like any attempt: over
// HTTP/1.1 it gets another connection (the first is busy), over HTTP/2 it
// may share the first's connection. Dialing a new one on purpose would add
// a round trip and a TLS handshake to every hedge — often more than the tail
// it is meant to cut — while a connection that stops answering is ended by
// its own timeouts.
type Hedging struct {
	// Delay is how long an attempt runs before a hedge is sent beside it.
	// Zero means adaptive: the latency within which the upstream answered
	// 1 − ExtraLoad of its recent attempts, so that hedges add about
	// ExtraLoad to the attempts sent (Finagle's maxExtraLoad) — less where
	// the waits described above hold hedges back, as on a busy machine.
	// Until an upstream has answered enough attempts to tell (64), adaptive
	// hedging sends no hedge.
	Delay time.Duration

	// ExtraLoad is the share of extra attempts adaptive hedging aims for;
	// twice it bounds the hedges of any delay. Zero means 0.05; at most
	// 0.5.
	ExtraLoad float64

	// MaxHedges is the most hedges of one call. Zero means 1.
	MaxHedges int

	// Keyed also hedges calls with a non-idempotent method (POST, PATCH)
	// that carry an Idempotency-Key header, which the upstream must honour.
	Keyed bool
}

func (h *Hedging) validate() error {
	if h == nil {
		return nil
	}
	switch {
	case h.Delay < 0:
		return cfgerr.New("outbound", "Hedging.Delay", "must be >= 0, got %v", h.Delay)
	case !(h.ExtraLoad >= 0 && h.ExtraLoad <= 0.5):
		return cfgerr.New("outbound", "Hedging.ExtraLoad", "must be in [0, 0.5], got %v", h.ExtraLoad)
	case h.MaxHedges < 0 || h.MaxHedges > 10:
		return cfgerr.New("outbound", "Hedging.MaxHedges", "must be in [0, 10], got %d", h.MaxHedges)
	}
	return nil
}

func (h *Hedging) maxHedges() int {
	if h.MaxHedges == 0 {
		return 1
	}
	return h.MaxHedges
}

func (h *Hedging) extraLoad() float64 {
	if h.ExtraLoad == 0 {
		return 0.05
	}
	return h.ExtraLoad
}

func (h *Hedging) quantile() float64 { return 1 - h.extraLoad() }

// clone returns a copy of h (nil for nil), so that a caller's later change
// to it races with no call.
func (h *Hedging) clone() *Hedging {
	if h == nil {
		return nil
	}
	hc := *h
	return &hc
}

// hedgeAllowance bounds an upstream's hedges: each hedged round (a call's
// first attempt with a hedging timer, whether or not it sent a hedge) earns
// twice its ExtraLoad of a hedge, up to a burst of hedgeBurst hedges, and a
// hedge spends one. It is kept as what was spent, so that its zero value is
// a full allowance.
type hedgeAllowance struct{ spent atomic.Int64 } // in thousandths of a hedge

// hedgeBurst is how many hedges an upstream may send at once beyond what
// its rounds earned: a short stall of the client or the upstream makes
// every call in flight pass the delay together. In BenchmarkHedging (16
// callers, 2 cores) a burst of 10 withheld the hedges of 1.2–1.4% of the
// calls; 32, of 0–0.2% (docs/DESIGN.md, "Hedging").
const hedgeBurst = 32

// earn credits one round of a call hedging with extraLoad.
func (a *hedgeAllowance) earn(extraLoad float64) { a.credit(int64(2 * extraLoad * 1000)) }

// giveBack returns a hedge that never left the process.
func (a *hedgeAllowance) giveBack() { a.credit(1000) }

// credit gives back d thousandths of a hedge, up to a full allowance.
func (a *hedgeAllowance) credit(d int64) {
	for {
		old := a.spent.Load()
		if old == 0 || a.spent.CompareAndSwap(old, max(old-d, 0)) {
			return
		}
	}
}

// tryTake spends a hedge if one is left, atomically.
func (a *hedgeAllowance) tryTake() bool {
	for {
		old := a.spent.Load()
		if old+1000 > hedgeBurst*1000 {
			return false
		}
		if a.spent.CompareAndSwap(old, old+1000) {
			return true
		}
	}
}

// attemptOrder follows the order in which an upstream's hedged calls'
// attempts start and are answered, so that a hedge timer can tell an
// attempt slow on its own from one slow with the others (sharedSlowness).
// Its zero value is ready to use.
type attemptOrder struct {
	// started is the start of the latest attempt, and answered the start
	// of the latest-started attempt that got an answer, both as clock.Now
	// less clock.Never: 0, the zero value, is before every attempt.
	started, answered atomic.Int64
}

// start notes that an attempt started at start (clock.Now). It is stored
// as is: of two attempts starting at once, the earlier may be kept, a few
// nanoseconds off.
func (o *attemptOrder) start(start int64) { o.started.Store(start - clock.Never) }

// answeredFrom notes that an attempt started at start got an answer.
func (o *attemptOrder) answeredFrom(start int64) {
	start -= clock.Never
	for {
		old := o.answered.Load()
		if start <= old || o.answered.CompareAndSwap(old, start) {
			return
		}
	}
}

// sharedSlowness reports whether an attempt started at start is slow with
// the others rather than on its own: attempts have started since, and none
// of them has been answered. A timer that fires says only that time has
// passed: on a busy machine, or behind an upstream that stalls as a whole,
// every attempt in flight passes the delay together, and hedges sent then
// are as slow as they are. An attempt that a later one overtook — or one
// alone, with nothing to compare it with — is slow on its own.
func (o *attemptOrder) sharedSlowness(start int64) bool {
	start -= clock.Never
	return o.started.Load() > start && o.answered.Load() <= start
}

// latency is a streaming estimate of an upstream's first attempts'
// latencies: weights in buckets spaced 16 to a doubling (4.4% wide) from
// 1 µs to over an hour, halved every latencyWindow samples so that it
// follows the upstream's recent behaviour. Recording is two atomic
// additions; a quantile reads the 512 counts.
type latency struct {
	n      atomic.Int64
	counts [latencyBuckets]atomic.Uint32
	halve  sync.Mutex
	late   atomic.Int64 // how late the hedge timers fire, smoothed (ns)

	// The share of rounds hedged, against the target: rounds and hedged
	// count this window; adj (millionths) corrects the quantile, so that
	// what the estimate cannot see — hedges' own load on the upstream, how
	// the answers cluster within a bucket — does not move the extra load.
	rounds, hedged atomic.Int64
	target, adj    atomic.Int64 // millionths

	// finishQ is the quantile of the latencies an attempt needs left
	// before its deadline (Config.FinishQuantile), 0 for none, and finish
	// that quantile, refreshed every finishEvery samples: 0 while there are
	// too few.
	finishQ float64
	finish  atomic.Int64
}

// finishEvery is how often, in samples, the time an attempt needs is
// computed again: a quantile reads 512 counts, a sample adds one.
const finishEvery = 32

// needs returns how long an attempt is expected to take — the quantile
// finishQ of the recent latencies — and 0 when that is not known.
func (l *latency) needs() time.Duration {
	if l == nil {
		return 0
	}
	return time.Duration(l.finish.Load())
}

// round counts a round of a call with hedging of extraLoad, and whether
// it sent a hedge.
func (l *latency) roundEnded(extraLoad float64, hedge bool) {
	l.target.Store(int64(extraLoad * 1e6))
	l.rounds.Add(1)
	if hedge {
		l.hedged.Add(1)
	}
}

// correct moves the quantile's correction by half the distance between the
// share of rounds hedged this window and the target: up by at most 4/5 of
// the target, down by at most twice the target (hedges that wait for
// evidence, see Hedging, are sent for fewer of the attempts past the
// delay), and never below the median; l.halve is held.
func (l *latency) correct() {
	rounds, hedged := l.rounds.Swap(0), l.hedged.Swap(0)
	if rounds < latencyWindow/4 {
		return
	}
	target := l.target.Load()
	off := hedged*1_000_000/rounds - target
	lowest := max(-2*target, target-500_000) // the quantile stays at 0.5 or above
	l.adj.Store(min(max(l.adj.Load()+off/2, lowest), target*4/5))
}

// timerLate records how late a hedge timer for delay fired (counted at most
// half the delay, which is the most it is ever armed early).
func (l *latency) timerLate(d, delay time.Duration) {
	d = min(max(d, 0), delay/2)
	old := l.late.Load()
	l.late.Store(old + (int64(d)-old)/8)
}

// early returns how much earlier than the delay a hedge timer must be armed
// to fire at the delay: timers fire late on a busy machine, and a hedge sent
// late is a hedge not sent for the attempts that answer meanwhile.
func (l *latency) early() time.Duration { return time.Duration(max(l.late.Load(), 0)) }

const (
	latencyPerDoubling = 16
	latencyBuckets     = 32 * latencyPerDoubling
	latencyWindow      = 500
	latencyMinSamples  = 64
	latencyOne         = 256 // a sample's weight: counts are kept in 1/256ths, so that halving keeps a sparse tail
)

func latencyBucket(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us <= 1 {
		return 0
	}
	return min(int(math.Log2(us)*latencyPerDoubling), latencyBuckets-1)
}

// record adds one answer's latency (or, for an attempt cancelled because
// another answered first, how long it had run: all that is known is that
// its answer would have come later).
func (l *latency) record(d time.Duration) {
	l.counts[latencyBucket(d)].Add(latencyOne)
	n := l.n.Add(1)
	if l.finishQ > 0 && n%finishEvery == 0 {
		if q, ok := l.at(l.finishQ); ok {
			l.finish.Store(int64(q))
		}
	}
	if n >= latencyWindow && l.halve.TryLock() {
		for i := range l.counts {
			c := &l.counts[i]
			for v := c.Load(); !c.CompareAndSwap(v, v/2); v = c.Load() {
			}
		}
		l.n.Store(0)
		l.correct()
		l.halve.Unlock()
	}
}

// quantile returns the latency below which a share q of the recorded ones
// lie (interpolated within its bucket), and false while there are too few.
func (l *latency) quantile(q float64) (time.Duration, bool) {
	return l.at(min(q+float64(l.adj.Load())/1e6, 0.999))
}

// at returns the latency below which a share q of the recorded ones lie,
// without quantile's correction for the hedges' load.
func (l *latency) at(q float64) (time.Duration, bool) {
	var counts [latencyBuckets]uint32
	var total uint64
	for i := range l.counts {
		counts[i] = l.counts[i].Load()
		total += uint64(counts[i])
	}
	if total < latencyMinSamples*latencyOne {
		return 0, false
	}
	target := q * float64(total)
	var sum float64
	for i, c := range counts {
		if c == 0 || sum+float64(c) < target {
			sum += float64(c)
			continue
		}
		// Within the bucket, as if its latencies were spread evenly.
		lo, hi := math.Exp2(float64(i)/latencyPerDoubling), math.Exp2(float64(i+1)/latencyPerDoubling)
		if i == 0 {
			lo = 0
		}
		us := lo + (hi-lo)*(target-sum)/float64(c)
		return time.Duration(us * float64(time.Microsecond)), true
	}
	return time.Duration(math.Exp2(latencyBuckets/latencyPerDoubling) * float64(time.Microsecond)), true
}

// latencies returns the latency estimate of the upstream s belongs to,
// made at its first use: by adaptive hedging, or a call with a deadline.
func (s *upstreamState) latencies() *latency {
	if l := s.lat.Load(); l != nil {
		return l
	}
	s.lat.CompareAndSwap(nil, &latency{finishQ: s.finishQ})
	return s.lat.Load()
}
