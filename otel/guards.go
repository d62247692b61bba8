package outboundotel

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission/circuit"
)

// states are the breaker states outbound.breaker.state reports.
var states = [...]circuit.State{circuit.Closed, circuit.Open, circuit.HalfOpen, circuit.Disabled, circuit.ForcedOpen, circuit.MetricsOnly}

// ObserveGuards reports the state of the guards of every upstream t keeps,
// read from the guards themselves at each collection. Of the circuit
// breakers (Transport.Breakers), the figures Resilience4j's breakers report:
//
//   - outbound.breaker.state (gauge, "{state}"): per outbound.upstream and
//     outbound.state ("CLOSED", "OPEN", "HALF_OPEN", "DISABLED",
//     "FORCED_OPEN", "METRICS_ONLY"), 1 for the breaker's current state and
//     0 for the others.
//   - outbound.breaker.generation (gauge, "{transition}"): the transitions
//     the breaker has made.
//   - outbound.breaker.failure_rate and outbound.breaker.slow_call_rate
//     (gauges, "%"): the percentages of failed and of slow calls in the
//     breaker's window, -1 while it holds fewer than the minimum number of
//     calls.
//   - outbound.breaker.buffered_calls, outbound.breaker.failed_calls and
//     outbound.breaker.slow_calls (gauges, "{call}"): the calls in the
//     window, the failed ones and the slow ones.
//   - outbound.breaker.not_permitted_calls (gauge, "{call}"): the calls
//     refused since the breaker entered its current state.
//
// And, read the same way (Transport.Upstream), the other guards' state:
//
//   - outbound.concurrency.limit and outbound.concurrency.in_flight
//     (gauges, "{attempt}"): the bulkhead's limit (the adaptive limit as it
//     is now, or MaxConcurrent) and the attempts holding a slot; for
//     upstreams with a bulkhead.
//   - outbound.throttle.rejection_probability (gauge, "1"): the probability
//     with which the client-side throttle refuses the next attempt; for
//     upstreams with a throttle.
//
// Each is reported per outbound.upstream. An upstream appears with its first
// call and leaves when t forgets it. Call it once per Transport, with the
// same MeterProvider as Hooks; unregister the returned Registration when the
// Transport is closed.
func ObserveGuards(t *outbound.Transport, opts ...Option) (metric.Registration, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	m := c.mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
	var errs error
	intGauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = errors.Join(errs, err)
		return g
	}
	rateGauge := func(name, desc string) metric.Float64ObservableGauge {
		g, err := m.Float64ObservableGauge(name, metric.WithUnit("%"), metric.WithDescription(desc))
		errs = errors.Join(errs, err)
		return g
	}
	o := &breakerObserver{t: t, attrs: map[string]*breakerAttrs{},
		state:        intGauge("outbound.breaker.state", "{state}", "Circuit breaker state: 1 for the current state, 0 for the others."),
		generation:   intGauge("outbound.breaker.generation", "{transition}", "Circuit breaker transitions so far."),
		failureRate:  rateGauge("outbound.breaker.failure_rate", "Failed calls in the breaker's window, or -1 below its minimum number of calls."),
		slowRate:     rateGauge("outbound.breaker.slow_call_rate", "Slow calls in the breaker's window, or -1 below its minimum number of calls."),
		buffered:     intGauge("outbound.breaker.buffered_calls", "{call}", "Calls in the breaker's window."),
		failed:       intGauge("outbound.breaker.failed_calls", "{call}", "Failed calls in the breaker's window."),
		slow:         intGauge("outbound.breaker.slow_calls", "{call}", "Slow calls in the breaker's window."),
		notPermitted: intGauge("outbound.breaker.not_permitted_calls", "{call}", "Calls refused since the breaker entered its state."),
		limit:        intGauge("outbound.concurrency.limit", "{attempt}", "The bulkhead's limit: the adaptive limit as it is now, or its MaxConcurrent."),
		inFlight:     intGauge("outbound.concurrency.in_flight", "{attempt}", "Attempts holding a bulkhead slot."),
	}
	var err error
	o.throttle, err = m.Float64ObservableGauge("outbound.throttle.rejection_probability", metric.WithUnit("1"),
		metric.WithDescription("Probability with which the client-side throttle refuses the next attempt."))
	errs = errors.Join(errs, err)
	if errs != nil {
		return nil, errs
	}
	return m.RegisterCallback(o.observe, o.state, o.generation, o.failureRate, o.slowRate, o.buffered, o.failed, o.slow, o.notPermitted,
		o.limit, o.inFlight, o.throttle)
}

type breakerObserver struct {
	t                                    *outbound.Transport
	state, generation                    metric.Int64ObservableGauge
	failureRate, slowRate                metric.Float64ObservableGauge
	buffered, failed, slow, notPermitted metric.Int64ObservableGauge
	limit, inFlight                      metric.Int64ObservableGauge
	throttle                             metric.Float64ObservableGauge

	mu    sync.Mutex
	attrs map[string]*breakerAttrs // by upstream: those of the last collection
}

// breakerAttrs are the attribute sets of one upstream's breaker series.
type breakerAttrs struct {
	upstream []metric.ObserveOption
	states   [len(states)][]metric.ObserveOption
}

func newBreakerAttrs(upstream string) *breakerAttrs {
	a := &breakerAttrs{upstream: []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(UpstreamKey.String(upstream)))}}
	for i, s := range states {
		a.states[i] = []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(UpstreamKey.String(upstream), StateKey.String(s.String())))}
	}
	return a
}

func (o *breakerObserver) observe(_ context.Context, obs metric.Observer) error {
	snap := o.t.Breakers()
	o.mu.Lock()
	defer o.mu.Unlock()
	attrs := make(map[string]*breakerAttrs, len(snap)) // only the upstreams kept: the cache stays bounded
	for up, b := range snap {
		a := o.attrs[up]
		if a == nil {
			a = newBreakerAttrs(up)
		}
		attrs[up] = a
		for i, s := range states {
			var v int64
			if s == b.State {
				v = 1
			}
			obs.ObserveInt64(o.state, v, a.states[i]...)
		}
		obs.ObserveInt64(o.generation, int64(b.Generation), a.upstream...)
		obs.ObserveFloat64(o.failureRate, b.FailureRate, a.upstream...)
		obs.ObserveFloat64(o.slowRate, b.SlowCallRate, a.upstream...)
		obs.ObserveInt64(o.buffered, int64(b.Calls), a.upstream...)
		obs.ObserveInt64(o.failed, int64(b.Failed), a.upstream...)
		obs.ObserveInt64(o.slow, int64(b.Slow), a.upstream...)
		obs.ObserveInt64(o.notPermitted, b.NotPermitted, a.upstream...)
		if u, ok := o.t.Upstream(up); ok {
			if u.Limit > 0 {
				obs.ObserveInt64(o.limit, int64(u.Limit), a.upstream...)
				obs.ObserveInt64(o.inFlight, int64(u.InFlight), a.upstream...)
			}
			if u.ThrottleProbability >= 0 {
				obs.ObserveFloat64(o.throttle, u.ThrottleProbability, a.upstream...)
			}
		}
	}
	o.attrs = attrs
	return nil
}
