package outboundotel_test

import (
	"context"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/attempt"
	outboundotel "github.com/outboundhq/outbound/otel"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/retry"
)

// env is an upstream, a Transport with the hooks, and the SDK's in-memory
// readers of their metrics and spans.
type env struct {
	s        *outboundtest.Server
	t        *outbound.Transport
	reader   *sdkmetric.ManualReader
	spans    *tracetest.SpanRecorder
	tp       *sdktrace.TracerProvider
	host     string
	port     int
	upstream string
}

func newEnv(t *testing.T, p outboundtest.Proto, cfg outbound.Config) *env {
	t.Helper()
	e := &env{s: outboundtest.NewServer(p), reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	t.Cleanup(e.s.Close)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = e.tp.Shutdown(context.Background()) })
	hooks, err := outboundotel.Hooks(outboundotel.WithMeterProvider(mp), outboundotel.WithTracerProvider(e.tp))
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTPTransport, cfg.Hooks = e.s.Transport(), outbound.ComposeHooks(hooks, cfg.Hooks) // the module's first
	if cfg.Backoff == (retry.Backoff{}) {
		cfg.Backoff = retry.Backoff{Initial: 1, Max: 1, Jitter: -1} // no waiting between attempts
	}
	if e.t, err = outbound.New(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.t.Close)
	reg, err := outboundotel.ObserveGuards(e.t, outboundotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Unregister() })
	u, _ := url.Parse(e.s.URL)
	e.host, e.upstream = u.Hostname(), e.s.URL
	e.port, _ = strconv.Atoi(u.Port())
	return e
}

// get makes a call and returns its status, or 0 and the error.
func (e *env) get(t *testing.T, ctx context.Context, path string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.s.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := e.t.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // resolves the breaker's permit
	return resp.StatusCode, nil
}

func (e *env) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != outboundotel.ScopeName {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// kvs renders attributes as "k=v" strings, sorted by key.
func kvs(set attribute.Set) string {
	var parts []string
	for _, kv := range set.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
	}
	return strings.Join(parts, " ")
}

// sums returns the values of an Int64 sum or gauge by their attributes.
func sums(t *testing.T, ms map[string]metricdata.Metrics, name, unit string) map[string]int64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		t.Fatalf("metric %s not recorded", name)
	}
	if m.Unit != unit {
		t.Errorf("%s: unit %q, want %q", name, m.Unit, unit)
	}
	out := map[string]int64{}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		if !d.IsMonotonic {
			t.Errorf("%s is not monotonic", name)
		}
		for _, p := range d.DataPoints {
			out[kvs(p.Attributes)] = p.Value
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out[kvs(p.Attributes)] = p.Value
		}
	default:
		t.Fatalf("%s: data %T", name, m.Data)
	}
	return out
}

// rates returns the values of a Float64 gauge in percent by their
// attributes.
func rates(t *testing.T, ms map[string]metricdata.Metrics, name string) map[string]float64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		t.Fatalf("metric %s not recorded", name)
	}
	if m.Unit != "%" {
		t.Errorf("%s: unit %q, want %%", name, m.Unit)
	}
	g, ok := m.Data.(metricdata.Gauge[float64])
	if !ok {
		t.Fatalf("%s: data %T", name, m.Data)
	}
	out := map[string]float64{}
	for _, p := range g.DataPoints {
		out[kvs(p.Attributes)] = p.Value
	}
	return out
}

// histogram returns the counts of http.client.request.duration by attributes.
func histogram(t *testing.T, ms map[string]metricdata.Metrics) map[string]uint64 {
	t.Helper()
	m, ok := ms["http.client.request.duration"]
	if !ok {
		t.Fatal("http.client.request.duration not recorded")
	}
	if m.Unit != "s" {
		t.Errorf("http.client.request.duration: unit %q, want s", m.Unit)
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("http.client.request.duration: data %T", m.Data)
	}
	out := map[string]uint64{}
	for _, p := range h.DataPoints {
		out[kvs(p.Attributes)] = p.Count
		if p.Sum <= 0 || p.Sum > 10 {
			t.Errorf("duration sum %v s for %s", p.Sum, kvs(p.Attributes))
		}
	}
	return out
}

