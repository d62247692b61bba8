// Package outboundredis shares what one process learns about an upstream
// with a fleet of processes, through Redis: a rate limit that holds across
// every process (Limiter), and a breaker signal that opens the other
// processes' breakers when one of them opens its own (Signal).
//
// Both plug into the admission pipeline of package outbound without changing
// its order or its permit rules: circuit breaker, then the fleet's rate limit,
// then the bulkhead. A token taken for an attempt that never reaches the wire
// is refunded; a Redis that cannot be reached is never an upstream failure.
package outboundredis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/ratelimit"
)

// ErrUnavailable is the cause of a rejection while Redis cannot be reached
// and the Limiter is configured to reject (Degraded.Reject).
var ErrUnavailable = errors.New("outboundredis: Redis unavailable, the fleet's rate limit cannot be checked")

// Config configures a Limiter: one limit of PerSecond per upstream, shared
// by every process that uses the same Redis and Prefix.
type Config struct {
	// Client reaches Redis: a rueidis client of one server or of a cluster
	// (a limit's key carries its upstream as a hash tag, so each limit lives
	// on one node); required. Client-side caching is not used
	// (ClientOption.DisableCache may be set).
	Client rueidis.Client

	// PerSecond is the fleet-wide sustained rate per upstream; required,
	// and at most 1,000,000.
	PerSecond float64

	// Burst is how many tokens the fleet may take at once after an idle
	// period. Zero means one second's worth of PerSecond (at least 1).
	Burst int

	// Prefix starts every key. Zero means "outbound:rate:".
	Prefix string

	// Timeout bounds how long an admission waits for Redis. Zero means
	// 50 ms.
	Timeout time.Duration

	// Lease lets a process take tokens in batches and hand them out without
	// a round trip. The zero value means no leasing.
	Lease Lease

	// Degraded says what admission does while Redis cannot be reached.
	Degraded Degraded

	// OnEvent, if set, is told of every switch between fleet and degraded
	// mode. It is called outside every lock; a panic in it is recovered.
	OnEvent func(Event)
}

// Lease configures the leasing of tokens. Leased tokens count as taken on
// Redis when they are leased, so the fleet's sustained rate stays exact;
// what moves is when they are used. A process holds at most Max leased
// tokens it has not handed out, each for at most Hold: over any interval the
// fleet admits at most PerSecond × (the interval + Hold) + Burst, and never
// more than the processes × Max above PerSecond × the interval + Burst.
// Refunded tokens are held the same way (with or without leasing) and add to
// that bound the tokens refunded within the last Hold: a token refunded long
// after it was taken — its attempt waited for a connection, then was
// cancelled — is used later than the limit scheduled it. A token taken from
// the local share in degraded mode and refunded after the switch back goes
// to Redis as if it had come from there.
type Lease struct {
	// Max is the most tokens a process takes in one round trip. Zero or 1
	// means no leasing.
	Max int

	// Hold is how long a process keeps leased tokens before it gives back
	// those it has not used; a batch is sized to what the process's own
	// rate uses in that time (between 1 and Max). It is also the longest a
	// process remembers that Redis had no token, without asking again.
	// Zero means 100 ms.
	Hold time.Duration
}

// Degraded configures admission while Redis cannot be reached (an error,
// or no answer within Timeout).
type Degraded struct {
	// Share is the share of the fleet's rate (and burst) one process
	// allows itself in degraded mode, with a local limiter per upstream:
	// with N processes, 1/N keeps the fleet's rate; more is more available
	// and less exact. Required unless Reject is set.
	Share float64

	// Reject, if set, rejects every attempt in degraded mode (fail-closed)
	// with ErrUnavailable, as a local rejection.
	Reject bool

	// RetryEvery is how often a degraded Limiter asks Redis whether it is
	// back. Zero means 500 ms.
	RetryEvery time.Duration
}

// Mode is whether a Limiter checks the fleet's limit or a local one.
type Mode uint8

const (
	ModeFleet    Mode = iota // the fleet's limit, on Redis
	ModeDegraded             // Redis cannot be reached: the local share, or rejection
)

func (m Mode) String() string {
	if m == ModeDegraded {
		return "degraded"
	}
	return "fleet"
}

// Event is a switch of mode.
type Event struct {
	Mode Mode      // the mode entered
	Err  error     // why Redis could not be reached (entering Degraded)
	At   time.Time // when
}

