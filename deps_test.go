package outbound_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The core module depends on the standard library and
// golang.org/x/... only; integrations (OpenTelemetry) and the peer benchmarks
// are nested modules with their own go.mod.
func TestCoreModuleDependsOnlyOnTheStandardLibraryAndGolangOrgX(t *testing.T) {
	data, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	inRequire := false
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case f[0] == "require" && len(f) > 1 && f[1] == "(":
			inRequire = true
			continue
		case f[0] == ")":
			inRequire = false
			continue
		case f[0] == "require":
			f = f[1:]
		case !inRequire:
			continue
		}
		if !strings.HasPrefix(f[0], "golang.org/x/") {
			t.Errorf("the core module requires %s", f[0])
		}
	}
	for _, nested := range []string{"otel/go.mod", "bench/go.mod"} {
		if _, err := os.Stat(nested); err != nil {
			t.Errorf("%s: %v", nested, err)
		}
	}
}

// moduleDeps returns, for every package of the core module, the packages of
// the module it depends on (directly or not, tests excluded), by path
// relative to the module ("" for the root).
func moduleDeps(t *testing.T) map[string][]string {
	t.Helper()
	const mod = "github.com/outboundhq/outbound"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	rel := func(p string) (string, bool) {
		if p == mod {
			return "", true
		}
		r, ok := strings.CutPrefix(p, mod+"/")
		return r, ok
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, _ := rel(f[0])
		deps[pkg] = []string{}
		for _, d := range f[1:] {
			if r, ok := rel(d); ok {
				deps[pkg] = append(deps[pkg], r)
			}
		}
	}
	if len(deps) < 10 {
		t.Fatalf("go list found %d packages: %s", len(deps), out)
	}
	return deps
}

// under reports whether pkg is dir or a package below it.
func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

// The layering of the module, one rule each: a package may depend only on
// what its rule allows (internal/ holds the primitives every layer may use).
func TestEachLayerDependsOnlyOnTheLayersBelowIt(t *testing.T) {
	deps := moduleDeps(t)
	rules := []struct {
		name    string
		applies func(pkg string) bool
		allows  func(dep string) bool
	}{
		{"a package under internal/ depends on nothing of the module outside internal/",
			func(p string) bool { return under(p, "internal") },
			func(d string) bool { return under(d, "internal") }},
		{"classify depends on nothing of the module but internal/",
			func(p string) bool { return p == "classify" },
			func(d string) bool { return under(d, "internal") }},
		{"retry depends on nothing of the module but classify and internal/",
			func(p string) bool { return p == "retry" },
			func(d string) bool { return d == "classify" || under(d, "internal") }},
		{"outcome depends on nothing of the module but classify, retry and internal/",
			func(p string) bool { return p == "outcome" },
			func(d string) bool { return d == "classify" || d == "retry" || under(d, "internal") }},
		{"criticality depends on nothing of the module",
			func(p string) bool { return p == "criticality" },
			func(d string) bool { return false }},
		{"admission never depends on attempt, retry, outcome or the root",
			func(p string) bool { return under(p, "admission") },
			func(d string) bool {
				return under(d, "admission") || d == "classify" || d == "criticality" || under(d, "internal")
			}},
		{"a guard depends on no other guard and not on admission",
			func(p string) bool { return under(p, "admission") && p != "admission" },
			func(d string) bool { return d == "criticality" || under(d, "internal") }},
		{"attempt never depends on retry, outcome or the root",
			func(p string) bool { return p == "attempt" },
			func(d string) bool {
				return under(d, "admission") || d == "classify" || d == "criticality" || under(d, "internal")
			}},
		{"the library never depends on the drill, the test upstream or the command",
			func(p string) bool {
				return !under(p, "drill") && !under(p, "outboundtest") && !under(p, "cmd") && !under(p, "interop") && !under(p, "soak")
			},
			func(d string) bool {
				return !under(d, "drill") && !under(d, "outboundtest") && !under(d, "cmd")
			}},
	}
	for _, r := range rules {
		checked := 0
		for pkg, ds := range deps {
			if !r.applies(pkg) {
				continue
			}
			checked++
			for _, d := range ds {
				if !r.allows(d) {
					t.Errorf("%s: %q depends on %q", r.name, pkg, d)
				}
			}
		}
		if checked == 0 {
			t.Errorf("%s: no package to check", r.name)
		}
	}
}
