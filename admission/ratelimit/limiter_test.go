package ratelimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func mustNew(t *testing.T, cfg Config) *Limiter {
	t.Helper()
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

const sec = int64(time.Second)

// step is one operation at a fixed instant: take a token, or refund one.
type step struct {
	at     int64 // nanoseconds from the start
	refund bool
	ok     bool // for a take: whether it is admitted
}

func run(t *testing.T, l *Limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		if s.refund {
			l.Refund()
			continue
		}
		if got := l.take(s.at); got != s.ok {
			t.Fatalf("step %d (take at %v): got %v, want %v", i, time.Duration(s.at), got, s.ok)
		}
	}
}

func TestAdmitsTheBurstThenTheRate(t *testing.T) {
	l := mustNew(t, Config{PerSecond: 2, Burst: 3}) // one token every 500 ms
	run(t, l, []step{
		{at: 0, ok: true}, {at: 0, ok: true}, {at: 0, ok: true}, {at: 0, ok: false},
		{at: sec/2 - 1, ok: false}, {at: sec / 2, ok: true}, {at: sec / 2, ok: false},
		{at: 10 * sec, ok: true}, {at: 10 * sec, ok: true}, {at: 10 * sec, ok: true}, // refilled to the burst, not beyond
		{at: 10 * sec, ok: false},
	})
}

func TestRefundGivesBackExactlyOneToken(t *testing.T) {
	l := mustNew(t, Config{PerSecond: 1, Burst: 2})
	run(t, l, []step{
		{at: 0, ok: true}, {at: 0, ok: true}, {at: 0, ok: false},
		{refund: true}, {at: 0, ok: true}, {at: 0, ok: false},
	})
}

func TestRefundsNeverRaiseTheBurst(t *testing.T) {
	l := mustNew(t, Config{PerSecond: 1, Burst: 2})
	for range 10 {
		l.Refund() // refunds of an idle limiter are lost, not banked
	}
	run(t, l, []step{{at: 5 * sec, ok: true}, {at: 5 * sec, ok: true}, {at: 5 * sec, ok: false}})
}

func TestBurstDefaultsToOneSecondOfRate(t *testing.T) {
	for _, tc := range []struct {
		rate float64
		want int
	}{{10, 10}, {0.5, 1}, {2.5, 3}} {
		l := mustNew(t, Config{PerSecond: tc.rate})
		if got := l.availableAt(0); got != tc.want {
			t.Errorf("rate %v: burst %d, want %d", tc.rate, got, tc.want)
		}
	}
}

func TestZeroRateMeansNoLimit(t *testing.T) {
	l := mustNew(t, Config{})
	if l != nil {
		t.Fatal("zero Config built a limiter")
	}
	for range 1000 {
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	l.Refund()
}

func TestRejectsAtOnceWithoutMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{PerSecond: 1, Burst: 1})
		ctx := context.Background()
		if err := l.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := l.Acquire(ctx); !errors.Is(err, ErrLimited) {
			t.Fatalf("err = %v, want ErrLimited", err)
		}
		if time.Since(start) != 0 {
			t.Fatal("a rejection without MaxWait waited")
		}
	})
}

func TestWaitsForATokenWithinMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{PerSecond: 1, Burst: 1, MaxWait: 2 * time.Second})
		ctx := context.Background()
		_ = l.Acquire(ctx)
		start := time.Now()
		if err := l.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Fatalf("waited %v, want 1s", waited)
		}
	})
}

func TestRejectsWhenTheTokenComesAfterMaxWait(t *testing.T) {
	l := mustNew(t, Config{PerSecond: 1, Burst: 1, MaxWait: 2 * time.Second})
	ctx := context.Background()
	run(t, l, []step{{at: 0, ok: true}})
	for i, want := range []int64{1 * sec, 2 * sec} {
		if wait, ok := l.reserve(0, ctx); !ok || wait != want {
			t.Fatalf("reservation %d: wait %v ok %v, want %v", i, time.Duration(wait), ok, time.Duration(want))
		}
	}
	if _, ok := l.reserve(0, ctx); ok {
		t.Fatal("the token 3 s away was promised with MaxWait 2 s")
	}
}

func TestWaitEndsWithTheContextAndRefunds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{PerSecond: 1, Burst: 1, MaxWait: 10 * time.Second})
		_ = l.Acquire(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- l.Acquire(ctx) }()
		synctest.Wait()
		cancel()
		if err := <-done; err != context.Canceled {
			t.Fatalf("err = %v, want context.Canceled unchanged", err)
		}
		time.Sleep(time.Second)
		if got := l.Available(); got != 1 {
			t.Fatalf("available after the cancelled wait = %d, want 1 (token refunded)", got)
		}
	})
}

func TestDoesNotWaitPastTheContextDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{PerSecond: 1, Burst: 1, MaxWait: 10 * time.Second})
		_ = l.Acquire(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := l.Acquire(ctx); !errors.Is(err, ErrLimited) {
			t.Fatalf("err = %v, want ErrLimited", err)
		}
		if time.Since(start) != 0 {
			t.Fatal("waited for a token that comes after the deadline")
		}
	})
}

func TestInvalidConfigFailsWithTheFieldName(t *testing.T) {
	for _, tc := range []struct {
		field string
		cfg   Config
	}{
		{"PerSecond", Config{PerSecond: -1}},
		{"PerSecond", Config{PerSecond: 2e9}},
		{"Burst", Config{PerSecond: 1, Burst: -1}},
		{"MaxWait", Config{PerSecond: 1, MaxWait: -1}},
		{"Burst", Config{Burst: 5}},
	} {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), "Config."+tc.field) {
			t.Errorf("New(%+v) = %v, want an error naming Config.%s", tc.cfg, err, tc.field)
		}
	}
}
