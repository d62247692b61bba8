package attempt

import "sync"

// idleList is the Attempter's list of idle connections across every address,
// most recently idle first, for MaxIdleConns, like net/http's idleLRU. With
// no limit it keeps nothing and costs nothing.
type idleList struct {
	max int // 0: no limit

	mu         sync.Mutex
	head, tail *conn
	n          int
}

// push puts c at the front, and returns the oldest idle connection if the
// list is now over its limit (taken off the list: the caller retires it).
func (l *idleList) push(c *conn) (oldest *conn) {
	if l.max <= 0 {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.listed {
		l.unlink(c)
	}
	c.listed, c.idlePrev, c.idleNext = true, nil, l.head
	if l.head != nil {
		l.head.idlePrev = c
	}
	l.head = c
	if l.tail == nil {
		l.tail = c
	}
	l.n++
	if l.n > l.max {
		oldest = l.tail
		l.unlink(oldest)
	}
	return oldest
}

// remove takes c off the list, if it is on it.
func (l *idleList) remove(c *conn) {
	if l.max <= 0 {
		return
	}
	l.mu.Lock()
	if c.listed {
		l.unlink(c)
	}
	l.mu.Unlock()
}

// unlink takes c, which is listed, off the list; l.mu must be held.
func (l *idleList) unlink(c *conn) {
	if c.idlePrev != nil {
		c.idlePrev.idleNext = c.idleNext
	} else {
		l.head = c.idleNext
	}
	if c.idleNext != nil {
		c.idleNext.idlePrev = c.idlePrev
	} else {
		l.tail = c.idlePrev
	}
	c.idlePrev, c.idleNext, c.listed = nil, nil, false
	l.n--
}

// len returns the number of idle connections listed.
func (l *idleList) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}
