// Package throttle is client-side throttling, a guard of the admission
// pipeline: when an upstream accepts fewer of the attempts sent to it than
// it is sent, attempts are refused locally, before they cost the upstream
// anything, with the probability
//
//	max(0, (requests − K·accepts) / (requests + 1))
//
// (Google's SRE book, "Handling Overload"), at most MaxRejection, where
// requests counts the attempts that asked the throttle over the last Window
// (those it refused too: that is what lets the upstream see about K times
// what it accepts) and accepts the attempts that the upstream answered with
// a success. An attempt is counted when it is resolved (a refusal at once),
// so one in flight counts neither way: otherwise slow answers would look
// refused, and a healthy upstream with many calls in flight would be
// throttled. An upstream that accepts nothing receives, after a moment, one
// attempt in 1/(1−MaxRejection) (one in ten by default); one that accepts
// everything is never throttled.
//
// The throttle never counts the client's own refusals against the upstream:
// an attempt that a later guard refused, or that was never sent, or whose
// result said nothing about the upstream (the caller cancelled it, a hedge
// won) is resolved by Refund, which counts it neither way.
package throttle

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/internal/clock"
	"github.com/outboundhq/outbound/internal/clocked"
)

func init() {
	clocked.ThrottleAllow = (*Throttle).allowAt
	clocked.ThrottleAccept = (*Throttle).acceptAt
	clocked.ThrottleFail = (*Throttle).failAt
}

// ErrThrottled is the refusal of an attempt by the throttle.
var ErrThrottled = errors.New("throttle: refused locally: the upstream accepts too few of the attempts sent to it")

// Config configures a Throttle. The zero value means no throttle.
type Config struct {
	// Enabled turns the throttle on.
	Enabled bool

	// K is how many times what the upstream accepts it may be sent before
	// attempts are refused locally. Default 2; at least 1.
	K float64

	// Window is how far back requests and accepts are counted, in ten
	// steps. Default 30 s.
	Window time.Duration

	// MaxRejection caps the probability of a local refusal, so that some
	// attempts always reach the upstream and can see it recover. Default
	// 0.9; in (0, 1].
	MaxRejection float64
}

const buckets = 10

// Throttle is a client-side throttle. It is safe for concurrent use. A nil
// *Throttle admits everything.
//
// Each attempt costs one atomic addition, when it is resolved: to the
// current bucket's accepts or to its other requests. Allow only reads them,
// with the sums of the other buckets, which are computed when the window
// moves (every Window/10).
type Throttle struct {
	k, maxP float64
	width   int64 // ns per bucket

	next   atomic.Int64          // when the next bucket begins (clock.Now)
	cur    atomic.Int32          // the current bucket
	epoch  int64                 // clock.Now()/width of the current bucket; under mu
	others [buckets]atomic.Int64 // requests not accepted: refused, failed or declined
	acc    [buckets]atomic.Int64 // accepts
	// The sums of others and acc over the buckets but the current one, as
	// they were when the window last moved.
	pastOthers, pastAcc atomic.Int64
	mu                  sync.Mutex // moving the window
}

// New validates cfg and returns a Throttle, or nil when it is not Enabled.
// Errors name the offending field.
func New(cfg Config) (*Throttle, error) {
	switch {
	case !cfg.Enabled:
		if cfg != (Config{}) {
			return nil, cfgerr.New("throttle", "Enabled", "must be true when other fields are set, got %+v", cfg)
		}
		return nil, nil
	case cfg.K != 0 && !(cfg.K >= 1 && cfg.K <= 1000): // NaN too
		return nil, cfgerr.New("throttle", "K", "must be in [1, 1000], got %v", cfg.K)
	case cfg.Window < 0 || cfg.Window != 0 && cfg.Window < 10*time.Millisecond:
		return nil, cfgerr.New("throttle", "Window", "must be 0 or at least 10ms, got %v", cfg.Window)
	case cfg.MaxRejection != 0 && !(cfg.MaxRejection > 0 && cfg.MaxRejection <= 1):
		return nil, cfgerr.New("throttle", "MaxRejection", "must be in (0, 1], got %v", cfg.MaxRejection)
	}
	t := &Throttle{k: cfg.K, maxP: cfg.MaxRejection, width: int64(cfg.Window) / buckets}
	if t.k == 0 {
		t.k = 2
	}
	if t.maxP == 0 {
		t.maxP = 0.9
	}
	if t.width == 0 {
		t.width = int64(30*time.Second) / buckets
	}
	t.epoch = floorDiv(clock.Now(), t.width)
	t.cur.Store(int32(index(t.epoch)))
	t.next.Store((t.epoch + 1) * t.width)
	return t, nil
}

