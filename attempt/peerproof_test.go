package attempt_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outboundtest"
)

// What a failure proves depends on the peer that gave the proof. These tests
// reproduce the peers that give false or lost proofs.

// TestAResetFromAConnectionGoingAwayProvesNothing: HAProxy's hard-stop-after
// sends a GOAWAY whose last-stream-id covers every stream, then resets with
// REFUSED_STREAM the streams it has already forwarded to its backend
// (outboundtest.HardStop). The reset contradicts the GOAWAY: the stream is
// Ambiguous, a lifecycle failure (the breaker is not told), never NotSent.
func TestAResetFromAConnectionGoingAwayProvesNothing(t *testing.T) {
	for _, p := range h2protos {
		t.Run(p.String(), func(t *testing.T) {
			s := newServer(t, p)
			var ev events
			tr := newTransport(t, s, attempt.Config{Admission: admission.Config{OnEvent: ev.On}})
			if o := roundTrip(tr, newRequest(t, context.Background(), s, noBody, "warm")); o.status != 200 {
				t.Fatalf("warm-up: %+v", o)
			}
			s.Enqueue(outboundtest.HardStop(1))
			_, err := tr.RoundTrip(newRequest(t, context.Background(), s, replayable, "x"))
			ce := classifyError(t, err)
			if ce.Category != classify.Ambiguous || ce.Evidence != classify.EvidenceResetWhileDraining || !ce.Lifecycle {
				t.Fatalf("got %v (%v), lifecycle %v: %v", ce.Category, ce.Evidence, ce.Lifecycle, err)
			}
			if n := s.Executions("x"); n != 1 {
				t.Fatalf("executed %d times, want 1: the proxy forwarded it", n)
			}
			if n := ev.Count("circuit-exit(failure)"); n != 0 {
				t.Fatalf("the breaker recorded %d failures for a proxy shutting down", n)
			}
		})
	}
}

// TestARefusedStreamFromAnUntrustedUpstreamIsAmbiguous: HAProxy also answers
// REFUSED_STREAM, on a healthy connection, for a request its backend
// executed and then failed to answer (outboundtest.ResetStream with
// REFUSED_STREAM: executed, then refused). Config.DistrustRefusedStream
// names such upstreams: their REFUSED_STREAM proves nothing. Others keep
// trusting it.
func TestARefusedStreamFromAnUntrustedUpstreamIsAmbiguous(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	var asked []string
	var mu sync.Mutex
	distrust := newTransport(t, s, attempt.Config{DistrustRefusedStream: func(upstream string) bool {
		mu.Lock()
		asked = append(asked, upstream)
		mu.Unlock()
		return true
	}})
	trust := newTransport(t, s, attempt.Config{})
	s.Enqueue(outboundtest.ResetStream(http2.ErrCodeRefusedStream))
	_, err := distrust.RoundTrip(newRequest(t, context.Background(), s, replayable, "executed"))
	if ce := classifyError(t, err); ce.Category != classify.Ambiguous || ce.Evidence != classify.EvidenceRefusedUntrusted || ce.Lifecycle {
		t.Fatalf("distrusted: %v (%v), lifecycle %v: %v", ce.Category, ce.Evidence, ce.Lifecycle, err)
	}
	if s.Executions("executed") != 1 {
		t.Fatalf("executed %d times", s.Executions("executed"))
	}
	s.Enqueue(outboundtest.RefusedStream())
	_, err = trust.RoundTrip(newRequest(t, context.Background(), s, replayable, "refused"))
	if ce := classifyError(t, err); ce.Category != classify.NotSent || ce.Evidence != classify.EvidenceRefusedStream {
		t.Fatalf("trusted: %v (%v): %v", ce.Category, ce.Evidence, err)
	}
	// Asked only for the REFUSED_STREAM, with the upstream's key.
	s.Enqueue(outboundtest.ResetStream(http2.ErrCodeInternal))
	distrust.RoundTrip(newRequest(t, context.Background(), s, noBody, "internal"))
	if want := []string{"http://" + strings.TrimPrefix(s.URL, "http://")}; fmt.Sprint(asked) != fmt.Sprint(want) {
		t.Fatalf("DistrustRefusedStream asked %q, want %q", asked, want)
	}
}

