package attempt

import (
	"sync/atomic"
	"syscall"
)

// Arrival watches an attempt for the first bytes of its answer, so that a
// hedge timer can tell an attempt whose answer has reached the machine but
// not yet its caller — the client is behind, not the upstream — from one
// the upstream has not answered. On a busy machine the first is common: in
// BenchmarkHedging (16 callers, 2 cores) about two in five of the hedges
// whose first attempt then won were sent after the upstream had answered
// it, a millisecond on average before the hedge. A hedge then adds load and
// cuts nothing: its own answer waits on the same busy client.
//
// Its zero value is ready to use; Options.Arrival gives it to an attempt.
type Arrival struct {
	// on is the HTTP/1 connection the attempt waits on, and read what had
	// been read from it when the attempt took it: read is stored before
	// on, so that a reader that sees on sees its read.
	on    atomic.Pointer[countingConn]
	read  atomic.Int64
	first atomic.Bool // net/http has read the answer's first byte
}

// watch notes that the attempt is alone on the HTTP/1 connection c: every
// byte that comes on it is the attempt's answer.
func (a *Arrival) watch(c *countingConn) {
	a.read.Store(c.read.Load())
	a.on.Store(c)
}

func (a *Arrival) gotFirstByte() { a.first.Store(true) }

// Arriving reports whether the first bytes of the attempt's answer have
// reached the machine: net/http has read its first byte, or, on an HTTP/1
// connection that has answered before (which carries the attempt alone),
// bytes have been read from it since the attempt took it or wait unread in
// its socket. False when nothing says so — no connection yet, or a system
// where a socket is not asked what it holds (only Linux is) — and for a nil
// Arrival.
func (a *Arrival) Arriving() bool {
	if a == nil {
		return false
	}
	if a.first.Load() {
		return true
	}
	c := a.on.Load()
	return c != nil && (c.read.Load() > a.read.Load() || c.unread() > 0)
}

// unread returns how many bytes the socket under c holds that nothing has
// read yet, 0 when that cannot be told.
func (c *countingConn) unread() int {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return 0
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	if rc.Control(func(fd uintptr) { n = socketUnread(fd) }) != nil {
		return 0
	}
	return n
}
