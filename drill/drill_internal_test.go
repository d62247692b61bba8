package drill

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/criticality"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// A call without hedges is a sequence: each attempt starts after the one
// before and its wait, numbered in order, and the last carries the call's
// commit status.
func TestMarksOfASequenceOfAttempts(t *testing.T) {
	out := &outcome.Outcome{Commit: outcome.Committed, Attempts: []outcome.Attempt{
		{Category: classify.Answered, Status: 503, Duration: 10 * time.Millisecond, Decision: retry.Retryable, Wait: 5 * time.Millisecond},
		{Category: classify.LocalRejection, Guard: classify.GuardRate, Duration: time.Millisecond, Decision: retry.Retryable, Wait: 4 * time.Millisecond},
		{Category: classify.Answered, Status: 200, Duration: 20 * time.Millisecond},
	}}
	got := marksOf(7, 100*time.Millisecond, out)
	want := []Mark{
		{AtMs: 100, Millis: 10, Call: 7, Category: "Answered", Status: 503, Failure: true, Attempt: 1},
		{AtMs: 115, Millis: 1, Call: 7, Category: "LocalRejection", Guard: classify.GuardRate.String(), Attempt: 2},
		{AtMs: 120, Millis: 20, Call: 7, Category: "Answered", Status: 200, Attempt: 3, Commit: "committed"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("marks\n got %+v\nwant %+v", got, want)
	}
	if marksOf(1, 0, &outcome.Outcome{Commit: outcome.NotCommitted}) != nil {
		t.Error("marks for a call without attempts")
	}
}

// A hedged round's attempts are in the outcome as they landed, the one
// that decided the round last: the round starts with its first attempt,
// whatever its place, the hedges are numbered after it and end with it,
// and the next round starts after the longest and the decided one's wait.
func TestMarksOfAHedgedCall(t *testing.T) {
	out := &outcome.Outcome{Commit: outcome.Unknown, Attempts: []outcome.Attempt{
		// Round 1: the hedge landed first, failing; the first attempt, a 503, decided a retry.
		{Category: classify.Ambiguous, Duration: 30 * time.Millisecond, Hedge: true},
		{Category: classify.Answered, Status: 503, Duration: 50 * time.Millisecond, Decision: retry.Retryable, Wait: 10 * time.Millisecond},
		// Round 2: the first attempt lost to a hedge's answer.
		{Category: classify.Ambiguous, Duration: 40 * time.Millisecond, Lost: true},
		{Category: classify.Answered, Status: 200, Duration: 25 * time.Millisecond, Hedge: true},
	}}
	got := marksOf(3, 0, out)
	type brief struct {
		at, ms      float64
		attempt     int
		hedge, lost bool
		commit      string
	}
	var b []brief
	for _, m := range got {
		b = append(b, brief{m.AtMs, m.Millis, m.Attempt, m.Hedge, m.Lost, m.Commit})
	}
	want := []brief{
		{0, 50, 1, false, false, ""},
		{20, 30, 2, true, false, ""}, // ends with the first: 50 − 30
		{60, 40, 3, false, true, ""}, // after the round's 50 and its wait of 10
		{75, 25, 4, true, false, "unknown"},
	}
	if fmt.Sprint(b) != fmt.Sprint(want) {
		t.Fatalf("marks\n got %v\nwant %v", b, want)
	}
	// A hedge slower than its round's first ends later: it starts with it.
	out.Attempts[0].Duration = 80 * time.Millisecond
	if got := marksOf(3, 0, out); got[1].AtMs != 0 || got[2].AtMs != 90 {
		t.Errorf("a slow hedge at %v, the next round at %v; want 0 and 90", got[1].AtMs, got[2].AtMs)
	}
}

// The series keeps every call and the whole time it ran, in at most
// maxSamples samples, however long it runs: when full, neighbours merge in
// pairs and the interval doubles.
func TestTheSeriesStaysBounded(t *testing.T) {
	s := &series{every: sampleEvery}
	rejected := result{err: fmt.Errorf("drill: %w", admission.ErrRejected), out: &outcome.Outcome{Commit: outcome.NotCommitted}}
	const ticks = 10_000
	var doubled int
	for i := 1; i <= ticks; i++ {
		for range 3 {
			s.add(criticality.Critical, result{elapsed: time.Duration(i) * time.Millisecond})
		}
		s.add(criticality.Sheddable, rejected)
		s.add(criticality.Default, result{err: errors.New("reset"), out: &outcome.Outcome{Commit: outcome.Unknown}})
		if every := s.tick(float64(i)*25, 64-i%50, i%9); every != 0 {
			doubled++
			if every != sampleEvery<<doubled {
				t.Fatalf("interval %v after %d doublings", every, doubled)
			}
		}
	}
	got := s.result()
	if len(got) > maxSamples || len(got) < maxSamples/2 {
		t.Fatalf("%d samples after %d ticks, want %d..%d", len(got), ticks, maxSamples/2, maxSamples)
	}
	var answered, refused, failed, critical, shed int
	var span float64
	last := 0.0
	for _, p := range got {
		if p.AtMs <= last {
			t.Fatalf("sample at %v after %v", p.AtMs, last)
		}
		last = p.AtMs
		answered, refused, failed, span = answered+p.Answered, refused+p.Rejected, failed+p.Failed, span+p.Millis
		critical, shed = critical+p.ByLevel["critical"].Answered, shed+p.ByLevel["sheddable"].Rejected
		if _, ok := p.ByLevel["default"]; ok {
			t.Fatal("calls of the default level counted as a level")
		}
	}
	if answered != 3*ticks || refused != ticks || failed != ticks || critical != 3*ticks || shed != ticks || span != 25*ticks || last != 25*ticks {
		t.Errorf("counted %d answered (%d critical), %d refused (%d sheddable), %d failed over %v ms to %v; want %d, %d, %d over %d",
			answered, critical, refused, shed, failed, span, last, 3*ticks, ticks, ticks, 25*ticks)
	}
	// The bulkhead as it was at each sample's moment.
	if p := got[len(got)-1]; p.Limit != 64-ticks%50 || p.InFlight != ticks%9 {
		t.Errorf("last sample: limit %d, in flight %d; want %d, %d", p.Limit, p.InFlight, 64-ticks%50, ticks%9)
	}
	// The latency of the last sample's calls: those of its ticks.
	p := got[len(got)-1]
	first := float64(ticks) - p.Millis/25 + 1
	if med := (first + ticks) / 2; math.Abs(p.P50Ms-med)/med > 0.05 || p.P99Ms > ticks || p.P99Ms < 0.95*(first+0.99*(ticks-first)) {
		t.Errorf("last sample, of the calls of %v ms to %v ms: p50 %v, p99 %v", first, float64(ticks), p.P50Ms, p.P99Ms)
	}
}

func TestLatencyQuantiles(t *testing.T) {
	var l latencies
	if l.quantile(0.5) != 0 {
		t.Error("a quantile of no latency")
	}
	for range 50 {
		l.add(20)
	}
	if l.quantile(0.5) != 20 || l.quantile(0.99) != 20 {
		t.Errorf("50 × 20 ms: p50 %v, p99 %v", l.quantile(0.5), l.quantile(0.99))
	}
	l = latencies{}
	for i := 1; i <= 1000; i++ {
		l.add(float64(i))
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 500}, {0.99, 990}} {
		if got := l.quantile(c.q); math.Abs(got-c.want)/c.want > 0.05 {
			t.Errorf("1..1000 ms: quantile %v = %v, want %v within 5%%", c.q, got, c.want)
		}
	}
	var m latencies
	m.add(0.001) // below the first bucket
	m.add(1e9)   // beyond the last
	m.merge(&l)
	if m.n != 1002 || m.min != 0.001 || m.max != 1e9 || m.quantile(0.999) > 1e9 {
		t.Errorf("merged: %d latencies from %v to %v", m.n, m.min, m.max)
	}
}

