package outbound

import "context"

// callOptions are what a call's context says over the Transport's Config:
// one value under one key, so that a call looks them up once.
type callOptions struct {
	maxAttempts int // 0: Config.MaxAttempts
	hedging     *Hedging
	setHedging  bool // hedging is set (nil: off)
}

type callOptionsKey struct{}

func optionsOf(ctx context.Context) callOptions {
	o, _ := ctx.Value(callOptionsKey{}).(callOptions)
	return o
}

// WithMaxAttempts returns a copy of ctx under which a call makes at most n
// attempts, the first included, whatever Config.MaxAttempts says: 1 turns
// the library's retries off for the calls made with it. Use it around an SDK
// that retries by itself, so that the two retry layers do not multiply.
// Transparent retries (a stream above a graceful GOAWAY, the keep-alive race:
// see retry.Transparent), which net/http makes silently too, are not
// attempts and still happen. n is clamped to [1, 100].
func WithMaxAttempts(ctx context.Context, n int) context.Context {
	o := optionsOf(ctx)
	o.maxAttempts = min(max(n, 1), 100)
	return context.WithValue(ctx, callOptionsKey{}, o)
}

// WithHedging returns a copy of ctx under which a call is hedged as h says,
// whatever Config.Hedging says; a nil h turns hedging off for the calls made
// with it. An h out of the ranges Hedging documents turns it off too.
func WithHedging(ctx context.Context, h *Hedging) context.Context {
	o := optionsOf(ctx)
	o.hedging, o.setHedging = h.clone(), true
	return context.WithValue(ctx, callOptionsKey{}, o)
}
