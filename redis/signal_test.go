package outboundredis_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/internal/redistest"
	outboundredis "github.com/outboundhq/outbound/redis"
)

type signalWorker struct {
	Redis, Upstream string
}

const signalEnv = "OUTBOUNDREDIS_SIGNAL_WORKER"

// TestSignalWorker is one replica of the breaker signal test, run as a child
// process. It reads commands on stdin — "calls N PATH" makes N calls —
// and prints "ok" after each, and "open UNIXNANO REASON" when its breaker
// opens.
func TestSignalWorker(t *testing.T) {
	spec := os.Getenv(signalEnv)
	if spec == "" {
		t.Skip("a child process of TestOneReplicasOpeningOpensTheOthersWithNoRedisCallWhileClosed")
	}
	var w signalWorker
	if err := json.Unmarshal([]byte(spec), &w); err != nil {
		t.Fatal(err)
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{w.Redis}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sig, err := outboundredis.NewSignal(outboundredis.SignalConfig{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	say := func(format string, args ...any) { mu.Lock(); fmt.Printf(format+"\n", args...); mu.Unlock() }
	tr, err := outbound.New(outbound.Config{MaxAttempts: 1, Admission: admission.Config{
		Circuit: circuit.Config{WindowSize: 4, MinimumCalls: 4, WaitInOpen: time.Minute},
		OnEvent: func(e admission.Event) {
			sig.Observe(e)
			if e.Kind == admission.Transition && e.Transition.To == circuit.Open {
				say("open %d %v", time.Now().UnixNano(), e.Transition.Cause)
			}
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := sig.Attach(tr); err != nil {
		t.Fatal(err)
	}
	defer sig.Close()
	hc := &http.Client{Transport: tr}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var n int
		var path string
		if _, err := fmt.Sscanf(in.Text(), "calls %d %s", &n, &path); err != nil {
			t.Fatalf("command %q: %v", in.Text(), err)
		}
		for range n {
			if resp, err := hc.Get(w.Upstream + path); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		say("ok")
	}
}

// replica is a child process running TestSignalWorker.
type replica struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	opened chan time.Time
}

func startReplica(t *testing.T, w signalWorker) *replica {
	t.Helper()
	spec, _ := json.Marshal(w)
	r := &replica{lines: make(chan string, 16), opened: make(chan time.Time, 4)}
	r.cmd = exec.Command(os.Args[0], "-test.run=^TestSignalWorker$", "-test.count=1")
	r.cmd.Env = append(os.Environ(), signalEnv+"="+string(spec))
	r.cmd.Stderr = os.Stderr
	r.stdin, _ = r.cmd.StdinPipe()
	out, _ := r.cmd.StdoutPipe()
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.stdin.Close(); r.cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "open" {
				ns, _ := strconv.ParseInt(f[1], 10, 64)
				r.opened <- time.Unix(0, ns)
			} else {
				r.lines <- sc.Text()
			}
		}
		close(r.lines)
	}()
	return r
}

// do makes n calls to path and waits for them.
func (r *replica) do(t *testing.T, n int, path string) {
	t.Helper()
	fmt.Fprintf(r.stdin, "calls %d %s\n", n, path)
	select {
	case l, ok := <-r.lines:
		if !ok || l != "ok" {
			t.Fatalf("replica answered %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("replica did not answer within 30 s")
	}
}

// commands returns the calls the Redis server has run, by command, but for
// INFO itself.
func commands(t *testing.T, c rueidis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for l := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		m[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return m
}

// Three replicas share an upstream; it fails for one of them only. That
// one's breaker opens, and the other two are OPEN within a second. While
// CLOSED, calls make no Redis command at all.
func TestOneReplicasOpeningOpensTheOthersWithNoRedisCallWhileClosed(t *testing.T) {
	srv := redistest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer up.Close()
	w := signalWorker{Redis: srv.Addr(), Upstream: up.URL}
	rs := []*replica{startReplica(t, w), startReplica(t, w), startReplica(t, w)}
	for _, r := range rs {
		r.do(t, 1, "/ok") // each has the upstream's state
	}
	rc := client(t, srv.Addr())
	before := commands(t, rc)
	for _, r := range rs {
		r.do(t, 200, "/ok")
	}
	after := commands(t, rc)
	for cmd, n := range after {
		if n != before[cmd] {
			t.Errorf("%d %s commands during 600 calls while CLOSED, want none", n-before[cmd], cmd)
		}
	}
	rs[0].do(t, 4, "/fail")
	var first time.Time
	select {
	case first = <-rs[0].opened:
	case <-time.After(10 * time.Second):
		t.Fatal("the failing replica's breaker did not open")
	}
	for i, r := range rs[1:] {
		select {
		case at := <-r.opened:
			if d := at.Sub(first); d > time.Second {
				t.Errorf("replica %d opened %v after the failing one, want within 1 s", i+1, d)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("replica %d did not open within 5 s of the failing one", i+1)
		}
	}
	if n := commands(t, rc)["publish"] - after["publish"]; n != 1 {
		t.Errorf("%d publications, want 1: openings the signal applied must not be published again", n)
	}
}

// Only an opening from CLOSED is published: a failed round of trial calls
// (HALF_OPEN to OPEN) would reopen replicas that closed on their own good
// trials; openings the signal applied, Retry-After pauses and SetState are
// not evidence of this process's own.
func TestOnlyAnOpeningFromClosedOnItsOwnEvidenceIsPublished(t *testing.T) {
	srv := redistest.Start(t)
	c := client(t, srv.Addr())
	sig, err := outboundredis.NewSignal(outboundredis.SignalConfig{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	defer sig.Close()
	open := func(from circuit.State, r circuit.Cause) admission.Event {
		return admission.Event{Upstream: "up", Kind: admission.Transition,
			Transition: circuit.Transition{From: from, To: circuit.Open, Cause: r, Wait: time.Minute}}
	}
	for _, e := range []admission.Event{
		open(circuit.HalfOpen, circuit.CauseFailureRate),
		open(circuit.Closed, circuit.CauseOpenFor),
		open(circuit.Closed, circuit.CauseManual),
		open(circuit.Closed, circuit.CauseSlowCallRate),
		open(circuit.Closed, circuit.CauseFailureRate),
	} {
		sig.Observe(e)
	}
	waitFor(t, "two publications", func() bool { return commands(t, c)["publish"] >= 2 })
	time.Sleep(50 * time.Millisecond) // room for a third, which must not come; not a timing assertion
	if n := commands(t, c)["publish"]; n != 2 {
		t.Fatalf("%d publications, want 2 (the openings from CLOSED on failure and slow-call rates)", n)
	}
}

// An Attach that cannot confirm its subscription fails within its Timeout
// and leaves the Signal as it was: a later Attach, with Redis back, works.
func TestAnAttachThatFailsCanBeMadeAgain(t *testing.T) {
	srv := redistest.Start(t)
	c := client(t, srv.Addr())
	sig, err := outboundredis.NewSignal(outboundredis.SignalConfig{Client: c, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sig.Close()
	tr, err := outbound.New(outbound.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	srv.Pause()
	start := time.Now()
	if err := sig.Attach(tr); err == nil {
		t.Fatal("attached to a Redis that does not answer")
	}
	if d := time.Since(start); d > 2*time.Second { // generous: the bound is the Timeout
		t.Errorf("Attach took %v with a Timeout of 200ms", d)
	}
	srv.Resume()
	if err := sig.Attach(tr); err != nil {
		t.Fatalf("Attach after Redis came back: %v", err)
	}
}

// breakerSet is a Breakers of fixed breakers.
type breakerSet map[string]*circuit.Breaker

func (b breakerSet) Breaker(upstream string) (*circuit.Breaker, bool) {
	br, ok := b[upstream]
	return br, ok
}

// Regression: an opening published while Redis was frozen was delivered
// when it came back, 1.9 s later, after its publication had timed out, and
// opened the other replicas' breakers late. A replica drops an opening that
// arrives after its publication's Timeout; one that arrives in time opens
// its breaker.
func TestAnOpeningDeliveredAfterItsPublicationTimedOutIsDropped(t *testing.T) {
	srv := redistest.Start(t)
	br, err := circuit.New(circuit.Config{})
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan bool, 4)
	sub, err := outboundredis.NewSignal(outboundredis.SignalConfig{Client: client(t, srv.Addr()), Replica: "sub",
		OnReceive: func(upstream, replica string, wait time.Duration, ok bool) { applied <- ok }})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Attach(breakerSet{"up": br}); err != nil {
		t.Fatal(err)
	}
	pub, err := outboundredis.NewSignal(outboundredis.SignalConfig{Client: client(t, srv.Addr()), Replica: "pub",
		Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	opening := admission.Event{Upstream: "up", Kind: admission.Transition,
		Transition: circuit.Transition{From: circuit.Closed, To: circuit.Open, Cause: circuit.CauseFailureRate, Wait: time.Minute}}

	srv.Pause()
	pub.Observe(opening)
	time.Sleep(time.Second) // Redis frozen past the publication's Timeout: the fault itself, not a timing assertion
	srv.Resume()
	select {
	case <-applied:
		t.Fatal("an opening delivered after its publication timed out was applied")
	case <-time.After(500 * time.Millisecond): // room for a late delivery, which must not come
	}
	if st := br.State(); st != circuit.Closed {
		t.Fatalf("the breaker is %v after a late opening, want CLOSED", st)
	}
	pub.Observe(opening)
	select {
	case ok := <-applied:
		if !ok || br.State() != circuit.Open {
			t.Fatalf("an opening in time: applied %v, breaker %v", ok, br.State())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an opening published in time was not received")
	}
}
