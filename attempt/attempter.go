// Package attempt makes exactly one physical attempt per admission.
//
// Go's transports re-send some requests by themselves, invisibly (a reused
// HTTP/1.1 connection closed by the server, HTTP/2 REFUSED_STREAM, GOAWAY,
// RST_STREAM PROTOCOL_ERROR), and lose the evidence of why. Such a re-send
// would bypass the guards and erase what the first try proved. So this package
// does not send through http.Transport.RoundTrip: it keeps its own small pool
// of connections per address, each an *http.ClientConn from Go 1.26's
// Transport.NewClientConn, which never retries. One RoundTrip on a ClientConn
// is one attempt on the wire, admitted by the circuit breaker, the rate
// limiter and the bulkhead, and its error keeps its type (HTTP/2 stream
// resets stay typed).
//
// Connections are dialed through the configured http.Transport's settings
// (dialer, proxy, TLS, protocols), with its DialContext wrapped to count the
// bytes that reach each socket. Under TLS the count sits below the TLS layer,
// which is what lets ALPN still negotiate HTTP/2. A failed attempt that wrote
// no byte is proven not sent (unless its context had ended: a transport may
// still be writing then). A connection from the Transport's DialTLSContext is
// a *tls.Conn that cannot be wrapped without losing HTTP/2; on it, an attempt
// learns whether it wrote anything from net/http's WroteHeaders trace hook.
//
// The admission permit of an answered attempt lasts until its response body
// is read to the end or closed, or until the attempt's context ends: the
// bulkhead bounds the whole exchange, and the breaker records the outcome
// then. A body that is never closed, under a context that never ends, keeps
// its permit, as it keeps its connection in net/http: close every body.
//
// Most programs do not use this package directly: outbound.Transport owns the
// attempt loop (retries, backoff, the outcome) and makes each attempt through
// an Attempter. Use an Attempter as an http.RoundTripper where one attempt per
// call is what you want, or call Route and AttemptOn from an attempt loop of
// your own. A Route is for one call: find it again for the next call, since
// an upstream that has been idle long enough is forgotten and its state is
// made afresh when it is next used.
package attempt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/cfgerr"
	"github.com/outboundhq/outbound/internal/clock"
)

