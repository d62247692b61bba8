package attempt_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest/testkit"
)

// fleetOf makes a fleet of n replicas behind "svc.test:80", all answering
// 200, and an Attempter that spreads over them with ejection e (and
// cfg.Endpoints.OnEject, if set).
func fleetOf(t *testing.T, n int, e attempt.Ejection, cfg attempt.Config) (*testkit.Fleet, *attempt.Attempter, []string) {
	t.Helper()
	addrs := testkit.AddrPorts(testkit.Loopbacks(n), 80)
	f := testkit.NewFleet(addrs...)
	cfg.HTTPTransport = &http.Transport{DialContext: f.Dial}
	var onEject func(string, string, time.Duration)
	if cfg.Endpoints != nil {
		onEject = cfg.Endpoints.OnEject
	}
	cfg.Endpoints = &attempt.Endpoints{Resolver: testkit.Names{"svc.test": testkit.Loopbacks(n)}, Ejection: e, OnEject: onEject}
	tr, err := attempt.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return f, tr, addrs
}

// Without a reason to prefer one, attempts spread over every address of a
// host, each asked for the host by its name.
func TestAttemptsSpreadOverEveryEndpointOfAHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := fleetOf(t, 5, attempt.Ejection{}, attempt.Config{})
		for range 500 {
			if err := tryGet(tr, "http://svc.test/"); err != nil {
				t.Fatal(err)
			}
		}
		for _, a := range addrs {
			if n := f.Received(a); n < 50 {
				t.Errorf("%s got %d of 500 attempts", a, n)
			}
		}
		if h := f.Hosts(); len(h) != 1 || h[0] != "svc.test" {
			t.Errorf("Host headers seen: %v, want svc.test only", h)
		}
	})
}

// An endpoint that failed ConsecutiveFailures times in a row gets no
// attempt until its ejection is over, then gets attempts again; a second
// ejection lasts twice as long.
func TestAnEjectedEndpointGetsNoAttemptsUntilItsTimeIsUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var told []string
		f, tr, addrs := fleetOf(t, 5, attempt.Ejection{ConsecutiveFailures: 3, BaseTime: 10 * time.Second, MaxShare: 0.2},
			attempt.Config{Endpoints: &attempt.Endpoints{OnEject: func(key, ep string, d time.Duration) {
				mu.Lock()
				told = append(told, fmt.Sprintf("%s %s %v", key, ep, d))
				mu.Unlock()
			}}})
		sick := addrs[0]
		f.Set(sick, 503)
		for range 200 {
			tryGet(tr, "http://svc.test/")
		}
		if n := f.Received(sick); n != 3 {
			t.Fatalf("the 503 endpoint got %d attempts, want 3: ejected after its third failure", n)
		}
		time.Sleep(9 * time.Second)
		for range 100 {
			tryGet(tr, "http://svc.test/")
		}
		if n := f.Received(sick); n != 3 {
			t.Fatalf("%d attempts reached the endpoint before its ejection was over", n-3)
		}
		time.Sleep(2 * time.Second) // 11 s: the ejection is over
		for range 200 {
			tryGet(tr, "http://svc.test/")
		}
		if n := f.Received(sick); n != 6 {
			t.Fatalf("after its ejection the endpoint got %d attempts, want 3 more (then ejected again)", n-3)
		}
		time.Sleep(11 * time.Second) // the second ejection lasts 20 s
		for range 100 {
			tryGet(tr, "http://svc.test/")
		}
		if n := f.Received(sick); n != 6 {
			t.Fatalf("the second ejection let %d attempts through after 11 s", n-6)
		}
		mu.Lock()
		defer mu.Unlock()
		want := []string{"http://svc.test:80 " + sick + " 10s", "http://svc.test:80 " + sick + " 0s", "http://svc.test:80 " + sick + " 20s"}
		if strings.Join(told, ", ") != strings.Join(want, ", ") {
			t.Fatalf("OnEject told %q, want %q", told, want)
		}
	})
}

// metricsOnly has a breaker that never opens: the ejections alone keep
// attempts off the endpoints.
var metricsOnly = attempt.Config{Admission: admission.Config{Circuit: circuit.Config{StartState: circuit.MetricsOnly}}}

