package throttle_test

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission/throttle"
)

func newThrottle(t *testing.T, cfg throttle.Config) *throttle.Throttle {
	t.Helper()
	cfg.Enabled = true
	th, err := throttle.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return th
}

func TestAnUpstreamThatAcceptsEverythingIsNeverThrottled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottle(t, throttle.Config{K: 1})
		for i := range 100_000 {
			if !th.Allow() {
				t.Fatalf("attempt %d refused, probability %v", i, th.Probability())
			}
			th.Accept()
			if i%1000 == 0 {
				time.Sleep(time.Second)
			}
		}
	})
}

// overload offers `offered` attempts per second for the given seconds to an
// upstream that accepts `capacity` of them per second (it answers the others
// with a refusal), and returns the attempts sent and accepted.
func overload(th *throttle.Throttle, offered, capacity, seconds int) (sent, accepted int) {
	for range seconds {
		taken := 0
		for range offered {
			if !th.Allow() {
				continue
			}
			sent++
			if taken < capacity {
				taken++
				accepted++
				th.Accept()
			} else {
				th.Fail()
			}
		}
		time.Sleep(time.Second)
	}
	return sent, accepted
}

// The SRE book's promise: after the window has filled, an overloaded upstream
// is sent about K times what it accepts.
func TestAnOverloadedUpstreamIsSentAboutKTimesWhatItAccepts(t *testing.T) {
	for _, k := range []float64{1.1, 2} {
		synctest.Test(t, func(t *testing.T) {
			th := newThrottle(t, throttle.Config{K: k, Window: 10 * time.Second})
			overload(th, 400, 100, 20) // the window fills
			sent, accepted := overload(th, 400, 100, 60)
			if ratio := float64(sent) / float64(accepted); ratio > k*1.05 || ratio < k*0.9 {
				t.Fatalf("K %v: sent %d for %d accepted: %.3f times", k, sent, accepted, ratio)
			}
		})
	}
}

// Some attempts always get through, so that a recovery can be seen; and once
// the upstream accepts again the throttle lets everything through within
// the window.
func TestTheRejectionCapLetsARecoveryBeSeen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottle(t, throttle.Config{Window: 10 * time.Second, MaxRejection: 0.9})
		sent, _ := overload(th, 1000, 0, 30)
		if sent < 30*1000/20 {
			t.Fatalf("an upstream accepting nothing was sent %d of 30000 attempts, want at least a twentieth", sent)
		}
		if p := th.Probability(); p != 0.9 {
			t.Fatalf("probability %v, want the cap 0.9", p)
		}
		// Recovered: every attempt sent is accepted. The attempts still
		// refused meanwhile count as requests, so the probability comes
		// down window by window (p → 2p−1 with K = 2), not at once.
		for s := 1; th.Probability() > 0; s++ {
			if s > 60 {
				t.Fatalf("probability %v after 60 s of successes", th.Probability())
			}
			overload(th, 1000, 1000, 1)
		}
	})
}

func TestTheThrottleForgetsWhatIsOlderThanItsWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottle(t, throttle.Config{Window: 10 * time.Second})
		overload(th, 100, 0, 5)
		if th.Probability() == 0 {
			t.Fatal("no throttling after 5 s of refusals")
		}
		time.Sleep(11 * time.Second)
		if r, a := th.Counts(); r != 0 || a != 0 || th.Probability() != 0 {
			t.Fatalf("after the window: %d requests, %d accepts, probability %v", r, a, th.Probability())
		}
	})
}

// The client's own refusals and the attempts that say nothing of the upstream
// are never resolved, so never counted: they cannot make the throttle refuse.
func TestAdmittedAttemptsLeftUnresolvedNeverRaiseTheRejectionProbability(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottle(t, throttle.Config{})
		for range 10_000 {
			if !th.Allow() {
				t.Fatal("an unresolved attempt made the throttle refuse")
			}
		}
		if r, _ := th.Counts(); r != 0 || th.Probability() != 0 {
			t.Fatalf("after unresolved attempts only: %d requests, probability %v", r, th.Probability())
		}
	})
}

func TestAZeroConfigIsNoThrottle(t *testing.T) {
	th, err := throttle.New(throttle.Config{})
	if err != nil || th != nil || !th.Allow() || th.Probability() != 0 {
		t.Fatalf("zero config: %v %v", th, err)
	}
	th.Accept()
	th.Fail()
}

func TestThrottleConfigurationErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		cfg   throttle.Config
		field string
	}{
		{throttle.Config{K: 2}, "Enabled"},
		{throttle.Config{Enabled: true, K: 0.5}, "K"},
		{throttle.Config{Enabled: true, Window: time.Millisecond}, "Window"},
		{throttle.Config{Enabled: true, MaxRejection: 1.5}, "MaxRejection"},
	} {
		_, err := throttle.New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.field)
		}
	}
}

// Attempts in flight count neither way: many slow answers in flight at
// once do not make a healthy upstream look as if it refused them.
func TestAttemptsInFlightAreNotCountedAsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottle(t, throttle.Config{})
		for i := range 1000 {
			if !th.Allow() {
				t.Fatalf("attempt %d refused with %d in flight and nothing refused by the upstream", i, i)
			}
		}
	})
}

// An attempt is counted when it is resolved, in the window of that moment:
// one that stayed in flight longer than the whole window still counts, as a
// request and an accept, and the refusals in between count at once.
func TestAnAttemptIsCountedWhenItIsResolved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottle(t, throttle.Config{Window: 10 * time.Second})
		if !th.Allow() {
			t.Fatal("first attempt refused")
		}
		if r, a := th.Counts(); r != 0 || a != 0 {
			t.Fatalf("in flight: %d requests, %d accepts, want none", r, a)
		}
		time.Sleep(15 * time.Second)
		th.Accept()
		if r, a := th.Counts(); r != 1 || a != 1 {
			t.Fatalf("resolved after 15 s: %d requests, %d accepts, want 1 and 1", r, a)
		}
		if !th.Allow() {
			t.Fatal("second attempt refused")
		}
		th.Fail()
		if r, a := th.Counts(); r != 2 || a != 1 {
			t.Fatalf("after a failure: %d requests, %d accepts, want 2 and 1", r, a)
		}
	})
}
