package admission_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/admission/throttle"
	"github.com/outboundhq/outbound/internal/shard"
)

// FuzzPipelinePermitsAlwaysComeBack drives random sequences of acquisitions,
// local rejections, outcomes, releases, cancellations, panics, abandoned
// waits and clock jumps through one pipeline, then checks that nothing
// leaked: no permit outstanding, the bulkhead back to full capacity, every
// rate token of an attempt that never reached the wire refunded, and no
// HALF_OPEN trial slot lost, and the throttle's count holding exactly the
// attempts that reached the wire and the ones it refused. Each sequence runs
// three times: with the rate limiter and the bulkhead as built; with them
// striped over per-processor cells, as they are after contention; and with
// the client-side throttle on and the bulkhead's limit adaptive.
func FuzzPipelinePermitsAlwaysComeBack(f *testing.F) {
	for _, seed := range []string{
		"\x00\x01\x00\x02\x00\x03\x00\x04",
		"\x00\x00\x00\x02\x02\x02\x02\x08\x0a\x00\x00\x00\x01\x01",
		"\x00\x00\x02\x02\x00\x00\x02\x02\x08\x0b\x00\x00\x00\x05\x06\x07\x03\x03",
		"\x05\x05\x05\x06\x07\x00\x00\x00\x09\x09\x08\xff\x00\x01",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		for _, m := range []fuzzMode{asBuilt, striped, adaptive} {
			synctest.Test(t, func(t *testing.T) { runOps(t, ops, m) })
		}
	})
}

const fuzzBurst = 40

type fuzzMode int

const (
	asBuilt fuzzMode = iota
	striped
	adaptive // with the throttle on and an adaptive bulkhead
)

func runOps(t *testing.T, ops []byte, mode fuzzMode) {
	r := &recorder{}
	restore := shard.Force(mode == striped)
	defer restore()
	cfg := admission.Config{
		Upstream: "fuzz",
		Circuit: circuit.Config{WindowSize: 4, MinimumCalls: 4, WaitInOpen: 10 * time.Second,
			PermittedCallsInHalfOpen: 2, MaxWaitInHalfOpen: 40 * time.Second},
		// Practically no refill during a sequence (at most a few hours of
		// fake time), so the tokens left are exactly the burst minus the
		// tokens of attempts that reached the wire.
		Rate:     ratelimit.Config{PerSecond: 1.0 / (1000 * 3600), Burst: fuzzBurst},
		Bulkhead: bulkhead.Config{MaxConcurrent: 2, MaxWait: time.Second},
		OnEvent:  r.on,
	}
	if mode == adaptive {
		cfg.Bulkhead.Adaptive, cfg.Bulkhead.MinConcurrent = true, 1
		// A window far longer than a sequence: the counts are exact.
		cfg.Throttle = throttle.Config{Enabled: true, K: 1, Window: 1000 * time.Hour}
	}
	p := mustPipeline(t, cfg)
	var held []admission.Permit
	spent := 0    // tokens of attempts that reached the wire
	declined := 0 // of them, answers that declined the attempt (a 429)
	pop := func() *admission.Permit {
		if len(held) == 0 {
			return nil
		}
		pm := &held[0]
		held = held[1:]
		return pm
	}
	lostOrFailure := func(pm *admission.Permit) { // a Failure, or as often a Lost
		if spent%2 == 0 {
			pm.Lost(time.Millisecond)
		} else {
			pm.Failure(time.Millisecond)
		}
	}
	for i := 0; i < len(ops); i++ {
		switch ops[i] % 10 {
		case 0: // an attempt is admitted or rejected
			if pm, err := p.Acquire(context.Background()); err == nil {
				held = append(held, pm)
			}
		case 1, 2, 3, 4: // the oldest attempt ends
			pm := pop()
			if pm == nil {
				continue
			}
			switch ops[i] % 10 {
			case 1:
				if spent%3 == 0 {
					pm.Declined(time.Millisecond)
					declined++
				} else {
					pm.Success(time.Millisecond)
				}
				spent++
			case 2:
				lostOrFailure(pm)
				spent++
			case 3:
				pm.Release()
				spent++
			case 4:
				pm.Cancel()
			}
			pm.Release() // resolving again changes nothing
		case 5: // the call panics; the deferred Release cleans up
			func() {
				defer func() { _ = recover() }()
				pm, err := p.Acquire(context.Background())
				if err == nil {
					spent++
				}
				defer pm.Release()
				panic("call panicked")
			}()
		case 6: // the caller has already given up
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if pm, err := p.Acquire(ctx); err == nil {
				held = append(held, pm)
			}
		case 7: // the caller gives up while waiting for the bulkhead
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			if pm, err := p.Acquire(ctx); err == nil {
				held = append(held, pm)
			}
			cancel()
		case 8, 9: // time passes
			d := time.Second
			if i+1 < len(ops) {
				i++
				d = time.Duration(ops[i]) * time.Second / 4
			}
			time.Sleep(d)
			synctest.Wait()
		}
	}
	for pm := pop(); pm != nil; pm = pop() {
		pm.Release()
		spent++
	}

	n := checkBalanced(t, p, r.take())
	if got, want := p.Bulkhead().InUse(), 0; got != want {
		t.Fatalf("bulkhead in use %d", got)
	}
	if got, want := p.Limiter().Available(), max(0, fuzzBurst-spent); got != want {
		t.Fatalf("tokens available %d, want %d (%d spent): a token was not refunded, or refunded twice", got, want, spent)
	}
	if got := n["rate-enter"] - n["rate-exit(refund)"]; got != spent {
		t.Fatalf("%d tokens kept by the events, %d attempts reached the wire", got, spent)
	}
	if th := p.Throttle(); th != nil {
		// Counted: the attempts it let through, less those a later guard
		// refused or that said nothing of the upstream; and those it refused.
		req, acc := th.Counts()
		want := n["throttle-enter"] + n["throttle-reject"] - n["throttle-exit(refund)"]
		if accepted := n["circuit-exit(success)"] - declined; req != int64(want) || acc != int64(accepted) {
			t.Fatalf("throttle counts %d requests and %d accepts, want %d and %d (%v)", req, acc, want, accepted, n)
		}
		if got := n["throttle-enter"]; got != n["throttle-exit"]+n["throttle-exit(refund)"] {
			t.Fatalf("throttle: %d entered, %d exited, %d refunded", got, n["throttle-exit"], n["throttle-exit(refund)"])
		}
	}
	if l := p.Bulkhead().Limit(); l < 1 || l > 2 {
		t.Fatalf("bulkhead limit %d out of [1, 2]", l)
	}
	m := p.Breaker().Metrics()
	if m.TrialsInFlight != 0 {
		t.Fatalf("HALF_OPEN trial slots lost: %+v", m)
	}
	if m.State == circuit.HalfOpen {
		// Every free trial slot can still be taken.
		for range 2 - m.Calls {
			if _, err := p.Breaker().Allow(); err != nil {
				t.Fatalf("a trial slot is missing: %v (%+v)", err, m)
			}
		}
	}
}
