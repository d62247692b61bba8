package attempt_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboundhq/outbound/attempt"
)

// A connection carries at most MaxConnRequests requests, then takes no new
// one and is closed: 9 requests in turn over 3 connections, none failed.
// Without the limit, one connection carries them all.
func TestAConnectionCarriesAtMostMaxConnRequests(t *testing.T) {
	for _, p := range protos {
		for _, limit := range []int{0, 3} {
			t.Run(fmt.Sprintf("%v/limit %d", p, limit), func(t *testing.T) {
				s := newServer(t, p)
				tr := newTransport(t, s, attempt.Config{MaxConnRequests: limit})
				for i := range 9 {
					if o := roundTrip(tr, newRequest(t, context.Background(), s, noBody, fmt.Sprint(i))); o.err != nil || o.status != 200 {
						t.Fatalf("request %d: %+v", i, o)
					}
				}
				want := 1
				if limit > 0 {
					want = 9 / limit
				}
				if n := s.Conns(); n != want {
					t.Fatalf("%d connections for 9 requests, want %d", n, want)
				}
			})
		}
	}
}

// A connection MaxConnAge old takes no new request: with an age of a
// nanosecond every request goes to a new connection, and the old ones are
// closed (counted over TCP); with an hour, one connection carries them all.
func TestAConnectionMaxConnAgeOldTakesNoNewRequest(t *testing.T) {
	for _, p := range protos {
		for _, age := range []time.Duration{time.Nanosecond, time.Hour} {
			t.Run(fmt.Sprintf("%v/age %v", p, age), func(t *testing.T) {
				s := newServer(t, p)
				base := s.Transport()
				var open atomic.Int64
				dial := (&net.Dialer{}).DialContext
				base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
					c, err := dial(ctx, network, addr)
					if err == nil {
						open.Add(1)
						c = &closeCounted{Conn: c, open: &open}
					}
					return c, err
				}
				tr := newTransportWith(t, attempt.Config{HTTPTransport: base, MaxConnAge: age})
				for i := range 4 {
					if o := roundTrip(tr, newRequest(t, context.Background(), s, noBody, fmt.Sprint(i))); o.err != nil || o.status != 200 {
						t.Fatalf("request %d: %+v", i, o)
					}
				}
				want := 1
				if age == time.Nanosecond {
					want = 4
				}
				if n := s.Conns(); n != want || open.Load() == 0 {
					t.Fatalf("%d connections for 4 requests, want %d (%d open)", n, want, open.Load())
				}
				// The retired connections are closed once their request
				// ended (the last may still be open).
				for deadline := time.Now().Add(5 * time.Second); open.Load() > 1; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("%d connections still open, want at most 1", open.Load())
					}
				}
			})
		}
	}
}

// closeCounted counts a connection's Close once.
type closeCounted struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *closeCounted) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// Invalid limits are refused, naming the field.
func TestInvalidConnectionLimitsAreRefusedNamingTheField(t *testing.T) {
	for field, cfg := range map[string]attempt.Config{
		"MaxConnAge":      {MaxConnAge: -time.Second},
		"MaxConnRequests": {MaxConnRequests: -1},
	} {
		if _, err := attempt.New(cfg); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
}
