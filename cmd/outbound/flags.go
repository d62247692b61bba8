package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// parse parses a command's flags, which may come before, between or after
// the arguments (as curl takes them); "--" ends the flags. One-letter
// flags combine as curl's do: -iv is -i -v, -XPUT is -X PUT, -d@f is -d @f.
// When it returns false, the command must return code: 0 after -h (the
// usage printed), 2 after an error, which is printed on one line: an
// unknown flag is named with the nearest known one, not with the usage.
func parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
	w := fs.Output()
	var flags, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			rest = append(rest, a)
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := fs.Lookup(name)
		if f == nil && name != "h" && name != "help" {
			split, needsValue, bad := splitShort(fs, a)
			if split == nil {
				typed, _, _ := strings.Cut(a, "=")
				hint, close := suggest(fs, typed)
				if bad != "" && !close {
					hint, _ = suggest(fs, bad)
					typed = bad + " (in " + typed + ")"
				}
				fmt.Fprintf(w, "outbound %s: unknown flag %s; %s\n", fs.Name(), typed, hint)
				return exitUsage, false
			}
			flags = append(flags, split...)
			if needsValue {
				if i+1 == len(args) {
					fmt.Fprintf(w, "outbound %s: %s needs a value (outbound %s -h lists the flags)\n", fs.Name(), split[len(split)-1], fs.Name())
					return exitUsage, false
				}
				i++
				flags = append(flags, args[i])
			}
			continue
		}
		flags = append(flags, a)
		if f != nil && !hasValue && !isBool(f) {
			if i+1 == len(args) {
				fmt.Fprintf(w, "outbound %s: %s%s needs a value (outbound %s -h lists the flags)\n", fs.Name(), dash(f.Name), f.Name, fs.Name())
				return exitUsage, false
			}
			i++
			flags = append(flags, args[i])
		}
	}
	// The flag package prints the usage after any error; only -h shows it.
	usage := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(append(flags, append([]string{"--"}, rest...)...))
	fs.Usage = usage
	fs.SetOutput(w)
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return exitOK, false
	}
	if err != nil {
		fmt.Fprintf(w, "outbound %s: %s (outbound %s -h lists the flags)\n", fs.Name(), dashes(fs, err.Error()), fs.Name())
		return exitUsage, false
	}
	return 0, true
}

// splitShort splits a of one-letter flags run together (-iv, -XPUT, -d@f,
// -m5) into separate arguments: letters that are boolean flags, then at
// most one that takes a value, the rest of a or, when nothing is left, the
// next argument (needsValue). It returns nil and the first letter that is
// no flag if a is not such a run.
func splitShort(fs *flag.FlagSet, a string) (split []string, needsValue bool, bad string) {
	if len(a) < 3 || a[0] != '-' || a[1] == '-' {
		return nil, false, ""
	}
	s := a[1:]
	for j := 0; j < len(s); j++ {
		letter := s[j : j+1]
		f := fs.Lookup(letter)
		if f == nil {
			return nil, false, "-" + letter
		}
		split = append(split, "-"+letter)
		if isBool(f) {
			continue
		}
		if j+1 < len(s) {
			return append(split, s[j+1:]), false, ""
		}
		return split, true, ""
	}
	return split, false, ""
}

// suggest names the known flag nearest to typed ("-dat", "--dat"), and
// reports whether it is near enough to be what was meant.
func suggest(fs *flag.FlagSet, typed string) (hint string, close bool) {
	name := strings.TrimLeft(typed, "-")
	best, bestD := "", math.MaxInt
	fs.VisitAll(func(f *flag.Flag) {
		if d := distance(strings.ToLower(name), strings.ToLower(f.Name)); d < bestD {
			best, bestD = f.Name, d
		}
	})
	if best == "" {
		return "outbound " + fs.Name() + " -h lists the flags", false
	}
	near := max(1, min(2, len(name)/3))
	if len(name) <= 2 {
		near = 0 // -s is not a typo of -d
	}
	if bestD > near {
		return "the nearest is " + dash(best) + best + " (outbound " + fs.Name() + " -h lists the flags)", false
	}
	return "did you mean " + dash(best) + best + "?", true
}

// distance is the optimal string alignment distance between a and b: the
// edits (a letter added, removed, changed, or two swapped) from one to the
// other.
func distance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// dash is "-" before a one-letter flag and "--" before the others, as the
// documentation spells them.
func dash(name string) string {
	if len(name) == 1 {
		return "-"
	}
	return "--"
}

// dashes rewrites the flag package's "-name" in msg as the documentation
// spells the flag.
func dashes(fs *flag.FlagSet, msg string) string {
	for _, prefix := range []string{"for flag -", "for -", "flag needs an argument: -"} {
		i := strings.Index(msg, prefix)
		if i < 0 {
			continue
		}
		rest := msg[i+len(prefix):]
		end := strings.IndexAny(rest, ": ")
		if end < 0 {
			end = len(rest)
		}
		if name := rest[:end]; fs.Lookup(name) != nil && len(name) > 1 {
			msg = msg[:i+len(prefix)] + "-" + rest
		}
	}
	return msg
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// alias registers name as another name of the flag target.
func alias(fs *flag.FlagSet, name, target string) {
	f := fs.Lookup(target)
	fs.Var(f.Value, name, f.Usage)
}

// printFlags lists fs's flags as the documentation writes them: "--name
// PLACEHOLDER", the placeholder taken from the `backquoted` word of the
// usage, or "-X" for one-letter flags, as curl spells them; the names of
// one flag (see alias) on one line, "-m, --max-time, --timeout SECONDS".
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var order []flag.Value
	names := map[flag.Value][]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) {
		if _, seen := names[f.Value]; !seen {
			order = append(order, f.Value)
		}
		names[f.Value] = append(names[f.Value], f)
	})
	for _, v := range order {
		group := names[v]
		slices.SortStableFunc(group, func(a, b *flag.Flag) int { return min(len(a.Name), 2) - min(len(b.Name), 2) })
		f := group[0]
		placeholder, usage := flag.UnquoteUsage(f)
		var spelled []string
		for _, g := range group {
			spelled = append(spelled, dash(g.Name)+g.Name)
		}
		line := "  " + strings.Join(spelled, ", ")
		if !isBool(f) {
			if placeholder == "" {
				placeholder = "VALUE"
			}
			line += " " + placeholder
		}
		if d := f.DefValue; !isBool(f) && d != "" && d != "0" && d != "0s" {
			usage += fmt.Sprintf(" (default %s)", d)
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, usage)
	}
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ", ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// seconds is a duration flag that reads a bare number as seconds, as curl
// does (-m 1, -m 0.5), and a Go duration with its unit (500ms, 2m).
type seconds time.Duration

func durationFlag(fs *flag.FlagSet, name string, def time.Duration, usage string) *time.Duration {
	d := def
	fs.Var((*seconds)(&d), name, usage)
	return &d
}

func (s *seconds) String() string {
	if s == nil {
		return "0s"
	}
	return time.Duration(*s).String()
}

func (s *seconds) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 || math.IsNaN(f) || f*float64(time.Second) > math.MaxInt64 {
			return errors.New("want a number of seconds, 0 or more")
		}
		*s = seconds(time.Duration(f * float64(time.Second)))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want seconds (1, 0.5) or a duration with its unit (500ms, 2m)")
	}
	if d < 0 {
		return errors.New("want a duration of 0 or more")
	}
	*s = seconds(d)
	return nil
}
