package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// parse parses a command's flags, which may come before, between or after
// the arguments (as curl takes them); "--" ends the flags. When it returns
// false, the command must return code: 0 after -h, 2 after an error
// (already printed).
func parse(fs *flag.FlagSet, args []string) (code int, ok bool) {
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
		flags = append(flags, a)
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if f := fs.Lookup(name); f != nil && !hasValue && !isBool(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	if err := fs.Parse(append(flags, append([]string{"--"}, rest...)...)); err != nil {
		if err == flag.ErrHelp {
			return exitOK, false
		}
		return exitUsage, false
	}
	return 0, true
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// printFlags lists fs's flags as the documentation writes them: "--name
// PLACEHOLDER", the placeholder taken from the `backquoted` word of the
// usage, or "-X" for one-letter flags, as curl spells them.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		placeholder, usage := flag.UnquoteUsage(f)
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		line := "  " + dash + f.Name
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
	})
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ", ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }
