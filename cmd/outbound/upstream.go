package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/outboundhq/outbound/outboundtest"
)

// stopSignals end `outbound upstream`; a test may replace them.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

const upstreamUsage = `Usage: outbound upstream [flags]

Serves the fault-injecting upstream on loopback, so that outbound do, curl
or a client in any language can be tried against its faults. Every request
gets --fault, unless it carries the header
  %[1]s: FAULT
which chooses its own. The upstream counts, per %[2]s header, the
requests it received and those it executed (processed); Ctrl-C stops it
and prints them.

FAULT is a constructor call of package outboundtest, its name in any case,
with or without dashes and "()". Faults of a request (--fault, or the
header):
  Respond(503, Retry-After, 30)   Slow(2s, 200)   Hang()   Queued(8, 20ms)
  ResetBeforeRead()   ResetAfterRead()   CloseBeforeRead()   PartialHeaders()
  TruncatedBody(100, 10)   Trickle(10ms, 64)   HugeHeaders(1048576)
  BadStatusLine()   EndlessBody()   CloseMidStream()
HTTP/2 only (--proto h2c or h2tls; over HTTP/1.1 they are answered 501):
  RefusedStream()   ResetStream(CANCEL)   GoAway(1, 0, false)   HardStop(1)
Faults of a connection, before a byte of it is read, so no header can
choose them: --conn-fault gives one to every connection accepted:
  ResetOnAccept()   CloseOnAccept()   StallOnAccept()

GoAway(N, P, answer) and HardStop(N) wait, up to 3 s, for N streams on the
connection before the GOAWAY: one outbound do sends one stream at a time,
so give it N = 1 (GoAway(1, 0, false): a GOAWAY that proves the stream was
not processed; GoAway(1, 1, false): one that says it may have been).

Example:
  outbound upstream --proto h2c &
  outbound do --h2c -d '{"qty":1}' -H '%[1]s: RefusedStream()' http://127.0.0.1:8088/orders

Flags:
`

func upstreamCmd(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	return runUpstream(ctx, args, stdout, stderr)
}

// runUpstream serves until ctx ends, then prints what it counted.
func runUpstream(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	proto := fs.String("proto", "http1", "protocol `PROTO`: http1, h2c (HTTP/2 without TLS) or h2tls (HTTP/2 over TLS, self-signed)")
	addr := fs.String("addr", "127.0.0.1:8088", "listen on `ADDR` (port 0 picks one)")
	fault := fs.String("fault", "Respond(200)", "the `FAULT` every request gets unless its "+outboundtest.FaultHeader+" header names another")
	connFault := fs.String("conn-fault", "", "the connection `FAULT` (ResetOnAccept, CloseOnAccept, StallOnAccept) every accepted connection gets: no request is then read")
	perConn := fs.Int("requests-per-conn", 0, "close each connection after `N` requests, as nginx's keepalive_requests does (0: no limit)")
	certFile := fs.String("cert", "", "with h2tls: write the server's certificate to `FILE`, for clients to trust (outbound do --cacert FILE, curl --cacert FILE)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, upstreamUsage, outboundtest.FaultHeader, outboundtest.IDHeader)
		printFlags(stderr, fs)
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outbound upstream: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	p, ok := map[string]outboundtest.Proto{"http1": outboundtest.HTTP1, "h2c": outboundtest.H2C, "h2tls": outboundtest.H2TLS}[strings.ToLower(*proto)]
	if !ok {
		fmt.Fprintf(stderr, "outbound upstream: --proto %q: want http1, h2c or h2tls\n", *proto)
		return exitUsage
	}
	def, err := outboundtest.ParseFault(*fault)
	if err == nil && def.ConnLevel() {
		err = fmt.Errorf("%s is a connection-level fault: give it to --conn-fault", def)
	}
	if err != nil {
		fmt.Fprintln(stderr, "outbound upstream: --fault:", err)
		return exitUsage
	}
	if *certFile != "" && p != outboundtest.H2TLS {
		fmt.Fprintln(stderr, "outbound upstream: --cert needs --proto h2tls")
		return exitUsage
	}
	if *connFault != "" {
		cf, err := outboundtest.ParseFault(*connFault)
		if err == nil && !cf.ConnLevel() {
			err = fmt.Errorf("%s is a fault of a request: give it to --fault, or name it in the %s header", cf, outboundtest.FaultHeader)
		}
		if err != nil {
			fmt.Fprintln(stderr, "outbound upstream: --conn-fault:", err)
			return exitUsage
		}
		var also []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "fault" || f.Name == "requests-per-conn" || f.Name == "cert" {
				also = append(also, "--"+f.Name)
			}
		})
		if len(also) > 0 {
			fmt.Fprintf(stderr, "outbound upstream: %s with --conn-fault: every connection gets the connection fault, before a request or a TLS handshake\n", strings.Join(also, ", "))
			return exitUsage
		}
		return serveConnFault(ctx, p, *addr, cf, stdout, stderr)
	}
	s, err := outboundtest.NewServerAt(p, *addr)
	if err != nil {
		fmt.Fprintln(stderr, "outbound upstream:", err)
		return exitFailed
	}
	defer s.Close()
	s.EnableFaultHeader()
	s.SetRequestsPerConn(*perConn)
	s.SetDefault(def)
	if *certFile != "" {
		if err := os.WriteFile(*certFile, s.CertificatePEM(), 0o644); err != nil {
			fmt.Fprintln(stderr, "outbound upstream: --cert:", err)
			return exitFailed
		}
	}
	fmt.Fprintf(stdout, "listening on %s (%s), every request: %s\n", s.URL, s.Proto, def)
	if *certFile != "" {
		fmt.Fprintf(stdout, "certificate: %s\n", *certFile)
	}
	fmt.Fprintln(stdout, "Ctrl-C stops and prints the requests counted")
	<-ctx.Done()
	printCounts(stdout, s)
	return exitOK
}