// The configuration is described by the fields set, in their names, and
// the parts left zero say so.
func TestDescribeConfig(t *testing.T) {
	d := describeConfig(outbound.Config{MaxAttempts: 1, Admission: admission.Config{
		Bulkhead: bulkhead.Config{Adaptive: true, MaxConcurrent: 64},
		Throttle: throttle.Config{Enabled: true},
	}})
	want := map[string]string{
		"MaxAttempts": "1: no retries", "Backoff": "defaults", "Timeouts": "none", "Budget": "defaults", "Breaker": "defaults",
		"Rate": "none", "Bulkhead": "adaptive, MaxConcurrent 64", "Throttle": "on", "Hedging": "off", "Endpoints": "none: a host is dialed by name",
	}
	if fmt.Sprint(d) != fmt.Sprint(want) {
		t.Errorf("overload's configuration\n got %v\nwant %v", d, want)
	}
	d = describeConfig(outbound.Config{
		Admission: admission.Config{
			Circuit:  circuit.Config{WindowSize: 4, MinimumCalls: 4, WaitInOpen: 300 * time.Millisecond, PermittedCallsInHalfOpen: 2, MaxWaitInHalfOpen: -1},
			Bulkhead: bulkhead.Config{MaxConcurrent: 1},
			OnEvent:  func(admission.Event) {},
		},
		Backoff:   retry.Backoff{Initial: time.Millisecond, Max: time.Millisecond, Jitter: -1},
		Timeout:   2 * time.Second,
		Hedging:   &outbound.Hedging{MaxHedges: 2},
		Endpoints: &attempt.Endpoints{Ejection: attempt.Ejection{BaseTime: time.Second, MaxShare: 0.34}},
		IsFailure: func(*http.Response) bool { return false },
	})
	for k, v := range map[string]string{
		"MaxAttempts": "3 (the default)",
		"Breaker":     "WindowSize 4, MinimumCalls 4, WaitInOpen 300ms, PermittedCallsInHalfOpen 2, MaxWaitInHalfOpen -1ns",
		"Bulkhead":    "fixed, MaxConcurrent 1",
		"Backoff":     "Initial 1ms, Max 1ms, Jitter -1",
		"Timeouts":    "Timeout 2s",
		"Hedging":     "on, MaxHedges 2, adaptive delay",
		"Endpoints":   "spread over the host's addresses, Ejection{BaseTime 1s, MaxShare 0.34}",
		"Other":       "IsFailure",
	} {
		if d[k] != v {
			t.Errorf("%s: %q, want %q", k, d[k], v)
		}
	}
	for k, v := range d {
		if strings.Contains(v, "0x") || strings.Contains(v, "func") {
			t.Errorf("%s: %q shows a function", k, v)
		}
	}
}
