package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboundhq/outbound/outboundtest"
)

// curlBinary returns the path of curl, or skips the test, saying so, when
// there is none; with OUTBOUND_REQUIRE_CURL=1 (scripts/test sets it once
// it has installed curl) a missing curl fails the test instead.
func curlBinary(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("OUTBOUND_REQUIRE_CURL") == "1" {
			t.Fatalf("curl is not installed, and OUTBOUND_REQUIRE_CURL=1 requires it: %v", err)
		}
		t.Skip("curl is not installed: outbound do is not compared with it (scripts/test installs it)")
	}
	return path
}

// runCurl runs curl with args — without its configuration file, a proxy or
// a progress meter — and returns its exit status and standard output.
func runCurl(t *testing.T, curl string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(curl, append([]string{"-q", "-sS", "--noproxy", "*"}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	return exitCode(cmd.Run()), o.String(), e.String()
}

// curlServer answers as the comparison needs: /echo with what it received,
// /status/N with status N, /r/N/PATH with a redirect of status N to PATH,
// /loop with a redirect to itself, /away with a redirect to other.
func curlServer(t *testing.T, other string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var code int
		switch {
		case strings.HasPrefix(r.URL.Path, "/status/"):
			fmt.Sscanf(r.URL.Path, "/status/%d", &code)
			w.Header().Set("X-Status", fmt.Sprint(code))
			w.WriteHeader(code)
			fmt.Fprintf(w, "status %d\n", code)
		case strings.HasPrefix(r.URL.Path, "/r/"):
			var to string
			fmt.Sscanf(r.URL.Path, "/r/%d/%s", &code, &to)
			http.Redirect(w, r, "/"+to, code)
		case r.URL.Path == "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case r.URL.Path == "/away":
			http.Redirect(w, r, other+"/echo", http.StatusFound)
		default:
			b, _ := io.ReadAll(r.Body)
			w.Header().Set("X-Echo", "yes")
			fmt.Fprintf(w, "%s %s content-type=%q authorization=%q cookie=%q body=%q\n",
				r.Method, r.URL.RequestURI(), r.Header.Get("Content-Type"), r.Header.Get("Authorization"), r.Header.Get("Cookie"), b)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// normalHead sorts the header lines of a response head printed by -i, and
// drops Date, which may differ by a second: curl prints them in the order
// they came, do sorts them.
func normalHead(out string) string {
	head, body, _ := strings.Cut(out, "\r\n\r\n")
	lines := strings.Split(head, "\r\n")
	fields := slices.DeleteFunc(lines[1:], func(l string) bool { return strings.HasPrefix(strings.ToLower(l), "date:") })
	slices.Sort(fields)
	return lines[0] + "\r\n" + strings.Join(fields, "\r\n") + "\r\n\r\n" + body
}

// outbound do and curl, given the same flags against the same server,
// exit with the same status and write the same body (and -i the same
// head, -o the same file).
func TestDoAgreesWithCurl(t *testing.T) {
	curl := curlBinary(t)
	other := curlServer(t, "")
	s := curlServer(t, other.URL)
	dir := t.TempDir()
	crlf := filepath.Join(dir, "crlf")
	if err := os.WriteFile(crlf, []byte("a=1\r\nb=2\n\nc=3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(s.URL, "http://")
	for _, tc := range []struct {
		name string
		args []string // both; "OUT" is replaced by a file of each
		head bool     // stdout is -i's head and body
		file bool     // compare the files written at OUT
	}{
		{name: "GET", args: []string{s.URL + "/echo?q=1"}},
		{name: "no scheme", args: []string{host + "/echo"}},
		{name: "-i", args: []string{"-i", s.URL + "/echo"}, head: true},
		{name: "-X PUT -d", args: []string{"-X", "PUT", "-d", "a=1", s.URL + "/echo"}},
		{name: "-d, --data joined", args: []string{"-d", "a=1", "--data", "b=2", s.URL + "/echo"}},
		{name: "-d @file strips newlines", args: []string{"-d", "@" + crlf, s.URL + "/echo"}},
		{name: "--data-binary @file", args: []string{"--data-binary", "@" + crlf, s.URL + "/echo"}},
		{name: "-d with a Content-Type", args: []string{"-H", "Content-Type: application/json", "-d", `{"a":1}`, s.URL + "/echo"}},
		{name: "-d ''", args: []string{"-d", "", s.URL + "/echo"}},
		{name: "-o", args: []string{"-o", "OUT", s.URL + "/echo"}, file: true},
		{name: "-i -o", args: []string{"-i", "-o", "OUT", s.URL + "/echo"}, file: true},
		{name: "404 without -f", args: []string{s.URL + "/status/404"}},
		{name: "-f", args: []string{"-f", s.URL + "/status/404"}},
		{name: "--fail -i", args: []string{"--fail", "-i", s.URL + "/status/500"}, head: true},
		{name: "-f -o", args: []string{"-f", "-o", "OUT", s.URL + "/status/404"}, file: true},
		{name: "-f and a 2xx", args: []string{"-f", s.URL + "/status/201"}},
		{name: "302 without -L", args: []string{s.URL + "/r/302/echo"}},
		{name: "-L 302 GET", args: []string{"-L", s.URL + "/r/302/echo"}},
		{name: "-L 301 POST", args: []string{"-L", "-d", "a=1", s.URL + "/r/301/echo"}},
		{name: "-L 302 POST", args: []string{"--location", "-d", "a=1", s.URL + "/r/302/echo"}},
		{name: "-L 303 PUT", args: []string{"-L", "-X", "PUT", "-d", "a=1", s.URL + "/r/303/echo"}},
		{name: "-L 307 POST", args: []string{"-L", "-d", "a=1", s.URL + "/r/307/echo"}},
		{name: "-L 308 PUT", args: []string{"-L", "-X", "PUT", "--data-binary", "@" + crlf, s.URL + "/r/308/echo"}},
		{name: "-L -i", args: []string{"-L", "-i", s.URL + "/r/302/echo"}},
		{name: "-L to another origin", args: []string{"-L", "-H", "Authorization: Bearer t", "-H", "Cookie: c=1", s.URL + "/away"}},
		{name: "-L on the same origin", args: []string{"-L", "-H", "Authorization: Bearer t", "-H", "Cookie: c=1", s.URL + "/r/302/echo"}},
		{name: "--max-redirs", args: []string{"-L", "--max-redirs", "3", s.URL + "/loop"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outFiles := map[string]string{"curl": filepath.Join(t.TempDir(), "curl"), "do": filepath.Join(t.TempDir(), "do")}
			argsFor := func(who string) []string {
				args := slices.Clone(tc.args)
				for i, a := range args {
					if a == "OUT" {
						args[i] = outFiles[who]
					}
				}
				return args
			}
			curlCode, curlOut, curlErr := runCurl(t, curl, argsFor("curl")...)
			doCode, doOut, doErr := runCLI(append([]string{"do"}, argsFor("do")...)...)
			if tc.name == "-L -i" {
				// Each head is told apart by its status line; Location and
				// Date are compared by neither.
				curlOut, doOut = heads(curlOut), heads(doOut)
			} else if tc.head {
				curlOut, doOut = normalHead(curlOut), normalHead(doOut)
			}
			if doCode != curlCode {
				t.Errorf("exit: do %d, curl %d", doCode, curlCode)
			}
			if doOut != curlOut {
				t.Errorf("stdout:\n do   %q\n curl %q", doOut, curlOut)
			}
			if tc.file {
				curlFile, curlFileErr := os.ReadFile(outFiles["curl"])
				doFile, doFileErr := os.ReadFile(outFiles["do"])
				if os.IsNotExist(curlFileErr) != os.IsNotExist(doFileErr) {
					t.Errorf("the file: do %v, curl %v", doFileErr, curlFileErr)
				}
				if tc.head {
					curlFile, doFile = []byte(normalHead(string(curlFile))), []byte(normalHead(string(doFile)))
				} else if strings.Contains(string(curlFile), "\r\n\r\n") {
					curlFile, doFile = []byte(normalHead(string(curlFile))), []byte(normalHead(string(doFile)))
				}
				if !bytes.Equal(doFile, curlFile) {
					t.Errorf("the file:\n do   %q\n curl %q", doFile, curlFile)
				}
			}
			if t.Failed() {
				t.Logf("do's stderr:\n%s\ncurl's stderr:\n%s", doErr, curlErr)
			}
		})
	}
}

// heads keeps, of what -i -L printed, the status lines and the body.
func heads(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\r\n") {
		if strings.HasPrefix(l, "HTTP/") || !strings.Contains(l, ": ") && l != "" {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "|")
}

// A body cut short, the deadline and HTTP/2 stream resets: do exits with
// curl's status, and writes what curl writes.
func TestDoAgreesWithCurlOnFailures(t *testing.T) {
	curl := curlBinary(t)
	for _, tc := range []struct {
		name       string
		proto      outboundtest.Proto
		fault      outboundtest.Fault
		curl, do   []string
		want       int
		sameStdout bool
	}{
		{"truncated body", outboundtest.HTTP1, outboundtest.TruncatedBody(100, 10), nil, nil, exitTruncated, true},
		{"chunked body closed", outboundtest.HTTP1, outboundtest.CloseMidStream(), nil, nil, exitTruncated, true},
		// curl writes the DATA that came with the RST_STREAM, or not.
		{"HTTP/2 stream reset in the body", outboundtest.H2C, outboundtest.TruncatedBody(100, 10),
			[]string{"--http2-prior-knowledge"}, []string{"--h2c"}, exitH2Stream, false},
		{"-m before the answer", outboundtest.HTTP1, outboundtest.Hang(), []string{"-m", "0.3"}, []string{"-m", "0.3"}, exitTimeout, true},
		{"--max-time in an endless body", outboundtest.HTTP1, outboundtest.EndlessBody(),
			[]string{"--max-time", "0.3", "-o", os.DevNull}, []string{"--max-time", "0.3", "-o", os.DevNull}, exitTimeout, true},
		{"-m in a trickling body", outboundtest.HTTP1, outboundtest.Trickle(50*time.Millisecond, 100), []string{"-m", "0.3"}, []string{"--timeout", "0.3"}, exitTimeout, false},
		{"-f on a 503", outboundtest.HTTP1, outboundtest.Respond(503), []string{"-f"}, []string{"-f", "--max-attempts", "1"}, exitHTTPError, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := outboundtest.NewServer(tc.proto)
			defer s.Close()
			s.SetDefault(tc.fault)
			curlCode, curlOut, curlErr := runCurl(t, curl, append(tc.curl, s.URL+"/x")...)
			doCode, doOut, doErr := runCLI(append(append([]string{"do"}, tc.do...), s.URL+"/x")...)
			if curlCode != tc.want || doCode != tc.want {
				t.Errorf("exit: do %d, curl %d, want %d", doCode, curlCode, tc.want)
			}
			if tc.sameStdout && doOut != curlOut {
				t.Errorf("stdout:\n do   %q\n curl %q", doOut, curlOut)
			}
			if t.Failed() {
				t.Logf("do's stderr:\n%s\ncurl's stderr:\n%s", doErr, curlErr)
			}
		})
	}
}

// Ctrl-C while the body streams ends curl by SIGINT, which a shell reports
// as 130; do exits 130.
func TestDoAgreesWithCurlOnCtrlC(t *testing.T) {
	curl := curlBinary(t)
	bin := outboundBinary(t)
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.EndlessBody())
	curlCode, curlErr := interruptAfterFirstByte(t, exec.Command(curl, "-q", "-sS", "--noproxy", "*", s.URL+"/x"))
	doCode, doErr := interruptAfterFirstByte(t, exec.Command(bin, "do", s.URL+"/x"))
	if curlCode != exitInterrupted || doCode != exitInterrupted {
		t.Fatalf("exit: do %d, curl %d, want %d\ndo's stderr:\n%s\ncurl's stderr:\n%s", doCode, curlCode, exitInterrupted, doErr, curlErr)
	}
}