// However many endpoints fail, no more than MaxShare of them (at least one)
// are ejected at once, and never the last one: with every endpoint sick,
// the host's attempts still reach some, and the breaker decides.
func TestNeverMoreThanTheMaximumShareOfEndpointsIsEjected(t *testing.T) {
	for _, tc := range []struct {
		n, sick int
		share   float64
		want    int // ejected at most
	}{
		{5, 5, 0.1, 1}, {5, 5, 0.4, 2}, {10, 10, 0.5, 5}, {2, 2, 1, 1}, {3, 3, 1, 2},
	} {
		t.Run(fmt.Sprintf("%d of %d sick, share %v", tc.sick, tc.n, tc.share), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f, tr, addrs := fleetOf(t, tc.n, attempt.Ejection{ConsecutiveFailures: 2, MaxShare: tc.share}, metricsOnly)
				for _, a := range addrs[:tc.sick] {
					f.Set(a, 503)
				}
				for range 400 {
					tryGet(tr, "http://svc.test/")
				}
				f.Reset()
				for range 400 {
					tryGet(tr, "http://svc.test/")
				}
				reached := 0
				for _, a := range addrs {
					if f.Received(a) > 0 {
						reached++
					}
				}
				if ejected := tc.n - reached; ejected > tc.want || ejected < 1 {
					t.Fatalf("%d endpoints got no attempt, want between 1 and %d", ejected, tc.want)
				}
			})
		})
	}
}

// A host with one endpoint — or one whose other endpoints are ejected —
// is never ejected: its attempts go on, and the upstream's breaker decides.
func TestTheLastEndpointIsNeverEjected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := fleetOf(t, 2, attempt.Ejection{ConsecutiveFailures: 1, MaxShare: 1}, metricsOnly)
		f.Set(addrs[0], 503)
		f.Set(addrs[1], 503)
		for range 100 {
			tryGet(tr, "http://svc.test/")
		}
		f.Reset()
		for range 100 {
			tryGet(tr, "http://svc.test/")
		}
		if a, b := f.Received(addrs[0]), f.Received(addrs[1]); a+b != 100 || a != 0 && b != 0 {
			t.Fatalf("with both sick, they got %d and %d of 100: one ejected, the last one kept", a, b)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := fleetOf(t, 1, attempt.Ejection{ConsecutiveFailures: 1}, attempt.Config{})
		f.Set(addrs[0], 503)
		for range 50 {
			tryGet(tr, "http://svc.test/")
		}
		// One address is dialed by name, as without Endpoints: the fleet
		// refuses a name, so no attempt reached it, and none was ejected.
		if n := f.Received(addrs[0]); n != 0 {
			t.Fatalf("a one-address host was dialed by address (%d attempts)", n)
		}
	})
}

// What is not the endpoint's fault counts for nothing against it: a local
// rejection (the bulkhead full), the caller's cancellation, a body that
// fails to read. After many of them, the endpoint still takes attempts.
func TestClientFaultsAndLocalRejectionsEjectNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ejections atomic.Int64
		f, tr, addrs := fleetOf(t, 2, attempt.Ejection{ConsecutiveFailures: 1, MaxShare: 1},
			attempt.Config{Admission: admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}},
				Endpoints: &attempt.Endpoints{OnEject: func(string, string, time.Duration) { ejections.Add(1) }}})
		for _, a := range addrs {
			f.SetDelay(a, time.Second)
		}
		for range 20 {
			// The caller gives up after 100 ms, while a second call is
			// refused by the bulkhead; a third's body fails to read.
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc.test/", nil)
			done := make(chan error, 1)
			go func() {
				_, err := tr.RoundTrip(req)
				done <- err
			}()
			synctest.Wait()
			if err := tryGet(tr, "http://svc.test/"); !errors.Is(err, bulkhead.ErrFull) {
				t.Fatalf("a second call: %v, want the bulkhead full", err)
			}
			<-done
			cancel()
			time.Sleep(time.Second) // the replica's answer, to nobody
			bad, _ := http.NewRequest(http.MethodPost, "http://svc.test/", io.NopCloser(failing{}))
			if _, err := tr.RoundTrip(bad); err == nil {
				t.Fatal("a body that fails to read was sent")
			}
		}
		if n := ejections.Load(); n != 0 {
			t.Fatalf("%d ejections for faults that were not the endpoints'", n)
		}
		// And the control: failures of their own eject one.
		for _, a := range addrs {
			f.SetDelay(a, 0)
			f.Set(a, 503)
		}
		tryGet(tr, "http://svc.test/")
		if n := ejections.Load(); n != 1 {
			t.Fatalf("%d ejections after a 503, want 1", n)
		}
		time.Sleep(2 * time.Second) // the replicas end what they were given
	})
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errors.New("the caller's body failed") }

