// Package interop tests outbound against real software, side by side with a
// bare net/http client in the same run: what net/http gets through, outbound
// must get through too.
package interop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// nginx is a real nginx master process with its own configuration, on
// loopback ports, stopped by PID at the end of the test.
type nginx struct {
	cmd                  *exec.Cmd
	plain, h2c, tlsPorts int // listen ports: HTTP/1.1, HTTP/2 with prior knowledge, TLS (ALPN h2 and http/1.1)
}

// startNginx starts nginx in front of backend, configured as a busy site
// is: keepalive_requests 50 (an HTTP/2 connection gets a GOAWAY every 50
// streams, an HTTP/1.1 one is closed after 50 requests), keepalive_timeout
// 1s. It skips the test, saying so, only where nginx is not installed and
// OUTBOUND_REQUIRE_NGINX is not set (scripts/test installs it and sets it).
func startNginx(t *testing.T, backend string, ca *authority) *nginx {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if os.Getenv("OUTBOUND_REQUIRE_NGINX") != "" {
			t.Fatalf("nginx is required (OUTBOUND_REQUIRE_NGINX is set) but not installed: %v", err)
		}
		t.Skip("nginx is not installed (Debian package nginx; scripts/test installs it): skipping the tests against a real nginx")
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	cert, key := ca.files(t, dir)
	n := &nginx{plain: freePort(t), h2c: freePort(t), tlsPorts: freePort(t)}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;" // the workers read the files of this temporary directory
	}
	conf := fmt.Sprintf(`%s
worker_processes 1;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[2]s/tmp/body; proxy_temp_path %[2]s/tmp/proxy;
  fastcgi_temp_path %[2]s/tmp/fcgi; uwsgi_temp_path %[2]s/tmp/uwsgi; scgi_temp_path %[2]s/tmp/scgi;
  keepalive_requests 50;
  keepalive_timeout 1s;
  upstream backend { server %[3]s; keepalive 64; }
  server {
    listen 127.0.0.1:%[4]d;
    listen 127.0.0.1:%[5]d http2;
    listen 127.0.0.1:%[6]d ssl http2;
    ssl_certificate %[7]s; ssl_certificate_key %[8]s;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_read_timeout 30s;
    }
  }
}
`, user, dir, backend, n.plain, n.h2c, n.tlsPorts, cert, key)
	confPath := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	n.cmd = exec.Command(bin, "-p", dir, "-c", confPath, "-g", "daemon off;")
	var stderr strings.Builder
	n.cmd.Stdout, n.cmd.Stderr = &stderr, &stderr
	if err := n.cmd.Start(); err != nil {
		t.Fatalf("starting nginx: %v", err)
	}
	t.Cleanup(func() {
		n.cmd.Process.Signal(syscall.SIGTERM) // fast shutdown of the master and its workers
		n.cmd.Wait()
	})
	for _, port := range []int{n.plain, n.h2c, n.tlsPorts} {
		if err := waitListening(port, n.cmd); err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx did not start: %v\n%s%s", err, stderr.String(), log)
		}
	}
	return n
}

// reload makes nginx re-read its configuration: new workers, and the old ones
// shut down gracefully (GOAWAY on HTTP/2, idle HTTP/1.1 connections closed).
func (n *nginx) reload(t *testing.T) {
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Errorf("reloading nginx: %v", err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitListening waits until something accepts connections on port, or the
// process has exited, for at most 10 seconds.
func waitListening(port int, cmd *exec.Cmd) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if cmd.ProcessState != nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond) // a process starting, not a timing assertion
	}
}

// countingBackend is the upstream behind nginx. It counts, per X-Request-Id,
// the requests it received whole: the ground truth for "executed at most
// once" and "not committed means not executed".
type countingBackend struct {
	srv *httptest.Server
	mu  sync.Mutex
	n   map[string]int
}

