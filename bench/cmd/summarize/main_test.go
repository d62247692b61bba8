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