// Config configures an Attempter. The zero value is usable.
type Config struct {
	// HTTPTransport supplies the settings of new connections: dialer, TLS
	// dialer, proxy, TLS configuration, protocols, timeouts. Nil means a
	// clone of http.DefaultTransport. It is cloned, not used: its own
	// connection pool is never touched. Its Proxy is called with the
	// caller's request (URL, header and context), once per call, and
	// connections are pooled per proxy as well as per address. A nil
	// DialContext means a net.Dialer.
	HTTPTransport *http.Transport

	// Admission is the template of every upstream's admission pipeline;
	// Upstream is filled in per upstream.
	Admission admission.Config

	// UpstreamKey names the upstream a request is admitted against: one
	// breaker, rate limiter and bulkhead per key. Nil means
	// "scheme://host:port" of the URL.
	UpstreamKey func(*http.Request) string

	// IsFailure says which answered responses the breaker records as
	// upstream failures. Nil means status 500, 502, 503 and 504, which
	// also decides when it panics.
	IsFailure func(*http.Response) bool

	// IdleConnTimeout closes a connection that has carried no request for
	// this long. Zero means the Transport's IdleConnTimeout, and if that is
	// zero too, 90 seconds: net/http then keeps idle connections forever,
	// but here an idle connection also keeps its upstream's state.
	IdleConnTimeout time.Duration

	// MaxConnAge and MaxConnRequests retire a connection, once it is that
	// old or has carried that many requests: it takes no new request, and
	// is closed when those in flight have ended. Connections then move to
	// the upstream's current addresses and spread again after a change of
	// replicas. Zero means no limit (net/http keeps a connection for as
	// long as it works).
	MaxConnAge      time.Duration
	MaxConnRequests int

	// UpstreamIdleTime is how long the state of an upstream (its breaker,
	// rate limiter and bulkhead, and the pool of its address) is kept
	// without an attempt before it is forgotten, if it holds nothing worth
	// keeping: a breaker outside the state it started in, a permit, a token
	// still owed to the rate limiter, a connection (see Attempter). Zero means 5
	// minutes; negative, forever.
	UpstreamIdleTime time.Duration

	// MaxUpstreams caps the number of upstreams whose state is kept. A
	// call to a new upstream beyond it makes room by forgetting the least
	// recently used upstreams that hold nothing, and fails with
	// classify.ErrTooManyUpstreams, without being sent, when there are none. Zero
	// means no cap.
	MaxUpstreams int

	// UpstreamState, if set, makes the state that the layer above keeps
	// per upstream (a retry budget, latencies): it is called once, when the
	// upstream's state is made — under the Attempter's lock, so it must not
	// call the Attempter — and what it returns lives and is forgotten with
	// the upstream (Route.State, Attempter.State). If it has a method
	// Learned() bool, an upstream whose state reports true is kept until
	// the idle time, as one whose guards learned something is: not
	// forgotten to make room, nor with its last connection.
	UpstreamState func(key string) any

	// Endpoints, if set, spreads the attempts to a host over every address
	// it resolves to, and ejects the endpoints that fail (see Endpoints).
	// Nil: one endpoint per host, dialed by name, as net/http does.
	Endpoints *Endpoints

	// OnForget, if set, is called with the key of each upstream whose
	// state is forgotten, outside every lock, so that an observer can
	// forget what it keeps per upstream (metrics' attribute sets).
	OnForget func(key string)

	// BreakerRecords says which failed attempts the breaker records as
	// upstream failures, by what the failure proves (its stage, category,
	// evidence and cause): for example to count Ambiguous failures and
	// refused connections but not a DNS name that does not exist, or to
	// count a refused TLS certificate. It is asked for every attempt that
	// reached for the upstream and failed without an answer, and for an
	// answer whose body failed; an attempt it declines is released (neither
	// success nor failure). It is not asked for attempts the caller
	// cancelled, that were refused locally, or that waited in vain for a
	// connection. Nil means DefaultBreakerRecords, which also decides when
	// it panics.
	BreakerRecords func(*classify.Error) bool

	// DistrustRefusedStream names the upstreams whose HTTP/2
	// RST_STREAM(REFUSED_STREAM) does not prove that the request was not
	// processed: the attempt is then Ambiguous (evidence
	// classify.EvidenceRefusedUntrusted), and only an idempotent or keyed
	// request is sent again. Set it for an upstream behind a proxy you do
	// not control: HAProxy (2.6, measured) answers REFUSED_STREAM for a
	// request its backend executed and then failed to answer, on a healthy
	// connection. Whatever it says, a REFUSED_STREAM from a connection that
	// was going away (after a GOAWAY that covered the stream) proves
	// nothing. It is asked with the upstream key, only for attempts that
	// got a REFUSED_STREAM. Nil means that every upstream is trusted; a
	// panic, that this one is.
	DistrustRefusedStream func(upstream string) bool
}

// DefaultBreakerRecords records every failed attempt but those that say
// nothing of the upstream's health: lifecycle failures (classify.Lifecycle:
// a graceful GOAWAY, the keep-alive race) and refused TLS handshakes, which
// would fail the same way every time and which the breaker could only hide
// behind "circuit open".
func DefaultBreakerRecords(e *classify.Error) bool {
	return !e.Lifecycle && e.Evidence != classify.EvidenceTLSRefused
}

// DefaultIsFailure reports whether resp has status 500, 502, 503 or 504.
func DefaultIsFailure(resp *http.Response) bool {
	switch resp.StatusCode {
	case 500, 502, 503, 504:
		return true
	}
	return false
}

