package outboundotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/outboundhq/outbound"
	outboundotel "github.com/outboundhq/outbound/otel"
)

// discard is a span processor that drops every span: the spans are created,
// recorded and ended, then exported nowhere.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }

// BenchmarkHooksOverhead measures the cost of the hooks per request: one GET
// over loopback through outbound.Transport, answered 200 with a small body
// that is read to the end, without hooks and with them. "metrics" records
// metrics with the SDK (a ManualReader that is never collected) and no-op
// spans; "metrics+spans" also records two spans per call (the call and its
// attempt) with the SDK, sampled and dropped by a no-op processor.
func BenchmarkHooksOverhead(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	}))
	defer srv.Close()

	withOtel := func(spans bool) outbound.Hooks {
		opts := []outboundotel.Option{outboundotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))}
		if spans {
			opts = append(opts, outboundotel.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}))))
		} else {
			opts = append(opts, outboundotel.WithTracerProvider(noop.NewTracerProvider()))
		}
		h, err := outboundotel.Hooks(opts...)
		if err != nil {
			b.Fatal(err)
		}
		return h
	}
	for _, bc := range []struct {
		name  string
		hooks func() outbound.Hooks
	}{
		{"hooks=none", func() outbound.Hooks { return outbound.Hooks{} }},
		{"hooks=metrics", func() outbound.Hooks { return withOtel(false) }},
		{"hooks=metrics+spans", func() outbound.Hooks { return withOtel(true) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			t, err := outbound.New(outbound.Config{Hooks: bc.hooks()})
			if err != nil {
				b.Fatal(err)
			}
			defer t.Close()
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
			get := func() {
				resp, err := t.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			get() // a connection, and the attribute sets of the series
			b.ReportAllocs()
			for b.Loop() {
				get()
			}
		})
	}
}
