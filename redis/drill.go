package outboundredis

import (
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/drill"
)

// DrillFleet returns the fleet of the drill's fleet scenario
// (drill.Options.Fleet): each member a Limiter of its own on client, as a
// process of a fleet would have, all sharing one limit of perSecond and
// burst under keys of their own for the run.
func DrillFleet(client rueidis.Client, perSecond float64, burst int) (*drill.Fleet, error) {
	cfg := Config{Client: client, PerSecond: perSecond, Burst: burst,
		Prefix:   "outbound:drill:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":",
		Degraded: Degraded{Reject: true}}
	if _, err := New(cfg); err != nil {
		return nil, err
	}
	return &drill.Fleet{PerSecond: perSecond, Burst: burst,
		New: func() (func(string) admission.RateGuard, func()) {
			l, _ := New(cfg) // validated above
			return l.For, func() { l.Close() }
		}}, nil
}
