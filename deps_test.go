package outbound_test

import (
	"os"
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
