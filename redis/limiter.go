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
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/ratelimit"
)

// ErrUnavailable is the cause of a rejection while Redis cannot be reached,
// or cannot keep an upstream's limit, and the Limiter is configured to
// reject (Degraded.Reject). It is a local rejection like the limit's own:
// errors.Is(err, ratelimit.ErrLimited) holds.
var ErrUnavailable error = &limitedError{"outboundredis: Redis unavailable, the fleet's rate limit cannot be checked"}

// ErrNoAnswer is the cause of a rejection when Redis did not answer a take
// within the Timeout while it answers otherwise: the process may not have had
// the processor to read the answer, or Redis was slow for a moment. The take
// is refused — Redis may have counted the token, so refusing admits less,
// never more — and Redis is checked (Degraded.Confirm) before it is taken for
// down. errors.Is(err, ratelimit.ErrLimited) holds.
var ErrNoAnswer error = &limitedError{"outboundredis: no answer from Redis within the Timeout; refused"}

// limitedError is a refusal that is the limit's, for the admission pipeline
// and for callers: errors.Is matches ratelimit.ErrLimited.
type limitedError struct{ msg string }

func (e *limitedError) Error() string        { return e.msg }
func (e *limitedError) Is(target error) bool { return target == ratelimit.ErrLimited }

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

	// Degraded says what admission does while Redis cannot be reached, or
	// cannot keep an upstream's limit.
	Degraded Degraded

	// OnEvent, if set, is told of every switch between fleet and degraded
	// mode, of the whole Limiter or of one upstream's limit. It is called
	// outside every lock; a panic in it is recovered.
	OnEvent func(Event)
}

// Lease configures the leasing of tokens. Leased tokens count as taken on
// Redis when they are leased, so the fleet's sustained rate stays exact;
// what moves is when they are used. A process holds at most Max leased
// tokens it has not handed out, each for at most Hold.
//
// The bound, for one upstream over any interval T, with N processes each
// degraded at Share 1/N: PerSecond × T + Burst, plus PerSecond × Hold with
// leasing (tokens leased before T, used in it; never more than N × Max),
// plus a token per process in degraded mode (each local share rounds on its
// own), plus a Burst for each restart of Redis that lost its data (the
// bucket it kept is gone). A degraded episode's local share starts empty,
// and what it admits is charged to Redis when it comes back, so that the
// fleet admits that much less afterwards: with a Share above 1/N the fleet
// admits more while degraded and pays it back. Refunded tokens are held like
// leased ones (with or without leasing), and a refund counts only for a
// token handed out within the last Hold.
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

