package outbound_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outboundtest/testkit"
	"github.com/outboundhq/outbound/retry"
)

// twoReplicas is a fleet of two replicas behind "svc.test:80" and a
// Transport with Endpoints over them, ejection off.
func twoReplicas(t *testing.T, cfg outbound.Config) (*testkit.Fleet, *outbound.Transport, [2]string) {
	t.Helper()
	ips := testkit.Loopbacks(2)
	addrs := [2]string(testkit.AddrPorts(ips, 80))
	f := testkit.NewFleet(addrs[:]...)
	cfg.HTTPTransport = &http.Transport{DialContext: f.Dial}
	cfg.Endpoints = &attempt.Endpoints{Resolver: testkit.Names{"svc.test": ips}, Ejection: attempt.Ejection{ConsecutiveFailures: -1}}
	cfg.Backoff = retry.Backoff{Initial: 1, Max: 1, Jitter: -1}
	tr, err := outbound.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return f, tr, addrs
}

// A retry goes to another endpoint than the one that failed, even when
// the one that failed looks the better pick: here it answers 503 at once
// and the other 200 after 10 ms, so the power of two choices alone would
// send every attempt to the first.
func TestARetryGoesToAnotherEndpointThanTheOneThatFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := twoReplicas(t, outbound.Config{MaxAttempts: 2, Budget: retry.BudgetConfig{MaxTokens: 100}})
		f.Set(addrs[0], 503)
		f.SetDelay(addrs[1], 10*time.Millisecond)
		for i := range 30 {
			req, _ := http.NewRequest(http.MethodGet, "http://svc.test/", nil)
			resp, out, err := tr.Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("call %d: %v %v, outcome %+v", i, resp, err, out)
			}
			resp.Body.Close()
			if last := out.Attempts[len(out.Attempts)-1]; last.Endpoint != addrs[1] ||
				len(out.Attempts) == 2 && out.Attempts[0].Endpoint != addrs[0] {
				t.Fatalf("call %d: the outcome names the endpoints %v", i, out)
			}
		}
		if n := f.Received(addrs[0]); n == 0 || n > 30 {
			t.Fatalf("the failing endpoint got %d attempts of 30 calls: each call's retry should go elsewhere", n)
		}
	})
}

// A retry after a connection that could not be made goes to another
// endpoint — here within the same attempt, as net/http's dialer tries
// every address: the call succeeds in one attempt.
func TestARetryAfterAConnectFailureGoesToAnotherEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := twoReplicas(t, outbound.Config{MaxAttempts: 1})
		f.Set(addrs[0], 0) // refuses connections
		for i := range 20 {
			req, _ := http.NewRequest(http.MethodPost, "http://svc.test/", nil)
			resp, out, err := tr.Do(req)
			if err != nil || resp.StatusCode != 200 || len(out.Attempts) != 1 {
				t.Fatalf("call %d: %v %v, outcome %+v", i, resp, err, out)
			}
			resp.Body.Close()
		}
		if n := f.Received(addrs[1]); n != 20 {
			t.Fatalf("the healthy endpoint got %d of 20", n)
		}
	})
}

// A hedge goes to another endpoint than its primary: when the primary's
// endpoint, until then the faster, stalls, the hedge is answered by the
// other and the call takes the hedge's delay plus the other's latency.
func TestAHedgeGoesToAnotherEndpointThanItsPrimary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, tr, addrs := twoReplicas(t, outbound.Config{Hedging: &outbound.Hedging{Delay: 20 * time.Millisecond}})
		f.SetDelay(addrs[1], 5*time.Millisecond)
		for range 10 { // the first endpoint answers at once: it is the pick
			getURL(t, tr, "http://svc.test/")
		}
		f.SetDelay(addrs[0], 500*time.Millisecond)
		f.Reset()
		start := time.Now()
		req, _ := http.NewRequest(http.MethodGet, "http://svc.test/", nil)
		resp, out, err := tr.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v, outcome %+v", resp, err, out)
		}
		resp.Body.Close()
		if took := time.Since(start); took > 100*time.Millisecond || f.Received(addrs[0]) != 1 || f.Received(addrs[1]) != 1 {
			t.Fatalf("took %v, the endpoints got %d and %d attempts: want the primary on the first, the hedge on the second",
				took, f.Received(addrs[0]), f.Received(addrs[1]))
		}
		time.Sleep(time.Second) // the stalled replica ends its answer to nobody
	})
}