// A connection refused by one endpoint is made to another within the same
// attempt, as net/http's dialer tries each address of a host: the attempt
// succeeds, and the refusing endpoint is ejected after its failures.
func TestAConnectionRefusedByOneEndpointIsMadeToAnotherWithinTheAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := fleetOf(t, 3, attempt.Ejection{ConsecutiveFailures: 2, MaxShare: 0.5}, attempt.Config{})
		f.Set(addrs[0], 0) // refuses connections
		for i := range 100 {
			if err := tryGet(tr, "http://svc.test/"); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
		}
		refused := 0
		for _, d := range f.Dialed() {
			if d == addrs[0] {
				refused++
			}
		}
		if refused != 2 {
			t.Fatalf("the refusing endpoint was dialed %d times, want 2: ejected after its second refusal", refused)
		}
	})
}

// Every endpoint refusing: the attempt fails NotSent at the dial, with the
// last endpoint's error, having tried each once.
func TestAnAttemptTriesEachEndpointOnceBeforeItFailsToConnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := fleetOf(t, 3, attempt.Ejection{ConsecutiveFailures: -1}, attempt.Config{})
		for _, a := range addrs {
			f.Set(a, 0)
		}
		err := tryGet(tr, "http://svc.test/")
		var ce *classify.Error
		if !errors.As(err, &ce) || ce.Category != classify.NotSent || ce.Stage != classify.StageDial {
			t.Fatalf("err %v, want NotSent at the dial", err)
		}
		if d := f.Dialed(); len(d) != 3 {
			t.Fatalf("dialed %v, want each endpoint once", d)
		}
	})
}

// A host that resolves to one address, an IP address, or a name the
// resolver does not know, is dialed by name, exactly as without Endpoints:
// the user's DialContext is given the host's name.
func TestOneAddressIsDialedByNameAsWithoutEndpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := testkit.NewFleet("one.test:80", "unknown.test:80", "127.0.0.9:80")
		tr, err := attempt.New(attempt.Config{HTTPTransport: &http.Transport{DialContext: f.Dial},
			Endpoints: &attempt.Endpoints{Resolver: testkit.Names{"one.test": testkit.Loopbacks(1)}}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for _, u := range []string{"http://one.test/", "http://unknown.test/", "http://127.0.0.9/"} {
			if err := tryGet(tr, u); err != nil {
				t.Fatal(err)
			}
		}
		if want := "one.test:80 unknown.test:80 127.0.0.9:80"; strings.Join(f.Dialed(), " ") != want {
			t.Fatalf("dialed %q, want %q", f.Dialed(), want)
		}
	})
}

// A stalling endpoint is avoided: the power of two choices by peak-EWMA
// latency × attempts in flight sends almost nothing to an endpoint that
// takes 2 s while the others take 1 ms.
func TestASlowEndpointGetsFewAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := fleetOf(t, 5, attempt.Ejection{}, attempt.Config{})
		for _, a := range addrs {
			f.SetDelay(a, time.Millisecond)
		}
		f.SetDelay(addrs[0], 2*time.Second)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 100 {
					tryGet(tr, "http://svc.test/")
				}
			})
		}
		wg.Wait()
		if n := f.Received(addrs[0]); n > 16 {
			t.Fatalf("the slow endpoint got %d of 800 attempts", n)
		}
	})
}

