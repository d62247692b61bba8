// Package outboundotel records the calls of an outbound.Transport as
// OpenTelemetry spans and metrics, following the HTTP client semantic
// conventions where they apply. It is a module of its own, so that programs
// that use outbound without OpenTelemetry download nothing of it.
//
//	hooks, err := outboundotel.Hooks(outboundotel.WithMeterProvider(mp))
//	if err != nil {
//		return err
//	}
//	t, err := outbound.New(outbound.Config{Hooks: hooks})
//	if err != nil {
//		return err
//	}
//	guards, err := outboundotel.ObserveGuards(t, outboundotel.WithMeterProvider(mp))
//
// To log as well, compose: outbound.ComposeHooks(hooks, outbound.SlogHooks(l)).
//
// # Spans
//
// A call is one INTERNAL span, with one CLIENT span per physical attempt as
// its children:
//
//	outbound GET                  INTERNAL  (the caller's span, if any, is its parent)
//	├── GET                       CLIENT    attempt 1: REFUSED_STREAM, NotSent
//	└── GET                       CLIENT    attempt 2: 200, http.request.resend_count=1
//
// The call span, named "outbound {method}", starts when the call starts and
// ends when Do or RoundTrip returns. It carries outbound.upstream,
// http.request.method, server.address, server.port and url.scheme, and at
// its end outbound.commit_status ("committed", "not committed" or
// "unknown"), outbound.attempts and outbound.end_reason (why the call ended:
// the decision after its last attempt). Its status is Error when the commit
// status is not committed or unknown.
//
// An attempt span, named "{method}" as the conventions name HTTP client
// spans, starts before the attempt asks the local guards (so a local
// rejection has its span too) and ends when the attempt has its result: the
// response headers or a classified failure. It carries http.request.method,
// server.address, server.port, url.scheme, http.request.resend_count (only
// on a resend, that is from the second attempt on, as the conventions ask),
// http.response.status_code when answered, and outbound.stage,
// outbound.category, outbound.evidence, outbound.decision (the retry
// decision taken after it), for a local rejection, outbound.guard, and,
// with Config.Endpoints, network.peer.address and network.peer.port: the
// endpoint the attempt went to. A
// failed attempt has error.type set to its category ("NotSent",
// "Ambiguous", "LocalRejection"), status Error, and its error recorded as an
// exception event; an answer of 400 or more has error.type set to the status
// code ("503") and status Error, as the conventions ask of client spans.
//
// The commit status is a property of the call, not of an attempt: the
// attempt spans end before it is known, so it is only on the call span.
//
// An unknown method is recorded as "_OTHER" (with http.request.method_original
// on spans), and spans are then named "HTTP" and "outbound HTTP". server.port
// is left out when the URL names no port and the scheme has no default one.
//
// # Metrics
//
// Instruments are created once, by Hooks:
//
//   - http.client.request.duration (histogram, "s", the buckets the
//     conventions advise): the duration of each attempt but local
//     rejections, which are not requests, from admission to the response
//     headers or the failure, with http.request.method, server.address,
//     server.port, url.scheme, http.response.status_code when answered, and
//     error.type as on the attempt's span.
//   - outbound.attempts (counter, "{attempt}"): attempts by outbound.upstream
//     and outbound.category.
//   - outbound.rejections (counter, "{attempt}"): attempts refused by a
//     local guard, by outbound.upstream and outbound.guard ("circuit",
//     "rate", "bulkhead").
//   - outbound.retries (counter, "{retry}"): retries scheduled, by
//     outbound.upstream.
//   - outbound.retry.declined (counter, "{retry}"): retries not made after
//     an attempt that did not end the call with a final answer, by
//     outbound.upstream and outbound.reason.
//   - outbound.retry_budget.exhausted (counter, "{attempt}"): retries
//     declined by the upstream's retry budget alone (they are in
//     outbound.retry.declined too, as "retry budget exhausted") and hedges
//     it withheld, by outbound.upstream.
//   - outbound.calls (counter, "{call}"): finished calls, by
//     outbound.upstream and outbound.commit_status.
//   - outbound.endpoint.ejections (counter, "{ejection}"): endpoints
//     ejected (Config.Endpoints), by outbound.upstream and
//     outbound.endpoint ("ip:port"; at most Endpoints.MaxEndpoints per
//     host).
//
// Measurements are taken in the hook's context, so an exemplar points at the
// attempt's or the call's span.
//
// # What is recorded
//
// Never the URL's path or query, a header or a body. outbound.upstream is
// the upstream key (scheme://host:port unless Config.UpstreamKey says
// otherwise: keep such keys free of secrets and of high cardinality). Error
// texts of classified failures are those of Go's network stack, which name
// addresses, not request contents; an unclassified error (an invalid
// request, a GetBody that failed) is recorded without its text, which may
// quote the URL.
//
// Create the hooks once per Transport and keep them as long as it: the
// instruments live as long as the MeterProvider.
//
// # Guards
//
// The breakers' state and figures (failure and slow-call rates, buffered,
// failed, slow and not-permitted calls), the bulkheads' limits and the
// throttles' probabilities of refusal are read from the Transport itself,
// once it exists, at each collection, by ObserveGuards (see it for the
// instruments). Unregister what it returns when the Transport is closed.
package outboundotel

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/outboundhq/outbound/otel"