func wantCounts[V comparable](t *testing.T, name string, got, want map[string]V) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d series %v, want %v", name, len(got), got, want)
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s{%s} = %v (present %v), want %v; all: %v", name, k, g, ok, w, got)
		}
	}
}

func TestMetricsOfARetriedCall(t *testing.T) {
	e := newEnv(t, outboundtest.H2C, outbound.Config{})
	e.s.Enqueue(outboundtest.RefusedStream())
	if status, err := e.get(t, context.Background(), "/"); err != nil || status != 200 {
		t.Fatalf("status %d err %v", status, err)
	}
	ms := e.collect(t)
	up := "outbound.upstream=" + e.upstream
	server := "http.request.method=GET "
	wire := " server.address=" + e.host + " server.port=" + strconv.Itoa(e.port) + " url.scheme=http"
	wantCounts(t, "http.client.request.duration", histogram(t, ms), map[string]uint64{
		"error.type=NotSent " + server + wire[1:]:       1,
		server + "http.response.status_code=200" + wire: 1,
	})
	wantCounts(t, "outbound.attempts", sums(t, ms, "outbound.attempts", "{attempt}"), map[string]int64{
		"outbound.category=NotSent " + up:  1,
		"outbound.category=Answered " + up: 1,
	})
	wantCounts(t, "outbound.retries", sums(t, ms, "outbound.retries", "{retry}"), map[string]int64{up: 1})
	wantCounts(t, "outbound.calls", sums(t, ms, "outbound.calls", "{call}"), map[string]int64{
		"outbound.commit_status=committed " + up: 1,
	})
	wantCounts(t, "outbound.breaker.state", sums(t, ms, "outbound.breaker.state", "{state}"), map[string]int64{
		"outbound.state=CLOSED " + up: 1, "outbound.state=OPEN " + up: 0, "outbound.state=HALF_OPEN " + up: 0,
		"outbound.state=DISABLED " + up: 0, "outbound.state=FORCED_OPEN " + up: 0, "outbound.state=METRICS_ONLY " + up: 0,
	})
	for _, name := range []string{"outbound.rejections", "outbound.retry.declined", "outbound.retry_budget.exhausted"} {
		if _, ok := ms[name]; ok {
			t.Errorf("%s recorded for a call without rejections or declined retries", name)
		}
	}
}

