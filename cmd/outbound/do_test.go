package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
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
	for _, u := range []string{"http://a b/", "ftp://127.0.0.1/x", "http://", "http://[::1", "/relative/path", "http://-x.example/", "http://a..b/"} {
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
	if code != exitUsage || !strings.Contains(errOut, "bad URL \"-i\": \"-i\" is not a host name") {
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

// doExit runs do in-process and fails the test unless it exits with want
// and its standard error holds every one of wants.
func doExit(t *testing.T, want int, wants []string, args ...string) (stdout, stderr string) {
	t.Helper()
	code, out, errOut := runCLI(append([]string{"do"}, args...)...)
	if code != want {
		t.Errorf("do %q: exit %d, want %d\n%s", args, code, want, errOut)
	}
	for _, w := range wants {
		if !strings.Contains(errOut, w) {
			t.Errorf("do %q: stderr lacks %q:\n%s", args, w, errOut)
		}
	}
	return out, errOut
}

// A body cut short is exit 18 over HTTP/1 and 92 (the stream was reset)
// over HTTP/2, as curl has them; what did arrive is written out.
func TestDoBodyEndedEarlyExits18Or92(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.TruncatedBody(100, 10))
	out, _ := doExit(t, exitTruncated, []string{"outcome: committed", "error: the body ended early, after 10 byte(s) of 100: unexpected EOF"}, s.URL+"/x")
	if out != strings.Repeat("x", 10) {
		t.Errorf("stdout %q", out)
	}
	s.SetDefault(outboundtest.CloseMidStream())
	doExit(t, exitTruncated, []string{"error: the body ended early, after 12 byte(s): unexpected EOF"}, s.URL+"/x")

	h2 := outboundtest.NewServer(outboundtest.H2C)
	defer h2.Close()
	h2.SetDefault(outboundtest.TruncatedBody(100, 10))
	doExit(t, exitH2Stream, []string{"error: the body ended early, after 10 byte(s) of 100: stream error: stream ID 1; INTERNAL_ERROR"}, "--h2c", h2.URL+"/x")
}

// The deadline (-m, --max-time, --timeout, in seconds without a unit)
// bounds the whole call, the body included: exit 28. A request that is not
// idempotent and may have been processed exits 4 instead, and is to be
// reconciled; an idempotent one is said safe to send again.
func TestDoDeadlineExits28Or4ForAPostThatMayHaveBeenProcessed(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.Hang())
	_, errOut := doExit(t, exitTimeout, []string{"timed out: the call's deadline (-m 200ms) expired before an answer",
		"verdict: unknown — the upstream may have processed it; GET is idempotent: sending it again is safe"}, "-m", "0.2", s.URL+"/x")
	if strings.Contains(errOut, "reconcile") {
		t.Errorf("a GET is not to be reconciled:\n%s", errOut)
	}
	doExit(t, exitUnknown, []string{"timed out: the call's deadline (-m 200ms) expired before an answer",
		"verdict: unknown — the upstream may have processed it; reconcile before sending again"}, "--max-time", "0.2", "-d", "x", s.URL+"/x")
	doExit(t, exitTimeout, []string{"verdict: unknown — the upstream may have processed it; send it again only with the same Idempotency-Key"},
		"--timeout", "200ms", "-d", "x", "-H", "Idempotency-Key: k1", s.URL+"/x")

	s.SetDefault(outboundtest.EndlessBody())
	start := time.Now()
	out, _ := doExit(t, exitTimeout, []string{"outcome: committed", "timed out: the call's deadline (-m 300ms) expired while the body streamed, after "},
		"-m", "0.3", "-o", os.DevNull, s.URL+"/x")
	if d := time.Since(start); d > 5*time.Second || out != "" {
		t.Errorf("the endless body ended after %v; stdout %d bytes", d, len(out))
	}
}

// A GET that may have been processed, and failed otherwise than by its
// deadline, exits 4 but is not to be reconciled.
func TestDoUnknownGetIsSafeToSendAgain(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.ResetAfterRead())
	_, errOut := doExit(t, exitUnknown, []string{"verdict: unknown — the upstream may have processed it; GET is idempotent: sending it again is safe"},
		"--max-attempts", "1", s.URL+"/x")
	if strings.Contains(errOut, "reconcile") || strings.Contains(errOut, "protocol:") {
		t.Errorf("stderr:\n%s", errOut)
	}
}

