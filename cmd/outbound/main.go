// Command outbound drills the library against a faulty upstream and sends
// single requests through it with verdicts.
//
//	outbound drill [--list] [--scenario NAME]... [--json] [--html FILE]
//	outbound do [-X METHOD] [-H 'Name: value']... [-d DATA | -d @FILE | -d @-] [-v] URL
//	outbound version
//
// Run `outbound help` or `outbound COMMAND -h` for the flags.
package main

import (
	"flag"
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
	exitUsage        = 2
	exitNotCommitted = 3 // do: the call was proven not processed
	exitUnknown      = 4 // do: the call may or may not have been processed
)

const usage = `outbound: outbound HTTP calls that fail correctly.

Usage:
  outbound drill [flags]   run failure scenarios against an embedded faulty upstream
  outbound do [flags] URL  send one request through the full pipeline and explain the outcome
  outbound version         print the version

Run "outbound COMMAND -h" for a command's flags.
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
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "outbound", version())
		return exitOK
	case "help", "-h", "--help", "-help":
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

// parse parses a command's flags. When it returns false, the command must
// return code: 0 after -h, 2 after an error (already printed by fs).
func parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitOK, false
		}
		return exitUsage, false
	}
	return 0, true
}
