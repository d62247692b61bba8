package outboundredis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/internal/redistest"
	outboundredis "github.com/outboundhq/outbound/redis"
)

func client(t testing.TB, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newLimiter(t testing.TB, cfg outboundredis.Config) *outboundredis.Limiter {
	t.Helper()
	if cfg.Degraded == (outboundredis.Degraded{}) {
		cfg.Degraded.Reject = true
	}
	if cfg.Timeout == 0 {
		// A test about something else than a slow Redis must not fail on a
		// busy machine (the race detector, the other tests): the first take
		// of a client dials and loads the script.
		cfg.Timeout = 5 * time.Second
	}
	l, err := outboundredis.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// takeAll takes from g until it refuses, and returns how many it took.
func takeAll(t *testing.T, g admission.RateGuard) int {
	t.Helper()
	for n := 0; ; n++ {
		switch err := g.Take(context.Background()); {
		case errors.Is(err, ratelimit.ErrLimited):
			return n
		case err != nil:
			t.Fatalf("take %d: %v", n+1, err)
		case n > 10000:
			t.Fatal("no limit")
		}
	}
}

// Two processes' Limiters (two clients each, one Redis) admit the burst
// once between them, for each upstream, and refuse the rest.
func TestTheFleetAdmitsTheBurstOnceAcrossProcesses(t *testing.T) {
	srv := redistest.Start(t)
	for _, leased := range []int{0, 4} {
		cfg := outboundredis.Config{PerSecond: 1.0 / 3600, Burst: 20, Prefix: "t" + string(rune('a'+leased)) + ":",
			Lease: outboundredis.Lease{Max: leased}}
		cfg.Client = client(t, srv.Addr())
		a := newLimiter(t, cfg)
		cfg.Client = client(t, srv.Addr())
		b := newLimiter(t, cfg)
		for _, up := range []string{"https://one.example:443", "https://two.example:443"} {
			ga, gb := a.For(up), b.For(up)
			got := 0
			for range 15 {
				if ga.Take(context.Background()) == nil {
					got++
				}
			}
			got += takeAll(t, gb) + takeAll(t, ga)
			if got != 20 {
				t.Errorf("lease %d, %s: the fleet admitted %d, want the burst of 20", leased, up, got)
			}
		}
	}
}

func TestARefundedTokenIsAdmittedAgain(t *testing.T) {
	srv := redistest.Start(t)
	for _, leased := range []int{0, 8} {
		l := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1.0 / 3600, Burst: 5,
			Prefix: strings.Repeat("r", leased+1) + ":", Lease: outboundredis.Lease{Max: leased}})
		g := l.For("up")
		if n := takeAll(t, g); n != 5 {
			t.Fatalf("lease %d: took %d, want 5", leased, n)
		}
		g.Refund()
		g.Refund()
		if n := takeAll(t, g); n != 2 {
			t.Fatalf("lease %d: after two refunds took %d, want 2", leased, n)
		}
	}
}