// A storm of 503s opens the breaker; later calls are rejected locally.
func TestMetricsOfA503Storm(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{MaxAttempts: 1,
		Admission: admission.Config{Circuit: circuit.Config{WindowSize: 4, MinimumCalls: 4, WaitInOpen: time.Hour}}})
	e.s.SetDefault(outboundtest.Respond(503))
	for i := range 6 {
		status, err := e.get(t, context.Background(), "/")
		switch {
		case i < 4 && status != 503:
			t.Fatalf("call %d: status %d err %v", i, status, err)
		case i >= 4 && err == nil:
			t.Fatalf("call %d: status %d, want a local rejection", i, status)
		}
	}
	ms := e.collect(t)
	up := "outbound.upstream=" + e.upstream
	wantCounts(t, "http.client.request.duration", histogram(t, ms), map[string]uint64{
		"error.type=503 http.request.method=GET http.response.status_code=503 server.address=" + e.host +
			" server.port=" + strconv.Itoa(e.port) + " url.scheme=http": 4,
	})
	wantCounts(t, "outbound.attempts", sums(t, ms, "outbound.attempts", "{attempt}"), map[string]int64{
		"outbound.category=Answered " + up:       4,
		"outbound.category=LocalRejection " + up: 2,
	})
	wantCounts(t, "outbound.rejections", sums(t, ms, "outbound.rejections", "{attempt}"), map[string]int64{
		"outbound.guard=circuit " + up: 2,
	})
	wantCounts(t, "outbound.retry.declined", sums(t, ms, "outbound.retry.declined", "{retry}"), map[string]int64{
		"outbound.reason=attempts exhausted " + up: 4,
		"outbound.reason=rejected locally " + up:   2,
	})
	wantCounts(t, "outbound.calls", sums(t, ms, "outbound.calls", "{call}"), map[string]int64{
		"outbound.commit_status=committed " + up:     4,
		"outbound.commit_status=not committed " + up: 2,
	})
	wantCounts(t, "outbound.breaker.state", sums(t, ms, "outbound.breaker.state", "{state}"), map[string]int64{
		"outbound.state=CLOSED " + up: 0, "outbound.state=OPEN " + up: 1, "outbound.state=HALF_OPEN " + up: 0,
		"outbound.state=DISABLED " + up: 0, "outbound.state=FORCED_OPEN " + up: 0, "outbound.state=METRICS_ONLY " + up: 0,
	})

	wantCounts(t, "outbound.breaker.failure_rate", rates(t, ms, "outbound.breaker.failure_rate"), map[string]float64{up: 100})
	wantCounts(t, "outbound.breaker.slow_call_rate", rates(t, ms, "outbound.breaker.slow_call_rate"), map[string]float64{up: 0})
	for name, want := range map[string]int64{"outbound.breaker.buffered_calls": 4, "outbound.breaker.failed_calls": 4,
		"outbound.breaker.slow_calls": 0, "outbound.breaker.not_permitted_calls": 2} {
		wantCounts(t, name, sums(t, ms, name, "{call}"), map[string]int64{up: want})
	}
	wantCounts(t, "outbound.breaker.generation", sums(t, ms, "outbound.breaker.generation", "{transition}"), map[string]int64{up: 1})

	// The breaker's later states follow.
	b, ok := e.t.Breaker(e.upstream)
	if !ok {
		t.Fatalf("no breaker kept for %s", e.upstream)
	}
	if err := b.SetState(circuit.ForcedOpen); err != nil {
		t.Fatal(err)
	}
	got := sums(t, e.collect(t), "outbound.breaker.state", "{state}")
	if got["outbound.state=FORCED_OPEN "+up] != 1 || got["outbound.state=OPEN "+up] != 0 {
		t.Errorf("after SetState(FORCED_OPEN): %v", got)
	}

	// The rejected attempts have spans too.
	var rejected []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if attr(s, "outbound.guard").Emit() == "circuit" {
			rejected = append(rejected, s)
		}
	}
	if len(rejected) != 2 {
		t.Fatalf("%d attempt spans with outbound.guard=circuit, want 2", len(rejected))
	}
	s := rejected[0]
	wantAttrs(t, s, map[string]string{"outbound.category": "LocalRejection", "error.type": "LocalRejection",
		"outbound.stage": "admission", "outbound.decision": "rejected locally"})
	if s.Status().Code != codes.Error || len(s.Events()) != 1 || s.Events()[0].Name != "exception" {
		t.Errorf("rejected attempt: status %v, events %v", s.Status(), s.Events())
	}
}

func attr(s sdktrace.ReadOnlySpan, key string) attribute.Value {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	for k, w := range want {
		if g := attr(s, k); g.Type() == attribute.INVALID || g.Emit() != w {
			t.Errorf("span %q: %s = %q, want %q", s.Name(), k, g.Emit(), w)
		}
	}
}