// Attempter is an http.RoundTripper that makes exactly one physical attempt
// per call, through the admission pipeline of the call's upstream, and
// classifies every failure. It does not retry. It is safe for concurrent use.
type Attempter struct {
	base            *http.Transport
	proxy           func(*http.Request) (*url.URL, error) // the configured Proxy, called per call
	admission       admission.Config
	key             func(*http.Request) string
	customKey       bool
	isFailure       func(*http.Response) bool
	idleTimeout     time.Duration
	maxIdlePerHost  int
	maxConnsPerHost int
	maxConnAge      time.Duration // MaxConnAge; 0: none
	maxConnRequests int32         // MaxConnRequests; 0: none
	keep            time.Duration // UpstreamIdleTime; negative: forever
	maxUpstreams    int
	onForget        func(string)
	records         func(*classify.Error) bool
	distrustRefused func(string) bool // nil: every upstream is trusted
	endpoints       *endpointsConfig  // nil: hosts are dialed by name
	customTLS       bool              // the Transport dials TLS itself (DialTLSContext): by name

	idle  idleList      // idle connections across every address (MaxIdleConns)
	epoch atomic.Uint32 // sweeps so far

	mu        sync.RWMutex
	upstreams map[string]*upstream
	routes    map[hostKey]*Route // with the default key: per scheme, URL host and proxy
	closed    atomic.Bool        // by Close; read without the lock by attempts in flight
	sweeper   *time.Timer        // armed while anything is kept
	toNotify  []string           // forgotten keys for OnForget, told outside the lock
	toClose   []*pool            // pools of upstreams forgotten to make room, closed outside the lock
	peaks     [2]int             // the most entries upstreams and routes held since they were made
	newState  func(string) any   // Config.UpstreamState
}