// Metrics is a snapshot of a Limiter.
type Metrics struct {
	Mode       Mode
	Switches   int64 // switches of mode since the Limiter was made
	RoundTrips int64 // scripts run on Redis (takes, give-backs)
	Takes      int64 // tokens asked for by admissions
	Refunds    int64
	Local      int64 // admissions the local share allowed in degraded mode
	Held       int   // leased tokens not yet handed out, over every upstream
	Upstreams  int   // upstreams with state kept
}

// Limiter is a rate limit shared by a fleet of processes, kept on Redis as
// GCRA (the generic cell rate algorithm) on the Redis server's clock: one
// script per round trip, atomic on the server, so the limit is exact across
// any number of processes. Give its For method to admission.Config.RateGuard.
type Limiter struct {
	client  rueidis.Client
	prefix  string
	emit    float64   // microseconds per token
	tau     float64   // microseconds of burst: Burst × emit
	args    [2]string // emit and tau, as the script reads them
	timeout time.Duration
	lease   int
	hold    time.Duration
	share   ratelimit.Config
	reject  bool
	retry   time.Duration
	onEvent func(Event)

	degraded atomic.Bool
	probing  atomic.Bool
	probeKey atomic.Pointer[string] // the key whose script failed

	mu      sync.Mutex
	buckets map[string]*bucket
	sweeper *time.Timer
	closed  bool

	switches, trips, takes, refunds, local atomic.Int64
}

// maxRate is the highest rate per upstream: one token per microsecond.
const maxRate = 1e6

// New validates cfg and returns a Limiter. Errors name the field.
func New(cfg Config) (*Limiter, error) {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("outboundredis: Config.%s %s", field, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.Client == nil:
		return nil, bad("Client", "is required")
	case !(cfg.PerSecond > 0) || cfg.PerSecond > maxRate:
		return nil, bad("PerSecond", "must be a positive rate of at most %v per second (the bucket is kept in microseconds), got %v", maxRate, cfg.PerSecond)
	case cfg.Burst < 0:
		return nil, bad("Burst", "must be >= 0, got %d", cfg.Burst)
	case cfg.Timeout < 0:
		return nil, bad("Timeout", "must be >= 0, got %v", cfg.Timeout)
	case cfg.Lease.Max < 0:
		return nil, bad("Lease.Max", "must be >= 0, got %d", cfg.Lease.Max)
	case cfg.Lease.Hold < 0:
		return nil, bad("Lease.Hold", "must be >= 0, got %v", cfg.Lease.Hold)
	case cfg.Degraded.RetryEvery < 0:
		return nil, bad("Degraded.RetryEvery", "must be >= 0, got %v", cfg.Degraded.RetryEvery)
	case !cfg.Degraded.Reject && !(cfg.Degraded.Share > 0 && cfg.Degraded.Share <= 1):
		return nil, bad("Degraded.Share", "must be in (0, 1] unless Degraded.Reject is set (the share of the fleet's rate one process allows itself while Redis cannot be reached), got %v", cfg.Degraded.Share)
	case cfg.Degraded.Reject && cfg.Degraded.Share != 0:
		return nil, bad("Degraded.Share", "cannot be set together with Degraded.Reject")
	}
	burst := cfg.Burst
	if burst == 0 {
		burst = max(1, int(cfg.PerSecond))
	}
	l := &Limiter{
		client:  cfg.Client,
		prefix:  cmp.Or(cfg.Prefix, "outbound:rate:"),
		emit:    1e6 / cfg.PerSecond,
		timeout: cmp.Or(cfg.Timeout, 50*time.Millisecond),
		lease:   max(1, cfg.Lease.Max),
		hold:    cmp.Or(cfg.Lease.Hold, 100*time.Millisecond),
		reject:  cfg.Degraded.Reject,
		retry:   cmp.Or(cfg.Degraded.RetryEvery, 500*time.Millisecond),
		onEvent: cfg.OnEvent,
		buckets: map[string]*bucket{},
	}
	l.tau = float64(burst) * l.emit
	l.args = [2]string{strconv.FormatFloat(l.emit, 'g', -1, 64), strconv.FormatFloat(l.tau, 'g', -1, 64)}
	if !l.reject {
		l.share = ratelimit.Config{PerSecond: cfg.PerSecond * cfg.Degraded.Share,
			Burst: max(1, int(float64(burst)*cfg.Degraded.Share))}
	}
	return l, nil
}

