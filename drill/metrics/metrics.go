// Package metrics turns the library's hooks into counters and gauges served
// in the Prometheus text exposition format, with no dependency: what
// `outbound drill --metrics` serves. The names and labels are those the
// OpenTelemetry module's instruments get from the OpenTelemetry Prometheus
// exporter (outbound_calls_total{outbound_commit_status=…,
// outbound_upstream=…}), so that a dashboard built on one reads the other;
// applications should use that module.
package metrics

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// family describes one metric. Labels are in alphabetical order, as the
// OpenTelemetry exporter writes them.
type family struct {
	name, help, kind string
	labels           []string
}

const (
	upstream = "outbound_upstream"
)

var (
	attempts   = family{"outbound_attempts_total", "Attempts, by category.", "counter", []string{"outbound_category", upstream}}
	rejections = family{"outbound_rejections_total", "Attempts refused by a local guard.", "counter", []string{"outbound_guard", upstream}}
	retries    = family{"outbound_retries_total", "Retries scheduled.", "counter", []string{upstream}}
	declined   = family{"outbound_retry_declined_total", "Retries not made, by reason.", "counter", []string{"outbound_reason", upstream}}
	budget     = family{"outbound_retry_budget_exhausted_total", "Retries declined and hedges withheld by the retry budget.", "counter", []string{upstream}}
	calls      = family{"outbound_calls_total", "Finished calls, by commit status.", "counter", []string{"outbound_commit_status", upstream}}
	ejections  = family{"outbound_endpoint_ejections_total", "Endpoints of an upstream ejected (Config.Endpoints), by endpoint.", "counter", []string{"outbound_endpoint", upstream}}
	duration   = family{"http_client_request_duration_seconds", "Duration of HTTP client requests.", "histogram",
		[]string{"error_type", "http_request_method", "http_response_status_code", "server_address", "server_port", "url_scheme"}}
	breakerState = family{"outbound_breaker_state", "Circuit breaker state: 1 for the current state, 0 for the others.", "gauge", []string{"outbound_state", upstream}}
)

var families = []family{attempts, rejections, retries, declined, budget, calls, ejections}

