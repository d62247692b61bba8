package attempt_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
)

// tryGet makes one attempt of a GET to url and closes the answer's body.
func tryGet(tr *attempt.Attempter, url string) error {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return err
}

// forgetting records the keys an Attempter forgets.
type forgetting struct {
	mu   sync.Mutex
	keys []string
}

func (f *forgetting) on(key string) {
	f.mu.Lock()
	f.keys = append(f.keys, key)
	f.mu.Unlock()
}

func (f *forgetting) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys)
}

// An upstream whose breaker is OPEN or HALF_OPEN is never forgotten, however
// long it stays idle: forgetting an outage would be a way around the breaker.
// Once it has recovered and stays idle for the idle time, it is forgotten
// (and OnForget is told), and a call after that starts afresh.
func TestAnOpenBreakersUpstreamIsNeverForgottenAndARecoveredOneIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		var f forgetting
		tr, err := attempt.New(attempt.Config{
			HTTPTransport:    &http.Transport{DialContext: u.dial},
			Admission:        admission.Config{Circuit: circuit.Config{WindowSize: 2, MinimumCalls: 2, WaitInOpen: time.Minute, PermittedCallsInHalfOpen: 1}},
			UpstreamIdleTime: time.Minute,
			OnForget:         f.on,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		const key = "http://upstream.test:80"
		u.down.Store(true)
		for range 2 {
			if err := tryGet(tr, "http://upstream.test/"); err == nil {
				t.Fatal("a call to a dead upstream succeeded")
			}
		}
		if st := pipelineOf(t, tr, key).Breaker().State(); st != circuit.Open {
			t.Fatalf("breaker %v after two failures", st)
		}
		time.Sleep(time.Hour) // idle all along: OPEN and HALF_OPEN in turn
		synctest.Wait()
		p := pipelineOf(t, tr, key)
		if st := p.Breaker().State(); st == circuit.Closed || len(f.got()) != 0 {
			t.Fatalf("after an idle hour: breaker %v, forgotten %v", st, f.got())
		}

		u.down.Store(false)
		for p.Breaker().State() != circuit.HalfOpen {
			time.Sleep(time.Second)
		}
		if err := tryGet(tr, "http://upstream.test/"); err != nil {
			t.Fatal(err)
		}
		if st := p.Breaker().State(); st != circuit.Closed {
			t.Fatalf("breaker %v after a good trial", st)
		}
		time.Sleep(time.Minute / 2)
		if _, ok := tr.Pipeline(key); !ok {
			t.Fatal("forgotten before the idle time")
		}
		time.Sleep(2 * time.Minute) // its connection closes after 90 s, then the upstream is idle long enough
		synctest.Wait()
		if _, ok := tr.Pipeline(key); ok || !slices.Equal(f.got(), []string{key}) || u.open() != 0 {
			t.Fatalf("recovered and idle: still kept %v, forgotten %v, %d connections open", ok, f.got(), u.open())
		}
		if len(tr.Upstreams()) != 0 {
			t.Fatalf("still kept: %v", tr.Upstreams())
		}
		if err := tryGet(tr, "http://upstream.test/"); err != nil || pipelineOf(t, tr, key).Breaker().Metrics().Calls != 1 {
			t.Fatalf("the next call: %v", err)
		}
	})
}

// Breakers that start METRICS_ONLY (or DISABLED) do not keep their upstreams
// for ever: an upstream whose breaker is still in the state it started in is
// forgotten when idle, as a CLOSED one is; one an operator moved to another
// state is kept.
func TestUpstreamsWhoseBreakersStartOutsideClosedAreStillForgotten(t *testing.T) {
	for _, start := range []circuit.State{circuit.MetricsOnly, circuit.Disabled} {
		t.Run(start.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				u := &pipeUpstream{}
				var f forgetting
				tr, err := attempt.New(attempt.Config{
					HTTPTransport:    &http.Transport{DialContext: u.dial},
					Admission:        admission.Config{Circuit: circuit.Config{StartState: start}},
					UpstreamIdleTime: time.Minute,
					OnForget:         f.on,
				})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				for _, h := range []string{"a", "b"} {
					if err := tryGet(tr, "http://"+h+".test/"); err != nil {
						t.Fatal(err)
					}
				}
				if err := pipelineOf(t, tr, "http://b.test:80").Breaker().SetState(circuit.ForcedOpen); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Hour)
				synctest.Wait()
				if got := f.got(); !slices.Equal(got, []string{"http://a.test:80"}) || !slices.Equal(tr.Upstreams(), []string{"http://b.test:80"}) {
					t.Fatalf("after an idle hour: forgotten %v, kept %v; want a forgotten, b (FORCED_OPEN) kept", got, tr.Upstreams())
				}
			})
		})
	}
}

