package outboundredis_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/internal/redistest"
	outboundredis "github.com/outboundhq/outbound/redis"
)

// Slow is not down: a Redis whose answers come after the Timeout — as they
// do to a process short of processor time, which reads them late — refuses
// the takes that waited in vain (ErrNoAnswer, a local rejection: the token
// may have been counted, refusing admits less), but it answers the check
// that follows within Degraded.Confirm, so the Limiter never switches to
// degraded mode, whose local share would admit on top of what the fleet
// takes.
func TestASlowAnswerIsNotARedisThatIsDown(t *testing.T) {
	srv := redistest.Start(t)
	for _, leased := range []int{0, 16} {
		t.Run(fmt.Sprintf("lease=%d", leased), func(t *testing.T) {
			var ev events
			l := newLimiter(t, outboundredis.Config{Client: client(t, slowProxy(t, srv.Addr(), 40*time.Millisecond)),
				PerSecond: 1000, Burst: 1000, Timeout: 20 * time.Millisecond, Lease: outboundredis.Lease{Max: leased},
				Prefix: fmt.Sprintf("slow%d:", leased), OnEvent: ev.on,
				Degraded: outboundredis.Degraded{Share: 0.5, Confirm: time.Second}})
			g := l.For("up")
			// Eight callers at once: a check that shared their connection
			// was failed by their deadlines, again and again, and the
			// Limiter switched although Redis answered every take.
			var noAnswer atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 100 {
						err := g.Take(context.Background())
						switch {
						case errors.Is(err, outboundredis.ErrNoAnswer):
							if !errors.Is(err, ratelimit.ErrLimited) {
								t.Error("ErrNoAnswer is not a local rejection")
							}
							noAnswer.Add(1)
						case err != nil:
							t.Errorf("take: %v", err)
						}
						time.Sleep(2 * time.Millisecond) // a caller's pace, not a timing assertion
					}
				})
			}
			wg.Wait()
			if noAnswer.Load() == 0 {
				t.Fatal("every take was answered within the Timeout: the slowness was not reproduced")
			}
			time.Sleep(100 * time.Millisecond) // the checks answer (40 ms); not a timing assertion
			if m := l.Metrics(); m.Switches != 0 || m.Mode != outboundredis.ModeFleet || m.Local != 0 {
				t.Fatalf("a slow Redis switched the Limiter: %+v, events %s", m, ev.modes())
			}
		})
	}
}

// A Redis that stops answering altogether (SIGSTOP) is down: the check that
// follows a take without an answer gets none within Degraded.Confirm, and the
// Limiter switches to degraded mode; it comes back once Redis answers.
func TestARedisThatAnswersNothingIsDownAfterTheCheck(t *testing.T) {
	srv := redistest.Start(t)
	var ev events
	l := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: 1000, Timeout: 20 * time.Millisecond,
		OnEvent: ev.on, Degraded: outboundredis.Degraded{Share: 0.5, Confirm: 100 * time.Millisecond, RetryEvery: 20 * time.Millisecond}})
	g := l.For("up")
	if err := g.Take(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	if err := g.Take(context.Background()); !errors.Is(err, outboundredis.ErrNoAnswer) {
		t.Fatalf("a take from a stopped Redis: %v, want ErrNoAnswer", err)
	}
	waitFor(t, "degraded mode", func() bool { return l.Mode() == outboundredis.ModeDegraded })
	srv.Resume()
	waitFor(t, "fleet mode", func() bool { return l.Mode() == outboundredis.ModeFleet })
	if got := ev.modes(); got != "degraded fleet" {
		t.Fatalf("events: %s", got)
	}
}

