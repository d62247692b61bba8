package outboundotel_test

import (
	"bufio"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboundhq/outbound"
	outboundotel "github.com/outboundhq/outbound/otel"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/retry"
)

// Export the metrics to Prometheus: the OpenTelemetry Prometheus exporter is
// the MeterProvider's reader, and promhttp serves what it collects.
func ExampleHooks_prometheus() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		log.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	cfg := outbound.Config{Backoff: retry.Backoff{Initial: 10 * time.Millisecond}, Timeout: 5 * time.Second}

	// An upstream that sheds load once.
	upstream := outboundtest.NewServer(outboundtest.HTTP1)
	defer upstream.Close()
	upstream.Enqueue(outboundtest.Respond(503))
	cfg.HTTPTransport = upstream.Transport()

	hooks, err := outboundotel.Hooks(outboundotel.WithMeterProvider(mp)) // and WithTracerProvider(tp) for spans
	if err != nil {
		log.Fatal(err)
	}
	cfg.Hooks = hooks
	t, err := outbound.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer t.Close()
	guards, err := outboundotel.ObserveGuards(t, outboundotel.WithMeterProvider(mp)) // the guards' state
	if err != nil {
		log.Fatal(err)
	}
	defer guards.Unregister() // when the Transport is closed
	client := &http.Client{Transport: t}
	for range 3 {
		resp, err := client.Get(upstream.URL + "/orders")
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}

	// In a program: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})).
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()
	resp, err := http.Get(metrics.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	// The upstream listens on a random port: name it PORT.
	u, _ := url.Parse(upstream.URL)
	r := strings.NewReplacer(":"+u.Port(), ":PORT", `server_port="`+u.Port()+`"`, `server_port="PORT"`)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := r.Replace(sc.Text())
		for _, name := range []string{"outbound_attempts_total", "outbound_calls_total", "outbound_retries_total",
			"outbound_breaker_state{", "outbound_breaker_failure_rate", "outbound_breaker_buffered_calls", "http_client_request_duration_seconds_count"} {
			if strings.HasPrefix(line, name) {
				fmt.Println(line)
			}
		}
	}
	// Output:
	// http_client_request_duration_seconds_count{http_request_method="GET",http_response_status_code="200",server_address="127.0.0.1",server_port="PORT",url_scheme="http"} 3
	// http_client_request_duration_seconds_count{error_type="503",http_request_method="GET",http_response_status_code="503",server_address="127.0.0.1",server_port="PORT",url_scheme="http"} 1
	// outbound_attempts_total{outbound_category="Answered",outbound_upstream="http://127.0.0.1:PORT"} 4
	// outbound_breaker_buffered_calls{outbound_upstream="http://127.0.0.1:PORT"} 4
	// outbound_breaker_failure_rate_percent{outbound_upstream="http://127.0.0.1:PORT"} -1
	// outbound_breaker_state{outbound_state="CLOSED",outbound_upstream="http://127.0.0.1:PORT"} 1
	// outbound_breaker_state{outbound_state="DISABLED",outbound_upstream="http://127.0.0.1:PORT"} 0
	// outbound_breaker_state{outbound_state="FORCED_OPEN",outbound_upstream="http://127.0.0.1:PORT"} 0
	// outbound_breaker_state{outbound_state="HALF_OPEN",outbound_upstream="http://127.0.0.1:PORT"} 0
	// outbound_breaker_state{outbound_state="METRICS_ONLY",outbound_upstream="http://127.0.0.1:PORT"} 0
	// outbound_breaker_state{outbound_state="OPEN",outbound_upstream="http://127.0.0.1:PORT"} 0
	// outbound_calls_total{outbound_commit_status="committed",outbound_upstream="http://127.0.0.1:PORT"} 3
	// outbound_retries_total{outbound_upstream="http://127.0.0.1:PORT"} 1
}
