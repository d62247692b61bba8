package outbound

import (
	"context"
	"log/slog"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// SlogHooks returns hooks that log the library's decisions to l:
//
//   - Warn: a call whose commit status is unknown, a breaker opening, a retry
//     budget exhausted.
//   - Info: a failed attempt (not sent, ambiguous, rejected locally), a retry
//     scheduled or declined, a call not committed, other breaker transitions,
//     an adaptive concurrency limit moved (a rejection by the client-side
//     throttle is a failed attempt rejected locally, guard "throttle").
//   - Debug: answered attempts and committed calls, every guard event.
//
// Records carry the upstream (scheme://host:port), the method, the attempt
// number, stage, category, evidence, status, duration, and the reason of each
// decision. They never carry the URL's path or query, a header (no
// Authorization, no Cookie) or a body. Error texts are those of Go's network
// stack and name addresses, not request contents.
func SlogHooks(l *slog.Logger) Hooks {
	return Hooks{
		AttemptDone: func(ctx context.Context, a AttemptInfo, r outcome.Attempt) {
			level := slog.LevelInfo
			if r.Category == classify.Answered {
				level = slog.LevelDebug
			}
			attrs := []slog.Attr{
				slog.String("upstream", a.Upstream), slog.String("method", a.Method), slog.Int("attempt", a.Attempt),
				slog.String("stage", r.Stage.String()), slog.String("category", r.Category.String()),
				slog.String("evidence", r.Evidence.String()), slog.Duration("duration", r.Duration),
			}
			if r.Status != 0 {
				attrs = append(attrs, slog.Int("status", r.Status))
			}
			if r.Guard != 0 {
				attrs = append(attrs, slog.String("guard", r.Guard.String()))
			}
			if r.Endpoint != "" {
				attrs = append(attrs, slog.String("endpoint", r.Endpoint))
			}
			if r.Err != nil {
				attrs = append(attrs, slog.String("error", r.Err.Error()))
			}
			l.LogAttrs(ctx, level, "outbound attempt", attrs...)
		},
		RetryDecided: func(ctx context.Context, a AttemptInfo, d retry.Decision) {
			msg := "outbound retry declined"
			attrs := []slog.Attr{slog.String("upstream", a.Upstream), slog.String("method", a.Method),
				slog.Int("attempt", a.Attempt), slog.String("reason", d.Reason.String())}
			if d.Retry {
				msg = "outbound retry scheduled"
				attrs = append(attrs, slog.Duration("wait", d.Wait))
			}
			l.LogAttrs(ctx, slog.LevelInfo, msg, attrs...)
		},
		EndpointEjected: func(upstream, endpoint string, d time.Duration) {
			if d == 0 {
				l.LogAttrs(context.Background(), slog.LevelInfo, "outbound endpoint back", slog.String("upstream", upstream),
					slog.String("endpoint", endpoint))
				return
			}
			l.LogAttrs(context.Background(), slog.LevelWarn, "outbound endpoint ejected", slog.String("upstream", upstream),
				slog.String("endpoint", endpoint), slog.Duration("for", d))
		},
		BudgetExhausted: func(ctx context.Context, upstream string) {
			l.LogAttrs(ctx, slog.LevelWarn, "outbound retry budget exhausted", slog.String("upstream", upstream))
		},
		CallDone: func(ctx context.Context, o *outcome.Outcome) {
			level := slog.LevelDebug
			switch o.Commit {
			case outcome.Unknown:
				level = slog.LevelWarn
			case outcome.NotCommitted:
				level = slog.LevelInfo
			}
			l.LogAttrs(ctx, level, "outbound call", slog.String("upstream", o.Upstream), slog.String("method", o.Method),
				slog.String("commit", o.Commit.String()), slog.Int("attempts", len(o.Attempts)), slog.String("reason", o.Why()))
		},
		Guard: func(e admission.Event) {
			if e.Kind == admission.Transition {
				level := slog.LevelInfo
				if e.Transition.To == circuit.Open {
					level = slog.LevelWarn
				}
				l.LogAttrs(context.Background(), level, "outbound breaker transition", slog.String("upstream", e.Upstream),
					slog.String("from", e.Transition.From.String()), slog.String("to", e.Transition.To.String()),
					slog.String("reason", e.Transition.Cause.String()))
				return
			}
			if e.Kind == admission.LimitChanged {
				l.LogAttrs(context.Background(), slog.LevelInfo, "outbound concurrency limit changed", slog.String("upstream", e.Upstream),
					slog.Int("from", e.Limit[0]), slog.Int("to", e.Limit[1]))
				return
			}
			if l.Enabled(context.Background(), slog.LevelDebug) {
				attrs := []slog.Attr{slog.String("upstream", e.Upstream), slog.String("event", e.String())}
				if e.Err != nil {
					attrs = append(attrs, slog.String("error", e.Err.Error()))
				}
				l.LogAttrs(context.Background(), slog.LevelDebug, "outbound guard", attrs...)
			}
		},
	}
}
