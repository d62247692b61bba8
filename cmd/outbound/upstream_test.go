package main

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/outboundhq/outbound/outboundtest"
)

// lockedBuffer is a bytes.Buffer that several goroutines write and read;
// ready receives the first line written.
type lockedBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	ready chan string
	sent  bool
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	if line, _, ok := strings.Cut(b.buf.String(), "\n"); ok && !b.sent && b.ready != nil {
		b.sent = true
		b.ready <- line
	}
	return n, err
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startUpstream runs `outbound upstream args --addr 127.0.0.1:0` in-process
// and returns its URL, once it listens, and a function that stops it (as
// Ctrl-C does) and returns what it printed; the test's end stops it too.
func startUpstream(t *testing.T, args ...string) (url string, stop func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &lockedBuffer{ready: make(chan string, 1)}
	var errOut lockedBuffer
	done := make(chan int, 1)
	go func() { done <- runUpstream(ctx, append(args, "--addr", "127.0.0.1:0"), out, &errOut) }()
	select {
	case first := <-out.ready: // listening on http://127.0.0.1:PORT (HTTP1), every …
		url, _, _ = strings.Cut(strings.TrimPrefix(first, "listening on "), " ")
	case code := <-done:
		cancel()
		t.Fatalf("outbound upstream %q: exit %d before it listened: %s", args, code, errOut.String())
	}
	var once sync.Once
	var printed string
	stop = func() string {
		once.Do(func() {
			cancel()
			if code := <-done; code != exitOK {
				t.Errorf("outbound upstream %q: exit %d: %s", args, code, errOut.String())
			}
			printed = out.String()
		})
		return printed
	}
	t.Cleanup(func() { stop() })
	return url, stop
}

// faultsInHelp returns the fault specs that `outbound upstream -h` names,
// between "FAULT is" and the example; the forms it explains with
// placeholders (GoAway(N, P, answer)) are left out.
func faultsInHelp(t *testing.T) []string {
	code, out, _ := runCLI("help", "upstream")
	if code != exitOK {
		t.Fatalf("help upstream: exit %d", code)
	}
	_, list, ok := strings.Cut(out, "FAULT is")
	list, _, ok2 := strings.Cut(list, "Example:")
	if !ok || !ok2 {
		t.Fatalf("no fault list in the help:\n%s", out)
	}
	var specs []string
	for _, spec := range regexp.MustCompile(`[A-Z][A-Za-z]+\([^)]*\)`).FindAllString(strings.Join(strings.Fields(list), " "), -1) {
		if _, err := outboundtest.ParseFault(spec); err != nil {
			if spec != "GoAway(N, P, answer)" && spec != "HardStop(N)" {
				t.Errorf("the help names %s, which does not parse: %v", spec, err)
			}
			continue
		}
		if !slices.Contains(specs, spec) {
			specs = append(specs, spec)
		}
	}
	if len(specs) < 21 {
		t.Fatalf("%d faults found in the help: %q", len(specs), specs)
	}
	return specs
}

