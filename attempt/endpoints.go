package attempt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/classify"

	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/internal/clock"
)

// Endpoints spreads the attempts to a host over every address it resolves
// to, each address (an endpoint) with its own connections and statistics,
// and keeps attempts off an endpoint that fails (ejection). net/http dials
// one address of a host and keeps its connections there, so one sick
// replica behind a name takes every call with it; with Endpoints, each
// attempt picks the less loaded of two endpoints drawn at random (the
// power of two choices, by peak-EWMA latency × attempts in flight), a
// retry or a hedge goes to an endpoint the call has not tried when there
// is one, a connection that cannot be made to one endpoint is made to
// another within the same attempt (as net/http's dialer tries every
// address), and an endpoint whose last ConsecutiveFailures attempts failed
// is ejected for a while.
//
// The host name is kept for everything but the dial: the TLS server name
// and certificate check, the Host header, and the key of the upstream's
// breaker, limiter and bulkhead, which stay one per host. A user's
// DialContext is given the endpoint's "ip:port". A host that resolves to
// one address, an IP address, a host the Resolver cannot resolve, a
// request through a Proxy (one endpoint: the proxy), and a Transport with
// DialTLSContext (whose dialer may take the address for the server name)
// are dialed by name, as without Endpoints.
type Endpoints struct {
	// Resolver looks a host's addresses up (A and AAAA); nil means
	// net.DefaultResolver. Tests map a name to loopback addresses with it.
	Resolver Resolver

	// Refresh is how often a host's addresses are looked up again, in the
	// background while attempts go on with what is known. Zero means 30
	// seconds. (The records' TTL is not visible through net.Resolver.)
	Refresh time.Duration

	// MaxEndpoints caps the addresses used per host, in the order the
	// resolver gave them; zero means 32.
	MaxEndpoints int

	// Ejection says when an endpoint is kept out of the picks.
	Ejection Ejection

	// OnEject, if set, is told when an endpoint of the upstream named key
	// is ejected (for how long) and, with a zero duration, when an
	// attempt finds its ejection over. It must not block.
	OnEject func(key, endpoint string, d time.Duration)
}

// Ejection says when an endpoint is kept out of the picks, from what its
// own attempts showed — a connection that could not be made, an attempt
// lost on the wire, or an answer the breaker counts as a failure (a 5xx by
// default) — ConsecutiveFailures times in a row, or in FailureRate of a
// window of its outcomes. Local rejections, the
// caller's cancellations and the client's own faults are not the
// endpoint's and count for nothing. An endpoint is ejected for BaseTime
// times the number of its recent ejections, at most MaxTime; never more
// than MaxShare of a host's endpoints at once (at least one), and never the
// last one.
type Ejection struct {
	// ConsecutiveFailures ejects an endpoint after this many failures in
	// a row; zero means 5 (Envoy's and Finagle's default); negative turns
	// ejection off.
	ConsecutiveFailures int
	// BaseTime is the first ejection's length; zero means 30 seconds.
	BaseTime time.Duration
	// MaxTime caps an ejection; zero means 300 seconds. An endpoint that
	// has not been ejected for MaxTime starts again from BaseTime.
	MaxTime time.Duration
	// MaxShare is the largest share of a host's endpoints ejected at once;
	// zero means 0.1. At least one may be, out of two or more.
	MaxShare float64
	// FailureRate ejects an endpoint when at least this share of a window
	// of Window of its outcomes failed, whether in a row or not: an
	// endpoint that fails every other attempt rarely fails five in a row.
	// Zero means 0.5; negative turns it off.
	FailureRate float64
	// Window is the number of an endpoint's outcomes FailureRate is
	// judged on, in windows one after the other; zero means 20.
	Window int
	// SlowFactor, if set, also ejects an endpoint by latency: when its
	// last ConsecutiveFailures outcomes (5 if that is off) each took more
	// than SlowFactor times the median latency estimate of the host's
	// endpoints and more than SlowMin — an answer, or an attempt still
	// waiting when its caller gave up. An answer faster than that ends the
	// run. The pick already keeps most attempts off a slow endpoint; this
	// keeps off the few it still sends it to see whether it has recovered.
	// Zero (the default) turns it off; otherwise it must be above 1.
	SlowFactor float64
	// SlowMin is the least latency that counts as slow, so that a host of
	// fast endpoints does not eject one for a pause of a few milliseconds;
	// zero means 100 ms.
	SlowMin time.Duration
}

