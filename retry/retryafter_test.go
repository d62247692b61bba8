package retry_test

import (
	"testing"
	"time"

	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/retry"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const limit = time.Minute
	for _, tc := range []struct {
		in     string
		d      time.Duration
		capped bool
		ok     bool
	}{
		{"0", 0, false, true},
		{"5", 5 * time.Second, false, true},
		{"60", time.Minute, false, true},
		{"61", limit, true, true},
		{"999999999999999999999999999999", limit, true, true},
		{"Sun, 29 Nov 2026 12:00:30 GMT", 30 * time.Second, false, true},
		{"Sunday, 29-Nov-26 12:00:30 GMT", 30 * time.Second, false, true}, // RFC 850, obsolete but allowed
		{"Sun Nov 29 12:00:30 2026", 30 * time.Second, false, true},       // asctime
		{"Sun, 29 Nov 2026 11:00:00 GMT", 0, false, true},                 // in the past
		{"Mon, 30 Nov 2026 12:00:00 GMT", limit, true, true},
		{"", 0, false, false},
		{"-1", 0, false, false},
		{"+5", 0, false, false},
		{"1.5", 0, false, false},
		{" 5", 0, false, false},
		{"5 ", 0, false, false},
		{"5, 6", 0, false, false},
		{"0x10", 0, false, false},
		{"soon", 0, false, false},
		{"Sun, 29 Nov 2026 12:00:30", 0, false, false}, // no zone
		{string(make([]byte, 100)), 0, false, false},
	} {
		d, capped, ok := retry.ParseRetryAfter(tc.in, now, limit)
		if d != tc.d || capped != tc.capped || ok != tc.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v, %v; want %v, %v, %v", tc.in, d, capped, ok, tc.d, tc.capped, tc.ok)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", "99999999999999999999", "Sun, 29 Nov 2026 12:00:30 GMT", "-1", "1e9", "\x00"} {
		f.Add(s, int64(time.Minute))
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string, limit int64) {
		if limit < 0 {
			limit = -limit
		}
		lim := time.Duration(limit % int64(24*time.Hour))
		d, capped, ok := retry.ParseRetryAfter(s, now, lim)
		switch {
		case !ok && (d != 0 || capped):
			t.Fatalf("%q: not ok but %v, %v", s, d, capped)
		case d < 0 || d > lim:
			t.Fatalf("%q: %v outside [0, %v]", s, d, lim)
		case capped && d != lim:
			t.Fatalf("%q: capped at %v, not the limit %v", s, d, lim)
		}
	})
}

func FuzzDecide(f *testing.F) {
	f.Add("GET", false, true, uint8(2), true, true, int64(time.Second), false, 1, 3, int64(100e6), true, int64(2e9), true, false, false, uint8(0))
	f.Add("POST", true, false, uint8(3), false, false, int64(0), true, 3, 3, int64(-5), false, int64(0), false, true, false, uint8(5))
	f.Add("GET", false, true, uint8(3), false, false, int64(0), false, 3, 3, int64(0), true, int64(5e8), false, true, false, uint8(16))
	f.Fuzz(func(t *testing.T, method string, key, replayable bool, cat uint8, retryable, hasRA bool, ra int64, capped bool,
		attempts, maxAttempts int, backoff int64, hasDeadline bool, remaining int64, budget bool,
		lifecycle, transparentUsed bool, ev uint8) {
		in := retry.Input{Method: method, IdempotencyKey: key, BodyReplayable: replayable,
			Category: classifyCategory(cat), Evidence: classify.Evidence(ev % 20), RetryableStatus: retryable, HasRetryAfter: hasRA,
			RetryAfter: time.Duration(ra), RetryAfterCapped: capped, Attempts: attempts, MaxAttempts: maxAttempts,
			Backoff: time.Duration(backoff), HasDeadline: hasDeadline, Remaining: time.Duration(remaining), BudgetAllows: budget,
			Lifecycle: lifecycle, TransparentUsed: transparentUsed}
		d := retry.Decide(in)
		if !d.Retry {
			if d.Wait != 0 || d.Reason == retry.Retryable || d.Reason == retry.Transparent || d.Reason == 0 {
				t.Fatalf("no retry with %+v", d)
			}
			return
		}
		switch {
		case !replayable:
			t.Fatal("retried a one-shot body")
		case in.Category == classify.LocalRejection:
			t.Fatal("retried a local rejection")
		case in.Evidence == classify.EvidenceTLSRefused:
			t.Fatal("retried a refused TLS handshake")
		case in.Category != classify.NotSent && !key && !retry.Idempotent(method):
			t.Fatal("retried a non-idempotent request that may have been processed")
		case d.Wait < 0 || (hasDeadline && d.Wait >= in.Remaining):
			t.Fatalf("wait %v with %v left", d.Wait, in.Remaining)
		}
		if d.Reason == retry.Transparent {
			if !lifecycle || transparentUsed || in.Category == classify.Answered || d.Wait != 0 {
				t.Fatalf("transparent retry of %+v", in)
			}
			return
		}
		switch {
		case d.Reason != retry.Retryable:
			t.Fatalf("retry with reason %v", d.Reason)
		case attempts >= maxAttempts:
			t.Fatal("retried past MaxAttempts")
		case !budget && !retry.Drained(in.Evidence, in.Lifecycle):
			t.Fatal("retried without budget, though no connection being taken down ended the attempt")
		}
	})
}