// serveConnFault listens on addr and gives every connection it accepts the
// connection-level fault f, as outboundtest's Server.EnqueueConn does to
// one: ResetOnAccept resets it (SO_LINGER 0, then close), CloseOnAccept
// closes it (FIN), StallOnAccept reads and drops what the client sends
// until the client closes it or ctx ends — on H2TLS, a TLS handshake that
// never completes. No byte is read before the fault, so no request is.
func serveConnFault(ctx context.Context, p outboundtest.Proto, addr string, f outboundtest.Fault, stdout, stderr io.Writer) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(stderr, "outbound upstream:", err)
		return exitFailed
	}
	scheme := "http"
	if p == outboundtest.H2TLS {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "listening on %s://%s (%s), every connection: %s\n", scheme, ln.Addr(), p, f)
	fmt.Fprintln(stdout, "Ctrl-C stops and prints the connections counted")
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		stalled = map[net.Conn]struct{}{}
		n       int
	)
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		mu.Lock()
		for c := range stalled {
			c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				break
			}
			// Out of file descriptors or similar: wait a little.
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		n++
		switch f.String() {
		case "ResetOnAccept()":
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			c.Close()
		case "CloseOnAccept()":
			c.Close()
		default: // StallOnAccept()
			mu.Lock()
			if ctx.Err() != nil {
				mu.Unlock()
				c.Close()
				continue
			}
			stalled[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(io.Discard, c)
				c.Close()
				mu.Lock()
				delete(stalled, c)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	fmt.Fprintf(stdout, "\n%d connection(s) accepted, every one given %s: no request was read\n", n, f)
	return exitOK
}

// printCounts prints what the upstream counted: per call id, the requests
// received and executed.
func printCounts(w io.Writer, s *outboundtest.Server) {
	type count struct{ received, executed int }
	counts := map[string]*count{}
	for _, r := range s.Log() {
		c := counts[r.ID]
		if c == nil {
			c = &count{}
			counts[r.ID] = c
		}
		c.received++
		if r.Executed {
			c.executed++
		}
	}
	fmt.Fprintf(w, "\n%d request(s) received, %d executed, on %d connection(s)\n", s.TotalReceived(), s.TotalExecutions(), s.Conns())
	if len(counts) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tRECEIVED\tEXECUTED\n", strings.ToUpper(outboundtest.IDHeader))
	for _, id := range slices.Sorted(maps.Keys(counts)) {
		name := id
		if name == "" {
			name = "(none)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\n", name, counts[id].received, counts[id].executed)
	}
	tw.Flush()
}
