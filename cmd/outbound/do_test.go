package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outcome"
)

// echo is an upstream that answers with what it received: the method, the
// Host, the Content-Type and the body, and a header X-Echo: yes.
func echo(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		_, _ = body.ReadFrom(r.Body)
		w.Header().Set("X-Echo", "yes")
		fmt.Fprintf(w, "method=%s host=%s content-type=%s body=%s", r.Method, r.Host, r.Header.Get("Content-Type"), body.String())
	}))
	t.Cleanup(s.Close)
	return s
}

// A URL that cannot be called is a usage error, as curl makes it, with
// the reason; no attempt is made.
func TestDoRefusesABadURLAsAUsageError(t *testing.T) {
	for _, u := range []string{"notaurl", "ftp://127.0.0.1/x", "http://", "http://[::1", "/relative/path"} {
		code, out, errOut := runCLI("do", u)
		if code != exitUsage || !strings.Contains(errOut, "bad URL") || strings.Contains(errOut, "verdict") || out != "" {
			t.Errorf("do %s: exit %d, stderr %q", u, code, errOut)
		}
	}
}

// -i prints the status line and the headers before the body.
func TestDoIncludeFlagPrintsTheResponseHeaders(t *testing.T) {
	s := echo(t)
	code, out, _ := runCLI("do", "-i", s.URL+"/x")
	if code != exitOK || !strings.HasPrefix(out, "HTTP/1.1 200 OK\r\n") || !strings.Contains(out, "X-Echo: yes\r\n") ||
		!strings.HasSuffix(out, "\r\n\r\nmethod=GET host="+strings.TrimPrefix(s.URL, "http://")+" content-type= body=") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
}

// -v prints, per attempt, the request headers as written and the response
// headers, and every guard event, the rate limiter's and the bulkhead's
// included once their flags set them.
func TestDoVerbosePrintsHeadersBothWaysAndTheGuardEvents(t *testing.T) {
	s := echo(t)
	code, out, errOut := runCLI("do", "-v", "--rate", "100", "--bulkhead", "4", "-H", "X-Mine: 1", s.URL+"/x")
	for _, want := range []string{"* ", "attempt 1: GET http://127.0.0.1", "> Host: 127.0.0.1", "> X-Mine: 1",
		"< HTTP/1.1 200 OK", "< X-Echo: yes", "circuit-enter", "rate-enter", "bulkhead-enter", "bulkhead-exit"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if code != exitOK || strings.Contains(out, "X-Echo") {
		t.Errorf("exit %d; stdout %q (headers go to stderr with -v)", code, out)
	}
	if t.Failed() {
		t.Log(errOut)
	}
}

// -H Host: sets the request's host, as curl does.
func TestDoHonoursAHostHeader(t *testing.T) {
	s := echo(t)
	code, out, _ := runCLI("do", "-H", "Host: api.example.test", s.URL)
	if code != exitOK || !strings.Contains(out, "host=api.example.test ") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
}

// -d sends a form, as curl does, unless a header names another type; it
// makes the request a POST.
func TestDoSendsDataAsAFormUnlessAHeaderSaysOtherwise(t *testing.T) {
	s := echo(t)
	code, out, _ := runCLI("do", "-d", "a=1", s.URL)
	if code != exitOK || out != "method=POST host="+strings.TrimPrefix(s.URL, "http://")+" content-type=application/x-www-form-urlencoded body=a=1" {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	code, out, _ = runCLI("do", "-d", `{"a":1}`, "-H", "Content-Type: application/json", s.URL)
	if code != exitOK || !strings.Contains(out, "content-type=application/json body={\"a\":1}") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
}

// Flags may follow the URL, and "--" ends them.
func TestDoTakesFlagsAfterTheURL(t *testing.T) {
	s := echo(t)
	code, out, _ := runCLI("do", s.URL+"/x", "-X", "PUT", "-i", "--max-attempts=1")
	if code != exitOK || !strings.HasPrefix(out, "HTTP/1.1 200 OK") || !strings.Contains(out, "method=PUT") {
		t.Fatalf("exit %d, stdout %q", code, out)
	}
	code, _, errOut := runCLI("do", "--", "-i")
	if code != exitUsage || !strings.Contains(errOut, "bad URL \"-i\"") {
		t.Fatalf("after --, -i is the URL: exit %d, %s", code, errOut)
	}
}

// Each fact is on its own line: an attempt's failure is given once, by its
// cause, not by a message that repeats the attempt's summary; the
// Retry-After of an answer returned because of it is shown. (The GET reset
// after its bytes left is ambiguous, and retried: it is idempotent.)
func TestDoPrintsEachFactOnce(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.Enqueue(outboundtest.ResetBeforeRead(), outboundtest.Respond(503, "Retry-After", "120"))
	code, _, errOut := runCLI("do", "--max-retry-after", "5s", s.URL+"/x")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	want := []string{
		"outcome: committed after 2 attempt(s); ended: Retry-After longer than the cap",
		"attempt 1: Ambiguous at await-response",
		"attempt 1 cause: ",
		"attempt 2: Answered at",
		"Retry-After asked: 120",
	}
	if code != exitOK || len(lines) != len(want) {
		t.Fatalf("exit %d, %d lines:\n%s", code, len(lines), errOut)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d: %q, want it to start with %q", i+1, lines[i], w)
		}
	}
	if strings.Count(errOut, "Ambiguous") != 1 {
		t.Errorf("the failure is told more than once:\n%s", errOut)
	}
}

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// outboundBinary builds the command once, for the tests that run it as a
// process.
func outboundBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "outbound-cmd")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "outbound")
		out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// Ctrl-C during a POST the upstream is processing ends the call and prints
