package attempt

import "golang.org/x/sys/unix"

// socketUnread returns the bytes waiting in the socket fd, 0 on error.
func socketUnread(fd uintptr) int {
	n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	if err != nil {
		return 0
	}
	return n
}
