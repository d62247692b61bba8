package drill_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/drill"
	"github.com/outboundhq/outbound/retry"
)

// Run the scenarios against your own configuration, from a test of yours:
// does it survive an outage, a 503 storm, a reset, a GOAWAY?
func ExampleRun() {
	cfg := outbound.Config{
		MaxAttempts: 3,
		Backoff:     retry.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond},
		Admission: admission.Config{Circuit: circuit.Config{
			WindowSize: 20, MinimumCalls: 10, WaitInOpen: 500 * time.Millisecond, PermittedCallsInHalfOpen: 3}},
	}
	r, err := drill.Run(context.Background(), drill.Options{Config: &cfg,
		Only: []string{"recovery-under-backpressure", "503-storm", "reset-after-processing-h2c", "goaway-below-and-above"}})
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range r.Scenarios {
		fmt.Println(map[bool]string{true: "PASS", false: "FAIL"}[s.Passed], s.Name)
		for _, c := range s.Checks {
			if !c.Passed {
				fmt.Printf("  %s: want %s, got %s\n", c.What, c.Want, c.Got)
			}
		}
	}
	// Output:
	// PASS recovery-under-backpressure
	// PASS 503-storm
	// PASS reset-after-processing-h2c
	// PASS goaway-below-and-above
}

// A configuration that makes the client fail its users fails the drill,
// and the checks say where: a breaker that never counts a 503, and a
// client that never retries.
func ExampleRun_brokenConfiguration() {
	cfg := outbound.Config{
		MaxAttempts: 1,
		IsFailure:   func(*http.Response) bool { return false },
		Admission:   admission.Config{Circuit: circuit.Config{WindowSize: 10, MinimumCalls: 10}},
	}
	r, err := drill.Run(context.Background(), drill.Options{Config: &cfg, Only: []string{"503-storm", "refused-stream"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("passed:", r.Passed)
	for _, s := range r.Scenarios {
		for _, c := range s.Checks {
			if !c.Passed {
				fmt.Printf("%s: %s: got %s\n", s.Name, c.What, c.Got)
			}
		}
	}
	// Output:
	// passed: false
	// 503-storm: the breaker opens: got CLOSED
	// refused-stream: the POST is retried after the proof: got 0 after 1 attempt(s)
	// refused-stream: its commit status: got not committed
	// refused-stream: executions of the POST: got 0
}