// its verdict: unknown, exit status 4.
func TestDoInterruptedDuringAPostSaysUnknownAndExits4(t *testing.T) {
	bin := outboundBinary(t)
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.Hang())
	cmd := exec.Command(bin, "do", "-d", `{"order":1}`, "-H", outboundtest.IDHeader+": p1", s.URL+"/orders")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); s.Received("p1") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("the POST never reached the upstream")
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUnknown {
		t.Fatalf("exit: %v, want status %d\n%s", err, exitUnknown, stderr.String())
	}
	for _, want := range []string{"interrupted", "outcome: unknown", "verdict: unknown"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

// `outbound upstream` runs as a process that the library and a bare
// net/http client both drive; Ctrl-C stops it, and it prints what it
// counted per call id.
func TestUpstreamServesTheLibraryAndNetHTTPAsAProcess(t *testing.T) {
	bin := outboundBinary(t)
	cmd := exec.Command(bin, "upstream", "--proto", "h2c", "--addr", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		t.Fatalf("no output: %s", stderr.String())
	}
	first := lines.Text() // listening on http://127.0.0.1:PORT (H2C), every request: Respond(200)
	url, _, _ := strings.Cut(strings.TrimPrefix(first, "listening on "), " ")
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("first line %q", first)
	}
	h2c := func() *http.Transport {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return &http.Transport{Protocols: p}
	}

	// The library: the first attempt of the call is refused, the retry is
	// answered, and the upstream executed it once.
	tr, err := outbound.New(outbound.Config{HTTPTransport: h2c()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	req, _ := http.NewRequest(http.MethodPost, url+"/orders", strings.NewReader(`{"qty":1}`))
	req.Header.Set(outboundtest.FaultHeader, "RefusedStream()")
	req.Header.Set(outboundtest.IDHeader, "lib-1")
	resp, out, err := tr.Do(req)
	if err != nil || resp.StatusCode != 200 || len(out.Attempts) != 2 || out.Commit != outcome.Committed {
		t.Fatalf("through the library: %v %v", out, err)
	}
	resp.Body.Close()

	// net/http: a fault by header, and a spec that does not parse.
	hc := &http.Client{Transport: h2c()}
	for spec, want := range map[string]int{"Respond(503, Retry-After, 1)": 503, "Explode()": 400} {
		req, _ := http.NewRequest(http.MethodGet, url+"/x", nil)
		req.Header.Set(outboundtest.FaultHeader, spec)
		resp, err := hc.Do(req)
		if err != nil || resp.StatusCode != want {
			t.Fatalf("net/http with %s: %v %v, want %d", spec, resp, err, want)
		}
		resp.Body.Close()
	}

	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v\n%s", err, stderr.String())
	}
	report := rest.String()
	if !strings.Contains(report, "4 request(s) received, 3 executed") || !regexp.MustCompile(`lib-1\s+2\s+1`).MatchString(report) {
		t.Fatalf("the counts printed on exit:\n%s", report)
	}
}
