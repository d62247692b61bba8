// Package leakcheck fails a test binary whose tests leave goroutines behind.
// A package opts in with
//
//	func TestMain(m *testing.M) { leakcheck.Main(m) }
//
// After the tests pass, it waits (at most a few seconds) for every goroutine
// that did not exist before them to end, and otherwise prints their stacks and
// makes the binary fail. It does what go.uber.org/goleak does for us, without
// a dependency outside the standard library in the core module.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// grace is how long goroutines get to end after the tests.
const grace = 5 * time.Second

// Main runs the tests, then checks for leaked goroutines.
func Main(m *testing.M) {
	before := ids(stacks())
	code := m.Run()
	if code == 0 {
		if leaked := Leaked(before, grace); len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "leakcheck: %d goroutine(s) still running after the tests:\n\n%s\n",
				len(leaked), strings.Join(leaked, "\n\n"))
			code = 1
		}
	}
	os.Exit(code)
}

// Leaked waits up to d for the goroutines not in before (and not the
// runtime's or the testing package's own) to end, and returns the stacks of
// those still running.
func Leaked(before map[string]bool, d time.Duration) []string {
	deadline := time.Now().Add(d)
	for {
		var leaked []string
		for _, g := range stacks() {
			if !before[id(g)] && !ignored(g) {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Snapshot returns the ids of the goroutines running now, for Leaked.
func Snapshot() map[string]bool { return ids(stacks()) }

// stacks returns one stack text per goroutine, the current one excluded.
func stacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	gs := strings.Split(string(buf), "\n\n")
	return gs[1:] // the first is the caller's own
}

func ids(gs []string) map[string]bool {
	m := make(map[string]bool, len(gs))
	for _, g := range gs {
		m[id(g)] = true
	}
	return m
}

// id returns "goroutine N" from a stack text.
func id(g string) string {
	if i := strings.Index(g, " ["); i > 0 {
		return g[:i]
	}
	return g
}

// ignored reports goroutines that belong to the runtime or to the testing
// package, not to the code under test.
func ignored(g string) bool {
	for _, s := range []string{
		"testing.(*M).",
		"testing.tRunner",
		"testing.runFuzzing",
		"os/signal.signal_recv",
		"runtime.ensureSigM",
		"created by runtime.gc",
		"runtime.goexit0",
	} {
		if strings.Contains(g, s) {
			return true
		}
	}
	return false
}
