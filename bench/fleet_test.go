package bench

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound/internal/redistest"
	outboundredis "github.com/outboundhq/outbound/redis"
)

// fleetRate is a limit that never binds in these benchmarks: what is measured
// is the cost of asking, not of being refused.
const fleetRate = 1_000_000

// scripts returns how many scripts the server has run (EVAL and EVALSHA):
// the round trips of the admissions.
func scripts(tb testing.TB, c *redis.Client) int64 {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var n int64
	for l := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":calls=")
		if ok && (name == "cmdstat_evalsha" || name == "cmdstat_eval") {
			v, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			n += v
		}
	}
	return n
}

// BenchmarkFleet compares one admission of a fleet-wide rate limit on a local
// redis-server: go-redis/redis_rate on go-redis (one script per admission,
// no refund), outbound's Limiter on rueidis without leasing (one script per
// admission, refunds) and with leasing (batches of up to 64). It reports
// Redis round trips per admission, counted by the server.
func BenchmarkFleet(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 32})
	b.Cleanup(func() { c.Close() })
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rc.Close)
	rr := redis_rate.NewLimiter(c)
	limit := redis_rate.Limit{Rate: fleetRate, Burst: fleetRate, Period: time.Second}
	ours := func(lease int) func(context.Context) error {
		l, err := outboundredis.New(outboundredis.Config{Client: rc, PerSecond: fleetRate, Burst: fleetRate,
			Prefix: "bench" + strconv.Itoa(lease) + ":", Lease: outboundredis.Lease{Max: lease}, Timeout: time.Second,
			Degraded: outboundredis.Degraded{Reject: true}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		return l.For("https://api.example:443").Take
	}
	libs := []struct {
		name string
		take func(context.Context) error
	}{
		{"redis_rate", func(ctx context.Context) error {
			_, err := rr.Allow(ctx, "https://api.example:443", limit)
			return err
		}},
		{"outbound", ours(0)},
		{"outbound-leased", ours(64)},
	}
	for _, lib := range libs {
		for _, mode := range []string{"sequential", "16-goroutines"} {
			b.Run(lib.name+"/"+mode, func(b *testing.B) {
				ctx := context.Background()
				before := scripts(b, c)
				b.ReportAllocs()
				b.ResetTimer()
				if mode == "sequential" {
					for range b.N {
						if err := lib.take(ctx); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := lib.take(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				b.StopTimer()
				b.ReportMetric(float64(scripts(b, c)-before)/float64(b.N), "round-trips/op")
			})
		}
	}
}

// BenchmarkRedisClient is the measurement behind the choice of client: the
// rate script run through go-redis v9 and through rueidis, one admission's
// round trip each.
func BenchmarkRedisClient(b *testing.B) {
	srv := redistest.Start(b)
	const script = `local t = redis.call('TIME') local v = redis.call('INCR', KEYS[1]) return {v, tonumber(t[2])}`
	gr := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 32})
	b.Cleanup(func() { gr.Close() })
	gs := redis.NewScript(script)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rc.Close)
	rs := rueidis.NewLuaScript(script)
	ctx := context.Background()
	clients := []struct {
		name string
		run  func() error
	}{
		{"go-redis", func() error { return gs.Run(ctx, gr, []string{"k"}, 1).Err() }},
		{"rueidis", func() error { return rs.Exec(ctx, rc, []string{"k"}, []string{"1"}).Error() }},
	}
	for _, cl := range clients {
		for _, mode := range []string{"sequential", "16-goroutines"} {
			b.Run(cl.name+"/"+mode, func(b *testing.B) {
				b.ReportAllocs()
				if mode == "sequential" {
					for range b.N {
						if err := cl.run(); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := cl.run(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