// Resolver looks a host's addresses up; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

const (
	defaultRefresh      = 30 * time.Second
	defaultMaxEndpoints = 32
	// ewmaDecay is the time constant of the latency estimate's decay.
	// Finagle's 10 s kept an endpoint whose estimate one pause had raised
	// out of the picks for tens of seconds (the drill's
	// one-bad-replica-of-three: a replica never picked in 600 calls); at
	// 1 s a spike of 10× fades in about 2 s, while a stall of 1 s among
	// answers of 1 ms still keeps its endpoint out for about 7 s.
	ewmaDecay = time.Second
	// resolveTimeout bounds a lookup made in the background.
	resolveTimeout = 10 * time.Second
)

// endpointsConfig is Endpoints with its defaults applied.
type endpointsConfig struct {
	resolver     Resolver
	refresh      int64
	maxEndpoints int
	failures     int     // 0: no ejection by failures in a row
	rate         float64 // 0: no ejection by the failure rate
	window       int
	base, cap    int64
	share        float64
	slowFactor   float64 // 0: no ejection by latency
	slowMin      int64
	slowRun      int
	onEject      func(key, endpoint string, d time.Duration)
}

func newEndpointsConfig(e *Endpoints) (*endpointsConfig, error) {
	if e == nil {
		return nil, nil
	}
	x := e.Ejection
	switch {
	case e.Refresh < 0:
		return nil, cfgerr.New("attempt", "Endpoints.Refresh", "must be >= 0, got %v", e.Refresh)
	case e.MaxEndpoints < 0:
		return nil, cfgerr.New("attempt", "Endpoints.MaxEndpoints", "must be >= 0, got %d", e.MaxEndpoints)
	case x.BaseTime < 0:
		return nil, cfgerr.New("attempt", "Endpoints.Ejection.BaseTime", "must be >= 0, got %v", x.BaseTime)
	case x.MaxTime < 0:
		return nil, cfgerr.New("attempt", "Endpoints.Ejection.MaxTime", "must be >= 0, got %v", x.MaxTime)
	case !(x.MaxShare >= 0 && x.MaxShare <= 1):
		return nil, cfgerr.New("attempt", "Endpoints.Ejection.MaxShare", "must be in [0, 1], got %v", x.MaxShare)
	case !(x.FailureRate <= 1) || x.FailureRate != x.FailureRate:
		return nil, cfgerr.New("attempt", "Endpoints.Ejection.FailureRate", "must be at most 1 (negative: off), got %v", x.FailureRate)
	case x.Window < 0:
		return nil, cfgerr.New("attempt", "Endpoints.Ejection.Window", "must be >= 0, got %d", x.Window)
	case x.SlowFactor != 0 && !(x.SlowFactor > 1 && x.SlowFactor <= math.MaxFloat64):
		return nil, cfgerr.New("attempt", "Endpoints.Ejection.SlowFactor", "must be 0 (off) or above 1, got %v", x.SlowFactor)
	case x.SlowMin < 0:
		return nil, cfgerr.New("attempt", "Endpoints.Ejection.SlowMin", "must be >= 0, got %v", x.SlowMin)
	}
	c := &endpointsConfig{resolver: e.Resolver, refresh: int64(cmp.Or(e.Refresh, defaultRefresh)),
		maxEndpoints: cmp.Or(e.MaxEndpoints, defaultMaxEndpoints), failures: cmp.Or(x.ConsecutiveFailures, 5),
		base: int64(cmp.Or(x.BaseTime, 30*time.Second)), cap: int64(cmp.Or(x.MaxTime, 300*time.Second)),
		share: cmp.Or(x.MaxShare, 0.1), onEject: e.OnEject, rate: max(cmp.Or(x.FailureRate, 0.5), 0), window: cmp.Or(x.Window, 20)}
	if c.cap < c.base {
		return nil, cfgerr.New("attempt", "Endpoints.Ejection.MaxTime", "must be >= BaseTime (%v), got %v", time.Duration(c.base), time.Duration(c.cap))
	}
	if c.failures < 0 {
		c.failures = 0
	}
	c.slowFactor, c.slowMin, c.slowRun = x.SlowFactor, int64(cmp.Or(x.SlowMin, 100*time.Millisecond)), cmp.Or(c.failures, 5)
	if c.resolver == nil {
		c.resolver = net.DefaultResolver
	}
	return c, nil
}

