package attempt

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"golang.org/x/net/idna"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/clock"
)

// What an Attempter keeps per upstream (its admission pipeline), per address
// (a pool of connections) and per URL host (a route to both), and how it
// forgets what is idle.
//
// An upstream is forgotten after UpstreamIdleTime without an attempt, if it
// holds nothing worth keeping: its breaker is in the state it started in
// (CLOSED unless circuit.Config.StartState says otherwise; never OPEN,
// HALF_OPEN or another state an operator set), no bulkhead slot is held, and its rate
// limiter has every token back (a new one would allow no more). An address's
// pool is forgotten after the same time if it has no connection. A forgotten
// upstream starts afresh: a CLOSED (or METRICS_ONLY) breaker's window is forgotten with it,
// since outcomes older than UpstreamIdleTime are not recent. Forgetting is
// done by a sweeper, a timer that runs every quarter of UpstreamIdleTime
// while anything is kept: an attempt only records the sweep it happened in
// (no clock read, no lock), and an entry not used for five sweeps is idle.
//
// MaxUpstreams caps the upstreams kept: a new one beyond it makes room by
// forgetting the least recently used that hold nothing and have learned
// nothing from recent outcomes (forgettable), whatever their idle time, and
// is refused (classify.ErrTooManyUpstreams, a local rejection) when none
// does — an outage is never forgotten to make room.

const (
	// defaultUpstreamIdleTime is how long an idle upstream is kept.
	defaultUpstreamIdleTime = 5 * time.Minute
	// sweepsPerIdleTime is how often the sweeper runs per idle time; an
	// entry unused for one sweep more is idle.
	sweepsPerIdleTime = 4
)

// upstream is the state kept for one upstream key.
type upstream struct {
	key       string
	pipeline  *admission.Pipeline
	state     any // Config.UpstreamState's
	used      epochMark
	held      atomic.Int64   // admission permits not yet resolved: attempts in flight, bodies open
	forgotten atomic.Bool    // written under Attempter.mu
	pools     []*pool        // per address (endpoint) and proxy; guarded by Attempter.mu
	sets      []*endpointSet // per address, with Config.Endpoints; guarded by Attempter.mu
	routes    []hostKey      // the keys of Attempter.routes that lead to it; guarded by Attempter.mu
}

// epochMark is the sweep in which an entry was last used.
type epochMark struct{ atomic.Uint32 }

// touch records that the entry is used in sweep epoch: a store only when
// the sweep has changed, so that concurrent attempts mostly share the line.
func (m *epochMark) touch(epoch uint32) {
	if m.Load() != epoch {
		m.Store(epoch)
	}
}

// idleSince reports whether the entry was not used in the last
// sweepsPerIdleTime sweeps before epoch.
func (m *epochMark) idleSince(epoch uint32) bool { return epoch-m.Load() > sweepsPerIdleTime }

type hostKey struct{ scheme, host, proxy string }

// Route is where a request goes: the upstream it is admitted against and the
// pool of connections to its address. Attempter.Route finds it. A Route is
// for one call (all of its attempts): an upstream idle for the idle time, or
// pushed out by newer ones, is forgotten, and a Route kept past that points
// at state the Attempter no longer counts or shows.
type Route struct {
	key  string
	up   *upstream
	pool *pool        // its address's pool; nil with set
	set  *endpointSet // its address's endpoints (Config.Endpoints); nil with pool
}

// Key returns the route's upstream key.
func (r *Route) Key() string { return r.key }

// Pipeline returns the route's admission pipeline.
func (r *Route) Pipeline() *admission.Pipeline { return r.up.pipeline }

// Ejected reports whether the endpoint ("ip:port") of the route's host is
// ejected now (Config.Endpoints); false for any other.
func (r *Route) Ejected(endpoint string) bool {
	if r.set == nil || endpoint == "" {
		return false
	}
	eps := r.set.eps.Load()
	if eps == nil {
		return false
	}
	now := clock.Now()
	for _, ep := range *eps {
		if ep.dialAddr == endpoint {
			u := ep.until.Load()
			return u != 0 && now < u
		}
	}
	return false
}

// State returns what Config.UpstreamState made for the route's upstream, or
// nil.
func (r *Route) State() any { return r.up.state }

