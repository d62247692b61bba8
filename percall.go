package outbound

import "context"

type maxAttemptsKey struct{}

// WithMaxAttempts returns a copy of ctx under which a call makes at most n
// attempts, the first included, whatever Config.MaxAttempts says: 1 turns
// the library's retries off for the calls made with it. Use it around an SDK
// that retries by itself, so that the two retry layers do not multiply.
// Transparent retries (a stream above a graceful GOAWAY, the keep-alive race:
// see retry.Transparent), which net/http makes silently too, are not
// attempts and still happen. n is clamped to [1, 100].
func WithMaxAttempts(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, maxAttemptsKey{}, min(max(n, 1), 100))
}