// New validates cfg and returns an Attempter. Errors name the offending field.
func New(cfg Config) (*Attempter, error) {
	base := cfg.HTTPTransport
	if base == nil {
		base = http.DefaultTransport.(*http.Transport)
	}
	switch {
	case cfg.IdleConnTimeout < 0:
		return nil, cfgerr.New("attempt", "IdleConnTimeout", "must be >= 0, got %v", cfg.IdleConnTimeout)
	case cfg.MaxUpstreams < 0:
		return nil, cfgerr.New("attempt", "MaxUpstreams", "must be >= 0, got %d", cfg.MaxUpstreams)
	case cfg.MaxConnAge < 0:
		return nil, cfgerr.New("attempt", "MaxConnAge", "must be >= 0, got %v", cfg.MaxConnAge)
	case cfg.MaxConnRequests < 0 || cfg.MaxConnRequests > math.MaxInt32:
		return nil, cfgerr.New("attempt", "MaxConnRequests", "must be in [0, %d], got %d", math.MaxInt32, cfg.MaxConnRequests)
	case cfg.UpstreamIdleTime > 0 && cfg.UpstreamIdleTime < 4*time.Millisecond:
		return nil, cfgerr.New("attempt", "UpstreamIdleTime", "must be 0, negative or at least 4ms, got %v", cfg.UpstreamIdleTime)
	}
	tmpl := cfg.Admission
	tmpl.Upstream = "validation"
	if tmpl.RateGuard != nil { // checked, not called: it would make a guard for no upstream
		tmpl.RateGuard = func(string) admission.RateGuard { return nil }
	}
	if _, err := admission.New(tmpl); err != nil {
		return nil, cfgerr.In("attempt", "Admission", err)
	}
	eps, err := newEndpointsConfig(cfg.Endpoints)
	if err != nil {
		return nil, err
	}
	b := base.Clone()
	dial := b.DialContext
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	b.DialContext = countingDial(dial)
	if tlsDial := b.DialTLSContext; tlsDial != nil {
		b.DialTLSContext = countingTLSDial(tlsDial)
	} else if tlsDial := b.DialTLS; tlsDial != nil { //nolint:staticcheck // the deprecated field is honoured
		b.DialTLSContext = countingTLSDial(func(_ context.Context, network, addr string) (net.Conn, error) {
			return tlsDial(network, addr)
		})
		b.DialTLS = nil //nolint:staticcheck // replaced by the DialTLSContext above
	}
	if b.Protocols == nil {
		b.ForceAttemptHTTP2 = true // a custom DialContext would otherwise turn HTTP/2 off
	}
	// The pool enforces MaxConnsPerHost itself. Left on the clone, it makes
	// net/http (Go 1.26) count down, when a ClientConn from NewClientConn
	// closes, a connection it never counted up: "connCount underflow", a
	// panic (TestMaxConnsPerHostOneOpensOneConnection).
	b.MaxConnsPerHost = 0
	userProxy := b.Proxy
	if userProxy != nil {
		// Called once per call with the caller's request (Route); the dial
		// then uses what that call chose.
		b.Proxy = func(r *http.Request) (*url.URL, error) {
			if n, ok := r.Context().Value(dialNoteKey{}).(*dialNote); ok {
				return n.proxy, nil
			}
			return nil, nil
		}
	}
	t := &Attempter{
		base:            b,
		proxy:           userProxy,
		admission:       cfg.Admission,
		key:             cfg.UpstreamKey,
		isFailure:       cfg.IsFailure,
		idleTimeout:     cmp.Or(cfg.IdleConnTimeout, base.IdleConnTimeout, 90*time.Second),
		maxIdlePerHost:  cmp.Or(base.MaxIdleConnsPerHost, http.DefaultMaxIdleConnsPerHost),
		maxConnsPerHost: max(base.MaxConnsPerHost, 0),
		maxConnAge:      cfg.MaxConnAge,
		maxConnRequests: int32(cfg.MaxConnRequests),
		idle:            idleList{max: max(base.MaxIdleConns, 0)},
		keep:            cmp.Or(cfg.UpstreamIdleTime, defaultUpstreamIdleTime),
		maxUpstreams:    cfg.MaxUpstreams,
		onForget:        cfg.OnForget,
		records:         cfg.BreakerRecords,
		upstreams:       map[string]*upstream{},
		routes:          map[hostKey]*Route{},
		customKey:       cfg.UpstreamKey != nil,
		newState:        cfg.UpstreamState,
		endpoints:       eps,
		customTLS:       base.DialTLSContext != nil || base.DialTLS != nil, //nolint:staticcheck // the deprecated field is honoured
	}
	if base.DisableKeepAlives || base.MaxIdleConnsPerHost < 0 {
		t.maxIdlePerHost = 0 // no idle connection is kept
	}
	if t.key == nil {
		t.key = DefaultUpstreamKey
	}
	if t.records == nil {
		t.records = DefaultBreakerRecords
	} else {
		t.records = recovered(t.records, DefaultBreakerRecords)
	}
	if t.isFailure == nil {
		t.isFailure = DefaultIsFailure
	} else {
		t.isFailure = recovered(t.isFailure, DefaultIsFailure)
	}
	if cfg.DistrustRefusedStream != nil {
		t.distrustRefused = recovered(cfg.DistrustRefusedStream, func(string) bool { return false })
	}
	return t, nil
}

// recovered returns user's decision, or def's when user panics: the permit
// it decides about must be resolved whatever the callback does.
func recovered[T any](user, def func(T) bool) func(T) bool {
	return func(v T) (b bool) {
		defer func() {
			if recover() != nil {
				b = def(v)
			}
		}()
		return user(v)
	}
}

// RoundTrip makes one attempt of req. It keeps the http.RoundTripper
// contract: req is not modified, its body is closed, and any answered status
// comes back as (resp, nil). A failed attempt returns a *classify.Error.
func (t *Attempter) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.Attempt(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	return resp, nil
}

// Attempt is RoundTrip without the body rule: when the attempt fails before
// the request reached a connection (an invalid request, a local rejection, or
// no connection could be made), req.Body is left unread and open, so that a
// caller that owns the body may use it for another attempt. In every other
// case the body has been consumed and closed.
func (t *Attempter) Attempt(req *http.Request) (*http.Response, error) {
	r, err := t.Route(req)
	if err != nil {
		return nil, err
	}
	return t.AttemptOn(req.Context(), r, req, Options{AsIs: true})
}

