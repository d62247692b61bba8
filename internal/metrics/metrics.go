// Package metrics turns the library's hooks into counters and gauges served
// in the Prometheus text exposition format, with no dependency: what
// `outbound drill --metrics` serves. Applications should prefer the
// OpenTelemetry module, whose Prometheus exporter serves the same kind of
// figures under the HTTP semantic conventions.
package metrics

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// family describes one metric.
type family struct {
	name, help, kind string
	labels           []string
}

var (
	attempts       = family{"outbound_attempts_total", "Physical attempts, by category.", "counter", []string{"upstream", "category"}}
	attemptSeconds = family{"outbound_attempt_duration_seconds", "Time to the response headers or the failure, by category.", "summary", []string{"upstream", "category"}}
	rejections     = family{"outbound_rejections_total", "Attempts refused by a local guard, by guard.", "counter", []string{"upstream", "guard"}}
	retries        = family{"outbound_retries_total", "Retries scheduled.", "counter", []string{"upstream"}}
	declined       = family{"outbound_retries_declined_total", "Retries declined, by reason.", "counter", []string{"upstream", "reason"}}
	budget         = family{"outbound_retry_budget_exhausted_total", "Retries declined by the retry budget.", "counter", []string{"upstream"}}
	calls          = family{"outbound_calls_total", "Finished calls, by commit status.", "counter", []string{"upstream", "commit"}}
	breakerState   = family{"outbound_breaker_state", "1 for the breaker's current state, 0 for the others.", "gauge", []string{"upstream", "state"}}
)

var families = []family{attempts, attemptSeconds, rejections, retries, declined, budget, calls}

// breakerFamilies are the figures of each breaker, read from it, with how
// to read each from its snapshot (the state is breakerState).
var breakerFamilies = []struct {
	family
	value func(circuit.Metrics) float64
}{
	{family{"outbound_breaker_generation", "Transitions the breaker has made.", "gauge", []string{"upstream"}},
		func(m circuit.Metrics) float64 { return float64(m.Generation) }},
	{family{"outbound_breaker_failure_rate_percent", "Failed calls in the breaker's window, or -1 below its minimum number of calls.", "gauge", []string{"upstream"}},
		func(m circuit.Metrics) float64 { return m.FailureRate }},
	{family{"outbound_breaker_slow_call_rate_percent", "Slow calls in the breaker's window, or -1 below its minimum number of calls.", "gauge", []string{"upstream"}},
		func(m circuit.Metrics) float64 { return m.SlowCallRate }},
	{family{"outbound_breaker_buffered_calls", "Calls in the breaker's window.", "gauge", []string{"upstream"}},
		func(m circuit.Metrics) float64 { return float64(m.Calls) }},
	{family{"outbound_breaker_failed_calls", "Failed calls in the breaker's window.", "gauge", []string{"upstream"}},
		func(m circuit.Metrics) float64 { return float64(m.Failed) }},
	{family{"outbound_breaker_slow_calls", "Slow calls in the breaker's window.", "gauge", []string{"upstream"}},
		func(m circuit.Metrics) float64 { return float64(m.Slow) }},
	{family{"outbound_breaker_not_permitted_calls", "Calls refused since the breaker entered its state.", "gauge", []string{"upstream"}},
		func(m circuit.Metrics) float64 { return float64(m.NotPermitted) }},
}

// The two series of the attempt-duration summary, named once rather than
// on every attempt.
var (
	attemptSecondsSum   = family{name: attemptSeconds.name + "_sum", labels: attemptSeconds.labels}
	attemptSecondsCount = family{name: attemptSeconds.name + "_count", labels: attemptSeconds.labels}
)

// Registry holds the figures. It is safe for concurrent use.
type Registry struct {
	mu         sync.Mutex
	values     map[string]map[string]float64 // family name -> label string -> value
	transports []*outbound.Transport         // whose breakers are reported
}

// New returns an empty Registry.
func New() *Registry {
	return &Registry{values: map[string]map[string]float64{}}
}

// Observe adds t's breakers to the figures: each is read when the figures
// are rendered, for as long as t keeps its upstream.
func (r *Registry) Observe(t *outbound.Transport) {
	r.mu.Lock()
	r.transports = append(r.transports, t)
	r.mu.Unlock()
}

func (r *Registry) add(f family, v float64, labels ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.values[f.name]
	if m == nil {
		m = map[string]float64{}
		r.values[f.name] = m
	}
	m[labelString(f.labels, labels)] += v
}

// Hooks returns the hooks that feed the registry.
func (r *Registry) Hooks() outbound.Hooks {
	return outbound.Hooks{
		AttemptDone: func(_ context.Context, a outbound.AttemptInfo, res outcome.Attempt) {
			r.add(attempts, 1, a.Upstream, res.Category.String())
			r.add(attemptSecondsSum, res.Duration.Seconds(), a.Upstream, res.Category.String())
			r.add(attemptSecondsCount, 1, a.Upstream, res.Category.String())
			if res.Category == classify.LocalRejection && res.Guard != 0 {
				r.add(rejections, 1, a.Upstream, res.Guard.String())
			}
		},
		RetryDecided: func(_ context.Context, a outbound.AttemptInfo, d retry.Decision) {
			if d.Retry {
				r.add(retries, 1, a.Upstream)
			} else {
				r.add(declined, 1, a.Upstream, d.Reason.String())
			}
		},
		BudgetExhausted: func(_ context.Context, upstream string) { r.add(budget, 1, upstream) },
		CallDone: func(_ context.Context, o *outcome.Outcome) {
			r.add(calls, 1, o.Upstream, o.Commit.String())
		},
	}
}

// ServeHTTP writes every figure in the Prometheus text format (0.0.4).
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(r.Text()))
}

// Text renders the figures.
func (r *Registry) Text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, f := range families {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.kind)
		names := []string{f.name}
		if f.kind == "summary" {
			names = []string{f.name + "_sum", f.name + "_count"}
		}
		for _, n := range names {
			m := r.values[n]
			for _, ls := range slices.Sorted(maps.Keys(m)) {
				fmt.Fprintf(&b, "%s%s %g\n", n, ls, m[ls])
			}
		}
	}
	r.breakers(&b)
	return b.String()
}

// breakers renders the figures of the observed transports' breakers.
func (r *Registry) breakers(b *strings.Builder) {
	snap := map[string]circuit.Metrics{}
	for _, t := range r.transports {
		maps.Copy(snap, t.Breakers())
	}
	ups := slices.Sorted(maps.Keys(snap))
	f := breakerState
	fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.kind)
	for _, up := range ups {
		for st := circuit.Closed; st <= circuit.MetricsOnly; st++ {
			v := 0
			if snap[up].State == st {
				v = 1
			}
			fmt.Fprintf(b, "%s%s %d\n", f.name, labelString(f.labels, []string{up, st.String()}), v)
		}
	}
	for _, f := range breakerFamilies {
		fmt.Fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.kind)
		for _, up := range ups {
			fmt.Fprintf(b, "%s%s %g\n", f.name, labelString(f.labels, []string{up}), f.value(snap[up]))
		}
	}
}

// labelString renders {name="value",…} with the text format's escaping.
func labelString(names, values []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		v := ""
		if i < len(values) {
			v = values[i]
		}
		v = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
		fmt.Fprintf(&b, `%s="%s"`, n, v)
	}
	b.WriteByte('}')
	return b.String()
}
