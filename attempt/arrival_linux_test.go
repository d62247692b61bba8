package attempt

import (
	"net"
	"testing"
	"time"
)

// The socket tells how many bytes it holds that nothing has read: the fact
// Arrival relies on to see an HTTP/1 answer that has reached the machine
// before net/http's reader (on Linux, SIOCINQ).
func TestTheSocketTellsHowManyBytesWaitUnread(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := newCountingConn(d)
	defer c.Close()
	server := <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	defer server.Close()

	var a Arrival
	a.watch(c)
	if n := c.unread(); n != 0 || a.Arriving() {
		t.Fatalf("before any byte: %d unread, arriving %v", n, a.Arriving())
	}
	if _, err := server.Write([]byte("HTTP/")); err != nil {
		t.Fatal(err)
	}
	// Loopback delivers as the write returns; the wait is a bound, not a
	// pause.
	for end := time.Now().Add(5 * time.Second); c.unread() < 5 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	if n := c.unread(); n != 5 || !a.Arriving() {
		t.Fatalf("5 bytes sent: %d unread, arriving %v", n, a.Arriving())
	}
	buf := make([]byte, 2)
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	if n := c.unread(); n != 3 {
		t.Fatalf("2 of 5 read: %d unread, want 3", n)
	}
	buf = make([]byte, 3)
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	if n := c.unread(); n != 0 || !a.Arriving() {
		t.Fatalf("all read: %d unread, arriving %v; want 0, and arriving (bytes were read since the watch)", n, a.Arriving())
	}
	var b Arrival
	b.watch(c)
	if b.Arriving() {
		t.Fatal("a watch begun after the bytes were read says they are arriving")
	}
	var none *Arrival
	if none.Arriving() {
		t.Fatal("a nil Arrival says arriving")
	}
}