// A bulkhead slot held, or a rate token still owed, keeps an upstream: the
// fresh guards that forgetting would give it would allow more than its own.
func TestAnUpstreamHoldingAPermitOrOwingTokensIsNotForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		tr, err := attempt.New(attempt.Config{
			HTTPTransport:    &http.Transport{DialContext: u.dial},
			Admission:        admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}},
			UpstreamIdleTime: time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		req, _ := http.NewRequest(http.MethodGet, "http://held.test/", nil)
		resp, err := tr.RoundTrip(req) // its body stays open: the slot is held
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		if _, ok := tr.Pipeline("http://held.test:80"); !ok {
			t.Fatal("forgotten while a bulkhead slot was held")
		}
		resp.Body.Close()
		time.Sleep(time.Hour)
		if _, ok := tr.Pipeline("http://held.test:80"); ok {
			t.Fatal("kept after the slot came back")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		tr, err := attempt.New(attempt.Config{
			HTTPTransport:    &http.Transport{DialContext: u.dial},
			Admission:        admission.Config{Rate: ratelimit.Config{PerSecond: 1.0 / 3600, Burst: 2}}, // two an hour
			UpstreamIdleTime: time.Minute,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for range 2 {
			if err := tryGet(tr, "http://limited.test/"); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(90 * time.Minute) // one token back of two
		if _, ok := tr.Pipeline("http://limited.test:80"); !ok {
			t.Fatal("forgotten while it owed its limiter a token")
		}
		if err := tryGet(tr, "http://limited.test/"); err != nil {
			t.Fatal(err)
		}
		if err := tryGet(tr, "http://limited.test/"); !errors.Is(err, classify.ErrLocalRejection) {
			t.Fatalf("a third call within the hour: %v, want a local rejection", err)
		}
	})
}

// MaxUpstreams caps the upstreams kept: a new one forgets the least recently
// used of those that hold nothing — closing its idle connection —, and is
// refused when every one holds something (here, an OPEN breaker).
func TestMaxUpstreamsForgetsTheLeastRecentlyUsedButNeverAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		var f forgetting
		tr, err := attempt.New(attempt.Config{
			HTTPTransport: &http.Transport{DialContext: u.dial},
			Admission:     admission.Config{Circuit: circuit.Config{WindowSize: 1, MinimumCalls: 1}},
			MaxUpstreams:  3,
			OnForget:      f.on,
			// Connections kept: an upstream whose last connection closes,
			// holding nothing, is forgotten with it.
			IdleConnTimeout: time.Hour,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for _, h := range []string{"a", "b", "c"} {
			if err := tryGet(tr, "http://"+h+".test/"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Minute) // a sweep between them: a is the least recently used
		}
		if err := tryGet(tr, "http://d.test/"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got, want := tr.Upstreams(), []string{"http://b.test:80", "http://c.test:80", "http://d.test:80"}; !slices.Equal(got, want) || !slices.Equal(f.got(), []string{"http://a.test:80"}) {
			t.Fatalf("kept %v, forgotten %v", got, f.got())
		}

		tr.CloseIdleConnections() // the next calls dial, and fail
		u.down.Store(true)
		for _, h := range []string{"b", "c", "d"} { // every breaker OPEN
			_ = tryGet(tr, "http://"+h+".test/")
		}
		err = tryGet(tr, "http://e.test/")
		if !errors.Is(err, classify.ErrTooManyUpstreams) || len(tr.Upstreams()) != 3 {
			t.Fatalf("a new upstream with every kept one OPEN: %v, kept %v", err, tr.Upstreams())
		}
	})
}

// The default upstream key has one spelling per host, so whoever writes the
// URL cannot multiply the per-upstream limits.
func TestSpellingsOfOneHostShareOneBulkhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		tr, err := attempt.New(attempt.Config{
			HTTPTransport: &http.Transport{DialContext: u.dial},
			Admission:     admission.Config{Bulkhead: bulkhead.Config{MaxConcurrent: 1}},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		req, _ := http.NewRequest(http.MethodGet, "http://localhost/", nil)
		resp, err := tr.RoundTrip(req) // holds the only slot until its body is closed
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		for _, url := range []string{"http://LOCALHOST/", "http://LocalHost/", "http://localhost./", "http://LOCALhost:80/", "http://localhost:080/"} {
			if err := tryGet(tr, url); !errors.Is(err, bulkhead.ErrFull) {
				t.Errorf("%s: %v, want the bulkhead full", url, err)
			}
		}
		if got := tr.Upstreams(); !slices.Equal(got, []string{"http://localhost:80"}) {
			t.Fatalf("upstreams %v", got)
		}
	})
}

