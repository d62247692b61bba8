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
package attempt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/internal/clock"
)

// ErrAttemptTimeout is the context cause a caller sets (with
// context.WithTimeoutCause) for a per-attempt timeout. An attempt whose
// context ended with this cause counts as an upstream failure (too slow); an
// attempt whose context ended for any other reason was cancelled by the
// caller and counts as neither success nor failure.
//
// It reports itself the way net/http reports a timeout: it is a net.Error
// whose Timeout is true, and errors.Is(ErrAttemptTimeout,
// context.DeadlineExceeded) holds.
var ErrAttemptTimeout error = attemptTimeout{}

type attemptTimeout struct{}

func (attemptTimeout) Error() string   { return "outbound: attempt timed out" }
func (attemptTimeout) Timeout() bool   { return true }
func (attemptTimeout) Temporary() bool { return true }

// Is makes errors.Is(ErrAttemptTimeout, context.DeadlineExceeded) hold.
func (attemptTimeout) Is(target error) bool { return target == context.DeadlineExceeded }

// Config configures a Transport. The zero value is usable.
type Config struct {
	// Transport supplies the settings of new connections: dialer, TLS
	// dialer, proxy, TLS configuration, protocols, timeouts. Nil means a
	// clone of http.DefaultTransport. It is cloned, not used: its own
	// connection pool is never touched. Its Proxy is called with the
	// caller's request (URL, header and context), once per call, and
	// connections are pooled per proxy as well as per address. A nil
	// DialContext means a net.Dialer.
	Transport *http.Transport

	// Admission is the template of every upstream's admission pipeline;
	// Upstream is filled in per upstream.
	Admission admission.Config

	// UpstreamKey names the upstream a request is admitted against: one
	// breaker, rate limiter and bulkhead per key. Nil means
	// "scheme://host:port" of the URL.
	UpstreamKey func(*http.Request) string

	// IsFailure says which answered responses the breaker records as
	// upstream failures. Nil means status 500, 502, 503 and 504.
	IsFailure func(*http.Response) bool

	// IdleConnTimeout closes a connection that has carried no request for
	// this long. Zero means 90 seconds.
	IdleConnTimeout time.Duration
}

// DefaultIsFailure reports whether resp has status 500, 502, 503 or 504.
func DefaultIsFailure(resp *http.Response) bool {
	switch resp.StatusCode {
	case 500, 502, 503, 504:
		return true
	}
	return false
}

// Transport is an http.RoundTripper that makes exactly one physical attempt
// per call, through the admission pipeline of the call's upstream, and
// classifies every failure. It does not retry. It is safe for concurrent use.
type Transport struct {
	base        *http.Transport
	proxy       func(*http.Request) (*url.URL, error) // the configured Proxy, called per call
	admission   admission.Config
	key         func(*http.Request) string
	customKey   bool
	isFailure   func(*http.Response) bool
	idleTimeout time.Duration

	mu        sync.RWMutex
	upstreams map[string]*admission.Pipeline
	pools     map[string]*pool
	routes    map[hostKey]*Route // with the default key: per scheme and URL host
	closed    bool
}

type hostKey struct{ scheme, host, proxy string }

// Route is where a request goes: the upstream it is admitted against and the
// pool of connections to its address. Transport.Route finds it.
type Route struct {
	key      string
	pipeline *admission.Pipeline
	pool     *pool
}

// Key returns the route's upstream key.
func (r *Route) Key() string { return r.key }

// Pipeline returns the route's admission pipeline.
func (r *Route) Pipeline() *admission.Pipeline { return r.pipeline }