// DefaultUpstreamKey returns "scheme://host:port" of the request's URL, in
// one spelling per host: the host in lower case without a trailing dot, an
// IP address in its canonical form, and the scheme's default port when the
// URL has none. Spellings of one host thus share one breaker, rate limiter
// and bulkhead. (A custom Config.UpstreamKey is responsible for its own.)
func DefaultUpstreamKey(req *http.Request) string {
	return req.URL.Scheme + "://" + address(req)
}

// address returns the canonical "host:port" of req's URL (see
// DefaultUpstreamKey): what a connection is dialed to and pooled by.
func address(req *http.Request) string {
	host, port := req.URL.Hostname(), req.URL.Port()
	switch {
	case port == "" && req.URL.Scheme == "https":
		port = "443"
	case port == "":
		port = "80"
	case port[0] == '0':
		if n, err := strconv.Atoi(port); err == nil {
			port = strconv.Itoa(n)
		}
	}
	return net.JoinHostPort(canonicalHost(host), port)
}

// canonicalHost returns one spelling of the host h: an IP address in its
// canonical form — an IPv4-mapped IPv6 address as the IPv4 address it is; a
// zone only where it means something (a link-local address), by interface
// name rather than index — and a name in lower case, without a trailing dot,
// in ASCII (IDNA, as net/http dials it).
func canonicalHost(h string) string {
	if ip, err := netip.ParseAddr(h); err == nil {
		ip = ip.Unmap()
		if z := ip.Zone(); z != "" {
			switch {
			case !ip.IsLinkLocalUnicast() && !ip.IsLinkLocalMulticast() && !ip.IsInterfaceLocalMulticast():
				ip = ip.WithZone("")
			default:
				if n, err := strconv.Atoi(z); err == nil {
					if ifc, err := net.InterfaceByIndex(n); err == nil {
						ip = ip.WithZone(ifc.Name)
					}
				}
			}
		}
		return ip.String()
	}
	h = strings.TrimSuffix(h, ".")
	for i := 0; i < len(h); i++ {
		if h[i] >= utf8.RuneSelf {
			if a, err := idna.Lookup.ToASCII(h); err == nil {
				h = a
			}
			break
		}
	}
	return strings.ToLower(h)
}

// UpstreamKey returns the key of the upstream req is admitted against.
func (t *Attempter) UpstreamKey(req *http.Request) string { return t.key(req) }

// Route returns where req goes. With the default upstream key, routes are
// cached per scheme, URL host and proxy, so finding one allocates nothing
// when no proxy is configured. The Transport's Proxy, if any, is called here
// with req itself.
func (t *Attempter) Route(req *http.Request) (*Route, error) {
	if req.URL == nil || req.URL.Host == "" || (req.URL.Scheme != "http" && req.URL.Scheme != "https") {
		return nil, errUnsupportedURL(req)
	}
	var proxy *url.URL
	hk := hostKey{scheme: req.URL.Scheme, host: req.URL.Host}
	if t.proxy != nil {
		u, err := t.proxy(req)
		if err != nil {
			return nil, fmt.Errorf("outbound: the Transport's Proxy refused the request: %w", err)
		}
		if u != nil {
			proxy, hk.proxy = u, u.String()
		}
	}
	if !t.customKey {
		t.mu.RLock()
		r := t.routes[hk]
		t.mu.RUnlock()
		if r != nil {
			return r, nil
		}
	}
	key := t.key(req)
	t.mu.Lock()
	if t.closed.Load() {
		t.mu.Unlock()
		return nil, errPoolClosed
	}
	u, err := t.upstreamLocked(key)
	var r *Route
	if err == nil {
		addr := address(req)
		r = &Route{key: key, up: u}
		if t.endpoints != nil && proxy == nil && !t.customTLS {
			r.set = t.setLocked(u, req.URL.Scheme, addr)
		} else {
			r.pool = t.poolLocked(u, req.URL.Scheme, addr, "", proxy, hk.proxy)
		}
		if !t.customKey {
			if old := t.routes[hk]; old == nil || old.up != u {
				u.routes = append(u.routes, hk)
			}
			t.routes[hk] = r
			t.peaks[1] = max(t.peaks[1], len(t.routes))
		}
	}
	forgotten, toClose := t.toNotify, t.toClose
	t.toNotify, t.toClose = nil, nil
	t.mu.Unlock()
	for _, p := range toClose {
		p.closeAndForget()
	}
	t.notifyForgotten(forgotten)
	return r, err
}