// ejectionsTold collects what OnEject is told, as "endpoint duration".
type ejectionsTold struct {
	mu   sync.Mutex
	told []string
}

func (e *ejectionsTold) on(_, ep string, d time.Duration) {
	e.mu.Lock()
	e.told = append(e.told, fmt.Sprintf("%s %v", ep, d))
	e.mu.Unlock()
}

func (e *ejectionsTold) got() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.told)
}

// With SlowFactor set, an endpoint whose last five outcomes each took more
// than SlowFactor times the host's median latency (and more than SlowMin)
// is ejected, and then gets no attempt until its time is up; without it,
// the pick alone keeps attempts off it, and it keeps getting the few it
// sends to see whether it has recovered.
func TestAnEndpointFarSlowerThanTheOthersIsEjectedByLatencyWhenAskedTo(t *testing.T) {
	for _, factor := range []float64{0, 5} {
		t.Run(fmt.Sprint("SlowFactor=", factor), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var ej ejectionsTold
				f, tr, addrs := fleetOf(t, 5, attempt.Ejection{SlowFactor: factor, SlowMin: 50 * time.Millisecond, BaseTime: time.Minute},
					attempt.Config{Endpoints: &attempt.Endpoints{OnEject: ej.on}})
				for _, a := range addrs {
					f.SetDelay(a, 10*time.Millisecond)
				}
				slow := addrs[0]
				f.SetDelay(slow, 200*time.Millisecond)
				start := time.Now()
				for time.Since(start) < 40*time.Second {
					tryGet(tr, "http://svc.test/")
				}
				got, at := ej.got(), f.Received(slow)
				if factor == 0 {
					if len(got) != 0 || at < 6 {
						t.Fatalf("off: ejections %q and %d attempts to the slow endpoint; want none, and the pick's probes (at least 6)", got, at)
					}
					return
				}
				if want := []string{slow + " 1m0s"}; !slices.Equal(got, want) {
					t.Fatalf("ejections %q, want %q", got, want)
				}
				// Ejected after its fifth slow answer; its first may come
				// before two others have answered, with nothing to compare.
				if at < 5 || at > 6 {
					t.Fatalf("the slow endpoint got %d attempts, want 5 or 6, and none while ejected", at)
				}
			})
		})
	}
}

// An attempt still waiting when its caller gave up took at least that
// long: an endpoint that stalls past its callers' deadlines is ejected by
// latency though it never answers.
func TestAnEndpointThatStallsPastItsCallersDeadlinesIsEjectedByLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ej ejectionsTold
		f, tr, addrs := fleetOf(t, 3, attempt.Ejection{SlowFactor: 5, BaseTime: time.Minute},
			attempt.Config{Endpoints: &attempt.Endpoints{OnEject: ej.on}})
		for _, a := range addrs {
			f.SetDelay(a, 5*time.Millisecond)
		}
		f.SetDelay(addrs[0], time.Hour)
		for start := time.Now(); time.Since(start) < time.Minute; {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc.test/", nil)
			if resp, err := tr.RoundTrip(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			cancel()
		}
		if got, want := ej.got(), []string{addrs[0] + " 1m0s"}; !slices.Equal(got, want) {
			t.Errorf("ejections %q, want %q", got, want)
		}
		time.Sleep(time.Hour) // the stalled answers end
	})
}

// Latency ejection compares an endpoint with the others: when every
// endpoint of a host is slow, or one is slower but by less than SlowFactor
// or under SlowMin, none is ejected.
func TestEndpointsSlowAlikeOrUnderTheMinimumAreNotEjectedByLatency(t *testing.T) {
	for _, tc := range []struct {
		name        string
		all, slow   time.Duration
		factor, min float64
	}{
		{"all slow", 300 * time.Millisecond, 300 * time.Millisecond, 5, 0.05},
		{"slower by less than the factor", 100 * time.Millisecond, 400 * time.Millisecond, 5, 0.05},
		{"under the minimum", time.Millisecond, 40 * time.Millisecond, 5, 0.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var ej ejectionsTold
				f, tr, addrs := fleetOf(t, 3, attempt.Ejection{SlowFactor: tc.factor, SlowMin: time.Duration(tc.min * float64(time.Second))},
					attempt.Config{Endpoints: &attempt.Endpoints{OnEject: ej.on}})
				for _, a := range addrs {
					f.SetDelay(a, tc.all)
				}
				f.SetDelay(addrs[0], tc.slow)
				for start := time.Now(); time.Since(start) < time.Minute; {
					tryGet(tr, "http://svc.test/")
				}
				if got := ej.got(); len(got) != 0 {
					t.Fatalf("ejected %q", got)
				}
				if n := f.Received(addrs[0]); n < 10 {
					t.Fatalf("the test is void: endpoint %s got only %d attempts", addrs[0], n)
				}
			})
		})
	}
}

