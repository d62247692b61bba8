//go:build mutate

package mutate

import "sync/atomic"

// Enabled reports whether the switches can be turned on: this build has
// the tag mutate.
const Enabled = true

// Switch is a deliberate fault, off until Store(true).
type Switch struct{ on atomic.Bool }

// Load reports whether the fault is on.
func (s *Switch) Load() bool { return s.on.Load() }

// Store turns the fault on or off.
func (s *Switch) Store(on bool) { s.on.Store(on) }
