package outbound

import (
	"context"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// Hooks observe calls, attempts, retry decisions and the guards, in the
// manner of net/http/httptrace.ClientTrace. Every field is optional; a nil
// field costs nothing. Hooks of different calls run concurrently; the hooks
// of one call run one after the other, in its goroutine, except Guard, which
// also receives breaker transitions from the breaker's timers. A hook that
// panics is recovered (its event is dropped, a context-returning hook keeps
// the context it was given): an observer cannot break a call.
type Hooks struct {
	// CallStart is called when a call starts. The context it returns is
	// the call's from then on (a tracer puts the call's span in it).
	CallStart func(ctx context.Context, c CallInfo) context.Context

	// AttemptStart is called before each attempt asks the guards. The
	// context it returns is the attempt's (a tracer puts the attempt's
	// span in it).
	AttemptStart func(ctx context.Context, a AttemptInfo) context.Context

	// AttemptDone is called when an attempt has its result: an answer
	// (response headers), a classified failure, or a local rejection.
	AttemptDone func(ctx context.Context, a AttemptInfo, result outcome.Attempt)

	// RetryDecided is called after each attempt that did not end the call
	// with a final answer and after which a retry was decided: d.Retry says
	// whether another attempt follows (after d.Wait), d.Reason why or why
	// not. A call that ends without a decision (its context ended during
	// the attempt, the answer opened the breaker or was too large to keep)
	// is not told here: CallDone's Outcome.End says how it ended.
	RetryDecided func(ctx context.Context, a AttemptInfo, d retry.Decision)

	// BudgetExhausted is called when the retry budget of an upstream
	// declines a retry that every other rule allowed, or when a hedge is
	// withheld — by that budget or by the upstream's hedge allowance
	// (Outcome.HedgesWithheld counts those).
	BudgetExhausted func(ctx context.Context, upstream string)

	// CallDone is called when the call's outcome is known: when Do or
	// RoundTrip returns.
	CallDone func(ctx context.Context, out *outcome.Outcome)

	// Guard receives every admission event of every upstream: enter,
	// reject, exit, refund and release per guard, and breaker transitions.
	// It is called outside every lock, possibly concurrently.
	Guard func(e admission.Event)

	// UpstreamForgotten is called when the state of an upstream is
	// forgotten (Config.UpstreamIdleTime, Config.MaxUpstreams), so that an
	// observer can forget what it keeps per upstream too.
	UpstreamForgotten func(upstream string)

	// EndpointEjected is called, with Config.Endpoints, when an endpoint
	// ("ip:port") of an upstream is ejected for d, and with d = 0 when an
	// attempt finds its ejection over. It must not block.
	EndpointEjected func(upstream, endpoint string, d time.Duration)
}

// CallInfo describes a call.
type CallInfo struct {
	Upstream string // the upstream key, e.g. "https://api.example.com:443"
	Method   string
	Scheme   string
	Host     string // the URL's host, without the port
	Port     int
}

// AttemptInfo describes an attempt of a call.
type AttemptInfo struct {
	CallInfo
	Attempt int // 1 for the first attempt; http.request.resend_count is Attempt-1
}

// ComposeHooks returns hooks that call each of hs in order.
func ComposeHooks(hs ...Hooks) Hooks {
	var out Hooks
	for _, h := range hs {
		out.CallStart = chainCtx(out.CallStart, h.CallStart)
		out.AttemptStart = chainCtx(out.AttemptStart, h.AttemptStart)
		out.AttemptDone = chain3(out.AttemptDone, h.AttemptDone)
		out.RetryDecided = chain3(out.RetryDecided, h.RetryDecided)
		out.BudgetExhausted = chain2(out.BudgetExhausted, h.BudgetExhausted)
		out.CallDone = chain2(out.CallDone, h.CallDone)
		out.UpstreamForgotten = chain1(out.UpstreamForgotten, h.UpstreamForgotten)
		out.EndpointEjected = chain3(out.EndpointEjected, h.EndpointEjected)
		if f := h.Guard; f != nil {
			prev := out.Guard
			out.Guard = func(e admission.Event) {
				if prev != nil {
					prev(e)
				}
				f(e)
			}
		}
	}
	return out
}

// chainCtx chains two context-returning hooks: f sees the context prev
// returned.
func chainCtx[I any](prev, f func(context.Context, I) context.Context) func(context.Context, I) context.Context {
	switch {
	case f == nil:
		return prev
	case prev == nil:
		return f
	}
	return func(ctx context.Context, info I) context.Context { return f(prev(ctx, info), info) }
}

func chain1[A any](prev, f func(A)) func(A) {
	switch {
	case f == nil:
		return prev
	case prev == nil:
		return f
	}
	return func(a A) { prev(a); f(a) }
}

func chain2[A, B any](prev, f func(A, B)) func(A, B) {
	switch {
	case f == nil:
		return prev
	case prev == nil:
		return f
	}
	return func(a A, b B) { prev(a, b); f(a, b) }
}

func chain3[A, B, C any](prev, f func(A, B, C)) func(A, B, C) {
	switch {
	case f == nil:
		return prev
	case prev == nil:
		return f
	}
	return func(a A, b B, c C) { prev(a, b, c); f(a, b, c) }
}

// The safe* helpers call a hook, recovering a panic in it.

func safeCtx[I any](f func(context.Context, I) context.Context, ctx context.Context, info I) (out context.Context) {
	out = ctx
	defer func() {
		if recover() != nil {
			out = ctx
		}
	}()
	if c := f(ctx, info); c != nil {
		out = c
	}
	return out
}

func safe2[A, B any](f func(A, B), a A, b B) {
	defer func() { _ = recover() }()
	f(a, b)
}

func safe3[A, B, C any](f func(A, B, C), a A, b B, c C) {
	defer func() { _ = recover() }()
	f(a, b, c)
}
