package outboundtest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/outboundhq/outbound/outboundtest"
)

var h2Protos = []outboundtest.Proto{outboundtest.H2C, outboundtest.H2TLS}

func forEachH2(t *testing.T, fn func(t *testing.T, p outboundtest.Proto)) {
	t.Helper()
	for _, p := range h2Protos {
		t.Run(p.String(), func(t *testing.T) { fn(t, p) })
	}
}

// RefusedStream is never executed. net/http re-sends a refused GET by itself
// (the server sees it twice); it cannot re-send a one-shot body.
func TestRefusedStreamIsNotExecuted(t *testing.T) {
	forEachH2(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		c := newClient(t, s)

		s.Enqueue(outboundtest.RefusedStream())
		resp, _, err := do(c, "GET", s.URL, "get", nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET: %v, %v; want 200 after net/http's own retry", resp, err)
		}
		log := s.Log()
		if s.Received("get") != 2 || s.Executions("get") != 1 || log[0].Executed || log[0].Fault != "RefusedStream()" || !log[1].Executed {
			t.Fatalf("GET: received %d, executed %d, log %+v; want the refused stream not executed and the retry executed",
				s.Received("get"), s.Executions("get"), log)
		}

		s.Enqueue(outboundtest.RefusedStream())
		_, _, err = do(c, "POST", s.URL, "post", io.NopCloser(strings.NewReader("one-shot")))
		if err == nil {
			t.Fatal("POST with a one-shot body succeeded after REFUSED_STREAM")
		}
		if s.Received("post") != 1 || s.Executions("post") != 0 {
			t.Errorf("POST: received %d, executed %d; want 1, 0", s.Received("post"), s.Executions("post"))
		}
	})
}

func TestResetStreamExecutesAndResets(t *testing.T) {
	forEachH2(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		c := newClient(t, s)
		s.Enqueue(outboundtest.ResetStream(http2.ErrCodeInternal))
		var first, next net.Addr
		_, _, err := doCtx(onConn(&first), c, "GET", s.URL, "x", nil)
		var se http2.StreamError
		if !errors.As(err, &se) || se.Code != http2.ErrCodeInternal {
			t.Fatalf("err = %v, want a stream error INTERNAL_ERROR", err)
		}
		if s.Executions("x") != 1 {
			t.Errorf("Executions = %d, want 1", s.Executions("x"))
		}
		// The connection survives a stream reset: the next request goes on
		// it. (Not "the server saw one connection": net/http may dial for
		// the next request before it sees the reset stream gone, and then
		// send it on the first connection after all, so the count is
		// sometimes 2; seen under load, one run in a few hundred.)
		resp, _, err := doCtx(onConn(&next), c, "GET", s.URL, "y", nil)
		if err != nil || resp.StatusCode != 200 || first == nil || next == nil || next.String() != first.String() {
			t.Errorf("next request: %v, %v on connection %v; want 200 on the reset stream's connection %v", resp, err, next, first)
		}
	})
}

// onConn returns a context whose request records in addr the local address
// of the connection it is sent on.
func onConn(addr *net.Addr) context.Context {
	return httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { *addr = i.Conn.LocalAddr() },
	})
}