// Options say how AttemptOn sends one attempt.
type Options struct {
	// AsIs sends the request itself, with its own context, header and
	// body: no copy is made. ctx must then be the request's context, and
	// Header and Body are ignored. (The caller says so because comparing
	// contexts or bodies is not always possible: an interface holding an
	// uncomparable value panics when compared.)
	AsIs bool

	// Header and Body replace the request's in the one copy of it that is
	// sent with ctx; the request itself is not modified. A caller making
	// several attempts of one request thus copies it once per attempt.
	Header http.Header
	Body   io.ReadCloser

	// NotBefore, when not zero, keeps the attempt off every connection
	// opened before it: a retry after a connection's failure does not meet
	// a connection as old as the one that failed.
	NotBefore time.Time

	// OneShot says that the request cannot be sent again once its body is
	// read: it is kept off HTTP/2 connections that are about to reach the
	// number of streams the upstream accepts per connection, whose GOAWAY
	// would leave it proven unprocessed but impossible to resend.
	OneShot bool

	// Unretryable says that the request could not be sent again after a
	// failure that may have reached the upstream: a one-shot body, or a
	// non-idempotent method without an Idempotency-Key. It is kept off
	// connections that have been idle nearly as long as the upstream lets
	// a connection idle before it closes it, as learnt from the
	// connections it closed: the keep-alive race would make it Ambiguous
	// and lose it, where a new connection costs only a dial.
	Unretryable bool

	// Provisional says that the attempt races others of one call (a hedged
	// round), and the call, not the answer, says whether it counts: the
	// breaker's verdict on its answer waits until the answer's body is
	// closed or read to the end — even an empty body (http.NoBody), when
	// the answer is a failure; an empty success is judged at once, as
	// without Provisional, so that one the caller never closes (a HEAD's)
	// holds no permit — and an answer whose context the caller cancelled
	// before that is released: neither success nor failure. The call
	// cancels the attempts that lost the race before it closes their
	// answers.
	Provisional bool

	// Elsewhere, with Config.Endpoints, is the call's record of the
	// endpoints its attempts went to: this one goes to another, when the
	// host has one not ejected, and is added to it. Nil: any endpoint.
	Elsewhere *Elsewhere

	// Arrival, if set, is told how to see the first bytes of the attempt's
	// answer arrive, so that a hedge timer can ask whether they have (see
	// Arrival).
	Arrival *Arrival

	// Endpoint, if set, receives the address ("ip:port") of the endpoint
	// the attempt was sent to, with Config.Endpoints and a host of several
	// addresses; it is left as it is otherwise.
	Endpoint *string
}

