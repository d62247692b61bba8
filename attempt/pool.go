package attempt

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/clock"
)

// pool holds the connections to one address. Each is an *http.ClientConn:
// one connection with no retries of its own, so that each RoundTrip on it is
// exactly one physical attempt.
//
// It honours the connection limits of the configured http.Transport as
// net/http does: at most MaxIdleConnsPerHost idle connections per address
// (net/http's default of 2 when zero), at most MaxIdleConns idle
// connections across every address (the Attempter's idle list), at most
// MaxConnsPerHost connections, dialing included, per address (an attempt
// that would need one more waits, within its context, for one to free up),
// and IdleConnTimeout.
type pool struct {
	t      *Attempter
	up     *upstream // its owner
	key    string    // among its owner's pools: scheme://addr, and the proxy
	scheme string
	addr   string   // "host:port", as the URL names it: the TLS server name, and the Host
	dialAt string   // the endpoint's "ip:port" its connections are dialed to; empty: addr
	proxy  *url.URL // the proxy every connection of the pool goes through, or nil

	used epochMark // the sweep of its last attempt

	mu        sync.Mutex
	conns     []*conn
	ready     []*conn         // connections that had room when last seen, most recent last
	idle      int             // connections with nothing in flight (conn.isIdle)
	idleN     atomic.Int32    // idle, read without the lock (endpointSet.pick)
	dials     int             // dials in progress
	waiters   []chan struct{} // attempts waiting for MaxConnsPerHost to allow one more connection
	h2        bool            // the upstream answered over HTTP/2: share one connection
	dialing   chan struct{}   // closed when the HTTP/2 dial in progress ends
	closed    bool
	forgotten bool // no longer its upstream's: attempts find a new pool for the address

	// streamLimits are the numbers of streams the upstream accepted on
	// its last HTTP/2 connections that ended with a GOAWAY leaving
	// streams of ours above its last id (see streamLimit); next is where
	// the next one goes. Guarded by mu.
	streamLimits [4]int32
	nextLimit    int

	// idleCloses are how long its last connections that the upstream
	// closed while they carried nothing had been idle (see idleLimit);
	// nextIdle is where the next one goes. Guarded by mu.
	idleCloses [4]time.Duration
	nextIdle   int
}

type conn struct {
	p       *pool
	cc      *http.ClientConn
	raw     *countingConn // nil for a *tls.Conn from DialTLSContext
	born    time.Time     // when it was dialed
	streams atomic.Int32  // requests it carried: more than one, and a failure with nothing written may be the keep-alive race
	http1   atomic.Bool   // has answered over HTTP/1
	retired atomic.Bool   // out of the pool; closed when nothing is in flight

	// answered counts the requests on it that got an answer, above those
	// that failed for being above a GOAWAY's last-stream-id: what the
	// upstream accepted on it, and what it refused.
	answered, above atomic.Int32

	// maxFree is the most request slots seen free on it at once (the one
	// an attempt had just reserved included): a lower bound of its
	// concurrency limit. See goingAway.
	maxFree atomic.Int32

	// suspect is the count of answers c must reach before a request that
	// cannot be sent again may use it: set when an attempt takes it after
	// it was idle for the pool's idle limit (see get).
	suspect atomic.Int32

	// idleLearnt is set once the pool has learnt from c how long the
	// upstream let it idle (closedByPeer), so that it learns once per
	// connection.
	idleLearnt atomic.Bool

	inReady bool // on p.ready; guarded by p.mu
	isIdle  bool // nothing in flight, counted in p.idle and on the Attempter's idle list; guarded by p.mu

	// On the Attempter's idle list (MaxIdleConns); guarded by its lock.
	idlePrev, idleNext *conn
	listed             bool

	// idleSince is when the connection last had nothing in flight
	// (clock.Now). The idle timer, armed the first time, compares it with
	// the idle timeout and re-arms itself, so that a request costs no timer
	// operation.
	idleSince atomic.Int64
	idleArmed atomic.Bool

	mu      sync.Mutex
	idleT   *time.Timer
	idleFor *idleTarget // what the idle timer checks; cleared when it stops
	stopped bool        // retired: the idle timer is stopped for good
}