// Attribute keys of the library's own attributes.
const (
	UpstreamKey     = attribute.Key("outbound.upstream")
	CommitStatusKey = attribute.Key("outbound.commit_status")
	AttemptsKey     = attribute.Key("outbound.attempts")
	EndReasonKey    = attribute.Key("outbound.end_reason")
	StageKey        = attribute.Key("outbound.stage")
	CategoryKey     = attribute.Key("outbound.category")
	EvidenceKey     = attribute.Key("outbound.evidence")
	GuardKey        = attribute.Key("outbound.guard")
	DecisionKey     = attribute.Key("outbound.decision")
	ReasonKey       = attribute.Key("outbound.reason")
	EndpointKey     = attribute.Key("outbound.endpoint")
	StateKey        = attribute.Key("outbound.state")
)

// Option configures Hooks.
type Option func(*config)

type config struct {
	mp metric.MeterProvider
	tp trace.TracerProvider
}

// WithMeterProvider sets the meter provider; the default is the global one
// (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets the tracer provider; the default is the global one
// (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// durationBuckets are the bucket boundaries the semantic conventions advise
// for http.client.request.duration.
var durationBuckets = []float64{0, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// Hooks returns outbound.Hooks that record OpenTelemetry metrics and spans,
// as the package documentation describes. It fails only if an instrument
// cannot be created.
func Hooks(opts ...Option) (outbound.Hooks, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	r := &recorder{
		tracer:    c.tp.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		upstreams: map[string]trace.SpanStartOption{},
		sets:      map[setKey]*measureOpts{},
		upSets:    map[string][]setKey{},
	}
	m := c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var errs error
	counter := func(name, unit, desc string) metric.Int64Counter {
		ctr, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = errors.Join(errs, err)
		return ctr
	}
	var err error
	r.duration, err = m.Float64Histogram("http.client.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP client requests."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	errs = errors.Join(errs, err)
	r.attempts = counter("outbound.attempts", "{attempt}", "Attempts, by category.")
	r.rejections = counter("outbound.rejections", "{attempt}", "Attempts refused by a local guard.")
	r.retries = counter("outbound.retries", "{retry}", "Retries scheduled.")
	r.declined = counter("outbound.retry.declined", "{retry}", "Retries not made, by reason.")
	r.exhausted = counter("outbound.retry_budget.exhausted", "{attempt}", "Retries declined and hedges withheld by the retry budget.")
	r.calls = counter("outbound.calls", "{call}", "Finished calls, by commit status.")
	r.ejections = counter("outbound.endpoint.ejections", "{ejection}", "Endpoints of an upstream ejected (Config.Endpoints), by endpoint.")
	if errs != nil {
		return outbound.Hooks{}, errs
	}
	return outbound.Hooks{
		CallStart:         r.callStart,
		AttemptStart:      r.attemptStart,
		AttemptDone:       r.attemptDone,
		RetryDecided:      r.retryDecided,
		BudgetExhausted:   r.budgetExhausted,
		CallDone:          r.callDone,
		Guard:             r.guard,
		UpstreamForgotten: r.forget,
		EndpointEjected:   r.ejected,
	}, nil
}

type recorder struct {
	tracer     trace.Tracer
	duration   metric.Float64Histogram
	attempts   metric.Int64Counter
	rejections metric.Int64Counter
	retries    metric.Int64Counter
	declined   metric.Int64Counter
	exhausted  metric.Int64Counter
	calls      metric.Int64Counter
	ejections  metric.Int64Counter

	umu       sync.RWMutex
	upstreams map[string]trace.SpanStartOption // outbound.upstream of call spans, by upstream

	smu    sync.RWMutex
	sets   map[setKey]*measureOpts
	upSets map[string][]setKey // the keys in sets of each upstream's measurements
}

// forget drops what the recorder keeps for an upstream whose state the
// Transport forgot: its cached attributes.
func (r *recorder) forget(upstream string) {
	r.umu.Lock()
	delete(r.upstreams, upstream)
	r.umu.Unlock()
	r.smu.Lock()
	for _, k := range r.upSets[upstream] {
		delete(r.sets, k)
	}
	delete(r.upSets, upstream)
	r.smu.Unlock()
}

// callKey is the context key of a call's state.
type callKey struct{}

// callState is what the hooks of one call share. They run one after the
// other in the call's goroutine, so it needs no lock. The arrays hold the
// span start options, so that starting a span allocates no option slice.
type callState struct {
	span        trace.Span // the call's
	attempt     trace.Span // the attempt in progress, until AttemptDone
	attemptName string
	attrs       [5]attribute.KeyValue
	callOpts    [3]trace.SpanStartOption
	attemptOpts [3]trace.SpanStartOption
}

var (
	internalKind = trace.WithSpanKind(trace.SpanKindInternal)
	clientKind   = trace.WithSpanKind(trace.SpanKindClient)
)

func (r *recorder) callStart(ctx context.Context, c outbound.CallInfo) context.Context {
	upAttr := r.upstreamAttr(c.Upstream)
	method, known := knownMethod(c.Method)
	st := &callState{attemptName: method}
	attrs := append(st.attrs[:0], semconv.HTTPRequestMethodKey.String(method))
	if !known {
		attrs = append(attrs, semconv.HTTPRequestMethodOriginal(c.Method))
	}
	attrs = append(attrs, semconv.ServerAddress(c.Host))
	if c.Port != 0 {
		attrs = append(attrs, semconv.ServerPort(c.Port))
	}
	attrs = append(attrs, semconv.URLScheme(c.Scheme))
	common := trace.WithAttributes(attrs...)
	st.callOpts = [...]trace.SpanStartOption{internalKind, upAttr, common}
	st.attemptOpts = [...]trace.SpanStartOption{clientKind, common, nil}
	name, ok := callSpanNames[method]
	if !known {
		st.attemptName, name = "HTTP", "outbound HTTP"
	} else if !ok {
		name = "outbound " + method
	}
	ctx, st.span = r.tracer.Start(ctx, name, st.callOpts[:]...)
	return context.WithValue(ctx, callKey{}, st)
}

// callSpanNames are the names of call spans by method.
var callSpanNames = map[string]string{}

func init() {
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead,
		http.MethodPatch, http.MethodOptions, http.MethodConnect, http.MethodTrace, "QUERY"} {
		callSpanNames[m] = "outbound " + m
	}
}

func (r *recorder) attemptStart(ctx context.Context, a outbound.AttemptInfo) context.Context {
	st, _ := ctx.Value(callKey{}).(*callState)
	if st == nil {
		return ctx
	}
	opts := st.attemptOpts[:2]
	if a.Attempt > 1 {
		st.attemptOpts[2] = trace.WithAttributes(semconv.HTTPRequestResendCount(a.Attempt - 1))
		opts = st.attemptOpts[:]
	}
	ctx, st.attempt = r.tracer.Start(ctx, st.attemptName, opts...)
	return ctx
}

func (r *recorder) attemptDone(ctx context.Context, a outbound.AttemptInfo, res outcome.Attempt) {
	category, errType := categoryName(res.Category), ""
	switch {
	case res.Category == classify.Answered:
		if res.Status >= 400 {
			errType = statusText(res.Status)
		}
	default:
		errType = category
	}
	r.attempts.Add(ctx, 1, r.opts(setKey{kind: kindAttempts, a: a.Upstream, b: category}).add...)
	if res.Category != classify.LocalRejection && res.Category != 0 {
		method, _ := knownMethod(a.Method)
		k := setKey{kind: kindDuration, a: method, b: a.Host, c: a.Scheme, d: errType, n: a.Port, m: res.Status}
		r.duration.Record(ctx, res.Duration.Seconds(), r.opts(k).rec...)
	}

	st, _ := ctx.Value(callKey{}).(*callState)
	if st == nil || st.attempt == nil {
		return
	}
	span := st.attempt
	st.attempt = nil
	if !span.IsRecording() {
		span.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 8)
	if res.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(res.Status))
	}
	if res.Stage != 0 {
		attrs = append(attrs, StageKey.String(res.Stage.String()))
	}
	attrs = append(attrs, CategoryKey.String(category))
	if res.Evidence != 0 {
		attrs = append(attrs, EvidenceKey.String(res.Evidence.String()))
	}
	if res.Guard != 0 {
		attrs = append(attrs, GuardKey.String(res.Guard.String()))
	}
	if res.Decision != 0 {
		attrs = append(attrs, DecisionKey.String(res.Decision.String()))
	}
	if host, port, err := net.SplitHostPort(res.Endpoint); err == nil { // with Config.Endpoints
		attrs = append(attrs, semconv.NetworkPeerAddress(host))
		if p, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, semconv.NetworkPeerPort(p))
		}
	}
	if errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errType))
	}
	span.SetAttributes(attrs...)
	switch {
	case res.Err != nil && res.Category != 0:
		span.RecordError(res.Err)
		span.SetStatus(codes.Error, res.Err.Error())
	case res.Err != nil:
		span.SetStatus(codes.Error, "request not sent: unclassified error")
	case errType != "":
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

func (r *recorder) retryDecided(ctx context.Context, a outbound.AttemptInfo, d retry.Decision) {
	if d.Retry {
		r.retries.Add(ctx, 1, r.opts(setKey{kind: kindRetries, a: a.Upstream}).add...)
		return
	}
	r.declined.Add(ctx, 1, r.opts(setKey{kind: kindDeclined, a: a.Upstream, n: int(d.Reason)}).add...)
}

func (r *recorder) ejected(upstream, endpoint string, d time.Duration) {
	if d > 0 {
		r.ejections.Add(context.Background(), 1, r.opts(setKey{kind: kindEjections, a: upstream, b: endpoint}).add...)
	}
}

func (r *recorder) budgetExhausted(ctx context.Context, upstream string) {
	r.exhausted.Add(ctx, 1, r.opts(setKey{kind: kindExhausted, a: upstream}).add...)
}

func (r *recorder) callDone(ctx context.Context, o *outcome.Outcome) {
	commit := o.Commit
	if commit == 0 { // not resolved (a GetBody that failed before a retry)
		commit = outcome.CommitOf(o.Attempts)
	}
	r.calls.Add(ctx, 1, r.opts(setKey{kind: kindCalls, a: o.Upstream, n: int(commit)}).add...)
	st, _ := ctx.Value(callKey{}).(*callState)
	if st == nil {
		return
	}
	if st.attempt != nil { // an attempt that never had a result: its request could not be built
		st.attempt.SetStatus(codes.Error, "request not sent: unclassified error")
		st.attempt.End()
		st.attempt = nil
	}
	span := st.span
	if span.IsRecording() {
		span.SetAttributes(CommitStatusKey.String(commit.String()), AttemptsKey.Int(len(o.Attempts)),
			EndReasonKey.String(o.Why()))
		if commit != outcome.Committed {
			span.SetStatus(codes.Error, commit.String())
		}
	}
	span.End()
}

func (r *recorder) guard(e admission.Event) {
	if e.Kind == admission.Reject {
		r.rejections.Add(context.Background(), 1, r.opts(setKey{kind: kindRejections, a: e.Upstream, n: int(e.Guard)}).add...)
	}
}

// knownMethod returns method if it is one the conventions name, else
// "_OTHER" and false.
func knownMethod(method string) (string, bool) {
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodHead,
		http.MethodPatch, http.MethodOptions, http.MethodConnect, http.MethodTrace, "QUERY":
		return method, true
	}
	return "_OTHER", false
}

