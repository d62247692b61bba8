package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboundhq/outbound/drill"
	"github.com/outboundhq/outbound/drill/metrics"
)

func drillCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var only stringList
	fs.Var(&only, "scenario", "run only the scenario `NAME` (repeatable); see --list")
	list := fs.Bool("list", false, "list the scenarios and exit")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of text")
	htmlPath := fs.String("html", "", "also write a self-contained HTML report with timelines to `FILE`")
	metricsAddr := fs.String("metrics", "", "serve the client's metrics in the Prometheus text format at http://`ADDR`/metrics while the drill runs")
	metricsWait := durationFlag(fs, "metrics-wait", 30*time.Second, "with --metrics: how long to keep serving after the drill (`SECONDS`, or a duration: 500ms; Ctrl-C stops)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: outbound drill [flags]

Starts a faulty upstream on loopback (HTTP/1.1, h2c, h2 over TLS) and runs
scripted scenarios through a client built from the library: an outage with
recovery under local back-pressure, a 503 storm, resets before and after
processing, REFUSED_STREAM, GOAWAY, Retry-After beyond the deadline, a
streamed one-shot PUT, a burst against a dead upstream. Each scenario states
what a correct client must do, what happened, and a verdict. To run them
against your own configuration, use the drill package from a Go test.

Exit status: 0 every verdict passed, 1 a verdict failed, 2 usage (a bad
flag, an unknown scenario, an --html file that cannot be written), 5 the
HTML report could not be written after the drill.

Flags:
`)
		printFlags(stderr, fs)
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "outbound drill: unexpected argument %q (did you mean --scenario %s?)\n", fs.Arg(0), fs.Arg(0))
		return exitUsage
	}
	if *list {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, s := range drill.Scenarios() {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, s.Proto, s.Title)
		}
		tw.Flush()
		return exitOK
	}
	var html *os.File
	if *htmlPath != "" {
		// Fail before the drill, not after it: the file must be writable.
		f, err := os.Create(*htmlPath)
		if err != nil {
			fmt.Fprintln(stderr, "outbound drill: --html:", err)
			return exitUsage
		}
		html = f
		defer html.Close()
	}
	opts := drill.Options{Only: only, Version: version()}
	if *metricsAddr != "" {
		reg := metrics.New()
		opts.Hooks, opts.Observe = reg.Hooks(), reg.Observe
		stop, url, err := serveMetrics(*metricsAddr, reg)
		if err != nil {
			fmt.Fprintln(stderr, "outbound drill: --metrics:", err)
			return exitUsage
		}
		fmt.Fprintf(stderr, "metrics: %s\n", url)
		defer func() {
			if *metricsWait > 0 {
				fmt.Fprintf(stderr, "metrics: still serving %s for %v (Ctrl-C stops)\n", url, *metricsWait)
				ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
				defer cancel()
				select {
				case <-ctx.Done():
				case <-time.After(*metricsWait):
				}
			}
			stop()
		}()
	}
	tty := isTerminal(stdout)
	if tty && !*asJSON {
		opts.Progress = func(i, n int, s drill.Scenario) {
			fmt.Fprintf(stdout, "\r\033[K[%d/%d] %s …", i+1, n, s.Name)
		}
	}
	r, err := drill.Run(context.Background(), opts)
	if tty && !*asJSON {
		fmt.Fprint(stdout, "\r\033[K")
	}
	if err != nil {
		fmt.Fprintln(stderr, "outbound drill:", err)
		return exitUsage
	}
	var htmlErr error
	if html != nil {
		htmlErr = writeHTML(html, r)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(stderr, "outbound drill:", err)
			return exitFailed
		}
	} else {
		printReport(stdout, r)
		if html != nil && htmlErr == nil {
			fmt.Fprintf(stdout, "\nHTML report: %s\n", *htmlPath)
		}
	}
	if htmlErr != nil {
		fmt.Fprintln(stderr, "outbound drill: writing the HTML report:", htmlErr)
		return exitIO
	}
	if !r.Passed {
		return exitFailed
	}
	return exitOK
}

// serveMetrics serves reg at http://addr/metrics until stop is called.
func serveMetrics(addr string, reg *metrics.Registry) (stop func(), url string, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", reg)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return func() { _ = srv.Close() }, "http://" + ln.Addr().String() + "/metrics", nil
}

func writeHTML(f *os.File, r *drill.Report) error {
	if err := drill.WriteHTML(f, r); err != nil {
		return err
	}
	return f.Close()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// printReport writes the text report: per scenario what must happen, what
// did, and the verdict; then a summary table.
func printReport(w io.Writer, r *drill.Report) {
	for _, s := range r.Scenarios {
		fmt.Fprintf(w, "%s  %s (%s)\n  %s\n  must: %s\n", verdict(s.Passed), s.Name, s.Protocol, s.Title, s.Expect)
		for _, c := range s.Checks {
			mark := "ok "
			if !c.Passed {
				mark = "BAD"
			}
			fmt.Fprintf(w, "    [%s] %s: want %s, got %s\n", mark, c.What, c.Want, c.Got)
		}
		states := []string{}
		if len(s.Transitions) > 0 {
			states = append(states, s.Transitions[0].From)
		}
		for _, t := range s.Transitions {
			states = append(states, fmt.Sprintf("%s@%.0fms", t.To, t.AtMs))
		}
		if len(states) > 0 {
			fmt.Fprintf(w, "    breaker: %s\n", strings.Join(states, " -> "))
		}
		fmt.Fprintln(w)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tPROTO\tVERDICT\tCALLS\tEXECUTED\tATTEMPTS answered/not-sent/ambiguous/local\tCOMMITS c/n/u\tRETRIES\tTIME")
	for _, s := range r.Scenarios {
		a, c := s.Attempts, s.Commits
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d/%d/%d/%d\t%d/%d/%d\t%d\t%s\n", s.Name, s.Protocol, verdict(s.Passed),
			s.Calls, s.Executions, a["Answered"], a["NotSent"], a["Ambiguous"], a["LocalRejection"],
			c["committed"], c["not committed"], c["unknown"], s.Retries, millis(s.Millis))
	}
	tw.Flush()
	passed := 0
	for _, s := range r.Scenarios {
		if s.Passed {
			passed++
		}
	}
	fmt.Fprintf(w, "\n%s: %d of %d scenarios passed in %s\n", verdict(r.Passed), passed, len(r.Scenarios), millis(r.Millis))
}

// millis renders a duration given in milliseconds with the precision it
// deserves: "0.4ms", "11ms", "2.3s".
func millis(ms float64) string {
	switch {
	case ms < 10:
		return fmt.Sprintf("%.1fms", ms)
	case ms < 1000:
		return fmt.Sprintf("%.0fms", ms)
	}
	return fmt.Sprintf("%.1fs", ms/1000)
}
