package drill

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"html/template"
	"io"
	"maps"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// WriteHTML writes r as one self-contained HTML page (no external resources:
// inline CSS, inline SVG, at most a small inline script).
//
// The page has a header with the overall verdict, a summary table with one
// row per scenario, and per scenario a section (its id is the scenario name)
// with the configuration it ran with, the checks and a timeline picture: the
// breaker state as a coloured band, the attempts as marks below it (a
// retry's with a notch before it, a hedge's hatched), each call's commit
// status at the end of its lane, a time axis and a legend. A scenario with
// a series (the overload scenarios) also has line charts of it on the same
// time axis: the bulkhead's limit and the attempts in flight, the latency,
// and the calls per second. Everything taken from the report is escaped by
// html/template: names, titles and checks are data, not markup.
func WriteHTML(w io.Writer, r *Report) error {
	if r == nil {
		return errors.New("drill: WriteHTML: nil report")
	}
	// Render into a buffer first so that a template error never leaves a
	// half-written page behind.
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, newPageView(r)); err != nil {
		return fmt.Errorf("drill: WriteHTML: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// Geometry of the timeline picture, in SVG user units. The SVG has a viewBox
// and scales to the width of the page, so these are proportions more than
// pixels; at the page's maximum width one unit is about one CSS pixel.
const (
	svgWidth   = 960.0
	plotLeft   = 64.0 // room for the row labels on the left
	plotRight  = 26.0 // room for a minimum-width mark at the very end, and the calls' commit status
	plotWidth  = svgWidth - plotLeft - plotRight
	bandTop    = 6.0
	bandHeight = 22.0
	minMarkW   = 2.0                       // an attempt shorter than this is still visible
	minSegW    = 3.0                       // so is a breaker state that lasted less
	commitX    = plotLeft + plotWidth + 12 // the column of the calls' commit status
)

// Limits that keep the page small and the picture readable whatever the
// report holds.
const (
	// maxRows is the number of attempt lanes. Up to this many calls get a
	// lane each; beyond it calls are packed into this many lanes.
	maxRows = 40
	// maxMarks is the number of attempt marks drawn per scenario, one per
	// attempt. A mark costs about 130 bytes; a scenario with more attempts
	// is drawn as a histogram of histBuckets columns instead, so that its
	// picture stays a few hundred KB at most, whatever the count.
	maxMarks    = 1000
	histBuckets = 160
	histHeight  = 160.0
	// maxTransitionLines bounds the faint vertical lines drawn at breaker
	// transitions; a flapping breaker would otherwise hatch the picture.
	maxTransitionLines = 60
	// maxSeriesPoints bounds the points of each line of a scenario's
	// charts: a longer series, from a report written elsewhere, is drawn
	// with neighbouring samples merged.
	maxSeriesPoints = maxSamples
)

// pageView is what the page template renders.
type pageView struct {
	Verdict   string // PASSED or FAILED
	Passed    bool
	Started   string
	Duration  string
	GoVersion string
	Version   string
	PassedN   int
	FailedN   int
	Scenarios []scenarioView
}

type scenarioView struct {
	*ScenarioResult
	Anchor     string
	Duration   string
	Attempts   string
	Commits    string
	Rejections string
	Timeline   timelineView
	Chart      *chartView // of the series, if the scenario has one
	Settings   []configRow
}

// configRow is one part of the configuration a scenario ran with.
type configRow struct{ Key, Value string }

func newPageView(r *Report) pageView {
	p := pageView{
		Verdict:   "FAILED",
		Passed:    r.Passed,
		Started:   "unknown",
		Duration:  humanMs(r.Millis),
		GoVersion: orDash(r.GoVersion),
		Version:   orDash(r.Version),
	}
	if r.Passed {
		p.Verdict = "PASSED"
	}
	if !r.Started.IsZero() {
		p.Started = r.Started.Format("2006-01-02 15:04:05 MST")
	}
	used := make(map[string]bool)
	for i := range r.Scenarios {
		s := &r.Scenarios[i]
		if s.Passed {
			p.PassedN++
		} else {
			p.FailedN++
		}
		v := scenarioView{
			ScenarioResult: s,
			Anchor:         anchorFor(s.Name, i, used),
			Duration:       humanMs(s.Millis),
			Attempts:       fmtCounts(s.Attempts, []string{"Answered", "NotSent", "Ambiguous", "LocalRejection"}),
			Commits:        fmtCommits(s.Commits),
			Rejections:     fmtCounts(s.Rejections, []string{"circuit", "rate", "bulkhead"}),
			Timeline:       buildTimeline(s),
			Chart:          buildChart(s),
			Settings:       configRows(s.Config),
		}
		v.Timeline.HatchID = "hatch-" + v.Anchor
		p.Scenarios = append(p.Scenarios, v)
	}
	return p
}

// anchorFor returns the section id for a scenario: its name, so that links
// like report.html#recovery-under-backpressure keep working across runs. Characters that do
// not belong in a fragment are replaced, an empty name becomes scenario-<i>,
// and a repeated one gets a counter so that every id is unique.
func anchorFor(name string, i int, used map[string]bool) string {
	a := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '-'
	}, name)
	if a == "" {
		a = fmt.Sprintf("scenario-%d", i+1)
	}
	for base, n := a, 2; used[a]; n++ {
		a = fmt.Sprintf("%s-%d", base, n)
	}
	used[a] = true
	return a
}

// configOrder is the order in which a scenario's configuration is shown;
// parts it does not name follow, sorted.
var configOrder = []string{"MaxAttempts", "Backoff", "Timeouts", "Budget", "Breaker", "Rate", "Bulkhead", "Throttle", "Hedging", "Endpoints", "Other"}