func TestSpansOfARetriedCall(t *testing.T) {
	e := newEnv(t, outboundtest.H2C, outbound.Config{})
	e.s.Enqueue(outboundtest.RefusedStream())
	if status, err := e.get(t, context.Background(), "/"); err != nil || status != 200 {
		t.Fatalf("status %d err %v", status, err)
	}
	spans := e.spans.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3 (two attempts, then the call)", len(spans))
	}
	first, second, call := spans[0], spans[1], spans[2]
	if call.Name() != "outbound GET" || call.SpanKind() != trace.SpanKindInternal || call.Parent().IsValid() {
		t.Errorf("call span: %q, kind %v, parent %v", call.Name(), call.SpanKind(), call.Parent())
	}
	for i, a := range []sdktrace.ReadOnlySpan{first, second} {
		if a.Name() != "GET" || a.SpanKind() != trace.SpanKindClient || a.Parent().SpanID() != call.SpanContext().SpanID() ||
			a.SpanContext().TraceID() != call.SpanContext().TraceID() {
			t.Errorf("attempt %d: %q, kind %v, not a child of the call span", i+1, a.Name(), a.SpanKind())
		}
	}
	wantAttrs(t, first, map[string]string{"outbound.category": "NotSent", "outbound.evidence": "REFUSED_STREAM",
		"error.type": "NotSent", "outbound.decision": "retryable"})
	if attr(first, "http.request.resend_count").Type() != attribute.INVALID {
		t.Error("the first attempt carries http.request.resend_count")
	}
	wantAttrs(t, second, map[string]string{"http.request.resend_count": "1", "http.response.status_code": "200",
		"outbound.category": "Answered"})
	wantAttrs(t, call, map[string]string{"outbound.commit_status": "committed", "outbound.attempts": "2"})
}

// A call made under the caller's span is its child.
func TestACallNestsUnderTheCallersSpan(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{})
	ctx, parent := e.tp.Tracer("test").Start(context.Background(), "handler")
	if status, err := e.get(t, ctx, "/"); err != nil || status != 200 {
		t.Fatalf("status %d err %v", status, err)
	}
	parent.End()
	spans := e.spans.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	call := spans[1]
	if call.Name() != "outbound GET" || call.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("call span %q is not a child of the caller's span", call.Name())
	}
}

// A POST reset after processing: the call span says unknown, with status
// Error, and the call counts as unknown.
func TestAnAmbiguousPostIsUnknownOnTheCallSpan(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{})
	e.s.Enqueue(outboundtest.ResetAfterRead())
	req, _ := http.NewRequest(http.MethodPost, e.s.URL+"/", strings.NewReader("{}"))
	if _, err := e.t.RoundTrip(req); err == nil {
		t.Fatal("no error")
	}
	spans := e.spans.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	call := spans[1]
	wantAttrs(t, call, map[string]string{"outbound.commit_status": "unknown", "outbound.attempts": "1"})
	if call.Status().Code != codes.Error {
		t.Errorf("call status %v, want Error", call.Status())
	}
	got := sums(t, e.collect(t), "outbound.calls", "{call}")
	if got["outbound.commit_status=unknown outbound.upstream="+e.upstream] != 1 {
		t.Errorf("outbound.calls: %v", got)
	}
}

// Neither the path, the query nor a header reaches a span or a metric, also
// when the request fails.
func TestNoSecretsRecorded(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{})
	e.s.Enqueue(outboundtest.ResetBeforeRead(), outboundtest.ResetAfterRead())
	for range 3 {
		req, _ := http.NewRequest(http.MethodGet, e.s.URL+"/private-path?token=hunter2", nil)
		req.Header.Set("Authorization", "Bearer hunter2")
		if resp, err := e.t.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	// An unsupported URL fails unclassified; its error names the scheme and
	// host only.
	req, _ := http.NewRequest(http.MethodGet, "ftp://"+e.host+"/private-path?token=hunter2", nil)
	if _, err := e.t.RoundTrip(req); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err %v, want an error without the path or query", err)
	}

	var seen []string
	for _, s := range e.spans.Ended() {
		seen = append(seen, s.Name(), s.Status().Description)
		for _, kv := range s.Attributes() {
			seen = append(seen, kv.Value.Emit())
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				seen = append(seen, kv.Value.Emit())
			}
		}
	}
	for _, m := range e.collect(t) {
		var sets []attribute.Set
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				sets = append(sets, p.Attributes)
			}
		case metricdata.Gauge[int64]:
			for _, p := range d.DataPoints {
				sets = append(sets, p.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				sets = append(sets, p.Attributes)
			}
		}
		for _, s := range sets {
			seen = append(seen, kvs(s))
		}
	}
	if len(seen) < 20 {
		t.Fatalf("only %d values recorded", len(seen))
	}
	for _, v := range seen {
		if strings.Contains(v, "hunter2") || strings.Contains(v, "private-path") {
			t.Errorf("recorded: %q", v)
		}
	}
}

