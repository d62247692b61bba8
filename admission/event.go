package admission

import (
	"fmt"

	"github.com/outboundhq/outbound/admission/circuit"
	"github.com/outboundhq/outbound/classify"
)

// Kind says what happened at a guard.
type Kind uint8

const (
	Enter        Kind = iota + 1 // the guard admitted the attempt
	Reject                       // the guard refused the attempt
	Exit                         // the guard's permit was given back after the attempt
	Refund                       // the rate token was given back (the attempt never reached the wire), or the throttle let go of an attempt that says nothing of the upstream (counted neither way)
	Release                      // the circuit permission was given back without an outcome
	Success                      // the circuit permission was resolved as a success
	Failure                      // the circuit permission was resolved as a failure
	Transition                   // the breaker changed state (Event.Transition)
	LimitChanged                 // an adaptive bulkhead moved its limit (Event.Limit)
)

var kindNames = [...]string{Enter: "enter", Reject: "reject", Exit: "exit", Refund: "exit(refund)",
	Release: "release", Success: "exit(success)", Failure: "exit(failure)", Transition: "transition",
	LimitChanged: "limit"}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one step of an attempt through the guards, or a breaker
// transition.
type Event struct {
	Upstream   string
	Guard      classify.Guard
	Kind       Kind
	Err        error              // for Reject: why
	Transition circuit.Transition // for Transition
	Limit      [2]int             // for LimitChanged: the limit before and after
}

// String renders the event as the guard and what happened to it:
// "circuit-enter", "bulkhead-reject", "rate-exit(refund)", "circuit-release",
// "circuit-transition(CLOSED->OPEN)", "bulkhead-limit(20->40)".
func (e Event) String() string {
	switch e.Kind {
	case Transition:
		return fmt.Sprintf("circuit-transition(%v->%v)", e.Transition.From, e.Transition.To)
	case LimitChanged:
		return fmt.Sprintf("bulkhead-limit(%d->%d)", e.Limit[0], e.Limit[1])
	}
	return e.Guard.String() + "-" + e.Kind.String()
}