// Tokens leased and not used go back to Redis: on Close at once, and after
// Hold by themselves, where the other processes can take them.
func TestLeasedTokensNotUsedAreGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	cfg := outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1.0 / 3600, Burst: 100,
		Lease: outboundredis.Lease{Max: 10, Hold: 50 * time.Millisecond}}
	leaser := newLimiter(t, cfg)
	cfg.Lease = outboundredis.Lease{}
	other := newLimiter(t, cfg)
	// A busy process leases a full batch.
	g := leaser.For("up")
	for range 30 {
		if err := g.Take(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if m := leaser.Metrics(); m.RoundTrips >= 30 {
		t.Fatalf("%d round trips for 30 takes: leasing is not working", m.RoundTrips)
	}
	// Given back after Hold, by the sweep: the other process can take all
	// that the busy one did not use.
	deadline := time.Now().Add(10 * time.Second)
	for leaser.Metrics().Held != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still %d held tokens long after Hold", leaser.Metrics().Held)
		}
		time.Sleep(10 * time.Millisecond) // waiting for the sweep, not asserting its timing
	}
	if n := takeAll(t, other.For("up")); n != 70 {
		t.Fatalf("the other process took %d, want the 70 the busy one did not use", n)
	}
	// On Close: the tokens a process holds go back at once.
	cfg.Prefix, cfg.Lease = "close:", outboundredis.Lease{Max: 10, Hold: time.Hour}
	closer := newLimiter(t, cfg)
	gc := closer.For("up")
	for range 5 {
		if err := gc.Take(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if closer.Metrics().Held == 0 {
		t.Fatal("nothing held after 5 quick takes: leasing is not working")
	}
	if err := closer.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Lease = outboundredis.Lease{}
	third := newLimiter(t, cfg)
	if n := takeAll(t, third.For("up")); n != 95 {
		t.Fatalf("after Close a third process took %d, want the 95 the closed one did not use", n)
	}
}

// Regression: refunds were not capped, so three refunds on a full bucket
// made the next burst 8 where the burst is 5. A refund counts only for a
// token handed out within the last Hold.
func TestRefundsNeverExceedTheTokensTaken(t *testing.T) {
	srv := redistest.Start(t)
	for _, leased := range []int{0, 8} {
		l := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1.0 / 3600, Burst: 5,
			Prefix: fmt.Sprintf("cap%d:", leased), Lease: outboundredis.Lease{Max: leased}})
		g := l.For("up")
		for range 3 {
			g.Refund() // nothing was taken
		}
		if n := takeAll(t, g); n != 5 {
			t.Fatalf("lease %d: after 3 refunds of nothing, took %d, want the burst of 5", leased, n)
		}
		for range 3 {
			g.Refund() // 5 were taken: these count
		}
		g.Refund() // four of the five taken: all count
		if n := takeAll(t, g); n != 4 {
			t.Fatalf("lease %d: after 4 refunds of 5 tokens taken, took %d, want 4", leased, n)
		}
		if m := l.Metrics(); m.Dropped != 3 {
			t.Fatalf("lease %d: %d refunds dropped, want 3", leased, m.Dropped)
		}
	}
}

func TestConfigurationErrorsNameTheField(t *testing.T) {
	srv := redistest.Start(t)
	c := client(t, srv.Addr())
	for _, tc := range []struct {
		cfg  outboundredis.Config
		want string
	}{
		{outboundredis.Config{PerSecond: 1, Degraded: outboundredis.Degraded{Reject: true}}, "Config.Client is required"},
		{outboundredis.Config{Client: c, Degraded: outboundredis.Degraded{Reject: true}}, "Config.PerSecond"},
		{outboundredis.Config{Client: c, PerSecond: 1, Burst: -1, Degraded: outboundredis.Degraded{Reject: true}}, "Config.Burst"},
		{outboundredis.Config{Client: c, PerSecond: 1}, "Config.Degraded.Share"},
		{outboundredis.Config{Client: c, PerSecond: 1, Degraded: outboundredis.Degraded{Share: 1.5}}, "Config.Degraded.Share"},
		{outboundredis.Config{Client: c, PerSecond: 1, Degraded: outboundredis.Degraded{Share: 0.5, Reject: true}}, "Config.Degraded.Share"},
		{outboundredis.Config{Client: c, PerSecond: 1, Lease: outboundredis.Lease{Max: -1}, Degraded: outboundredis.Degraded{Reject: true}}, "Config.Lease.Max"},
		{outboundredis.Config{Client: c, PerSecond: 2e6, Degraded: outboundredis.Degraded{Reject: true}}, "Config.PerSecond"},
	} {
		_, err := outboundredis.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want one naming %s", err, tc.want)
		}
	}
}

// events records a Limiter's switches of mode.
type events struct {
	mu sync.Mutex
	es []outboundredis.Event
}

func (e *events) on(ev outboundredis.Event) { e.mu.Lock(); e.es = append(e.es, ev); e.mu.Unlock() }

func (e *events) all() []outboundredis.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]outboundredis.Event(nil), e.es...)
}

func (e *events) modes() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var s []string
	for _, ev := range e.es {
		s = append(s, ev.Mode.String())
	}
	return strings.Join(s, " ")
}

// waitFor polls cond (a background probe switching modes) for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond) // waiting for a probe, not asserting its timing
	}
}