// goAwayRound sends n concurrent GETs after a warm-up request, so that all of
// them share the warm connection (connection 1), and returns their errors by
// call id.
func goAwayRound(t *testing.T, s *outboundtest.Server, f outboundtest.Fault, n int) map[string]error {
	t.Helper()
	c := newClient(t, s)
	if _, _, err := do(c, "GET", s.URL, "warm", nil); err != nil {
		t.Fatal(err)
	}
	s.Enqueue(f)
	errs := make(map[string]error)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		id := fmt.Sprintf("call-%d", i)
		wg.Go(func() {
			resp, _, err := do(c, "GET", s.URL, id, nil)
			if err == nil && resp.StatusCode != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			mu.Lock()
			errs[id] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return errs
}

// goAwayRecords returns the records of the streams the GoAway fault covered.
func goAwayRecords(s *outboundtest.Server) (processed, refused []outboundtest.Record) {
	for _, r := range s.Log() {
		if !strings.HasPrefix(r.Fault, "GoAway(") {
			continue
		}
		if r.Executed {
			processed = append(processed, r)
		} else {
			refused = append(refused, r)
		}
	}
	return processed, refused
}

// GoAway(3, 1, true): of three streams in flight, only the first (lowest id)
// is executed on that connection; the GOAWAY's last stream id tells the client
// the other two were not, so net/http re-sends them on a new connection.
func TestGoAwayExecutesOnlyUpToLastStreamID(t *testing.T) {
	forEachH2(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		errs := goAwayRound(t, s, outboundtest.GoAway(3, 1, true), 3)
		for id, err := range errs {
			if err != nil {
				t.Errorf("%s: %v", id, err)
			}
			if s.Executions(id) != 1 {
				t.Errorf("%s executed %d times, want 1", id, s.Executions(id))
			}
		}
		processed, refused := goAwayRecords(s)
		if len(processed) != 1 || len(refused) != 2 {
			t.Fatalf("processed %+v, refused %+v; want 1 and 2", processed, refused)
		}
		for _, r := range refused {
			if r.StreamID <= processed[0].StreamID || r.ConnIndex != processed[0].ConnIndex {
				t.Errorf("refused stream %+v is not above the processed one %+v on the same connection", r, processed[0])
			}
		}
		if processed[0].Status != 200 {
			t.Errorf("processed stream answered %d, want 200", processed[0].Status)
		}
		for _, r := range s.Log() {
			if r.Executed && r.Fault != "Respond(200)" && r.ConnIndex == processed[0].ConnIndex && r != processed[0] {
				t.Errorf("another stream executed on the GOAWAY connection: %+v", r)
			}
		}
	})
}

// GoAway(3, 1, false): the processed stream gets no answer, the client gets an
// error for it, and the two streams above the last id are re-sent elsewhere.
func TestGoAwayWithoutAnswersLeavesTheProcessedStreamAmbiguous(t *testing.T) {
	forEachH2(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		errs := goAwayRound(t, s, outboundtest.GoAway(3, 1, false), 3)
		processed, refused := goAwayRecords(s)
		if len(processed) != 1 || len(refused) != 2 {
			t.Fatalf("processed %+v, refused %+v; want 1 and 2", processed, refused)
		}
		if errs[processed[0].ID] == nil || processed[0].Status != 0 {
			t.Errorf("the processed stream %+v got an answer", processed[0])
		}
		for _, r := range refused {
			if err := errs[r.ID]; err != nil {
				t.Errorf("%s, above the last stream id, was not re-sent: %v", r.ID, err)
			}
		}
		for id := range errs {
			if s.Executions(id) != 1 {
				t.Errorf("%s executed %d times, want 1", id, s.Executions(id))
			}
		}
	})
}

func TestGoAwayWithNothingProcessed(t *testing.T) {
	forEachH2(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		errs := goAwayRound(t, s, outboundtest.GoAway(2, 0, true), 2)
		processed, refused := goAwayRecords(s)
		if len(processed) != 0 || len(refused) != 2 {
			t.Fatalf("processed %+v, refused %+v; want 0 and 2", processed, refused)
		}
		for id, err := range errs {
			if err != nil || s.Executions(id) != 1 {
				t.Errorf("%s: %v, executed %d times; want re-sent and executed once", id, err, s.Executions(id))
			}
		}
	})
}

// When fewer streams than inFlight arrive, the GOAWAY goes out after the
// safety timeout with what has arrived. This test waits for that timeout.
func TestGoAwayFiresAfterTimeoutWithFewerStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the GoAway timeout")
	}
	s := newServer(t, outboundtest.H2C)
	errs := goAwayRound(t, s, outboundtest.GoAway(5, 1, true), 1)
	if err := errs["call-0"]; err != nil {
		t.Fatal(err)
	}
	processed, refused := goAwayRecords(s)
	if len(processed) != 1 || len(refused) != 0 {
		t.Fatalf("processed %+v, refused %+v; want 1 and 0", processed, refused)
	}
}

// A GOAWAY with a debug payload larger than any frame the client accepts.
func TestGoAwayHugeDebugData(t *testing.T) {
	forEachH2(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		errs := goAwayRound(t, s, outboundtest.GoAway(1, 1, true).WithDebugData(1<<20), 1)
		if errs["call-0"] == nil {
			t.Fatal("the client accepted a 1 MiB GOAWAY frame")
		}
		if s.Executions("call-0") != 1 {
			t.Errorf("Executions = %d, want 1", s.Executions("call-0"))
		}
	})
}

