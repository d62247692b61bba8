package throttle

import (
	"context"
	"testing"

	"github.com/outboundhq/outbound/criticality"
)

// TestSheddableCallsAreRefusedBeforeCriticalOnesAtTheThrottle: with the
// upstream accepting 40 % of what it is sent (K 2: default calls refused
// about a fifth of the time), sheddable calls are refused more often than
// default ones and critical ones not at all; at 20 % accepted, critical
// calls are refused too, still less often than the others.
func TestSheddableCallsAreRefusedBeforeCriticalOnesAtTheThrottle(t *testing.T) {
	for _, tc := range []struct {
		accepted         int // of 100
		critRefusedAtAll bool
	}{{40, false}, {20, true}} {
		const now = 1
		// Each level asks a throttle of its own, from the same counts.
		refused := map[criticality.Level]int{}
		for _, l := range []criticality.Level{criticality.Sheddable, criticality.Default, criticality.Critical} {
			ctx := criticality.With(context.Background(), l)
			fresh, err := New(Config{Enabled: true})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 100 {
				if i < tc.accepted {
					fresh.acceptAt(now)
				} else {
					fresh.failAt(now)
				}
			}
			r, a := fresh.Counts()
			// K 2 as if halfway to 1 for sheddable calls, doubled for critical ones.
			p := fresh.probabilityK(r, a, map[criticality.Level]float64{criticality.Sheddable: 1.5, criticality.Default: 2, criticality.Critical: 4}[l])
			for range 2000 {
				before, _ := fresh.Counts()
				if !fresh.allowAt(now, ctx) {
					refused[l]++
				}
				// Undo the refusal's count, so that every ask sees the same state.
				if after, _ := fresh.Counts(); after != before {
					fresh.others[fresh.current()].Add(-1)
				}
			}
			if got := float64(refused[l]) / 2000; got < p-0.05 || got > p+0.05 {
				t.Errorf("%d%% accepted, %v: refused %.3f, want about %.3f", tc.accepted, l, got, p)
			}
		}
		if !(refused[criticality.Sheddable] > refused[criticality.Default] && refused[criticality.Default] > refused[criticality.Critical]) {
			t.Errorf("%d%% accepted: refused %v; want sheddable > default > critical", tc.accepted, refused)
		}
		if (refused[criticality.Critical] > 0) != tc.critRefusedAtAll {
			t.Errorf("%d%% accepted: %d critical calls refused", tc.accepted, refused[criticality.Critical])
		}
	}
}