// endpointSet is the endpoints of one host address (scheme, "host:port")
// of an upstream, kept with the upstream (upstream.sets).
type endpointSet struct {
	t      *Attempter
	up     *upstream
	scheme string
	addr   string // "host:port", as the URL names it (canonical)
	host   string
	port   string

	eps atomic.Pointer[[]*endpoint] // nil until the first lookup ended

	mu         sync.Mutex    // the lookups and ejections
	resolving  chan struct{} // closed when the first lookup ends; nil if none is in progress
	refreshing atomic.Bool   // a lookup runs in the background
	resolvedAt atomic.Int64  // clock.Now of the last lookup's end
}

// endpoint is one address of a host: its pool of connections, and what its
// attempts showed.
type endpoint struct {
	set      *endpointSet
	dialAddr string // "ip:port"; empty: dialed by name
	pool     atomic.Pointer[pool]

	inflight atomic.Int32 // attempts between the pick and their answer

	// Read by every pick and written by every answer, without a lock: an
	// answer is most attempts' last step, and a lock shared by every
	// caller of a host costs them (measured in DESIGN.md, "A host is many
	// endpoints").
	ewma  atomic.Uint64 // peak-EWMA latency, ns, as float64 bits; 0 before the first sample
	stamp atomic.Int64  // clock.Now of the last sample; 0 before the first
	until atomic.Int64  // clock.Now at which its ejection ends; 0 if not ejected

	fails       atomic.Int32 // failures in a row
	slowRun     atomic.Int32 // slow outcomes in a row (Ejection.SlowFactor)
	window      atomic.Int32 // outcomes in the window in progress (Ejection.Window)
	windowFails atomic.Int32 // and the failures among them

	mu        sync.Mutex // for an ejection, its start and its end
	ejections int        // recent ejections
	lastEnd   int64      // when its last ejection ended
}

// Elsewhere is what a call's attempts have been sent to: each attempt made
// with it goes to an endpoint none of the earlier ones went to, when the
// host has one not ejected. One Elsewhere per call; safe for the concurrent
// attempts of a hedged round.
type Elsewhere struct {
	n     atomic.Int32 // len(tried): a call's first attempt takes no lock
	mu    sync.Mutex
	first [3]*endpoint // tried's array while it fits: no allocation
	tried []*endpoint
}