// TestGoAwayWithoutAnswersDrainsBeforeItCloses pins, frame by frame, how a
// GoAway fault that answers nothing ends its connection: the GOAWAY is
// followed by a PING, the connection stays usable while the client has not
// acknowledged it (here, the client's own PING is answered), and once the
// client has acknowledged it and reset the stream above the last id, the
// server closes the connection.
func TestGoAwayWithoutAnswersDrainsBeforeItCloses(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	s.Enqueue(outboundtest.GoAway(1, 0, false))
	nc, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fr := http2.NewFramer(nc, nc)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
		{Name: ":authority", Value: "x"}, {Name: ":path", Value: "/"}, {Name: strings.ToLower(outboundtest.IDHeader), Value: "above"}} {
		enc.WriteField(f)
	}
	if err := errors.Join(fr.WriteSettings(), fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1,
		BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true})); err != nil {
		t.Fatal(err)
	}
	// next returns the next frame that is neither SETTINGS nor WINDOW_UPDATE.
	next := func() http2.Frame {
		t.Helper()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("reading a frame: %v", err)
			}
			switch f.(type) {
			case *http2.SettingsFrame, *http2.WindowUpdateFrame:
				continue
			}
			return f
		}
	}
	ga, ok := next().(*http2.GoAwayFrame)
	if !ok || ga.LastStreamID != 0 || ga.ErrCode != http2.ErrCodeNo {
		t.Fatalf("want GOAWAY(last 0, NO_ERROR) first, got %v", ga)
	}
	ping, ok := next().(*http2.PingFrame)
	if !ok || ping.IsAck() {
		t.Fatalf("want a PING after the GOAWAY, got %v", ping)
	}
	// Not acknowledged yet: the connection is still there.
	mine := [8]byte{'c', 'l', 'i', 'e', 'n', 't'}
	if err := fr.WritePing(false, mine); err != nil {
		t.Fatal(err)
	}
	if ack, ok := next().(*http2.PingFrame); !ok || !ack.IsAck() || ack.Data != mine {
		t.Fatalf("want the ack of the client's PING, got %v", ack)
	}
	if err := errors.Join(fr.WritePing(true, ping.Data), fr.WriteRSTStream(1, http2.ErrCodeCancel)); err != nil {
		t.Fatal(err)
	}
	if f, err := fr.ReadFrame(); err == nil {
		t.Fatalf("want the connection closed, got %v", f)
	}
	if s.Executions("above") != 0 || s.Received("above") != 1 {
		t.Fatalf("received %d, executed %d; want 1, 0", s.Received("above"), s.Executions("above"))
	}
}

// HardStop(2): both streams are executed, then reset with REFUSED_STREAM,
// after a GOAWAY whose last stream id covers them — the connection can take
// no new stream by the time the resets arrive. One ClientConn, which never
// retries, sees each reset as it is.
func TestHardStopRefusesStreamsItExecuted(t *testing.T) {
	forEachH2(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		scheme := "http"
		if p == outboundtest.H2TLS {
			scheme = "https"
		}
		cc, err := s.Transport().NewClientConn(context.Background(), scheme, strings.TrimPrefix(strings.TrimPrefix(s.URL, "http://"), "https://"))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		s.Enqueue(outboundtest.HardStop(2))
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, s.URL, nil)
				req.Header.Set(outboundtest.IDHeader, fmt.Sprint("call-", i))
				resp, err := cc.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
					err = fmt.Errorf("answered %d", resp.StatusCode)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			var se http2.StreamError
			if !errors.As(err, &se) || se.Code != http2.ErrCodeRefusedStream {
				t.Errorf("call-%d: %v, want REFUSED_STREAM", i, err)
			}
			if n := s.Executions(fmt.Sprint("call-", i)); n != 1 {
				t.Errorf("call-%d executed %d times, want 1", i, n)
			}
		}
		if cc.Err() == nil && cc.Available() > 0 {
			t.Error("the connection takes new streams after its GOAWAY")
		}
	})
}
