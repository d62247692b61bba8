// Package redistest starts real redis-server processes for tests: a single
// server, or a cluster made with redis-cli --cluster create, each on
// loopback ports with a configuration written to a temporary directory, and
// stopped by PID when the test ends.
package redistest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Redis is one redis-server process.
type Redis struct {
	t      testing.TB
	bin    string
	dir    string
	conf   string
	Port   int
	cmd    *exec.Cmd
	exited chan struct{}
	out    *strings.Builder
}

// Addr returns the server's address.
func (s *Redis) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.Port) }

// PID returns the server's process ID.
func (s *Redis) PID() int { return s.cmd.Process.Pid }

func binaries(t testing.TB) (server, cli string) {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err == nil {
		cli, err = exec.LookPath("redis-cli")
	}
	if err != nil {
		if os.Getenv("OUTBOUND_REQUIRE_REDIS") != "" {
			t.Fatalf("redis-server and redis-cli are required (OUTBOUND_REQUIRE_REDIS is set) but not installed: %v", err)
		}
		t.Skip("redis-server is not installed (Debian package redis-server; scripts/test installs it): skipping the tests against a real Redis")
	}
	return server, cli
}

// Start starts a single redis-server, without persistence, on a free
// loopback port. It skips the test, saying so, only where redis-server is not
// installed and OUTBOUND_REQUIRE_REDIS is not set.
func Start(t testing.TB) *Redis {
	t.Helper()
	bin, _ := binaries(t)
	s := newServer(t, bin, "")
	s.start()
	return s
}

func newServer(t testing.TB, bin, extra string) *Redis {
	t.Helper()
	s := &Redis{t: t, bin: bin, dir: t.TempDir(), Port: freePort(t)}
	s.conf = filepath.Join(s.dir, "redis.conf")
	conf := fmt.Sprintf(`bind 127.0.0.1
port %d
dir %s
save ""
appendonly no
protected-mode no
enable-debug-command yes
loglevel warning
logfile %s
%s`, s.Port, s.dir, filepath.Join(s.dir, "redis.log"), extra)
	if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	return s
}

func (s *Redis) start() {
	s.t.Helper()
	s.out = &strings.Builder{}
	s.cmd = exec.Command(s.bin, s.conf)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting redis-server: %v", err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func() { s.cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server exited: %s%s", s.out, log)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server did not listen on %s within 10 s: %v", s.Addr(), err)
		}
		time.Sleep(10 * time.Millisecond) // a process starting, not a timing assertion
	}
}

// Kill stops the server by PID (SIGKILL: it loses what it held) and waits
// for it to exit. Killing a stopped server does nothing.
func (s *Redis) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT) // a paused server must run to die
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts a killed server again on the same port, empty.
func (s *Redis) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// Pause stops the server's process (SIGSTOP): connections stay open and
// nothing answers, as with a server that hangs. Resume undoes it.
func (s *Redis) Pause() { s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Redis) Resume() { s.cmd.Process.Signal(syscall.SIGCONT) }

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Redis
}

// Addrs returns the addresses of the cluster's nodes.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.Addr())
	}
	return a
}

// StartCluster starts n redis-server processes with cluster-enabled and
// joins them with redis-cli --cluster create, every slot covered.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	bin, cli := binaries(t)
	c := &Cluster{}
	for range n {
		s := newServer(t, bin, "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 5000\n")
		s.start()
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	// Wait until every node sees the cluster as ok.
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.Nodes {
		for {
			info, err := exec.Command(cli, "-p", fmt.Sprint(s.Port), "cluster", "info").Output()
			if err == nil && strings.Contains(string(info), "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the cluster did not become ok within 20 s: %s %v", info, err)
			}
			time.Sleep(50 * time.Millisecond) // a cluster forming, not a timing assertion
		}
	}
	return c
}

func freePort(t testing.TB) int {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if port+10000 <= 65535 { // a cluster node also listens on port+10000
			return port
		}
	}
}