// AttemptOn is Attempt on a route found by Route, with the attempt's context
// ctx and the Options o.
func (t *Attempter) AttemptOn(ctx context.Context, r *Route, req *http.Request, o Options) (*http.Response, error) {
	areq := req
	if !o.AsIs {
		areq = req.WithContext(ctx)
		areq.Header, areq.Body = o.Header, o.Body
	}
	var sb *sentBody
	if areq.Body != nil && areq.Body != http.NoBody {
		// The body's own errors are told apart from the upstream's: a
		// body that fails to read is the caller's fault.
		if areq == req {
			areq = new(http.Request)
			*areq = *req
		}
		sb = &sentBody{rc: areq.Body}
		areq.Body = sb
	}
	key, pl, p := r.key, r.up.pipeline, r.pool
	if err := validate(areq); err != nil {
		return nil, &classify.Error{Upstream: key, Stage: classify.StageAdmission, Category: classify.LocalRejection,
			Evidence: classify.EvidenceInvalidRequest, Err: err}
	}
	epoch := t.epoch.Load()
	r.up.used.touch(epoch)
	if p != nil {
		p.used.touch(epoch)
	}
	pm, err := pl.Acquire(ctx)
	if err != nil {
		return nil, &classify.Error{Upstream: key, Stage: classify.StageAdmission, Category: classify.LocalRejection,
			Evidence: classify.EvidenceLocalGuard, Err: err}
	}
	// The upstream is kept while the permit is held: its resolution must
	// reach this breaker, not a forgotten one.
	up := r.up
	up.held.Add(1)
	// The breaker times the attempt from its admission: a wait in a local
	// guard (a bulkhead's queue, a shared rate guard's round trip) is not
	// the upstream being slow.
	start := clock.Now()
	var ep *endpoint
	var c *conn
	var seq int32
	if r.set != nil {
		ep, p, c, seq, err = t.connect(ctx, r.set, o, epoch, start)
	} else {
		p, c, seq, err = t.connectTo(ctx, p, o)
	}
	if err != nil {
		stage := classify.StageDial
		var de *dialError
		if errors.As(err, &de) {
			stage = de.stage
		}
		ce := &classify.Error{Upstream: key, Stage: stage, Category: classify.NotSent,
			Evidence: classify.EvidenceNoConnection, Err: withCause(ctx, err)}
		var cl *connLimitError
		switch {
		case errors.As(err, &cl):
			// It waited for MaxConnsPerHost to allow a connection and gave
			// up: it wrote nothing, and the upstream is not to blame.
			ce.Evidence = classify.EvidenceConnLimit
			pm.Cancel()
		case err == errPoolClosed:
			ce.Evidence = classify.EvidenceClientClosed
			pm.Cancel()
		case callerCancelled(ctx):
			pm.Cancel()
		default:
			if classify.TLSRefused(err) {
				ce.Evidence = classify.EvidenceTLSRefused
			}
			t.resolveFailed(&pm, ce, start)
		}
		up.held.Add(-1)
		return nil, ce
	}
	var connected int64 // when the connection was ready: an endpoint's latency leaves its dial out
	if ep != nil {
		defer ep.inflight.Add(-1) // until its answer, or its failure
		connected = clock.Now()
	}

	var wrote *wroteFlag
	var before int64
	var trace *httptrace.ClientTrace
	if c.raw != nil {
		before = c.raw.written.Load()
	} else {
		// A connection from DialTLSContext: its bytes are not counted, but
		// net/http says when it has written the request's headers.
		wrote = new(wroteFlag)
		trace = &httptrace.ClientTrace{WroteHeaders: wrote.set}
	}
	if o.Arrival != nil {
		if c.raw != nil && c.http1.Load() {
			// Every byte that comes on it now is the attempt's answer.
			o.Arrival.watch(c.raw)
		} else {
			// HTTP/2, whose bytes are every stream's, or a connection that
			// has not answered yet (its first bytes may be TLS's or
			// HTTP/2's own): net/http says when it has read the answer's
			// first byte.
			if trace == nil {
				trace = new(httptrace.ClientTrace)
			}
			trace.GotFirstResponseByte = o.Arrival.gotFirstByte
		}
	}
	if trace != nil {
		areq = areq.WithContext(httptrace.WithClientTrace(areq.Context(), trace))
	}
	reused := seq > 1
	resp, err := c.cc.RoundTrip(areq)
	if err != nil {
		var written int64
		if c.raw != nil {
			written = c.raw.written.Load() - before
		} else if wrote.Load() {
			written = 1 // some, uncounted
		}
		facts := classify.Facts{Stage: classify.InferStage(written, err), Written: written, Err: err,
			Cancelled: ctx.Err() != nil, Reused: reused, HTTP1: c.http1.Load()}
		if !facts.HTTP1 {
			// What a stream reset proves depends on the connection it came
			// from, just after it came.
			facts.Draining = c.goingAway()
			facts.DistrustRefused = t.distrustRefused != nil &&
				classify.HTTP2Evidence(err) == classify.EvidenceRefusedStream && t.distrustRefused(key)
		}
		cat, ev := classify.Failure(facts)
		lifecycle := classify.Lifecycle(facts, ev)
		if fault := t.clientFault(sb); fault != 0 {
			// Not the upstream: the breaker and the retry budget are
			// not told, and the call is not retried.
			ev, lifecycle = fault, false
			if cat != classify.NotSent {
				cat = classify.Ambiguous
			}
		}
		if ev == classify.EvidenceGoAwayAbove {
			c.above.Add(1)
		}
		ce := &classify.Error{Upstream: key, Stage: facts.Stage, Category: cat, Evidence: ev,
			Lifecycle: lifecycle, Err: withCause(ctx, err)}
		switch {
		case callerCancelled(ctx) || classify.ClientFault(ev):
			pm.Release() // the caller gave up, or failed: it says nothing about the upstream
			if ep != nil && !classify.ClientFault(ev) {
				now := clock.Now()
				ep.slow(now, now-start) // but it was still waiting
			}
		default:
			if t.resolveFailed(&pm, ce, start) && ep != nil {
				now := clock.Now()
				ep.failed(now, now-start)
			}
		}
		up.held.Add(-1)
		if c.cc.Err() != nil {
			p.retire(c)
		}
		return nil, ce
	}
	if resp.ProtoMajor == 2 {
		c.answered.Add(1)
		c.learnHTTP2()
		p.learnHTTP2()
	} else if !c.http1.Load() {
		c.http1.Store(true)
	}
	now := clock.Now()
	elapsed := time.Duration(now - start)
	failed := t.isFailure(resp)
	if ep != nil {
		ep.answered(now, now-connected, failed)
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		if !o.Provisional || !failed {
			finish(&pm, failed, declined(resp), elapsed)
			up.held.Add(-1)
			return resp, nil
		}
		resp.Body = http.NoBody // a failure that may lose the race: judged at its Close
	}
	b := &body{rc: resp.Body, pm: pm, failed: failed, declined: declined(resp), elapsed: elapsed, ctx: ctx, upstream: key, t: t, up: up}
	if ctx.Done() != nil {
		// The exchange ends with the attempt's context, whether or not the
		// caller ever closes the body: the permit comes back then. (The
		// lock: the function may run before AfterFunc returns.)
		b.mu.Lock()
		b.stop = context.AfterFunc(ctx, b.contextDone)
		b.mu.Unlock()
	}
	resp.Body = b
	return resp, nil
}

