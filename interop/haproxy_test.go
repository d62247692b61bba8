package interop

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
)

// haproxy is a real HAProxy in master-worker mode with its own
// configuration, on loopback ports, stopped by the master's PID at the end of
// the test.
type haproxy struct {
	cmd    *exec.Cmd
	ports  ports
	dir    string
	stderr *lockedBuffer
}

// haproxyKeepAlive is HAProxy's timeout http-keep-alive in these tests.
const haproxyKeepAlive = time.Second

// startHAProxy starts HAProxy in master-worker mode (-W) in front of backend,
// with timeout http-keep-alive 1s and, if hardStop is not zero,
// hard-stop-after hardStop: a reload then kills what the old worker still
// holds after that long. It skips the test, saying so, only where HAProxy is
// not installed and OUTBOUND_REQUIRE_HAPROXY is not set (scripts/test
// installs it and sets it).
func startHAProxy(t *testing.T, backend string, ca *authority, hardStop time.Duration) *haproxy {
	t.Helper()
	bin := requireBinary(t, "haproxy", "haproxy", "OUTBOUND_REQUIRE_HAPROXY")
	dir := t.TempDir()
	cert, key := ca.files(t, dir)
	// HAProxy takes the certificate and its key in one file.
	pemPath := filepath.Join(dir, "server-and-key.pem")
	certPEM, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pemPath, append(certPEM, keyPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &haproxy{ports: ports{plain: freePort(t), h2c: freePort(t), tls: freePort(t)}, dir: dir, stderr: &lockedBuffer{}}
	hard := ""
	if hardStop > 0 {
		hard = fmt.Sprintf("hard-stop-after %dms", hardStop.Milliseconds())
	}
	conf := fmt.Sprintf(`global
  master-worker
  pidfile %[1]s/haproxy.pid
  %[2]s
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  timeout http-keep-alive %[3]dms
frontend fe
  bind 127.0.0.1:%[4]d
  bind 127.0.0.1:%[5]d proto h2
  bind 127.0.0.1:%[6]d ssl crt %[7]s alpn h2,http/1.1
  default_backend be
backend be
  server s1 %[8]s
`, dir, hard, haproxyKeepAlive.Milliseconds(), h.ports.plain, h.ports.h2c, h.ports.tls, pemPath, backend)
	confPath := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// -W: master-worker; -db: the master stays in the foreground, so that
	// its PID is the one started here.
	h.cmd = exec.Command(bin, "-W", "-db", "-f", confPath)
	h.cmd.Stdout, h.cmd.Stderr = h.stderr, h.stderr
	if err := h.cmd.Start(); err != nil {
		t.Fatalf("starting haproxy: %v", err)
	}
	t.Cleanup(func() {
		h.cmd.Process.Signal(syscall.SIGTERM) // the master stops its workers and exits
		h.cmd.Wait()
	})
	for _, port := range []int{h.ports.plain, h.ports.h2c, h.ports.tls} {
		if err := waitListening(port, h.cmd); err != nil {
			t.Fatalf("haproxy did not start: %v\n%s", err, h.stderr.String())
		}
	}
	return h
}

// reload makes the master start a new worker and tell the old one to stop
// (SIGUSR2): the old worker sends GOAWAY on its HTTP/2 connections, closes
// its idle HTTP/1.1 ones and finishes what it holds — or, past
// hard-stop-after, kills it.
func (h *haproxy) reload(t *testing.T) {
	if err := h.cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Errorf("reloading haproxy: %v", err)
	}
}

// hardStopPhase reloads HAProxy six times while the backend takes 400 ms per
// call, twice the hard-stop-after of its instance: every reload kills calls
// that the backend is executing.
var hardStopPhase = phase{name: "hardstop", sleep: 400, reloads: 6, every: 700 * time.Millisecond, minCalls: 150, minTime: 3 * time.Second}

