package main

import (
	"bytes"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkAdmission/baseline/sequential-2   	 3000000	       100.0 ns/op	       0 B/op	       0 allocs/op
BenchmarkAdmission/outbound/sequential-2   	 6000000	        40.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkEndToEnd/bare/16-callers-2        	   50000	     16000 ns/op	        16.00 conns	     15000 cpu-ns/op	     62500 req/s	    3350 B/op	      41 allocs/op
BenchmarkEndToEnd/outbound/16-callers      	   50000	     16000 ns/op	        16.00 conns	     16500 cpu-ns/op	     60000 req/s	    4350 B/op	      60 allocs/op
PASS
`

func TestParse(t *testing.T) {
	r, names := parse(strings.NewReader(sample))
	want := []string{"Admission/baseline/sequential", "Admission/outbound/sequential",
		"EndToEnd/bare/16-callers", "EndToEnd/outbound/16-callers"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("names = %q, want %q", names, want)
	}
	if got := r["EndToEnd/bare/16-callers"]["req/s"]; got != 62500 {
		t.Errorf("req/s = %v, want 62500", got)
	}
	if got := r["Admission/outbound/sequential"]["ns/op"]; got != 40 {
		t.Errorf("ns/op = %v, want 40", got)
	}
}

func TestRatiosAgainstSameRound(t *testing.T) {
	r1, names := parse(strings.NewReader(sample))
	r2, _ := parse(strings.NewReader(strings.ReplaceAll(sample, "100.0 ns/op", "80.00 ns/op")))
	s := &summary{rounds: []round{r1, r2}}
	// Per-round ratios 0.4 and 0.5: their median is 0.45.
	if got := median(s.ratios("Admission/outbound/sequential", "Admission/baseline/sequential", "ns/op")); got != 0.45 {
		t.Errorf("median ratio = %v, want 0.45", got)
	}
	var out bytes.Buffer
	s.table(&out, sortNames(names))
	if !strings.Contains(out.String(), "| `EndToEnd/outbound/16-callers` | req/s | 60000 | 60000–60000 | 0.960 |") {
		t.Errorf("table row missing:\n%s", out.String())
	}
}

// pairedSample is one round in which the separate-process runs put outbound
// below the target and the paired run above it.
const pairedSample = `BenchmarkEndToEnd/bare/16-callers-2        	   50000	     16000 ns/op	        16.00 conns	     15000 cpu-ns/op	     62500 req/s	    3350 B/op	      41 allocs/op
BenchmarkEndToEnd/outbound/16-callers      	   50000	     16000 ns/op	        16.00 conns	     16500 cpu-ns/op	     56250 req/s	    3350 B/op	      38 allocs/op
BenchmarkEndToEndPaired/16-callers-2         	   50000	     52952 ns/op	     25847 base-cpu-ns/op	     37820 base-req/s	         1.010 cpu-ratio	     25855 cpu-ns/op	     37730 req/s	         0.9900 req/s-ratio
BenchmarkEndToEndPaired/16-callers-bare-vs-bare-2         	   50000	     52952 ns/op	     25847 base-cpu-ns/op	     37820 base-req/s	         1.001 cpu-ratio	     25855 cpu-ns/op	     37730 req/s	         0.9970 req/s-ratio
`

func TestTheEndToEndTargetsAreCheckedOnThePairedRunsWhenThereAreAny(t *testing.T) {
	r, names := parse(strings.NewReader(pairedSample))
	s := &summary{rounds: []round{r}}
	var out bytes.Buffer
	s.table(&out, sortNames(names))
	s.targets(&out)
	for _, want := range []string{
		"| `EndToEndPaired/16-callers` | req/s-ratio | 0.99 | 0.99–0.99 | 0.990 | bare net/http, alternating in the same process | — | — | 25855 (1.010) |",
		"| end to end (16-callers), each client in its own process: requests/s vs bare net/http | 0.900× ",
		"| end to end (16-callers): ≥ 0.98× bare net/http requests/s | 0.990× (paired in one process; 1.010× client CPU per request) | yes |",
		"| end to end (16-callers): client CPU per request ≤ 1.02× bare net/http's | 1.010× | yes |",
		"| the paired runs' own error: bare net/http against itself (requests/s, client CPU) | 0.997× [0.997–0.997], 1.001× | (information) |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("missing %q in:\n%s", want, out.String())
		}
	}
	// Without the paired run, the same round misses the target.
	s = &summary{rounds: []round{r}}
	delete(r, "EndToEndPaired/16-callers")
	out.Reset()
	s.targets(&out)
	if !strings.Contains(out.String(), "| end to end (16-callers): ≥ 0.98× bare net/http requests/s | 0.900× ") ||
		!strings.Contains(out.String(), "| **no** |") {
		t.Errorf("without the paired run, the separate-process ratio should be checked:\n%s", out.String())
	}
}
