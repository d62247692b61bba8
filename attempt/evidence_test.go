package attempt_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
)

// rawHTTP1 serves each accepted connection with serve, on loopback.
func rawHTTP1(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	return ln.Addr().String()
}

func readRequest(t *testing.T, br *bufio.Reader) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, req.Body)
	return true
}

// TestNoResponseByteErrorsOfThisGoVersion pins how net/http's HTTP/1 client
// (an http.ClientConn, as the attempt layer uses) says that a connection
// ended before the first byte of the response — the fact the keep-alive race
// is recognised by — and that a response cut short says something else.
func TestNoResponseByteErrorsOfThisGoVersion(t *testing.T) {
	for name, tc := range map[string]struct {
		answer string // written after the request, before the close
		want   bool
	}{
		"closed before any byte":          {"", true},
		"closed inside the status line":   {"HTTP/1.1 20", false},
		"closed inside the response head": {"HTTP/1.1 200 OK\r\nContent-Ty", false},
	} {
		t.Run(name, func(t *testing.T) {
			addr := rawHTTP1(t, func(c net.Conn, br *bufio.Reader) {
				if readRequest(t, br) {
					io.WriteString(c, tc.answer)
				}
			})
			cc, err := (&http.Transport{}).NewClientConn(context.Background(), "http", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
			_, err = cc.RoundTrip(req)
			// On a reused connection, with bytes written, only an error
			// that says no byte of the answer came is the keep-alive race.
			_, ev := classify.Failure(classify.Facts{Stage: classify.StageAwait, Written: 100, Reused: true, HTTP1: true, Err: err})
			if err == nil || (ev == classify.EvidenceIdleConnClosed) != tc.want {
				t.Fatalf("%T %q: evidence %v, keep-alive race wanted %t", err, err, ev, tc.want)
			}
		})
	}
}

// TestConnNotUsableTextOfThisGoVersion pins the error of a request that was
// to open a stream on an HTTP/2 connection that received a GOAWAY after the
// request's slot was reserved: nothing of it is written, and the upstream
// never sees it.
func TestConnNotUsableTextOfThisGoVersion(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	cc, err := s.Transport().NewClientConn(context.Background(), "http", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	get := func(id string) error {
		req := newRequest(t, context.Background(), s, noBody, id)
		resp, err := cc.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	if err := get("warm"); err != nil {
		t.Fatal(err)
	}
	if err := cc.Reserve(); err != nil {
		t.Fatal(err)
	}
	s.Enqueue(outboundtest.GoAway(1, 0, false))
	if err := get("above"); classify.HTTP2Evidence(err) != classify.EvidenceGoAwayAbove {
		t.Fatalf("the stream that took the GOAWAY: %v", err)
	}
	err = get("after")
	if classify.HTTP2Evidence(err) != classify.EvidenceConnShuttingDown || s.Received("after") != 0 {
		t.Fatalf("the reserved request after the GOAWAY: evidence %v from %q, received %d",
			classify.HTTP2Evidence(err), rootText(err), s.Received("after"))
	}
}

// TestConnNotEstablishedTextOfThisGoVersion pins the error of the first
// request on a new HTTP/2 connection that the server closed before the
// request could open a stream (seen behind nginx under load): the upstream
// never sees it, though the handshakes wrote bytes.
func TestConnNotEstablishedTextOfThisGoVersion(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	s.EnqueueConn(outboundtest.CloseOnAccept())
	cc, err := s.Transport().NewClientConn(context.Background(), "http", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Skipf("the connection failed before it was made, not the case pinned here: %v", err)
	}
	defer cc.Close()
	dead := whenUnusable(cc)
	select {
	case <-dead:
	case <-time.After(10 * time.Second):
		t.Fatal("the closed connection was never noticed")
	}
	_, err = cc.RoundTrip(newRequest(t, context.Background(), s, noBody, "first"))
	if classify.HTTP2Evidence(err) != classify.EvidenceConnNotEstablished || s.Received("first") != 0 {
		t.Fatalf("the first request of a connection closed at once: evidence %v from %q, received %d",
			classify.HTTP2Evidence(err), rootText(err), s.Received("first"))
	}
	if cat, _ := classify.Failure(classify.Facts{Stage: classify.StageAwait, Written: 120, Err: err}); cat != classify.NotSent {
		t.Fatalf("classified %v, want NotSent", cat)
	}
}

// The other form of the same fact: the server closed the connection while it
// was idle, and the next request finds it closed.
func TestServerClosedIdleTextOfThisGoVersion(t *testing.T) {
	addr := rawHTTP1(t, func(c net.Conn, br *bufio.Reader) {
		if readRequest(t, br) {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	cc, err := (&http.Transport{}).NewClientConn(context.Background(), "http", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	closed := whenUnusable(cc)
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	<-closed // the server closed the idle connection
	// Whatever bytes the connection's count shows, the error says nothing
	// of the request was written.
	_, err = cc.RoundTrip(req)
	if cat, ev := classify.Failure(classify.Facts{Stage: classify.StageAwait, Written: 100, Reused: true, HTTP1: true, Err: err}); cat != classify.NotSent || ev != classify.EvidenceNothingWritten {
		t.Fatalf("%T %q: %v (%v), want NotSent (nothing written)", err, err, cat, ev)
	}
}

// whenUnusable returns a channel closed when cc's state hook first sees it
// unusable (Err non-nil).
func whenUnusable(cc *http.ClientConn) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	cc.SetStateHook(func(cc *http.ClientConn) {
		if cc.Err() != nil {
			once.Do(func() { close(ch) })
		}
	})
	return ch
}