func configRows(m map[string]string) []configRow {
	var rows []configRow
	for _, k := range configOrder {
		if v, ok := m[k]; ok {
			rows = append(rows, configRow{k, v})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(configOrder, k) {
			rows = append(rows, configRow{k, m[k]})
		}
	}
	return rows
}

// fmtCounts prints a map of counts with the well-known keys first, in their
// usual order, then any other key sorted, so that rows read the same way.
func fmtCounts(m map[string]int, order []string) string {
	if len(m) == 0 {
		return "—"
	}
	var parts []string
	seen := make(map[string]bool, len(order))
	for _, k := range order {
		seen[k] = true
		if v, ok := m[k]; ok {
			parts = append(parts, k+" "+strconv.Itoa(v))
		}
	}
	var rest []string
	for k := range m {
		if !seen[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		parts = append(parts, k+" "+strconv.Itoa(m[k]))
	}
	return strings.Join(parts, ", ")
}

// fmtCommits prints "committed / not committed / unknown" as three numbers,
// the order the summary table's column header announces.
func fmtCommits(m map[string]int) string {
	if len(m) == 0 {
		return "—"
	}
	s := fmt.Sprintf("%d / %d / %d", m["committed"], m["not committed"], m["unknown"])
	var extra []string
	for k, v := range m {
		if k != "committed" && k != "not committed" && k != "unknown" {
			extra = append(extra, k+" "+strconv.Itoa(v))
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// humanMs prints a duration given in milliseconds for people.
func humanMs(ms float64) string {
	switch {
	case ms < 0 || math.IsNaN(ms):
		return "—"
	case ms < 10:
		return strconv.FormatFloat(ms, 'f', 2, 64) + " ms"
	case ms < 1000:
		return strconv.FormatFloat(ms, 'f', 1, 64) + " ms"
	default:
		return strconv.FormatFloat(ms/1000, 'f', 2, 64) + " s"
	}
}

// svgNum prints an SVG coordinate with one decimal at most: enough
// precision for a picture, and it keeps thousands of marks small.
func svgNum(v float64) string {
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64)
}

// timelineView is the geometry of one scenario's picture, computed in Go so
// that the template only places elements.
type timelineView struct {
	Width     float64
	Height    float64
	Grid      []svgTick
	Lines     []float64 // x of breaker transitions, drawn across the lanes
	LinesY2   float64
	Band      []bandSegment
	RowLabels []svgLabel
	Marks     []markGroup // one mark per attempt (see drawLanes), or
	MarkH     float64
	Retries   []svgMark // a notch before each retry's mark, NotchH tall
	NotchH    float64
	Hedges    []svgBar // the hedges' marks again, hatched (HatchID names the pattern)
	HatchID   string
	Commits   []commitSymbol // each call's commit status, at its lane's end
	Bars      []svgBar       // a histogram when there are too many (see histogram)
	Ejected   []svgBar       // an endpoint's ejections, on its lane
	Empty     *svgLabel      // "no attempts" note, when there are none
	AxisY     float64
	TickY2    float64 // bottom of the tick marks
	TickTextY float64
	Ticks     []svgTick
	Legend    []legendItem
	Caption   string

	// Constants, passed so that the template does not repeat them.
	LabelX, PlotLeft, PlotRight float64
	BandY, BandH, BandBottom    float64
	BandTextY                   float64 // baseline of the state names
}

type svgTick struct {
	X     float64
	Label string
	End   bool // anchor the label at its end, so that it stays inside the picture
}

type svgLabel struct {
	X, Y float64
	Text string
}

type bandSegment struct {
	X, W  float64
	Class string
	Label string // empty when the segment is too narrow for the name
	LX    float64
	Title string
}

// svgMark is one attempt. Its class and height are the same for a whole
// group, so they are not repeated on every mark.
type svgMark struct {
	X, Y, W float64
	Title   string
}

// markGroup is the marks of one kind, drawn under one <g> that carries
// their class, H tall.
type markGroup struct {
	Class string
	H     float64
	Marks []svgMark
}

// svgBar is one stacked part of a histogram column.
type svgBar struct {
	X, Y, W, H float64
	Class      string
	Title      string
}

type legendItem struct {
	X, Y  float64 // Y: the text's baseline
	BoxY  float64
	Class string
	Text  string
	TX    float64
	// What the swatch is when it is not a box of Class: a box with a
	// retry's notch or a hedge's hatching, a commit symbol, or a line of
	// Class (from X to LX2 at LY).
	Notch, Hatch bool
	Sym          *commitSymbol
	Line         bool
	LX2, LY      float64
}

// commitSymbol is a call's commit status: a filled circle for committed,
// a ring for not committed, a diamond for unknown.
type commitSymbol struct {
	Class   string // c-yes, c-no, c-unk, c-other
	Diamond bool
	X, Y, R float64
	Points  string // the diamond's
	Title   string
}

// newCommitSymbol draws status at (x, y), r in size.
func newCommitSymbol(status string, x, y, r float64) *commitSymbol {
	c := &commitSymbol{X: x, Y: y, R: r}
	switch status {
	case "committed":
		c.Class = "c-yes"
	case "not committed":
		c.Class = "c-no"
	case "unknown":
		c.Class, c.Diamond = "c-unk", true
	default:
		c.Class, c.Diamond = "c-other", true
	}
	if c.Diamond {
		r += 0.8 // a diamond looks smaller than a circle of its size
		c.Points = strings.Join([]string{svgNum(x) + "," + svgNum(y-r), svgNum(x+r) + "," + svgNum(y), svgNum(x) + "," + svgNum(y+r), svgNum(x-r) + "," + svgNum(y)}, " ")
	}
	return c
}

// stateSpan is an interval during which the breaker was in one state.
type stateSpan struct {
	From, To float64
	State    string
	Reason   string
}

// scenarioEnd is where the picture's time axis stops: the scenario's
// duration, or later if an attempt or a transition was recorded after it.
func scenarioEnd(s *ScenarioResult) float64 {
	end := s.Millis
	for _, e := range s.Events {
		end = math.Max(end, e.AtMs+math.Max(e.Millis, 0))
	}
	for _, p := range s.Series {
		end = math.Max(end, p.AtMs)
	}
	for _, t := range s.Transitions {
		end = math.Max(end, t.AtMs)
	}
	if !(end > 0) || math.IsInf(end, 0) { // also catches NaN
		end = 1
	}
	return end
}

// stateSpans turns the transitions into the breaker's states over [0, end].
// The breaker starts CLOSED; each transition switches to its To state at its
// AtMs. From is not checked: if a transition went missing, the band still
// shows what the breaker said it moved to.
func stateSpans(ts []Transition, end float64) []stateSpan {
	sorted := append([]Transition(nil), ts...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].AtMs < sorted[j].AtMs })
	var spans []stateSpan
	cur := stateSpan{From: 0, State: "CLOSED", Reason: "initial state"}
	for _, t := range sorted {
		at := math.Min(math.Max(t.AtMs, cur.From), end)
		if at > cur.From {
			cur.To = at
			spans = append(spans, cur)
		}
		cur = stateSpan{From: at, State: t.To, Reason: t.Reason}
	}
	cur.To = end
	if cur.To > cur.From || len(spans) == 0 {
		spans = append(spans, cur)
	}
	return spans
}

// commitWords says a commit status in a sentence.
func commitWords(status string) string {
	switch status {
	case "committed":
		return "committed"
	case "not committed":
		return "not committed (the upstream did not process it)"
	case "unknown":
		return "commit status unknown (it may have been processed)"
	}
	return "commit status " + orDash(status)
}

func stateClass(state string) string {
	switch state {
	case "CLOSED":
		return "s-closed"
	case "OPEN", "FORCED_OPEN":
		return "s-open"
	case "HALF_OPEN":
		return "s-half"
	}
	return "s-other"
}

// The kinds of attempt, in legend order: their class, their legend, and
// how a histogram's tooltip says it. An unknown category is "a-other".
var markKinds = [...]struct{ class, legend, verb string }{
	{"a-ok", "answered", "answered"},
	{"a-fail", "answered, failure (e.g. 503)", "answered with a failure"},
	{"a-ns", "not sent", "not sent"},
	{"a-amb", "ambiguous", "ambiguous"},
	{"a-rej", "rejected locally", "rejected locally"},
	{"a-other", "other", "of another kind"},
}

// kindIndex is the position of e's class in markKinds.
func kindIndex(e Mark) int {
	switch e.Category {
	case "Answered":
		if e.Failure {
			return 1
		}
		return 0
	case "NotSent":
		return 2
	case "Ambiguous":
		return 3
	case "LocalRejection":
		return 4
	}
	return 5
}

// attemptNumbers numbers each attempt in its call: its Attempt, or, in a
// report written before attempts had numbers, its place among the call's
// attempts so far.
func attemptNumbers(events []Mark) []int {
	seen := map[int]int{}
	nums := make([]int, len(events))
	for i, e := range events {
		seen[e.Call]++
		nums[i] = cmp.Or(e.Attempt, seen[e.Call])
	}
	return nums
}

// markTitle is the tooltip of one attempt, the attempt number n of its
// call: what it was ("retry 2 of call 7", "hedge of call 7"), then what
// came of it.
func markTitle(e Mark, n int) string {
	var b strings.Builder
	switch {
	case e.Hedge:
		fmt.Fprintf(&b, "hedge of call %d", e.Call)
		if e.Lost {
			b.WriteString(" (lost: another answered first)")
		}
	case n > 1:
		fmt.Fprintf(&b, "retry %d of call %d", n, e.Call)
	default:
		fmt.Fprintf(&b, "call %d", e.Call)
	}
	b.WriteString(" · " + orDash(e.Category))
	if e.Status != 0 {
		b.WriteString(" " + strconv.Itoa(e.Status))
	}
	if e.Guard != "" {
		b.WriteString(" by " + e.Guard)
	}
	if e.Failure {
		b.WriteString(" (failure)")
	}
	if e.Endpoint != "" {
		b.WriteString(" from " + e.Endpoint)
	}
	fmt.Fprintf(&b, " · at %s for %s", humanMs(e.AtMs), humanMs(e.Millis))
	if e.Commit != "" {
		b.WriteString(" · the call's last attempt: " + commitWords(e.Commit))
	}
	return b.String()
}

// buildTimeline lays out one scenario's picture: the breaker band on top,
// the attempts below it, then the time axis and the legend.
func buildTimeline(s *ScenarioResult) timelineView {
	end := scenarioEnd(s)
	x := func(ms float64) float64 {
		return plotLeft + math.Min(math.Max(ms, 0), end)/end*plotWidth
	}
	tl := timelineView{
		Width: svgWidth, LabelX: plotLeft - 6, PlotLeft: plotLeft, PlotRight: plotLeft + plotWidth,
		BandY: bandTop, BandH: bandHeight, BandBottom: bandTop + bandHeight, BandTextY: bandTop + 15,
	}

	tl.Band = band(stateSpans(s.Transitions, end), x)

	top := bandTop + bandHeight + 10
	var lanesH float64
	var notes []string
	switch {
	case len(s.Events) == 0 && len(s.Series) > 0:
		lanesH = 18
		tl.Empty = &svgLabel{X: plotLeft + plotWidth/2, Y: top + 12, Text: "attempts counted, not kept one by one: the charts below draw them over time"}
	case len(s.Events) == 0:
		lanesH = 18
		tl.Empty = &svgLabel{X: plotLeft + plotWidth/2, Y: top + 12, Text: "no attempts recorded"}
	case len(s.Events) > maxMarks:
		lanesH = histHeight
		var bucketMs float64
		tl.Bars, tl.RowLabels, bucketMs = histogram(s.Events, end, x, top, lanesH)
		notes = append(notes, fmt.Sprintf("too many to draw one by one, so each column counts the attempts that started in its %s, stacked by kind", humanMs(bucketMs)))
	default:
		lanesH, notes = tl.drawLanes(s.Events, s.Ejections, x, top)
	}

	// Faint lines at the transitions tie the band to the attempts below.
	if len(s.Transitions) <= maxTransitionLines {
		for _, t := range s.Transitions {
			tl.Lines = append(tl.Lines, x(t.AtMs))
		}
	} else {
		notes = append(notes, fmt.Sprintf("%d breaker transitions, too many for lines across the attempts", len(s.Transitions)))
	}

	tl.AxisY = top + lanesH + 6
	tl.LinesY2 = tl.AxisY
	tl.Ticks = timeTicks(end, x)
	tl.Grid = tl.Ticks
	tl.TickY2, tl.TickTextY = tl.AxisY+4, tl.AxisY+16
	tl.Legend = tl.legendItems(tl.AxisY + 38)
	tl.Height = tl.Legend[len(tl.Legend)-1].Y + 8

	tl.Caption = fmt.Sprintf("%d attempts in %d calls over %s", len(s.Events), s.Calls, humanMs(end))
	if len(s.Events) == 0 && len(s.Series) > 0 {
		counted := 0
		for _, n := range s.Attempts {
			counted += n
		}
		tl.Caption = fmt.Sprintf("%d calls over %s, their %d attempts counted (see the summary) but not kept one by one", s.Calls, humanMs(end), counted)
	}
	if len(notes) > 0 {
		tl.Caption += "; " + strings.Join(notes, "; ")
	}
	tl.Caption += "."
	return tl
}

// band draws the breaker's states. A state too short to see is drawn
// minSegW wide, centred on its time (within the picture), over its
// neighbours, which keep their places: the others' times do not shift.
func band(spans []stateSpan, x func(float64) float64) []bandSegment {
	var wide, narrow []bandSegment
	for _, sp := range spans {
		seg := bandSegment{
			X:     x(sp.From),
			W:     x(sp.To) - x(sp.From),
			Class: stateClass(sp.State),
			Title: fmt.Sprintf("%s from %s to %s", orDash(sp.State), humanMs(sp.From), humanMs(sp.To)),
		}
		if sp.Reason != "" {
			seg.Title += " · " + sp.Reason
		}
		if seg.W < minSegW {
			mid := seg.X + seg.W/2
			seg.X = math.Min(math.Max(mid-minSegW/2, plotLeft), plotLeft+plotWidth-minSegW)
			seg.W = minSegW
			narrow = append(narrow, seg)
			continue
		}
		// Name the state only where the name fits: about 6.5 units per
		// character at the band's font size, plus some padding.
		if seg.W >= float64(len(sp.State))*6.5+10 {
			seg.Label, seg.LX = sp.State, seg.X+seg.W/2
		}
		wide = append(wide, seg)
	}
	return append(wide, narrow...) // drawn last, on top
}

// drawLanes draws one mark per attempt, on lanes of calls (see assignLanes)
// or, when the attempts name their endpoints, one lane per endpoint with
// its ejections shaded; it returns the lanes' height and what the caption
// should say about them.
func (tl *timelineView) drawLanes(events []Mark, ejections []Ejection, x func(float64) float64, top float64) (float64, []string) {
	epLane, epNames := endpointLanes(events, ejections)
	laneOf, lanes, packed := assignLanes(events, x)
	lane := func(e Mark) int { return laneOf[e.Call] }
	if epNames != nil {
		lanes, packed = len(epNames), false
		lane = func(e Mark) int { return epLane[e.Endpoint] }
	}
	pitch, markH := 12.0, 8.0 // whole units keep the coordinates short
	if lanes > 24 {           // then maxRows lanes take at most 280 units
		pitch, markH = 7.0, 5.0
	}
	// A hedge runs beside an attempt of its call, on the same lane: it is
	// drawn over the lower part of the lane, after the others, so that the
	// attempt it ran beside still shows above it.
	hedgeH := math.Ceil(markH * 0.6)
	groups := make([]markGroup, 2*len(markKinds)) // then the hedges'
	for i, k := range markKinds {
		groups[i] = markGroup{Class: k.class, H: markH}
		groups[len(markKinds)+i] = markGroup{Class: k.class, H: hedgeH}
	}
	nums := attemptNumbers(events)
	for i, e := range events {
		x0 := x(e.AtMs)
		m := svgMark{
			X:     x0,
			Y:     top + float64(lane(e))*pitch + math.Floor((pitch-markH)/2),
			W:     math.Max(x(e.AtMs+math.Max(e.Millis, 0))-x0, minMarkW),
			Title: markTitle(e, nums[i]),
		}
		g := &groups[kindIndex(e)]
		switch {
		case e.Hedge:
			m.Y += markH - hedgeH
			g = &groups[len(markKinds)+kindIndex(e)]
			tl.Hedges = append(tl.Hedges, svgBar{X: m.X, Y: m.Y, W: m.W, H: hedgeH})
		case nums[i] > 1: // a retry: a notch just before it
			tl.Retries = append(tl.Retries, svgMark{X: x0 - 2, Y: m.Y - 1, W: 1.5})
		}
		g.Marks = append(g.Marks, m)
	}
	tl.Marks, tl.MarkH, tl.NotchH = groups, markH, markH+2
	if epNames == nil && !packed { // a lane per call: its commit status at the lane's end
		commits := map[int]string{}
		for _, e := range events {
			if e.Commit != "" {
				commits[e.Call] = e.Commit
			}
		}
		for call, l := range laneOf {
			if st, ok := commits[call]; ok {
				c := newCommitSymbol(st, commitX, top+float64(l)*pitch+pitch/2, math.Min(3.5, pitch/2-0.5))
				c.Title = fmt.Sprintf("call %d: %s", call, commitWords(st))
				tl.Commits = append(tl.Commits, *c)
			}
		}
		sort.Slice(tl.Commits, func(i, j int) bool { return tl.Commits[i].Y < tl.Commits[j].Y })
	}

	var notes []string
	switch {
	case epNames != nil:
		labels, port := laneNames(epNames)
		for i, l := range labels {
			tl.RowLabels = append(tl.RowLabels, svgLabel{X: plotLeft - 6, Y: top + float64(i)*pitch + 9, Text: l})
		}
		if port != "" {
			notes = append(notes, "every endpoint on port "+port)
		}
		for _, j := range ejections {
			x0 := x(j.AtMs)
			tl.Ejected = append(tl.Ejected, svgBar{X: x0, Y: top + float64(epLane[j.Endpoint])*pitch, W: math.Max(x(j.AtMs+j.Millis)-x0, minMarkW), H: pitch,
				Class: "ejected", Title: fmt.Sprintf("%s ejected at %s for %s", j.Endpoint, humanMs(j.AtMs), humanMs(j.Millis))})
		}
		notes = append(notes, "one lane per endpoint, shaded while it was ejected")
	case packed:
		tl.RowLabels = []svgLabel{{X: plotLeft - 6, Y: top + 8, Text: "attempts"}}
		notes = append(notes, fmt.Sprintf("%d calls packed into %d lanes, a call's attempts on one lane", len(laneOf), lanes))
	case pitch < 12: // too tight to name every lane
		tl.RowLabels = []svgLabel{{X: plotLeft - 6, Y: top + 8, Text: "calls"}}
		notes = append(notes, fmt.Sprintf("one lane per call, %d lanes in call order from the top", lanes))
	default:
		for call, lane := range laneOf {
			tl.RowLabels = append(tl.RowLabels, svgLabel{X: plotLeft - 6, Y: top + float64(lane)*pitch + 9, Text: "call " + strconv.Itoa(call)})
		}
		sort.Slice(tl.RowLabels, func(i, j int) bool { return tl.RowLabels[i].Y < tl.RowLabels[j].Y })
		notes = append(notes, "one lane per call")
	}
	return float64(lanes) * pitch, notes
}

// laneNames names the endpoints' lanes in the room on the left: without
// the port when all share it (returned, for the caption), and an address
// too long cut to its end. The lane of none is "none".
func laneNames(eps []string) (labels []string, port string) {
	ports := map[string]bool{}
	for _, ep := range eps {
		if ap, err := netip.ParseAddrPort(ep); err == nil {
			ports[strconv.Itoa(int(ap.Port()))] = true
		} else if ep != "" {
			ports[""] = true
		}
	}
	if len(ports) == 1 {
		for p := range ports {
			port = p
		}
	}
	for _, ep := range eps {
		l := ep
		if ap, err := netip.ParseAddrPort(ep); err == nil && port != "" {
			l = ap.Addr().String()
		}
		if r := []rune(l); len(r) > 9 {
			l = "…" + string(r[len(r)-8:])
		}
		labels = append(labels, cmp.Or(l, "none"))
	}
	return labels, port
}

// endpointLanes gives each endpoint a lane, in the order of their
// addresses, when the attempts name their endpoints (Config.Endpoints),
// and a last lane, named "", to the attempts that reached none (rejected
// before the pick); nil when no attempt names one or there are more than
// maxRows.
func endpointLanes(events []Mark, ejections []Ejection) (map[string]int, []string) {
	seen := map[string]bool{}
	for _, e := range events {
		seen[e.Endpoint] = true
	}
	for _, j := range ejections {
		seen[j.Endpoint] = true
	}
	names := slices.SortedFunc(maps.Keys(seen), func(a, b string) int {
		pa, ea := netip.ParseAddrPort(a)
		pb, eb := netip.ParseAddrPort(b)
		switch {
		case a == "" || b == "": // the lane of none last
			return cmp.Compare(b, a)
		case ea == nil && eb == nil:
			return pa.Compare(pb)
		}
		return cmp.Compare(a, b)
	})
	if len(names) == 0 || names[0] == "" || len(names) > maxRows {
		return nil, nil
	}
	lanes := make(map[string]int, len(names))
	for i, n := range names {
		lanes[n] = i
	}
	return lanes, names
}

// assignLanes puts each call on a lane, so that a call's retries line up on
// one row. With up to maxRows calls each gets its own lane, in call order.
// With more, calls are packed greedily, in SVG units so that minimum-width
// marks count: a call goes on the first lane that is free when it starts,
// and if none is, on the lane that frees up first — the only case in which
// marks may overlap.
func assignLanes(events []Mark, x func(float64) float64) (laneOf map[int]int, lanes int, packed bool) {
	type span struct {
		call       int
		start, end float64
	}
	byCall := make(map[int]*span)
	var calls []*span
	for _, e := range events {
		x0 := x(e.AtMs)
		x1 := math.Max(x(e.AtMs+math.Max(e.Millis, 0)), x0+minMarkW)
		sp, ok := byCall[e.Call]
		if !ok {
			sp = &span{call: e.Call, start: x0, end: x1}
			byCall[e.Call] = sp
			calls = append(calls, sp)
		}
		sp.start, sp.end = math.Min(sp.start, x0), math.Max(sp.end, x1)
	}
	laneOf = make(map[int]int, len(calls))
	if len(calls) <= maxRows {
		sort.Slice(calls, func(i, j int) bool { return calls[i].call < calls[j].call })
		for i, c := range calls {
			laneOf[c.call] = i
		}
		return laneOf, len(calls), false
	}
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].start < calls[j].start })
	var laneEnd []float64
	for _, c := range calls {
		lane := -1
		for i, end := range laneEnd {
			if end+1 <= c.start {
				lane = i
				break
			}
		}
		if lane < 0 && len(laneEnd) < maxRows {
			lane = len(laneEnd)
			laneEnd = append(laneEnd, 0)
		}
		if lane < 0 {
			lane = 0
			for i := range laneEnd {
				if laneEnd[i] < laneEnd[lane] {
					lane = i
				}
			}
		}
		laneEnd[lane] = math.Max(laneEnd[lane], c.end)
		laneOf[c.call] = lane
	}
	return laneOf, len(laneEnd), true
}

