// Package criticality says, through a call's context, how important the
// call is: when an upstream is overloaded, the client-side throttle
// refuses the sheddable calls first, the bulkhead keeps room for the
// critical ones, and sheddable calls stop retrying and hedging first, as
// Google's SRE book describes client-side throttling by criticality. The
// breaker and the rate limiter treat every level alike.
//
//	ctx = criticality.With(ctx, criticality.Sheddable) // a prefetch
//
// It changes what the guards admit, never what an attempt's outcome
// teaches the breaker or an endpoint's ejection.
package criticality

import (
	"context"
	"strconv"
)

// Level is a call's criticality. The zero value is Default.
type Level int8

const (
	// Sheddable calls are refused first: prefetches, batch work,
	// anything that can be done later or not at all.
	Sheddable Level = -1
	// Default is every call not marked otherwise.
	Default Level = 0
	// Critical calls are what the service exists for: refused last, with
	// room kept for them.
	Critical Level = 1
)

func (l Level) String() string {
	switch l {
	case Sheddable:
		return "sheddable"
	case Default:
		return "default"
	case Critical:
		return "critical"
	}
	return "Level(" + strconv.Itoa(int(l)) + ")"
}

type key struct{}

// With returns a copy of ctx under which calls have level l (clamped to
// Sheddable…Critical).
func With(ctx context.Context, l Level) context.Context {
	return context.WithValue(ctx, key{}, min(max(l, Sheddable), Critical))
}

// Of returns the level ctx carries: Default unless With set one.
func Of(ctx context.Context) Level {
	if ctx == nil {
		return Default
	}
	l, _ := ctx.Value(key{}).(Level)
	return l
}
