package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
)

// The synthetic report of these tests has four scenarios: a recovery (CLOSED → OPEN → HALF_OPEN → CLOSED, about fifty attempts of
// every category, retries among them), a failed one whose title carries
// markup, with a hedge, one with no attempts at all, and an overload whose
// attempts were counted, not kept, with a series sampled by criticality.
const (
	synthRecoveryName = "recovery-under-backpressure"
	synthFailedName   = "h2-goaway-midstream"
	synthIdleName     = "idle-upstream"
	synthOverloadName = "overload-mixed-criticality"
	synthEvilTitle    = `Retries after <script>alert("drill")</script> a GOAWAY & friends`
)

func synthReport() *Report {
	return &Report{
		Version:   "v0.0.0-test",
		GoVersion: runtime.Version(),
		Started:   time.Date(2026, 3, 14, 9, 26, 53, 0, time.UTC),
		Millis:    2817.4,
		Passed:    false,
		Scenarios: []ScenarioResult{synthRecovery(), synthFailed(), synthIdle(), synthOverload()},
	}
}

// withCommits gives each call's last attempt the call's commit status, as
// the drill records it: committed if it was answered, unknown if it was
// ambiguous, not committed otherwise.
func withCommits(events []Mark) []Mark {
	last := map[int]int{}
	for i, e := range events {
		last[e.Call] = i
	}
	for _, i := range last {
		switch e := &events[i]; e.Category {
		case "Answered":
			e.Commit = "committed"
		case "Ambiguous":
			e.Commit = "unknown"
		default:
			e.Commit = "not committed"
		}
	}
	return events
}

// synthOverload mimics overload-mixed-criticality: 3 s of calls counted
// but not kept one by one, a series of 120 samples whose limit comes down
// from 20 to 8, and critical calls answered while sheddable ones are
// refused.
func synthOverload() ScenarioResult {
	s := ScenarioResult{
		Name: synthOverloadName, Title: "16 callers against an upstream that serves 8 at a time", Protocol: "HTTP1",
		Expect: "The critical calls are answered; the sheddable ones absorb the refusals.", Passed: true, Millis: 3010,
		Checks:   []Check{{What: "critical calls answered", Want: ">= 90%", Got: "99.1%", Passed: true}},
		Attempts: map[string]int{"Answered": 2400, "LocalRejection": 1800}, Commits: map[string]int{"committed": 2400, "not committed": 1800},
		Rejections: map[string]int{"bulkhead": 1800}, Calls: 4200, Executions: 2400,
		Config: map[string]string{"MaxAttempts": "1: no retries", "Bulkhead": "adaptive, MaxConcurrent 64", "Breaker": "defaults", "Zeta": "<b>escaped</b>"},
	}
	for i := range 120 {
		at := float64(i+1) * 25
		limit := max(20-i/5, 8)
		s.Series = append(s.Series, Sample{AtMs: at, Millis: 25, Limit: limit, InFlight: min(limit, 6+i%4),
			Answered: 20, Rejected: 15, P50Ms: 20 + float64(limit), P99Ms: 40 + 2*float64(limit),
			ByLevel: map[string]LevelCounts{"critical": {Answered: 6}, "sheddable": {Answered: 14, Rejected: 15}}})
	}
	return s
}

// synthRecovery mimics the recovery under back-pressure: the upstream fails, the breaker opens and
// rejects calls locally, then lets trial calls through in HALF_OPEN while the
// rate limiter pushes back, and closes again once the trials succeed.
func synthRecovery() ScenarioResult {
	s := ScenarioResult{
		Name:     synthRecoveryName,
		Title:    "The breaker recovers while the local guards push back",
		Protocol: "H2C",
		Expect:   "Open on the burst of 503s, fail fast while OPEN, give back the circuit permit of every locally rejected trial so HALF_OPEN can close again.",
		Passed:   true,
		Millis:   1300,
		Checks: []Check{
			{What: "breaker opened", Want: "CLOSED→OPEN", Got: "CLOSED→OPEN at 180 ms", Passed: true},
			{What: "breaker closed again", Want: "HALF_OPEN→CLOSED", Got: "at 1010 ms", Passed: true},
			{What: "executions ≤ attempts sent", Want: "≤ 38", Got: "35", Passed: true},
		},
		Transitions: []Transition{
			{AtMs: 180, From: "CLOSED", To: "OPEN", Reason: "failure rate 60% ≥ 50%"},
			{AtMs: 680, From: "OPEN", To: "HALF_OPEN", Reason: "wait in OPEN elapsed"},
			{AtMs: 1010, From: "HALF_OPEN", To: "CLOSED", Reason: "trial calls succeeded"},
		},
		Retries: 14,
	}
	add := func(call int, at, ms float64, cat string, status int, guard string, failure bool) {
		s.Events = append(s.Events, Mark{AtMs: at, Millis: ms, Call: call, Category: cat, Status: status, Guard: guard, Failure: failure})
	}
	call := 0
	// CLOSED: healthy, then a burst of 503s with one retry each.
	for i := 0; i < 10; i++ {
		call++
		at := 8 + float64(i)*16
		switch {
		case i < 4:
			add(call, at, 9, "Answered", 200, "", false)
		case i == 6:
			add(call, at, 40, "Ambiguous", 0, "", true)
		default:
			add(call, at, 6, "Answered", 503, "", true)
			add(call, at+14, 6, "Answered", 503, "", true)
		}
	}
	// OPEN: calls fail fast; a few are not sent (the connection was gone).
	for i := 0; i < 12; i++ {
		call++
		at := 200 + float64(i)*40
		if i%4 == 3 {
			add(call, at, 3, "NotSent", 0, "", false)
		}
		add(call, at+4, 0.1, "LocalRejection", 0, "circuit", false)
	}
	// HALF_OPEN: the rate limiter rejects some trials before one gets through.
	for i := 0; i < 8; i++ {
		call++
		at := 690 + float64(i)*38
		if i%2 == 0 {
			add(call, at, 0.2, "LocalRejection", 0, "rate", false)
			at += 12
		}
		add(call, at, 11, "Answered", 200, "", false)
	}
	// CLOSED again.
	for i := 0; i < 6; i++ {
		call++
		add(call, 1030+float64(i)*40, 8, "Answered", 200, "", false)
	}
	s.Events = withCommits(s.Events) // no attempt numbers: a report of before they were recorded
	s.Config = map[string]string{"MaxAttempts": "1: no retries", "Breaker": "WindowSize 4, MinimumCalls 4, WaitInOpen 300ms",
		"Rate": "PerSecond 10, Burst 4", "Bulkhead": "fixed, MaxConcurrent 1"}
	s.Calls = call
	s.Executions = 35
	s.Attempts = map[string]int{}
	s.Commits = map[string]int{"committed": 24, "not committed": 11, "unknown": 1}
	s.Rejections = map[string]int{"circuit": 12, "rate": 4, "bulkhead": 0}
	for _, e := range s.Events {
		s.Attempts[e.Category]++
	}
	return s
}

