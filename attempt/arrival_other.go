//go:build !linux

package attempt

// socketUnread is 0 where this package does not ask a socket what it holds.
func socketUnread(uintptr) int { return 0 }