// TestAGoAwayInTheSocketIsReadBeforeAFailedWriteEndsTheStream: a server that
// closes the connection right after its GOAWAY (HAProxy closing an idle
// HTTP/2 connection) makes a client still writing a request body fail with a
// broken pipe, and net/http then closes the connection, losing the GOAWAY it
// had not read yet — the stream would prove nothing, where net/http sometimes
// sees the GOAWAY. A write that fails because the peer closed is reported
// done until the reading side has reached the end of what the peer sent, so
// a GOAWAY that reached the client's socket is always read: every such round
// is NotSent. (The server closes with the body unread, so its kernel resets
// the connection, and may then drop a GOAWAY it had not transmitted yet: a
// round where the GOAWAY never reached the client can only be Ambiguous. The
// test watches the bytes the client's socket received — over h2c, where they
// can be read — and asks for NotSent wherever the GOAWAY was among them.)
func TestAGoAwayInTheSocketIsReadBeforeAFailedWriteEndsTheStream(t *testing.T) {
	for _, oneShot := range []bool{false, true} {
		t.Run(fmt.Sprintf("one-shot=%t", oneShot), func(t *testing.T) {
			s := newServer(t, outboundtest.H2C)
			base := s.Transport()
			var watched sync.Map // round id -> *goAwayWatch, for the connection dialed for it
			var round atomic.Value
			base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				w := &goAwayWatch{Conn: c}
				watched.Store(round.Load(), w)
				return w, nil
			}
			tr := newTransportWith(t, attempt.Config{HTTPTransport: base})
			seen := 0
			for i := range 40 {
				id := fmt.Sprint("round-", i)
				round.Store(id)
				s.Enqueue(outboundtest.GoAway(1, 0, false).WithAbruptClose())
				o := roundTrip(tr, largePost(t, s, id, oneShot))
				w, _ := watched.Load(id)
				got := w != nil && w.(*goAwayWatch).saw()
				if got {
					seen++
				}
				switch {
				case s.Executions(id) != 0:
					t.Fatalf("round %d: executed", i)
				case o.category == classify.NotSent && o.evidence != classify.EvidenceGoAwayAbove:
					t.Fatalf("round %d: NotSent on %v: %v", i, o.evidence, o.err)
				case got && o.category != classify.NotSent:
					t.Fatalf("round %d: the GOAWAY reached the socket, and the stream is %v at %v (%v): %v", i, o.category, o.stage, o.evidence, o.err)
				}
			}
			if seen < 20 {
				t.Fatalf("the GOAWAY reached the client in %d rounds of 40: the race was not reproduced", seen)
			}
		})
	}
}

// goAwayWatch is a client connection that notes whether a GOAWAY frame
// without debug data and with last-stream-id 0 and NO_ERROR (what
// GoAway(1, 0, false) sends) came in.
type goAwayWatch struct {
	net.Conn
	mu   sync.Mutex
	tail []byte // the last bytes read, for a frame split across reads
	got  bool
}

var goAwayFrame = []byte{0, 0, 8, byte(http2.FrameGoAway), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func (w *goAwayWatch) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	w.mu.Lock()
	buf := append(w.tail, p[:n]...)
	if bytes.Contains(buf, goAwayFrame) {
		w.got = true
	}
	w.tail = append(w.tail[:0], buf[max(0, len(buf)-len(goAwayFrame)):]...)
	w.mu.Unlock()
	return n, err
}

func (w *goAwayWatch) saw() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.got
}