// Every fault the help of `outbound upstream` lists is served, as it says
// in the help: each is given, as the help spells it, to a request of
// `outbound do` (by header, or by --conn-fault for the connection faults),
// and do's exit status, verdict and the upstream's counts are checked.
func TestUpstreamServesEveryFaultItsHelpLists(t *testing.T) {
	type check struct {
		proto    string   // "" http1, or h2c
		conn     bool     // --conn-fault
		do       []string // do's flags; "-H Outbound-Test-Fault: SPEC" and the URL are added
		exits    []int    // do's exit status: one of these
		stderr   []string // in do's standard error
		stdout   string   // do's standard output, when not ""
		received int      // by the upstream for the call id "c" (conn faults: connections, at least)
		executed int
	}
	post := []string{"-d", `{"qty":1}`}
	unknownPost := "verdict: unknown — the upstream may have processed it; reconcile before sending again"
	checks := map[string]check{
		"Respond(503, Retry-After, 30)": {exits: []int{exitOK}, stderr: []string{"status 503", "Retry-After asked: 30"}, stdout: "ok\n", received: 1, executed: 1},
		"Slow(2s, 200)": {do: []string{"-m", "0.2"}, exits: []int{exitTimeout}, received: 1, executed: 1,
			stderr: []string{"timed out: the call's deadline (-m 200ms) expired before an answer", "GET is idempotent: sending it again is safe"}},
		"Hang()":          {do: append([]string{"-m", "0.2"}, post...), exits: []int{exitUnknown}, stderr: []string{"timed out", unknownPost}, received: 1, executed: 1},
		"Queued(8, 20ms)": {exits: []int{exitOK}, stdout: "ok\n", received: 1, executed: 1},
		"ResetBeforeRead()": {do: post, exits: []int{exitUnknown}, received: 1, executed: 0,
			stderr: []string{"attempt 1: Ambiguous at ", unknownPost}},
		"ResetAfterRead()": {do: post, exits: []int{exitUnknown}, received: 1, executed: 1,
			stderr: []string{"attempt 1: Ambiguous at ", unknownPost}},
		"CloseBeforeRead()": {do: post, exits: []int{exitUnknown}, received: 1, executed: 0,
			stderr: []string{"attempt 1: Ambiguous at ", unknownPost}},
		"PartialHeaders()": {do: post, exits: []int{exitUnknown}, received: 1, executed: 1,
			stderr: []string{"malformed MIME header", unknownPost}},
		"TruncatedBody(100, 10)": {exits: []int{exitTruncated}, stdout: strings.Repeat("x", 10), received: 1, executed: 1,
			stderr: []string{"error: the body ended early, after 10 byte(s) of 100"}},
		"Trickle(10ms, 64)":    {exits: []int{exitOK}, stdout: strings.Repeat("x", 64), received: 1, executed: 1},
		"HugeHeaders(1048576)": {exits: []int{exitOK}, stdout: "", stderr: []string{"outcome: committed"}, received: 1, executed: 1},
		"BadStatusLine()": {do: post, exits: []int{exitUnknown}, received: 1, executed: 1,
			stderr: []string{`malformed HTTP status code "2x0"`, unknownPost}},
		"EndlessBody()": {do: []string{"-m", "0.3", "-o", "/dev/null"}, exits: []int{exitTimeout}, received: 1, executed: 1,
			stderr: []string{"timed out: the call's deadline (-m 300ms) expired while the body streamed"}},
		"CloseMidStream()": {exits: []int{exitTruncated}, stdout: "partial body", received: 1, executed: 1,
			stderr: []string{"error: the body ended early, after 12 byte(s)"}},
		"RefusedStream()": {proto: "h2c", do: post, exits: []int{exitOK}, stdout: "ok\n", received: 2, executed: 1,
			stderr: []string{"attempt 1: NotSent at await-response (REFUSED_STREAM)", "attempt 2: Answered"}},
		"ResetStream(CANCEL)": {proto: "h2c", do: post, exits: []int{exitUnknown}, received: 1, executed: 1,
			stderr: []string{"attempt 1: Ambiguous at await-response (stream reset)", "CANCEL", unknownPost}},
		"GoAway(1, 0, false)": {proto: "h2c", do: post, exits: []int{exitOK}, stdout: "ok\n", received: 2, executed: 1,
			stderr: []string{"attempt 1: NotSent at await-response (stream above GOAWAY last-stream-id)", "attempt 2: Answered"}},
		"GoAway(1, 1, false)": {proto: "h2c", do: post, exits: []int{exitUnknown}, received: 1, executed: 1,
			stderr: []string{"attempt 1: Ambiguous at await-response (stream at or below GOAWAY last-stream-id)", unknownPost}},
		"HardStop(1)": {proto: "h2c", do: post, exits: []int{exitUnknown}, received: 1, executed: 1,
			stderr: []string{"stream reset by a connection going away (after its GOAWAY)", "REFUSED_STREAM", unknownPost}},
		// Whether the client had written its request when the reset or
		// the close arrived is a race: not committed or unknown.
		"ResetOnAccept()": {conn: true, do: []string{"--max-attempts", "1"}, exits: []int{exitNotCommitted, exitUnknown}, received: 1,
			stderr: []string{"outcome: ", "verdict: "}},
		"CloseOnAccept()": {conn: true, do: []string{"--max-attempts", "1"}, exits: []int{exitNotCommitted, exitUnknown}, received: 1,
			stderr: []string{"outcome: ", "verdict: "}},
		"StallOnAccept()": {conn: true, do: []string{"-m", "0.2"}, exits: []int{exitTimeout}, received: 1,
			stderr: []string{"timed out: the call's deadline (-m 200ms) expired before an answer", "GET is idempotent"}},
	}
	specs := faultsInHelp(t)
	for _, spec := range specs {
		if _, ok := checks[spec]; !ok {
			t.Errorf("the help lists %s, which this test does not try", spec)
		}
	}
	for spec, c := range checks {
		if !slices.Contains(specs, spec) {
			t.Errorf("this test tries %s, which the help does not list", spec)
		}
		t.Run(spec, func(t *testing.T) {
			t.Parallel()
			var args []string
			if c.proto != "" {
				args = append(args, "--proto", c.proto)
			}
			if c.conn {
				args = append(args, "--conn-fault", spec)
			}
			url, stop := startUpstream(t, args...)
			do := append([]string{"do"}, c.do...)
			if c.proto == "h2c" {
				do = append(do, "--h2c")
			}
			if !c.conn {
				do = append(do, "-H", outboundtest.FaultHeader+": "+spec)
			}
			do = append(do, "-H", outboundtest.IDHeader+": c", url+"/orders")
			code, out, errOut := runCLI(do...)
			printed := stop()
			ok := false
			for _, e := range c.exits {
				ok = ok || code == e
			}
			if !ok {
				t.Errorf("exit %d, want one of %v", code, c.exits)
			}
			for _, w := range c.stderr {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q", w)
				}
			}
			if code == exitNotCommitted && !strings.Contains(errOut, "verdict: not committed") ||
				code == exitUnknown && !strings.Contains(errOut, "verdict: unknown") {
				t.Errorf("exit %d with another verdict", code)
			}
			if c.stdout != "" && out != c.stdout {
				t.Errorf("stdout %q, want %q", out, c.stdout)
			}
			if c.conn {
				m := regexp.MustCompile(`(\d+) connection\(s\) accepted, every one given (.*): no request was read`).FindStringSubmatch(printed)
				n := 0
				if m != nil {
					n, _ = strconv.Atoi(m[1])
				}
				if m == nil || n < c.received || m[2] != spec {
					t.Errorf("the upstream printed:\n%s", printed)
				}
			} else if !regexp.MustCompile(fmt.Sprintf(`(?m)^c\s+%d\s+%d$`, c.received, c.executed)).MatchString(printed) {
				t.Errorf("the upstream counted, want c received %d and executed %d:\n%s", c.received, c.executed, printed)
			}
			if t.Failed() {
				t.Logf("outbound %q:\n%s", do, errOut)
			}
		})
	}
}

// The faults of a request and of a connection each go to their own flag;
// --conn-fault serves no request, so the request flags are refused with it.
func TestUpstreamRefusesAFaultOnTheWrongFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--fault", "ResetOnAccept()"}, "--fault: ResetOnAccept() is a connection-level fault: give it to --conn-fault"},
		{[]string{"--conn-fault", "Hang()"}, "--conn-fault: Hang() is a fault of a request: give it to --fault, or name it in the Outbound-Test-Fault header"},
		{[]string{"--conn-fault", "ResetOnAccept()", "--fault", "Hang()"}, "--fault with --conn-fault: every connection gets the connection fault"},
		{[]string{"--conn-fault", "StallOnAccept()", "--proto", "h2tls", "--cert", "c.pem", "--requests-per-conn", "2"}, "--cert, --requests-per-conn with --conn-fault: "},
		{[]string{"--conn-fault", "Nope()"}, `no fault named "Nope"`},
		{[]string{"--faul", "Hang()"}, "unknown flag --faul; did you mean --fault?"},
	} {
		code, _, errOut := runCLI(append([]string{"upstream", "--addr", "127.0.0.1:0"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("upstream %q: exit %d, stderr %q, want %q", tc.args, code, errOut, tc.want)
		}
	}
}