func newCountingBackend(t *testing.T) *countingBackend {
	b := &countingBackend{n: map[string]int{}}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return
		}
		b.mu.Lock()
		b.n[r.Header.Get("X-Request-Id")]++
		b.mu.Unlock()
		if ms, _ := strconv.Atoi(r.URL.Query().Get("sleep")); ms > 0 {
			time.Sleep(time.Duration(ms) * time.Millisecond) // a backend doing work
		}
		io.WriteString(w, "done")
	}))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *countingBackend) executions(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n[id]
}

// minCalls is the least number of calls each client makes per protocol and
// phase.
const minCalls = 1200

// kinds of calls: a GET, a POST whose body can be made again (GetBody), and a
// POST with a one-shot body, which nobody can retry once it was sent.
const (
	get = iota
	postReplayable
	postOneShot
	nKinds
)

var kindNames = [nKinds]string{"GET", "POST-replayable", "POST-one-shot"}

// result is one call as its client saw it.
type result struct {
	kind int
	id   string
	err  error
	out  *outcome.Outcome // outbound only
}

// client makes calls of every kind, in turn, from 16 workers.
type client struct {
	name string
	do   func(*http.Request) (*http.Response, *outcome.Outcome, error)
}

// load makes calls until ctx ends, counting them in made.
func load(ctx context.Context, c client, url string, seq, made *atomic.Int64) []result {
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; ctx.Err() == nil; i++ {
				k := i % nKinds
				id := fmt.Sprintf("%s-%d", c.name, seq.Add(1)) // unique in the whole test: the backend counts by it
				req := newCall(k, url, id)
				resp, out, err := c.do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				mu.Lock()
				results = append(results, result{kind: k, id: id, err: err, out: out})
				mu.Unlock()
				made.Add(1)
			}
		})
	}
	wg.Wait()
	return results
}

func newCall(k int, url, id string) *http.Request {
	var req *http.Request
	switch k {
	case get:
		req, _ = http.NewRequest(http.MethodGet, url, nil)
	case postReplayable:
		req, _ = http.NewRequest(http.MethodPost, url, strings.NewReader(`{"qty":1}`))
	case postOneShot:
		req, _ = http.NewRequest(http.MethodPost, url, io.MultiReader(strings.NewReader(`{"qty":1}`))) // no GetBody
		req.ContentLength = 9
	}
	req.Header.Set("X-Request-Id", id)
	return req
}

// modes are the protocols between the client and nginx.
var modes = []struct {
	name   string
	scheme string
	port   func(*nginx) int
	protos func() *http.Protocols
}{
	{"HTTP/1.1", "http", func(n *nginx) int { return n.plain }, func() *http.Protocols {
		p := new(http.Protocols)
		p.SetHTTP1(true)
		return p
	}},
	{"HTTP/1.1+TLS", "https", func(n *nginx) int { return n.tlsPorts }, func() *http.Protocols {
		p := new(http.Protocols)
		p.SetHTTP1(true)
		return p
	}},
	{"HTTP/2+TLS", "https", func(n *nginx) int { return n.tlsPorts }, func() *http.Protocols {
		p := new(http.Protocols)
		p.SetHTTP2(true)
		return p
	}},
	{"h2c", "http", func(n *nginx) int { return n.h2c }, func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}},
}