// TestAnHTTP1RequestNetHTTPNeverWroteIsNotSentThoughTLSWroteItsCloseNotify
// reproduces the keep-alive race behind nginx over HTTP/1.1 with TLS: the
// server closed an idle connection; an attempt took the connection before
// net/http had noticed, and counted the bytes on its socket; then net/http
// noticed, closed the connection — and TLS wrote its close_notify alert,
// which the count sees — and failed the request without writing a byte of it
// ("http: server closed idle connection"). The attempt must take net/http's
// word over the byte count: NotSent, where it was Ambiguous and a POST was
// lost that net/http would have sent again. The window between the attempt's
// count and net/http taking the request is held open by the request's
// context, whose first lookup of an httptrace key (at the start of
// net/http's RoundTrip) lets the close through and waits for it.
func TestAnHTTP1RequestNetHTTPNeverWroteIsNotSentThoughTLSWroteItsCloseNotify(t *testing.T) {
	var executed atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		executed.Add(1)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	conns := make(chan *heldConn, 4)
	base := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}}
	base.Protocols = new(http.Protocols)
	base.Protocols.SetHTTP1(true)
	base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		hc := newHeldConn(c)
		conns <- hc
		return hc, nil
	}
	tr := newTransportWith(t, attempt.Config{HTTPTransport: base})
	warm, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	if o := roundTrip(tr, warm); o.status != 200 {
		t.Fatalf("warm-up: %+v", o)
	}
	hc := <-conns
	hc.hold() // what the server sends from now on is kept from net/http
	srv.CloseClientConnections()
	<-hc.peerGone // the server closed the idle connection; net/http does not know yet
	executed.Store(0)

	var written func() int64
	ctx := &traceLookupHook{Context: context.Background(), hook: func() {
		written = hc.writtenSince()
		hc.release()
		<-hc.closed // net/http saw the close and closed the connection
	}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"qty":1}`))
	o := roundTrip(tr, req)
	if written == nil || written() == 0 {
		t.Fatal("TLS wrote nothing when net/http closed the connection: the race was not reproduced")
	}
	if o.category != classify.NotSent || o.evidence != classify.EvidenceNothingWritten {
		t.Fatalf("got %v (%v): %v", o.category, o.evidence, o.err)
	}
	if n := executed.Load(); n != 0 {
		t.Fatalf("executed %d times", n)
	}
}

// traceLookupHook is a context that calls hook at the first lookup of a key
// of package net/http/httptrace: net/http's RoundTrip looks one up before it
// takes the request.
type traceLookupHook struct {
	context.Context
	hook func()
	once sync.Once
}

func (c *traceLookupHook) Value(key any) any {
	if reflect.TypeOf(key).PkgPath() == "net/http/httptrace" {
		c.once.Do(c.hook)
	}
	return c.Context.Value(key)
}

func classifyError(t *testing.T, err error) *classify.Error {
	t.Helper()
	o := fromError(err)
	if o.category == 0 {
		t.Fatalf("not a classified failure: %v", err)
	}
	ce, _ := o.err.(*classify.Error)
	if ce == nil {
		t.Fatalf("not a *classify.Error: %T %v", err, err)
	}
	return ce
}

// TestAStreamBelowAGoAwayWithAnErrorCodeIsAnUpstreamFailure: a stream left
// unanswered at or below the last id of a GOAWAY that carries an error code
// (INTERNAL_ERROR: a server in trouble) is not the connection's life: the
// breaker records it.
func TestAStreamBelowAGoAwayWithAnErrorCodeIsAnUpstreamFailure(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	tr := newTransport(t, s, attempt.Config{})
	s.Enqueue(outboundtest.Respond(200), outboundtest.GoAway(3, 1, false).WithErrCode(http2.ErrCodeInternal))
	outs, execs := concurrent(t, s, tr, 3)
	o := outs[2] // ordered by category: the Ambiguous one last
	ce, ok := o.err.(*classify.Error)
	if !ok || o.evidence != classify.EvidenceGoAwayAtOrBelow || execs[2] != 1 || ce.Lifecycle {
		t.Fatalf("stream at the last id of GOAWAY(INTERNAL_ERROR): %v (%v), executed %d: %#v", o.category, o.evidence, execs[2], o.err)
	}
}

// TestARequestThatCannotBeResentKeepsOffAConnectionAboutToBeClosedForIdling:
// a server closes a connection idle for its keep-alive timeout, and a
// request written as it does is lost if it cannot be sent again (a POST
// without a key, a one-shot body). The pool learns the timeout from the
// connections the server closed while idle (two alike), and such a request
// then takes a new connection rather than one idle for more than seven
// eighths of it; a GET, which the race costs only a transparent retry, keeps
// using it.
func TestARequestThatCannotBeResentKeepsOffAConnectionAboutToBeClosedForIdling(t *testing.T) {
	const timeout = 500 * time.Millisecond
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("HTTP/2=%t", h2), func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) }))
			srv.Config.IdleTimeout = timeout
			srv.EnableHTTP2 = h2
			srv.StartTLS()
			t.Cleanup(srv.Close)
			var dials atomic.Int32
			base := srv.Client().Transport.(*http.Transport).Clone()
			base.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
				dials.Add(1)
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}
			tr := newTransportWith(t, attempt.Config{HTTPTransport: base})
			call := func(method string, unretryable bool) {
				t.Helper()
				req, _ := http.NewRequest(method, srv.URL, nil)
				r, err := tr.Route(req)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := tr.AttemptOn(context.Background(), r, req, attempt.Options{AsIs: true, Unretryable: unretryable})
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			// Connections closed by the server for idling.
			for range 3 {
				before := dials.Load()
				call(http.MethodGet, false)
				if dials.Load() != before+1 {
					t.Fatalf("%d dials, want a new connection after the server closed the idle one", dials.Load()-before)
				}
				time.Sleep(timeout + timeout/2) // the server's idle timeout passes: a real server's timer, not a timing assertion
			}
			call(http.MethodGet, false)
			// Idle for more than seven eighths of the timeout, less than it:
			// fifteen sixteenths leave room for a late state hook (the
			// connection counts as idle from it), and past the timeout the
			// server's close sends the POST to a new connection anyway.
			time.Sleep(timeout * 15 / 16)
			before := dials.Load()
			call(http.MethodPost, true)
			if dials.Load() != before+1 {
				t.Fatalf("the POST took a connection idle for 7/8 of the server's timeout (%d dials)", dials.Load()-before)
			}
			time.Sleep(timeout / 8)
			before = dials.Load()
			call(http.MethodGet, false) // idle for an eighth of it: reused
			if dials.Load() != before {
				t.Fatalf("the GET dialed %d connections, want the idle one reused", dials.Load()-before)
			}
		})
	}
}
