package attempt

import (
	"context"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/outboundhq/outbound/internal/clock"
)

type fiveNames struct{}

func (fiveNames) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3"), netip.MustParseAddr("127.0.0.4"), netip.MustParseAddr("127.0.0.5"), netip.MustParseAddr("127.0.0.6")}, nil
}

// fiveEndpoints is an endpoint set of five addresses, looked up, and a
// function doing what Endpoints adds to an attempt: the pick of one of
// them and the record of its answer.
func fiveEndpoints(b *testing.B) func() {
	t, err := New(Config{Endpoints: &Endpoints{Resolver: fiveNames{}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(t.Close)
	s := &endpointSet{t: t, scheme: "http", addr: "svc:80", host: "svc", port: "80"}
	s.resolve(context.Background())
	ctx := context.Background()
	return func() {
		var e Elsewhere
		ep := s.pick(ctx, clock.Now(), &e, nil)
		e.add(ep)
		ep.inflight.Add(1)
		ep.inflight.Add(-1)
		ep.answered(clock.Now(), 100_000, false)
	}
}

// BenchmarkPickAndAnswer is what Endpoints adds to an attempt, from every
// processor at once: they share the five endpoints' counters.
func BenchmarkPickAndAnswer(b *testing.B) {
	attempt := fiveEndpoints(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			attempt()
		}
	})
}

// BenchmarkPickAndAnswerSequential is what Endpoints adds to an attempt.
func BenchmarkPickAndAnswerSequential(b *testing.B) {
	attempt := fiveEndpoints(b)
	for b.Loop() {
		attempt()
	}
}

// The pick compares two endpoints' loads without reading the clock or,
// for answers close together, computing an exponential: decay is the
// exponential within 1e-9, and lighter orders two endpoints as their loads
// decayed to any moment do.
func TestThePickComparesLoadsAsTheirDecayedEstimatesDo(t *testing.T) {
	for _, dt := range []int64{-5e9, -1e9, -999_999, -1000, 0, 1, 1000, 999_999, 1e6, 3e7, 1e9, 7e9} {
		want := math.Exp(-float64(dt) / float64(ewmaDecay))
		if got := decay(dt); math.Abs(got-want) > 1e-9*want {
			t.Errorf("decay(%d) = %v, want %v", dt, got, want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		var a, b endpoint
		now := int64(r.IntN(10e9)) + 10e9
		a.ewma.Store(math.Float64bits(float64(r.IntN(1e8) + 1)))
		b.ewma.Store(math.Float64bits(float64(r.IntN(1e8) + 1)))
		a.stamp.Store(now - int64(r.IntN(int(5e9))) - 1)
		b.stamp.Store(now - int64(r.IntN(int(2e6))) - 1)
		a.inflight.Store(int32(r.IntN(4)))
		b.inflight.Store(int32(r.IntN(4)))
		la, lb := a.load(now, 0), b.load(now, 0)
		if math.Abs(la-lb) < 1e-6*max(la, lb) {
			continue // a tie within rounding
		}
		if got, want := a.lighter(&b), la < lb; got != want {
			t.Fatalf("lighter = %v, loads %v and %v", got, la, lb)
		}
	}
}

// An endpoint with an idle connection is picked over a lighter one without,
// within twice its load: otherwise each endpoint kept connections for the
// peaks of its share of the attempts (26 connections for 16 callers over
// five endpoints, against 16 by name). Beyond twice, the load decides.
func TestThePickTakesAnEndpointWithAnIdleConnectionWithinTwiceTheLoad(t *testing.T) {
	tr, err := New(Config{Endpoints: &Endpoints{Resolver: fiveNames{}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	now := clock.Now()
	mk := func(inflight int32, idle int32) *endpoint {
		ep := &endpoint{dialAddr: "x"}
		ep.ewma.Store(math.Float64bits(100_000))
		ep.stamp.Store(now)
		ep.inflight.Store(inflight)
		p := &pool{}
		p.idleN.Store(idle)
		ep.pool.Store(p)
		return ep
	}
	for _, tc := range []struct {
		warmInflight int32
		wantWarm     bool
	}{{0, true}, {1, true}, {2, false}, {5, false}} {
		cold, warm := mk(0, 0), mk(tc.warmInflight, 1)
		s := &endpointSet{t: tr}
		eps := []*endpoint{cold, warm}
		s.eps.Store(&eps)
		s.resolvedAt.Store(now)
		for range 20 {
			got := s.pick(context.Background(), now, nil, nil)
			if (got == warm) != tc.wantWarm {
				t.Fatalf("warm endpoint with %d in flight against a cold idle one: picked the warm one: %v, want %v", tc.warmInflight, got == warm, tc.wantWarm)
			}
		}
	}
}