func TestTheDefaultUpstreamKeyIsCanonical(t *testing.T) {
	for url, want := range map[string]string{
		"http://Example.COM/x":             "http://example.com:80",
		"http://example.com.:80":           "http://example.com:80",
		"https://example.com/":             "https://example.com:443",
		"https://example.com:0443/":        "https://example.com:443",
		"http://[0:0:0:0:0:0:0:1]:8080/":   "http://[::1]:8080",
		"http://[::0001]/":                 "http://[::1]:80",
		"http://[2001:DB8::1]/":            "http://[2001:db8::1]:80",
		"http://127.0.0.1:9/":              "http://127.0.0.1:9",
		"http://[fe80::1%25eth0]:7/":       "http://[fe80::1%eth0]:7",
		"http://xn--bcher-kva.example/":    "http://xn--bcher-kva.example:80",
		"http://user:pass@example.com/x?q": "http://example.com:80",
		// Regression: an IPv4-mapped IPv6 address is the IPv4 host; a zone
		// means nothing on loopback; IDNA as net/http dials (a full-width
		// "localhost" is localhost).
		"http://[::ffff:127.0.0.1]:8080/": "http://127.0.0.1:8080",
		"http://[::1%25lo]/":              "http://[::1]:80",
		"http://[::1%251]/":               "http://[::1]:80",
		"http://ｌｏｃａｌｈｏｓｔ/":               "http://localhost:80",
		"http://Bücher.example/":          "http://xn--bcher-kva.example:80",
	} {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := attempt.DefaultUpstreamKey(req); got != want {
			t.Errorf("%s: %s, want %s", url, got, want)
		}
	}
}

// A link-local address's zone names the interface: by index or by name,
// one upstream.
func TestALinkLocalZoneIsOneUpstreamByIndexOrName(t *testing.T) {
	ifc, err := net.InterfaceByIndex(1)
	if err != nil {
		t.Skipf("no interface of index 1 on this machine: %v", err)
	}
	for _, url := range []string{"http://[fe80::1%251]:7/", "http://[fe80::1%25" + ifc.Name + "]:7/"} {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := attempt.DefaultUpstreamKey(req), "http://[fe80::1%"+ifc.Name+"]:7"; got != want {
			t.Errorf("%s: %s, want %s", url, got, want)
		}
	}
}

func TestLookingUpAnUnknownUpstreamCreatesNothing(t *testing.T) {
	tr, err := attempt.New(attempt.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if p, ok := tr.Pipeline("http://never.test:80"); ok || p != nil {
		t.Fatalf("an unknown key has a pipeline: %v", p)
	}
	if got := tr.Upstreams(); len(got) != 0 {
		t.Fatalf("a look-up created %v", got)
	}
}

// MaxConnsPerHost bounds the connections to an address, dialing included,
// as in net/http: attempts beyond it wait for a connection.
func TestMaxConnsPerHostOneOpensOneConnection(t *testing.T) {
	for _, p := range []outboundtest.Proto{outboundtest.HTTP1, outboundtest.H2C} {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			s.SetDefault(outboundtest.Slow(20*time.Millisecond, 200))
			base := s.Transport()
			base.MaxConnsPerHost = 1
			tr := newTransportWith(t, attempt.Config{HTTPTransport: base})
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range 4 {
				wg.Go(func() { errs[i] = tryGet(tr, s.URL+"/") })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if n := s.Conns(); n != 1 {
				t.Fatalf("4 concurrent GETs opened %d connections with MaxConnsPerHost 1", n)
			}
		})
	}
}