// histogram draws attempts by the count: histBuckets columns over the
// scenario, each stacking the attempts of every kind that started in it,
// scaled so that the fullest column is height tall. Nothing is left out and
// the page stays small; what is lost is the single attempt and its tooltip.
func histogram(events []Mark, end float64, x func(float64) float64, top, height float64) (bars []svgBar, labels []svgLabel, bucketMs float64) {
	bucketMs = end / histBuckets
	counts := make([][len(markKinds)]int, histBuckets)
	totals := make([]int, histBuckets)
	most := 1
	for _, e := range events {
		b := min(max(int(e.AtMs/bucketMs), 0), histBuckets-1)
		counts[b][kindIndex(e)]++
		totals[b]++
		most = max(most, totals[b])
	}
	for b, c := range counts {
		x0, x1 := x(float64(b)*bucketMs), x(float64(b+1)*bucketMs)
		y := top + height
		for k, n := range c {
			if n == 0 {
				continue
			}
			h := float64(n) / float64(most) * height
			y -= h
			bars = append(bars, svgBar{
				X: x0, Y: y, W: math.Max(x1-x0-0.6, 0.5), H: math.Max(h, 0.5),
				Class: markKinds[k].class,
				Title: fmt.Sprintf("%d of %d attempts %s · started from %s to %s",
					n, totals[b], markKinds[k].verb, humanMs(float64(b)*bucketMs), humanMs(float64(b+1)*bucketMs)),
			})
		}
	}
	// A y axis of sorts: the count of the fullest column, and zero; the
	// caption says what a column is.
	labels = []svgLabel{
		{X: plotLeft - 6, Y: top + 8, Text: "max " + strconv.Itoa(most)},
		{X: plotLeft - 6, Y: top + height, Text: "0"},
	}
	return bars, labels, bucketMs
}

