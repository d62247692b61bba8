package clock_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/internal/clock"
)

// The guards rely on clock.Now following a synctest bubble's fake clock, and
// on Never being earlier than any reading, inside a bubble or not.
func TestNowFollowsTheSynctestClock(t *testing.T) {
	if clock.Now() <= clock.Never {
		t.Fatal("a reading outside a bubble is not after Never")
	}
	synctest.Test(t, func(t *testing.T) {
		a := clock.Now()
		if a <= clock.Never {
			t.Fatal("a reading inside a bubble is not after Never")
		}
		time.Sleep(90 * time.Second)
		if got := time.Duration(clock.Now() - a); got != 90*time.Second {
			t.Fatalf("clock moved %v during a 90s fake sleep", got)
		}
	})
}