// Allow reports whether an attempt may go on. A refused one is counted as a
// request at once. An admitted one is resolved with Accept or Fail when the
// upstream's answer (or failure) says something of its load; one that says
// nothing (a later guard refused it, it was never sent, it was cancelled or
// a hedge won) is not resolved at all: it is counted neither way.
func (t *Throttle) Allow() bool { return t.allowAt(clock.Now(), nil) }

// allowAt, acceptAt and failAt are Allow, Accept and Fail at now, a
// clock.Now reading the caller has: the admission pipeline's (package
// clocked). allowAt judges a call of the criticality ctx carries (Default
// for nil), looked up only once the upstream has refused something: a
// sheddable call is refused as if K were halfway to 1, a critical one as
// if it were twice K, so that at every moment the sheddable calls are the
// likeliest refused and the critical ones the least.
func (t *Throttle) allowAt(now int64, ctx context.Context) bool {
	if t == nil {
		return true
	}
	i := t.advanceTo(now)
	o := t.pastOthers.Load() + t.others[i].Load()
	if o == 0 { // the upstream accepted every attempt in the window
		return true
	}
	a := t.pastAcc.Load() + t.acc[i].Load()
	k := t.k
	switch criticality.Of(ctx) {
	case criticality.Sheddable:
		k = 1 + (k-1)/2
	case criticality.Critical:
		k *= 2
	}
	p := t.probabilityK(o+a, a, k)
	if p == 0 || rand.Float64() >= p {
		return true
	}
	t.others[i].Add(1)
	return false
}

func (t *Throttle) probability(r, a int64) float64 { return t.probabilityK(r, a, t.k) }

func (t *Throttle) probabilityK(r, a int64, k float64) float64 {
	excess := float64(r) - k*float64(a)
	if excess <= 0 {
		return 0
	}
	return min(excess/float64(r+1), t.maxP)
}

// Probability reports the probability with which the next attempt would be
// refused.
func (t *Throttle) Probability() float64 {
	if t == nil {
		return 0
	}
	r, a := t.Counts()
	return t.probability(r, a)
}

// Accept resolves an attempt Allow admitted that the upstream answered with
// a success: a request and an accept.
func (t *Throttle) Accept() { t.acceptAt(clock.Now()) }

func (t *Throttle) acceptAt(now int64) {
	if t != nil {
		t.acc[t.advanceTo(now)].Add(1)
	}
}

// Fail resolves an attempt Allow admitted that the upstream did not accept:
// it failed, or the upstream declined it. It is a request without an accept.
func (t *Throttle) Fail() { t.failAt(clock.Now()) }

func (t *Throttle) failAt(now int64) {
	if t != nil {
		t.others[t.advanceTo(now)].Add(1)
	}
}

// Counts reports the requests (refusals included) and accepts resolved in
// the window; attempts in flight are not in them.
func (t *Throttle) Counts() (requests, accepts int64) {
	if t == nil {
		return 0, 0
	}
	i := t.advance()
	a := t.pastAcc.Load() + t.acc[i].Load()
	return t.pastOthers.Load() + t.others[i].Load() + a, a
}

// advance moves the window to the present, emptying the buckets that have
// fallen out of it, and returns the current bucket's index.
func (t *Throttle) advance() int { return t.advanceTo(clock.Now()) }

// advanceTo is advance at the time now.
func (t *Throttle) advanceTo(now int64) int {
	if now < t.next.Load() {
		return t.current()
	}
	e := floorDiv(now, t.width)
	t.mu.Lock()
	defer t.mu.Unlock()
	if e <= t.epoch { // moved meanwhile, by another caller
		return t.current()
	}
	for cur := max(t.epoch, e-buckets); cur < e; cur++ {
		i := index(cur + 1)
		t.others[i].Store(0)
		t.acc[i].Store(0)
	}
	t.epoch = e
	i := index(e)
	// Resolutions that land in the bucket just left after this sum are
	// counted when the window moves next.
	var others, acc int64
	for j := range buckets {
		if j != i {
			others += t.others[j].Load()
			acc += t.acc[j].Load()
		}
	}
	t.pastOthers.Store(others)
	t.pastAcc.Store(acc)
	t.cur.Store(int32(i))
	t.next.Store((e + 1) * t.width)
	return i
}

// floorDiv is a/b rounded down (a is negative inside a synctest bubble).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// current returns the index of the bucket the window was last moved to.
// A time before it (an attempt resolved at a time computed before the window
// moved) lands there too.
func (t *Throttle) current() int { return int(t.cur.Load()) }

// index is the bucket of epoch e (which is negative inside a synctest
// bubble, whose clock starts before the origin).
func index(e int64) int { return int((e%buckets + buckets) % buckets) }
