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
// a success. An attempt in flight counts neither way until it is resolved:
// otherwise slow answers would look refused, and a healthy upstream with
// many calls in flight would be throttled. An upstream that accepts
// nothing receives, after a moment, one attempt in 1/(1−MaxRejection) (one
// in ten by default); one that accepts everything is never throttled.
//
// The throttle never counts the client's own refusals against the upstream:
// an attempt that a later guard refused, or that was never sent, or whose
// result said nothing about the upstream (the caller cancelled it, a hedge
// won) is taken back out of requests (Refund).
package throttle

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/internal/clock"
)

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
type Throttle struct {
	k, maxP float64
	width   int64 // ns per bucket

	requests, accepts atomic.Int64 // over the live buckets
	inFlight          atomic.Int64 // admitted and not yet resolved: counted neither way yet
	epoch             atomic.Int64 // clock.Now()/width of the current bucket
	next              atomic.Int64 // when the next bucket begins (clock.Now)
	cur               atomic.Int32 // index(epoch)
	req, acc          [buckets]atomic.Int64
	mu                sync.Mutex // rotation
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
	e := floorDiv(clock.Now(), t.width)
	t.epoch.Store(e)
	t.cur.Store(int32(index(e)))
	t.next.Store((e + 1) * t.width)
	return t, nil
}

// Allow counts one request and reports whether it may go on. A refused one
// stays counted.
func (t *Throttle) Allow() bool { return t.AllowAt(clock.Now()) }

// AllowAt is Allow with the time now, as ratelimit.Now returns it, read by
// the caller: a pipeline with a rate limiter reads the clock once for both.
func (t *Throttle) AllowAt(now int64) bool {
	if t == nil {
		return true
	}
	i := t.advanceTo(now)
	p := t.probability(t.requests.Load()-t.inFlight.Load(), t.accepts.Load())
	ok := p == 0 || rand.Float64() >= p
	if ok {
		t.inFlight.Add(1)
	}
	t.req[i].Add(1)
	t.requests.Add(1)
	return ok
}

func (t *Throttle) probability(r, a int64) float64 {
	excess := float64(r) - t.k*float64(a)
	if excess <= 0 { // r < 0 too: in flight longer than the window, its request expired
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
	t.advance()
	return t.probability(t.requests.Load()-t.inFlight.Load(), t.accepts.Load())
}

// Accept counts an attempt Allow admitted that the upstream answered with a
// success.
func (t *Throttle) Accept() {
	if t == nil {
		return
	}
	t.acc[t.current()].Add(1)
	t.accepts.Add(1)
	t.inFlight.Add(-1)
}

// Fail resolves an attempt Allow admitted that the upstream did not accept:
// it failed, or the upstream declined it. Its request stays counted.
func (t *Throttle) Fail() {
	if t != nil {
		t.inFlight.Add(-1)
	}
}

// Refund takes back the request of an attempt Allow admitted that says
// nothing of the upstream: a later guard refused it, it was never sent, or
// it ended without a verdict (cancelled, or a hedge won).
func (t *Throttle) Refund() {
	if t == nil {
		return
	}
	t.inFlight.Add(-1)
	i := t.current()
	// Taken back from the current bucket, whichever bucket counted it (an
	// older one, still in the window, comes out of the total the same).
	// An empty current bucket gives nothing back: the request may have
	// been counted in a bucket that has left the window since.
	if t.req[i].Add(-1) < 0 {
		t.req[i].Add(1)
		return
	}
	t.requests.Add(-1)
}

// Counts reports the requests and accepts in the window (requests include
// those in flight).
func (t *Throttle) Counts() (requests, accepts int64) {
	if t == nil {
		return 0, 0
	}
	t.advance()
	return t.requests.Load(), t.accepts.Load()
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
	for cur := t.epoch.Load(); cur < e; cur++ {
		if e-cur > buckets { // a long silence: every bucket is out
			cur = e - buckets
		}
		i := index(cur + 1)
		t.requests.Add(-t.req[i].Swap(0))
		t.accepts.Add(-t.acc[i].Swap(0))
		t.epoch.Store(cur + 1)
		t.cur.Store(int32(index(cur + 1)))
	}
	t.next.Store((t.epoch.Load() + 1) * t.width)
	t.mu.Unlock()
	return index(e)
}

// floorDiv is a/b rounded down (a is negative inside a synctest bubble).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// current returns the index of the bucket the window was last moved to:
// the resolution of an attempt lands there, without reading the clock (the
// next Allow moves the window).
func (t *Throttle) current() int { return int(t.cur.Load()) }

// index is the bucket of epoch e (which is negative inside a synctest
// bubble, whose clock starts before the origin).
func index(e int64) int { return int((e%buckets + buckets) % buckets) }