func synthFailed() ScenarioResult {
	s := ScenarioResult{
		Name:     synthFailedName,
		Title:    synthEvilTitle,
		Protocol: "H2TLS",
		Expect:   "Retry the requests the server never processed (stream id above the GOAWAY's last stream id), and only those.",
		Passed:   false,
		Millis:   420.5,
		Checks: []Check{
			{What: "unprocessed streams retried", Want: "4", Got: "4", Passed: true},
			{What: "processed streams not retried", Want: "0 retries", Got: "2 retries <b>twice</b>", Passed: false},
		},
		Calls: 8, Executions: 10, Retries: 6,
		Attempts:   map[string]int{"Answered": 8, "NotSent": 4, "Ambiguous": 2},
		Commits:    map[string]int{"committed": 6, "not committed": 0, "unknown": 2},
		Rejections: map[string]int{},
	}
	for call := 1; call <= 8; call++ {
		at := float64(call) * 30
		switch {
		case call == 7: // a POST, not re-sent: its commit status is unknown
			s.Events = append(s.Events, Mark{AtMs: at, Millis: 25, Call: call, Category: "Ambiguous", Failure: true})
		case call%4 == 0:
			s.Events = append(s.Events, Mark{AtMs: at, Millis: 25, Call: call, Category: "Ambiguous", Failure: true},
				Mark{AtMs: at + 40, Millis: 12, Call: call, Category: "Answered", Status: 200})
		case call%4 == 1:
			s.Events = append(s.Events, Mark{AtMs: at, Millis: 2, Call: call, Category: "NotSent"},
				Mark{AtMs: at + 5, Millis: 10, Call: call, Category: "Answered", Status: 200})
		case call%4 == 2: // hedged: the hedge answered first
			s.Events = append(s.Events, Mark{AtMs: at, Millis: 14, Call: call, Category: "Ambiguous", Attempt: 1, Lost: true},
				Mark{AtMs: at + 6, Millis: 8, Call: call, Category: "Answered", Status: 200, Attempt: 2, Hedge: true})
		default:
			s.Events = append(s.Events, Mark{AtMs: at, Millis: 14, Call: call, Category: "Answered", Status: 200})
		}
	}
	s.Events = withCommits(s.Events)
	s.Config = map[string]string{"MaxAttempts": "3 (the default)", "Hedging": "on, Delay 5ms"}
	return s
}

func synthIdle() ScenarioResult {
	return ScenarioResult{
		Name:     synthIdleName,
		Title:    "No traffic: nothing to draw",
		Protocol: "HTTP1",
		Expect:   "Do nothing.",
		Passed:   true,
		Checks:   []Check{{What: "no attempts", Want: "0", Got: "0", Passed: true}},
	}
}

// synthBusy has n attempts of every kind, spread at random over 10 s.
func synthBusy(name string, n int) ScenarioResult {
	rng := rand.New(rand.NewPCG(1, 2))
	s := ScenarioResult{Name: name, Title: "busy", Protocol: "HTTP1", Passed: true, Millis: 10000, Calls: n}
	for i := 0; i < n; i++ {
		e := Mark{AtMs: rng.Float64() * 9990, Millis: rng.Float64() * 8, Call: i + 1}
		switch i % 5 {
		case 0:
			e.Category, e.Status = "Answered", 200
		case 1:
			e.Category, e.Status, e.Failure = "Answered", 503, true
		case 2:
			e.Category = "NotSent"
		case 3:
			e.Category, e.Failure = "Ambiguous", true
		case 4:
			e.Category, e.Guard = "LocalRejection", "rate"
		}
		s.Events = append(s.Events, e)
	}
	s.Transitions = []Transition{{AtMs: 3000, From: "CLOSED", To: "OPEN"}, {AtMs: 6000, From: "OPEN", To: "HALF_OPEN"}}
	return s
}

func renderHTML(t *testing.T, r *Report) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteHTML(&buf, r); err != nil {
		t.Fatalf("WriteHTML: %v", err)
	}
	return buf.Bytes()
}

func parseHTML(t *testing.T, page []byte) *html.Node {
	t.Helper()
	doc, err := html.Parse(bytes.NewReader(page))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return doc
}

// find returns the elements under n, in document order, for which match
// holds.
func domFind(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	for c := range n.Descendants() {
		if c.Type == html.ElementNode && match(c) {
			out = append(out, c)
		}
	}
	return out
}

func domTag(name string) func(*html.Node) bool {
	return func(n *html.Node) bool { return n.Data == name }
}

func domAttr(n *html.Node, key string) (string, bool) {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val, true
		}
	}
	return "", false
}

func domHasClass(n *html.Node, class string) bool {
	v, _ := domAttr(n, "class")
	for _, c := range strings.Fields(v) {
		if c == class {
			return true
		}
	}
	return false
}

func domText(n *html.Node) string {
	var b strings.Builder
	for c := range n.Descendants() {
		if c.Type == html.TextNode {
			b.WriteString(c.Data)
		}
	}
	return b.String()
}

func domSections(doc *html.Node) []*html.Node {
	return domFind(doc, func(n *html.Node) bool { return n.Data == "section" && domHasClass(n, "scenario") })
}

// domMarks returns what an SVG draws for the attempts: marks, or the bars
// of a histogram.
func domMarks(svg *html.Node) []*html.Node {
	var out []*html.Node
	for _, g := range domFind(svg, func(n *html.Node) bool { return n.Data == "g" && domHasClass(n, "marks") }) {
		out = append(out, domFind(g, domTag("rect"))...)
	}
	return out
}

func TestWriteHTMLIsOneSelfContainedPageWithASVGPerScenario(t *testing.T) {
	r := synthReport()
	page := renderHTML(t, r)
	t.Logf("test report: %d bytes of HTML", len(page))
	doc := parseHTML(t, page)

	secs := domSections(doc)
	if len(secs) != len(r.Scenarios) {
		t.Fatalf("%d scenario sections, want %d", len(secs), len(r.Scenarios))
	}
	for i, sec := range secs {
		if id, _ := domAttr(sec, "id"); id != r.Scenarios[i].Name {
			t.Errorf("section %d has id %q, want the scenario name %q", i, id, r.Scenarios[i].Name)
		}
		svgs := domFind(sec, func(n *html.Node) bool { return n.Data == "svg" && domHasClass(n, "timeline") })
		if len(svgs) != 1 {
			t.Fatalf("section %s has %d timelines, want 1", r.Scenarios[i].Name, len(svgs))
		}
		charts := domFind(sec, func(n *html.Node) bool { return n.Data == "svg" && domHasClass(n, "chart") })
		if want := min(len(r.Scenarios[i].Series), 1); len(charts) != want {
			t.Errorf("section %s has %d charts, want %d", r.Scenarios[i].Name, len(charts), want)
		}
		band := domFind(svgs[0], func(n *html.Node) bool { return n.Data == "g" && domHasClass(n, "band") })
		if len(band) != 1 || len(domFind(band[0], domTag("rect"))) == 0 {
			t.Errorf("section %s: no breaker band", r.Scenarios[i].Name)
		}
		if got, want := len(domMarks(svgs[0])), len(r.Scenarios[i].Events); got != want {
			t.Errorf("section %s: %d marks, want one per attempt (%d)", r.Scenarios[i].Name, got, want)
		}
		for _, m := range domMarks(svgs[0]) {
			if len(domFind(m, domTag("title"))) != 1 {
				t.Fatalf("section %s: a mark without a <title> tooltip", r.Scenarios[i].Name)
			}
		}
	}
	if n := len(domFind(doc, domTag("svg"))); n != len(r.Scenarios)+1 {
		t.Errorf("%d <svg> in the page, want a timeline per scenario and the overload's chart, %d", n, len(r.Scenarios)+1)
	}
	// The HTML parser forgives unbalanced tags; XML does not. Each SVG is
	// well-formed on its own, so it could also be cut out of the page.
	svgRE := regexp.MustCompile(`(?s)<svg .*?</svg>`)
	for i, svg := range svgRE.FindAll(page, -1) {
		d := xml.NewDecoder(bytes.NewReader(svg))
		for {
			_, err := d.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("SVG %d is not well-formed XML: %v", i, err)
			}
		}
	}

	// Self-contained: nothing is loaded from anywhere, links only point
	// inside the page, and there is exactly one (inline) script.
	for _, n := range domFind(doc, func(*html.Node) bool { return true }) {
		if _, ok := domAttr(n, "src"); ok {
			t.Errorf("<%s> has a src attribute", n.Data)
		}
		if h, ok := domAttr(n, "href"); ok && !strings.HasPrefix(h, "#") {
			t.Errorf("<%s> links outside the page: %q", n.Data, h)
		}
		if n.Data == "link" || n.Data == "iframe" || n.Data == "img" {
			t.Errorf("external-resource element <%s>", n.Data)
		}
	}
	if n := len(domFind(doc, domTag("script"))); n != 1 {
		t.Errorf("%d <script> elements, want 1", n)
	}
	if n := len(domFind(doc, func(n *html.Node) bool { v, _ := domAttr(n, "id"); return v == "render-check" })); n != 1 {
		t.Errorf("%d render-check elements, want 1", n)
	}
}