// errUnsupportedURL names the scheme and host only: a URL's path and query
// may carry secrets, and errors end up in logs.
func errUnsupportedURL(req *http.Request) error {
	if req.URL == nil {
		return errors.New("outbound: request has no URL")
	}
	return fmt.Errorf("outbound: unsupported request URL: scheme %q, host %q (want http or https, and a host)", req.URL.Scheme, req.URL.Host)
}

// State returns what Config.UpstreamState made for the upstream named key,
// and whether the Attempter keeps the upstream. Looking does not create it.
func (t *Attempter) State(key string) (any, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if u := t.upstreams[key]; u != nil {
		return u.state, true
	}
	return nil, false
}

// Pipeline returns the admission pipeline of the upstream named key, and
// whether the Attempter keeps one: it reports false for a key that never had
// a call or that was forgotten. Looking does not create it.
func (t *Attempter) Pipeline(key string) (*admission.Pipeline, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if u := t.upstreams[key]; u != nil {
		return u.pipeline, true
	}
	return nil, false
}

// Upstreams returns the keys of the upstreams whose state the Attempter
// keeps, in order.
func (t *Attempter) Upstreams() []string {
	t.mu.RLock()
	keys := make([]string, 0, len(t.upstreams))
	for k := range t.upstreams {
		keys = append(keys, k)
	}
	t.mu.RUnlock()
	slices.Sort(keys)
	return keys
}

// Breakers returns a snapshot of the breaker of every upstream kept, by key.
func (t *Attempter) Breakers() map[string]circuit.Metrics {
	t.mu.RLock()
	ps := make(map[string]*admission.Pipeline, len(t.upstreams))
	for k, u := range t.upstreams {
		ps[k] = u.pipeline
	}
	t.mu.RUnlock()
	out := make(map[string]circuit.Metrics, len(ps))
	for k, p := range ps {
		out[k] = p.Breaker().Metrics()
	}
	return out
}

// upstreamLocked returns the upstream named key, creating it (within
// MaxUpstreams) if needed; t.mu must be held for writing.
func (t *Attempter) upstreamLocked(key string) (*upstream, error) {
	if u := t.upstreams[key]; u != nil {
		return u, nil
	}
	if t.maxUpstreams > 0 && len(t.upstreams) >= t.maxUpstreams && !t.makeRoomLocked() {
		return nil, classify.ErrTooManyUpstreams
	}
	cfg := t.admission
	cfg.Upstream = key
	p, _ := admission.New(cfg) // validated in New
	u := &upstream{key: key, pipeline: p}
	if t.newState != nil {
		u.state = t.newState(key)
	}
	u.used.Store(t.epoch.Load())
	t.upstreams[key] = u
	t.peaks[0] = max(t.peaks[0], len(t.upstreams))
	t.armSweeperLocked()
	return u, nil
}

// poolLocked returns u's pool for scheme, addr and proxy, creating it if
// needed; t.mu must be held for writing.
func (t *Attempter) poolLocked(u *upstream, scheme, addr, dial string, proxy *url.URL, proxyKey string) *pool {
	k := scheme + "://" + addr
	if dial != "" {
		k += " at " + dial
	}
	if proxyKey != "" {
		k += " via " + proxyKey
	}
	for _, p := range u.pools {
		if p.key == k {
			return p
		}
	}
	p := &pool{t: t, up: u, key: k, scheme: scheme, addr: addr, dialAt: dial, proxy: proxy}
	p.used.Store(t.epoch.Load())
	u.pools = append(u.pools, p)
	t.armSweeperLocked()
	return p
}

// renewPool returns the pool that replaces p, forgotten while an attempt
// still held a route to it: the upstream's new one, the upstream being kept
// again if it was forgotten meanwhile (the attempt holds its permit) and no
// other has taken its key.
func (t *Attempter) renewPool(p *pool) (*pool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed.Load() {
		return nil, errPoolClosed
	}
	u := p.up
	if u.forgotten.Load() {
		if cur := t.upstreams[u.key]; cur != nil {
			u = cur
		} else {
			t.adoptLocked(u)
		}
	}
	proxyKey := ""
	if p.proxy != nil {
		proxyKey = p.proxy.String()
	}
	return t.poolLocked(u, p.scheme, p.addr, p.dialAt, p.proxy, proxyKey), nil
}