// For returns the fleet's rate guard of upstream: give the method itself to
// admission.Config.RateGuard (or outbound.Config.Admission.RateGuard).
func (l *Limiter) For(upstream string) admission.RateGuard {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[upstream]
	if b == nil {
		b = &bucket{l: l, upstream: upstream, key: l.prefix + "{" + upstream + "}"}
		l.adoptLocked(b)
	}
	return b
}

// Mode returns the Limiter's mode.
func (l *Limiter) Mode() Mode {
	if l.degraded.Load() {
		return ModeDegraded
	}
	return ModeFleet
}

// Metrics returns a snapshot of the Limiter.
func (l *Limiter) Metrics() Metrics {
	m := Metrics{Mode: l.Mode(), Switches: l.switches.Load(), RoundTrips: l.trips.Load(),
		Takes: l.takes.Load(), Refunds: l.refunds.Load(), Local: l.local.Load()}
	l.mu.Lock()
	bs := make([]*bucket, 0, len(l.buckets))
	for _, b := range l.buckets {
		bs = append(bs, b)
	}
	m.Upstreams = len(l.buckets)
	l.mu.Unlock()
	for _, b := range bs {
		b.mu.Lock()
		m.Held += b.held
		b.mu.Unlock()
	}
	return m
}

// Close gives back every leased token not handed out, each upstream's
// within Timeout (but a batch whose round trip is in flight), and stops the
// Limiter's timers. Guards handed out keep working, without give-backs; a
// Limiter closed in degraded mode stays in it (nothing probes Redis any
// more). It returns the first error Redis gave.
func (l *Limiter) Close() error {
	l.mu.Lock()
	l.closed = true
	if l.sweeper != nil {
		l.sweeper.Stop()
		l.sweeper = nil
	}
	bs := make([]*bucket, 0, len(l.buckets))
	for _, b := range l.buckets {
		bs = append(bs, b)
	}
	l.mu.Unlock()
	var first error
	for _, b := range bs {
		if err := b.giveBack(true); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// adoptLocked keeps b in the Limiter's map, for its give-backs; l.mu held.
func (l *Limiter) adoptLocked(b *bucket) {
	if cur := l.buckets[b.upstream]; cur == nil {
		l.buckets[b.upstream] = b
	} // else For made another since b was forgotten: b's tokens go back at its next round trip
	b.kept.Store(true)
	if l.sweeper == nil && !l.closed {
		l.sweeper = time.AfterFunc(l.hold, l.sweep)
	}
}

// idleTime is how long an upstream's bucket is kept without a take.
const idleTime = time.Minute

// sweep gives back the leased tokens held longer than Hold, forgets the
// buckets idle for idleTime, and arms itself again while any is kept.
func (l *Limiter) sweep() {
	l.mu.Lock()
	var due []*bucket
	now := time.Now()
	for k, b := range l.buckets {
		b.mu.Lock()
		switch {
		case b.held > 0 && now.After(b.heldUntil):
			due = append(due, b)
		case b.held == 0 && b.fetching == nil && now.Sub(b.lastTake) > idleTime:
			delete(l.buckets, k)
			b.kept.Store(false)
		}
		b.mu.Unlock()
	}
	l.mu.Unlock()
	if !l.degraded.Load() { // a Redis that cannot be reached is not asked every Hold
		for _, b := range due {
			b.giveBack(false)
		}
	}
	l.mu.Lock()
	l.sweeper = nil
	if len(l.buckets) > 0 && !l.closed {
		l.sweeper = time.AfterFunc(l.hold, l.sweep)
	}
	l.mu.Unlock()
}

// degrade switches to degraded mode, once, and starts asking Redis whether
// it is back.
func (l *Limiter) degrade(err error, key string) {
	if l.degraded.Swap(true) {
		return
	}
	l.probeKey.Store(&key)
	l.switches.Add(1)
	l.event(Event{Mode: ModeDegraded, Err: err, At: time.Now()})
	if !l.probing.Swap(true) {
		time.AfterFunc(l.retry, l.probe)
	}
}

// probe asks Redis whether it answers again — the script itself, taking
// nothing, on the key that failed, so that on a cluster it asks the node
// that failed — and switches back to fleet mode when it does.
func (l *Limiter) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	err := gcra.Exec(ctx, l.client, []string{*l.probeKey.Load()}, []string{l.args[0], l.args[1], "0", "0"}).Error()
	cancel()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if err != nil && !closed {
		time.AfterFunc(l.retry, l.probe)
		return
	}
	l.probing.Store(false)
	if err == nil && l.degraded.Swap(false) {
		l.switches.Add(1)
		l.event(Event{Mode: ModeFleet, At: time.Now()})
	}
}

func (l *Limiter) event(e Event) {
	if l.onEvent == nil {
		return
	}
	defer func() { _ = recover() }()
	l.onEvent(e)
}

// gcra takes up to want tokens after giving back back, atomically on the
// server's clock. The bucket's state is its theoretical arrival time (TAT)
// in microseconds since mid-2025, kept with a fraction so that a rate that
// is not a whole number of microseconds per token stays exact (Lua's numbers
// are doubles: about 0.01 µs of resolution at this magnitude, which is 0.01%
// of the interval between tokens at 10,000 per second and 1% at the highest
// rate allowed, rounded to the nearest so that errors do not add up in one
// direction); the key expires when the bucket is full again. It returns the tokens granted and, when none, the
// microseconds until one is.
var gcra = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1750000000) * 1000000 + tonumber(t[2])
local emit, tau = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, back = tonumber(ARGV[3]), tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
if back > 0 then
  tat = tat - back * emit
  if tat < now then tat = now end