// New validates cfg and returns a Transport. Errors name the offending field.
func New(cfg Config) (*Transport, error) {
	base := cfg.Transport
	if base == nil {
		base = http.DefaultTransport.(*http.Transport)
	}
	if cfg.IdleConnTimeout < 0 {
		return nil, fmt.Errorf("attempt: Config.IdleConnTimeout must be >= 0, got %v", cfg.IdleConnTimeout)
	}
	tmpl := cfg.Admission
	tmpl.Upstream = "validation"
	if _, err := admission.New(tmpl); err != nil {
		return nil, fmt.Errorf("attempt: Config.Admission: %w", err)
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
	t := &Transport{
		base:        b,
		proxy:       userProxy,
		admission:   cfg.Admission,
		key:         cfg.UpstreamKey,
		isFailure:   cfg.IsFailure,
		idleTimeout: cfg.IdleConnTimeout,
		upstreams:   map[string]*admission.Pipeline{},
		routes:      map[hostKey]*Route{},
		customKey:   cfg.UpstreamKey != nil,
		pools:       map[string]*pool{},
	}
	if t.key == nil {
		t.key = DefaultUpstreamKey
	}
	if t.isFailure == nil {
		t.isFailure = DefaultIsFailure
	}
	if t.idleTimeout == 0 {
		t.idleTimeout = 90 * time.Second
	}
	return t, nil
}

// DefaultUpstreamKey returns "scheme://host:port" of the request's URL, with
// the scheme's default port when the URL has none.
func DefaultUpstreamKey(req *http.Request) string {
	return req.URL.Scheme + "://" + address(req)
}

func address(req *http.Request) string {
	host, port := req.URL.Hostname(), req.URL.Port()
	if port == "" {
		port = "80"
		if req.URL.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(host, port)
}

// UpstreamKey returns the key of the upstream req is admitted against.
func (t *Transport) UpstreamKey(req *http.Request) string { return t.key(req) }

// Route returns where req goes. With the default upstream key, routes are
// cached per scheme, URL host and proxy, so finding one allocates nothing
// when no proxy is configured. The Transport's Proxy, if any, is called here
// with req itself.
func (t *Transport) Route(req *http.Request) (*Route, error) {
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
	p, err := t.pool(req.URL.Scheme, address(req), proxy, hk.proxy)
	if err != nil {
		return nil, err
	}
	r := &Route{key: key, pipeline: t.Pipeline(key), pool: p}
	if !t.customKey {
		t.mu.Lock()
		t.routes[hk] = r
		t.mu.Unlock()
	}
	return r, nil
}

// errUnsupportedURL names the scheme and host only: a URL's path and query
// may carry secrets, and errors end up in logs.
func errUnsupportedURL(req *http.Request) error {
	if req.URL == nil {
		return errors.New("outbound: request has no URL")
	}
	return fmt.Errorf("outbound: unsupported request URL: scheme %q, host %q (want http or https, and a host)", req.URL.Scheme, req.URL.Host)
}

// Pipeline returns the admission pipeline of the upstream named key, creating
// it if needed.
func (t *Transport) Pipeline(key string) *admission.Pipeline {
	t.mu.RLock()
	p := t.upstreams[key]
	t.mu.RUnlock()
	if p != nil {
		return p
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p = t.upstreams[key]; p == nil {
		cfg := t.admission
		cfg.Upstream = key
		p, _ = admission.New(cfg) // validated in New
		t.upstreams[key] = p
	}
	return p
}

func (t *Transport) pool(scheme, addr string, proxy *url.URL, proxyKey string) (*pool, error) {
	k := scheme + "://" + addr
	if proxyKey != "" {
		k += " via " + proxyKey
	}
	t.mu.RLock()
	p, closed := t.pools[k], t.closed
	t.mu.RUnlock()
	if p != nil {
		return p, nil
	}
	if closed {
		return nil, errPoolClosed
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errPoolClosed
	}
	if p = t.pools[k]; p == nil {
		p = &pool{t: t.base, scheme: scheme, addr: addr, proxy: proxy, idleTimeout: t.idleTimeout}
		t.pools[k] = p
	}
	return p, nil
}

// CloseIdleConnections closes every connection that carries no request.
func (t *Transport) CloseIdleConnections() {
	for _, p := range t.allPools() {
		p.closeIdle()
	}
}

// Close closes every connection, interrupting requests in flight; later
// calls fail.
func (t *Transport) Close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	for _, p := range t.allPools() {
		p.close()
	}
}

func (t *Transport) allPools() []*pool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	ps := make([]*pool, 0, len(t.pools))
	for _, p := range t.pools {
		ps = append(ps, p)
	}
	return ps
}

// RoundTrip makes one attempt of req. It keeps the http.RoundTripper
// contract: req is not modified, its body is closed, and any answered status
// comes back as (resp, nil). A failed attempt returns a *classify.Error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
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
func (t *Transport) Attempt(req *http.Request) (*http.Response, error) {
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
}

// AttemptOn is Attempt on a route found by Route, with the attempt's context
// ctx and the Options o.
func (t *Transport) AttemptOn(ctx context.Context, r *Route, req *http.Request, o Options) (*http.Response, error) {
	areq := req
	if !o.AsIs {
		areq = req.WithContext(ctx)
		areq.Header, areq.Body = o.Header, o.Body
	}
	key, pl, p := r.key, r.pipeline, r.pool
	if err := validate(areq); err != nil {
		return nil, &classify.Error{Upstream: key, Stage: classify.StageAdmission, Category: classify.LocalRejection,
			Evidence: classify.EvidenceInvalidRequest, Err: err}
	}
	start := clock.Now()
	pm, err := pl.Acquire(ctx)
	if err != nil {
		return nil, &classify.Error{Upstream: key, Stage: classify.StageAdmission, Category: classify.LocalRejection,
			Evidence: classify.EvidenceLocalGuard, Err: err}
	}
	c, seq, err := p.get(ctx, o.NotBefore, o.OneShot)
	if err != nil {
		stage := classify.StageDial
		var de *dialError
		if errors.As(err, &de) {
			stage = de.stage
		}
		ev := classify.EvidenceNoConnection
		switch {
		case callerCancelled(ctx) || err == errPoolClosed:
			pm.Cancel()
		case classify.TLSRefused(err):
			// It would fail the same way for every attempt; the breaker
			// could only hide its cause behind "circuit open".
			ev = classify.EvidenceTLSRefused
			pm.Release()
		default:
			pm.Failure(time.Duration(clock.Now() - start))
		}
		return nil, &classify.Error{Upstream: key, Stage: stage, Category: classify.NotSent,
			Evidence: ev, Err: withCause(ctx, err)}
	}

	var wrote *wroteFlag
	var before int64
	if c.raw != nil {
		before = c.raw.written.Load()
	} else {
		// A connection from DialTLSContext: its bytes are not counted, but
		// net/http says when it has written the request's headers.
		wrote = new(wroteFlag)
		areq = areq.WithContext(httptrace.WithClientTrace(areq.Context(), &httptrace.ClientTrace{WroteHeaders: wrote.set}))
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
		cat, ev := classify.Failure(facts)
		lifecycle := classify.Lifecycle(facts, ev)
		if ev == classify.EvidenceGoAwayAbove {
			c.above.Add(1)
		}
		if callerCancelled(ctx) || lifecycle {
			// Says nothing about the upstream's health: the caller gave
			// up, or the connection's life ended it (see classify.Lifecycle).
			pm.Release()
		} else {
			pm.Failure(time.Duration(clock.Now() - start))
		}
		if c.cc.Err() != nil {
			p.retire(c)
		}
		return nil, &classify.Error{Upstream: key, Stage: facts.Stage, Category: cat, Evidence: ev,
			Lifecycle: lifecycle, Err: withCause(ctx, err)}
	}
	if resp.ProtoMajor == 2 {
		c.answered.Add(1)
		p.learnHTTP2()
	} else if !c.http1.Load() {
		c.http1.Store(true)
	}
	elapsed := time.Duration(clock.Now() - start)
	failed := t.isFailure(resp)
	if resp.Body == nil || resp.Body == http.NoBody {
		finish(&pm, failed, elapsed)
		return resp, nil
	}
	b := &body{rc: resp.Body, pm: pm, failed: failed, elapsed: elapsed, ctx: ctx, upstream: key}
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

// wroteFlag records net/http's WroteHeaders for one attempt.
type wroteFlag struct{ atomic.Bool }

func (w *wroteFlag) set() { w.Store(true) }

func finish(pm *admission.Permit, failed bool, elapsed time.Duration) {
	if failed {
		pm.Failure(elapsed)
	} else {
		pm.Success(elapsed)
	}
}

// withCause makes sure an error of an attempt ended by its per-attempt
// timeout says so on every protocol: net/http returns the context's cause for
// HTTP/1 but context.DeadlineExceeded for HTTP/2.
func withCause(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), ErrAttemptTimeout) && !errors.Is(err, ErrAttemptTimeout) {
		return fmt.Errorf("%w (%w)", ErrAttemptTimeout, err)
	}
	return err
}

// callerCancelled reports whether ctx ended for a reason other than a
// per-attempt timeout.
func callerCancelled(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrAttemptTimeout)
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
	elapsed  time.Duration
	stop     func() bool // stops the context.AfterFunc, if one was set

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
	default:
		cancelled := callerCancelled(b.ctx)
		b.end(true, cancelled)
		if !cancelled {
			err = &classify.Error{Upstream: b.upstream, Stage: classify.StageReadBody, Category: classify.Answered,
				Evidence: classify.EvidenceStatus, Err: withCause(b.ctx, err)}
		}
	}
	return n, err
}

func (b *body) Close() error {
	b.closing.Store(true)
	err := b.rc.Close()
	b.end(b.failed, false)
	return err
}

// contextDone ends the exchange when the attempt's context ends before the
// body did: a per-attempt timeout is a failure, a cancellation by the caller
// is neither. The body is closed, which frees its connection; a later Read
// fails with the context's cause.
func (b *body) contextDone() {
	timedOut := !callerCancelled(b.ctx)
	b.end(timedOut, !timedOut)
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
	if release {
		b.pm.Release()
		return
	}
	finish(&b.pm, failed, b.elapsed)
}