// legendItems lays the legend out from baseline y, on more rows when one
// is full: the kinds of attempt, retries and hedges and the commit
// statuses if the picture draws any, then the breaker's states.
func (tl *timelineView) legendItems(y float64) []legendItem {
	l := legend{x: plotLeft, y: y}
	for _, k := range markKinds[:5] { // "other" is rare; not worth the room
		l.add(legendItem{Class: k.class, Text: k.legend})
	}
	if len(tl.Retries) > 0 {
		l.add(legendItem{Class: "a-rej", Text: "retry (attempt 2 or later)", Notch: true})
	}
	if len(tl.Hedges) > 0 {
		l.add(legendItem{Class: "a-rej", Text: "hedge", Hatch: true})
	}
	if len(tl.Commits) > 0 {
		seen := map[string]bool{}
		for _, c := range tl.Commits {
			seen[c.Class] = true
		}
		for _, c := range []struct{ status, class, text string }{
			{"committed", "c-yes", "call committed"}, {"not committed", "c-no", "call not committed"},
			{"unknown", "c-unk", "call's commit status unknown"}, {"", "c-other", "other commit status"},
		} {
			if seen[c.class] {
				l.add(legendItem{Text: c.text, Sym: newCommitSymbol(c.status, 0, 0, 3.5)})
			}
		}
	}
	l.x += 12
	l.together(legendItem{Class: "s-closed", Text: "CLOSED"}, legendItem{Class: "s-open", Text: "OPEN"},
		legendItem{Class: "s-half", Text: "HALF_OPEN"}, legendItem{Class: "s-other", Text: "other state"})
	if len(tl.Ejected) > 0 {
		l.add(legendItem{Class: "ejected", Text: "endpoint ejected"})
	}
	return l.items
}