// TLS checks the certificate against the host's name, never the
// endpoint's address: two replicas on 127.0.0.2 and 127.0.0.3 whose
// certificate names only "localhost" are trusted as localhost, and the
// same replicas asked for as another name are refused.
func TestTLSVerificationUsesTheHostName(t *testing.T) {
	a, b := replicaPair(t, outboundtest.H2TLS)
	u, _ := url.Parse(a.URL)
	port := u.Port()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(a.CertificatePEM())
	roots.AppendCertsFromPEM(b.CertificatePEM())
	tr, err := outbound.New(outbound.Config{MaxAttempts: 1,
		HTTPTransport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true},
		Endpoints:     &attempt.Endpoints{Resolver: testkit.Names{"localhost": testkit.Loopbacks(2), "svc.test": testkit.Loopbacks(2)}}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for i := range 40 {
		resp, err := getURL(t, tr, "https://localhost:"+port+"/")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if a.TotalReceived() == 0 || b.TotalReceived() == 0 {
		t.Fatalf("the replicas got %d and %d of 40 calls: both should be used", a.TotalReceived(), b.TotalReceived())
	}
	_, err = getURL(t, tr, "https://svc.test:"+port+"/")
	var uerr x509.HostnameError
	if !errors.As(err, &uerr) {
		t.Fatalf("a name the certificate does not have: %v, want a host name error", err)
	}
}

// replicaPair starts two servers speaking p on one port of 127.0.0.2 and
// 127.0.0.3.
func replicaPair(t *testing.T, p outboundtest.Proto) (*outboundtest.Server, *outboundtest.Server) {
	t.Helper()
	for range 20 {
		a, err := outboundtest.NewServerAt(p, "127.0.0.2:0")
		if err != nil {
			t.Skipf("cannot listen on 127.0.0.2 (%v): this machine's loopback has one address", err)
		}
		u, _ := url.Parse(a.URL)
		b, err := outboundtest.NewServerAt(p, "127.0.0.3:"+u.Port())
		if err != nil {
			a.Close()
			continue // the port is taken there
		}
		t.Cleanup(a.Close)
		t.Cleanup(b.Close)
		return a, b
	}
	t.Fatal("no port free on both 127.0.0.2 and 127.0.0.3 in 20 tries")
	return nil, nil
}

// An ejection and its end are told to Hooks.EndpointEjected (beside
// Endpoints.OnEject) and logged by SlogHooks, with the upstream and the
// endpoint; a hook that panics stops nothing.
func TestEndpointEjectionsAreToldToTheHooksAndLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ips := testkit.Loopbacks(3)
		all := testkit.AddrPorts(ips, 80)
		sick := all[0]
		f := testkit.NewFleet(all...)
		f.Set(sick, 503)
		var logs strings.Builder
		var told, hooked []string
		tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: f.Dial}, MaxAttempts: 1,
			Endpoints: &attempt.Endpoints{Resolver: testkit.Names{"svc.test": ips},
				Ejection: attempt.Ejection{ConsecutiveFailures: 1, BaseTime: time.Second, MaxShare: 0.5},
				OnEject:  func(_, ep string, d time.Duration) { told = append(told, fmt.Sprint(ep, " ", d)) }},
			Hooks: outbound.ComposeHooks(outbound.SlogHooks(slog.New(slog.NewTextHandler(&logs, nil))),
				outbound.Hooks{EndpointEjected: func(up, ep string, d time.Duration) {
					hooked = append(hooked, fmt.Sprint(up, " ", ep, " ", d))
					panic("a hook that panics")
				}})})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		for f.Received(sick) == 0 {
			getURL(t, tr, "http://svc.test/")
		}
		time.Sleep(2 * time.Second)
		for range 30 {
			getURL(t, tr, "http://svc.test/")
		}
		want := []string{sick + " 1s", sick + " 0s"}
		if len(told) < 2 || fmt.Sprint(told[:2]) != fmt.Sprint(want) {
			t.Fatalf("OnEject told %q, want %q first; hooked %q, log %s", told, want, hooked, logs.String())
		}
		if len(hooked) != len(told) || hooked[0] != "http://svc.test:80 "+sick+" 1s" {
			t.Fatalf("the hook was told %q", hooked)
		}
		for _, line := range []string{`msg="outbound endpoint ejected" upstream=http://svc.test:80 endpoint=` + sick + ` for=1s`,
			`msg="outbound endpoint back" upstream=http://svc.test:80 endpoint=` + sick} {
			if !strings.Contains(logs.String(), line) {
				t.Fatalf("the log has no %q:\n%s", line, logs.String())
			}
		}
	})
}

// A failure of an endpoint that is ejected by the time the call decides is
// the endpoint's, not the upstream's: it costs the retry budget nothing,
// and the retry goes elsewhere. Before, behind five replicas of which one
// turned to 503, the failure that ejected it left the budget at half and
// its call's retry was refused: 4 of 162,836 GETs failed. A failure that
// ejects nothing is charged as before.
func TestAFailureThatEjectsItsEndpointCostsTheRetryBudgetNothing(t *testing.T) {
	for _, tc := range []struct {
		failures int
		tokens   float64
	}{{1, 10}, {3, 9}} {
		t.Run(fmt.Sprintf("ejected after %d", tc.failures), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ips := testkit.Loopbacks(3)
				all := testkit.AddrPorts(ips, 80)
				sick := all[0]
				f := testkit.NewFleet(all...)
				f.Set(sick, 503)
				tr, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{DialContext: f.Dial},
					Backoff: retry.Backoff{Initial: 1, Max: 1, Jitter: -1},
					Endpoints: &attempt.Endpoints{Resolver: testkit.Names{"svc.test": ips},
						Ejection: attempt.Ejection{ConsecutiveFailures: tc.failures, MaxShare: 0.34}}})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				for f.Received(sick) == 0 {
					req, _ := http.NewRequest(http.MethodGet, "http://svc.test/", nil)
					resp, out, err := tr.Do(req)
					if err != nil || resp.StatusCode != 200 {
						t.Fatalf("%v %v", err, out)
					}
					resp.Body.Close()
				}
				s, _ := tr.Upstream("http://svc.test:80")
				if s.BudgetTokens < tc.tokens || s.BudgetTokens >= tc.tokens+0.5 {
					t.Fatalf("retry budget %v after one 503, want %v (and what successes gave back)", s.BudgetTokens, tc.tokens)
				}
			})
		})
	}
}
