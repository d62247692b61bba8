package retry

import (
	"testing"
	"time"
)

func TestBackoffGrowsExponentiallyWithJitterAndIsCapped(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: 0.2}
	for _, tc := range []struct {
		n    int
		r    float64
		want time.Duration
	}{
		{1, 0.5, 100 * time.Millisecond},
		{2, 0.5, 200 * time.Millisecond},
		{3, 0.5, 400 * time.Millisecond},
		{3, 0, 320 * time.Millisecond}, // -20%
		{3, 1, 480 * time.Millisecond}, // +20%
		{10, 0.5, time.Second},         // capped
		{10, 0.99, time.Second},        // jitter never exceeds the cap
		{200, 0.5, time.Second},        // no overflow
	} {
		if got := b.delay(tc.n, tc.r); got < tc.want-time.Microsecond || got > tc.want+time.Microsecond {
			t.Errorf("delay(%d, %v) = %v, want %v", tc.n, tc.r, got, tc.want)
		}
	}
	if d := (Backoff{}).withDefaults(); d.Initial != 100*time.Millisecond || d.Max != 5*time.Second || d.Multiplier != 2 || d.Jitter != 0.2 {
		t.Fatalf("defaults %+v", d)
	}
}