// Invalid settings fail at construction, naming the field.
func TestInvalidEndpointSettingsAreRefusedNamingTheField(t *testing.T) {
	for _, tc := range []struct {
		e    attempt.Endpoints
		want string
	}{
		{attempt.Endpoints{Refresh: -1}, "Endpoints.Refresh"},
		{attempt.Endpoints{MaxEndpoints: -1}, "Endpoints.MaxEndpoints"},
		{attempt.Endpoints{Ejection: attempt.Ejection{MaxShare: 1.5}}, "Endpoints.Ejection.MaxShare"},
		{attempt.Endpoints{Ejection: attempt.Ejection{FailureRate: 1.5}}, "Endpoints.Ejection.FailureRate"},
		{attempt.Endpoints{Ejection: attempt.Ejection{Window: -1}}, "Endpoints.Ejection.Window"},
		{attempt.Endpoints{Ejection: attempt.Ejection{SlowFactor: 0.5}}, "Endpoints.Ejection.SlowFactor"},
		{attempt.Endpoints{Ejection: attempt.Ejection{SlowFactor: -1}}, "Endpoints.Ejection.SlowFactor"},
		{attempt.Endpoints{Ejection: attempt.Ejection{SlowMin: -1}}, "Endpoints.Ejection.SlowMin"},
		{attempt.Endpoints{Ejection: attempt.Ejection{BaseTime: -1}}, "Endpoints.Ejection.BaseTime"},
		{attempt.Endpoints{Ejection: attempt.Ejection{BaseTime: time.Minute, MaxTime: time.Second}}, "Endpoints.Ejection.MaxTime"},
	} {
		_, err := attempt.New(attempt.Config{Endpoints: &tc.e})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %s", tc.e, err, tc.want)
		}
	}
}

// Regression: "not ejected" was an ejection end of 0, compared with a
// clock that reads below 0 in a synctest bubble, so every endpoint looked
// ejected there: the others were counted against the share (none could be
// ejected) and the upstream was never forgotten. An upstream with an
// ejected endpoint is kept however idle; once the ejection is over, it is
// forgotten after the idle time like any other.
func TestAnUpstreamIsKeptWhileAnEndpointIsEjectedAndForgottenAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var forgot forgetting
		f, tr, addrs := fleetOf(t, 3, attempt.Ejection{ConsecutiveFailures: 1, BaseTime: 10 * time.Minute, MaxTime: 10 * time.Minute, MaxShare: 0.5},
			attempt.Config{UpstreamIdleTime: time.Minute, OnForget: forgot.on})
		f.Set(addrs[0], 503)
		for f.Received(addrs[0]) == 0 {
			tryGet(tr, "http://svc.test/")
		}
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if got := forgot.got(); len(got) != 0 {
			t.Fatalf("forgotten %v while an endpoint was ejected", got)
		}
		time.Sleep(7 * time.Minute) // the ejection ends at 10 min, the idle time after it
		synctest.Wait()
		if got := forgot.got(); len(got) != 1 {
			t.Fatalf("forgotten %v after the ejection was over and the idle time passed", got)
		}
	})
}