func TestWriteHTMLShowsTheVerdicts(t *testing.T) {
	r := synthReport()
	doc := parseHTML(t, renderHTML(t, r))

	h1 := domFind(doc, domTag("h1"))
	if len(h1) != 1 {
		t.Fatalf("%d <h1>, want 1", len(h1))
	}
	if !strings.Contains(domText(h1[0]), "FAILED") {
		t.Fatalf("header does not say FAILED: %q", domText(h1[0]))
	}
	meta := domFind(doc, func(n *html.Node) bool { return n.Data == "p" && domHasClass(n, "meta") })
	if len(meta) == 0 || !strings.Contains(domText(meta[0]), "3 scenarios passed, 1 failed") {
		t.Errorf("header does not count the scenarios: %q", domText(meta[0]))
	}
	for _, want := range []string{r.Version, r.GoVersion, "2026-03-14 09:26:53 UTC", "2.82 s"} {
		if !strings.Contains(domText(meta[0]), want) {
			t.Errorf("header lacks %q: %q", want, domText(meta[0]))
		}
	}

	rows := domFind(domFind(doc, func(n *html.Node) bool { return n.Data == "table" && domHasClass(n, "summary") })[0], domTag("tr"))
	if len(rows) != 1+len(r.Scenarios) {
		t.Fatalf("summary has %d rows, want a header and %d", len(rows), len(r.Scenarios))
	}
	for i, want := range []string{"PASSED", "FAILED", "PASSED", "PASSED"} {
		row := domText(rows[i+1])
		if !strings.Contains(row, r.Scenarios[i].Name) || !strings.Contains(row, want) {
			t.Errorf("summary row %d = %q, want %s and %s", i, row, r.Scenarios[i].Name, want)
		}
	}
	if row := domText(rows[1]); !strings.Contains(row, "24 / 11 / 1") || !strings.Contains(row, "circuit 12, rate 4, bulkhead 0") {
		t.Errorf("summary row of %s lacks commits or rejections: %q", synthRecoveryName, row)
	}

	// The failed check is marked as such in the failed scenario's section.
	failed := domSections(doc)[1]
	var fails int
	for _, tr := range domFind(failed, domTag("tr")) {
		if domHasClass(tr, "failed") {
			fails++
			if !strings.Contains(domText(tr), "processed streams not retried") {
				t.Errorf("wrong check marked failed: %q", domText(tr))
			}
		}
	}
	if fails != 1 {
		t.Errorf("%d failed checks shown, want 1", fails)
	}

	r.Passed = true
	if h1 := domFind(parseHTML(t, renderHTML(t, r)), domTag("h1")); !strings.Contains(domText(h1[0]), "PASSED") {
		t.Errorf("header of a passing report: %q", domText(h1[0]))
	}
}

func TestWriteHTMLEscapesReportText(t *testing.T) {
	page := renderHTML(t, synthReport())
	if bytes.Contains(page, []byte("<script>alert")) || bytes.Contains(page, []byte("<b>twice")) {
		t.Fatal("markup from the report reached the page unescaped")
	}
	doc := parseHTML(t, page)
	for _, s := range domFind(doc, domTag("script")) {
		if strings.Contains(domText(s), "alert") {
			t.Fatal("the scenario title became a script")
		}
	}
	// The title is still shown, as text.
	if sec := domSections(doc)[1]; !strings.Contains(domText(sec), synthEvilTitle) {
		t.Errorf("the title %q is not shown as text", synthEvilTitle)
	}
}