// idleTarget is the connection an idle timer checks. A stopped timer may
// stay in the runtime's timer heap for a while, with its function: through
// this indirection, cleared when the timer stops, it does not keep the
// closed connection reachable meanwhile.
type idleTarget struct{ c atomic.Pointer[conn] }

func (t *idleTarget) fire() {
	if c := t.c.Load(); c != nil {
		c.idleCheck()
	}
}

var (
	errPoolClosed    = errors.New("outbound: transport closed")
	errPoolForgotten = errors.New("outbound: pool forgotten") // internal: the attempt finds the address's new pool
)

// connLimitError is an attempt that gave up waiting for MaxConnsPerHost to
// allow a connection: it wrote nothing.
type connLimitError struct{ err error }

func (e *connLimitError) Error() string {
	return "outbound: waited for a connection (Transport.MaxConnsPerHost reached): " + e.err.Error()
}
func (e *connLimitError) Unwrap() error { return e.err }

// get returns a connection with a reserved request slot, dialing one if
// none has room, and the number of the request among those the connection
// carried (1 for its first). With a non-zero o.NotBefore, connections opened
// before it are not used. With o.OneShot (the request cannot be sent again
// once its body is read), an HTTP/2 connection close to the number of
// streams the upstream accepts per connection is not used either (see
// streamLimit); with o.Unretryable, nor is a connection that has been idle
// nearly as long as the upstream keeps idle connections (see idleLimit).
// The stage of a failure is DNS, dial or TLS.
func (p *pool) get(ctx context.Context, o Options) (*conn, int32, error) {
	for {
		p.mu.Lock()
		switch {
		case p.closed:
			p.mu.Unlock()
			return nil, 0, errPoolClosed
		case p.forgotten:
			p.mu.Unlock()
			return nil, 0, errPoolForgotten
		}
		var avoid avoidance
		if o.OneShot && p.h2 {
			avoid.maxStreams = p.streamLimit()
		}
		var idleLimit time.Duration
		if o.Unretryable || p.h2 {
			idleLimit = p.idleLimit()
		}
		if o.Unretryable && idleLimit > 0 {
			avoid.idleBefore = clock.Now() - int64(idleLimit)
		}
		if m := p.t.maxConnRequests; m > 0 && (avoid.maxStreams == 0 || m < avoid.maxStreams) {
			avoid.maxStreams = m // take, below, holds it against racing attempts
		}
		if p.t.maxConnAge > 0 || p.t.maxConnRequests > 0 {
			if spent := p.spentLocked(); len(spent) > 0 {
				p.mu.Unlock()
				for _, c := range spent {
					p.retire(c) // closed once what is in flight has ended
				}
				continue
			}
		}
		// The most recently freed connection first (its TCP and TLS state
		// is warm). Busy connections are never asked, so an attempt does
		// not pay a failed Reserve (an allocation) per busy connection.
		// Reserve may run the connection's state hook, which takes p.mu:
		// it is called without the lock.
		//
		// An HTTP/1 connection carries one request at a time: it leaves the
		// ready stack with this attempt. An HTTP/2 one stays for the next
		// attempts while it has room for more streams.
		if i := p.readyIndex(o.NotBefore, avoid); i >= 0 {
			c, h2 := p.ready[i], p.h2
			if !h2 {
				p.ready = slices.Delete(p.ready, i, i+1)
				c.inReady = false
			}
			wasIdle := p.busyLocked(c)
			p.mu.Unlock()
			if wasIdle {
				p.t.idle.remove(c)
				if h2 && idleLimit > 0 && clock.Now()-c.idleSince.Load() >= int64(idleLimit) {
					// Idle about as long as the upstream keeps idle
					// connections: it may be closing it as this attempt
					// arrives. Until an answer shows that it took this
					// burst, requests that cannot be sent again keep off.
					c.suspect.Store(c.answered.Load() + 1)
				}
			}
			seq, ok := c.take(avoid.maxStreams)
			if !ok {
				continue // others took it to the limit meanwhile
			}
			if c.cc.Reserve() == nil {
				avail := c.cc.Available()
				c.noteFree(avail + 1) // and the slot just reserved
				if h2 && avail == 0 {
					p.dropReady(c)
				} else if !h2 && avail > 0 {
					p.putReady(c) // HTTP/2 before the pool learnt it
				}
				return c, seq, nil
			}
			if h2 {
				p.dropReady(c) // stale: filled up or died since; the hook brings it back
				if wasIdle && c.goingAway() {
					p.closedByPeer(c, true) // a GOAWAY while it was idle
				}
			}
			continue
		}
		if p.h2 && p.dialing != nil { // one HTTP/2 dial at a time
			wait := p.dialing
			p.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, 0, &dialError{stage: classify.StageDial, err: ctx.Err()}
			}
		}
		if limit := p.t.maxConnsPerHost; limit > 0 && len(p.conns)+p.dials >= limit {
			wake := make(chan struct{})
			p.waiters = append(p.waiters, wake)
			p.mu.Unlock()
			select {
			case <-wake:
				continue
			case <-ctx.Done():
				p.mu.Lock()
				if i := slices.Index(p.waiters, wake); i >= 0 {
					p.waiters = slices.Delete(p.waiters, i, i+1)
				}
				p.mu.Unlock()
				return nil, 0, &connLimitError{err: ctx.Err()}
			}
		}
		var done chan struct{}
		if p.h2 {
			done = make(chan struct{})
			p.dialing = done
		}
		p.dials++
		p.mu.Unlock()
		c, err := p.dial(ctx)
		p.mu.Lock()
		p.dials--
		if done != nil {
			p.dialing = nil
		}
		if err != nil {
			p.wakeLocked() // the connection it would have been is not: room for another
		}
		p.mu.Unlock()
		if done != nil {
			close(done)
		}
		return c, 1, err
	}
}