// TestBehindHAProxyOutboundFailsNoCallThatNetHTTPGetsThrough is the nginx
// test against a second real proxy, HAProxy in master-worker mode: steady
// load, calls spaced around timeout http-keep-alive (idle), reloads under
// load (SIGUSR2), and reloads with hard-stop-after 200ms while the backend
// takes 400 ms per call. At a hard stop HAProxy resets, with
// RST_STREAM(REFUSED_STREAM), streams it has already forwarded to the
// backend, after a GOAWAY whose last-stream-id covers them: a proof of
// non-processing that the peer contradicts. In every protocol and phase
// the rules of check hold — none of outbound's calls reported not
// committed was executed, and its breaker never opens.
func TestBehindHAProxyOutboundFailsNoCallThatNetHTTPGetsThrough(t *testing.T) {
	ca := newAuthority(t)
	backend := newCountingBackend(t)
	var seq atomic.Int64 // call ids
	report, done := newReport(t, "behind a real HAProxy: outbound and bare net/http side by side")
	defer done()
	h := startHAProxy(t, backend.addr(), ca, 0)
	runPhases(t, report, backend, ca, h.ports, &seq, []phase{steadyPhase, idlePhase(haproxyKeepAlive), reloadPhase},
		func(phase) func() { return func() { h.reload(t) } })
	hs := startHAProxy(t, backend.addr(), ca, 200*time.Millisecond)
	runPhases(t, report, backend, ca, hs.ports, &seq, []phase{hardStopPhase},
		func(phase) func() { return func() { hs.reload(t) } })
}

// lockedBuffer collects a process's output, written from the goroutines of
// os/exec.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// droppingBackend reads a request whole, counts it executed (by
// X-Request-Id) and closes the connection without answering: a backend that
// crashed, or closed a keep-alive connection, after doing the work.
type droppingBackend struct {
	ln net.Listener
	mu sync.Mutex
	n  map[string]int
}

func newDroppingBackend(t *testing.T) *droppingBackend {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &droppingBackend{ln: ln, n: map[string]int{}}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				if _, err := io.Copy(io.Discard, req.Body); err != nil {
					return
				}
				b.mu.Lock()
				b.n[req.Header.Get("X-Request-Id")]++
				b.mu.Unlock()
			})
		}
	})
	return b
}

func (b *droppingBackend) executions(id string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n[id]
}

// TestHAProxyAnswersRefusedStreamForARequestItsBackendExecuted pins a second
// false proof of HAProxy's, without any shutdown: when its backend executes
// a request and closes the connection without answering, HAProxy (2.6)
// resets the client's HTTP/2 stream with REFUSED_STREAM — the code it uses
// for any stream it aborts before sending response headers — on a healthy
// connection. A bare HTTP/2 connection sees exactly that; outbound, told to
// distrust REFUSED_STREAM from this upstream (Config.DistrustRefusedStream),
// reports the POST Unknown and never sends it again.
func TestHAProxyAnswersRefusedStreamForARequestItsBackendExecuted(t *testing.T) {
	ca := newAuthority(t)
	backend := newDroppingBackend(t)
	h := startHAProxy(t, backend.ln.Addr().String(), ca, 0)
	for _, m := range modes[2:] { // HTTP/2, over TLS and h2c
		t.Run(strings.ReplaceAll(m.name, "/", ""), func(t *testing.T) {
			url := fmt.Sprintf("%s://127.0.0.1:%d/pay", m.scheme, m.port(h.ports))
			base := &http.Transport{Protocols: m.protos(), TLSClientConfig: ca.clientConfig()}
			defer base.CloseIdleConnections()
			cc, err := base.NewClientConn(context.Background(), m.scheme, fmt.Sprintf("127.0.0.1:%d", m.port(h.ports)))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			id := "bare-" + m.name
			req := newCall(postReplayable, url, id)
			_, err = cc.RoundTrip(req)
			var se http2.StreamError
			if !errors.As(err, &se) || se.Code != http2.ErrCodeRefusedStream || backend.executions(id) != 1 {
				t.Fatalf("HAProxy answered %v for a request its backend executed %d times; this test expects REFUSED_STREAM once executed",
					err, backend.executions(id))
			}
			if cc.Err() != nil || cc.Available() == 0 {
				t.Fatalf("the connection is going away (Err %v, Available %d): this test expects a healthy one", cc.Err(), cc.Available())
			}

			ob, err := outbound.New(outbound.Config{HTTPTransport: &http.Transport{Protocols: m.protos(), TLSClientConfig: ca.clientConfig()},
				DistrustRefusedStream: func(string) bool { return true }})
			if err != nil {
				t.Fatal(err)
			}
			defer ob.Close()
			id = "outbound-" + m.name
			_, out, err := ob.Do(newCall(postReplayable, url, id))
			if !errors.Is(err, outcome.ErrUnknown) || backend.executions(id) != 1 {
				t.Fatalf("err %v, executed %d times: %v", err, backend.executions(id), out)
			}
			if a := out.Attempts[0]; a.Evidence != classify.EvidenceRefusedUntrusted {
				t.Fatalf("attempt %v, want REFUSED_STREAM not trusted", a)
			}
		})
	}
}
