package drill_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/drill"
	"github.com/outboundhq/outbound/internal/mutate"
)

func TestEveryDrillScenarioPasses(t *testing.T) {
	if testing.Short() {
		t.Skip("the drill takes a few seconds")
	}
	r, err := drill.Run(context.Background(), drill.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range r.Scenarios {
		for _, c := range s.Checks {
			if !c.Passed {
				t.Errorf("%s: %s: want %s, got %s", s.Name, c.What, c.Want, c.Got)
			}
		}
		if len(s.Checks) == 0 {
			t.Errorf("%s: no verdict", s.Name)
		}
		checkRecord(t, s)
	}
	if !r.Passed || len(r.Scenarios) != len(drill.Scenarios()) {
		t.Fatalf("passed %v, %d scenarios", r.Passed, len(r.Scenarios))
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

// checkRecord checks what the report records of a scenario besides its
// verdicts: the configuration it ran with; each call's commit status on
// its last attempt and the attempts numbered in their call; and for the
// overload scenarios, a bounded series of the bulkhead and the calls.
func checkRecord(t *testing.T, s drill.ScenarioResult) {
	t.Helper()
	if s.Config["MaxAttempts"] == "" || s.Config["Breaker"] == "" || s.Config["Bulkhead"] == "" {
		t.Errorf("%s: configuration %v", s.Name, s.Config)
	}
	commits := map[string]int{}
	next := map[int]int{} // the next attempt number of each call
	for _, m := range s.Events {
		next[m.Call]++
		if m.Attempt != next[m.Call] {
			t.Errorf("%s: call %d's attempt %d is numbered %d", s.Name, m.Call, next[m.Call], m.Attempt)
		}
		if m.Commit != "" {
			commits[m.Commit]++
		}
	}
	if len(s.Events) > 0 && fmt.Sprint(commits) != fmt.Sprint(s.Commits) {
		t.Errorf("%s: commit statuses on the calls' last attempts %v, want the calls' %v", s.Name, commits, s.Commits)
	}
	if !strings.HasPrefix(s.Name, "overload") {
		return
	}
	if len(s.Series) < 20 || len(s.Series) > 240 {
		t.Fatalf("%s: %d samples, want a few dozen (3 s every 25 ms), at most 240", s.Name, len(s.Series))
	}
	var answered, refused, limited, inFlight int
	for _, p := range s.Series {
		answered, refused = answered+p.Answered, refused+p.Rejected
		if p.Limit > 0 {
			limited++
		}
		if p.InFlight > 0 {
			inFlight++
		}
		if s.Name == "overload-mixed-criticality" && p.Answered+p.Rejected+p.Failed > 0 && len(p.ByLevel) == 0 {
			t.Errorf("%s: a sample without its levels: %+v", s.Name, p)
		}
	}
	if answered+refused == 0 || answered+refused > s.Calls || limited < len(s.Series)/2 || inFlight == 0 || s.Series[len(s.Series)/2].P99Ms <= 0 {
		t.Errorf("%s: the series counts %d answered and %d refused of %d calls; %d samples have a limit, %d attempts in flight; p99 %v",
			s.Name, answered, refused, s.Calls, limited, inFlight, s.Series[len(s.Series)/2].P99Ms)
	}
}

// The drill must be able to fail: with the circuit permission kept when a
// local guard rejects, its first scenario fails.
func TestABrokenClientFailsTheDrill(t *testing.T) {
	if !mutate.Enabled {
		t.Skip("needs the deliberate faults: go test -tags mutate (scripts/test does)")
	}
	mutate.KeepCircuitPermitOnLocalRejection.Store(true)
	defer mutate.KeepCircuitPermitOnLocalRejection.Store(false)
	r, err := drill.Run(context.Background(), drill.Options{Only: []string{"recovery-under-backpressure"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Passed {
		t.Fatal("the drill passed a client that leaks circuit permissions")
	}
}

func TestTheFleetScenarioNeedsAFleetAndSaysSo(t *testing.T) {
	_, err := drill.Run(context.Background(), drill.Options{Only: []string{"fleet-shared-limit"}})
	if err == nil || !strings.Contains(err.Error(), "Options.Fleet") {
		t.Fatalf("err = %v, want one naming Options.Fleet", err)
	}
}

// sharedGuard is a fleet kept in this process: every member takes from one
// limiter, and the takes are counted.
type sharedGuard struct {
	l     *ratelimit.Limiter
	takes *atomic.Int64
}

func (g sharedGuard) Take(context.Context) error {
	g.takes.Add(1)
	if g.l.TryAcquire() {
		return nil
	}
	return ratelimit.ErrLimited
}
func (g sharedGuard) Refund() { g.l.Refund() }

// Regression: with Options.Config, the fleet scenario built every member
// from the user's configuration a second time, without the fleet's rate
// guard: the members had no shared limit at all.
func TestTheFleetScenarioUsesTheFleetsGuardUnderTheUsersConfiguration(t *testing.T) {
	l, _ := ratelimit.New(ratelimit.Config{PerSecond: 100, Burst: 10})
	var takes atomic.Int64
	fleet := &drill.Fleet{PerSecond: 100, Burst: 10, New: func() (func(string) admission.RateGuard, func()) {
		return func(string) admission.RateGuard { return sharedGuard{l, &takes} }, func() {}
	}}
	cfg := outbound.Config{MaxAttempts: 1, Admission: admission.Config{Rate: ratelimit.Config{PerSecond: 1e6}}}
	r, err := drill.Run(context.Background(), drill.Options{Only: []string{"fleet-shared-limit"}, Fleet: fleet, Config: &cfg})
	if err != nil {
		t.Fatal(err)
	}
	if takes.Load() == 0 || !r.Passed {
		t.Fatalf("the fleet's guard was asked %d times; passed %v: %+v", takes.Load(), r.Passed, r.Scenarios[0].Checks)
	}
}
