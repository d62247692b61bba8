package attempt

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/outboundhq/outbound/internal/clock"
)

// countingConn counts the bytes that reached the socket. It sits under TLS
// (net/http layers its own *tls.Conn over what DialContext returns, so ALPN
// still negotiates HTTP/2), so the count includes TLS records: sampled when an
// attempt starts on an established connection, the difference is what the
// attempt wrote.
//
// On an HTTP/2 connection, a write that fails because the peer has closed
// the connection is reported as done (and not counted) until the reading
// side has reached the end of what the peer sent. A server that closes an
// HTTP/2 connection sends a GOAWAY first, and TCP delivers it before the
// close; but a write error makes net/http abort the writing stream and close
// the connection at once, losing a GOAWAY still unread in the socket — the
// stream would end with a broken pipe that proves nothing instead of the
// GOAWAY that proves it unprocessed (seen behind HAProxy closing idle
// connections). Waiting inside the failed write would not do: the writer
// holds net/http's write lock, which its reader needs to acknowledge a
// SETTINGS or a PING before it reaches the GOAWAY. Reported as done, the
// write frees the lock, the reader handles every frame the peer sent, then
// reads the close and ends every stream still open with what it proves.
// (Nothing more can reach the peer anyway.) Over HTTP/1 there is no such
// frame and a write error is returned as it is.
//
// While the pool holds the connection idle (idle), a read that returns —
// data, or the end — is the peer acting on an idle connection: the time of
// the first is kept (idleRead), so that the pool can learn how long the
// upstream lets a connection idle (pool.idleLimit) from the GOAWAY or the
// close it sent then.
type countingConn struct {
	net.Conn
	written   atomic.Int64
	read      atomic.Int64  // bytes read from it (Arrival)
	h2        atomic.Bool   // known to carry HTTP/2
	idle      atomic.Bool   // nothing in flight on it, as the pool sees it
	idleRead  atomic.Int64  // clock.Now of the first read that returned while idle, 0 for none
	readEnded chan struct{} // closed when a Read fails or the connection is closed
	endOnce   sync.Once
}

func newCountingConn(c net.Conn) *countingConn {
	return &countingConn{Conn: c, readEnded: make(chan struct{})}
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	if err != nil && c.h2.Load() && peerClosed(err) && !c.readsEnded() {
		return len(p), nil // see the type's documentation
	}
	return n, err
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	if c.idle.Load() && c.idleRead.Load() == 0 {
		c.idleRead.CompareAndSwap(0, clock.Now())
	}
	if err != nil {
		c.endReads()
	}
	return n, err
}

func (c *countingConn) Close() error {
	c.endReads()
	return c.Conn.Close()
}

func (c *countingConn) endReads() { c.endOnce.Do(func() { close(c.readEnded) }) }

func (c *countingConn) readsEnded() bool {
	select {
	case <-c.readEnded:
		return true
	default:
		return false
	}
}

// peerClosed reports whether a write failed because the peer had closed the
// connection: EPIPE, or ECONNRESET. Reads then return what the peer sent
// before it closed, and then fail: the reading side always reaches its end.
func peerClosed(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET)
}

// dialNote carries, from the pool's dial to the wrapped dialers, the proxy
// the call chose, and back where to put the counting connection, whether
// the TCP dial itself succeeded, and whether the connection came from the
// Transport's DialTLSContext (which dials TCP and TLS in one step).
type dialNote struct {
	proxy     *url.URL
	addr      string // the endpoint to dial instead of the address asked, if not empty
	conn      *countingConn
	dialed    bool
	customTLS bool
}

type dialNoteKey struct{}

// countingDial wraps a DialContext so that every connection it opens is a
// countingConn, noted in the dial's context.
func countingDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		n, _ := ctx.Value(dialNoteKey{}).(*dialNote)
		if n != nil && n.addr != "" {
			addr = n.addr
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc := newCountingConn(c)
		if n != nil {
			n.conn, n.dialed = cc, true
		}
		return cc, nil
	}
}

// countingTLSDial wraps a DialTLSContext. A *tls.Conn it returns is kept as
// it is: net/http negotiates HTTP/2 only over a *tls.Conn, so wrapping it
// would turn HTTP/2 off; its attempts learn what they wrote from a trace
// hook instead. Any other connection is counted like a plain one.
func countingTLSDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		n, _ := ctx.Value(dialNoteKey{}).(*dialNote)
		if n != nil {
			n.customTLS = true
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if _, ok := c.(*tls.Conn); ok {
			return c, nil
		}
		cc := newCountingConn(c)
		if n != nil {
			n.conn = cc
		}
		return cc, nil
	}
}