func TestBreakerBandFollowsTheTransitions(t *testing.T) {
	s := synthRecovery()
	got := stateSpans(s.Transitions, scenarioEnd(&s))
	want := []stateSpan{
		{0, 180, "CLOSED", "initial state"},
		{180, 680, "OPEN", "failure rate 60% ≥ 50%"},
		{680, 1010, "HALF_OPEN", "wait in OPEN elapsed"},
		{1010, 1300, "CLOSED", "trial calls succeeded"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("spans\n got %v\nwant %v", got, want)
	}

	// In the page: the same four segments, coloured and named.
	band := domFind(domFind(domSections(parseHTML(t, renderHTML(t, synthReport())))[0], domTag("svg"))[0],
		func(n *html.Node) bool { return n.Data == "g" && domHasClass(n, "band") })[0]
	var classes []string
	for _, r := range domFind(band, domTag("rect")) {
		c, _ := domAttr(r, "class")
		classes = append(classes, c)
	}
	if fmt.Sprint(classes) != "[s-closed s-open s-half s-closed]" {
		t.Errorf("band segments %v", classes)
	}
	for _, name := range []string{"CLOSED", "OPEN", "HALF_OPEN"} {
		if !strings.Contains(domText(band), name) {
			t.Errorf("band does not name %s", name)
		}
	}

	// No transitions: one CLOSED segment over the whole scenario; the end is
	// the last attempt's end when that is after the duration.
	s = ScenarioResult{Millis: 100, Events: []Mark{{AtMs: 90, Millis: 30}}}
	if got := stateSpans(nil, scenarioEnd(&s)); fmt.Sprint(got) != "[{0 120 CLOSED initial state}]" {
		t.Errorf("no transitions: %v", got)
	}
}

func TestTimelineStaysReadableFromZeroToThousandsOfAttempts(t *testing.T) {
	one := ScenarioResult{Name: "one", Passed: true, Millis: 50, Calls: 1,
		Events: []Mark{{AtMs: 10, Millis: 0.01, Call: 1, Category: "Answered", Status: 200}}}
	many := synthBusy("many", maxMarks)
	for i := range many.Events {
		many.Events[i].Call = i/10 + 1 // calls of 10 attempts
	}
	many.Calls = maxMarks / 10
	busy := synthBusy("busy", 10000)
	r := &Report{Scenarios: []ScenarioResult{synthIdle(), one, many, busy}}
	page := renderHTML(t, r)
	t.Logf("0, 1, %d and 10000 attempts: %d bytes of HTML", maxMarks, len(page))
	doc := parseHTML(t, page)
	secs := domSections(doc)

	idle := domFind(secs[0], domTag("svg"))[0]
	if len(domMarks(idle)) != 0 || !strings.Contains(domText(idle), "no attempts recorded") {
		t.Errorf("empty scenario: %d marks, text %q", len(domMarks(idle)), domText(idle))
	}
	if ticks := domFind(idle, func(n *html.Node) bool { return n.Data == "g" && domHasClass(n, "tk") }); len(domFind(ticks[0], domTag("text"))) < 2 {
		t.Error("empty scenario: no time axis")
	}

	m := domMarks(domFind(secs[1], domTag("svg"))[0])
	if len(m) != 1 {
		t.Fatalf("one attempt: %d marks", len(m))
	}
	if w, _ := domAttr(m[0], "width"); w != "2" {
		t.Errorf("a 0.01 ms attempt is %s units wide, want the minimum 2", w)
	}

	// Up to maxMarks, one mark per attempt, on at most maxRows lanes.
	svg := domFind(secs[2], domTag("svg"))[0]
	if n := len(domMarks(svg)); n != maxMarks {
		t.Errorf("%d attempts drawn as %d marks", maxMarks, n)
	}
	if caption := domText(domFind(secs[2], domTag("figcaption"))[0]); !strings.Contains(caption, fmt.Sprintf("%d calls packed into %d lanes", maxMarks/10, maxRows)) {
		t.Errorf("caption: %q", caption)
	}

	// Beyond, a histogram of a bounded number of bars.
	svg = domFind(secs[3], domTag("svg"))[0]
	if n := len(domMarks(svg)); n == 0 || n > histBuckets*len(markKinds) {
		t.Errorf("10000 attempts drawn as %d marks, want 1..%d", n, histBuckets*len(markKinds))
	}
	caption := domText(domFind(secs[3], domTag("figcaption"))[0])
	if !strings.Contains(caption, "10000 attempts") || !strings.Contains(caption, "each column counts the attempts") {
		t.Errorf("caption does not say how the attempts are drawn: %q", caption)
	}
	// The histogram leaves no attempt out: its bars add up to all of them.
	var counted int
	for _, bar := range domMarks(svg) {
		var n int
		if _, err := fmt.Sscan(domText(bar), &n); err != nil {
			t.Fatalf("bar title %q: %v", domText(bar), err)
		}
		counted += n
	}
	if counted != 10000 {
		t.Errorf("histogram counts %d attempts, want 10000", counted)
	}
	if len(page) > 400<<10 {
		t.Errorf("page is %d KB, want at most 400", len(page)>>10)
	}
}

// A report of the expected shape, ten scenarios of a few hundred attempts,
// stays a few hundred KB.
func TestPageSizeOfATypicalReport(t *testing.T) {
	r := synthReport()
	r.Scenarios = nil
	for i := 0; i < 10; i++ {
		r.Scenarios = append(r.Scenarios, synthBusy(fmt.Sprintf("scenario-%02d", i), 300))
	}
	page := renderHTML(t, r)
	t.Logf("10 scenarios × 300 attempts: %d KB of HTML", len(page)>>10)
	if len(page) > 500<<10 {
		t.Errorf("page is %d KB, want at most 500", len(page)>>10)
	}
}

func TestNiceTicks(t *testing.T) {
	for _, c := range []struct {
		end  float64
		want string
	}{
		{1300, "[0 ms 200 ms 400 ms 600 ms 800 ms 1000 ms 1200 ms]"},
		{420.5, "[0 ms 100 ms 200 ms 300 ms 400 ms]"},
		{10000, "[0 s 2 s 4 s 6 s 8 s 10 s]"},
		{1, "[0.0 ms 0.2 ms 0.4 ms 0.6 ms 0.8 ms 1.0 ms]"},
		{2817.4, "[0.0 s 0.5 s 1.0 s 1.5 s 2.0 s 2.5 s]"},
	} {
		var labels []string
		for _, tk := range niceTicks(c.end, 6) {
			labels = append(labels, tk.label)
		}
		if got := "[" + strings.Join(labels, " ") + "]"; got != c.want {
			t.Errorf("niceTicks(%v) = %s, want %s", c.end, got, c.want)
		}
	}
}

func TestWriteHTMLNilReport(t *testing.T) {
	if err := WriteHTML(&bytes.Buffer{}, nil); err == nil {
		t.Fatal("no error for a nil report")
	}
}

// TestHTMLReportRendersInChromium opens the page in headless Chromium and
// reads back what the page's own script found: every scenario section has a
// laid-out SVG with its breaker band, and no band segment too thin to see;
// the overload's charts have their lines drawn through their points, with
// a legend; each call of a lane of its own has its commit status drawn;
// the retries' notches and the hedges' hatching are drawn, and named in
// the legend; the configuration is laid out; and the render check itself
// is neither seen nor laid out. It also takes a screenshot.
//
// With OUTBOUND_SCREENSHOT=<file.png> it also writes a screenshot of the
// recovery-under-backpressure scenario there (docs/drill-recovery.png is
// made this way). The
// scenario comes from the synthetic report, or from the JSON report named by
// OUTBOUND_SCREENSHOT_REPORT (the output of a real drill run): its scenario
// named recovery-under-backpressure, or else its first.
func TestHTMLReportRendersInChromium(t *testing.T) {
	browser := findChromium()
	if browser == "" {
		if os.Getenv("OUTBOUND_REQUIRE_CHROMIUM") != "" {
			t.Fatal("no Chromium on PATH, and OUTBOUND_REQUIRE_CHROMIUM is set (scripts/test sets it where it can install the Debian package chromium)")
		}
		t.Skip("no Chromium on PATH: install the Debian package chromium (apt-get install -y chromium) to run this test")
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, renderHTML(t, synthReport()), 0o644); err != nil {
		t.Fatal(err)
	}

	dom := runChromium(t, browser, "--virtual-time-budget=5000", "--dump-dom", fileURL(page))
	check := domFind(parseHTML(t, dom), func(n *html.Node) bool { v, _ := domAttr(n, "id"); return v == "render-check" })
	if len(check) != 1 {
		t.Fatalf("no render-check element in the DOM Chromium dumped:\n%.2000s", dom)
	}
	scenarios, _ := domAttr(check[0], "data-scenarios")
	svgs, _ := domAttr(check[0], "data-svgs")
	if scenarios != "4" || svgs != "4" {
		t.Fatalf("render check: data-scenarios=%q data-svgs=%q, want 4 and 4", scenarios, svgs)
	}
	if _, hidden := domAttr(check[0], "hidden"); !hidden || domText(check[0]) != "" {
		t.Errorf("the render check is not hidden, or has text: %q", domText(check[0]))
	}
	if h, _ := domAttr(check[0], "data-height"); h != "0" {
		t.Errorf("the render check is laid out %q tall, want 0: hidden", h)
	}
	if text := visibleText(parseHTML(t, dom)); strings.Contains(strings.ToLower(text), "render check") {
		t.Errorf("the page Chromium drew says the render check: %.300q", text)
	}
	checkDrawn(t, check[0])

	shot := filepath.Join(dir, "shot.png")
	screenshot(t, browser, page, shot, "1280,1600")
	if fi, err := os.Stat(shot); err != nil || fi.Size() <= 10<<10 {
		t.Fatalf("screenshot %s: %v, want more than 10 KB", shot, statSize(fi, err))
	}

	if out := os.Getenv("OUTBOUND_SCREENSHOT"); out != "" {
		writeRecoveryScreenshot(t, browser, out)
	}
}

// drawnSection is what the page's script found laid out in a scenario's
// section.
type drawnSection struct {
	ID    string `json:"id"`
	Lines []struct {
		Class  string  `json:"cls"`
		Points int     `json:"points"`
		Length float64 `json:"length"`
		Drawn  bool    `json:"drawn"`
	} `json:"lines"`
	ThinBand int      `json:"thinBand"`
	Legend   []string `json:"legend"`
	Commits  int      `json:"commits"`
	Retries  int      `json:"retries"`
	Hedges   int      `json:"hedges"`
	Config   int      `json:"config"`
}

// checkDrawn checks what the page's script found laid out, per section,
// against the synthetic report.
func checkDrawn(t *testing.T, check *html.Node) {
	t.Helper()
	data, _ := domAttr(check, "data-sections")
	var secs []drawnSection
	if err := json.Unmarshal([]byte(data), &secs); err != nil {
		t.Fatalf("data-sections %q: %v", data, err)
	}
	r := synthReport()
	if len(secs) != len(r.Scenarios) {
		t.Fatalf("the script reported %d sections, want %d", len(secs), len(r.Scenarios))
	}
	for i, got := range secs {
		s := r.Scenarios[i]
		if got.ID != s.Name {
			t.Errorf("section %d is %q, want %q", i, got.ID, s.Name)
		}
		if got.ThinBand != 0 {
			t.Errorf("%s: %d breaker states drawn thinner than 1.5 px", s.Name, got.ThinBand)
		}
		if got.Config != len(s.Config) {
			t.Errorf("%s: %d configuration values laid out, want %d", s.Name, got.Config, len(s.Config))
		}
		calls := map[int]bool{}
		retries, hedges := 0, 0
		for j, n := range attemptNumbers(s.Events) {
			if s.Events[j].Commit != "" {
				calls[s.Events[j].Call] = true
			}
			switch {
			case s.Events[j].Hedge:
				hedges++
			case n > 1:
				retries++
			}
		}
		if got.Commits != len(calls) || got.Retries != retries || got.Hedges != hedges {
			t.Errorf("%s: %d commit symbols, %d retries, %d hedges drawn; want %d, %d, %d", s.Name, got.Commits, got.Retries, got.Hedges, len(calls), retries, hedges)
		}
		for _, w := range []struct {
			n    int
			text string
		}{{retries, "retry (attempt 2 or later)"}, {hedges, "hedge"}, {len(calls), "call committed"}} {
			if (w.n > 0) != slices.Contains(got.Legend, w.text) {
				t.Errorf("%s: %d drawn, legend %v (of %q)", s.Name, w.n, got.Legend, w.text)
			}
		}
		if len(s.Series) == 0 {
			if len(got.Lines) != 0 {
				t.Errorf("%s: %d chart lines without a series", s.Name, len(got.Lines))
			}
			continue
		}
		if len(got.Lines) != 8 {
			t.Errorf("%s: %d chart lines drawn, want 8", s.Name, len(got.Lines))
		}
		for _, l := range got.Lines {
			if l.Points != len(s.Series) || !l.Drawn || l.Length <= 0 {
				t.Errorf("%s: line %q: %d points, %v long, laid out %v; want %d points, drawn", s.Name, l.Class, l.Points, l.Length, l.Drawn, len(s.Series))
			}
		}
		for _, w := range []string{"limit", "attempts in flight", "median", "99th percentile", "critical answered", "sheddable refused"} {
			if !slices.Contains(got.Legend, w) {
				t.Errorf("%s: legend %v lacks %q", s.Name, got.Legend, w)
			}
		}
	}
	if secs[0].Commits == 0 || secs[0].Retries == 0 || secs[1].Hedges == 0 || len(secs[3].Lines) == 0 {
		t.Errorf("the synthetic report lost what it is for: %+v", secs)
	}
}

// writeRecoveryScreenshot renders a report holding only the recovery scenario,
// so that its section is what the screenshot shows, and saves it to out (a
// relative path is relative to this package's directory).
func writeRecoveryScreenshot(t *testing.T, browser, out string) {
	r := synthReport()
	if src := os.Getenv("OUTBOUND_SCREENSHOT_REPORT"); src != "" {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		r = new(Report)
		if err := json.Unmarshal(data, r); err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if len(r.Scenarios) == 0 {
			t.Fatalf("%s has no scenarios", src)
		}
	}
	pick := r.Scenarios[0]
	for _, s := range r.Scenarios {
		if s.Name == "recovery-under-backpressure" {
			pick = s
			break
		}
	}
	r.Scenarios = []ScenarioResult{pick}
	r.Passed = pick.Passed

	page := filepath.Join(t.TempDir(), "recovery.html")
	if err := os.WriteFile(page, renderHTML(t, r), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := filepath.Abs(out)
	if err != nil {
		t.Fatal(err)
	}
	screenshot(t, browser, page, out, "1280,1240")
	t.Logf("wrote a screenshot of %s to %s", pick.Name, out)
}

func findChromium() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

func fileURL(path string) string {
	return (&url.URL{Scheme: "file", Path: path}).String()
}

func screenshot(t *testing.T, browser, page, out, size string) {
	t.Helper()
	runChromium(t, browser, "--virtual-time-budget=5000", "--hide-scrollbars",
		"--screenshot="+out, "--window-size="+size, fileURL(page))
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("Chromium wrote no screenshot: %v", err)
	}
}

// runChromium runs one headless Chromium with a fresh profile and returns
// its standard output. Everything that would reach the network at start-up
// is switched off, so the test runs offline.
func runChromium(t *testing.T, browser string, args ...string) []byte {
	t.Helper()
	// Not t.TempDir: Chromium's helper processes can still be writing into
	// the profile for a moment after the browser exits, which would make
	// t.TempDir's cleanup fail the test. Removal is best effort.
	profile, err := os.MkdirTemp("", "outbound-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(profile)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args = append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", // containers often have a tiny /dev/shm
		"--user-data-dir=" + profile,
	}, args...)
	cmd := exec.CommandContext(ctx, browser, args...)
	// Helpers that inherit stdout could keep Output waiting after the
	// browser is gone; WaitDelay bounds that.
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v (timeout: %v)\n%s", browser, strings.Join(args, " "), err, ctx.Err(), lastLines(stderr.String(), 20))
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func statSize(fi os.FileInfo, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d bytes", fi.Size())
}

// TestAttemptsThatNameTheirEndpointsAreDrawnOnALanePerEndpoint: with
// Config.Endpoints each attempt names its endpoint; the picture then has a
// lane per endpoint, in address order (127.0.0.10 after 127.0.0.9), with
// the ejections shaded on their endpoint's lane, and a last lane for the
// attempts rejected before the pick.
func TestAttemptsThatNameTheirEndpointsAreDrawnOnALanePerEndpoint(t *testing.T) {
	s := ScenarioResult{Name: "replicas", Title: "replicas", Protocol: "HTTP1", Passed: true, Millis: 1000, Calls: 4,
		Events: []Mark{
			{AtMs: 10, Millis: 5, Call: 1, Category: "Answered", Status: 200, Endpoint: "127.0.0.10:80"},
			{AtMs: 20, Millis: 5, Call: 2, Category: "Answered", Status: 503, Failure: true, Endpoint: "127.0.0.9:80"},
			{AtMs: 30, Millis: 5, Call: 2, Category: "Answered", Status: 200, Endpoint: "127.0.0.10:80"},
			{AtMs: 40, Millis: 0, Call: 3, Category: "LocalRejection", Guard: "rate"},
		},
		Ejections: []Ejection{{AtMs: 25, Millis: 500, Endpoint: "127.0.0.9:80"}},
	}
	tl := buildTimeline(&s)
	var labels []string
	for _, l := range tl.RowLabels {
		labels = append(labels, l.Text)
	}
	if fmt.Sprint(labels) != "[127.0.0.9 …7.0.0.10 none]" {
		t.Fatalf("lanes %v, want one per endpoint in address order (without their common port, cut to fit), then none", labels)
	}
	if !strings.Contains(tl.Caption, "every endpoint on port 80") {
		t.Errorf("caption %q does not give the common port", tl.Caption)
	}
	laneY := func(i int) float64 { return tl.RowLabels[i].Y - 9 } // a label sits 9 below its lane's top
	var marks []svgMark
	for _, g := range tl.Marks {
		marks = append(marks, g.Marks...)
	}
	onLane := map[int]int{}
	for _, m := range marks {
		for i := range labels {
			if m.Y >= laneY(i) && m.Y < laneY(i)+12 {
				onLane[i]++
			}
		}
	}
	if onLane[0] != 1 || onLane[1] != 2 || onLane[2] != 1 {
		t.Errorf("marks per lane %v, want 1 on .9, 2 on .10, 1 on none", onLane)
	}
	if len(tl.Ejected) != 1 || tl.Ejected[0].Y != laneY(0) || !strings.Contains(tl.Ejected[0].Title, "127.0.0.9:80 ejected") {
		t.Errorf("ejections drawn %+v, want one on the lane of 127.0.0.9:80", tl.Ejected)
	}
	if !strings.Contains(tl.Caption, "one lane per endpoint") {
		t.Errorf("caption %q does not say the lanes are endpoints", tl.Caption)
	}
	page := string(renderHTML(t, &Report{Scenarios: []ScenarioResult{s}}))
	if !strings.Contains(page, `class="ejected"`) || !strings.Contains(page, "endpoint ejected") {
		t.Error("the page draws no ejection, or its legend does not name it")
	}

	// Without endpoints: lanes of calls, as before.
	for i := range s.Events {
		s.Events[i].Endpoint = ""
	}
	s.Ejections = nil
	if tl := buildTimeline(&s); !strings.Contains(tl.Caption, "one lane per call") || len(tl.Ejected) != 0 {
		t.Errorf("without endpoints: caption %q, %d ejections", tl.Caption, len(tl.Ejected))
	}
}

// laneOfMark returns the lane a mark is drawn on, from the row labels of a
// picture with a named lane per call (a label sits 9 below its lane's
// top, and a lane is 12 tall).
func callLaneTops(tl timelineView) map[string]float64 {
	tops := map[string]float64{}
	for _, l := range tl.RowLabels {
		tops[l.Text] = l.Y - 9
	}
	return tops
}

// A retry (an attempt after the first that is no hedge) has a notch before
// its mark; a hedge is hatched, over the lower part of the lane, above the
// attempt it ran beside; the tooltips say which, and the legend names both
// only when the picture has them. A report written before attempts had
// numbers still shows its retries, by their place in the call.
func TestRetriesAndHedgesAreDrawnApart(t *testing.T) {
	s := ScenarioResult{Name: "retries", Title: "retries", Protocol: "HTTP1", Passed: true, Millis: 200, Calls: 3,
		Events: []Mark{
			{AtMs: 10, Millis: 5, Call: 1, Category: "Answered", Status: 503, Failure: true, Attempt: 1},
			{AtMs: 30, Millis: 5, Call: 1, Category: "Answered", Status: 200, Attempt: 2, Commit: "committed"},
			{AtMs: 50, Millis: 40, Call: 7, Category: "Ambiguous", Attempt: 1, Lost: true},
			{AtMs: 70, Millis: 20, Call: 7, Category: "Answered", Status: 200, Attempt: 2, Hedge: true, Commit: "committed"},
			{AtMs: 100, Millis: 5, Call: 9, Category: "Answered", Status: 200, Attempt: 1, Commit: "committed"},
		}}
	tl := buildTimeline(&s)
	titles := map[string]svgMark{}
	var hedgeGroup markGroup
	for i, g := range tl.Marks {
		for _, m := range g.Marks {
			titles[m.Title[:strings.Index(m.Title, " · ")]] = m
			if i >= len(markKinds) {
				hedgeGroup = g
			}
		}
	}
	for _, want := range []string{"call 1", "retry 2 of call 1", "call 7", "hedge of call 7", "call 9"} {
		if _, ok := titles[want]; !ok {
			t.Errorf("no mark whose tooltip begins %q: %v", want, slices.Collect(maps.Keys(titles)))
		}
	}
	retry := titles["retry 2 of call 1"]
	if len(tl.Retries) != 1 || tl.Retries[0].X+tl.Retries[0].W > retry.X || tl.Retries[0].X < retry.X-3 || tl.Retries[0].Y > retry.Y {
		t.Errorf("retry notches %+v, want one just before the retry's mark %+v", tl.Retries, retry)
	}
	hedge, first := titles["hedge of call 7"], titles["call 7"]
	if len(tl.Hedges) != 1 || tl.Hedges[0].X != hedge.X || tl.Hedges[0].W != hedge.W || tl.Hedges[0].Y != hedge.Y {
		t.Errorf("hatching %+v, want one over the hedge's mark %+v", tl.Hedges, hedge)
	}
	if hedge.Y <= first.Y || hedge.Y+hedgeGroup.H != first.Y+tl.MarkH || hedgeGroup.H >= tl.MarkH {
		t.Errorf("the hedge (y %v, %v tall) is not over the lower part of its call's lane (y %v, %v tall)", hedge.Y, hedgeGroup.H, first.Y, tl.MarkH)
	}
	legend := legendTexts(tl.Legend)
	if !slices.Contains(legend, "retry (attempt 2 or later)") || !slices.Contains(legend, "hedge") {
		t.Errorf("legend %v names no retry or no hedge", legend)
	}

	page := string(renderHTML(t, &Report{Scenarios: []ScenarioResult{s}}))
	for _, want := range []string{`<g class="retries notch">`, `<g class="hedges hatch" fill="url(#hatch-retries)">`, `<pattern id="hatch-retries"`,
		"retry 2 of call 1 · Answered 200", "hedge of call 7 · Answered 200"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}

	// Without attempt numbers or hedges (an older report): a call's second
	// attempt is its retry; and a picture without retries or hedges does
	// not name them.
	for i := range s.Events {
		s.Events[i].Attempt, s.Events[i].Hedge = 0, false
	}
	if tl := buildTimeline(&s); len(tl.Retries) != 2 || len(tl.Hedges) != 0 {
		t.Errorf("without numbers: %d retries, %d hedges, want 2 and 0", len(tl.Retries), len(tl.Hedges))
	}
	s.Events = []Mark{s.Events[0], s.Events[4]}
	if legend := legendTexts(buildTimeline(&s).Legend); slices.Contains(legend, "hedge") || slices.Contains(legend, "retry (attempt 2 or later)") {
		t.Errorf("legend of a picture without retries or hedges: %v", legend)
	}
}

func legendTexts(items []legendItem) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Text)
	}
	return out
}