// -f: an answer of 400 or more prints no body and exits 22; -o writes the
// body to a file, created only for a body it writes; a file that cannot
// be written is exit 23.
func TestDoFailAndOutputFile(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.Respond(404).WithBody([]byte("missing\n")))
	out, _ := doExit(t, exitHTTPError, []string{"error: the upstream answered 404 Not Found; -f prints no body"}, "-f", s.URL+"/x")
	if out != "" {
		t.Errorf("-f printed %q", out)
	}
	if out, _ := doExit(t, exitOK, nil, s.URL+"/x"); out != "missing\n" {
		t.Errorf("without -f: %q", out)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "body")
	doExit(t, exitHTTPError, nil, "--fail", "-o", file, s.URL+"/x")
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("-f -o created the file: %v", err)
	}
	if out, _ := doExit(t, exitOK, nil, "--output", file, s.URL+"/x"); out != "" {
		t.Errorf("-o printed %q", out)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "missing\n" {
		t.Errorf("-o wrote %q, %v", b, err)
	}
	doExit(t, exitWrite, []string{"error: writing the body: "}, "-o", filepath.Join(dir, "no", "such", "dir"), s.URL+"/x")
}

// -L follows redirects as curl does: a 302 turns a POST into a GET, a 307
// keeps the method and body; Authorization is not sent to another origin;
// more than --max-redirs is exit 47. Without -L, the 302 is the answer.
func TestDoFollowsRedirectsWithL(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "other: %s authorization=%q x=%q", r.Method, r.Header.Get("Authorization"), r.Header.Get("X-Mine"))
	}))
	defer other.Close()
	var s *httptest.Server
	s = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/302":
			http.Redirect(w, r, "/echo", http.StatusFound)
		case "/307":
			http.Redirect(w, r, "/echo", http.StatusTemporaryRedirect)
		case "/away":
			http.Redirect(w, r, other.URL+"/", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		default:
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s body=%q authorization=%q", r.Method, r.URL.Path, b, r.Header.Get("Authorization"))
		}
	}))
	defer s.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-L", "-d", "a=1", s.URL + "/302"}, `GET /echo body="" authorization=""`},
		{[]string{"--location", "-d", "a=1", s.URL + "/307"}, `POST /echo body="a=1" authorization=""`},
		{[]string{"-L", "-H", "Authorization: Bearer t", "-H", "X-Mine: 1", s.URL + "/away"}, `other: GET authorization="" x="1"`},
		{[]string{"-L", "-H", "Authorization: Bearer t", s.URL + "/302"}, `GET /echo body="" authorization="Bearer t"`},
		{[]string{s.URL + "/302"}, "<a href=\"/echo\">Found</a>.\n\n"},
	} {
		out, errOut := doExit(t, exitOK, nil, tc.args...)
		if out != tc.want {
			t.Errorf("do %q: stdout %q, want %q\n%s", tc.args, out, tc.want, errOut)
		}
	}
	doExit(t, exitOK, []string{"redirect 1: 302 Found after 1 attempt(s) -> " + s.URL + "/echo"}, "-L", s.URL+"/302")
	doExit(t, exitRedirects, []string{"error: more than 3 redirects (--max-redirs)"}, "-L", "--max-redirs", "3", s.URL+"/loop")
}

// -d strips carriage returns and newlines from a file, as curl's does;
// --data-binary sends its bytes as they are; pieces are joined with &.
func TestDoDataAsCurlSendsIt(t *testing.T) {
	s := echo(t)
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, []byte("a=1\r\nb=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		body string
	}{
		{[]string{"-d", "@" + file}, "a=1b=2"},
		{[]string{"--data", "@" + file, "-d", "c=3"}, "a=1b=2&c=3"},
		{[]string{"--data-binary", "@" + file}, "a=1\r\nb=2\n"},
		{[]string{"--data-binary", "@" + file, "--data-binary", "x"}, "a=1\r\nb=2\n&x"},
		{[]string{"-d", ""}, ""},
	} {
		out, _ := doExit(t, exitOK, nil, append(tc.args, s.URL)...)
		if want := "method=POST host=" + strings.TrimPrefix(s.URL, "http://") + " content-type=application/x-www-form-urlencoded body=" + tc.body; out != want {
			t.Errorf("do %q: %q, want %q", tc.args, out, want)
		}
	}
}