// adoptLocked keeps u again, forgotten while a permit of it was being
// taken; t.mu must be held for writing.
func (t *Attempter) adoptLocked(u *upstream) {
	u.forgotten.Store(false)
	u.pools, u.sets = nil, nil // forgotten with it
	t.upstreams[u.key] = u
	t.armSweeperLocked()
}

// armSweeperLocked arms the sweeper if it is not armed; t.mu must be held
// for writing.
func (t *Attempter) armSweeperLocked() {
	if t.keep > 0 && t.sweeper == nil && !t.closed.Load() {
		t.sweeper = time.AfterFunc(t.keep/sweepsPerIdleTime, t.sweep)
	}
}

// forgettable reports whether u holds nothing worth keeping (see the
// comment at the top of this file): no permit held, every rate token back,
// the breaker in its start state — and, when room is to be made for another
// upstream or its last connection has gone (busy), nothing learned from
// recent outcomes, by its guards (admission.Pipeline.Learned) or by the
// layer above (Config.UpstreamState): an upstream in use is not forgotten
// to make room or because its connections close, whereas outcomes older
// than the idle time are no longer recent.
func (t *Attempter) forgettable(u *upstream, busy bool) bool {
	p := u.pipeline
	if u.held.Load() != 0 || p.Breaker().State() != t.admission.Circuit.StartState || !p.Limiter().Full() {
		return false
	}
	if slices.ContainsFunc(u.sets, (*endpointSet).ejecting) {
		return false // forgetting an ejection would be a way around it
	}
	if busy {
		l, ok := u.state.(interface{ Learned() bool })
		return !p.Learned() && (!ok || !l.Learned()) && !slices.ContainsFunc(u.sets, (*endpointSet).learned)
	}
	return true
}

// sweep forgets what has been idle for the idle time, and arms itself again
// while anything is kept.
func (t *Attempter) sweep() {
	epoch := t.epoch.Add(1)
	t.mu.Lock()
	var forgotten []string
	for key, u := range t.upstreams {
		kept := u.pools[:0]
		for _, p := range u.pools {
			if !p.used.idleSince(epoch) || !p.forget() {
				kept = append(kept, p)
			}
		}
		clear(u.pools[len(kept):])
		u.pools = kept
		if len(u.pools) == 0 && u.used.idleSince(epoch) && t.forgettable(u, false) {
			t.forgetLocked(u)
			forgotten = append(forgotten, key)
		}
	}
	t.dropRoutesLocked()
	t.shrinkLocked()
	t.sweeper = nil
	if len(t.upstreams) > 0 {
		t.armSweeperLocked()
	}
	t.mu.Unlock()
	t.notifyForgotten(forgotten)
}

// lastConnGone is told by p that its last connection is gone: an upstream
// that then holds nothing, whose breaker is clean and that has learned
// nothing worth remembering about its connections (pool.remembers), is
// forgotten at once, with its pools — an upstream called once costs nothing
// once its connection has closed — rather than after the idle time.
func (t *Attempter) lastConnGone(p *pool) {
	t.mu.Lock()
	u := p.up
	if t.closed.Load() || u.forgotten.Load() || t.upstreams[u.key] != u || !t.forgettable(u, true) {
		t.mu.Unlock()
		return
	}
	for i, q := range u.pools {
		if q.remembers() || !q.forget() {
			// The upstream stays, without the pools forgotten before q:
			// a forgotten pool left in u.pools would be found again by
			// every attempt to its address, which would renew it to
			// itself for ever.
			u.pools = slices.Delete(u.pools, 0, i)
			t.mu.Unlock()
			return
		}
	}
	t.forgetLocked(u)
	t.shrinkLocked()
	t.mu.Unlock()
	t.notifyForgotten([]string{u.key})
}