func TestUnknownMethod(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{})
	req, _ := http.NewRequest("PURGE", e.s.URL+"/", nil)
	resp, err := e.t.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	spans := e.spans.Ended()
	if len(spans) != 2 || spans[0].Name() != "HTTP" || spans[1].Name() != "outbound HTTP" {
		t.Fatalf("spans %v", spans)
	}
	wantAttrs(t, spans[0], map[string]string{"http.request.method": "_OTHER", "http.request.method_original": "PURGE"})
	for k := range histogram(t, e.collect(t)) {
		if !strings.Contains(k, "http.request.method=_OTHER ") || strings.Contains(k, "PURGE") {
			t.Errorf("duration series %s", k)
		}
	}
}

func TestDefaultsToTheGlobalProviders(t *testing.T) {
	h, err := outboundotel.Hooks()
	if err != nil {
		t.Fatal(err)
	}
	// The globals are no-ops until set: the hooks must still work.
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	tr, err := outbound.New(outbound.Config{HTTPTransport: s.Transport(), Hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	resp, err := (&http.Client{Transport: tr}).Get(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// The breaker figures are read from the breakers: one that starts in
// METRICS_ONLY is reported so from its first call, with its rates (-1 below
// the minimum number of calls).
func TestBreakerFiguresAreTheBreakersOwn(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{MaxAttempts: 1,
		Admission: admission.Config{Circuit: circuit.Config{WindowSize: 4, MinimumCalls: 4, StartState: circuit.MetricsOnly}}})
	e.s.SetDefault(outboundtest.Respond(500))
	up := "outbound.upstream=" + e.upstream
	for i := range 4 {
		if _, err := e.get(t, context.Background(), "/"); err != nil {
			t.Fatal(err)
		}
		ms := e.collect(t)
		if got := sums(t, ms, "outbound.breaker.state", "{state}"); got["outbound.state=METRICS_ONLY "+up] != 1 {
			t.Fatalf("after %d calls: %v, want METRICS_ONLY", i+1, got)
		}
		want := -1.0
		if i == 3 {
			want = 100
		}
		wantCounts(t, "outbound.breaker.failure_rate", rates(t, ms, "outbound.breaker.failure_rate"), map[string]float64{up: want})
		wantCounts(t, "outbound.breaker.failed_calls", sums(t, ms, "outbound.breaker.failed_calls", "{call}"), map[string]int64{up: int64(i + 1)})
	}
}

// When GetBody fails before a retry, the second attempt never starts: the
// call ends unknown (its first attempt was ambiguous), with that reason.
func TestAttemptWithoutAResult(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{})
	e.s.Enqueue(outboundtest.ResetAfterRead())
	req, _ := http.NewRequest(http.MethodPut, e.s.URL+"/", strings.NewReader("{}"))
	req.GetBody = func() (io.ReadCloser, error) { return nil, io.ErrUnexpectedEOF }
	if _, err := e.t.RoundTrip(req); err == nil {
		t.Fatal("no error")
	}
	spans := e.spans.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2 (one attempt, the call)", len(spans))
	}
	wantAttrs(t, spans[1], map[string]string{"outbound.commit_status": "unknown", "outbound.attempts": "1",
		"outbound.end_reason": "GetBody failed"})
	got := sums(t, e.collect(t), "outbound.calls", "{call}")
	if got["outbound.commit_status=unknown outbound.upstream="+e.upstream] != 1 {
		t.Errorf("outbound.calls: %v", got)
	}
}

func TestMetricsOfAnExhaustedBudget(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{Budget: retry.BudgetConfig{MaxTokens: 1}})
	e.s.SetDefault(outboundtest.Respond(503))
	if status, err := e.get(t, context.Background(), "/"); err != nil || status != 503 {
		t.Fatalf("status %d err %v", status, err)
	}
	ms := e.collect(t)
	up := "outbound.upstream=" + e.upstream
	wantCounts(t, "outbound.retry_budget.exhausted", sums(t, ms, "outbound.retry_budget.exhausted", "{attempt}"),
		map[string]int64{up: 1})
	wantCounts(t, "outbound.retry.declined", sums(t, ms, "outbound.retry.declined", "{retry}"),
		map[string]int64{"outbound.reason=retry budget exhausted " + up: 1})
	if _, ok := ms["outbound.retries"]; ok {
		t.Error("a retry was counted")
	}
}