// A URL without a scheme is http://, as curl takes it.
func TestDoTakesAURLWithoutSchemeAsHTTP(t *testing.T) {
	s := echo(t)
	out, _ := doExit(t, exitOK, nil, strings.TrimPrefix(s.URL, "http://")+"/x")
	if !strings.HasPrefix(out, "method=GET") {
		t.Fatalf("stdout %q", out)
	}
}

// -v prints, per attempt, the URL with its port and path, and the request
// line and headers as curl -v does.
func TestDoVerbosePrintsTheRequestLinePerAttempt(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.Enqueue(outboundtest.Respond(503))
	host := strings.TrimPrefix(s.URL, "http://")
	_, errOut := doExit(t, exitOK, nil, "-v", "--max-retry-after", "1", s.URL+"/p?q=1")
	for _, want := range []string{
		"attempt 1: GET " + s.URL + "/p?q=1\n", "attempt 2: GET " + s.URL + "/p?q=1\n",
		"> GET /p?q=1 HTTP/1.1\n> Host: " + host + "\n", "attempt 1: answered 503", "attempt 1: retryable: another attempt in ",
		"< HTTP/1.1 200 OK\n", "< Content-Length: 3\n",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q", want)
		}
	}
	if n := strings.Count(errOut, "> GET /p?q=1 HTTP/1.1\n"); n != 2 {
		t.Errorf("%d request lines for 2 attempts", n)
	}
	if t.Failed() {
		t.Log(errOut)
	}
}

// Ctrl-C while the body streams exits 130, as curl's does in a shell; so
// does Ctrl-C during a GET before the answer.
func TestDoInterruptedExits130(t *testing.T) {
	bin := outboundBinary(t)
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.EndlessBody())
	code, stderr := interruptAfterFirstByte(t, exec.Command(bin, "do", s.URL+"/x"))
	if code != exitInterrupted || !strings.Contains(stderr, "interrupted: the call was ended while the body streamed, after ") {
		t.Errorf("during the body: exit %d\n%s", code, stderr)
	}

	s.SetDefault(outboundtest.Hang())
	cmd := exec.Command(bin, "do", "-H", outboundtest.IDHeader+": g1", s.URL+"/x")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); s.Received("g1") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("the GET never reached the upstream")
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := exitCode(cmd.Wait()); code != exitInterrupted || !strings.Contains(errOut.String(), "interrupted: the call was ended before it finished") ||
		!strings.Contains(errOut.String(), "GET is idempotent") {
		t.Errorf("before the answer: exit %d\n%s", code, errOut.String())
	}
}

// interruptAfterFirstByte starts cmd, sends it SIGINT once a byte of its
// standard output has arrived, and returns its exit status as a shell
// gives it (128 + the signal for a process a signal ended) and its
// standard error.
func interruptAfterFirstByte(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(stdout, make([]byte, 1)); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("%s: no byte of the body: %v\n%s", cmd.Path, err, errOut.String())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, stdout) // until it exits
	return exitCode(cmd.Wait()), errOut.String()
}

// exitCode is the exit status of a process as a shell reports it: 128 + the
// signal's number for a process a signal ended.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return -1
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// Ctrl-C while the call waits to retry ends it with the answer it holds,
// printed, and exit 130: the call was still cut short.
func TestDoInterruptedWhileWaitingToRetryExits130WithTheAnswer(t *testing.T) {
	bin := outboundBinary(t)
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.Respond(503, "Retry-After", "20"))
	cmd := exec.Command(bin, "do", "-v", s.URL+"/x")
	var out bytes.Buffer
	cmd.Stdout = &out
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var errOut strings.Builder
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		errOut.WriteString(lines.Text() + "\n")
		if strings.Contains(lines.Text(), "another attempt in") {
			break
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
		errOut.WriteString(lines.Text() + "\n")
	}
	code := exitCode(cmd.Wait())
	if code != exitInterrupted || out.String() != "ok\n" ||
		!strings.Contains(errOut.String(), "interrupted: the call was ended while it waited to retry; the answer is the last attempt's") {
		t.Fatalf("exit %d, stdout %q:\n%s", code, out.String(), errOut.String())
	}
}
