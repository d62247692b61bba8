package attempt

import (
	"context"
	"crypto/tls"
	"net"
	"net/url"
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

// dialNote carries, from the pool's dial to the wrapped dialers, the proxy
// the call chose, and back where to put the counting connection, whether
// the TCP dial itself succeeded, and whether the connection came from the
// Transport's DialTLSContext (which dials TCP and TLS in one step).
type dialNote struct {
	proxy     *url.URL
	conn      *countingConn
	dialed    bool
	customTLS bool
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
		cc := &countingConn{Conn: c}
		if n != nil {
			n.conn = cc
		}
		return cc, nil
	}
}