// noteFree records that n request slots were seen free on c at once.
func (c *conn) noteFree(n int) {
	for {
		old := c.maxFree.Load()
		if int32(n) <= old || c.maxFree.CompareAndSwap(old, int32(n)) {
			return
		}
	}
}

// goingAway reports whether c, an HTTP/2 connection, can take no new
// request for a reason other than its concurrency limit: it is closed, or it
// has no free slot while fewer requests than it once had free slots are in
// flight — which net/http's ClientConn shows only when the connection has
// received a GOAWAY or is closing. (At its limit it cannot tell; it then
// says no. A server that lowers its limit below what it once allowed can
// make it say yes wrongly.)
func (c *conn) goingAway() bool {
	return c.cc.Err() != nil || c.cc.Available() == 0 && int32(c.cc.InFlight()) < c.maxFree.Load()
}

// learnHTTP2 records that c carries HTTP/2 (see countingConn).
func (c *conn) learnHTTP2() {
	if c.raw != nil && !c.raw.h2.Load() {
		c.raw.h2.Store(true)
	}
}

// take counts one more request on c and returns its number, unless c has
// already carried maxStreams (if not zero). The count is taken when the
// request's slot is, so that requests racing for the last streams below a
// limit cannot all see room.
func (c *conn) take(maxStreams int32) (int32, bool) {
	for {
		n := c.streams.Load()
		if maxStreams > 0 && n >= maxStreams {
			return 0, false
		}
		if c.streams.CompareAndSwap(n, n+1) {
			return n + 1, true
		}
	}
}

// spentLocked returns the ready connections that are MaxConnAge old or
// have carried MaxConnRequests requests, to be retired. p.mu must be held.
func (p *pool) spentLocked() []*conn {
	var spent []*conn
	for _, c := range p.ready {
		if p.t.maxConnAge > 0 && time.Since(c.born) >= p.t.maxConnAge ||
			p.t.maxConnRequests > 0 && c.streams.Load() >= p.t.maxConnRequests {
			spent = append(spent, c)
		}
	}
	return spent
}