// With a lane per call, each call's commit status is a symbol at its
// lane's end, in a column right of the time axis: the symbol's shape and
// class say the status, its tooltip says it in words, and the legend
// names the statuses drawn. With calls packed into lanes, there is no
// lane's end to put it at.
func TestEachCallsCommitStatusIsAtItsLanesEnd(t *testing.T) {
	s := synthFailed()
	tl := buildTimeline(&s)
	tops := callLaneTops(tl)
	if len(tl.Commits) != s.Calls {
		t.Fatalf("%d commit symbols, want one per call (%d)", len(tl.Commits), s.Calls)
	}
	want := map[int]string{} // from the marks
	for _, e := range s.Events {
		if e.Commit != "" {
			want[e.Call] = e.Commit
		}
	}
	for call := 1; call <= s.Calls; call++ {
		top, ok := tops[fmt.Sprintf("call %d", call)]
		if !ok {
			t.Fatalf("no lane named call %d", call)
		}
		var sym *commitSymbol
		for i, c := range tl.Commits {
			if c.Y > top && c.Y < top+12 {
				sym = &tl.Commits[i]
			}
		}
		if sym == nil {
			t.Fatalf("no commit symbol on the lane of call %d", call)
		}
		if sym.X != commitX || sym.X <= plotLeft+plotWidth || sym.X+sym.R > svgWidth {
			t.Errorf("call %d: symbol at x %v, want %v, right of the time axis and inside the picture", call, sym.X, commitX)
		}
		cls := map[string]string{"committed": "c-yes", "not committed": "c-no", "unknown": "c-unk"}[want[call]]
		if sym.Class != cls || sym.Diamond != (cls == "c-unk") || !strings.HasPrefix(sym.Title, fmt.Sprintf("call %d: %s", call, want[call][:3])) &&
			!strings.HasPrefix(sym.Title, fmt.Sprintf("call %d: commit status unknown", call)) {
			t.Errorf("call %d (%s): symbol %+v", call, want[call], sym)
		}
	}
	legend := legendTexts(tl.Legend)
	for _, w := range []string{"call committed", "call's commit status unknown"} {
		if !slices.Contains(legend, w) {
			t.Errorf("legend %v lacks %q", legend, w)
		}
	}
	if slices.Contains(legend, "call not committed") {
		t.Errorf("legend %v names a status no call had", legend)
	}
	page := string(renderHTML(t, &Report{Scenarios: []ScenarioResult{s}}))
	if n := strings.Count(page, `<circle class="c-yes"`) + strings.Count(page, `<polygon class="c-unk"`); n != s.Calls+2 { // and the legend's two
		t.Errorf("%d commit symbols in the page, want %d and the legend's 2", n, s.Calls)
	}
	if !strings.Contains(page, "<title>call 7: commit status unknown (it may have been processed)</title>") {
		t.Error("no tooltip says a call's commit status is unknown")
	}

	busy := synthBusy("busy", 300) // one attempt per call, packed
	busy.Events = withCommits(busy.Events)
	if tl := buildTimeline(&busy); len(tl.Commits) != 0 || !strings.Contains(tl.Caption, "packed") {
		t.Errorf("packed lanes: %d commit symbols, caption %q", len(tl.Commits), tl.Caption)
	}
}