func (e *Elsewhere) has(ep *endpoint) bool {
	if e.n.Load() == 0 {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Contains(e.tried, ep)
}

func (e *Elsewhere) add(ep *endpoint) {
	e.mu.Lock()
	if !slices.Contains(e.tried, ep) {
		if e.tried == nil {
			e.tried = e.first[:0]
		}
		e.tried = append(e.tried, ep)
		e.n.Store(int32(len(e.tried)))
	}
	e.mu.Unlock()
}

// setLocked returns u's endpoint set for scheme and addr, creating it if
// needed; t.mu must be held for writing.
func (t *Attempter) setLocked(u *upstream, scheme, addr string) *endpointSet {
	for _, s := range u.sets {
		if s.scheme == scheme && s.addr == addr {
			return s
		}
	}
	host, port, _ := net.SplitHostPort(addr)
	s := &endpointSet{t: t, up: u, scheme: scheme, addr: addr, host: host, port: port}
	u.sets = append(u.sets, s)
	return s
}

// endpoints returns the set's endpoints, looking them up first if they
// never were (within ctx: the lookup is part of the attempt's dial, as it
// is of net/http's), and starting a lookup in the background when the last
// is older than Refresh at now.
func (s *endpointSet) endpoints(ctx context.Context, now int64) []*endpoint {
	if eps := s.eps.Load(); eps != nil {
		if now-s.resolvedAt.Load() >= s.t.endpoints.refresh && s.refreshing.CompareAndSwap(false, true) {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
				defer cancel()
				s.resolve(ctx)
				s.refreshing.Store(false)
			}()
		}
		return *eps
	}
	s.mu.Lock()
	wait := s.resolving
	if wait == nil && s.eps.Load() == nil {
		s.resolving = make(chan struct{})
	}
	s.mu.Unlock()
	if wait == nil {
		if s.eps.Load() == nil {
			s.resolve(ctx)
			s.mu.Lock()
			close(s.resolving)
			s.resolving = nil
			s.mu.Unlock()
		}
	} else {
		select {
		case <-wait:
		case <-ctx.Done():
		}
	}
	if eps := s.eps.Load(); eps != nil {
		return *eps
	}
	return s.byName()
}

// lookup asks the Resolver for the host's addresses; a Resolver that panics
// has failed the lookup (it may run in the background, where a panic
// would end the process, or in an attempt holding its permit).
func (s *endpointSet) lookup(ctx context.Context) (addrs []netip.Addr, err error) {
	defer func() {
		if p := recover(); p != nil {
			addrs, err = nil, fmt.Errorf("outbound: the Resolver panicked: %v", p)
		}
	}()
	return s.t.endpoints.resolver.LookupNetIP(ctx, "ip", s.host)
}

// byName is the one endpoint of a host dialed by its name.
func (s *endpointSet) byName() []*endpoint {
	return []*endpoint{{set: s}}
}