// avoidance says which connections a request keeps off, beyond those
// opened before its NotBefore: with maxStreams not zero, an HTTP/2
// connection that has carried that many requests (streamLimit); with
// idleBefore not zero, one with nothing in flight since before that
// instant (clock.Now; idleLimit), or one taken after such an idle spell and
// not answered since (conn.suspect).
type avoidance struct {
	maxStreams int32
	idleBefore int64
}

// readyIndex returns the index in p.ready of the connection to try, the most
// recently freed one opened at or after notBefore that avoid does not keep
// the request off; or -1. p.mu must be held.
func (p *pool) readyIndex(notBefore time.Time, avoid avoidance) int {
	for i := len(p.ready) - 1; i >= 0; i-- {
		c := p.ready[i]
		switch {
		case !notBefore.IsZero() && c.born.Before(notBefore):
		case avoid.maxStreams > 0 && c.streams.Load() >= avoid.maxStreams:
		case avoid.idleBefore != 0 && (c.isIdle && c.idleSince.Load() < avoid.idleBefore || c.suspect.Load() > c.answered.Load()):
		default:
			return i
		}
	}
	return -1
}

// streamLimit returns how many requests a one-shot request may find already
// sent on an HTTP/2 connection, or 0 for no limit. p.mu must be held.
//
// A server that accepts a fixed number of streams per connection (nginx's
// keepalive_requests, 1000 by default) sends a GOAWAY after the last, and the
// streams a client opened meanwhile fail above its last id: proven not
// processed, but a one-shot body already read cannot go out again. The pool
// learns the number from those GOAWAYs — the answers a connection got before
// one that left streams of ours above its last id — and believes it only when
// it is the same on two of the last four such connections and at least 8: a
// fixed limit gives the same count every time, while a reload or a fault
// ends connections at any count. It then keeps one-shot requests off
// connections within an eighth of it (at least 3 streams) of the limit: they
// go to a new connection instead. Other requests, which a GOAWAY costs only
// a transparent retry, keep using the connection, and so keep the number up
// to date.
func (p *pool) streamLimit() int32 {
	limit := int32(0)
	for i, a := range p.streamLimits {
		if a >= 8 && a > limit && slices.Contains(p.streamLimits[i+1:], a) {
			limit = a
		}
	}
	if limit == 0 {
		return 0
	}
	return limit - max(limit/8, 3)
}

// idleLimit returns how long a request that could not be sent again after
// an ambiguous failure may find a connection idle, or 0 for no limit. p.mu
// must be held.
//
// A server closes a connection that has been idle for its keep-alive
// timeout (nginx's keepalive_timeout, HAProxy's timeout http-keep-alive,
// net/http's IdleTimeout), and a request written as it does — the
// keep-alive race — is lost if it cannot be sent again: over HTTP/1 it may
// have arrived, over HTTP/2 a one-shot body above the GOAWAY's last id is
// already read. The pool learns the timeout from the connections the
// upstream closed while they carried nothing — how long each had been idle
// — and believes it once two of the last four are within a fifth of each
// other (a timeout is fixed; a reload or a fault closes idle connections
// at any age). Such requests then keep off connections idle for more than
// seven eighths of it, and go to a new connection instead; others, which
// the race costs only a transparent retry, keep using them.
func (p *pool) idleLimit() time.Duration {
	limit := time.Duration(0)
	for i, a := range p.idleCloses {
		for _, b := range p.idleCloses[i+1:] {
			if a > 0 && b > 0 && max(a, b)-min(a, b) <= min(a, b)/5 && (limit == 0 || min(a, b) < limit) {
				limit = min(a, b)
			}
		}
	}
	return limit - limit/8
}

