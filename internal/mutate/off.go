//go:build !mutate

package mutate

// Enabled reports whether the switches can be turned on: this build does
// not have the tag mutate.
const Enabled = false

// Switch is a deliberate fault; without the tag mutate, always off.
type Switch struct{}

// Load reports false.
func (*Switch) Load() bool { return false }

// Store does nothing.
func (*Switch) Store(bool) {}
