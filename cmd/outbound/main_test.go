package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboundhq/outbound/drill"
	"github.com/outboundhq/outbound/internal/mutate"
	"github.com/outboundhq/outbound/outboundtest"
)

func runCLI(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestDrillPassesWithJSONVerdictsAndExecutionCounts(t *testing.T) {
	if testing.Short() {
		t.Skip("the drill takes a few seconds")
	}
	html := filepath.Join(t.TempDir(), "report.html")
	code, out, errOut := runCLI("drill", "--json", "--html", html)
	var r drill.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("JSON: %v\n%s\n%s", err, out, errOut)
	}
	if code != exitOK || !r.Passed {
		for _, s := range r.Scenarios {
			if !s.Passed {
				t.Errorf("%s failed: %+v", s.Name, s.Checks)
			}
		}
		t.Fatalf("exit %d, passed %v", code, r.Passed)
	}
	execs := map[string]int{}
	for _, s := range r.Scenarios {
		if !s.Passed {
			t.Errorf("%s failed: %+v", s.Name, s.Checks)
		}
		execs[s.Name] = s.Executions
	}
	// What the upstream counted, scenario by scenario, where it is exact.
	for name, want := range map[string]int{
		"503-storm":                   10, // the window, then the circuit fails fast
		"refused-stream":              1,  // the refused attempt was not executed
		"goaway-below-and-above":      4,  // a warm-up GET and each POST once
		"retry-after-beyond-deadline": 1,
		"one-shot-streamed-put":       1,
	} {
		if execs[name] != want {
			t.Errorf("%s: the upstream executed %d requests, want %d", name, execs[name], want)
		}
	}
	if st, err := os.Stat(html); err != nil || st.Size() < 1000 {
		t.Fatalf("HTML report: %v", err)
	}
}

func TestABrokenClientFailsTheDrillWithExitStatus1(t *testing.T) {
	if !mutate.Enabled {
		t.Skip("needs the deliberate faults: go test -tags mutate (scripts/test does)")
	}
	mutate.KeepCircuitPermitOnLocalRejection.Store(true)
	defer mutate.KeepCircuitPermitOnLocalRejection.Store(false)
	code, out, _ := runCLI("drill", "--scenario", "recovery-under-backpressure")
	if code != exitFailed || !strings.Contains(out, "FAIL  recovery-under-backpressure") ||
		!strings.Contains(out, "[BAD] the breaker closes again once the upstream is back") {
		t.Fatalf("exit %d, output:\n%s", code, out)
	}
}

func TestDrillListsScenariosAndRejectsUnknownOnes(t *testing.T) {
	code, out, _ := runCLI("drill", "--list")
	if code != exitOK || !strings.Contains(out, "recovery-under-backpressure") || !strings.Contains(out, "goaway-below-and-above") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	code, _, errOut := runCLI("drill", "--scenario", "nope")
	if code != exitUsage || !strings.Contains(errOut, `no scenario "nope"`) || !strings.Contains(errOut, "--list") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

func TestDoRefusedConnectionIsNotCommitted(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.Pause()
	code, _, errOut := runCLI("do", "--max-attempts", "1", "-d", "x", s.URL+"/orders")
	if code != exitNotCommitted || !strings.Contains(errOut, "attempt 1: NotSent at dial (no connection)") ||
		!strings.Contains(errOut, "verdict: not committed") {
		t.Fatalf("exit %d:\n%s", code, errOut)
	}
}

func TestDoRefusedStreamIsRetriedAndCommitted(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.H2C)
	defer s.Close()
	s.Enqueue(outboundtest.RefusedStream())
	code, out, errOut := runCLI("do", "--h2c", "-v", "-H", outboundtest.IDHeader+": a", "-d", `{"qty":1}`, s.URL+"/orders")
	for _, want := range []string{
		"attempt 1: NotSent at await-response (REFUSED_STREAM)", "-> retryable",
		"attempt 2: Answered", "outcome: committed after 2 attempt(s)", "circuit-enter", "> POST /orders HTTP/2", "> Host: 127.0.0.1:", "< HTTP/2 200",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("missing %q", want)
		}
	}
	if code != exitOK || out != "ok\n" || s.Executions("a") != 1 {
		t.Fatalf("exit %d, body %q, executions %d:\n%s", code, out, s.Executions("a"), errOut)
	}
}

func TestDoResetAfterProcessingIsUnknown(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.Enqueue(outboundtest.ResetAfterRead())
	code, _, errOut := runCLI("do", "-X", "POST", "-d", "x", s.URL+"/orders")
	if code != exitUnknown || !strings.Contains(errOut, "attempt 1: Ambiguous at await-response") ||
		!strings.Contains(errOut, "not idempotent and may have been processed") || !strings.Contains(errOut, "verdict: unknown") {
		t.Fatalf("exit %d:\n%s", code, errOut)
	}
}

func TestDoPrintsTheIdempotencyKeyItGenerated(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	code, _, errOut := runCLI("do", "--idempotency-key", "-d", "x", s.URL+"/orders")
	if code != exitOK || !strings.Contains(errOut, "idempotency key: \"") {
		t.Fatalf("exit %d:\n%s", code, errOut)
	}
}

func TestCommandsHelpVersionAndUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, exitUsage, "Usage:"},
		{[]string{"help"}, exitOK, "outbound drill"},
		{[]string{"version"}, exitOK, "outbound "},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"drill", "-h"}, exitOK, "Usage: outbound drill"},
		{[]string{"drill", "extra"}, exitUsage, "unexpected argument"},
		{[]string{"do", "-h"}, exitOK, "Exit status"},
		{[]string{"do"}, exitUsage, "give exactly one URL"},
		{[]string{"do", "-H", "nocolon", "http://127.0.0.1:1/"}, exitUsage, "want 'Name: value'"},
		{[]string{"do", "-d", "@/does/not/exist", "http://127.0.0.1:1/"}, exitUsage, "no such file"},
		{[]string{"do", "--max-attempts", "-1", "http://127.0.0.1:1/"}, exitUsage, "outbound: Config.MaxAttempts must"},
		{[]string{"help", "drill"}, exitOK, "Usage: outbound drill"},
		{[]string{"help", "do"}, exitOK, "Usage: outbound do"},
		{[]string{"help", "upstream"}, exitOK, "Usage: outbound upstream"},
		{[]string{"drill", "-h"}, exitOK, "--scenario NAME"},
	} {
		code, out, errOut := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%v: exit %d, want %d with %q:\n%s%s", tc.args, code, tc.code, tc.want, out, errOut)
		}
	}
}

var openRe = regexp.MustCompile(`outbound_breaker_state\{outbound_state="OPEN",outbound_upstream="[^"]+"\} 1`)

func TestDrillServesMetricsWhileItRuns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	done := make(chan int)
	go func() {
		code, _, _ := runCLI("drill", "--scenario", "503-storm", "--metrics", addr, "--metrics-wait", "5s")
		done <- code
	}()
	var body string
	for range 200 {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if body = string(b); openRe.MatchString(body) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(body, `outbound_calls_total{`) || !openRe.MatchString(body) ||
		!strings.Contains(body, `outbound_breaker_failure_rate_percent{`) || !strings.Contains(body, `outbound_breaker_not_permitted_calls{`) {
		t.Fatalf("metrics during the drill:\n%s", body)
	}
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d", code)
	}
}
