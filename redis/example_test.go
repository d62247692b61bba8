package outboundredis_test

import (
	"log"
	"net/http"

	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	outboundredis "github.com/outboundhq/outbound/redis"
)

// A Transport whose every upstream is limited to 100 calls per second
// across the fleet, with leased tokens, half the fleet's rate locally while
// Redis cannot be reached, and breakers that open together. (Compiled, not
// run: it needs a Redis at localhost:6379; the tests of this package start
// their own.)
func Example() {
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"localhost:6379"}, DisableCache: true})
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	limit, err := outboundredis.New(outboundredis.Config{
		Client:    rdb,
		PerSecond: 100,
		Lease:     outboundredis.Lease{Max: 16},
		Degraded:  outboundredis.Degraded{Share: 0.5},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer limit.Close()
	signal, err := outboundredis.NewSignal(outboundredis.SignalConfig{Client: rdb})
	if err != nil {
		log.Fatal(err)
	}
	defer signal.Close()
	t, err := outbound.New(outbound.Config{
		Admission: admission.Config{RateGuard: limit.For, OnEvent: signal.Observe},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	if err := signal.Attach(t); err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: t}
	_ = client // every call through it counts against the fleet's limit
}