// A breaker state far shorter than a unit of the picture (a CLOSED of 0.2
// ms in 5 s) is still drawn minSegW wide, centred on its time, on top of
// its neighbours; the neighbours keep their places.
func TestAShortBreakerStateIsStillVisible(t *testing.T) {
	s := ScenarioResult{Name: "flap", Passed: true, Millis: 5000, Transitions: []Transition{
		{AtMs: 1000, From: "CLOSED", To: "OPEN"}, {AtMs: 2000, From: "OPEN", To: "HALF_OPEN"},
		{AtMs: 2500, From: "HALF_OPEN", To: "CLOSED"}, {AtMs: 2500.2, From: "CLOSED", To: "OPEN"},
		{AtMs: 4000, From: "OPEN", To: "HALF_OPEN"},
	}}
	x := func(ms float64) float64 { return plotLeft + ms/5000*plotWidth }
	tl := buildTimeline(&s)
	if len(tl.Band) != 6 {
		t.Fatalf("%d segments, want 6", len(tl.Band))
	}
	for _, seg := range tl.Band {
		if seg.W < minSegW {
			t.Errorf("segment %q is %v wide, want at least %v", seg.Title, seg.W, minSegW)
		}
	}
	short := tl.Band[len(tl.Band)-1]
	if short.Class != "s-closed" || !strings.HasPrefix(short.Title, "CLOSED from 2500 ms") && !strings.HasPrefix(short.Title, "CLOSED from 2.50 s") {
		t.Fatalf("the last segment drawn is %+v, want the short CLOSED, on top", short)
	}
	if mid := short.X + short.W/2; math.Abs(mid-x(2500.1)) > 0.01 || short.W != minSegW || short.Label != "" {
		t.Errorf("the short CLOSED is at %v, %v wide, named %q; want centred on %v, %v wide, unnamed", short.X, short.W, short.Label, x(2500.1), minSegW)
	}
	// The others start and end where their times are.
	for i, want := range [][2]float64{{0, 1000}, {1000, 2000}, {2000, 2500}, {2500.2, 4000}, {4000, 5000}} {
		seg := tl.Band[i]
		if math.Abs(seg.X-x(want[0])) > 1e-9 || math.Abs(seg.X+seg.W-x(want[1])) > 1e-9 {
			t.Errorf("segment %d is [%v, %v], want [%v, %v]", i, seg.X, seg.X+seg.W, x(want[0]), x(want[1]))
		}
	}
	// At the very start or end, the minimum width stays inside the plot.
	s.Transitions = []Transition{{AtMs: 0.01, From: "CLOSED", To: "OPEN"}, {AtMs: 4999.99, From: "OPEN", To: "HALF_OPEN"}}
	for _, seg := range buildTimeline(&s).Band {
		if seg.X < plotLeft || seg.X+seg.W > plotLeft+plotWidth+1e-9 || seg.W < minSegW {
			t.Errorf("segment %q at [%v, %v], outside the plot or too narrow", seg.Title, seg.X, seg.X+seg.W)
		}
	}
}