// buckets are the bucket boundaries the HTTP semantic conventions advise
// for http.client.request.duration, as the OpenTelemetry module uses.
var buckets = []float64{0, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// breakerFamilies are the figures of each breaker, read from it, with how
// to read each from its snapshot (the state is breakerState).
var breakerFamilies = []struct {
	family
	value func(circuit.Metrics) float64
}{
	{family{"outbound_breaker_buffered_calls", "Calls in the breaker's window.", "gauge", []string{upstream}},
		func(m circuit.Metrics) float64 { return float64(m.Calls) }},
	{family{"outbound_breaker_failed_calls", "Failed calls in the breaker's window.", "gauge", []string{upstream}},
		func(m circuit.Metrics) float64 { return float64(m.Failed) }},
	{family{"outbound_breaker_failure_rate_percent", "Failed calls in the breaker's window, or -1 below its minimum number of calls.", "gauge", []string{upstream}},
		func(m circuit.Metrics) float64 { return m.FailureRate }},
	{family{"outbound_breaker_generation", "Circuit breaker transitions so far.", "gauge", []string{upstream}},
		func(m circuit.Metrics) float64 { return float64(m.Generation) }},
	{family{"outbound_breaker_not_permitted_calls", "Calls refused since the breaker entered its state.", "gauge", []string{upstream}},
		func(m circuit.Metrics) float64 { return float64(m.NotPermitted) }},
	{family{"outbound_breaker_slow_call_rate_percent", "Slow calls in the breaker's window, or -1 below its minimum number of calls.", "gauge", []string{upstream}},
		func(m circuit.Metrics) float64 { return m.SlowCallRate }},
	{family{"outbound_breaker_slow_calls", "Slow calls in the breaker's window.", "gauge", []string{upstream}},
		func(m circuit.Metrics) float64 { return float64(m.Slow) }},
}

// histogram is one series of the duration histogram.
type histogram struct {
	counts []uint64 // per bucket, not cumulative
	sum    float64
	n      uint64
}

// Registry holds the figures. It is safe for concurrent use.
type Registry struct {
	mu         sync.Mutex
	values     map[string]map[string]float64 // family name -> label string -> value
	durations  map[string]*histogram         // label string -> series
	transports []*outbound.Transport         // whose breakers are reported
}

// New returns an empty Registry.
func New() *Registry {
	return &Registry{values: map[string]map[string]float64{}, durations: map[string]*histogram{}}
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

func (r *Registry) observe(seconds float64, labels ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	key := labelString(duration.labels, labels)
	h := r.durations[key]
	if h == nil {
		h = &histogram{counts: make([]uint64, len(buckets)+1)}
		r.durations[key] = h
	}
	i, _ := slices.BinarySearch(buckets, seconds)
	h.counts[i]++
	h.sum += seconds
	h.n++
}

// knownMethods are the methods the conventions name; others are "_OTHER".
var knownMethods = map[string]bool{http.MethodGet: true, http.MethodPost: true, http.MethodPut: true, http.MethodDelete: true,
	http.MethodHead: true, http.MethodPatch: true, http.MethodOptions: true, http.MethodConnect: true, http.MethodTrace: true, "QUERY": true}

// Hooks returns the hooks that feed the registry.
func (r *Registry) Hooks() outbound.Hooks {
	return outbound.Hooks{
		AttemptDone: func(_ context.Context, a outbound.AttemptInfo, res outcome.Attempt) {
			r.add(attempts, 1, res.Category.String(), a.Upstream)
			if res.Category == classify.LocalRejection {
				if res.Guard != 0 {
					r.add(rejections, 1, res.Guard.String(), a.Upstream)
				}
				return // not a request: no duration
			}
			method := a.Method
			if !knownMethods[method] {
				method = "_OTHER"
			}
			errType, status, port := "", "", ""
			switch {
			case res.Category != classify.Answered:
				errType = res.Category.String()
			case res.Status >= 400:
				errType = strconv.Itoa(res.Status)
			}
			if res.Status != 0 {
				status = strconv.Itoa(res.Status)
			}
			if a.Port != 0 {
				port = strconv.Itoa(a.Port)
			}
			r.observe(res.Duration.Seconds(), errType, method, status, a.Host, port, a.Scheme)
		},
		RetryDecided: func(_ context.Context, a outbound.AttemptInfo, d retry.Decision) {
			if d.Retry {
				r.add(retries, 1, a.Upstream)
			} else {
				r.add(declined, 1, d.Reason.String(), a.Upstream)
			}
		},
		BudgetExhausted: func(_ context.Context, upstream string) { r.add(budget, 1, upstream) },
		EndpointEjected: func(upstream, endpoint string, d time.Duration) {
			if d > 0 {
				r.add(ejections, 1, endpoint, upstream)
			}
		},
		CallDone: func(_ context.Context, o *outcome.Outcome) {
			r.add(calls, 1, o.Commit.String(), o.Upstream)
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
	head := func(f family) { fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.name, f.help, f.name, f.kind) }
	for _, f := range families {
		head(f)
		m := r.values[f.name]
		for _, ls := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(&b, "%s%s %g\n", f.name, ls, m[ls])
		}
	}
	head(duration)
	for _, ls := range slices.Sorted(maps.Keys(r.durations)) {
		h := r.durations[ls]
		inner := strings.TrimSuffix(strings.TrimPrefix(ls, "{"), "}")
		var cum uint64
		for i, le := range buckets {
			cum += h.counts[i]
			fmt.Fprintf(&b, "%s_bucket{%s,le=\"%g\"} %d\n", duration.name, inner, le, cum)
		}
		fmt.Fprintf(&b, "%s_bucket{%s,le=\"+Inf\"} %d\n", duration.name, inner, h.n)
		fmt.Fprintf(&b, "%s_sum%s %g\n%s_count%s %d\n", duration.name, ls, h.sum, duration.name, ls, h.n)
	}
	r.breakers(&b, head)
	r.guards(&b, head)
	return b.String()
}

// guardFamilies are the figures of each upstream's bulkhead and throttle,
// read from Transport.Upstream; a figure that does not apply (no bulkhead,
// no throttle) is left out.
var guardFamilies = []struct {
	family
	value func(outbound.UpstreamState) (float64, bool)
}{
	{family{"outbound_concurrency_in_flight", "Attempts holding a bulkhead slot.", "gauge", []string{upstream}},
		func(s outbound.UpstreamState) (float64, bool) { return float64(s.InFlight), s.Limit > 0 }},
	{family{"outbound_concurrency_limit", "The bulkhead's limit: the adaptive limit as it is now, or its MaxConcurrent.", "gauge", []string{upstream}},
		func(s outbound.UpstreamState) (float64, bool) { return float64(s.Limit), s.Limit > 0 }},
	{family{"outbound_throttle_rejection_probability", "Probability with which the client-side throttle refuses the next attempt.", "gauge", []string{upstream}},
		func(s outbound.UpstreamState) (float64, bool) {
			return s.ThrottleProbability, s.ThrottleProbability >= 0
		}},
}

// guards renders the figures of the observed transports' bulkheads and
// throttles.
func (r *Registry) guards(b *strings.Builder, head func(family)) {
	snap := map[string]outbound.UpstreamState{}
	for _, t := range r.transports {
		for _, up := range t.Upstreams() {
			if s, ok := t.Upstream(up); ok {
				snap[up] = s
			}
		}
	}
	ups := slices.Sorted(maps.Keys(snap))
	for _, f := range guardFamilies {
		headed := false
		for _, up := range ups {
			v, ok := f.value(snap[up])
			if !ok {
				continue
			}
			if !headed {
				head(f.family)
				headed = true
			}
			fmt.Fprintf(b, "%s%s %g\n", f.name, labelString(f.labels, []string{up}), v)
		}
	}
}

// breakers renders the figures of the observed transports' breakers.
func (r *Registry) breakers(b *strings.Builder, head func(family)) {
	snap := map[string]circuit.Metrics{}
	for _, t := range r.transports {
		maps.Copy(snap, t.Breakers())
	}
	ups := slices.Sorted(maps.Keys(snap))
	head(breakerState)
	for _, up := range ups {
		for st := circuit.Closed; st <= circuit.MetricsOnly; st++ {
			v := 0
			if snap[up].State == st {
				v = 1
			}
			fmt.Fprintf(b, "%s%s %d\n", breakerState.name, labelString(breakerState.labels, []string{st.String(), up}), v)
		}
	}
	for _, f := range breakerFamilies {
		head(f.family)
		for _, up := range ups {
			fmt.Fprintf(b, "%s%s %g\n", f.name, labelString(f.labels, []string{up}), f.value(snap[up]))
		}
	}
}

// labelString renders {name="value",…} with the text format's escaping,
// leaving out labels whose value is empty, as the OpenTelemetry exporter
// leaves out attributes that are not set.
func labelString(names, values []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		v := ""
		if i < len(values) {
			v = values[i]
		}
		if v == "" {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		v = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(v)
		fmt.Fprintf(&b, `%s="%s"`, n, v)
	}
	b.WriteByte('}')
	return b.String()
}
