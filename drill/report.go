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
}
