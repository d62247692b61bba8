package drill_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

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
	}
	if !r.Passed || len(r.Scenarios) != len(drill.Scenarios()) {
		t.Fatalf("passed %v, %d scenarios", r.Passed, len(r.Scenarios))
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

// The drill must be able to fail: with the circuit permission kept when a
// local guard rejects, its first scenario fails.
func TestABrokenClientFailsTheDrill(t *testing.T) {
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