// resolve looks the host up and installs what it found, keeping the
// endpoints (their connections and statistics) of the addresses found
// again. A lookup that fails changes nothing that is known — a DNS outage
// does not drop the endpoints, nor their ejections — and a first lookup
// ended by its context installs nothing: the next attempt looks again. A
// first lookup that fails otherwise leaves the host dialed by name, where
// the dial fails as net/http's would.
func (s *endpointSet) resolve(ctx context.Context) {
	var found []string
	if _, err := netip.ParseAddr(s.host); err != nil { // an IP address is its own one endpoint
		addrs, err := s.lookup(ctx)
		if err != nil {
			if s.eps.Load() != nil {
				s.resolvedAt.Store(clock.Now()) // asked again after Refresh
				return
			}
			if ctx.Err() != nil {
				return
			}
		}
		for _, a := range addrs {
			d := net.JoinHostPort(a.Unmap().String(), s.port)
			if !slices.Contains(found, d) && len(found) < s.t.endpoints.maxEndpoints {
				found = append(found, d)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.eps.Load()
	var eps []*endpoint
	switch {
	case len(found) <= 1:
		// One address, or none known: dialed by name, as net/http does.
		if old != nil && len(*old) == 1 && (*old)[0].dialAddr == "" {
			eps = *old
		} else {
			eps = s.byName()
		}
	default:
		for _, d := range found {
			var ep *endpoint
			if old != nil {
				if i := slices.IndexFunc(*old, func(e *endpoint) bool { return e.dialAddr == d }); i >= 0 {
					ep = (*old)[i]
				}
			}
			if ep == nil {
				ep = &endpoint{set: s, dialAddr: d}
			}
			eps = append(eps, ep)
		}
	}
	s.eps.Store(&eps)
	s.resolvedAt.Store(clock.Now())
}

// pick returns the endpoint for an attempt at now (its start: a few
// microseconds are nothing to estimates that decay over a second): among
// those not ejected (all of them if every one is) and, if there are any,
// not tried by e, the less loaded of two drawn at random.
func (s *endpointSet) pick(ctx context.Context, now int64, e *Elsewhere, skip []*endpoint) *endpoint {
	eps := s.endpoints(ctx, now)
	if len(eps) == 1 {
		return eps[0]
	}
	var buf [8]*endpoint
	cand := buf[:0]
	for pass := 0; pass < 3 && len(cand) == 0; pass++ {
		for _, ep := range eps {
			switch {
			case slices.Contains(skip, ep):
			case pass < 2 && ep.ejected(now):
			case pass < 1 && e != nil && e.has(ep):
			default:
				cand = append(cand, ep)
			}
		}
	}
	switch len(cand) {
	case 0:
		return nil
	case 1:
		return cand[0]
	}
	r := rand.Uint64() // one draw for both: i in [0, n), j in [0, n-1)
	n := uint64(len(cand))
	i := int(r % n)
	j := int((r / n) % (n - 1))
	if j >= i {
		j++
	}
	a, b := cand[i], cand[j]
	if !a.sampled() || !b.sampled() {
		def := s.meanLatency(eps, now) / 2
		if b.load(now, def) < a.load(now, def) {
			return b
		}
		return a
	}
	if b.lighter(a) {
		a, b = b, a
	}
	// a is the lighter. An endpoint with an idle connection is taken
	// over it if it has none — b, or else another — unless that one is
	// more than twice as loaded: without
	// that, each endpoint kept connections for the peaks of its share of
	// the attempts — 26 connections for 8 callers over five endpoints
	// against 8 by name, each costing the client and the server CPU.
	if a.warm() {
		return a
	}
	if b.warm() && !b.heavier(a, 2) {
		return b
	}
	for k := range cand { // the others, from a random one on
		if c := cand[(i+k)%len(cand)]; c != a && c != b && c.warm() && c.sampled() && !c.heavier(a, 2) {
			return c
		}
	}
	return a
}

// warm reports whether ep has an idle connection to take.
func (ep *endpoint) warm() bool {
	p := ep.pool.Load()
	return p != nil && p.idleN.Load() > 0
}

// lighter reports whether ep's load is below o's, both sampled: their
// estimates decayed to the same moment compare as decayed from one's stamp
// to the other's, so no clock is read and, under load (stamps close
// together), no exponential is computed.
func (ep *endpoint) lighter(o *endpoint) bool {
	return ep.relative(o) < 1
}

// heavier reports whether ep's load is more than f times o's, both
// sampled.
func (ep *endpoint) heavier(o *endpoint, f float64) bool {
	return ep.relative(o) > f
}

// relative is ep's load over o's, both sampled, their estimates decayed to
// the same moment.
func (ep *endpoint) relative(o *endpoint) float64 {
	la := max(ep.estimate(), 1) * float64(ep.inflight.Load()+1)
	lb := max(o.estimate(), 1) * float64(o.inflight.Load()+1)
	// ep's estimate decays from its stamp, o's from its own: relative to
	// o, ep's carries decay(o.stamp - ep.stamp) more, or less.
	return la * decay(o.stamp.Load()-ep.stamp.Load()) / lb
}

// decay is the estimate's decay over dt ns, exp(-dt/ewmaDecay); for a dt
// of under a millisecond either way (answers close together), its Taylor
// polynomial, within 2e-10 of it and a fraction of its cost.
func decay(dt int64) float64 {
	x := float64(dt) / float64(ewmaDecay)
	if x > -1e-3 && x < 1e-3 {
		return 1 - x + x*x/2
	}
	return math.Exp(-x)
}

// meanLatency is the mean estimate, decayed to now, of the endpoints that
// have one. Half of it is what an endpoint without a sample is assumed to
// take: it is tried before an idle endpoint of average latency, but not
// once it has an attempt in flight — a new endpoint is explored without a
// burst of attempts before its first answer.
func (s *endpointSet) meanLatency(eps []*endpoint, now int64) float64 {
	sum, n := 0.0, 0
	for _, ep := range eps {
		if ep.sampled() {
			sum += ep.decayed(now)
			n++
		}
	}
	if n == 0 {
		return 1
	}
	return sum / float64(n)
}

// sampled reports whether ep has a latency estimate.
func (ep *endpoint) sampled() bool { return ep.stamp.Load() != 0 }

// estimate is the latency estimate as of its last sample.
func (ep *endpoint) estimate() float64 { return math.Float64frombits(ep.ewma.Load()) }

// load is the endpoint's cost: its latency estimate, decayed to now, times
// the attempts in flight on it plus one.
func (ep *endpoint) load(now int64, def float64) float64 {
	l := def
	if ep.sampled() {
		l = ep.decayed(now)
	}
	return max(l, 1) * float64(ep.inflight.Load()+1)
}

// decayed is the estimate decayed from its last sample to now.
func (ep *endpoint) decayed(now int64) float64 {
	return ep.estimate() * decay(now-ep.stamp.Load())
}

// ejected reports whether ep is ejected at now, telling OnEject once when
// its ejection has ended.
func (ep *endpoint) ejected(now int64) bool {
	u := ep.until.Load()
	switch {
	case u == 0:
		return false
	case now < u:
		return true
	case !ep.until.CompareAndSwap(u, 0):
		return ep.ejected(now) // ejected again meanwhile, or ended by another pick
	}
	ep.mu.Lock()
	ep.lastEnd = now
	ep.mu.Unlock()
	ep.set.told(ep, 0)
	return false
}

// sample adds a latency of d ns at now: the estimate jumps to a higher one
// (the peak), and decays towards lower ones; with above, only a latency
// above the estimate is added (a lower bound of one). Samples that race
// are each applied, one perhaps decayed from the other's stamp: an error
// far below what a load estimate can see.
func (ep *endpoint) sample(now int64, d float64, above bool) {
	for {
		bits := ep.ewma.Load()
		e, stamp := math.Float64frombits(bits), ep.stamp.Load()
		if above && d <= e {
			return
		}
		n := d
		if stamp != 0 && d <= e {
			w := decay(now - stamp)
			n = e*w + d*(1-w)
		}
		if ep.ewma.CompareAndSwap(bits, math.Float64bits(n)) {
			ep.stamp.Store(now)
			return
		}
	}
}

// answered records an answer at now, elapsed ns after the connection was
// ready: a failure (failed) counts towards its ejection, anything else
// ends a run of failures.
func (ep *endpoint) answered(now, elapsed int64, failed bool) {
	ep.sample(now, float64(elapsed), false)
	ep.record(now, failed, ep.judgeSlow(now, elapsed, true))
}

// slow records that an attempt on ep was still waiting after elapsed ns
// when the caller gave up: it took at least that long.
func (ep *endpoint) slow(now, elapsed int64) {
	ep.sample(now, float64(elapsed), true)
	if ep.judgeSlow(now, elapsed, false) {
		ep.eject(now)
	}
}

// judgeSlow counts an outcome of ep that took elapsed ns towards its
// ejection by latency (Ejection.SlowFactor) and reports whether it is due:
// a slow one extends the run, an answer (answer) that was not ends it.
func (ep *endpoint) judgeSlow(now, elapsed int64, answer bool) bool {
	cfg := ep.set.t.endpoints
	switch {
	case cfg.slowFactor == 0:
		return false
	case elapsed > cfg.slowMin && float64(elapsed) > cfg.slowFactor*ep.set.medianLatency(now):
		return int(ep.slowRun.Add(1)) >= cfg.slowRun
	case answer && ep.slowRun.Load() != 0:
		ep.slowRun.Store(0)
	}
	return false
}

// medianLatency is the lower median of the latency estimates of the set's
// endpoints not ejected that have one, as of their last samples (decayed,
// an endpoint that answered a while ago would look faster than it is):
// with two, the faster; with more, one slow endpoint does not move it.
func (s *endpointSet) medianLatency(now int64) float64 {
	eps := s.eps.Load()
	if eps == nil {
		return math.Inf(1)
	}
	var buf [defaultMaxEndpoints]float64
	est := buf[:0]
	for _, ep := range *eps {
		if ep.sampled() && !ep.ejected(now) {
			est = append(est, ep.estimate())
		}
	}
	if len(est) < 2 {
		return math.Inf(1) // nothing to compare with
	}
	slices.Sort(est)
	return est[(len(est)-1)/2]
}

// failed records a failure of ep's own without an answer (a connection not
// made, an attempt lost); elapsed, if not negative, is how long the attempt
// waited for it (a latency it took at least).
func (ep *endpoint) failed(now int64, elapsed int64) {
	if elapsed >= 0 {
		ep.sample(now, float64(elapsed), true)
	}
	ep.record(now, true, false)
}

// record counts an outcome of ep's own, a failure or not, and ejects ep,
// within the share allowed, after ConsecutiveFailures failures in a row,
// when FailureRate of a window of its outcomes failed, or when slow says
// its latency is due.
func (ep *endpoint) record(now int64, failed, slow bool) {
	cfg := ep.set.t.endpoints
	due := slow
	if failed {
		ep.windowFails.Add(1)
		due = cfg.failures > 0 && int(ep.fails.Add(1)) >= cfg.failures || due
	} else if ep.fails.Load() != 0 {
		ep.fails.Store(0) // read first: most answers write nothing here
	}
	if n := ep.window.Add(1); int(n) == cfg.window { // the outcome that fills the window judges it
		f := ep.windowFails.Swap(0)
		ep.window.Store(0)
		due = due || cfg.rate > 0 && float64(f) >= cfg.rate*float64(n)
	}
	if due {
		ep.eject(now)
	}
}

// eject ejects ep at now, unless it is already, or the share of the host's
// endpoints ejected allows no more, or it is the last one.
func (ep *endpoint) eject(now int64) {
	s, cfg := ep.set, ep.set.t.endpoints
	if ep.until.Load() != 0 || ep.dialAddr == "" {
		return
	}
	s.mu.Lock()
	eps := s.eps.Load()
	if eps == nil {
		s.mu.Unlock()
		return
	}
	n, out := len(*eps), 0
	for _, o := range *eps {
		if u := o.until.Load(); o != ep && u != 0 && u > now {
			out++
		}
	}
	allowed := max(1, int(cfg.share*float64(n)))
	if out+1 > allowed || out+1 >= n || !slices.Contains(*eps, ep) {
		s.mu.Unlock()
		return
	}
	ep.mu.Lock()
	if ep.lastEnd != 0 && now-ep.lastEnd >= cfg.cap {
		ep.ejections = 0
	}
	ep.ejections++
	d := min(cfg.base*int64(ep.ejections), cfg.cap)
	ep.until.Store(now + d)
	ep.mu.Unlock()
	ep.fails.Store(0)
	ep.slowRun.Store(0)
	ep.window.Store(0)
	ep.windowFails.Store(0)
	s.mu.Unlock()
	s.told(ep, time.Duration(d))
}

// told tells OnEject of an ejection of ep for d, or its end (0); a panic
// of OnEject is recovered: the attempt that ejected goes on.
func (s *endpointSet) told(ep *endpoint, d time.Duration) {
	if f := s.t.endpoints.onEject; f != nil {
		defer func() { _ = recover() }()
		f(s.up.key, ep.dialAddr, d)
	}
}

// learned reports whether an endpoint of s has failures in a row or in
// its window, or is ejected: the upstream is not forgotten to make room or with its last
// connection then.
func (s *endpointSet) learned() bool {
	return s.any(func(ep *endpoint, now int64) bool {
		u := ep.until.Load()
		return ep.fails.Load() > 0 || ep.windowFails.Load() > 0 || u != 0 && u > now
	})
}

// ejecting reports whether an endpoint of s is ejected: the upstream is
// not forgotten then, however idle.
func (s *endpointSet) ejecting() bool {
	return s.any(func(ep *endpoint, now int64) bool { u := ep.until.Load(); return u != 0 && u > now })
}

// any reports whether f holds for an endpoint of s.
func (s *endpointSet) any(f func(ep *endpoint, now int64) bool) bool {
	eps := s.eps.Load()
	if eps == nil {
		return false
	}
	now := clock.Now()
	for _, ep := range *eps {
		if f(ep, now) {
			return true
		}
	}
	return false
}

// connectTo returns a connection of p with a request slot reserved, and
// the pool it came from: p, or the pool that replaced it if p was
// forgotten while the route to it was kept.
func (t *Attempter) connectTo(ctx context.Context, p *pool, o Options) (*pool, *conn, int32, error) {
	c, seq, err := p.get(ctx, o)
	for err == errPoolForgotten { // the route outlived its pool: the address has a new one
		if p, err = t.renewPool(p); err == nil {
			c, seq, err = p.get(ctx, o)
		}
	}
	return p, c, seq, err
}

// connect picks an endpoint of s for an attempt (pick) and returns a
// connection to it with a request slot reserved. A connection that cannot
// be made to the endpoint (nothing was sent) counts against it, and
// another endpoint is tried, within ctx, as net/http's dialer tries every
// address of a host; the error is the last endpoint's.
func (t *Attempter) connect(ctx context.Context, s *endpointSet, o Options, epoch uint32, now int64) (*endpoint, *pool, *conn, int32, error) {
	var tried []*endpoint
	var err error
	for {
		ep := s.pick(ctx, now, o.Elsewhere, tried)
		if ep == nil {
			return nil, nil, nil, 0, err // every endpoint was tried
		}
		if o.Elsewhere != nil {
			o.Elsewhere.add(ep)
		}
		if o.Endpoint != nil {
			*o.Endpoint = ep.dialAddr
		}
		p, perr := t.endpointPool(ep)
		if perr != nil {
			return ep, nil, nil, 0, perr
		}
		p.used.touch(epoch)
		ep.inflight.Add(1)
		var c *conn
		var seq int32
		p, c, seq, err = t.connectTo(ctx, p, o)
		if p != nil {
			ep.pool.Store(p)
		}
		if err == nil {
			return ep, p, c, seq, nil
		}
		ep.inflight.Add(-1)
		var de *dialError
		if !errors.As(err, &de) || de.stage == classify.StageDNS || ctx.Err() != nil {
			return ep, p, nil, 0, err // not the endpoint's: the caller's, or the client's
		}
		ep.failed(clock.Now(), -1)
		if ep.dialAddr == "" {
			return ep, p, nil, 0, err
		}
		tried = append(tried, ep)
	}
}

// endpointPool returns ep's pool, made when the endpoint is first used.
func (t *Attempter) endpointPool(ep *endpoint) (*pool, error) {
	if p := ep.pool.Load(); p != nil {
		return p, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil, errPoolClosed
	}
	if p := ep.pool.Load(); p != nil {
		return p, nil
	}
	s, u := ep.set, ep.set.up
	if u.forgotten.Load() { // while the attempt held its permit: kept again, as renewPool does
		if cur := t.upstreams[u.key]; cur != nil {
			u = cur
		} else {
			t.adoptLocked(u)
		}
	}
	p := t.poolLocked(u, s.scheme, s.addr, ep.dialAddr, nil, "")
	ep.pool.Store(p)
	return p, nil
}