// Degraded mode per key and per cause: a key of the wrong type under one
// upstream's limit (WRONGTYPE) is an error about that key, not a Redis out
// of reach. That upstream alone is degraded, and the event names it; the
// others keep the fleet's limit on Redis; once the key is fixed, the probe —
// which asks that key — brings it back.
func TestAWrongTypedKeyDegradesItsUpstreamOnly(t *testing.T) {
	srv := redistest.Start(t)
	c := client(t, srv.Addr())
	var ev events
	l := newLimiter(t, outboundredis.Config{Client: c, PerSecond: 1000, Prefix: "wt:", OnEvent: ev.on,
		Degraded: outboundredis.Degraded{Reject: true, RetryEvery: 20 * time.Millisecond}})
	bad, good := l.For("https://bad:443"), l.For("https://good:443")
	key := "wt:{https://bad:443}"
	if err := c.Do(context.Background(), c.B().Lpush().Key(key).Element("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := bad.Take(context.Background()); !errors.Is(err, outboundredis.ErrUnavailable) {
		t.Fatalf("the upstream with the wrong-typed key: %v, want ErrUnavailable", err)
	}
	for i := range 100 {
		if err := good.Take(context.Background()); err != nil {
			t.Fatalf("take %d of a healthy upstream: %v", i, err)
		}
	}
	es := ev.all()
	if len(es) != 1 || es[0].Upstream != "https://bad:443" || es[0].Mode != outboundredis.ModeDegraded ||
		es[0].Err == nil || !strings.HasPrefix(es[0].Err.Error(), "WRONGTYPE") || l.Mode() != outboundredis.ModeFleet {
		t.Fatalf("events %+v, mode %v: want the bad upstream alone degraded", es, l.Mode())
	}
	if m := l.Metrics(); m.KeysDown != 1 {
		t.Fatalf("%d keys down, want 1", m.KeysDown)
	}
	if err := c.Do(context.Background(), c.B().Del().Key(key).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bad upstream back in fleet mode", func() bool { return l.Metrics().KeysDown == 0 })
	if err := bad.Take(context.Background()); err != nil {
		t.Fatalf("after the key was fixed: %v", err)
	}
}

// The bound holds across episodes: a degraded episode's local share starts
// empty — a Redis that flaps must not hand each episode a fresh burst — and
// what it admitted is charged to Redis when it comes back, so the fleet's
// limit counts it.
func TestADegradedEpisodeStartsEmptyAndIsChargedToRedis(t *testing.T) {
	srv := redistest.Start(t)
	const rate, share = 100.0, 0.5
	l := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: rate, Burst: 100, Prefix: "ep:",
		Degraded: outboundredis.Degraded{Share: share, RetryEvery: 20 * time.Millisecond}})
	g := l.For("up")
	srv.Kill() // refused connections: degraded at once
	start := time.Now()
	for time.Since(start) < 400*time.Millisecond {
		g.Take(context.Background())
		time.Sleep(time.Millisecond) // a caller's pace, not a timing assertion
	}
	local := l.Metrics().Local
	// Empty at the start: no burst, only the share's rate (50/s) for the
	// time degraded; with a full start it would be 50 more.
	if limit := share*rate*time.Since(start).Seconds() + 2; float64(local) > limit {
		t.Fatalf("degraded mode admitted %d in %v, above the share's %.0f without a burst", local, time.Since(start), limit)
	}
	if local == 0 {
		t.Fatal("degraded mode admitted nothing")
	}
	srv.Restart()
	waitFor(t, "fleet mode", func() bool { return l.Mode() == outboundredis.ModeFleet })
	if m := l.Metrics(); m.Charged != local {
		t.Fatalf("charged %d to Redis, want the %d admitted locally", m.Charged, local)
	}
	// The restarted Redis lost its data: its bucket held the burst of 100,
	// less what was charged.
	other := newLimiter(t, outboundredis.Config{Client: client(t, srv.Addr()), PerSecond: rate, Burst: 100, Prefix: "ep:"})
	if n := takeAll(t, other.For("up")); n > 100-int(local)+5 {
		t.Fatalf("after the charge another process took %d, want at most %d (100 less the %d charged, and the refill since)", n, 100-int(local)+5, local)
	}
}

// A check is failed only by Redis: rueidis puts the deadline of a command
// that finds its connection idle on the connection itself, and when that
// deadline passes every command queued behind it fails at once, with the
// same "context deadline exceeded", long before its own deadline. A check
// queued behind a short command of another user of the client, while Redis
// is paused for less than Degraded.Confirm, must not take Redis for down.
func TestACheckIsNotFailedByTheDeadlineOfAnotherCommand(t *testing.T) {
	srv := redistest.Start(t)
	c := client(t, srv.Addr())
	var ev events
	l := newLimiter(t, outboundredis.Config{Client: c, PerSecond: 1000, Burst: 1000, Timeout: 10 * time.Millisecond,
		OnEvent: ev.on, Degraded: outboundredis.Degraded{Share: 0.5, Confirm: 2 * time.Second}})
	g := l.For("up")
	if err := g.Take(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	resumed := time.AfterFunc(300*time.Millisecond, srv.Resume) // well within Confirm
	defer resumed.Stop()
	// A command alone on the connection: its deadline becomes the
	// connection's.
	short := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 80*time.Millisecond)
		defer cancel()
		short <- c.Do(ctx, c.B().Ping().Build()).Error()
	}()
	time.Sleep(5 * time.Millisecond) // the short command goes first; not a timing assertion
	if err := g.Take(context.Background()); !errors.Is(err, outboundredis.ErrNoAnswer) {
		t.Fatalf("a take from a paused Redis: %v, want ErrNoAnswer", err)
	}
	if err := <-short; err == nil {
		t.Fatal("the short command was answered: the pause was not reproduced")
	}
	time.Sleep(600 * time.Millisecond) // Redis is back and the check answered; not a timing assertion
	if m := l.Metrics(); m.Switches != 0 || m.Mode != outboundredis.ModeFleet {
		t.Fatalf("the check was failed by another command's deadline: %+v, events %s", m, ev.modes())
	}
}