// learnIdleClose records that the upstream closed a connection that had
// been idle for d; p.mu must be held.
func (p *pool) learnIdleClose(d time.Duration) {
	if d > 0 {
		p.idleCloses[p.nextIdle] = d
		p.nextIdle = (p.nextIdle + 1) % len(p.idleCloses)
	}
}

// learnStreamLimit records that the upstream accepted n streams on a
// connection before a GOAWAY; p.mu must be held.
func (p *pool) learnStreamLimit(n int32) {
	if n > 0 {
		p.streamLimits[p.nextLimit] = n
		p.nextLimit = (p.nextLimit + 1) % len(p.streamLimits)
	}
}

// dialError is a failure to establish a connection, with its stage.
type dialError struct {
	stage classify.Stage
	err   error
}

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

func (p *pool) dial(ctx context.Context) (*conn, error) {
	note := &dialNote{proxy: p.proxy, addr: p.dialAt}
	cc, err := p.t.base.NewClientConn(context.WithValue(ctx, dialNoteKey{}, note), p.scheme, p.addr)
	if err != nil {
		stage := classify.StageTLS
		var dns *net.DNSError
		var op *net.OpError
		switch {
		case errors.As(err, &dns):
			stage = classify.StageDNS
		case note.customTLS: // TCP and TLS in one step: only the error tells them apart
			if errors.As(err, &op) && op.Op == "dial" {
				stage = classify.StageDial
			}
		case !note.dialed || p.scheme == "http": // no TLS: the HTTP/2 preface is part of the dial
			stage = classify.StageDial
		}
		if note.conn != nil {
			note.conn.Close()
		}
		return nil, &dialError{stage: stage, err: err}
	}
	if err := cc.Reserve(); err != nil {
		cc.Close()
		return nil, &dialError{stage: classify.StageTLS, err: err}
	}
	c := &conn{p: p, cc: cc, raw: note.conn, born: time.Now()}
	c.streams.Store(1) // the request it was dialed for
	avail := cc.Available()
	c.noteFree(avail + 1)
	if avail > 0 { // HTTP/2: room for more streams already
		c.learnHTTP2()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		cc.Close()
		return nil, errPoolClosed
	}
	p.conns = append(p.conns, c)
	if avail > 0 { // HTTP/2: room for more streams already
		p.pushReady(c)
	}
	p.mu.Unlock()
	cc.SetStateHook(c.stateChanged)
	return c, nil
}

// pushReady puts c on p.ready; p.mu must be held.
func (p *pool) pushReady(c *conn) {
	if !c.inReady && !c.retired.Load() {
		c.inReady = true
		p.ready = append(p.ready, c)
		p.wakeLocked()
	}
}

// wakeLocked wakes the attempts waiting for a connection; p.mu must be held.
func (p *pool) wakeLocked() {
	for _, w := range p.waiters {
		close(w)
	}
	p.waiters = p.waiters[:0]
}

// putReady puts c on p.ready; it takes p.mu.
func (p *pool) putReady(c *conn) {
	p.mu.Lock()
	p.pushReady(c)
	p.mu.Unlock()
}

// dropReady takes c off p.ready if it is there; it takes p.mu.
func (p *pool) dropReady(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !c.inReady {
		return
	}
	if i := slices.Index(p.ready, c); i >= 0 {
		p.ready = slices.Delete(p.ready, i, i+1)
	}
	c.inReady = false
}

// busyLocked notes that c carries a request again and reports whether it
// was idle (the caller then takes it off the Attempter's idle list, without
// p.mu); p.mu must be held.
func (p *pool) busyLocked(c *conn) bool {
	if !c.isIdle {
		return false
	}
	c.setIdle(false)
	p.idle--
	p.idleN.Store(int32(p.idle))
	return true
}

// setIdle records whether c carries nothing; p.mu must be held.
func (c *conn) setIdle(idle bool) {
	c.isIdle = idle
	if c.raw != nil {
		if idle {
			c.raw.idleRead.Store(0)
		}
		c.raw.idle.Store(idle)
	}
}