// An attempt that gives up waiting for a connection (its context ends)
// wrote nothing: NotSent, no breaker failure, its rate token refunded.
func TestAnAttemptThatGivesUpWaitingForAConnectionIsNotSentAndNoFailure(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	s.SetDefault(outboundtest.Hang())
	base := s.Transport()
	base.MaxConnsPerHost = 1
	var ev events
	tr := newTransportWith(t, attempt.Config{HTTPTransport: base, Admission: admission.Config{OnEvent: ev.On}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/hang", nil)
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}()
	for s.Received("") == 0 {
		time.Sleep(time.Millisecond) // the first request holds the only connection
	}
	waitCtx, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop()
	req, _ := http.NewRequestWithContext(waitCtx, http.MethodGet, s.URL+"/second", nil)
	_, err := tr.RoundTrip(req)
	var ce *classify.Error
	if !errors.As(err, &ce) || ce.Category != classify.NotSent || ce.Evidence != classify.EvidenceConnLimit {
		t.Fatalf("the waiting attempt: %v", err)
	}
	if n := ev.Count("circuit-exit(failure)"); n != 0 || ev.Count("circuit-release") != 1 {
		t.Fatalf("%d breaker failures, %d refunds, %d releases", n, ev.Count("rate-exit(refund)"), ev.Count("circuit-release"))
	}
	if s.Conns() != 1 {
		t.Fatalf("%d connections", s.Conns())
	}
}

// Idle connections are kept within MaxIdleConnsPerHost per address (net/http's
// default of 2 when zero) and MaxIdleConns in all, the newest idle ones kept
// per address and the oldest closed first across addresses, as in net/http.
func TestIdleConnectionsStayWithinMaxIdleConnsPerHostAndMaxIdleConns(t *testing.T) {
	for _, tc := range []struct {
		name          string
		perHost, all  int
		hosts, calls  int
		wantOpenAfter int
	}{
		{"per host, default 2", 0, 0, 1, 6, 2},
		{"per host 3", 3, 0, 1, 6, 3},
		{"in all 4", 0, 4, 6, 1, 4},
		{"in all 100, per host 1", 1, 100, 5, 3, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				u := &pipeUpstream{}
				tr, err := attempt.New(attempt.Config{HTTPTransport: &http.Transport{DialContext: u.dial,
					MaxIdleConnsPerHost: tc.perHost, MaxIdleConns: tc.all}})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				var wg sync.WaitGroup
				for h := range tc.hosts {
					for range tc.calls {
						wg.Go(func() {
							if err := tryGet(tr, fmt.Sprintf("http://h%d.test/wait/1s", h)); err != nil {
								t.Error(err)
							}
						})
					}
				}
				wg.Wait()
				synctest.Wait()
				if u.dials.Load() != int32(tc.hosts*tc.calls) || u.open() != tc.wantOpenAfter {
					t.Fatalf("%d dials, %d connections open after, want %d", u.dials.Load(), u.open(), tc.wantOpenAfter)
				}
			})
		})
	}
}

// With Config.IdleConnTimeout zero, the Transport's IdleConnTimeout applies.
func TestTheTransportsIdleConnTimeoutIsHonoured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := &pipeUpstream{}
		tr, err := attempt.New(attempt.Config{HTTPTransport: &http.Transport{DialContext: u.dial, IdleConnTimeout: 10 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		if err := tryGet(tr, "http://upstream.test/"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if u.open() != 1 {
			t.Fatalf("%d connections open before the timeout", u.open())
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if u.open() != 0 {
			t.Fatalf("%d connections open after the Transport's IdleConnTimeout", u.open())
		}
	})
}

// A call is slow by the time its answer's headers take, not by the time the
// caller then spends reading the body: a body streamed for a minute is the
// caller's pace (or the size of the answer), not the upstream's slowness.
func TestACallIsSlowByTheTimeToItsResponseHeaders(t *testing.T) {
	for _, tc := range []struct {
		name          string
		headers, body time.Duration
		slow          int
	}{
		{"headers at once, the body over 10 s", 0, 10 * time.Second, 0},
		{"headers after 2 s", 2 * time.Second, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				dial := func(context.Context, string, string) (net.Conn, error) {
					client, server := net.Pipe()
					go func() {
						defer server.Close()
						r := bufio.NewReader(server)
						if _, err := http.ReadRequest(r); err != nil {
							return
						}
						time.Sleep(tc.headers)
						io.WriteString(server, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no")
						time.Sleep(tc.body)
						io.WriteString(server, "k")
						// Keep the connection until the client closes it: a
						// connection the upstream closed would let the client
						// forget the upstream, whose breaker is read below.
						_, _ = http.ReadRequest(r)
					}()
					return client, nil
				}
				tr, err := attempt.New(attempt.Config{HTTPTransport: &http.Transport{DialContext: dial},
					Admission: admission.Config{Circuit: circuit.Config{SlowCallDuration: time.Second}}})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				if err := tryGet(tr, "http://upstream.test/"); err != nil {
					t.Fatal(err)
				}
				if m := pipelineOf(t, tr, "http://upstream.test:80").Breaker().Metrics(); m.Calls != 1 || m.Slow != tc.slow {
					t.Fatalf("%+v, want 1 call, %d slow", m, tc.slow)
				}
			})
		})
	}
}