end
local got = math.floor((now + tau - tat) / emit)
if got > want then got = want end
if got < 0 then got = 0 end
tat = tat + got * emit
if tat > now then
  redis.call('SET', KEYS[1], string.format('%.4f', tat), 'PX', math.ceil((tat - now) / 1000))
else
  redis.call('DEL', KEYS[1])
end
local wait = 0
if got == 0 then wait = math.ceil(tat + emit - tau - now) end
return {got, wait}
`)

// bucket is one upstream's guard: the leased tokens it holds, and its local
// limiter for degraded mode.
type bucket struct {
	l        *Limiter
	upstream string
	key      string
	kept     atomic.Bool // in l.buckets

	mu        sync.Mutex
	held      int       // leased tokens not handed out
	heldUntil time.Time // when they are given back
	limited   time.Time // no token on Redis before this (learned from a refusal)
	fetching  chan struct{}
	lastTake  time.Time
	rate      float64 // the process's own takes per second, smoothed
	counted   int     // takes since since
	since     time.Time
	local     *ratelimit.Limiter
}

// Take takes one token of the fleet's limit: from the tokens this process
// holds, or from Redis within the Limiter's Timeout, or — while Redis cannot
// be reached — from the local share. It waits for Redis (its own round trip,
// or another take's for the same upstream) at most Timeout in all, whatever
// ctx allows: a caller that gives up sooner does not make a slow Redis look
// healthy, nor a healthy one look slow. A ctx already done is refused at
// once.
func (b *bucket) Take(ctx context.Context) error {
	l := b.l
	l.takes.Add(1)
	if err := ctx.Err(); err != nil {
		return err
	}
	var deadline time.Time
	for {
		if l.degraded.Load() {
			return b.takeDegraded()
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(l.timeout)
		}
		b.mu.Lock()
		b.lastTake = now
		b.counted++
		if b.held > 0 && now.Before(b.heldUntil) {
			b.held--
			b.mu.Unlock()
			return nil
		}
		if now.Before(b.limited) {
			b.mu.Unlock()
			return ratelimit.ErrLimited
		}
		if l.lease > 1 && b.fetching != nil { // one round trip at a time per upstream
			wait := b.fetching
			b.mu.Unlock()
			if !await(wait, deadline) {
				l.degrade(errSlow, b.key)
				return b.takeDegraded()
			}
			continue
		}
		want, back := b.batchLocked(now)
		var done chan struct{}
		if l.lease > 1 {
			done = make(chan struct{})
			b.fetching = done
		}
		b.mu.Unlock()
		if !b.kept.Load() {
			l.mu.Lock()
			l.adoptLocked(b)
			l.mu.Unlock()
		}
		got, wait, err := b.run(ctx, deadline, want, back)
		b.mu.Lock()
		if done != nil {
			b.fetching = nil
			close(done)
		}
		switch {
		case err != nil:
			// The tokens it gave back are not kept: a script that timed
			// out may still have run, and giving them back twice would
			// admit more than the limit (dropping them admits less).
			b.mu.Unlock()
			l.degrade(err, b.key)
			return b.takeDegraded()
		case got == 0:
			// Ask again when the batch would be there (one round trip for
			// it rather than one per token), and after Hold at the latest:
			// tokens that other processes give back are seen within it.
			wait += time.Duration(float64(want-1) * l.emit * float64(time.Microsecond))
			b.limited = time.Now().Add(min(wait, l.hold))
			b.mu.Unlock()
			return ratelimit.ErrLimited
		}
		b.held += got - 1
		b.heldUntil = time.Now().Add(l.hold)
		b.mu.Unlock()
		return nil
	}
}

// errSlow is why a take that waited for another's round trip until its
// deadline switches to degraded mode.
var errSlow = errors.New("outboundredis: no answer from Redis within the Timeout")

// await waits for another take's round trip until deadline, and reports
// whether it ended in time.
func await(done chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// batchLocked returns how many tokens to ask for — what the process's own
// rate uses in Hold, between 1 and Lease.Max — and how many expired leased
// tokens to give back in the same round trip; b.mu held.
func (b *bucket) batchLocked(now time.Time) (want, back int) {
	back, b.held = b.held, 0
	if b.l.lease <= 1 {
		return 1, back
	}
	if el := now.Sub(b.since); el > 0 && !b.since.IsZero() {
		r := float64(b.counted) / el.Seconds()
		if b.rate == 0 {
			b.rate = r
		} else {
			b.rate = 0.5*b.rate + 0.5*r
		}
	}
	b.since, b.counted = now, 0
	want = int(math.Ceil(b.rate * b.l.hold.Seconds()))
	return min(max(want, 1), b.l.lease), back
}

// run runs the script until deadline, whatever ctx's own end (its values
// are kept, for tracing).
func (b *bucket) run(ctx context.Context, deadline time.Time, want, back int) (got int, wait time.Duration, err error) {
	l := b.l
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	args := []string{l.args[0], l.args[1], strconv.Itoa(want), strconv.Itoa(back)}
	l.trips.Add(1)
	res, err := gcra.Exec(ctx, l.client, []string{b.key}, args).AsIntSlice()
	if err != nil && back == 0 && ctx.Err() == nil && brokenConn(err) {
		// A connection that died while idle (Redis restarted) fails its
		// first command; the client dials again for the next. Taking again
		// can at worst take a token twice, which admits less, never more;
		// a give-back is not repeated, since that could admit more.
		l.trips.Add(1)
		res, err = gcra.Exec(ctx, l.client, []string{b.key}, args).AsIntSlice()
	}
	if err != nil {
		return 0, 0, err
	}
	if len(res) != 2 {
		return 0, 0, fmt.Errorf("outboundredis: the rate script answered %v", res)
	}
	return int(res[0]), time.Duration(res[1]) * time.Microsecond, nil
}

// brokenConn reports whether err says the connection was gone, as an idle
// connection to a restarted server is.
func brokenConn(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// takeDegraded answers an admission while Redis cannot be reached.
func (b *bucket) takeDegraded() error {
	l := b.l
	if l.reject {
		return ErrUnavailable
	}
	b.mu.Lock()
	b.lastTake = time.Now()
	if b.local == nil {
		b.local, _ = ratelimit.New(l.share) // validated in New
	}
	lim := b.local
	b.mu.Unlock()
	if lim.TryAcquire() {
		l.local.Add(1)
		return nil
	}
	return ratelimit.ErrLimited
}

// Refund gives back a token of an attempt that never reached the wire: to
// the tokens this process holds (the next take uses it without a round
// trip; one not used within Hold goes back to Redis), or to the local share
// in degraded mode.
func (b *bucket) Refund() {
	l := b.l
	l.refunds.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if l.degraded.Load() && b.local != nil {
		b.local.Refund()
		return
	}
	if b.held == 0 {
		b.heldUntil = time.Now().Add(l.hold)
	}
	b.held++
	b.limited = time.Time{}
}

// giveBack returns the bucket's held tokens to Redis: those held longer
// than Hold, or all of them.
func (b *bucket) giveBack(all bool) error {
	b.mu.Lock()
	if b.held == 0 || (!all && time.Now().Before(b.heldUntil)) || b.fetching != nil {
		b.mu.Unlock()
		return nil
	}
	back := b.held
	b.held = 0
	b.mu.Unlock()
	// On error they are not kept: the script may have run (see Take).
	_, _, err := b.run(context.Background(), time.Now().Add(b.l.timeout), 0, back)
	return err
}