// The series of an overload scenario is drawn as line charts on the
// timeline's time axis: the bulkhead's limit and the attempts in flight,
// the latency percentiles, and the calls per second by criticality; each
// line a path through every sample, each panel with a y axis and a legend.
func TestTheSeriesIsDrawnAsLineCharts(t *testing.T) {
	s := synthOverload()
	c := buildChart(&s)
	if c == nil || len(c.Panels) != 3 {
		t.Fatalf("chart %+v, want 3 panels", c)
	}
	lines := map[string]lineView{}
	for _, p := range c.Panels {
		if len(p.YTicks) < 2 || p.YTicks[0].Text[0] != '0' {
			t.Errorf("panel %q: y axis %v, want ticks from 0", p.Title, p.YTicks)
		}
		if len(p.Legend) != len(p.Lines) {
			t.Errorf("panel %q: %d legend items for %d lines", p.Title, len(p.Legend), len(p.Lines))
		}
		for _, l := range p.Lines {
			lines[l.Title] = l
			if l.Points != len(s.Series) || strings.Count(l.D, "L")+strings.Count(l.D, "M") != len(s.Series) || !strings.HasPrefix(l.D, "M") {
				t.Errorf("line %q: %d points, d %.60q…, want a path through all %d samples", l.Title, l.Points, l.D, len(s.Series))
			}
		}
	}
	for _, want := range []string{"limit", "attempts in flight", "median", "99th percentile", "critical answered", "critical refused", "sheddable answered", "sheddable refused"} {
		if _, ok := lines[want]; !ok {
			t.Errorf("no line %q among %v", want, slices.Collect(maps.Keys(lines)))
		}
	}
	// The limit comes down from 20 to 8: its first point is higher up
	// than its last, and both are on the time axis of the timeline.
	var px, py []float64
	for _, seg := range strings.FieldsFunc(lines["limit"].D, func(r rune) bool { return r == 'M' || r == 'L' }) {
		var a, b float64
		fmt.Sscan(seg, &a, &b)
		px, py = append(px, a), append(py, b)
	}
	end := scenarioEnd(&s)
	if py[0] >= py[len(py)-1] || math.Abs(px[0]-(plotLeft+25/end*plotWidth)) > 0.1 || math.Abs(px[len(px)-1]-(plotLeft+3000/end*plotWidth)) > 0.1 {
		t.Errorf("limit from (%v, %v) to (%v, %v)", px[0], py[0], px[len(px)-1], py[len(py)-1])
	}
	if !strings.Contains(c.Caption, "120 samples") {
		t.Errorf("caption %q", c.Caption)
	}

	// A latency where no call was answered is a gap, not a zero.
	s.Series[10].Answered, s.Series[10].ByLevel = 0, nil
	for _, p := range buildChart(&s).Panels {
		for _, l := range p.Lines {
			if l.Title == "median" && (l.Points != len(s.Series)-1 || strings.Count(l.D, "M") != 2) {
				t.Errorf("median with a sample of no answer: %d points, %d moves", l.Points, strings.Count(l.D, "M"))
			}
		}
	}

	// Without levels or a bulkhead: the calls by outcome alone.
	for i := range s.Series {
		s.Series[i].ByLevel, s.Series[i].Limit, s.Series[i].InFlight = nil, 0, 0
	}
	c = buildChart(&s)
	if len(c.Panels) != 2 || len(c.Panels[1].Lines) != 2 || c.Panels[1].Lines[0].Title != "answered" || c.Panels[1].Lines[1].Title != "refused locally" {
		t.Errorf("without levels or bulkhead: %d panels, %+v", len(c.Panels), c.Panels[len(c.Panels)-1].Lines)
	}
	if buildChart(&ScenarioResult{}) != nil {
		t.Error("a chart for a scenario without a series")
	}

	// In the page, after the timeline, as an SVG of its own.
	doc := parseHTML(t, renderHTML(t, synthReport()))
	sec := domSections(doc)[3]
	charts := domFind(sec, func(n *html.Node) bool { return n.Data == "svg" && domHasClass(n, "chart") })
	if len(charts) != 1 {
		t.Fatalf("%d charts in the overload's section", len(charts))
	}
	paths := domFind(charts[0], func(n *html.Node) bool { return n.Data == "path" && domHasClass(n, "line") })
	if len(paths) != 8 {
		t.Errorf("%d lines drawn, want 8", len(paths))
	}
	if text := domText(charts[0]); !strings.Contains(text, "sheddable refused") || !strings.Contains(text, "ms") || !strings.Contains(text, "3.0 s") {
		t.Errorf("the chart's text lacks a legend, a unit or a time: %q", text)
	}
	if text := domText(domFind(sec, domTag("svg"))[0]); !strings.Contains(text, "the charts below") {
		t.Errorf("the overload's timeline does not say where its attempts are: %q", text)
	}
}

