// Command summarize reads the output of `go test -bench` for several rounds
// of the benchmarks, one file per round, and prints a Markdown table: for each
// benchmark the median over the rounds of its main figure, the spread
// (min–max), the median of its per-round ratio to the baseline measured in the
// same round, and its allocations; then the check of each target (the
// targets table of BENCHMARKS.md).
//
// Usage: summarize round-1.txt round-2.txt ...
package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// round holds one round's figures: benchmark name -> unit -> value.
type round map[string]map[string]float64

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: summarize ROUND-FILE...")
		os.Exit(2)
	}
	var rounds []round
	var order []string
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		r, names := parse(f)
		f.Close()
		rounds = append(rounds, r)
		for _, n := range names {
			if !slices.Contains(order, n) {
				order = append(order, n)
			}
		}
	}
	s := &summary{rounds: rounds}
	s.table(os.Stdout, sortNames(order))
	s.targets(os.Stdout)
}

var (
	benchLine = regexp.MustCompile(`^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)
	pair      = regexp.MustCompile(`([-+0-9.eE]+)\s+(\S+)`)
)

// parse reads `go test -bench` output and returns the figures of each
// benchmark (a later line of the same benchmark replaces an earlier one) and
// the names in order of appearance.
func parse(r io.Reader) (round, []string) {
	out := round{}
	var names []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		vals := map[string]float64{}
		for _, p := range pair.FindAllStringSubmatch(m[2], -1) {
			if v, err := strconv.ParseFloat(p[1], 64); err == nil {
				vals[p[2]] = v
			}
		}
		if _, ok := out[m[1]]; !ok {
			names = append(names, m[1])
		}
		out[m[1]] = vals
	}
	return out, names
}

// sortNames puts the groups in a fixed order, the baseline of each group
// first, keeping the order of appearance otherwise.
func sortNames(names []string) []string {
	rank := func(n string) int {
		for i, g := range []string{"Admission/", "FastFail/", "EndToEnd/", "EndToEndPaired/", "IdleBreaker/", "Fleet/", "Hedging/"} {
			if strings.HasPrefix(n, g) {
				r := i * 2
				if base, _, _ := baseline(n); base == n {
					return r
				}
				return r + 1
			}
		}
		return 100
	}
	mode := func(n string) string { // group the modes: sequential, then parallel
		parts := strings.Split(n, "/")
		switch {
		case len(parts) == 3 && parts[0] == "Hedging": // Hedging/<protocol>/<client>
			return parts[1]
		case len(parts) == 3:
			return parts[2]
		}
		return ""
	}
	out := slices.Clone(names)
	slices.SortStableFunc(out, func(a, b string) int {
		if ra, rb := rank(a)/2, rank(b)/2; ra != rb {
			return ra - rb
		}
		if ma, mb := mode(a), mode(b); ma != mb {
			return strings.Compare(modeKey(ma), modeKey(mb))
		}
		return rank(a) - rank(b)
	})
	return out
}

func modeKey(m string) string {
	if m == "sequential" {
		return "0"
	}
	return "1" + m
}

// baseline returns the benchmark that n is compared with in its round, the
// unit of the figure compared, and whether higher is better.
func baseline(n string) (base, unit string, higherBetter bool) {
	parts := strings.Split(n, "/")
	switch parts[0] {
	case "Admission":
		if len(parts) == 3 {
			return "Admission/baseline/" + parts[2], "ns/op", false
		}
	case "FastFail":
		return "Admission/baseline/sequential", "ns/op", false
	case "EndToEndPaired": // its own baseline, measured in the same process (req/s-ratio)
		return n, "req/s-ratio", true
	case "EndToEnd":
		if len(parts) == 3 {
			return "EndToEnd/bare/" + parts[2], "req/s", true
		}
	case "IdleBreaker":
		return "IdleBreaker/gobreaker", "B/breaker", false
	case "Fleet":
		if len(parts) == 3 {
			return "Fleet/redis_rate/" + parts[2], "ns/op", false
		}
	case "Hedging":
		if len(parts) == 3 {
			return "Hedging/" + parts[1] + "/outbound", "p99-ms", false
		}
	case "HedgingSaturated":
		if len(parts) == 3 {
			return "HedgingSaturated/" + parts[1] + "/outbound", "amplification", false
		}
	}
	return "", "ns/op", false
}

type summary struct{ rounds []round }

// values returns the figure unit of benchmark n in every round that has it.
func (s *summary) values(n, unit string) []float64 {
	var v []float64
	for _, r := range s.rounds {
		if x, ok := r[n][unit]; ok {
			v = append(v, x)
		}
	}
	return v
}

// ratios returns, for every round that has both, a's figure over b's.
func (s *summary) ratios(a, b, unit string) []float64 {
	var v []float64
	for _, r := range s.rounds {
		x, ok1 := r[a][unit]
		y, ok2 := r[b][unit]
		if ok1 && ok2 && y != 0 {
			v = append(v, x/y)
		}
	}
	return v
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func spread(v []float64) string {
	if len(v) == 0 {
		return "—"
	}
	return num(slices.Min(v)) + "–" + num(slices.Max(v))
}

func num(x float64) string {
	switch {
	case math.IsNaN(x):
		return "—"
	case x == math.Trunc(x) && math.Abs(x) < 1e15:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case math.Abs(x) >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case math.Abs(x) >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

func ratio(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return strconv.FormatFloat(x, 'f', 3, 64)
}

func (s *summary) table(w io.Writer, names []string) {
	fmt.Fprintf(w, "Figures are medians over %d interleaved rounds; spread is min–max over the rounds; the ratio is the median of the per-round ratios to the baseline measured in the same round.\n\n", len(s.rounds))
	fmt.Fprintln(w, "| benchmark | figure | median | spread (min–max) | ratio vs baseline | baseline | allocs/op | B/op | client CPU ns/op (ratio) |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---|---:|---:|---:|")
	for _, n := range names {
		base, unit, _ := baseline(n)
		paired := unit == "req/s-ratio" // an EndToEndPaired row: its ratios are its own figures
		v := s.values(n, unit)
		r := "1"
		switch {
		case paired:
			r = ratio(median(v))
		case base != n:
			r = ratio(median(s.ratios(n, base, unit)))
		}
		allocs := median(s.values(n, "allocs/op"))
		bytes := median(s.values(n, "B/op"))
		switch {
		case unit == "B/breaker": // allocs/op and B/op count 100,000 breakers
			allocs /= upstreams
			bytes = median(s.values(n, "alloc-B/breaker"))
		case paired: // both clients' allocations, in one process: the EndToEnd rows have each one's
			allocs, bytes = math.NaN(), math.NaN()
		}
		cpu := "—"
		if c := s.values(n, "cpu-ns/op"); len(c) > 0 {
			cr := median(s.ratios(n, base, "cpu-ns/op"))
			if paired {
				cr = median(s.values(n, "cpu-ratio"))
			}
			cpu = num(median(c)) + " (" + ratio(cr) + ")"
		}
		baseCell := "`" + base + "`"
		switch {
		case paired && (strings.HasSuffix(n, "-endpoints") || strings.HasSuffix(n, "-by-name")):
			baseCell = "outbound by name, alternating in the same process"
		case paired:
			baseCell = "bare net/http, alternating in the same process"
		}
		fmt.Fprintf(w, "| `%s` | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			n, unit, num(median(v)), spread(v), r, baseCell, num(allocs), num(bytes), cpu)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "For `IdleBreaker` rows, allocs/op and B/op are per breaker (allocations while creating it); the figure is the live heap per breaker after a GC. For `EndToEnd` rows, allocs/op and B/op are the client process's per request, and client CPU is the user+system CPU time of the client process per request, with its ratio to the baseline's. For `EndToEndPaired` rows, the figure is outbound's requests/s over bare net/http's, the two alternating in blocks in one process, and client CPU is outbound's per request with its ratio to bare's over the same blocks; `16-callers-bare-vs-bare` pairs bare with itself, `16-callers-endpoints` outbound with Endpoints over a host of five addresses with outbound by name, and `16-callers-by-name` the latter with itself.")
	fmt.Fprintln(w)
}

const upstreams = 100_000

// targets checks the figures against the library's targets.
func (s *summary) targets(w io.Writer) {
	fmt.Fprintln(w, "## Targets")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | met |")
	fmt.Fprintln(w, "|---|---|---|")
	row := func(target, measured string, ok bool) {
		met := "**no**"
		if ok {
			met = "yes"
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", target, measured, met)
	}
	info := func(what, measured string) { fmt.Fprintf(w, "| %s | %s | (information) |\n", what, measured) }
	med := func(n, unit string) float64 { return median(s.values(n, unit)) }
	rat := func(a, b, unit string) float64 { return median(s.ratios(a, b, unit)) }

	for _, mode := range []string{"sequential", "parallel"} {
		ob := "Admission/outbound/" + mode
		a := med(ob, "allocs/op")
		row("admission ("+mode+"): 0 allocs/op", num(a)+" allocs/op", a == 0)
		r := rat(ob, "Admission/baseline/"+mode, "ns/op")
		row("admission ("+mode+"): ≤ 0.5× x/time/rate + channel", ratio(r)+"×", r <= 0.5)
		f := rat("Admission/failsafe/"+mode, ob, "ns/op")
		row("admission ("+mode+"): ≥ 5× faster than failsafe-go", num(f)+"× faster", f >= 5)
	}
	if ad := "Admission/outbound-adaptive/sequential"; len(s.values(ad, "ns/op")) > 0 {
		a := med(ad, "allocs/op")
		row("admission with the throttle and an adaptive bulkhead (sequential): 0 allocs/op", num(a)+" allocs/op", a == 0)
		r := rat(ad, "Admission/baseline/sequential", "ns/op")
		row("admission with the throttle and an adaptive bulkhead (sequential): ≤ 0.6× x/time/rate + channel",
			fmt.Sprintf("%s× (%s ns/op)", ratio(r), num(med(ad, "ns/op"))), r <= 0.6)
	}
	for _, lib := range []string{"outbound", "baseline", "gobreaker", "failsafe"} {
		sp := rat("Admission/"+lib+"/sequential", "Admission/"+lib+"/parallel", "ns/op")
		if lib == "outbound" {
			row("admission scales under RunParallel (throughput parallel ÷ sequential ≥ 1.5 on 2 cores)",
				fmt.Sprintf("%s× (%s ns/op parallel vs %s sequential)", ratio(sp),
					num(med("Admission/outbound/parallel", "ns/op")), num(med("Admission/outbound/sequential", "ns/op"))),
				sp >= 1.5)
			continue
		}
		info("for comparison: "+lib+" throughput parallel ÷ sequential", ratio(sp)+"×")
	}
	a := med("FastFail/outbound", "allocs/op")
	row("fast fail while OPEN: 0 allocs/op", fmt.Sprintf("%s allocs/op, %s ns/op", num(a), num(med("FastFail/outbound", "ns/op"))), a == 0)
	for _, mode := range []string{"16-callers", "16-callers-default-idle", "sequential"} {
		ob, bare := "EndToEnd/outbound/"+mode, "EndToEnd/bare/"+mode
		if len(s.values(ob, "req/s")) == 0 {
			continue
		}
		r := rat(ob, bare, "req/s")
		cpu := median(s.ratios(ob, bare, "cpu-ns/op"))
		da := med(ob, "allocs/op") - med(bare, "allocs/op")
		db := med(ob, "B/op") - med(bare, "B/op")
		measured := fmt.Sprintf("%s× (%+.0f allocs, %+.0f B, %s× client CPU per request)", ratio(r), da, db, ratio(cpu))
		paired := "EndToEndPaired/" + mode
		switch {
		case mode == "sequential":
			info("end to end (sequential): requests/s vs bare net/http", measured)
			continue
		case len(s.values(paired, "req/s-ratio")) > 0:
			// The targets are checked on the paired runs, where both
			// clients share the process and alternate every block.
			info("end to end ("+mode+"), each client in its own process: requests/s vs bare net/http", measured)
			r, cpu = med(paired, "req/s-ratio"), med(paired, "cpu-ratio")
			measured = fmt.Sprintf("%s× (paired in one process; %s× client CPU per request)", ratio(r), ratio(cpu))
		}
		row("end to end ("+mode+"): ≥ 0.98× bare net/http requests/s", measured, r >= 0.98)
		row("end to end ("+mode+"): client CPU per request ≤ 1.02× bare net/http's", ratio(cpu)+"×", cpu <= 1.02)
	}
	if aa := "EndToEndPaired/16-callers-bare-vs-bare"; len(s.values(aa, "req/s-ratio")) > 0 {
		v := s.values(aa, "req/s-ratio")
		info("the paired runs' own error: bare net/http against itself (requests/s, client CPU)",
			fmt.Sprintf("%s× [%s–%s], %s×", ratio(median(v)), ratio(slices.Min(v)), ratio(slices.Max(v)), ratio(med(aa, "cpu-ratio"))))
	}
	if ep := "EndToEndPaired/16-callers-endpoints"; len(s.values(ep, "req/s-ratio")) > 0 {
		// One host of five healthy addresses: Endpoints against by name.
		r, cpu := med(ep, "req/s-ratio"), med(ep, "cpu-ratio")
		row("a host of five healthy addresses (16-callers, paired): requests/s with Endpoints ≥ 0.98× by name", ratio(r)+"×", r >= 0.98)
		row("a host of five healthy addresses (16-callers, paired): client CPU per request with Endpoints ≤ 1.02× by name", ratio(cpu)+"×", cpu <= 1.02)
		if aa := "EndToEndPaired/16-callers-by-name"; len(s.values(aa, "req/s-ratio")) > 0 {
			info("the same pairing's own error: by name against itself (requests/s, client CPU)",
				fmt.Sprintf("%s×, %s×", ratio(med(aa, "req/s-ratio")), ratio(med(aa, "cpu-ratio"))))
		}
	}
	if len(s.values("Fleet/outbound/sequential", "ns/op")) > 0 {
		for _, mode := range []string{"sequential", "16-goroutines"} {
			r := rat("Fleet/outbound/"+mode, "Fleet/redis_rate/"+mode, "ns/op")
			row("fleet rate limit without leasing ("+mode+"): latency ≤ 1.0× go-redis/redis_rate's, with refunds",
				fmt.Sprintf("%s× (%s µs vs %s µs)", ratio(r), num(med("Fleet/outbound/"+mode, "ns/op")/1000),
					num(med("Fleet/redis_rate/"+mode, "ns/op")/1000)), r <= 1.0)
		}
		t := rat("Fleet/redis_rate/16-goroutines", "Fleet/outbound-leased/16-goroutines", "ns/op")
		row("fleet rate limit with leasing (16 goroutines): throughput ≥ 10× go-redis/redis_rate's", num(t)+"×", t >= 10)
		rt := med("Fleet/outbound-leased/16-goroutines", "round-trips/op")
		row("fleet rate limit with leasing (16 goroutines): ≤ 0.1 Redis round trips per admission", fmt.Sprintf("%.4f", rt), rt <= 0.1)
	}
	for _, proto := range []string{"http1", "h2c"} {
		if len(s.values("Hedging/"+proto+"/outbound", "p99-ms")) == 0 {
			continue
		}
		hedged, fs := "Hedging/"+proto+"/outbound-hedged", "Hedging/"+proto+"/failsafe-hedged"
		r := rat(hedged, "Hedging/"+proto+"/outbound", "p99-ms")
		row("hedging ("+proto+", 2% slow tail): p99 with adaptive hedging ≤ 0.5× without", fmt.Sprintf("%s× (%s ms vs %s ms)",
			ratio(r), num(med(hedged, "p99-ms")), num(med("Hedging/"+proto+"/outbound", "p99-ms"))), r <= 0.5)
		x := med(hedged, "hedges-%")
		// At most: a hedge waits for evidence that its attempt is slow on
		// its own, so that fewer than the target may be sent.
		row("hedging ("+proto+"): extra load at most 1 point above its 5% target", fmt.Sprintf("%.2f%% hedges sent (%.2f%% more requests received)",
			x, med(hedged, "extra-received-%")), x <= 6)
		// Against failsafe-go, at equal or lower extra load: the outbound
		// run with the highest ExtraLoad whose hedges do not exceed
		// failsafe-go's (outbound-hedged-7, at 7 %, when it has one).
		fx := med(fs, "hedges-%")
		cmpd, cx := hedged, x
		if h7 := hedged + "-7"; len(s.values(h7, "p99-ms")) > 0 && med(h7, "hedges-%") <= fx {
			cmpd, cx = h7, med(h7, "hedges-%")
		}
		label := strings.TrimPrefix(cmpd, "Hedging/"+proto+"/")
		fr := rat(cmpd, fs, "p99-ms")
		row("hedging ("+proto+"): p99 ≤ failsafe-go's hedge policy's at equal or lower extra load", fmt.Sprintf("%s× (%s %s ms at %.2f%% hedges vs %s ms at %.2f%%)",
			ratio(fr), label, num(med(cmpd, "p99-ms")), cx, num(med(fs, "p99-ms")), fx), fr <= 1 && cx <= fx)
		if len(s.values(cmpd, "p99.9-ms")) > 0 {
			fr := rat(cmpd, fs, "p99.9-ms")
			row("hedging ("+proto+"): p99.9 ≤ failsafe-go's hedge policy's at equal or lower extra load", fmt.Sprintf("%s× (%s %s ms at %.2f%% hedges vs %s ms at %.2f%%)",
				ratio(fr), label, num(med(cmpd, "p99.9-ms")), cx, num(med(fs, "p99.9-ms")), fx), fr <= 1 && cx <= fx)
		}
		if len(s.values(hedged, "withheld-%")) > 0 {
			row("hedging ("+proto+"): hedges withheld by the allowance or the budget", fmt.Sprintf("%.2f%% of the calls", med(hedged, "withheld-%")), true)
		}
	}
	for _, proto := range []string{"http1", "h2c"} {
		hedged, fs := "HedgingSaturated/"+proto+"/outbound-hedged", "HedgingSaturated/"+proto+"/failsafe-hedged"
		if len(s.values(hedged, "amplification")) == 0 {
			continue
		}
		a := med(hedged, "amplification")
		row("hedging ("+proto+", upstream at its capacity): requests received per call ≤ 1.1", fmt.Sprintf("%.3f (p99 %s ms; without hedging %.3f, p99 %s ms)",
			a, num(med(hedged, "p99-ms")), med("HedgingSaturated/"+proto+"/outbound", "amplification"), num(med("HedgingSaturated/"+proto+"/outbound", "p99-ms"))), a <= 1.1)
		info("for comparison ("+proto+", upstream at its capacity): failsafe-go's hedge policy, requests received per call", fmt.Sprintf("%.3f (p99 %s ms)",
			med(fs, "amplification"), num(med(fs, "p99-ms"))))
	}
	m := med("IdleBreaker/outbound", "B/breaker")
	g := med("IdleBreaker/gobreaker", "B/breaker")
	row("idle breaker (count window 100): ≤ 244 B (half of the 488 B given for gobreaker)", num(m)+" B", m <= 244)
	row("idle breaker: ≤ 0.5× gobreaker v2 measured here", fmt.Sprintf("%s× (%s B vs %s B)", ratio(rat("IdleBreaker/outbound", "IdleBreaker/gobreaker", "B/breaker")), num(m), num(g)), m <= g/2)
	fmt.Fprintln(w)
}
