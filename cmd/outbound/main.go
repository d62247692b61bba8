// Command outbound drills the library against a faulty upstream and sends
// single requests through it with verdicts.
//
//	outbound drill [--list] [--scenario NAME]... [--json] [--html FILE] [--metrics ADDR]
//	outbound do [-X METHOD] [-H 'Name: value']... [-d DATA | --data-binary @FILE]... [-i] [-v] [-L] [-f] [-o FILE] [-m SECONDS] URL
//	outbound upstream [--proto http1|h2c|h2tls] [--addr ADDR] [--fault SPEC | --conn-fault SPEC]
//	outbound version
//
// Run `outbound help COMMAND` for the flags.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Exit codes.
const (
	exitOK           = 0
	exitFailed       = 1 // a drill verdict failed, or the request could not be made
	exitUsage        = 2 // a bad flag, argument or URL
	exitIO           = 5 // drill: a report could not be written
	exitNotCommitted = 3 // do: the call was proven not processed
	exitUnknown      = 4 // do: the call may or may not have been processed
)

// Exit codes of do that curl has too, with curl's numbers.
const (
	exitTruncated   = 18  // the body ended before its end
	exitHTTPError   = 22  // -f: the answer's status was 400 or more
	exitWrite       = 23  // the body could not be written out
	exitTimeout     = 28  // the call's deadline (-m) expired
	exitRedirects   = 47  // -L: more redirects than --max-redirs
	exitH2Stream    = 92  // the HTTP/2 stream was reset while the body streamed
	exitInterrupted = 130 // Ctrl-C: 128 + SIGINT, what a shell reports of curl
)

const usage = `outbound: outbound HTTP calls that fail correctly.

Usage:
  outbound drill [flags]     run failure scenarios against an embedded faulty upstream
  outbound do [flags] URL    send one request through the full pipeline and explain the outcome
  outbound upstream [flags]  serve the fault-injecting upstream, to try do, curl or any client on
  outbound version           print the version

Run "outbound help COMMAND" for a command's flags.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "drill":
		return drillCmd(args[1:], stdout, stderr)
	case "do":
		return doCmd(args[1:], stdout, stderr)
	case "upstream":
		return upstreamCmd(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "outbound", version())
		return exitOK
	case "help", "-h", "--help", "-help":
		if len(args) > 1 && args[0] == "help" {
			switch args[1] {
			case "drill", "do", "upstream":
				return run([]string{args[1], "-h"}, stdout, stdout)
			}
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "outbound: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// version is the module version when built from a module proxy, or the VCS
// revision when built in a checkout.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "(devel)"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	return "(devel) " + rev
}
