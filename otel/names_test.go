package outboundotel_test

import (
	"bufio"
	"context"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/drill/metrics"
	outboundotel "github.com/outboundhq/outbound/otel"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/retry"
)

// series reads Prometheus text and returns, per metric name, the sorted
// label names of its series (le excluded), as "name{a,b}".
func series(t *testing.T, text string) map[string]bool {
	t.Helper()
	line := regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? `)
	label := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		var names []string
		for _, l := range label.FindAllStringSubmatch(m[3], -1) {
			if l[1] != "le" {
				names = append(names, l[1])
			}
		}
		slices.Sort(names)
		out[m[1]+"{"+strings.Join(names, ",")+"}"] = true
	}
	return out
}

// `outbound drill --metrics` serves the same names and labels as this
// module's instruments get from the OpenTelemetry Prometheus exporter, so
// that a dashboard built on one reads the other.
func TestTheDrillsMetricsCarryTheNamesAndDescriptionsTheExporterGives(t *testing.T) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	hooks, err := outboundotel.Hooks(outboundotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	drill := metrics.New()

	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	tr, err := outbound.New(outbound.Config{HTTPTransport: s.Transport(), Hooks: outbound.ComposeHooks(hooks, drill.Hooks()),
		Backoff:   retry.Backoff{Initial: time.Millisecond, Max: time.Millisecond},
		Budget:    retry.BudgetConfig{MaxTokens: 2},
		Admission: admission.Config{Circuit: circuit.Config{WindowSize: 6, MinimumCalls: 6}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	breakers, err := outboundotel.ObserveGuards(tr, outboundotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	defer breakers.Unregister()
	drill.Observe(tr)
	// Answers, a retry, a declined retry, an exhausted budget, an opening
	// breaker and local rejections: every family has series.
	s.Enqueue(outboundtest.ResetBeforeRead())
	s.SetDefault(outboundtest.Respond(503))
	for range 8 {
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/x", nil)
		if resp, err := tr.RoundTrip(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	otel, ours := series(t, string(body)), series(t, drill.Text())
	if len(ours) < 10 {
		t.Fatalf("the drill's registry has only %d series: %v", len(ours), ours)
	}
	for s := range ours {
		if !otel[s] {
			t.Errorf("the drill serves %s, the exporter does not", s)
		}
	}
	// The descriptions are written twice (the core module cannot import
	// this one): they must say the same.
	otelHelp, ourHelp := helps(string(body)), helps(drill.Text())
	for name, h := range ourHelp {
		if o, ok := otelHelp[name]; ok && o != h {
			t.Errorf("%s: the drill describes it as %q, the exporter as %q", name, h, o)
		}
	}
	if t.Failed() {
		t.Logf("the exporter's: %v", slices.Sorted(maps.Keys(otel)))
	}
}

// helps reads Prometheus text and returns each metric's HELP text.
func helps(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, help, _ := strings.Cut(rest, " ")
			out[name] = help
		}
	}
	return out
}