// learnHTTP2 records that the upstream speaks HTTP/2, so that later attempts
// share a connection instead of dialing one each.
func (p *pool) learnHTTP2() {
	p.mu.Lock()
	p.h2 = true
	p.mu.Unlock()
}

// stateChanged is the connection's state hook: a connection that can take
// no more requests is retired; an idle one is kept within the idle limits
// and closed after the idle timeout.
func (c *conn) stateChanged(cc *http.ClientConn) {
	if cc.Err() != nil || c.retired.Load() {
		if cc.Err() != nil {
			c.p.closedByPeer(c, false)
		}
		c.p.retire(c)
		return
	}
	if avail := cc.Available(); avail > 0 {
		c.noteFree(avail)
		c.p.putReady(c)
	}
	if cc.InFlight() == 0 {
		c.becameIdle()
	}
}

// closedByPeer notes that c can no longer be used. If it carried nothing —
// wasIdle says so for a connection an attempt has just taken — and neither
// the pool nor the Attempter closed it, the upstream closed it for being
// idle: it learns for how long (idleLimit), once per connection, up to the
// first thing the upstream sent on it while it was idle (its GOAWAY, or its
// close), else up to now.
func (p *pool) closedByPeer(c *conn, wasIdle bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !(c.isIdle || wasIdle) || c.retired.Load() || p.closed || c.idleLearnt.Swap(true) {
		return
	}
	since, until := c.idleSince.Load(), clock.Now()
	if c.raw != nil {
		if r := c.raw.idleRead.Load(); r > since {
			until = r
		}
	}
	p.learnIdleClose(time.Duration(until - since))
}

// becameIdle notes that nothing is in flight on c: it keeps c within the
// idle limits, and arms the idle timer the first time.
func (c *conn) becameIdle() {
	c.idleSince.Store(clock.Now())
	p := c.p
	p.mu.Lock()
	switch {
	case c.isIdle, c.retired.Load(), c.cc.InFlight() != 0:
		p.mu.Unlock()
	case p.idle >= p.t.maxIdlePerHost:
		p.mu.Unlock()
		p.retire(c) // too many idle connections to this address: net/http closes the newest
		return
	default:
		c.setIdle(true)
		p.idle++
		p.idleN.Store(int32(p.idle))
		p.mu.Unlock()
		if oldest := p.t.idle.push(c); oldest != nil {
			oldest.p.retireIdle(oldest) // too many idle connections in all: the oldest goes
		}
	}
	if c.idleArmed.Load() {
		return
	}
	c.mu.Lock()
	if c.idleT == nil && !c.stopped {
		c.idleFor = &idleTarget{}
		c.idleFor.c.Store(c)
		c.idleT = time.AfterFunc(p.t.idleTimeout, c.idleFor.fire)
		c.idleArmed.Store(true)
	}
	c.mu.Unlock()
}

// idleCheck is the idle timer: it retires c if nothing has been in flight
// on it for the idle timeout, and otherwise fires again when that could
// first be so.
func (c *conn) idleCheck() {
	timeout := c.p.t.idleTimeout
	wait := timeout
	if c.cc.InFlight() == 0 {
		wait = time.Duration(c.idleSince.Load() + int64(timeout) - clock.Now())
		if wait <= 0 {
			c.p.retire(c)
			return
		}
	}
	c.mu.Lock()
	if !c.stopped {
		c.idleT.Reset(wait)
	}
	c.mu.Unlock()
}

// stopIdle stops the idle timer for good.
func (c *conn) stopIdle() {
	c.mu.Lock()
	c.stopped = true
	if c.idleT != nil {
		c.idleT.Stop()
		c.idleFor.c.Store(nil)
	}
	c.mu.Unlock()
}

// retireIdle retires c if it is still idle: an attempt may have taken it
// since it was chosen to go.
func (p *pool) retireIdle(c *conn) {
	p.mu.Lock()
	idle := c.isIdle
	p.mu.Unlock()
	if idle {
		p.retire(c)
	}
}