// An endpoint that fails every other attempt never fails five in a row,
// but half of a window of its outcomes: it is ejected by its failure rate
// after one window. Below the rate, it is not.
func TestAnEndpointFailingHalfItsAttemptsIsEjectedByItsFailureRate(t *testing.T) {
	for _, tc := range []struct {
		cycle   []int
		ejected bool
	}{{[]int{503, 200}, true}, {[]int{503, 200, 200}, false}} {
		t.Run(fmt.Sprint(tc.cycle), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var ejections atomic.Int64
				f, tr, addrs := fleetOf(t, 3, attempt.Ejection{Window: 10, MaxShare: 0.5},
					attempt.Config{Endpoints: &attempt.Endpoints{OnEject: func(_, _ string, d time.Duration) {
						if d > 0 {
							ejections.Add(1)
						}
					}}})
				f.Cycle(addrs[0], tc.cycle...)
				for f.Received(addrs[0]) < 30 && ejections.Load() == 0 {
					tryGet(tr, "http://svc.test/")
				}
				if got := ejections.Load() == 1; got != tc.ejected {
					t.Fatalf("answering %v in turn: ejected %v after %d attempts", tc.cycle, got, f.Received(addrs[0]))
				}
				if tc.ejected && f.Received(addrs[0]) != 10 {
					t.Fatalf("ejected after %d attempts, want one window of 10", f.Received(addrs[0]))
				}
			})
		})
	}
}

// changingNames is a Resolver whose answers a test changes.
type changingNames struct {
	mu    sync.Mutex
	addrs []netip.Addr
	asked int
}

func (c *changingNames) set(a []netip.Addr) {
	c.mu.Lock()
	c.addrs = a
	c.mu.Unlock()
}

func (c *changingNames) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.asked++
	return slices.Clone(c.addrs), nil
}

// A host is looked up again every Refresh, in the background: an address
// that appears gets attempts from then on, one that is gone gets none, and
// an endpoint found again keeps what it learned (here, its ejection).
func TestAHostIsLookedUpAgainEveryRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ips := testkit.Loopbacks(4)
		addrs := testkit.AddrPorts(ips, 80)
		f := testkit.NewFleet(addrs...)
		f.Set(addrs[0], 503)
		names := &changingNames{addrs: ips[:3]}
		tr, err := attempt.New(attempt.Config{HTTPTransport: &http.Transport{DialContext: f.Dial},
			Endpoints: &attempt.Endpoints{Resolver: names, Refresh: time.Minute,
				Ejection: attempt.Ejection{ConsecutiveFailures: 1, BaseTime: time.Hour, MaxTime: time.Hour, MaxShare: 0.5}}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for range 100 {
			tryGet(tr, "http://svc.test/")
		}
		if f.Received(addrs[3]) != 0 || f.Received(addrs[0]) != 1 {
			t.Fatalf("before the change: %d attempts to the address not yet resolved, %d to the ejected one", f.Received(addrs[3]), f.Received(addrs[0]))
		}
		names.set([]netip.Addr{ips[0], ips[1], ips[3]}) // 127.0.0.4 gone, 127.0.0.5 new
		time.Sleep(time.Minute)
		tryGet(tr, "http://svc.test/") // finds the answer stale: looks it up again in the background
		synctest.Wait()
		f.Reset()
		for range 100 {
			tryGet(tr, "http://svc.test/")
		}
		if f.Received(addrs[2]) != 0 || f.Received(addrs[3]) == 0 || f.Received(addrs[0]) != 0 {
			t.Fatalf("after the change: %d attempts to the gone address, %d to the new one, %d to the one still ejected",
				f.Received(addrs[2]), f.Received(addrs[3]), f.Received(addrs[0]))
		}
		if names.asked != 2 {
			t.Fatalf("looked up %d times, want 2", names.asked)
		}
	})
}

