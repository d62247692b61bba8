package interop

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// nginx is a real nginx master process with its own configuration, on
// loopback ports, stopped by PID at the end of the test.
type nginx struct {
	cmd   *exec.Cmd
	ports ports
}

// nginxKeepAlive is nginx's keepalive_timeout in these tests.
const nginxKeepAlive = time.Second

// startNginx starts nginx in front of backend, configured as a busy site
// is: keepalive_requests 50 (an HTTP/2 connection gets a GOAWAY every 50
// streams, an HTTP/1.1 one is closed after 50 requests), keepalive_timeout
// 1s. It skips the test, saying so, only where nginx is not installed and
// OUTBOUND_REQUIRE_NGINX is not set (scripts/test installs it and sets it).
func startNginx(t *testing.T, backend string, ca *authority) *nginx {
	t.Helper()
	bin := requireBinary(t, "nginx", "nginx", "OUTBOUND_REQUIRE_NGINX")
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	cert, key := ca.files(t, dir)
	n := &nginx{ports: ports{plain: freePort(t), h2c: freePort(t), tls: freePort(t)}}
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
  keepalive_timeout %[9]ds;
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
`, user, dir, backend, n.ports.plain, n.ports.h2c, n.ports.tls, cert, key, int(nginxKeepAlive/time.Second))
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
	for _, port := range []int{n.ports.plain, n.ports.h2c, n.ports.tls} {
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

// The phases of the tests against nginx.
var (
	steadyPhase = phase{name: "steady", sleep: 20, minCalls: 1200, minTime: 3 * time.Second}
	reloadPhase = phase{name: "reloads", sleep: 20, reloads: 6, every: 600 * time.Millisecond, minCalls: 1200, minTime: 3 * time.Second}
)

// idlePhase spaces each worker's calls around the proxy's keep-alive
// timeout, for about 11 rounds.
func idlePhase(keepAlive time.Duration) phase {
	return phase{name: "idle", gap: idleGap(keepAlive), minCalls: 176, minTime: 3 * time.Second}
}

// TestBehindNginxOutboundFailsNoCallThatNetHTTPGetsThrough runs, for each
// protocol, mixed calls from 16 workers through outbound and through a bare
// net/http client at the same time, against a real nginx with
// keepalive_requests 50 and keepalive_timeout 1s in front of a backend that
// counts executions: in steady load, with calls spaced around the keep-alive
// timeout (idle: connections closed by nginx while idle, sometimes as a
// request arrives), and while nginx is reloaded six times. In every protocol
// and phase the rules of check hold.
func TestBehindNginxOutboundFailsNoCallThatNetHTTPGetsThrough(t *testing.T) {
	ca := newAuthority(t)
	backend := newCountingBackend(t)
	n := startNginx(t, backend.addr(), ca)
	var seq atomic.Int64 // call ids
	report, done := newReport(t, "behind a real nginx: outbound and bare net/http side by side")
	defer done()
	runPhases(t, report, backend, ca, n.ports, &seq, []phase{steadyPhase, idlePhase(nginxKeepAlive), reloadPhase},
		func(phase) func() { return func() { n.reload(t) } })
}
