package main

import (
	"bytes"
	"flag"
	"strings"
	"testing"
	"time"
)

// testFlags is a flag set like a command's: -i, -v (booleans), -X, -d,
// --data (values), --timeout with its aliases -m and --max-time.
func testFlags() (fs *flag.FlagSet, out *bytes.Buffer, i, v *bool, x *string, d *stringList, timeout *time.Duration) {
	out = new(bytes.Buffer)
	fs = flag.NewFlagSet("do", flag.ContinueOnError)
	fs.SetOutput(out)
	i = fs.Bool("i", false, "include")
	v = fs.Bool("v", false, "verbose")
	x = fs.String("X", "", "`METHOD`")
	d = new(stringList)
	fs.Var(d, "d", "`DATA`")
	alias(fs, "data", "d")
	timeout = durationFlag(fs, "timeout", 30*time.Second, "deadline (`SECONDS`)")
	alias(fs, "m", "timeout")
	alias(fs, "max-time", "timeout")
	fs.Usage = func() { out.WriteString("USAGE\n") }
	return
}

// One-letter flags run together as curl's do; values may be attached.
func TestParseSplitsOneLetterFlagsAsCurlDoes(t *testing.T) {
	fs, out, i, v, x, d, timeout := testFlags()
	code, ok := parse(fs, []string{"-iv", "-XPUT", "-d@f", "-m5", "url", "--data", "a=1"})
	if !ok || code != 0 || !*i || !*v || *x != "PUT" || strings.Join(*d, ",") != "@f,a=1" || *timeout != 5*time.Second ||
		fs.NArg() != 1 || fs.Arg(0) != "url" {
		t.Fatalf("ok %v code %d: -i %v -v %v -X %q -d %q -m %v args %q; %s", ok, code, *i, *v, *x, *d, *timeout, fs.Args(), out)
	}
	fs, out, _, v, x, _, _ = testFlags()
	if code, ok := parse(fs, []string{"-vX", "GET", "u"}); !ok || code != 0 || !*v || *x != "GET" || fs.Arg(0) != "u" {
		t.Fatalf("-vX GET: ok %v code %d -v %v -X %q args %q; %s", ok, code, *v, *x, fs.Args(), out)
	}
}

// Durations without a unit are seconds, as curl's -m takes them; with a
// unit, Go durations; negative ones are refused.
func TestDurationFlagsTakeBareSeconds(t *testing.T) {
	for in, want := range map[string]time.Duration{"1": time.Second, "0.5": 500 * time.Millisecond, "2.25": 2250 * time.Millisecond,
		"0": 0, "1s": time.Second, "250ms": 250 * time.Millisecond, "1m": time.Minute} {
		fs, out, _, _, _, _, timeout := testFlags()
		if code, ok := parse(fs, []string{"--timeout", in}); !ok || code != 0 || *timeout != want {
			t.Errorf("--timeout %s: %v, want %v (%d %v: %s)", in, *timeout, want, code, ok, out)
		}
	}
	for _, in := range []string{"-1", "abc", "1x", "-2s", "NaN"} {
		fs, out, _, _, _, _, _ := testFlags()
		code, ok := parse(fs, []string{"--max-time=" + in})
		if ok || code != exitUsage || strings.Count(out.String(), "\n") != 1 || !strings.Contains(out.String(), "--max-time") {
			t.Errorf("--max-time=%s: ok %v code %d, output %q", in, ok, code, out)
		}
	}
}

// An unknown flag gets one line that names the nearest known flag, and
// exit status 2; no usage.
func TestAnUnknownFlagNamesTheNearestOneOnOneLine(t *testing.T) {
	for args, want := range map[string]string{
		"--dat x":   "outbound do: unknown flag --dat; did you mean --data?\n",
		"--dta=x":   "outbound do: unknown flag --dta; did you mean --data?\n",
		"-timeot 1": "outbound do: unknown flag -timeot; did you mean --timeout?\n",
		"--max-tim": "outbound do: unknown flag --max-tim; did you mean --max-time?\n",
		"-ivs":      "outbound do: unknown flag -s (in -ivs); the nearest is ",
		"--zzzzzzz": "outbound do: unknown flag --zzzzzzz; the nearest is ",
		"-X":        "outbound do: -X needs a value",
		"u -d":      "outbound do: -d needs a value",
	} {
		fs, out, _, _, _, _, _ := testFlags()
		code, ok := parse(fs, strings.Fields(args))
		if ok || code != exitUsage || !strings.HasPrefix(out.String(), want) || strings.Count(out.String(), "\n") != 1 {
			t.Errorf("%s: ok %v code %d, output %q, want it to start with %q", args, ok, code, out, want)
		}
	}
	fs, out, _, _, _, _, _ := testFlags()
	if code, ok := parse(fs, []string{"-h"}); ok || code != exitOK || out.String() != "USAGE\n" {
		t.Errorf("-h: ok %v code %d, output %q", ok, code, out)
	}
}

// The names of one flag are listed on one line, the one-letter name first.
func TestPrintFlagsGroupsTheNamesOfAFlag(t *testing.T) {
	fs, _, _, _, _, _, _ := testFlags()
	var b bytes.Buffer
	printFlags(&b, fs)
	for _, want := range []string{"  -d, --data DATA\n", "  -m, --max-time, --timeout SECONDS\n    \tdeadline (SECONDS) (default 30s)\n", "  -X METHOD\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Count(b.String(), "--timeout") != 1 {
		t.Errorf("--timeout listed more than once:\n%s", b.String())
	}
}