// retire takes c out of the pool, so that no new attempt uses it, and closes
// it once no request is in flight on it.
//
// A connection whose Err is non-nil has already been closed by net/http,
// which is delivering each stream's own error (a GoAwayError, a reset):
// closing it again would only race that teardown. And InFlight reports 0 for
// a closed connection, so "nothing in flight" cannot be told from "closed".
// Hence only a live connection is closed here: one retired after a graceful
// GOAWAY, whose streams at or below the last id may still be answered, is
// closed when the state hook reports its last stream done.
func (p *pool) retire(c *conn) {
	p.mu.Lock()
	if c.above.Load() > 0 { // it ended with a GOAWAY that left streams of ours above its last id
		p.learnStreamLimit(c.answered.Load())
		c.above.Store(0)
	}
	// slices.Delete clears the vacated slot: a retired connection must not
	// stay reachable from the pool's slices.
	if i := slices.Index(p.conns, c); i >= 0 {
		p.conns = slices.Delete(p.conns, i, i+1)
		p.wakeLocked() // room for another connection
	}
	c.retired.Store(true)
	if c.inReady {
		if i := slices.Index(p.ready, c); i >= 0 {
			p.ready = slices.Delete(p.ready, i, i+1)
		}
		c.inReady = false
	}
	wasIdle := p.busyLocked(c)
	empty := len(p.conns) == 0 && p.dials == 0 && len(p.waiters) == 0 && !p.closed && !p.forgotten
	p.mu.Unlock()
	if wasIdle {
		p.t.idle.remove(c)
	}
	if empty {
		p.t.lastConnGone(p)
	}
	c.stopIdle()
	if c.cc.Err() == nil && c.cc.InFlight() == 0 {
		c.cc.Close()
	}
}

// closeIdle closes the connections that carry no request.
func (p *pool) closeIdle() {
	p.mu.Lock()
	var idle []*conn
	for _, c := range p.conns {
		if c.cc.InFlight() == 0 {
			idle = append(idle, c)
		}
	}
	p.mu.Unlock()
	for _, c := range idle {
		p.retire(c)
	}
}

// close closes every connection; in-flight requests are interrupted.
func (p *pool) close() { p.shut(&p.closed) }

// shut sets *flag (closed or forgotten) and closes every connection.
func (p *pool) shut(flag *bool) {
	p.mu.Lock()
	*flag = true
	conns := p.conns
	p.conns, p.ready = nil, nil
	p.wakeLocked()
	p.mu.Unlock()
	for _, c := range conns {
		p.t.idle.remove(c)
		c.stopIdle()
		c.cc.Close()
	}
}

// busy reports whether anything is in flight on p's connections, or a dial
// is in progress, or an attempt waits for one.
func (p *pool) busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dials > 0 || len(p.waiters) > 0 || p.dialing != nil {
		return true
	}
	for _, c := range p.conns {
		if !c.isIdle {
			return true
		}
	}
	return false
}

// remembers reports whether p has seen something of its upstream's
// connections that keeps its upstream until the idle time: how many streams
// one took before a GOAWAY, or how long one idled before the upstream
// closed it — a limit is believed on the second alike (streamLimit,
// idleLimit), so the first must not be forgotten with the connection.
func (p *pool) remembers() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streamLimits != [4]int32{} || p.idleCloses != [4]time.Duration{}
}

// closeAndForget takes p out of use and closes its connections, idle ones:
// see Attempter.makeRoomLocked, whose caller calls it outside its lock.
func (p *pool) closeAndForget() { p.shut(&p.forgotten) }

// forget takes p out of use if it holds nothing: no connection, no dial in
// progress, no attempt waiting. It reports whether it did.
func (p *pool) forget() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.conns) > 0 || p.dials > 0 || len(p.waiters) > 0 || p.dialing != nil {
		return false
	}
	p.forgotten = true
	return true
}
