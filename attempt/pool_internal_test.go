package attempt

import "testing"

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