// A Redis that is killed, or that stops answering, under load: every
// admission still decides within Timeout, the Limiter switches to degraded
// mode and keeps the local share's bound there, and comes back to the
// fleet's limit by itself, each switch an event.
func TestARedisDownOrSlowDegradesWithinTheTimeoutAndComesBack(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	var ev events
	l := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1000, Burst: 1000,
		Timeout: timeout, OnEvent: ev.on, Degraded: outboundredis.Degraded{Share: 0.01, RetryEvery: 20 * time.Millisecond}})
	g := l.For("up")
	var slowest atomic.Int64
	var errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 { // the load, through both faults
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := timedTake(g, &slowest)
				if err != nil && !errors.Is(err, ratelimit.ErrLimited) {
					errs.Add(1)
				}
				time.Sleep(time.Millisecond) // a client's pace
			}
		})
	}
	faults := []struct {
		name       string
		make, undo func()
	}{
		{"killed", srv.Kill, srv.Restart},
		{"paused", srv.Pause, srv.Resume},
	}
	for _, f := range faults {
		waitFor(t, f.name+": fleet mode before the fault", func() bool { return l.Mode() == outboundredis.ModeFleet })
		local := l.Metrics().Local
		f.make()
		waitFor(t, f.name+": degraded mode", func() bool { return l.Mode() == outboundredis.ModeDegraded })
		entered := time.Now()
		time.Sleep(300 * time.Millisecond) // load in degraded mode, not a wait for a state
		f.undo()
		waitFor(t, f.name+": the return to fleet mode", func() bool { return l.Mode() == outboundredis.ModeFleet })
		// The local share is 1% of the fleet's: a burst of 10, 10 per second.
		allowed := 10 + 10*time.Since(entered).Seconds() + 1
		if got := l.Metrics().Local - local; float64(got) > allowed {
			t.Errorf("%s: degraded mode admitted %d, above the local share's %.0f", f.name, got, allowed)
		}
	}
	close(stop)
	wg.Wait()
	if d := time.Duration(slowest.Load()); d > timeout+time.Second { // generous: the bound is the Timeout, not the machine's speed
		t.Errorf("an admission took %v, with a Timeout of %v", d, timeout)
	}
	if errs.Load() != 0 {
		t.Errorf("%d takes failed with an error other than the limit's", errs.Load())
	}
	if got := ev.modes(); got != "degraded fleet degraded fleet" {
		t.Fatalf("events: %s", got)
	}
	if m := l.Metrics(); m.Switches != 4 {
		t.Fatalf("metrics count %d switches, want 4", m.Switches)
	}
}

func TestFailClosedRejectsWithErrUnavailableWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	l := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1000,
		Degraded: outboundredis.Degraded{Reject: true, RetryEvery: 20 * time.Millisecond}})
	g := l.For("up")
	srv.Kill()
	for range 10 {
		if err := g.Take(context.Background()); !errors.Is(err, outboundredis.ErrUnavailable) {
			t.Fatalf("err = %v, want ErrUnavailable", err)
		}
	}
	srv.Restart()
	waitFor(t, "the return to fleet mode", func() bool { return l.Mode() == outboundredis.ModeFleet })
	if err := g.Take(context.Background()); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}

// The caller's own deadline is the caller's: a take that runs out of it
// says so, and does not take Redis for down.
func TestACallersDeadlineIsNotARedisFailure(t *testing.T) {
	srv := redistest.Start(t)
	l := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1000})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.For("up").Take(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if l.Mode() != outboundredis.ModeFleet {
		t.Fatal("a cancelled caller put the Limiter in degraded mode")
	}
}

// Against a 3-node cluster, each upstream's limit lives on the node of its
// hash tag and holds exactly, as on one server.
func TestTheFleetLimitHoldsOnACluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := client(t, cl.Addrs()...)
	l := newLimiter(t, outboundredis.Config{Client: c, PerSecond: 1.0 / 3600, Burst: 7, Timeout: time.Second})
	nodes := map[string]bool{}
	for _, name := range strings.Fields("payments search images mail maps video chat auth billing geo news shop") {
		up := "https://" + name + ".example:443"
		if n := takeAll(t, l.For(up)); n != 7 {
			t.Fatalf("%s: took %d, want 7", up, n)
		}
		nodes[nodeHolding(t, cl, "outbound:rate:{"+up+"}")] = true
	}
	if len(nodes) < 2 {
		t.Fatalf("12 upstreams' limits all on %v: the test does not exercise the cluster", nodes)
	}
}

