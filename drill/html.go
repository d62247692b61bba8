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
// with the checks and a timeline picture: the breaker state as a coloured
// band, the attempts as marks below it, a time axis and a legend. Everything
// taken from the report is escaped by html/template: names, titles and checks
// are data, not markup.
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
	plotRight  = 14.0 // room for a minimum-width mark at the very end
	plotWidth  = svgWidth - plotLeft - plotRight
	bandTop    = 6.0
	bandHeight = 22.0
	minMarkW   = 2.0 // an attempt shorter than this is still visible
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
}

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
		p.Scenarios = append(p.Scenarios, scenarioView{
			ScenarioResult: s,
			Anchor:         anchorFor(s.Name, i, used),
			Duration:       humanMs(s.Millis),
			Attempts:       fmtCounts(s.Attempts, []string{"Answered", "NotSent", "Ambiguous", "LocalRejection"}),
			Commits:        fmtCommits(s.Commits),
			Rejections:     fmtCounts(s.Rejections, []string{"circuit", "rate", "bulkhead"}),
			Timeline:       buildTimeline(s),
		})
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
	Bars      []svgBar  // a histogram when there are too many (see histogram)
	Ejected   []svgBar  // an endpoint's ejections, on its lane
	Empty     *svgLabel // "no attempts" note, when there are none
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
// their class.
type markGroup struct {
	Class string
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

// markTitle is the tooltip of one attempt.
func markTitle(e Mark) string {
	var b strings.Builder
	b.WriteString(orDash(e.Category))
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
	fmt.Fprintf(&b, " · call %d · at %s for %s", e.Call, humanMs(e.AtMs), humanMs(e.Millis))
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

	for _, sp := range stateSpans(s.Transitions, end) {
		seg := bandSegment{
			X:     x(sp.From),
			W:     math.Max(x(sp.To)-x(sp.From), 0.5),
			Class: stateClass(sp.State),
			Title: fmt.Sprintf("%s from %s to %s", orDash(sp.State), humanMs(sp.From), humanMs(sp.To)),
		}
		if sp.Reason != "" {
			seg.Title += " · " + sp.Reason
		}
		// Name the state only where the name fits: about 6.5 units per
		// character at the band's font size, plus some padding.
		if seg.W >= float64(len(sp.State))*6.5+10 {
			seg.Label, seg.LX = sp.State, seg.X+seg.W/2
		}
		tl.Band = append(tl.Band, seg)
	}

	top := bandTop + bandHeight + 10
	var lanesH float64
	var notes []string
	switch {
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
	for _, v := range niceTicks(end, 6) {
		// A label is about 6.4 units per character: if the last one,
		// centred, would stick out of the picture, end it at its tick.
		overflows := x(v.ms)+float64(len(v.label))*3.2 > svgWidth
		tl.Ticks = append(tl.Ticks, svgTick{X: x(v.ms), Label: v.label, End: overflows})
	}
	tl.Grid = tl.Ticks
	tl.TickY2, tl.TickTextY = tl.AxisY+4, tl.AxisY+16
	tl.Legend = legendItems(len(tl.Ejected) > 0, tl.AxisY+38)
	tl.Height = tl.Legend[len(tl.Legend)-1].Y + 8

	tl.Caption = fmt.Sprintf("%d attempts in %d calls over %s", len(s.Events), s.Calls, humanMs(end))
	if len(notes) > 0 {
		tl.Caption += "; " + strings.Join(notes, "; ")
	}
	tl.Caption += "."
	return tl
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
	groups := make([]markGroup, len(markKinds))
	for i, k := range markKinds {
		groups[i].Class = k.class
	}
	for _, e := range events {
		x0 := x(e.AtMs)
		g := &groups[kindIndex(e)]
		g.Marks = append(g.Marks, svgMark{
			X:     x0,
			Y:     top + float64(lane(e))*pitch + math.Floor((pitch-markH)/2),
			W:     math.Max(x(e.AtMs+math.Max(e.Millis, 0))-x0, minMarkW),
			Title: markTitle(e),
		})
	}
	tl.Marks, tl.MarkH = groups, markH

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
	case packed || pitch < 12: // too tight to name every lane
		tl.RowLabels = []svgLabel{{X: plotLeft - 6, Y: top + 8, Text: "attempts"}}
		notes = append(notes, fmt.Sprintf("%d calls packed into %d lanes, a call's attempts on one lane", len(laneOf), lanes))
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

// legendItems lays the legend out from baseline y, on a second row when
// the first is full.
func legendItems(ejected bool, y float64) []legendItem {
	items := make([]legendItem, 0, len(markKinds)+5)
	xpos := plotLeft
	add := func(class, text string) {
		w := 14 + float64(len(text))*5.8
		if xpos+w > svgWidth {
			xpos, y = plotLeft, y+16
		}
		items = append(items, legendItem{X: xpos, Y: y, BoxY: y - 9, Class: class, Text: text, TX: xpos + 14})
		xpos += w + 16
	}
	for _, k := range markKinds[:5] { // "other" is rare; not worth the room
		add(k.class, k.legend)
	}
	xpos += 12
	add("s-closed", "CLOSED")
	add("s-open", "OPEN")
	add("s-half", "HALF_OPEN")
	add("s-other", "other state")
	if ejected {
		add("ejected", "endpoint ejected")
	}
	return items
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
#render-check{font-size:11px;color:#868e96;margin-top:24px}
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
<h3>Checks</h3>
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
</section>
{{end}}
<div id="render-check" data-scenarios="" data-svgs="">Render check did not run.</div>
</main>
<script>
// Proves in a browser that every scenario's timeline was drawn: a section
// counts if its SVG has the breaker band and was laid out with a width.
addEventListener("load", function () {
  var sections = document.querySelectorAll("section.scenario"), ok = 0;
  for (var i = 0; i < sections.length; i++) {
    var svg = sections[i].querySelector("svg.timeline");
    if (svg && svg.querySelector("g.band rect") && svg.getBoundingClientRect().width > 0) ok++;
  }
  var el = document.getElementById("render-check");
  el.setAttribute("data-scenarios", sections.length);
  el.setAttribute("data-svgs", ok);
  el.textContent = "Render check: " + ok + " of " + sections.length + " timelines drawn.";
});
</script>
</body>
</html>
{{define "timeline"}}<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {{n .Width}} {{n .Height}}" role="img" aria-label="timeline">
<g class="grid">{{range .Grid}}<line x1="{{n .X}}" x2="{{n .X}}" y1="0" y2="{{n $.AxisY}}"/>{{end}}</g>
<g class="band"><text class="lbl" x="{{n .LabelX}}" y="{{n .BandTextY}}">breaker</text>
{{range .Band}}<rect class="{{.Class}}" x="{{n .X}}" y="{{n $.BandY}}" width="{{n .W}}" height="{{n $.BandH}}"><title>{{.Title}}</title></rect>{{if .Label}}<text x="{{n .LX}}" y="{{n $.BandTextY}}">{{.Label}}</text>{{end}}
{{end}}</g>
<g class="tl">{{range .Lines}}<line x1="{{n .}}" x2="{{n .}}" y1="{{n $.BandBottom}}" y2="{{n $.LinesY2}}"/>{{end}}</g>
<g>{{range .RowLabels}}<text class="lbl" x="{{n .X}}" y="{{n .Y}}">{{.Text}}</text>{{end}}{{with .Empty}}<text x="{{n .X}}" y="{{n .Y}}" text-anchor="middle">{{.Text}}</text>{{end}}</g>
<g class="marks">
{{range .Ejected}}<rect class="{{.Class}}" x="{{n .X}}" y="{{n .Y}}" width="{{n .W}}" height="{{n .H}}"><title>{{.Title}}</title></rect>
{{end}}{{range .Marks}}{{if .Marks}}<g class="{{.Class}}">
{{range .Marks}}<rect x="{{n .X}}" y="{{n .Y}}" width="{{n .W}}" height="{{n $.MarkH}}"><title>{{.Title}}</title></rect>
{{end}}</g>
{{end}}{{end}}{{range .Bars}}<rect class="{{.Class}}" x="{{n .X}}" y="{{n .Y}}" width="{{n .W}}" height="{{n .H}}"><title>{{.Title}}</title></rect>
{{end}}</g>
<g class="tk"><line class="axis" x1="{{n .PlotLeft}}" x2="{{n .PlotRight}}" y1="{{n .AxisY}}" y2="{{n .AxisY}}"/>
{{range .Ticks}}<line class="axis" x1="{{n .X}}" x2="{{n .X}}" y1="{{n $.AxisY}}" y2="{{n $.TickY2}}"/><text{{if .End}} class="end"{{end}} x="{{n .X}}" y="{{n $.TickTextY}}">{{.Label}}</text>{{end}}</g>
<g class="legend">{{range .Legend}}<rect class="{{.Class}}" x="{{n .X}}" y="{{n .BoxY}}" width="10" height="10"/><text x="{{n .TX}}" y="{{n .Y}}">{{.Text}}</text>{{end}}</g>
</svg>{{end}}`