// Degraded configures admission while Redis cannot be reached — a
// connection error, or no answer to a check within Confirm after a take got
// none within Timeout — for every upstream; and while Redis answers an
// upstream's take with an error about its key (a key of the wrong type, a
// script error, no memory for the write), for that upstream alone.
type Degraded struct {
	// Share is the share of the fleet's rate (and burst) one process
	// allows itself in degraded mode, with a local limiter per upstream:
	// with N processes, 1/N keeps the fleet's rate; more is more available
	// and less exact. Required unless Reject is set.
	Share float64

	// Reject, if set, rejects every attempt in degraded mode (fail-closed)
	// with ErrUnavailable, a local rejection.
	Reject bool

	// RetryEvery is how often a degraded Limiter asks Redis whether it is
	// back. Zero means 100 ms.
	RetryEvery time.Duration

	// Confirm is how long Redis is given to answer a check, after a take
	// got no answer within the Timeout, before it is taken for down: a
	// process short of processor time reads answers late, and a late
	// answer is not a Redis that is down. Zero means 1 s. A check that
	// fails sooner is asked again within Confirm, unless Redis refused the
	// connection: a command queued behind another user's on the client's
	// connection fails when that command's deadline breaks the connection.
	// A check that runs out of time while the process itself is starved
	// (its timers late by more than Confirm/4 in all) is made again, at
	// most 4 times. A take whose connection fails, other than for a deadline,
	// degrades at once.
	Confirm time.Duration
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

// Event is a switch of mode: of the whole Limiter (Upstream empty) when
// Redis cannot be reached, or of one upstream's limit when Redis answers
// with an error about its key (a key of the wrong type, a script error, no
// memory left for the write).
type Event struct {
	Mode     Mode      // the mode entered
	Upstream string    // the upstream whose limit switched, or "" for every one
	Err      error     // why (entering Degraded)
	At       time.Time // when
}

// Metrics is a snapshot of a Limiter.
type Metrics struct {
	Mode       Mode
	Switches   int64 // switches of mode since the Limiter was made
	RoundTrips int64 // scripts run on Redis (takes, give-backs)
	Takes      int64 // tokens asked for by admissions
	Refunds    int64
	Local      int64 // admissions the local share allowed in degraded mode
	Charged    int64 // local admissions charged to Redis when it came back
	NoAnswer   int64 // takes refused because Redis did not answer within the Timeout (ErrNoAnswer)
	Dropped    int64 // refunds beyond the tokens taken within Lease.Hold, not counted
	Held       int   // leased tokens not yet handed out, over every upstream
	Upstreams  int   // upstreams with state kept
	KeysDown   int   // upstreams whose key Redis answered with an error, in degraded mode
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
	share   float64 // of the fleet's rate and burst, in degraded mode
	reject  bool
	retry   time.Duration
	confirm time.Duration
	onEvent func(Event)

	degraded   atomic.Bool
	episode    atomic.Uint64 // degraded episodes of the whole Limiter so far
	probing    atomic.Bool
	confirming atomic.Bool
	probeKey   atomic.Pointer[string] // the key whose script failed

	mu      sync.Mutex
	buckets map[string]*bucket
	sweeper *time.Timer
	closed  bool

	switches, trips, takes, refunds, local, charged, noAnswer, dropped atomic.Int64
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
	case cfg.Degraded.Confirm < 0:
		return nil, bad("Degraded.Confirm", "must be >= 0, got %v", cfg.Degraded.Confirm)
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
		share:   cfg.Degraded.Share,
		reject:  cfg.Degraded.Reject,
		retry:   cmp.Or(cfg.Degraded.RetryEvery, 100*time.Millisecond),
		confirm: cmp.Or(cfg.Degraded.Confirm, time.Second),
		onEvent: cfg.OnEvent,
		buckets: map[string]*bucket{},
	}
	l.tau = float64(burst) * l.emit
	l.args = [2]string{strconv.FormatFloat(l.emit, 'g', -1, 64), strconv.FormatFloat(l.tau, 'g', -1, 64)}
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
		Takes: l.takes.Load(), Refunds: l.refunds.Load(), Local: l.local.Load(), Charged: l.charged.Load(),
		NoAnswer: l.noAnswer.Load(), Dropped: l.dropped.Load()}
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
		if b.keyDown.Load() {
			m.KeysDown++
		}
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

// The kinds of failure of a round trip to Redis, by what they say of it.
const (
	noAnswer    = iota + 1 // no answer within the Timeout: slow, or a process short of processor time
	unreachable            // Redis cannot be reached, or cannot serve at all
	keyFailure             // Redis answers, with an error about the limit's key
)

// failureOf says what an error of a round trip says of Redis. An error reply
// about the key — a key of the wrong type (WRONGTYPE), a script error, no
// memory for the write (OOM) — concerns that upstream's limit only; an error
// reply that Redis as a whole cannot serve (LOADING, BUSY, MASTERDOWN,
// CLUSTERDOWN, TRYAGAIN, READONLY) and any error of the connection are
// Redis out of reach; a deadline is no answer.
func failureOf(err error) int {
	if re, ok := rueidis.IsRedisErr(err); ok {
		msg := re.Error()
		for _, p := range []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY"} {
			if strings.HasPrefix(msg, p) {
				return unreachable
			}
		}
		return keyFailure
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return noAnswer
	}
	return unreachable
}