// TestBehindNginxOutboundFailsNoCallThatNetHTTPGetsThrough runs, for each
// protocol, mixed calls from 16 workers through outbound and through a bare
// net/http client at the same time, against a real nginx with
// keepalive_requests 50 and keepalive_timeout 1s in front of a backend that
// counts executions: first in steady load, then while nginx is reloaded six
// times. In every protocol and phase: no GET fails through outbound, no
// outbound call ends for want of retry budget, a replayable POST fails only
// where it may have been processed, outbound's share of failed calls is at
// most net/http's (or higher by chance only: see worseByMoreThanChance), no
// POST is executed twice, and no call outbound reports not committed was
// executed.
func TestBehindNginxOutboundFailsNoCallThatNetHTTPGetsThrough(t *testing.T) {
	ca := newAuthority(t)
	backend := newCountingBackend(t)
	n := startNginx(t, strings.TrimPrefix(backend.srv.URL, "http://"), ca)
	var seq atomic.Int64 // call ids
	var report strings.Builder
	defer func() {
		t.Log("\n" + report.String())
		if path := os.Getenv("OUTBOUND_INTEROP_REPORT"); path != "" { // scripts/test prints it
			if err := os.WriteFile(path, []byte(report.String()), 0o644); err != nil {
				t.Errorf("writing the report: %v", err)
			}
		}
	}()
	fmt.Fprintf(&report, "%-13s %-7s %-16s %-9s %6s %6s %s\n", "PROTOCOL", "PHASE", "KIND", "CLIENT", "CALLS", "FAILED", "OUTBOUND FAILURES BY REASON")
	for _, m := range modes {
		t.Run(strings.ReplaceAll(m.name, "/", ""), func(t *testing.T) {
			url := fmt.Sprintf("%s://127.0.0.1:%d/api?sleep=20", m.scheme, m.port(n))
			base := func() *http.Transport {
				return &http.Transport{Protocols: m.protos(), TLSClientConfig: ca.clientConfig(), MaxIdleConnsPerHost: 64}
			}
			ob, err := outbound.New(outbound.Config{Transport: base(), Timeout: 10 * time.Second, AttemptTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer ob.Close()
			bareTransport := base()
			defer bareTransport.CloseIdleConnections()
			bare := &http.Client{Transport: bareTransport, Timeout: 10 * time.Second}
			clients := []client{
				{"outbound", ob.Do},
				{"net/http", func(r *http.Request) (*http.Response, *outcome.Outcome, error) {
					resp, err := bare.Do(r)
					return resp, nil, err
				}},
			}
			// Each phase lasts until both clients have made minCalls calls,
			// at least; the second reloads nginx every 600 ms meanwhile, 6
			// times at least.
			for _, phase := range []struct {
				name    string
				reloads int
			}{{"steady", 0}, {"reloads", 6}} {
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				results := make([][]result, len(clients))
				made := make([]atomic.Int64, len(clients))
				for i, c := range clients {
					wg.Go(func() { results[i] = load(ctx, c, url, &seq, &made[i]) })
				}
				start, reloads := time.Now(), 0
				for {
					time.Sleep(100 * time.Millisecond) // pacing the phase, not a timing assertion
					if phase.reloads > 0 && time.Since(start) >= time.Duration(reloads+1)*600*time.Millisecond {
						n.reload(t)
						reloads++
					}
					enough := made[0].Load() >= minCalls && made[1].Load() >= minCalls && reloads >= phase.reloads
					if enough && time.Since(start) >= 3*time.Second || time.Since(start) > time.Minute {
						break
					}
				}
				cancel()
				wg.Wait()
				check(t, &report, m.name, phase.name, results[0], results[1], backend)
			}
		})
	}
}

// check asserts the rules of one protocol and phase, and adds its counts to
// the report.
func check(t *testing.T, report *strings.Builder, proto, phase string, ob, bare []result, backend *countingBackend) {
	t.Helper()
	failed := func(rs []result, kind int) (calls, fails int) {
		for _, r := range rs {
			if kind < 0 || r.kind == kind {
				calls++
				if r.err != nil {
					fails++
				}
			}
		}
		return
	}
	for k := range nKinds {
		for _, c := range []struct {
			name string
			rs   []result
		}{{"outbound", ob}, {"net/http", bare}} {
			calls, fails := failed(c.rs, k)
			reasons := ""
			if c.name == "outbound" {
				reasons = failureReasons(c.rs, k)
			}
			fmt.Fprintf(report, "%-13s %-7s %-16s %-9s %6d %6d %s\n", proto, phase, kindNames[k], c.name, calls, fails, reasons)
		}
	}
	obCalls, obFails := failed(ob, -1)
	bareCalls, bareFails := failed(bare, -1)
	if obCalls < minCalls || bareCalls < minCalls {
		t.Errorf("%s %s: too few calls to say anything: outbound %d, net/http %d", proto, phase, obCalls, bareCalls)
	}
	if p := worseByMoreThanChance(obFails, obCalls, bareFails, bareCalls); p < 0.001 {
		t.Errorf("%s %s: outbound failed %d of %d calls, more than net/http's %d of %d (p = %.2g)", proto, phase, obFails, obCalls, bareFails, bareCalls, p)
	}
	shown := 0
	for _, r := range ob {
		var bad string
		switch {
		case r.err == nil:
		case r.kind == get:
			bad = "a GET failed"
		case r.out != nil && r.out.Reason == retry.BudgetExhausted:
			bad = "a call ended for want of retry budget"
		case r.kind == postReplayable && !errors.Is(r.err, outcome.ErrUnknown):
			bad = "a replayable POST failed though it was not processed"
		}
		if r.out != nil && r.out.Commit == outcome.NotCommitted && backend.executions(r.id) != 0 {
			bad = fmt.Sprintf("not committed, but executed %d times", backend.executions(r.id))
		}
		if r.kind != get && backend.executions(r.id) > 1 {
			bad = fmt.Sprintf("a POST executed %d times", backend.executions(r.id))
		}
		if bad != "" && shown < 5 {
			shown++
			t.Errorf("%s %s: %s: %v\n%v", proto, phase, bad, r.err, r.out)
		}
	}
	for _, r := range bare {
		if r.kind != get && backend.executions(r.id) > 1 {
			t.Logf("%s %s: net/http executed a POST %d times: %s", proto, phase, backend.executions(r.id), r.id)
		}
	}
}

// worseByMoreThanChance returns 1 if outbound's share of failed calls
// (fo of no) is at most net/http's (fb of nb), and otherwise the probability
// that it is that much higher by chance alone: given the fo+fb failures of
// both, how likely fo or more of them fall to outbound if every call of
// either client fails with the same probability (an exact binomial test).
// Over HTTP/1.1 both clients lose a call in a few thousand to the same race
// (nginx closing an idle connection as a one-shot body is sent on it), so
// who loses one more is a coin toss; a share really higher than net/http's
// shows as a tiny probability.
func worseByMoreThanChance(fo, no, fb, nb int) float64 {
	if fo*nb <= fb*no {
		return 1
	}
	n, q := fo+fb, float64(no)/float64(no+nb)
	p, term := 0.0, math.Pow(1-q, float64(n)) // P(X = 0)
	for k := 0; k <= n; k++ {
		if k >= fo {
			p += term
		}
		term *= float64(n-k) / float64(k+1) * q / (1 - q) // P(X = k+1) from P(X = k)
	}
	return p
}

// failureReasons summarises why outbound's failed calls of kind k ended.
func failureReasons(rs []result, k int) string {
	n := map[string]int{}
	for _, r := range rs {
		if r.kind == k && r.err != nil && r.out != nil {
			last := r.out.Attempts[len(r.out.Attempts)-1]
			n[fmt.Sprintf("%v (%v) -> %v", last.Category, last.Evidence, r.out.Reason)]++
		}
	}
	var parts []string
	for s, c := range n {
		parts = append(parts, fmt.Sprintf("%d× %s", c, s))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func TestWorseByMoreThanChanceIsAnExactBinomialTest(t *testing.T) {
	for _, tc := range []struct {
		fo, no, fb, nb int
		want           float64
	}{
		{0, 100, 5, 100, 1},           // better
		{3, 100, 3, 100, 1},           // the same
		{1, 100, 0, 100, 0.5},         // one failure: a coin toss
		{10, 100, 0, 100, 1.0 / 1024}, // ten, all outbound's
		{3, 100, 1, 300, 1 - math.Pow(0.75, 4) - 4*0.25*math.Pow(0.75, 3) - 6*0.25*0.25*0.75*0.75},
	} {
		if got := worseByMoreThanChance(tc.fo, tc.no, tc.fb, tc.nb); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%+v: %v, want %v", tc, got, tc.want)
		}
	}
}
