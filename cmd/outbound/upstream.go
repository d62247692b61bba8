package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/outboundhq/outbound/outboundtest"
)

// stopSignals end `outbound upstream`; a test may replace them.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

func upstreamCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	proto := fs.String("proto", "http1", "protocol `PROTO`: http1, h2c (HTTP/2 without TLS) or h2tls (HTTP/2 over TLS, self-signed)")
	addr := fs.String("addr", "127.0.0.1:8088", "listen on `ADDR` (port 0 picks one)")
	fault := fs.String("fault", "Respond(200)", "the `FAULT` every request gets unless its "+outboundtest.FaultHeader+" header names another")
	perConn := fs.Int("requests-per-conn", 0, "close each connection after `N` requests, as nginx's keepalive_requests does (0: no limit)")
	certFile := fs.String("cert", "", "with h2tls: write the server's certificate to `FILE`, for clients to trust (outbound do --cacert FILE, curl --cacert FILE)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `Usage: outbound upstream [flags]

Serves the fault-injecting upstream on loopback, so that outbound do, curl
or a client in any language can be tried against its faults. Every request
gets --fault, unless it carries the header
  %s: FAULT
which chooses its own. The upstream counts, per %s header, the
requests it received and those it executed (processed); Ctrl-C stops it
and prints them.

FAULT is a constructor call of package outboundtest, its name in any case,
with or without dashes and "()":
  Respond(503, Retry-After, 30)   Slow(2s, 200)   Hang()   Queued(8, 20ms)
  ResetBeforeRead()   ResetAfterRead()   CloseBeforeRead()   PartialHeaders()
  TruncatedBody(100, 10)   Trickle(10ms, 64)   HugeHeaders(1048576)
  BadStatusLine()   EndlessBody()   CloseMidStream()
  RefusedStream()   ResetStream(CANCEL)   GoAway(3, 1, false)   HardStop(2)   (HTTP/2)

Example:
  outbound upstream --proto h2c &
  outbound do --h2c -d '{"qty":1}' -H '%s: RefusedStream()' http://127.0.0.1:8088/orders

Flags:
`, outboundtest.FaultHeader, outboundtest.IDHeader, outboundtest.FaultHeader)
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
		err = fmt.Errorf("%s is a connection-level fault, not one a request can get", def)
	}
	if err != nil {
		fmt.Fprintln(stderr, "outbound upstream: --fault:", err)
		return exitUsage
	}
	if *certFile != "" && p != outboundtest.H2TLS {
		fmt.Fprintln(stderr, "outbound upstream: --cert needs --proto h2tls")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
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
