package bench

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/sony/gobreaker/v2"

	"github.com/outboundhq/outbound/admission/circuit"
)

// upstreams is the number of idle breakers held at once, one per upstream key.
const upstreams = 100_000

// BenchmarkIdleBreaker measures the heap held by an idle breaker (created,
// never called), one per upstream key, each with a count window of 100
// calls (gobreaker: its default settings). It reports "B/breaker", the live
// heap after a GC divided by the number of breakers, and "alloc-B/breaker",
// everything allocated while creating them. Each iteration creates 100,000.
func BenchmarkIdleBreaker(b *testing.B) {
	keys := make([]string, upstreams)
	for i := range keys {
		keys[i] = fmt.Sprintf("https://upstream-%d.example:443", i)
	}
	cases := []struct {
		name string
		new  func(key string) any
	}{
		{"outbound", func(string) any {
			br, err := circuit.New(circuit.Config{WindowType: circuit.CountBased, WindowSize: windowSize})
			if err != nil {
				panic(err)
			}
			return br
		}},
		{"gobreaker", func(key string) any {
			return gobreaker.NewCircuitBreaker[any](gobreaker.Settings{Name: key})
		}},
		{"failsafe", func(string) any {
			return failsafeBreaker[any]()
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var live, total float64
			for i := 0; i < b.N; i++ {
				l, t := idleBytes(keys, c.new)
				live += l
				total += t
			}
			b.ReportMetric(live/float64(b.N), "B/breaker")
			b.ReportMetric(total/float64(b.N), "alloc-B/breaker")
		})
	}
}

// idleBytes creates one breaker per key and returns the live heap they hold
// and the bytes allocated while creating them, per breaker.
func idleBytes(keys []string, newBreaker func(string) any) (live, total float64) {
	held := make([]any, len(keys)) // allocated before the first reading
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, k := range keys {
		held[i] = newBreaker(k)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(held)
	n := float64(len(keys))
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n,
		float64(after.TotalAlloc-before.TotalAlloc) / n
}