// legend lays legend items out in rows from (x, y), the first row's
// baseline.
type legend struct {
	x, y  float64
	items []legendItem
}

// width is the room it takes in a row, and its swatch's.
func (it legendItem) width() (w, swatch float64) {
	swatch = 14.0 // the swatch and the room after it
	if it.Line {
		swatch = 26
	}
	return swatch + float64(len(it.Text))*5.8, swatch
}

// together adds items on one row: a new one if they do not fit in what is
// left of this one.
func (l *legend) together(items ...legendItem) {
	w := 0.0
	for _, it := range items {
		iw, _ := it.width()
		w += iw + 16
	}
	if l.x+w-16 > svgWidth && l.x > plotLeft {
		l.x, l.y = plotLeft, l.y+16
	}
	for _, it := range items {
		l.add(it)
	}
}

func (l *legend) add(it legendItem) {
	w, sw := it.width()
	if l.x+w > svgWidth {
		l.x, l.y = plotLeft, l.y+16
	}
	it.X, it.Y, it.BoxY, it.TX = l.x, l.y, l.y-9, l.x+sw
	if it.Sym != nil {
		*it.Sym = *newCommitSymbol(statusOf(it.Sym.Class), l.x+5, l.y-4, it.Sym.R)
	}
	it.LX2, it.LY = l.x+sw-4, l.y-4
	l.items = append(l.items, it)
	l.x += w + 16
}

// statusOf is the commit status a symbol's class draws.
func statusOf(class string) string {
	return map[string]string{"c-yes": "committed", "c-no": "not committed", "c-unk": "unknown"}[class]
}

// chartView is a scenario's series drawn as line charts, one panel above
// the other, on the time axis of its timeline: the bulkhead's limit and the
// attempts in flight, the calls' latency, and the calls per second by what
// they came to (and by criticality, when the calls had levels).
type chartView struct {
	Width, Height       float64
	PlotLeft, PlotRight float64
	LabelX              float64
	Grid                []svgTick
	GridBottom          float64
	Panels              []panelView
	AxisY, TickY2       float64
	TickTextY           float64
	Ticks               []svgTick
	Caption             string
}

type panelView struct {
	Title       string
	Top, Bottom float64 // of the plot area
	TitleY      float64 // the baseline of the title and the legend
	YTicks      []svgLabel
	Lines       []lineView
	Legend      []legendItem
}

// lineView is one line of a panel: a path of Points points.
type lineView struct {
	Class  string
	D      string
	Points int
	Title  string
}

// Geometry of a chart's panels.
const (
	panelHead = 20.0 // the title and legend row above a panel
	panelH    = 76.0
	panelGap  = 14.0
)

// lineSpec is one line to draw: its class, legend, and value at a sample
// (ok false for none, such as a latency where no call was answered).
type lineSpec struct {
	class, legend string
	value         func(Sample) (float64, bool)
}

