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
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// countingBackend is the upstream behind the proxy. It counts, per
// X-Request-Id, the requests it received whole: the ground truth for
// "executed at most once" and "not committed means not executed".
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

func (b *countingBackend) addr() string { return strings.TrimPrefix(b.srv.URL, "http://") }

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

// phase is a stretch of load on one protocol, with what happens to the proxy
// meanwhile.
type phase struct {
	name string
	// sleep is how long the backend works on each call, in milliseconds.
	sleep int
	// gap, if set, makes the workers call in rounds: all at once, then
	// none for gap() after the round's last answer. The idle phase spaces
	// its rounds around the proxy's keep-alive timeout, so that connections
	// are closed while idle, often as the next round's requests arrive.
	gap func() time.Duration
	// reloads is how many times the proxy is reloaded, one every every.
	reloads int
	every   time.Duration
	// minCalls is the least number of calls each client makes; minTime,
	// the least time the phase lasts.
	minCalls int
	minTime  time.Duration
}

// load makes calls until ctx ends, counting them in made: from 16 workers,
// each calling again as soon as it has its answer, or, with gap, in rounds —
// the 16 workers call at once, and the next round starts gap() after the
// last call of this one ended. A round's gap is counted from its own end,
// so the connections of either client of a pair stay idle for the same
// times, however fast each is.
func load(ctx context.Context, c client, url string, gap func() time.Duration, seq, made *atomic.Int64) []result {
	var mu sync.Mutex
	var results []result
	call := func(i int) {
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
	var wg sync.WaitGroup
	if gap == nil {
		for w := range 16 {
			wg.Go(func() {
				for i := w; ctx.Err() == nil; i++ {
					call(i)
				}
			})
		}
		wg.Wait()
		return results
	}
	for round := 0; ; round++ {
		select {
		case <-ctx.Done():
			return results
		case <-time.After(gap()): // pacing the load, not a timing assertion
		}
		for w := range 16 {
			wg.Go(func() { call(w + round) })
		}
		wg.Wait()
	}
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

// mode is a protocol between the client and the proxy.
type mode struct {
	name   string
	scheme string
	port   func(ports) int
	protos func() *http.Protocols
}

// ports are the proxy's listening ports: HTTP/1.1, HTTP/2 with prior
// knowledge, TLS (ALPN h2 and http/1.1).
type ports struct{ plain, h2c, tls int }

func protocols(set func(*http.Protocols)) func() *http.Protocols {
	return func() *http.Protocols {
		p := new(http.Protocols)
		set(p)
		return p
	}
}

var modes = []mode{
	{"HTTP/1.1", "http", func(p ports) int { return p.plain }, protocols(func(p *http.Protocols) { p.SetHTTP1(true) })},
	{"HTTP/1.1+TLS", "https", func(p ports) int { return p.tls }, protocols(func(p *http.Protocols) { p.SetHTTP1(true) })},
	{"HTTP/2+TLS", "https", func(p ports) int { return p.tls }, protocols(func(p *http.Protocols) { p.SetHTTP2(true) })},
	{"h2c", "http", func(p ports) int { return p.h2c }, protocols(func(p *http.Protocols) { p.SetUnencryptedHTTP2(true) })},
}

// pair is outbound and a bare net/http client, configured alike, for one
// protocol; opened counts the times outbound's breaker opened.
type pair struct {
	clients []client
	opened  atomic.Int64
}

func newPair(t *testing.T, m mode, ca *authority) *pair {
	base := func() *http.Transport {
		return &http.Transport{Protocols: m.protos(), TLSClientConfig: ca.clientConfig(), MaxIdleConnsPerHost: 64}
	}
	p := &pair{}
	ob, err := outbound.New(outbound.Config{HTTPTransport: base(), Timeout: 10 * time.Second, AttemptTimeout: 5 * time.Second,
		Hooks: outbound.Hooks{Guard: func(e admission.Event) {
			if e.Kind == admission.Transition && e.Transition.To == circuit.Open {
				p.opened.Add(1)
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ob.Close() })
	bareTransport := base()
	t.Cleanup(bareTransport.CloseIdleConnections)
	bare := &http.Client{Transport: bareTransport, Timeout: 10 * time.Second}
	p.clients = []client{
		{"outbound", ob.Do},
		{"net/http", func(r *http.Request) (*http.Response, *outcome.Outcome, error) {
			resp, err := bare.Do(r)
			return resp, nil, err
		}},
	}
	return p
}

// run drives both clients of p against url through phase ph, calling
// reload as the phase asks, and returns their results.
func (p *pair) run(url string, ph phase, seq *atomic.Int64, reload func()) (ob, bare []result) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	results := make([][]result, len(p.clients))
	made := make([]atomic.Int64, len(p.clients))
	for i, c := range p.clients {
		wg.Go(func() { results[i] = load(ctx, c, url, ph.gap, seq, &made[i]) })
	}
	start, reloads := time.Now(), 0
	for {
		time.Sleep(50 * time.Millisecond) // pacing the phase, not a timing assertion
		if reloads < ph.reloads && time.Since(start) >= time.Duration(reloads+1)*ph.every {
			reload()
			reloads++
		}
		enough := made[0].Load() >= int64(ph.minCalls) && made[1].Load() >= int64(ph.minCalls) && reloads >= ph.reloads
		if enough && time.Since(start) >= ph.minTime || time.Since(start) > time.Minute {
			break
		}
	}
	cancel()
	wg.Wait()
	return results[0], results[1]
}

// runPhases runs the phases on every protocol (mode), a pair of clients per
// protocol. The idle phases, which mostly wait, run for every protocol at
// once; the others one protocol at a time. reloader gives the function that
// reloads the proxy during a phase.
func runPhases(t *testing.T, report *strings.Builder, backend *countingBackend, ca *authority, p ports, seq *atomic.Int64,
	phases []phase, reloader func(phase) func()) {
	pairs := make([]*pair, len(modes))
	for i, m := range modes {
		pairs[i] = newPair(t, m, ca)
	}
	for _, ph := range phases {
		type results struct{ ob, bare []result }
		outs := make([]results, len(modes))
		opened := make([]int64, len(modes))
		runOne := func(i int) {
			m := modes[i]
			url := fmt.Sprintf("%s://127.0.0.1:%d/api?sleep=%d", m.scheme, m.port(p), ph.sleep)
			before := pairs[i].opened.Load()
			outs[i].ob, outs[i].bare = pairs[i].run(url, ph, seq, reloader(ph))
			opened[i] = pairs[i].opened.Load() - before
		}
		if ph.gap != nil && ph.reloads == 0 {
			done := make(chan int)
			for i := range modes {
				go func() { runOne(i); done <- i }()
			}
			for range modes {
				<-done
			}
		} else {
			for i := range modes {
				runOne(i)
			}
		}
		for i, m := range modes {
			check(t, report, m.name, ph.name, outs[i].ob, outs[i].bare, backend, opened[i])
		}
	}
}

// failedCall reports whether a call failed from its caller's point of view:
// it returned an error or a status other than 200, or it was a POST that the
// backend executed more than once (a duplicate is a failure, even when the
// client that made it reported success).
func failedCall(r result, b *countingBackend) bool {
	return r.err != nil || r.kind != get && b.executions(r.id) > 1
}

// check asserts the rules of one protocol and phase, and adds its counts to
// the report: for outbound, 0 failed GETs, no call ended for want of retry
// budget, no call reported not committed that the backend executed, no POST
// executed twice, a replayable POST failed only where it may have been
// processed or with the proxy's own answer (proxyAnswered), the breaker never opened (the backend is healthy), and per kind
// of call a share of failed calls (failedCall) at most net/http's, or higher
// by chance only (worseByMoreThanChance).
func check(t *testing.T, report *strings.Builder, proto, phase string, ob, bare []result, backend *countingBackend, opened int64) {
	t.Helper()
	failed := func(rs []result, kind int) (calls, fails int) {
		for _, r := range rs {
			if kind < 0 || r.kind == kind {
				calls++
				if failedCall(r, backend) {
					fails++
				}
			}
		}
		return
	}
	for k := range nKinds {
		obCalls, obFails := failed(ob, k)
		bareCalls, bareFails := failed(bare, k)
		fmt.Fprintf(report, "%-13s %-8s %-16s %-9s %6d %6d %s\n", proto, phase, kindNames[k], "outbound", obCalls, obFails, failureReasons(ob, k))
		fmt.Fprintf(report, "%-13s %-8s %-16s %-9s %6d %6d %s\n", proto, phase, kindNames[k], "net/http", bareCalls, bareFails, bareFailures(bare, k, backend))
		if p := worseByMoreThanChance(obFails, obCalls, bareFails, bareCalls); p < 0.001 {
			t.Errorf("%s %s %s: outbound failed %d of %d calls, more than net/http's %d of %d (p = %.2g)%s",
				proto, phase, kindNames[k], obFails, obCalls, bareFails, bareCalls, p, attemptsOfFailed(ob, k, backend))
		}
	}
	if opened > 0 {
		t.Errorf("%s %s: outbound's breaker opened %d times in front of a healthy backend", proto, phase, opened)
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
		case r.kind == postReplayable && !errors.Is(r.err, outcome.ErrUnknown) && !proxyAnswered(r):
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
}

// proxyAnswered reports whether r failed after an answer (outcome
// Committed): a status other than 200, or an answer whose body broke. The
// first is the proxy's own verdict: HAProxy answers 502 when the backend
// connection it forwarded a request on fails, whether or not the backend
// executed it (seen in the hard-stop phase over HTTP/1.1 with TLS, for POSTs
// the backend never executed). The client learns only the answer; a
// non-idempotent request is not sent again after it, by outbound or
// net/http, and the call counts as failed in the comparison with net/http.
func proxyAnswered(r result) bool {
	return r.out != nil && r.out.Commit == outcome.Committed
}

// attemptsOfFailed describes the attempts of the first five of outbound's
// failed calls of kind k, with their errors, and how often the backend
// executed each.
func attemptsOfFailed(rs []result, k int, b *countingBackend) string {
	var sb strings.Builder
	shown := 0
	for _, r := range rs {
		if r.kind != k || !failedCall(r, b) || r.out == nil || shown == 5 {
			continue
		}
		shown++
		fmt.Fprintf(&sb, "\n  %s, executed %d times:", r.id, b.executions(r.id))
		for _, a := range r.out.Attempts {
			fmt.Fprintf(&sb, "\n    %v %v (%v) -> %v: %v", a.Stage, a.Category, a.Evidence, a.Decision, a.Err)
		}
	}
	return sb.String()
}

// worseByMoreThanChance returns 1 if outbound's share of failed calls
// (fo of no) is at most net/http's (fb of nb), and otherwise the probability
// that it is that much higher by chance alone: given the fo+fb failures of
// both, how likely fo or more of them fall to outbound if every call of
// either client fails with the same probability (an exact binomial test).
// Over HTTP/1.1 both clients lose a call in a few thousand to the same race
// (a proxy closing an idle connection as a one-shot body is sent on it), so
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
	return summary(n)
}

// bareFailures summarises net/http's failed calls of kind k: its errors,
// with their text shortened, and the duplicates it made.
func bareFailures(rs []result, k int, b *countingBackend) string {
	n := map[string]int{}
	for _, r := range rs {
		switch {
		case r.kind != k:
		case r.err != nil:
			err := r.err
			var ue *url.Error
			if errors.As(err, &ue) { // its text repeats the method and the URL
				err = ue.Err
			}
			n[err.Error()]++
		case k != get && b.executions(r.id) > 1:
			n["executed twice"]++
		}
	}
	return summary(n)
}

func summary(n map[string]int) string {
	var parts []string
	for s, c := range n {
		parts = append(parts, fmt.Sprintf("%d× %s", c, s))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// newReport starts the table of a test; the returned function logs it and,
// when OUTBOUND_INTEROP_REPORT names a file (scripts/test prints it), adds it
// there.
func newReport(t *testing.T, title string) (*strings.Builder, func()) {
	var report strings.Builder
	fmt.Fprintf(&report, "%s\n%-13s %-8s %-16s %-9s %6s %6s %s\n", title, "PROTOCOL", "PHASE", "KIND", "CLIENT", "CALLS", "FAILED", "FAILURES")
	return &report, func() {
		t.Log("\n" + report.String())
		if path := os.Getenv("OUTBOUND_INTEROP_REPORT"); path != "" {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err == nil {
				_, err = fmt.Fprintln(f, report.String())
				f.Close()
			}
			if err != nil {
				t.Errorf("writing the report: %v", err)
			}
		}
	}
}

// idleGap spaces rounds of calls around timeout, the proxy's keep-alive
// timeout, within 15 ms either side: the next round's requests arrive as
// the proxy closes the connections that the last round left idle.
func idleGap(timeout time.Duration) func() time.Duration {
	const spread = 15 * time.Millisecond
	return func() time.Duration {
		return timeout - spread + rand.N(2*spread)
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

// requireBinary returns the path of a program the test needs, or skips the
// test saying so where it is not installed and env (which scripts/test sets
// where it installed the program) is not set.
func requireBinary(t *testing.T, name, pkg, env string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err == nil {
		return bin
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} { // not always on a user's PATH
		if p := dir + "/" + name; fileExists(p) {
			return p
		}
	}
	if os.Getenv(env) != "" {
		t.Fatalf("%s is required (%s is set) but not installed: %v", name, env, err)
	}
	t.Skipf("%s is not installed (Debian package %s; scripts/test installs it): skipping the tests against a real %s", name, pkg, name)
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
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