// failed handles the failure err of a round trip for b, and returns what the
// take that made it returns.
func (l *Limiter) failed(b *bucket, err error) error {
	switch failureOf(err) {
	case noAnswer:
		l.noAnswer.Add(1)
		l.check(b)
		return ErrNoAnswer
	case keyFailure:
		b.degrade(err)
	default:
		l.degrade(err, b.key)
	}
	return b.takeDegraded()
}

// check asks Redis, once at a time, whether it answers within Confirm, after
// a take got no answer within the Timeout: a process short of processor time
// reads its answers late, and that is not a Redis that is down. Until it
// ends, takes without a token at hand are refused (ErrNoAnswer) without a
// round trip: on the connection they share, rueidis puts the deadline of a
// command that finds it idle on the connection, and takes that timed out
// one after another failed the check early, again and again, while Redis
// answered every command, only later than the Timeout. It degrades
// only if Redis does not answer while the process had the processor: a
// check that ran out of time while the process itself was starved (its own
// timers ran late by more than a quarter of Confirm in all) proves nothing and is
// made again, up to maxInconclusive times.
func (l *Limiter) check(b *bucket) {
	if l.degraded.Load() || l.confirming.Swap(true) {
		return
	}
	go func() {
		defer l.confirming.Store(false)
		for round := 0; ; round++ {
			err, starved := l.confirmOnce(b)
			switch {
			case err == nil:
				return
			case failureOf(err) == keyFailure:
				b.degrade(err)
				return
			case starved && round < maxInconclusive:
				continue
			default:
				l.degrade(err, b.key)
				return
			}
		}
	}()
}

// maxInconclusive bounds the checks made again because the process was
// starved: a Redis that is down is taken for down within
// (1+maxInconclusive)×Confirm however busy the process is, and until then
// takes are refused (ErrNoAnswer), which admits less, never more.
const maxInconclusive = 4