// clientFault returns the evidence of a failed attempt that was the client's
// own doing, or 0: the request's body sb failed to read, or the client was
// closed during the attempt.
func (t *Attempter) clientFault(sb *sentBody) classify.Evidence {
	switch {
	case sb != nil && sb.failed.Load():
		return classify.EvidenceRequestBodyFailed
	case t.closed.Load():
		return classify.EvidenceClientClosed
	}
	return 0
}

// sentBody is the body of an attempt: it records whether a Read failed
// before the transport closed it, which is the caller's body failing, not
// the upstream.
type sentBody struct {
	rc      io.ReadCloser
	failed  atomic.Bool
	closing atomic.Bool // the transport closed it: a failed Read from then on is not the body's fault
}

func (b *sentBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF && !b.closing.Load() {
		b.failed.Store(true)
	}
	return n, err
}

func (b *sentBody) Close() error {
	b.closing.Store(true)
	return b.rc.Close()
}

// wroteFlag records net/http's WroteHeaders for one attempt.
type wroteFlag struct{ atomic.Bool }

func (w *wroteFlag) set() { w.Store(true) }

// resolveFailed resolves the permit of an attempt that failed without an
// answer: a failure if the breaker records it (Config.BreakerRecords), else
// a release.
func (t *Attempter) resolveFailed(pm *admission.Permit, ce *classify.Error, start int64) bool {
	if t.records(ce) {
		pm.Lost(time.Duration(clock.Now() - start))
		return true
	}
	pm.Release()
	return false
}

func finish(pm *admission.Permit, failed, declined bool, elapsed time.Duration) {
	switch {
	case failed:
		pm.Failure(elapsed)
	case declined:
		pm.Declined(elapsed)
	default:
		pm.Success(elapsed)
	}
}