// statusTexts are the status codes from 400 to 599 as strings.
var statusTexts [200]string

func init() {
	for i := range statusTexts {
		statusTexts[i] = strconv.Itoa(400 + i)
	}
}

func statusText(code int) string {
	if code >= 400 && code < 600 {
		return statusTexts[code-400]
	}
	return strconv.Itoa(code)
}

func categoryName(c classify.Category) string {
	if c == 0 {
		return "_OTHER"
	}
	return c.String()
}

// The upstream attribute of call spans.

// upstreamAttr returns the outbound.upstream attribute of upstream's call
// spans, cached until the upstream is forgotten.
func (r *recorder) upstreamAttr(upstream string) trace.SpanStartOption {
	r.umu.RLock()
	o, ok := r.upstreams[upstream]
	r.umu.RUnlock()
	if ok {
		return o
	}
	o = trace.WithAttributes(UpstreamKey.String(upstream))
	r.umu.Lock()
	if len(r.upstreams) < maxSets {
		r.upstreams[upstream] = o
	}
	r.umu.Unlock()
	return o
}

// Attribute sets, cached.

// Kinds of setKey.
const (
	kindDuration = iota + 1
	kindAttempts
	kindRejections
	kindRetries
	kindDeclined
	kindExhausted
	kindCalls
	kindEjections
)