// nodeHolding returns the address of the cluster node that holds key.
func nodeHolding(t *testing.T, cl *redistest.Cluster, key string) string {
	t.Helper()
	for _, addr := range cl.Addrs() {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true})
		if err != nil {
			t.Fatal(err)
		}
		n, _ := c.Do(context.Background(), c.B().Exists().Key(key).Build()).AsInt64()
		c.Close()
		if n == 1 {
			return addr
		}
	}
	t.Fatalf("no node holds %s", key)
	return ""
}

// debugSleep makes the server sleep for d (DEBUG SLEEP) from another
// connection: the commands sent meanwhile run after it, late.
func debugSleep(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	c := client(t, addr)
	go c.Do(context.Background(), c.B().Arbitrary("DEBUG", "SLEEP").Args(fmt.Sprint(d.Seconds())).Build())
	time.Sleep(20 * time.Millisecond) // the sleep has started; not a timing assertion
}

// Regression: a give-back whose round trip timed out was kept and given
// back again at the next sweep, although the script had run, late: the fleet
// then got those tokens twice or more.
func TestAGiveBackThatTimedOutIsNotGivenBackTwice(t *testing.T) {
	srv := redistest.Start(t)
	cfg := outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1.0 / 3600, Burst: 100, Timeout: 50 * time.Millisecond,
		Lease: outboundredis.Lease{Max: 10, Hold: 100 * time.Millisecond}, Degraded: outboundredis.Degraded{Reject: true}}
	l := newLimiter(t, cfg)
	g := l.For("up")
	for range 30 { // the lease grows to a batch of 10
		if err := g.Take(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// The sweeps during the sleep give the held tokens back: each times
	// out, and runs after the sleep.
	debugSleep(t, srv.Addr(), 600*time.Millisecond)
	probe := client(t, srv.Addr())
	waitFor(t, "the end of the server's sleep", func() bool {
		return probe.Do(context.Background(), probe.B().Ping().Build()).Error() == nil
	})
	time.Sleep(300 * time.Millisecond) // room for the sweeps after it; not a timing assertion
	l.Close()
	cfg.Lease, cfg.Prefix = outboundredis.Lease{}, ""
	other := newLimiter(t, cfg)
	if n := takeAll(t, other.For("up")); n > 70 {
		t.Fatalf("another process took %d, more than the 70 the busy one did not use: tokens given back twice", n)
	}
}

// slowProxy forwards TCP connections to addr, holding every chunk of the
// server's answers for delay: a Redis that answers, slowly.
func slowProxy(t *testing.T, addr string, delay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			go io.Copy(s, c)
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if err != nil {
						c.Close()
						return
					}
					time.Sleep(delay) // the slowness being simulated
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// Regression: a take that waited for another take's round trip could then
// wait for one more, each with a full Timeout: with Redis answering in 60 ms
// and a Timeout of 100 ms, admissions waited for several round trips.
func TestAnAdmissionWaitsForRedisAtMostTheTimeoutInAll(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	l := newLimiter(t, outboundredis.Config{Client: client(t, slowProxy(t, srv.Addr(), 60*time.Millisecond)),
		PerSecond: 1000, Burst: 1000, Timeout: timeout, Lease: outboundredis.Lease{Max: 64},
		Degraded: outboundredis.Degraded{Share: 0.5, RetryEvery: time.Hour}})
	g := l.For("up")
	var wg sync.WaitGroup
	var slowest atomic.Int64
	for range 20 { // a cold start: the first batch is of one token
		wg.Go(func() {
			timedTake(g, &slowest)
		})
	}
	wg.Wait()
	// The Timeout is the bound; 2.5× leaves room for a busy machine (seen:
	// 1.64× in a full run under the race detector), and is still below the
	// several round trips of 60 ms, each with a Timeout of its own, that
	// the bug let a take wait.
	if d := time.Duration(slowest.Load()); d > timeout*5/2 {
		t.Fatalf("an admission waited %v for Redis, with a Timeout of %v", d, timeout)
	}
}

// timedTake takes from g, raising slowest (nanoseconds) to how long it took
// if that is longer.
func timedTake(g admission.RateGuard, slowest *atomic.Int64) error {
	start := time.Now()
	err := g.Take(context.Background())
	d := int64(time.Since(start))
	for s := slowest.Load(); d > s && !slowest.CompareAndSwap(s, d); s = slowest.Load() {
	}
	return err
}
