package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// echoServer is the upstream of the end-to-end benchmarks, in its own
// process (cmd/echo-server) so that its allocations stay out of the
// client's figures.
type echoServer struct {
	URL   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startEchoServer starts cmd/echo-server with args and stops it when tb ends. It runs
// the binary named by $BENCH_ECHO_SERVER (run.sh builds it once); otherwise
// it builds one into a temporary directory.
func startEchoServer(tb testing.TB, args ...string) *echoServer {
	tb.Helper()
	bin := os.Getenv("BENCH_ECHO_SERVER")
	if bin == "" {
		bin = filepath.Join(tb.TempDir(), "echo-server")
		out, err := exec.Command("go", "build", "-o", bin, "./cmd/echo-server").CombinedOutput()
		if err != nil {
			tb.Fatalf("building echo-server: %v\n%s", err, out)
		}
	}
	s := &echoServer{cmd: exec.Command(bin, args...)}
	s.cmd.Stderr = os.Stderr
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.stop)

	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case s.URL = <-line:
	case <-time.After(30 * time.Second):
		tb.Fatal("echo-server did not print its address within 30s")
	}
	if !strings.HasPrefix(s.URL, "http://127.0.0.1:") {
		tb.Fatalf("echo-server printed %q, want its URL", s.URL)
	}
	return s
}

// stop closes the server's standard input, which makes it exit, and kills
// it if it has not exited within 5 seconds.
func (s *echoServer) stop() {
	_ = s.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			fmt.Fprintln(os.Stderr, "echo-server:", err)
		}
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}