// buildChart draws s's series, nil when it has none.
func buildChart(s *ScenarioResult) *chartView {
	series := boundSeries(s.Series, maxSeriesPoints)
	if len(series) == 0 {
		return nil
	}
	end := scenarioEnd(s)
	x := func(ms float64) float64 { return plotLeft + math.Min(math.Max(ms, 0), end)/end*plotWidth }
	c := &chartView{Width: svgWidth, PlotLeft: plotLeft, PlotRight: plotLeft + plotWidth, LabelX: plotLeft - 6}

	var panels [][]lineSpec
	var titles, units []string
	has := func(f func(Sample) bool) bool { return slices.ContainsFunc(series, f) }
	if has(func(p Sample) bool { return p.Limit > 0 || p.InFlight > 0 }) {
		panels = append(panels, []lineSpec{
			{"ln-limit", "limit", func(p Sample) (float64, bool) { return float64(p.Limit), true }},
			{"ln-inflight", "attempts in flight", func(p Sample) (float64, bool) { return float64(p.InFlight), true }},
		})
		titles, units = append(titles, "Bulkhead"), append(units, "")
	}
	if has(func(p Sample) bool { return p.Answered > 0 }) {
		lat := func(q func(Sample) float64) func(Sample) (float64, bool) {
			return func(p Sample) (float64, bool) { return q(p), p.Answered > 0 }
		}
		panels = append(panels, []lineSpec{
			{"ln-p50", "median", lat(func(p Sample) float64 { return p.P50Ms })},
			{"ln-p99", "99th percentile", lat(func(p Sample) float64 { return p.P99Ms })},
		})
		titles, units = append(titles, "Latency of the calls answered"), append(units, " ms")
	}
	rate := func(n func(Sample) int) func(Sample) (float64, bool) {
		return func(p Sample) (float64, bool) { return float64(n(p)) / p.Millis * 1000, p.Millis > 0 }
	}
	var calls []lineSpec
	levels := seriesLevels(series)
	for _, lv := range levels { // a colour per level; answered solid, refused dashed, failed dotted
		class := map[string]string{"critical": "ln-crit", "sheddable": "ln-shed"}[lv]
		if class == "" {
			class = "ln-lvl"
		}
		calls = append(calls,
			lineSpec{class, lv + " answered", rate(func(p Sample) int { return p.ByLevel[lv].Answered })},
			lineSpec{class + " dash", lv + " refused", rate(func(p Sample) int { return p.ByLevel[lv].Rejected })})
		if has(func(p Sample) bool { return p.ByLevel[lv].Failed > 0 }) {
			calls = append(calls, lineSpec{class + " dot", lv + " failed", rate(func(p Sample) int { return p.ByLevel[lv].Failed })})
		}
	}
	if len(levels) == 0 {
		calls = append(calls,
			lineSpec{"ln-ok", "answered", rate(func(p Sample) int { return p.Answered })},
			lineSpec{"ln-rej", "refused locally", rate(func(p Sample) int { return p.Rejected })})
		if has(func(p Sample) bool { return p.Failed > 0 }) {
			calls = append(calls, lineSpec{"ln-fail", "failed otherwise", rate(func(p Sample) int { return p.Failed })})
		}
	}
	panels = append(panels, calls)
	titles, units = append(titles, "Calls ended per second"), append(units, "/s")
	if len(levels) > 0 {
		titles[len(titles)-1] += ", by criticality"
	}

	y := 0.0
	for i, specs := range panels {
		pv := panelView{Title: titles[i], TitleY: y + 14}
		// The legend after the title, on its row, and more if it needs
		// them: the plot area comes below.
		l := legend{x: plotLeft + float64(len(pv.Title))*6.6 + 20, y: pv.TitleY}
		for _, sp := range specs {
			l.add(legendItem{Class: sp.class, Text: sp.legend, Line: true})
		}
		pv.Legend = l.items
		pv.Top = l.y + panelHead - 14
		pv.Bottom = pv.Top + panelH
		top := 0.0
		for _, sp := range specs {
			for _, p := range series {
				if v, ok := sp.value(p); ok && !math.IsNaN(v) && !math.IsInf(v, 0) {
					top = math.Max(top, v)
				}
			}
		}
		step, top := niceScale(top, 3)
		ys := func(v float64) float64 { return pv.Bottom - math.Min(math.Max(v, 0), top)/top*panelH }
		decimals := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
		for k := 0; float64(k)*step <= top*(1+1e-9); k++ {
			v := float64(k) * step
			pv.YTicks = append(pv.YTicks, svgLabel{X: plotLeft - 6, Y: ys(v) + 4, Text: strconv.FormatFloat(v, 'f', decimals, 64) + units[i]})
		}
		for _, sp := range specs {
			var d strings.Builder
			n, cmd := 0, "M"
			for _, p := range series {
				v, ok := sp.value(p)
				if !ok || math.IsNaN(v) || math.IsInf(v, 0) {
					cmd = "M" // a gap: the line starts again after it
					continue
				}
				d.WriteString(cmd + svgNum(x(p.AtMs)) + " " + svgNum(ys(v)))
				cmd = "L"
				n++
			}
			pv.Lines = append(pv.Lines, lineView{Class: sp.class, D: d.String(), Points: n, Title: sp.legend})
		}
		c.Panels = append(c.Panels, pv)
		y = pv.Bottom + panelGap
	}
	c.AxisY = y - panelGap + 6
	c.GridBottom = c.AxisY
	c.Ticks = timeTicks(end, x)
	c.Grid = c.Ticks
	c.TickY2, c.TickTextY = c.AxisY+4, c.AxisY+16
	c.Height = c.TickTextY + 6

	every := make([]float64, 0, len(s.Series))
	for _, p := range s.Series {
		every = append(every, p.Millis)
	}
	slices.Sort(every)
	c.Caption = fmt.Sprintf("%d samples, about every %s on the drill's clock: the bulkhead's limit and the attempts holding a slot as they were at each sample; "+
		"the latency and the count of the calls that ended since the sample before.", len(s.Series), humanMs(every[len(every)/2]))
	if len(series) < len(s.Series) {
		c.Caption += fmt.Sprintf(" Drawn as %d points, neighbouring samples merged.", len(series))
	}
	return c
}

// seriesLevels returns the criticality levels the series splits its calls
// by: critical first, sheddable last.
func seriesLevels(series []Sample) []string {
	seen := map[string]bool{}
	for _, p := range series {
		for k := range p.ByLevel {
			seen[k] = true
		}
	}
	rank := func(l string) int { return map[string]int{"critical": -1, "sheddable": 1}[l] }
	return slices.SortedFunc(maps.Keys(seen), func(a, b string) int { return cmp.Or(cmp.Compare(rank(a), rank(b)), cmp.Compare(a, b)) })
}

// boundSeries returns series with at most n samples: groups of neighbours
// merged into one, as the drill merges its own (the counts summed, the
// bulkhead as it was at the group's last sample, the latency's median
// weighted by the calls answered and its 99th percentile the group's
// highest).
func boundSeries(series []Sample, n int) []Sample {
	if len(series) <= n {
		return series
	}
	k := (len(series) + n - 1) / n
	var out []Sample
	for i := 0; i < len(series); i += k {
		g := series[i:min(i+k, len(series))]
		m := g[len(g)-1]
		m.Millis, m.Answered, m.Rejected, m.Failed, m.P50Ms, m.P99Ms, m.ByLevel = 0, 0, 0, 0, 0, 0, nil
		for _, p := range g {
			m.Millis += p.Millis
			m.Answered += p.Answered
			m.Rejected += p.Rejected
			m.Failed += p.Failed
			m.P50Ms += p.P50Ms * float64(p.Answered)
			m.P99Ms = math.Max(m.P99Ms, p.P99Ms)
			for lv, c := range p.ByLevel {
				if m.ByLevel == nil {
					m.ByLevel = map[string]LevelCounts{}
				}
				m.ByLevel[lv] = addCounts(m.ByLevel[lv], c)
			}
		}
		if m.Answered > 0 {
			m.P50Ms /= float64(m.Answered)
		}
		out = append(out, m)
	}
	return out
}

// niceScale returns a round step (1, 2 or 5 times a power of ten) that
// divides [0, top] into about want parts, and top rounded up to it; at
// least 1 when everything is 0.
func niceScale(top float64, want int) (step, max float64) {
	if !(top > 0) {
		return 1, 1
	}
	pow := math.Pow(10, math.Floor(math.Log10(top/float64(want))))
	step = pow
	for _, f := range []float64{2, 5, 10} {
		if top/step > float64(want) {
			step = f * pow
		}
	}
	return step, math.Ceil(top/step-1e-9) * step
}

type tickValue struct {
	ms    float64
	label string
}

// niceTicks returns about want ticks over [0, end] ms at a round step
// (1, 2 or 5 times a power of ten, whichever gives closest to want ticks),
// labelled in ms, or in s from 2 s on.
func niceTicks(end float64, want int) []tickValue {
	pow := math.Pow(10, math.Floor(math.Log10(end/float64(want))))
	step := pow
	for _, f := range []float64{2, 5, 10} {
		if math.Abs(end/(f*pow)-float64(want)) < math.Abs(end/step-float64(want)) {
			step = f * pow
		}
	}
	unit, div := "ms", 1.0
	if end >= 2000 {
		unit, div = "s", 1000
	}
	decimals := max(0, int(-math.Floor(math.Log10(step/div)+1e-9)))
	var ticks []tickValue
	for i := 0; ; i++ {
		v := float64(i) * step
		if v > end*(1+1e-9) {
			break
		}
		ticks = append(ticks, tickValue{ms: v, label: strconv.FormatFloat(v/div, 'f', decimals, 64) + " " + unit})
	}
	return ticks
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{"n": svgNum}).Parse(pageHTML))