// declined reports whether the upstream answered that it would not take the
// request for its own load (429 Too Many Requests): not an upstream failure
// unless Config.IsFailure says so, but not an accepted request for a
// client-side throttle either.
func declined(resp *http.Response) bool { return resp.StatusCode == http.StatusTooManyRequests }

// withCause makes sure an error of an attempt ended by its per-attempt
// timeout says so on every protocol: net/http returns the context's cause for
// HTTP/1 but context.DeadlineExceeded for HTTP/2.
func withCause(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), classify.ErrAttemptTimeout) && !errors.Is(err, classify.ErrAttemptTimeout) {
		return fmt.Errorf("%w (%w)", classify.ErrAttemptTimeout, err)
	}
	return err
}

// callerCancelled reports whether ctx ended for a reason other than a
// per-attempt timeout.
func callerCancelled(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), classify.ErrAttemptTimeout)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// body holds the attempt's admission permit until the response body is read
// to the end or closed, or until the attempt's context ends, then records the
// outcome.
type body struct {
	rc       io.ReadCloser
	ctx      context.Context
	upstream string
	failed   bool
	declined bool // see declined
	elapsed  time.Duration
	stop     func() bool // stops the context.AfterFunc, if one was set
	t        *Attempter  // its BreakerRecords, and whether it was closed
	up       *upstream   // whose permit it holds

	// closing is set before the caller's Close closes rc: a Read that
	// fails from then on fails because of it, not because of the upstream.
	closing atomic.Bool

	mu   sync.Mutex
	pm   admission.Permit
	done bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	switch {
	case err == nil:
	case err == io.EOF:
		b.end(b.failed, false)
	case b.closing.Load():
		// The caller closed the body, perhaps from another goroutine,
		// while this Read was in progress.
		b.end(b.failed, false)
	case callerCancelled(b.ctx):
		b.end(false, true)
	case b.t.closed.Load():
		// The client was closed while the body was read: not the upstream.
		b.end(false, true)
		err = &classify.Error{Upstream: b.upstream, Stage: classify.StageReadBody, Category: classify.Answered,
			Evidence: classify.EvidenceClientClosed, Err: err}
	default:
		ce := &classify.Error{Upstream: b.upstream, Stage: classify.StageReadBody, Category: classify.Answered,
			Evidence: classify.EvidenceStatus, Err: withCause(b.ctx, err)}
		b.endFailed(ce)
		err = ce
	}
	return n, err
}

// endFailed ends the exchange for a body that failed: a failure if the
// breaker records it, else a release.
func (b *body) endFailed(ce *classify.Error) {
	if b.t.records(ce) {
		b.end(true, false)
	} else {
		b.end(false, true)
	}
}

func (b *body) Close() error {
	b.closing.Store(true)
	err := b.rc.Close()
	if b.ctx.Err() != nil {
		// Closed after the attempt's context ended: judged as contextDone
		// judges it (it may not have run yet) — a cancellation, then a
		// close, is a release; an attempt timeout, then a close, a failure.
		b.contextDone()
	} else {
		b.end(b.failed, false)
	}
	return err
}

// contextDone ends the exchange when the attempt's context ends before the
// body did: a per-attempt timeout is a failure, a cancellation by the caller
// is neither. The body is closed, which frees its connection; a later Read
// fails with the context's cause.
func (b *body) contextDone() {
	if callerCancelled(b.ctx) {
		b.end(false, true)
	} else {
		b.endFailed(&classify.Error{Upstream: b.upstream, Stage: classify.StageReadBody, Category: classify.Answered,
			Evidence: classify.EvidenceStatus, Err: classify.ErrAttemptTimeout})
	}
	b.rc.Close()
}

// end resolves the permit once: a failure, a success, or (the caller gave
// up) a release.
func (b *body) end(failed, release bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	b.done = true
	if b.stop != nil {
		b.stop()
	}
	defer b.up.held.Add(-1)
	if release {
		b.pm.Release()
		return
	}
	finish(&b.pm, failed, b.declined, b.elapsed)
}
