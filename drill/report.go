package drill

import "time"

// Report is the result of a drill: what the JSON output prints and what the
// HTML report draws.
type Report struct {
	Version   string           `json:"version"`
	GoVersion string           `json:"go_version"`
	Started   time.Time        `json:"started"`
	Millis    float64          `json:"duration_ms"`
	Passed    bool             `json:"passed"`
	Scenarios []ScenarioResult `json:"scenarios"`
}

// ScenarioResult is one scenario's run.
type ScenarioResult struct {
	Name     string  `json:"name"`     // e.g. "recovery-under-backpressure"
	Title    string  `json:"title"`    // one line for people
	Protocol string  `json:"protocol"` // "HTTP1", "H2C", "H2TLS"
	Expect   string  `json:"expect"`   // what a correct client must do
	Passed   bool    `json:"passed"`
	Millis   float64 `json:"duration_ms"`
	Checks   []Check `json:"checks"`

	Calls      int            `json:"calls"`
	Executions int            `json:"executions"`           // as counted by the upstream
	Attempts   map[string]int `json:"attempts_by_category"` // "Answered", "NotSent", "Ambiguous", "LocalRejection"
	Commits    map[string]int `json:"commits"`              // "committed", "not committed", "unknown"
	Rejections map[string]int `json:"rejections_by_guard"`  // "circuit", "rate", "bulkhead"
	Retries    int            `json:"retries"`

	// Timeline, in milliseconds from the scenario's start.
	Transitions []Transition `json:"transitions"`
	Events      []Mark       `json:"events"`
	Ejections   []Ejection   `json:"ejections,omitempty"` // with Config.Endpoints

	// Series is sampled while the scenario runs, on its clock, in at most
	// 240 samples whatever its length (neighbours merge as it grows): the
	// overload and fleet scenarios, whose attempts are too many to keep
	// one by one, record it.
	Series []Sample `json:"series,omitempty"`

	// Config is the configuration the scenario's client was built from,
	// for people, by part ("MaxAttempts", "Timeouts", "Breaker", "Rate",
	// "Bulkhead", "Hedging", "Endpoints", …): the fields set, by their
	// names in outbound.Config and its parts; "defaults" or "none" for a
	// part left zero.
	Config map[string]string `json:"config,omitempty"`
}

// Sample is one point of a scenario's series: the state of its upstream's
// bulkhead at AtMs, and what the calls that ended in the Millis before it
// came to.
type Sample struct {
	AtMs     float64 `json:"at_ms"`
	Millis   float64 `json:"duration_ms"` // the interval the counts and latencies are of
	Limit    int     `json:"limit"`       // the bulkhead's limit at AtMs (adaptive: as it was then); 0 without a bulkhead
	InFlight int     `json:"in_flight"`   // attempts holding a bulkhead slot at AtMs
	// The calls that ended in the interval: answered, refused by a local
	// guard (not sent), and failed otherwise.
	Answered int `json:"answered"`
	Rejected int `json:"rejected"`
	Failed   int `json:"failed"`
	// Percentiles of the latency of the calls answered in the interval,
	// 0 when none was.
	P50Ms float64 `json:"latency_p50_ms"`
	P99Ms float64 `json:"latency_p99_ms"`
	// ByLevel splits the counts by the calls' criticality ("critical",
	// "sheddable"), when the scenario marks its calls.
	ByLevel map[string]LevelCounts `json:"by_level,omitempty"`
}

// LevelCounts is what the calls of one criticality level came to.
type LevelCounts struct {
	Answered int `json:"answered"`
	Rejected int `json:"rejected"`
	Failed   int `json:"failed"`
}

// Ejection is an endpoint kept out of the picks, from AtMs for Millis.
type Ejection struct {
	AtMs     float64 `json:"at_ms"`
	Millis   float64 `json:"duration_ms"`
	Endpoint string  `json:"endpoint"`
}

// Check is one verdict: what must hold, and what was seen.
type Check struct {
	What   string `json:"what"`
	Want   string `json:"want"`
	Got    string `json:"got"`
	Passed bool   `json:"passed"`
}

// Transition is a breaker state change. The breaker starts CLOSED at 0.
type Transition struct {
	AtMs   float64 `json:"at_ms"`
	From   string  `json:"from"` // "CLOSED", "OPEN", "HALF_OPEN", …
	To     string  `json:"to"`
	Reason string  `json:"reason"`
}

// Mark is one attempt, drawn as a mark on the timeline.
type Mark struct {
	AtMs     float64 `json:"at_ms"` // when it started
	Millis   float64 `json:"duration_ms"`
	Call     int     `json:"call"`     // which call (1-based) it belongs to
	Category string  `json:"category"` // "Answered", "NotSent", "Ambiguous", "LocalRejection"
	Status   int     `json:"status,omitempty"`
	Guard    string  `json:"guard,omitempty"`    // for LocalRejection
	Failure  bool    `json:"failure"`            // an upstream failure for the breaker (e.g. a 503)
	Endpoint string  `json:"endpoint,omitempty"` // where it went, with Config.Endpoints
	// Attempt is its number in its call, in the order the attempts
	// started (1 is the first); Hedge, that it was sent beside another of
	// the call that had not answered yet, and Lost, that it was cancelled
	// because another answered first. A retry is an attempt after the
	// first that is no hedge.
	Attempt int  `json:"attempt,omitempty"`
	Hedge   bool `json:"hedge,omitempty"`
	Lost    bool `json:"lost,omitempty"`
	// Commit is the call's commit status ("committed", "not committed",
	// "unknown"), on the call's last attempt only.
	Commit string `json:"commit,omitempty"`
}
