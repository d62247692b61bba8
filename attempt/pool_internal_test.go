package attempt

import (
	"testing"
	"time"
)

// TestAStreamLimitIsBelievedOnlyWhenItRepeats pins a bug the soak found: the
// pool took any count of answers before a GOAWAY for the upstream's stream
// limit, so GOAWAYs at random counts (faults, reloads) taught it limits of 1
// or 2, and every one-shot request dialed a connection of its own. A limit is
// believed only when two of the last four connections ended at the same
// count, of 8 or more.
func TestAStreamLimitIsBelievedOnlyWhenItRepeats(t *testing.T) {
	for _, tc := range []struct {
		seen [4]int32
		want int32
	}{
		{[4]int32{50, 0, 0, 0}, 0},                 // once: could be a reload
		{[4]int32{50, 50, 0, 0}, 50 - 6},           // nginx's keepalive_requests 50, twice
		{[4]int32{50, 7, 50, 23}, 50 - 6},          // with reloads in between
		{[4]int32{7, 7, 3, 3}, 0},                  // repeated, but too small to be a limit worth keeping to
		{[4]int32{1000, 1000, 50, 50}, 1000 - 125}, // the largest repeated one
		{[4]int32{12, 31, 5, 44}, 0},               // every count different: no limit
	} {
		p := &pool{streamLimits: tc.seen}
		if got := p.streamLimit(); got != tc.want {
			t.Errorf("after %v: %d, want %d", tc.seen, got, tc.want)
		}
	}
}

// TestAnIdleLimitIsBelievedOnlyWhenTwoClosesAgree: a server's keep-alive
// timeout closes idle connections after the same time each time; a reload or
// a fault closes them at any age. The limit is believed once two of the last
// four idle closes are within a fifth of each other, and requests that
// cannot be sent again keep off connections idle for seven eighths of it.
func TestAnIdleLimitIsBelievedOnlyWhenTwoClosesAgree(t *testing.T) {
	const s = time.Second
	for _, tc := range []struct {
		seen [4]time.Duration
		want time.Duration
	}{
		{[4]time.Duration{s, 0, 0, 0}, 0},                                      // once: could be a reload
		{[4]time.Duration{s, s + s/20, 0, 0}, s - s/8},                         // a 1 s timeout, seen twice
		{[4]time.Duration{s, 40 * time.Millisecond, s + s/10, 7 * s}, s - s/8}, // with reloads in between
		{[4]time.Duration{s, 2 * s, 4 * s, 8 * s}, 0},                          // every close at another age
		{[4]time.Duration{75 * s, 75 * s, s, s}, s - s/8},                      // the shorter of two agreeing pairs
	} {
		p := &pool{idleCloses: tc.seen}
		if got := p.idleLimit(); got != tc.want {
			t.Errorf("after %v: %v, want %v", tc.seen, got, tc.want)
		}
	}
}