// confirmOnce runs the script, taking nothing, until it answers or Confirm
// passes; it reports the error of the last try, nil for an answer, and
// whether the process was starved meanwhile.
func (l *Limiter) confirmOnce(b *bucket) (err error, starved bool) {
	ctx, cancel := context.WithTimeout(context.Background(), l.confirm)
	defer cancel()
	lag := watchLag(ctx)
	for {
		err = gcra.Exec(ctx, l.client, []string{b.key}, []string{l.args[0], l.args[1], "0", "0", "0"}).Error()
		if err == nil || failureOf(err) == keyFailure || refused(err) {
			return err, false
		}
		if ctx.Err() != nil {
			return err, lag() > l.confirm/4
		}
		// Failed before its own deadline, without a refusal: the
		// connection it was queued on broke — rueidis puts the deadline of
		// a command that finds its connection idle on the connection, and
		// when it passes, the commands queued behind fail with it. That
		// says nothing of Redis: ask again, on a new connection.
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// watchLag measures, until ctx ends, how late the process runs a timer of
// 10 ms, again and again, and returns a function that reports how late it
// ran in all, counting a timer that has not run yet. A process short of
// processor time runs every goroutine late, the one that reads Redis's
// answers too, and each of the hops an answer takes to its caller: the
// total, not the most of one timer, is what tells. Regression: with one
// processor and 16 busy goroutines each timer ran about 160 ms late — under
// a quarter of Confirm — while an answer's hops took more than Confirm, and
// a healthy Redis was taken for down (TestTheFleetLimitHoldsUnderStress,
// "starved clients", leasing).
func watchLag(ctx context.Context) func() time.Duration {
	var total, last atomic.Int64
	last.Store(time.Now().UnixNano())
	go func() {
		t := time.NewTimer(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := time.Now().UnixNano()
			if late := now - last.Load() - int64(10*time.Millisecond); late > 0 {
				total.Add(late)
			}
			last.Store(now)
			t.Reset(10 * time.Millisecond)
		}
	}()
	return func() time.Duration {
		pending := time.Now().UnixNano() - last.Load() - int64(10*time.Millisecond)
		return time.Duration(total.Load() + max(pending, 0))
	}
}

// refused reports whether err is a connection Redis's host refused: nothing
// listens there, Redis is down.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// degrade switches the whole Limiter to degraded mode, once, and starts
// asking Redis whether it is back.
func (l *Limiter) degrade(err error, key string) {
	if l.degraded.Load() {
		return
	}
	l.episode.Add(1) // before the switch: a take that sees degraded mode sees the new episode
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
// that failed — and switches back to fleet mode when it does, once every
// upstream's local admissions are charged to Redis.
func (l *Limiter) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), l.confirm)
	err := gcra.Exec(ctx, l.client, []string{*l.probeKey.Load()}, []string{l.args[0], l.args[1], "0", "0", "0"}).Error()
	cancel()
	if err == nil || failureOf(err) == keyFailure { // Redis answers: that key's trouble is its own
		err = l.chargeAll()
	}
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

// chargeAll charges to Redis what every upstream admitted locally (see
// bucket.charge), and returns the first error of Redis.
func (l *Limiter) chargeAll() error {
	l.mu.Lock()
	bs := make([]*bucket, 0, len(l.buckets))
	for _, b := range l.buckets {
		bs = append(bs, b)
	}
	l.mu.Unlock()
	for _, b := range bs {
		b.mu.Lock()
		owed := b.owed
		b.mu.Unlock()
		if owed == 0 || b.keyDown.Load() { // nothing to charge, or its own probe charges it
			continue
		}
		if err := b.charge(); err != nil && failureOf(err) != keyFailure {
			return err
		}
	}
	return nil
}

func (l *Limiter) event(e Event) {
	if l.onEvent == nil {
		return
	}
	defer func() { _ = recover() }()
	l.onEvent(e)
}

// gcra takes up to want tokens after giving back back and charging charge,
// atomically on the server's clock. The bucket's state is its theoretical
// arrival time (TAT) in microseconds since mid-2025, kept with a fraction so
// that a rate that is not a whole number of microseconds per token stays
// exact (Lua's numbers are doubles: about 0.01 µs of resolution at this
// magnitude, which is 0.01% of the interval between tokens at 10,000 per
// second and 1% at the highest rate allowed, rounded to the nearest so that
// errors do not add up in one direction); the key expires when the bucket is
// full again. A give-back never takes the bucket above full; a charge — the
// tokens a process admitted on its own while Redis could not be reached —
// may take it below empty, into a debt that later takes wait out. It returns
// the tokens granted and, when none, the microseconds until one is.
var gcra = rueidis.NewLuaScript(`
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1750000000) * 1000000 + tonumber(t[2])
local emit, tau = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, back, charge = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
if back > 0 then
  tat = tat - back * emit
  if tat < now then tat = now end
end
if charge > 0 then tat = tat + charge * emit end
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
// share for degraded mode.
type bucket struct {
	l        *Limiter
	upstream string
	key      string
	kept     atomic.Bool // in l.buckets
	keyDown  atomic.Bool // Redis answers with an error about this key: degraded on its own (keyErr)

	mu        sync.Mutex
	held      int       // leased (or refunded) tokens not handed out
	heldUntil time.Time // when they are given back
	limited   time.Time // no token on Redis before this (learned from a refusal)
	fetching  chan struct{}
	lastTake  time.Time
	rate      float64 // the process's own takes per second, smoothed
	counted   int     // takes since since
	since     time.Time
	// refundable is how many tokens handed out within the last Hold
	// (until refundableUntil) may still be refunded.
	refundable      int
	refundableUntil time.Time
	// The local share in degraded mode: GCRA at the share's rate, whose
	// theoretical arrival time is localTAT; a new episode starts empty
	// (localEpisode: the episode it belongs to; 0 for a key of its own).
	// owed counts its admissions not yet charged to Redis.
	localTAT     time.Time
	localEpisode uint64
	owed         int
	keyErr       error // why keyDown
}

// Take takes one token of the fleet's limit: from the tokens this process
// holds, or from Redis within the Limiter's Timeout, or — while Redis cannot
// be reached, or cannot keep this upstream's limit — from the local share. It
// waits for Redis (its own round trip, or another take's for the same
// upstream) at most Timeout in all, whatever ctx allows: a caller that gives
// up sooner does not make a slow Redis look healthy. A take that gets no
// answer in that time is refused with ErrNoAnswer, and Redis is checked
// (Degraded.Confirm) before it is taken for down. A ctx already done is
// refused at once.
func (b *bucket) Take(ctx context.Context) error {
	l := b.l
	l.takes.Add(1)
	if err := ctx.Err(); err != nil {
		return err
	}
	var deadline time.Time
	for {
		if l.degraded.Load() || b.keyDown.Load() {
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
			b.handedOutLocked(now)
			b.mu.Unlock()
			return nil
		}
		if now.Before(b.limited) {
			b.mu.Unlock()
			return ratelimit.ErrLimited
		}
		if l.confirming.Load() {
			// Redis is being checked (check): no round trip until it has
			// answered or not, so that the check is not failed by the
			// deadlines of takes queued on the same connection.
			b.mu.Unlock()
			l.noAnswer.Add(1)
			return ErrNoAnswer
		}
		if l.lease > 1 && b.fetching != nil { // one round trip at a time per upstream
			wait := b.fetching
			b.mu.Unlock()
			if !await(wait, deadline) {
				// Its answer did not come in time: the same as no answer
				// to a round trip of its own, and that round trip's
				// taker checks Redis.
				l.noAnswer.Add(1)
				return ErrNoAnswer
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
		got, wait, err := b.run(ctx, deadline, want, back, 0)
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
			return l.failed(b, err)
		case got == 0:
			// Ask again when the batch would be there (one round trip for
			// it rather than one per token), and after Hold at the latest:
			// tokens that other processes give back are seen within it.
			wait += time.Duration(float64(want-1) * l.emit * float64(time.Microsecond))
			b.limited = time.Now().Add(min(wait, l.hold))
			b.mu.Unlock()
			return ratelimit.ErrLimited
		}
		now = time.Now()
		b.held += got - 1
		b.heldUntil = now.Add(l.hold)
		b.handedOutLocked(now)
		b.mu.Unlock()
		return nil
	}
}

// handedOutLocked counts a token handed out as one that may be refunded
// within Hold; b.mu held.
func (b *bucket) handedOutLocked(now time.Time) {
	if now.After(b.refundableUntil) {
		b.refundable = 0
	}
	b.refundable++
	b.refundableUntil = now.Add(b.l.hold)
}

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
func (b *bucket) run(ctx context.Context, deadline time.Time, want, back, charge int) (got int, wait time.Duration, err error) {
	l := b.l
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	args := []string{l.args[0], l.args[1], strconv.Itoa(want), strconv.Itoa(back), strconv.Itoa(charge)}
	l.trips.Add(1)
	res, err := gcra.Exec(ctx, l.client, []string{b.key}, args).AsIntSlice()
	if err != nil && back == 0 && charge == 0 && ctx.Err() == nil && brokenConn(err) {
		// A connection that died while idle (Redis restarted) fails its
		// first command; the client dials again for the next. Taking again
		// can at worst take a token twice, which admits less, never more;
		// a give-back or a charge is not repeated, since that could admit
		// more or charge twice.
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

// degrade puts this upstream's limit alone in degraded mode, once, for an
// error of Redis about its key, and starts asking Redis, for this key,
// whether it can keep the limit again.
func (b *bucket) degrade(err error) {
	b.mu.Lock()
	if b.keyDown.Load() {
		b.mu.Unlock()
		return
	}
	b.keyErr = err
	b.localEpisode = math.MaxUint64 // not an episode of the whole Limiter: start the share afresh
	b.keyDown.Store(true)
	b.mu.Unlock()
	b.l.switches.Add(1)
	b.l.event(Event{Mode: ModeDegraded, Upstream: b.upstream, Err: err, At: time.Now()})
	time.AfterFunc(b.l.retry, b.probe)
}

// probe asks Redis whether it keeps this upstream's limit again — the
// script, taking nothing, charging what was admitted locally meanwhile — and
// ends the upstream's degraded mode when it does.
func (b *bucket) probe() {
	l := b.l
	err := b.charge()
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if err != nil && !closed {
		time.AfterFunc(l.retry, b.probe)
		return
	}
	if err == nil && b.keyDown.Swap(false) {
		l.switches.Add(1)
		l.event(Event{Mode: ModeFleet, Upstream: b.upstream, At: time.Now()})
	}
}

// charge charges to Redis the tokens this upstream admitted on its local
// share while Redis could not be reached or keep its limit, so that the
// fleet's limit counts them: the fleet then admits that many fewer. The
// count is kept on failure, for the next charge.
func (b *bucket) charge() error {
	b.mu.Lock()
	owed := b.owed
	b.owed = 0
	b.mu.Unlock()
	_, _, err := b.run(context.Background(), time.Now().Add(b.l.confirm), 0, 0, owed)
	if err != nil {
		// Not charged, as far as is known (a charge that timed out may
		// have run: charging it again admits less, never more).
		b.mu.Lock()
		b.owed += owed
		b.mu.Unlock()
		return err
	}
	b.l.charged.Add(int64(owed))
	return nil
}

// takeDegraded answers an admission while Redis cannot be reached, or
// cannot keep this upstream's limit: ErrUnavailable with Degraded.Reject,
// else the local share — at Share of the fleet's rate and burst, starting
// each degraded episode empty (a Redis that flaps must not hand each
// episode a fresh burst), its admissions counted to be charged to Redis
// when it comes back.
func (b *bucket) takeDegraded() error {
	l := b.l
	if l.reject {
		return ErrUnavailable
	}
	emit := time.Duration(l.emit / l.share * float64(time.Microsecond))
	tau := time.Duration(max(1, math.Floor(l.tau/l.emit*l.share))) * emit
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastTake = now
	if ep := l.episode.Load(); !b.keyDown.Load() && b.localEpisode != ep {
		b.localEpisode, b.localTAT = ep, now.Add(tau) // empty
	} else if b.keyDown.Load() && b.localEpisode == math.MaxUint64 {
		b.localEpisode, b.localTAT = 0, now.Add(tau)
	}
	tat := b.localTAT
	if tat.Before(now) {
		tat = now
	}
	if tat.Add(emit).Sub(now) > tau {
		return ratelimit.ErrLimited
	}
	b.localTAT = tat.Add(emit)
	b.owed++
	l.local.Add(1)
	return nil
}

// Refund gives back a token of an attempt that never reached the wire: to
// the tokens this process holds (the next take uses it without a round
// trip; one not used within Hold goes back to Redis), or to the local share
// in degraded mode. Refunds beyond the tokens handed out within the last
// Hold are not counted (Metrics.Dropped): a refund cannot make room the
// limit never gave.
func (b *bucket) Refund() {
	l := b.l
	l.refunds.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if l.degraded.Load() || b.keyDown.Load() {
		if b.owed > 0 {
			b.owed--
			b.localTAT = b.localTAT.Add(-time.Duration(l.emit / l.share * float64(time.Microsecond)))
		} else {
			l.dropped.Add(1)
		}
		return
	}
	now := time.Now()
	if b.refundable == 0 || now.After(b.refundableUntil) {
		b.refundable = 0
		l.dropped.Add(1)
		return
	}
	b.refundable--
	if b.held == 0 {
		b.heldUntil = now.Add(l.hold)
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
	_, _, err := b.run(context.Background(), time.Now().Add(b.l.timeout), 0, back, 0)
	return err
}