// The page. CSS classes carry the colours so that each mark is only a few
// attributes; the SVG scales with the page through its viewBox.
const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>outbound drill: {{.Verdict}}</title>
<style>
:root{--ok:#2f9e44;--fail:#f76707;--ns:#1c7ed6;--amb:#9c36b5;--rej:#868e96;--oth:#495057;--pass:#2b8a3e;--bad:#c92a2a}
body{margin:0;background:#f1f3f5;color:#212529;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1080px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:22px;margin:0 0 6px}
h2{font-size:17px;margin:0 0 4px;word-break:break-all}
h3{font-size:13px;margin:14px 0 4px;color:#495057;text-transform:uppercase;letter-spacing:.04em}
a{color:#1864ab;text-decoration:none}
a:hover{text-decoration:underline}
.meta{color:#495057;margin:0}
.meta span{margin-right:18px;white-space:nowrap}
.badge{display:inline-block;padding:1px 8px;border-radius:4px;color:#fff;font-weight:700;font-size:12px;letter-spacing:.03em}
h1 .badge{font-size:18px;padding:2px 12px;vertical-align:1px}
.pass{background:var(--pass)}
.fail{background:var(--bad)}
.card{background:#fff;border:1px solid #dee2e6;border-radius:8px;padding:16px 20px;margin:18px 0}
table{border-collapse:collapse;width:100%}
th,td{padding:5px 8px;border-bottom:1px solid #e9ecef;text-align:left;vertical-align:top}
th{font-size:12px;color:#495057;font-weight:600;background:#f8f9fa}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.summary td{font-size:13px}
.title{margin:0 0 8px}
.expect{margin:0;padding:8px 12px;background:#f8f9fa;border-left:3px solid #adb5bd}
tr.failed td{background:#fff5f5}
figure{margin:14px 0 0}
figcaption{font-size:12px;color:#495057;margin-top:2px}
svg.timeline{display:block;width:100%;height:auto}
svg text{font:11px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;fill:#495057}
svg .band text{fill:#212529;font-weight:600;text-anchor:middle}
svg text.lbl{text-anchor:end;font-weight:400}
svg .tk text{text-anchor:middle}
svg .tk text.end{text-anchor:end}
.grid line{stroke:#e9ecef}
.tl line{stroke:#868e96;stroke-dasharray:2 3}
.axis{stroke:#868e96}
.s-closed{fill:#8ce99a}.s-open{fill:#ff8787}.s-half{fill:#ffd43b}.s-other{fill:#ced4da}
.a-ok{fill:var(--ok)}.a-fail{fill:var(--fail)}.a-ns{fill:var(--ns)}.a-amb{fill:var(--amb)}.a-rej{fill:var(--rej)}.a-other{fill:var(--oth)}.ejected{fill:var(--fail);opacity:.18}
.notch{fill:#212529}.hatch{pointer-events:none}
.c-yes{fill:var(--ok)}.c-no{fill:#fff;stroke:var(--oth);stroke-width:1.6}.c-unk{fill:var(--amb)}.c-other{fill:var(--oth)}
svg.chart{display:block;width:100%;height:auto}
svg.chart text.ttl{font-weight:600;fill:#212529}
.chart path,.chart line.sw{fill:none;stroke-width:1.6;stroke-linejoin:round}
.ln-limit{stroke:#212529}.chart path.ln-limit{stroke-width:2.2}.ln-inflight{stroke:var(--ns)}.ln-p50{stroke:var(--ns)}.ln-p99{stroke:var(--amb)}
.ln-ok{stroke:var(--ok)}.ln-rej{stroke:var(--bad)}.ln-fail{stroke:var(--fail)}.ln-crit{stroke:#1864ab}.ln-shed{stroke:#e8590c}.ln-lvl{stroke:var(--oth)}.dash{stroke-dasharray:6 3}.dot{stroke-dasharray:1.5 2.5}
dl.config{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:2px 12px;margin:0;font-size:12.5px}
dl.config dt{font-weight:600;color:#495057}
dl.config dd{margin:0;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-word}
</style>
</head>
<body>
<main>
<header class="card">
<h1>outbound drill <span class="badge {{if .Passed}}pass{{else}}fail{{end}}">{{.Verdict}}</span></h1>
<p class="meta"><span>ran {{.Started}}</span><span>took {{.Duration}}</span><span>{{.GoVersion}}</span><span>outbound {{.Version}}</span><span>{{.PassedN}} scenario{{if ne .PassedN 1}}s{{end}} passed, {{.FailedN}} failed</span></p>
</header>
<div class="card">
<table class="summary">
<thead><tr><th>scenario</th><th>protocol</th><th>verdict</th><th>calls</th><th>executions</th><th>attempts by category</th><th title="committed / not committed / unknown">commits<br>yes / no / unknown</th><th>rejections by guard</th><th>retries</th><th>duration</th></tr></thead>
<tbody>
{{range .Scenarios}}<tr{{if not .Passed}} class="failed"{{end}}><td><a href="#{{.Anchor}}">{{.Name}}</a></td><td>{{.Protocol}}</td><td><span class="badge {{if .Passed}}pass">PASSED{{else}}fail">FAILED{{end}}</span></td><td class="n">{{.Calls}}</td><td class="n">{{.Executions}}</td><td>{{.Attempts}}</td><td class="n">{{.Commits}}</td><td>{{.Rejections}}</td><td class="n">{{.Retries}}</td><td class="n">{{.Duration}}</td></tr>
{{else}}<tr><td colspan="10">no scenarios</td></tr>
{{end}}</tbody>
</table>
</div>
{{range .Scenarios}}
<section class="card scenario" id="{{.Anchor}}">
<h2>{{.Name}} <span class="badge {{if .Passed}}pass">PASSED{{else}}fail">FAILED{{end}}</span></h2>
<p class="title">{{.Title}} <span class="meta">· {{.Protocol}} · {{.Duration}}</span></p>
<h3>What a correct client must do</h3>
<p class="expect">{{if .Expect}}{{.Expect}}{{else}}—{{end}}</p>
{{with .Settings}}<h3>Configuration</h3>
<dl class="config">{{range .}}<dt>{{.Key}}</dt><dd>{{.Value}}</dd>{{end}}</dl>
{{end}}<h3>Checks</h3>
<table class="checks">
<thead><tr><th>what</th><th>want</th><th>got</th><th>verdict</th></tr></thead>
<tbody>
{{range .Checks}}<tr{{if not .Passed}} class="failed"{{end}}><td>{{.What}}</td><td>{{.Want}}</td><td>{{.Got}}</td><td><span class="badge {{if .Passed}}pass">pass{{else}}fail">fail{{end}}</span></td></tr>
{{else}}<tr><td colspan="4">no checks</td></tr>
{{end}}</tbody>
</table>
<h3>Timeline</h3>
<figure>
{{template "timeline" .Timeline}}
<figcaption>{{.Timeline.Caption}}</figcaption>
</figure>
{{with .Chart}}<h3>Load over time</h3>
<figure>
{{template "chart" .}}
<figcaption>{{.Caption}}</figcaption>
</figure>
{{end}}</section>
{{end}}
<div id="render-check" hidden data-scenarios="" data-svgs="" data-sections=""></div>
</main>
<script>
// Proves in a browser that every scenario's pictures were drawn, for a
// test to read back from the hidden element: a timeline counts if its SVG
// has the breaker band and was laid out with a width; per section, what
// was laid out with a size.
addEventListener("load", function () {
  function drawn(el) { var b = el.getBoundingClientRect(); return b.width > 0 && b.height > 0; }
  function count(root, sel) {
    var n = 0, els = root ? root.querySelectorAll(sel) : [];
    for (var i = 0; i < els.length; i++) if (drawn(els[i])) n++;
    return n;
  }
  var sections = document.querySelectorAll("section.scenario"), ok = 0, per = [];
  for (var i = 0; i < sections.length; i++) {
    var sec = sections[i], svg = sec.querySelector("svg.timeline");
    if (svg && svg.querySelector("g.band rect") && svg.getBoundingClientRect().width > 0) ok++;
    var lines = [], paths = sec.querySelectorAll("svg.chart path.line");
    for (var j = 0; j < paths.length; j++) {
      var d = paths[j].getAttribute("d") || "";
      lines.push({cls: paths[j].getAttribute("class"), points: (d.match(/[ML]/g) || []).length,
        length: Math.round(paths[j].getTotalLength()), drawn: paths[j].getBoundingClientRect().width > 0});
    }
    var thin = 0, band = svg ? svg.querySelectorAll("g.band rect") : [];
    for (var j = 0; j < band.length; j++) if (band[j].getBoundingClientRect().width < 1.5) thin++;
    var legend = [], texts = sec.querySelectorAll("g.legend text");
    for (var j = 0; j < texts.length; j++) legend.push(texts[j].textContent);
    per.push({id: sec.id, lines: lines, thinBand: thin, legend: legend,
      commits: count(sec, "g.commits > *"), retries: count(sec, "g.retries rect"), hedges: count(sec, "g.hedges rect"),
      config: count(sec, "dl.config dd")});
  }
  var el = document.getElementById("render-check");
  el.setAttribute("data-scenarios", sections.length);
  el.setAttribute("data-svgs", ok);
  el.setAttribute("data-sections", JSON.stringify(per));
  el.setAttribute("data-height", el.getBoundingClientRect().height);
});
</script>
</body>
</html>
{{define "timeline"}}<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{n .Width}} {{n .Height}}" role="img" aria-label="timeline">
<defs><pattern id="{{.HatchID}}" width="3.5" height="3.5" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="1.6" height="3.5" fill="#fff" fill-opacity=".75"/></pattern></defs>
<g class="grid">{{range .Grid}}<line x1="{{n .X}}" x2="{{n .X}}" y1="0" y2="{{n $.AxisY}}"/>{{end}}</g>
<g class="band"><text class="lbl" x="{{n .LabelX}}" y="{{n .BandTextY}}">breaker</text>
{{range .Band}}<rect class="{{.Class}}" x="{{n .X}}" y="{{n $.BandY}}" width="{{n .W}}" height="{{n $.BandH}}"><title>{{.Title}}</title></rect>{{if .Label}}<text x="{{n .LX}}" y="{{n $.BandTextY}}">{{.Label}}</text>{{end}}
{{end}}</g>
<g class="tl">{{range .Lines}}<line x1="{{n .}}" x2="{{n .}}" y1="{{n $.BandBottom}}" y2="{{n $.LinesY2}}"/>{{end}}</g>
<g>{{range .RowLabels}}<text class="lbl" x="{{n .X}}" y="{{n .Y}}">{{.Text}}</text>{{end}}{{with .Empty}}<text x="{{n .X}}" y="{{n .Y}}" text-anchor="middle">{{.Text}}</text>{{end}}</g>
<g class="marks">
{{range .Ejected}}<rect class="{{.Class}}" x="{{n .X}}" y="{{n .Y}}" width="{{n .W}}" height="{{n .H}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Marks}}{{if .Marks}}<g class="{{.Class}}">{{$h := .H}}
{{range .Marks}}<rect x="{{n .X}}" y="{{n .Y}}" width="{{n .W}}" height="{{n $h}}"><title>{{.Title}}</title></rect>
{{end}}</g>
{{end}}{{end}}{{range .Bars}}<rect class="{{.Class}}" x="{{n .X}}" y="{{n .Y}}" width="{{n .W}}" height="{{n .H}}"><title>{{.Title}}</title></rect>
{{end}}</g>
{{with .Hedges}}<g class="hedges hatch" fill="url(#{{$.HatchID}})">{{range .}}<rect x="{{n .X}}" y="{{n .Y}}" width="{{n .W}}" height="{{n .H}}"/>{{end}}</g>
{{end}}{{with .Retries}}<g class="retries notch">{{range .}}<rect x="{{n .X}}" y="{{n .Y}}" width="{{n .W}}" height="{{n $.NotchH}}"/>{{end}}</g>
{{end}}{{with .Commits}}<g class="commits">{{range .}}{{template "sym" .}}{{end}}</g>
{{end}}<g class="tk"><line class="axis" x1="{{n .PlotLeft}}" x2="{{n .PlotRight}}" y1="{{n .AxisY}}" y2="{{n .AxisY}}"/>
{{range .Ticks}}<line class="axis" x1="{{n .X}}" x2="{{n .X}}" y1="{{n $.AxisY}}" y2="{{n $.TickY2}}"/><text{{if .End}} class="end"{{end}} x="{{n .X}}" y="{{n $.TickTextY}}">{{.Label}}</text>{{end}}</g>
<g class="legend">{{range .Legend}}{{template "swatch" .}}{{if .Hatch}}<rect class="hatch" fill="url(#{{$.HatchID}})" x="{{n .X}}" y="{{n .BoxY}}" width="10" height="10"/>{{end}}<text x="{{n .TX}}" y="{{n .Y}}">{{.Text}}</text>{{end}}</g>
</svg>{{end}}
{{define "swatch"}}{{if .Sym}}{{template "sym" .Sym}}{{else if .Line}}<line class="sw {{.Class}}" x1="{{n .X}}" x2="{{n .LX2}}" y1="{{n .LY}}" y2="{{n .LY}}"/>{{else}}<rect class="{{.Class}}" x="{{n .X}}" y="{{n .BoxY}}" width="10" height="10"/>{{end}}{{if .Notch}}<rect class="notch" x="{{n .X}}" y="{{n .BoxY}}" width="2" height="10"/>{{end}}{{end}}
{{define "sym"}}{{if .Diamond}}<polygon class="{{.Class}}" points="{{.Points}}">{{else}}<circle class="{{.Class}}" cx="{{n .X}}" cy="{{n .Y}}" r="{{n .R}}">{{end}}{{with .Title}}<title>{{.}}</title>{{end}}{{if .Diamond}}</polygon>{{else}}</circle>{{end}}{{end}}
{{define "chart"}}<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{n .Width}} {{n .Height}}" role="img" aria-label="load over time">
<g class="grid">{{range .Grid}}<line x1="{{n .X}}" x2="{{n .X}}" y1="0" y2="{{n $.GridBottom}}"/>{{end}}</g>
{{range .Panels}}<g class="panel">
<text class="ttl" x="{{n $.PlotLeft}}" y="{{n .TitleY}}">{{.Title}}</text>
<g class="legend">{{range .Legend}}{{template "swatch" .}}<text x="{{n .TX}}" y="{{n .Y}}">{{.Text}}</text>{{end}}</g>
<line class="axis" x1="{{n $.PlotLeft}}" x2="{{n $.PlotRight}}" y1="{{n .Bottom}}" y2="{{n .Bottom}}"/><line class="axis" x1="{{n $.PlotLeft}}" x2="{{n $.PlotLeft}}" y1="{{n .Top}}" y2="{{n .Bottom}}"/>
{{range .YTicks}}<text class="lbl" x="{{n .X}}" y="{{n .Y}}">{{.Text}}</text>{{end}}
{{range .Lines}}{{if .D}}<path class="line {{.Class}}" d="{{.D}}"><title>{{.Title}}</title></path>{{end}}
{{end}}</g>
{{end}}<g class="tk"><line class="axis" x1="{{n .PlotLeft}}" x2="{{n .PlotRight}}" y1="{{n .AxisY}}" y2="{{n .AxisY}}"/>
{{range .Ticks}}<line class="axis" x1="{{n .X}}" x2="{{n .X}}" y1="{{n $.AxisY}}" y2="{{n $.TickY2}}"/><text{{if .End}} class="end"{{end}} x="{{n .X}}" y="{{n $.TickTextY}}">{{.Label}}</text>{{end}}</g>
</svg>{{end}}`

// timeTicks are the time axis's ticks up to end ms, placed by x. A label is
// about 6.4 units per character: if the last one, centred, would stick out
// of the picture, it ends at its tick.
func timeTicks(end float64, x func(float64) float64) []svgTick {
	var ticks []svgTick
	for _, v := range niceTicks(end, 6) {
		overflows := x(v.ms)+float64(len(v.label))*3.2 > svgWidth
		ticks = append(ticks, svgTick{X: x(v.ms), Label: v.label, End: overflows})
	}
	return ticks
}
