package admission_test

import (
	"context"
	"testing"

	"golang.org/x/time/rate"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
)

// benchConfig admits everything: a rate and a concurrency far above what the
// benchmark reaches, so that every guard does its full work without rejecting.
func benchConfig() admission.Config {
	return admission.Config{
		Upstream: "bench",
		Rate:     ratelimit.Config{PerSecond: 1e9, Burst: 1 << 30},
		Bulkhead: bulkhead.Config{MaxConcurrent: 1 << 20},
	}
}

// BenchmarkAdmission measures one attempt's admission and release through the
// three guards, against a baseline of x/time/rate's Allow plus a buffered
// channel used as a semaphore, measured in the same run.
func BenchmarkAdmission(b *testing.B) {
	ctx := context.Background()
	b.Run("baseline", func(b *testing.B) {
		l, sem := rate.NewLimiter(1e9, 1<<30), make(chan struct{}, 1<<20)
		b.ReportAllocs()
		for b.Loop() {
			if l.Allow() {
				sem <- struct{}{}
				<-sem
			}
		}
	})
	b.Run("baseline-parallel", func(b *testing.B) {
		l, sem := rate.NewLimiter(1e9, 1<<30), make(chan struct{}, 1<<20)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if l.Allow() {
					sem <- struct{}{}
					<-sem
				}
			}
		})
	})
	b.Run("pipeline", func(b *testing.B) { admitAndRelease(b, mustPipeline(b, benchConfig())) })
	b.Run("pipeline-parallel", func(b *testing.B) {
		p := mustPipeline(b, benchConfig())
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				pm, err := p.Acquire(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				pm.Success(0)
			}
		})
	})
	b.Run("pipeline-observed", func(b *testing.B) {
		// With an observer set: six events per attempt, by value.
		cfg := benchConfig()
		var n int
		cfg.OnEvent = func(admission.Event) { n++ }
		admitAndRelease(b, mustPipeline(b, cfg))
	})
	b.Run("fastfail", func(b *testing.B) {
		p := mustPipeline(b, benchConfig())
		p.Breaker().SetState(circuit.ForcedOpen)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := p.Acquire(ctx); err == nil {
				b.Fatal("admitted while open")
			}
		}
	})
	b.Run("fastfail-parallel", func(b *testing.B) {
		p := mustPipeline(b, benchConfig())
		p.Breaker().SetState(circuit.ForcedOpen)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := p.Acquire(ctx); err == nil {
					b.Error("admitted while open")
					return
				}
			}
		})
	})
}

// admitAndRelease measures one admission and release per iteration.
func admitAndRelease(b *testing.B, p *admission.Pipeline) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		pm, err := p.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		pm.Success(0)
	}
}

func mustPipeline(tb testing.TB, cfg admission.Config) *admission.Pipeline {
	tb.Helper()
	p, err := admission.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}
