package outboundredis_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/drill"
	"github.com/outboundhq/outbound/internal/redistest"
	outboundredis "github.com/outboundhq/outbound/redis"
	"github.com/redis/rueidis"
)

func TestTheDrillsFleetScenarioPassesWithTheLimitOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	fleet, err := drillFleet(client(t, srv.Addr()), 100, 10)
	if err != nil {
		t.Fatal(err)
	}
	r, err := drill.Run(context.Background(), drill.Options{Only: []string{"fleet-shared-limit"}, Fleet: fleet})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Passed {
		t.Fatalf("the fleet scenario failed: %+v", r.Scenarios[0].Checks)
	}
}

// localGuard is what each process has without Redis: a limit of its own.
type localGuard struct{ l *ratelimit.Limiter }

func (g localGuard) Take(context.Context) error {
	if g.l.TryAcquire() {
		return nil
	}
	return ratelimit.ErrLimited
}
func (g localGuard) Refund() { g.l.Refund() }

// The scenario can fail: members that each keep the limit to themselves let
// four times the limit through.
func TestTheDrillsFleetScenarioFailsWhenEachMemberKeepsItsOwnLimit(t *testing.T) {
	fleet := &drill.Fleet{PerSecond: 100, Burst: 10, New: func() (func(string) admission.RateGuard, func()) {
		l, _ := ratelimit.New(ratelimit.Config{PerSecond: 100, Burst: 10})
		return func(string) admission.RateGuard { return localGuard{l} }, func() {}
	}}
	r, err := drill.Run(context.Background(), drill.Options{Only: []string{"fleet-shared-limit"}, Fleet: fleet})
	if err != nil {
		t.Fatal(err)
	}
	if r.Passed {
		t.Fatalf("four limits of their own passed as one shared limit: %+v", r.Scenarios[0].Checks)
	}
}

// drillFleet returns the fleet of the drill's fleet scenario
// (drill.Options.Fleet): each member a Limiter of its own on client, as a
// process of a fleet would have, all sharing one limit of perSecond and
// burst under keys of their own for the run.
func drillFleet(client rueidis.Client, perSecond float64, burst int) (*drill.Fleet, error) {
	cfg := outboundredis.Config{Client: client, PerSecond: perSecond, Burst: burst,
		Prefix:   "outbound:drill:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":",
		Degraded: outboundredis.Degraded{Reject: true}}
	if _, err := outboundredis.New(cfg); err != nil {
		return nil, err
	}
	return &drill.Fleet{PerSecond: perSecond, Burst: burst,
		New: func() (func(string) admission.RateGuard, func()) {
			l, _ := outboundredis.New(cfg) // validated above
			return l.For, func() { l.Close() }
		}}, nil
}
