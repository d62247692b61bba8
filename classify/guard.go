package classify

import "fmt"

// Guard names the local guard that refused an attempt (Category
// LocalRejection, Evidence EvidenceLocalGuard): one of the four an attempt
// asks in turn.
type Guard uint8

const (
	GuardCircuit  Guard = iota + 1 // the circuit breaker
	GuardRate                      // the rate limiter
	GuardBulkhead                  // the bulkhead
	GuardThrottle                  // the client-side throttle, between the circuit breaker and the rate limiter
)

func (g Guard) String() string {
	switch g {
	case GuardCircuit:
		return "circuit"
	case GuardRate:
		return "rate"
	case GuardBulkhead:
		return "bulkhead"
	case GuardThrottle:
		return "throttle"
	}
	return fmt.Sprintf("Guard(%d)", uint8(g))
}