// setKey names the attribute set of one measurement: a kind and the values
// it is built from.
type setKey struct {
	kind       uint8
	a, b, c, d string
	n, m       int
}

// measureOpts are the options that carry one attribute set.
type measureOpts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

// maxSets bounds the cache of attribute sets. Past it, sets are built for
// each measurement: correct, only slower.
const maxSets = 4096

// opts returns the measurement options of k, from the cache when it can.
// Building a set sorts and copies its attributes; the cache makes a
// measurement allocation-free once its series exists.
func (r *recorder) opts(k setKey) *measureOpts {
	r.smu.RLock()
	o := r.sets[k]
	r.smu.RUnlock()
	if o != nil {
		return o
	}
	set := k.set()
	o = &measureOpts{add: []metric.AddOption{metric.WithAttributeSet(set)}, rec: []metric.RecordOption{metric.WithAttributeSet(set)}}
	r.smu.Lock()
	if len(r.sets) < maxSets {
		if prev := r.sets[k]; prev != nil {
			o = prev
		} else {
			r.sets[k] = o
			if k.kind != kindDuration { // the others are per upstream, named by k.a
				r.upSets[k.a] = append(r.upSets[k.a], k)
			}
		}
	}
	r.smu.Unlock()
	return o
}

func (k setKey) set() attribute.Set {
	switch k.kind {
	case kindDuration:
		kv := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(k.a), semconv.ServerAddress(k.b), semconv.URLScheme(k.c)}
		if k.n != 0 {
			kv = append(kv, semconv.ServerPort(k.n))
		}
		if k.m != 0 {
			kv = append(kv, semconv.HTTPResponseStatusCode(k.m))
		}
		if k.d != "" {
			kv = append(kv, semconv.ErrorTypeKey.String(k.d))
		}
		return attribute.NewSet(kv...)
	case kindAttempts:
		return attribute.NewSet(UpstreamKey.String(k.a), CategoryKey.String(k.b))
	case kindRejections:
		return attribute.NewSet(UpstreamKey.String(k.a), GuardKey.String(classify.Guard(k.n).String()))
	case kindDeclined:
		return attribute.NewSet(UpstreamKey.String(k.a), ReasonKey.String(retry.Reason(k.n).String()))
	case kindCalls:
		return attribute.NewSet(UpstreamKey.String(k.a), CommitStatusKey.String(outcome.Commit(k.n).String()))
	case kindEjections:
		return attribute.NewSet(UpstreamKey.String(k.a), EndpointKey.String(k.b))
	}
	return attribute.NewSet(UpstreamKey.String(k.a))
}