// Calls in parallel, collected while they run (run it with -race).
func TestConcurrentCalls(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{})
	const workers, calls = 8, 20
	done := make(chan struct{})
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for {
			select {
			case <-done:
				return
			default:
				var rm metricdata.ResourceMetrics
				_ = e.reader.Collect(context.Background(), &rm)
			}
		}
	}()
	errs := make(chan error, workers)
	for range workers {
		go func() {
			var err error
			for range calls {
				if _, err = e.get(t, context.Background(), "/"); err != nil {
					break
				}
			}
			errs <- err
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(done)
	<-collected
	got := sums(t, e.collect(t), "outbound.calls", "{call}")
	if n := got["outbound.commit_status=committed outbound.upstream="+e.upstream]; n != workers*calls {
		t.Errorf("outbound.calls = %v, want %d committed", got, workers*calls)
	}
	if n := len(e.spans.Ended()); n != 2*workers*calls {
		t.Errorf("%d spans, want %d", n, 2*workers*calls)
	}
}

// When the Transport forgets an idle upstream, the module forgets what it
// keeps for it: its breaker gauge stops reporting it, and its cached
// attribute sets go.
func TestAForgottenUpstreamLeavesTheBreakerGauge(t *testing.T) {
	forgotten := make(chan string, 1)
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{UpstreamIdleTime: 20 * time.Millisecond,
		Hooks: outbound.Hooks{UpstreamForgotten: func(u string) { forgotten <- u }}})
	if _, err := e.get(t, context.Background(), "/"); err != nil {
		t.Fatal(err)
	}
	if got := sums(t, e.collect(t), "outbound.breaker.state", "{state}"); got["outbound.state=CLOSED outbound.upstream="+e.upstream] != 1 {
		t.Fatalf("breaker gauge before: %v", got)
	}
	e.t.CloseIdleConnections()
	if u := <-forgotten; u != e.upstream { // within a few sweeps
		t.Fatalf("forgot %s", u)
	}
	if _, ok := e.t.Upstream(e.upstream); ok {
		t.Fatal("the retry budget outlived its upstream")
	}
	ms := e.collect(t)
	if m, ok := ms["outbound.breaker.state"]; ok {
		if g := m.Data.(metricdata.Gauge[int64]); len(g.DataPoints) != 0 {
			t.Fatalf("the forgotten upstream is still reported: %v", sums(t, ms, "outbound.breaker.state", "{state}"))
		}
	}
}

