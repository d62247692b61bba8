//go:build race

package circuit_test

// raceEnabled: the race detector changes how much the allocator hands out.
const raceEnabled = true
