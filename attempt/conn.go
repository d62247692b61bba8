package attempt

import (
	"context"
	"net"
	"sync/atomic"
)

// countingConn counts the bytes that reached the socket. It sits under TLS
// (net/http layers its own *tls.Conn over what DialContext returns, so ALPN
// still negotiates HTTP/2), so the count includes TLS records: sampled when an
// attempt starts on an established connection, the difference is what the
// attempt wrote.
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// dialNote carries, from the pool's dial to the wrapped DialContext, where
// to put the counting connection and whether the TCP dial itself succeeded.
type dialNote struct {
	conn   *countingConn
	dialed bool
}

type dialNoteKey struct{}

// countingDial wraps a DialContext so that every connection it opens is a
// countingConn, noted in the dial's context.
func countingDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc := &countingConn{Conn: c}
		if n, ok := ctx.Value(dialNoteKey{}).(*dialNote); ok {
			n.conn, n.dialed = cc, true
		}
		return cc, nil
	}
}