// A request through a Proxy has one endpoint, the proxy, and a Transport
// with DialTLSContext dials by name: neither looks the host up.
func TestAProxyOrADialTLSContextMeansTheHostIsDialedByName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		names := &changingNames{addrs: testkit.Loopbacks(3)}
		f := testkit.NewFleet("proxy.test:3128", "svc.test:443")
		proxy, _ := url.Parse("http://proxy.test:3128")
		for _, base := range []*http.Transport{
			{DialContext: f.Dial, Proxy: http.ProxyURL(proxy)},
			{DialContext: f.Dial, DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return f.Dial(ctx, network, addr) // no TLS: the fleet answers in clear, enough to see what is dialed
			}},
		} {
			tr, err := attempt.New(attempt.Config{HTTPTransport: base, Endpoints: &attempt.Endpoints{Resolver: names}})
			if err != nil {
				t.Fatal(err)
			}
			url := "http://svc.test/"
			if base.DialTLSContext != nil {
				url = "https://svc.test/"
			}
			tryGet(tr, url)
			tr.Close()
		}
		if names.asked != 0 {
			t.Fatalf("the host was looked up %d times", names.asked)
		}
		if d := f.Dialed(); len(d) != 2 || d[0] != "proxy.test:3128" || d[1] != "svc.test:443" {
			t.Fatalf("dialed %v, want the proxy, then the host by name", d)
		}
	})
}

// failingNames fails its lookups while down, and while blocking waits for
// the lookup's context to end.
type failingNames struct {
	changingNames
	down, blocking atomic.Bool
}

func (f *failingNames) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if f.blocking.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if f.down.Load() {
		return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
	}
	return f.changingNames.LookupNetIP(ctx, network, host)
}

// A lookup that fails changes nothing known: through a DNS outage the
// endpoints, and an ejection, stay. A first lookup ended by its caller's
// context installs nothing: the next attempt looks the host up again.
func TestALookupThatFailsKeepsWhatIsKnown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ips := testkit.Loopbacks(3)
		addrs := testkit.AddrPorts(ips, 80)
		f := testkit.NewFleet(addrs...)
		f.Set(addrs[0], 503)
		names := &failingNames{changingNames: changingNames{addrs: ips}}
		names.blocking.Store(true)
		tr, err := attempt.New(attempt.Config{HTTPTransport: &http.Transport{DialContext: f.Dial},
			Endpoints: &attempt.Endpoints{Resolver: names, Refresh: time.Minute,
				Ejection: attempt.Ejection{ConsecutiveFailures: 1, BaseTime: time.Hour, MaxTime: time.Hour, MaxShare: 0.5}}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc.test/", nil)
		tr.RoundTrip(req) // its lookup ends with its context
		cancel()
		names.blocking.Store(false)
		for range 100 {
			tryGet(tr, "http://svc.test/")
		}
		if f.Received(addrs[1]) == 0 || f.Received(addrs[2]) == 0 || f.Received(addrs[0]) != 1 {
			t.Fatalf("after a cancelled first lookup, the replicas got %d, %d, %d: want the host spread, the 503 one ejected",
				f.Received(addrs[0]), f.Received(addrs[1]), f.Received(addrs[2]))
		}
		names.down.Store(true)
		time.Sleep(time.Minute)
		tryGet(tr, "http://svc.test/") // a refresh, which fails
		synctest.Wait()
		f.Reset()
		for range 100 {
			tryGet(tr, "http://svc.test/")
		}
		if f.Received(addrs[1]) == 0 || f.Received(addrs[2]) == 0 || f.Received(addrs[0]) != 0 {
			t.Fatalf("through a DNS outage the replicas got %d, %d, %d: want the host still spread, the ejected one still out",
				f.Received(addrs[0]), f.Received(addrs[1]), f.Received(addrs[2]))
		}
	})
}

type panickingNames struct{}

func (panickingNames) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	panic("a Resolver's bug")
}

// A Resolver that panics has failed its lookup: the host is dialed by
// name, and neither the attempt nor a lookup in the background (which
// would end the process) panics.
func TestAResolverThatPanicsFailsItsLookup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := testkit.NewFleet("svc.test:80")
		tr, err := attempt.New(attempt.Config{HTTPTransport: &http.Transport{DialContext: f.Dial},
			Endpoints: &attempt.Endpoints{Resolver: panickingNames{}, Refresh: time.Minute}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for range 2 {
			if err := tryGet(tr, "http://svc.test/"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Minute) // the next one looks again, in the background
		}
		synctest.Wait()
		if f.Received("svc.test:80") != 2 {
			t.Fatalf("received %d, want 2 calls dialed by name", f.Received("svc.test:80"))
		}
	})
}
