package retry

import (
	"net/http"
	"time"
)

// ParseRetryAfter reads a Retry-After header value (RFC 9110 §10.2.3): either
// delta-seconds (1*DIGIT) or an HTTP-date. It is strict: anything else —
// signs, fractions, spaces inside the number, garbage, several values —
// is ignored (ok is false), never an error or a panic. A delay longer than
// limit (or a number too large to represent) is clamped to limit, and
// reported with capped true, so that the caller can decline a wait the
// server asks for but the client will not make. A date in the past means
// zero. now is the time the answer arrived.
func ParseRetryAfter(value string, now time.Time, limit time.Duration) (d time.Duration, capped, ok bool) {
	if value == "" || len(value) > 64 {
		return 0, false, false
	}
	if value[0] >= '0' && value[0] <= '9' {
		var secs int64
		for i := 0; i < len(value); i++ {
			c := value[i]
			if c < '0' || c > '9' {
				return 0, false, false
			}
			if secs > int64(limit/time.Second)+1 {
				continue // already over the limit: keep validating, stop counting
			}
			secs = secs*10 + int64(c-'0')
		}
		d = time.Duration(secs) * time.Second
		if secs > int64(limit/time.Second) || d > limit {
			return limit, true, true
		}
		return d, false, true
	}
	t, err := http.ParseTime(value)
	if err != nil {
		return 0, false, false
	}
	switch d = t.Sub(now); {
	case d <= 0:
		return 0, false, true
	case d > limit:
		return limit, true, true
	}
	return d, false, true
}