func TestTheConcurrencyLimitAndTheThrottleAreReported(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{MaxAttempts: 1,
		Admission: admission.Config{Bulkhead: bulkhead.Config{Adaptive: true, MaxConcurrent: 64, InitialConcurrent: 8},
			Throttle: throttle.Config{Enabled: true, K: 1}}})
	e.s.SetDefault(outboundtest.Respond(429))
	if _, err := e.get(t, context.Background(), "/"); err != nil {
		t.Fatal(err)
	}
	ms := e.collect(t)
	up := "outbound.upstream=" + e.upstream
	wantCounts(t, "outbound.concurrency.limit", sums(t, ms, "outbound.concurrency.limit", "{attempt}"), map[string]int64{up: 8})
	wantCounts(t, "outbound.concurrency.in_flight", sums(t, ms, "outbound.concurrency.in_flight", "{attempt}"), map[string]int64{up: 0})
	g, ok := ms["outbound.throttle.rejection_probability"].Data.(metricdata.Gauge[float64])
	if !ok || len(g.DataPoints) != 1 || g.DataPoints[0].Value != 0.5 { // 1 request, not accepted: (1-0)/(1+1)
		t.Fatalf("outbound.throttle.rejection_probability: %+v", ms["outbound.throttle.rejection_probability"])
	}
}

// With Config.Endpoints, each ejection of an endpoint is counted by
// upstream and endpoint: here "svc.test" resolves to two loopback
// addresses where nothing listens, and one of them is ejected (never the
// last).
func TestEndpointEjectionsAreCounted(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{MaxAttempts: 1,
		Endpoints: &attempt.Endpoints{Resolver: testkit.Names{"svc.test": testkit.Loopbacks(2)},
			Ejection: attempt.Ejection{ConsecutiveFailures: 2, MaxShare: 0.5}}})
	u, _ := url.Parse(e.s.URL)
	for range 4 {
		req, _ := http.NewRequest(http.MethodGet, "http://svc.test:"+u.Port()+"/", nil)
		if _, err := e.t.RoundTrip(req); err == nil {
			t.Fatal("a call reached an address where nothing listens")
		}
	}
	ms := e.collect(t)
	got := sums(t, ms, "outbound.endpoint.ejections", "{ejection}")
	if len(got) != 1 {
		t.Fatalf("outbound.endpoint.ejections: %v, want one endpoint ejected once", got)
	}
	for k, n := range got {
		if n != 1 || !strings.Contains(k, "outbound.upstream=http://svc.test:"+u.Port()) || !strings.Contains(k, "outbound.endpoint=127.0.0.") {
			t.Fatalf("outbound.endpoint.ejections: %v", got)
		}
	}
}

// With Config.Endpoints, an attempt span names the endpoint it went to
// (network.peer.address and network.peer.port), the server.* attributes
// keep the host's name.
func TestAnAttemptSpanNamesItsEndpoint(t *testing.T) {
	e := newEnv(t, outboundtest.HTTP1, outbound.Config{MaxAttempts: 1,
		Endpoints: &attempt.Endpoints{Resolver: testkit.Names{"svc.test": {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")}},
			Ejection: attempt.Ejection{ConsecutiveFailures: 1, MaxShare: 0.5}}})
	u, _ := url.Parse(e.s.URL)
	for range 6 { // 127.0.0.2 refuses, is ejected; the attempts go to 127.0.0.1, where the server is
		req, _ := http.NewRequest(http.MethodGet, "http://svc.test:"+u.Port()+"/", nil)
		if resp, err := e.t.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	found := false
	for _, s := range e.spans.Ended() {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if attrs["http.response.status_code"] == "200" {
			found = true
			if attrs["network.peer.address"] != "127.0.0.1" || attrs["network.peer.port"] != u.Port() || attrs["server.address"] != "svc.test" {
				t.Fatalf("an answered attempt's span: %v", attrs)
			}
		}
	}
	if !found {
		t.Fatal("no answered attempt")
	}
}