// makeRoomLocked forgets, to make room for a new upstream, the least
// recently used sixteenth of MaxUpstreams (at least one) among the upstreams
// that hold nothing and are in no use (forgettable, and nothing in flight on
// their connections), whatever their idle time — their idle connections are
// closed; it reports whether it forgot any. t.mu must be held for writing.
func (t *Attempter) makeRoomLocked() bool {
	var candidates []*upstream
	for _, u := range t.upstreams {
		if t.forgettable(u, true) && !slices.ContainsFunc(u.pools, (*pool).busy) {
			candidates = append(candidates, u)
		}
	}
	if len(candidates) == 0 {
		return false
	}
	epoch := t.epoch.Load()
	slices.SortFunc(candidates, func(a, b *upstream) int { // the longest unused first
		return int(epoch-b.used.Load()) - int(epoch-a.used.Load())
	})
	n := min(len(candidates), max(t.maxUpstreams/16, 1))
	keys := make([]string, 0, n)
	for _, u := range candidates[:n] {
		t.toClose = append(t.toClose, u.pools...) // closed outside the lock, by the caller
		t.forgetLocked(u)
		keys = append(keys, u.key)
	}
	t.toNotify = append(t.toNotify, keys...) // told outside the lock, by the caller
	return true
}

// shrinkLocked rebuilds the maps that shrank to a quarter of their peak:
// a Go map keeps its buckets when entries are deleted, so an Attempter that
// once knew many upstreams would otherwise keep their room. t.mu must be held
// for writing.
func (t *Attempter) shrinkLocked() {
	t.upstreams = shrunk(t.upstreams, &t.peaks[0])
	t.routes = shrunk(t.routes, &t.peaks[1])
}

// shrunk returns m, or a copy of it if it shrank to a quarter of *peak, the
// most entries it held since it was made; it keeps *peak up to date.
func shrunk[K comparable, V any](m map[K]V, peak *int) map[K]V {
	*peak = max(*peak, len(m))
	if *peak < 64 || len(m) > *peak/4 {
		return m
	}
	*peak = len(m)
	n := make(map[K]V, len(m)) // not maps.Clone, which keeps m's room
	maps.Copy(n, m)
	return n
}

// forgetLocked forgets u, its pools (forgotten, or closed, by the caller)
// and the routes to it — by their keys, so that forgetting upstreams one at
// a time costs each its own routes, not a look at every route; t.mu must be
// held for writing.
func (t *Attempter) forgetLocked(u *upstream) {
	delete(t.upstreams, u.key)
	u.forgotten.Store(true)
	for _, hk := range u.routes {
		if r := t.routes[hk]; r != nil && r.up == u {
			delete(t.routes, hk)
		}
	}
	u.pools, u.sets, u.routes = nil, nil, nil
}

// dropRoutesLocked drops the routes to forgotten pools of upstreams still
// known (a forgotten upstream's went with it), looking at every route: the
// sweep's work, once per sweep; t.mu must be held for writing.
func (t *Attempter) dropRoutesLocked() {
	for hk, r := range t.routes {
		gone := false
		if r.pool != nil {
			r.pool.mu.Lock()
			gone = r.pool.forgotten
			r.pool.mu.Unlock()
		}
		if gone || r.up.forgotten.Load() {
			delete(t.routes, hk)
		}
	}
}

// notifyForgotten tells Config.OnForget of the forgotten keys.
func (t *Attempter) notifyForgotten(keys []string) {
	if t.onForget == nil {
		return
	}
	for _, k := range keys {
		func() {
			defer func() { _ = recover() }()
			t.onForget(k)
		}()
	}
}

// CloseIdleConnections closes every connection that carries no request.
func (t *Attempter) CloseIdleConnections() {
	for _, p := range t.allPools() {
		p.closeIdle()
	}
}

// Close closes every connection, interrupting requests in flight, and stops
// the sweeper; later calls fail.
func (t *Attempter) Close() {
	t.mu.Lock()
	t.closed.Store(true) // under the lock too: the sweeper is armed under it
	if t.sweeper != nil {
		t.sweeper.Stop()
		t.sweeper = nil
	}
	t.mu.Unlock()
	for _, p := range t.allPools() {
		p.close()
	}
}

func (t *Attempter) allPools() []*pool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var ps []*pool
	for _, u := range t.upstreams {
		ps = append(ps, u.pools...)
	}
	return ps
}