// However long the series a report holds, its lines have at most
// maxSeriesPoints points, the merged samples keep every call, and the page
// stays small.
func TestTheChartsStayBoundedWhateverTheSeries(t *testing.T) {
	s := synthOverload()
	s.Series = nil
	for i := range 100_000 {
		s.Series = append(s.Series, Sample{AtMs: float64(i+1) * 10, Millis: 10, Limit: 8, InFlight: i % 9, Answered: 3, Rejected: i % 2,
			P50Ms: 20, P99Ms: float64(30 + i%50), ByLevel: map[string]LevelCounts{"critical": {Answered: 1}, "sheddable": {Answered: 2, Rejected: i % 2}}})
	}
	s.Millis = 1_000_000
	merged := boundSeries(s.Series, maxSeriesPoints)
	var answered, rejected, shedRejected int
	var span float64
	for _, p := range merged {
		answered, rejected, shedRejected, span = answered+p.Answered, rejected+p.Rejected, shedRejected+p.ByLevel["sheddable"].Rejected, span+p.Millis
	}
	if len(merged) > maxSeriesPoints || answered != 300_000 || rejected != 50_000 || shedRejected != 50_000 || span != 1_000_000 {
		t.Errorf("merged: %d samples, %d answered, %d refused (%d sheddable) over %v ms", len(merged), answered, rejected, shedRejected, span)
	}
	if merged[0].P99Ms != 79 || merged[0].P50Ms != 20 {
		t.Errorf("merged latency: p50 %v, p99 %v; want the mean 20 and the highest 79", merged[0].P50Ms, merged[0].P99Ms)
	}
	c := buildChart(&s)
	for _, p := range c.Panels {
		for _, l := range p.Lines {
			if l.Points > maxSeriesPoints {
				t.Errorf("line %q has %d points, want at most %d", l.Title, l.Points, maxSeriesPoints)
			}
		}
	}
	page := renderHTML(t, &Report{Scenarios: []ScenarioResult{s}})
	t.Logf("a series of 100000 samples: %d KB of HTML", len(page)>>10)
	if len(page) > 100<<10 {
		t.Errorf("page is %d KB, want at most 100", len(page)>>10)
	}
}

// Each scenario's section shows the configuration it ran with, in a known
// order, as text.
func TestTheConfigurationIsShown(t *testing.T) {
	doc := parseHTML(t, renderHTML(t, synthReport()))
	for i, sec := range domSections(doc) {
		s := synthReport().Scenarios[i]
		dls := domFind(sec, func(n *html.Node) bool { return n.Data == "dl" && domHasClass(n, "config") })
		if len(s.Config) == 0 {
			if len(dls) != 0 {
				t.Errorf("%s: a configuration without one in the report", s.Name)
			}
			continue
		}
		if len(dls) != 1 {
			t.Fatalf("%s: %d configuration lists", s.Name, len(dls))
		}
		var keys []string
		for _, dt := range domFind(dls[0], domTag("dt")) {
			keys = append(keys, domText(dt))
		}
		dds := domFind(dls[0], domTag("dd"))
		if len(keys) != len(s.Config) || len(dds) != len(keys) {
			t.Fatalf("%s: %v, want the %d parts of %v", s.Name, keys, len(s.Config), s.Config)
		}
		for j, k := range keys {
			if domText(dds[j]) != s.Config[k] {
				t.Errorf("%s: %s is %q, want %q", s.Name, k, domText(dds[j]), s.Config[k])
			}
		}
		if s.Name == synthOverloadName && fmt.Sprint(keys) != "[MaxAttempts Breaker Bulkhead Zeta]" {
			t.Errorf("%s: parts in the order %v, want the known ones in their order, then the others", s.Name, keys)
		}
	}
	if page := renderHTML(t, synthReport()); bytes.Contains(page, []byte("<b>escaped")) {
		t.Error("a configuration's text reached the page as markup")
	}
}

// visibleText is the text of the page a person sees: not scripts, styles,
// or what is hidden.
func visibleText(n *html.Node) string {
	if n.Type == html.ElementNode {
		if _, hidden := domAttr(n, "hidden"); hidden || n.Data == "script" || n.Data == "style" || n.Data == "title" {
			return ""
		}
	}
	if n.Type == html.TextNode {
		return n.Data
	}
	var b strings.Builder
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		b.WriteString(visibleText(c))
	}
	return b.String()
}

// The render check is for the browser test, not for people: it is a hidden
// element without text.
func TestTheRenderCheckIsHidden(t *testing.T) {
	doc := parseHTML(t, renderHTML(t, synthReport()))
	check := domFind(doc, func(n *html.Node) bool { v, _ := domAttr(n, "id"); return v == "render-check" })
	if len(check) != 1 {
		t.Fatalf("%d render-check elements", len(check))
	}
	if _, hidden := domAttr(check[0], "hidden"); !hidden || domText(check[0]) != "" {
		t.Errorf("render check: hidden %v, text %q", hidden, domText(check[0]))
	}
	if text := visibleText(doc); strings.Contains(strings.ToLower(text), "render check") || !strings.Contains(text, synthRecoveryName) {
		t.Errorf("the visible text says the render check, or is not the page's: %.300q", text)
	}
}
