package outboundtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"
	"time"
)

// serveHTTP1 serves the requests of one HTTP/1.1 connection, one after the
// other, until a fault or either side closes it. Responses are written by
// hand so that every byte on the wire is the fault's choice.
func (s *Server) serveHTTP1(c *conn) {
	br := bufio.NewReader(c.nc)
	bw := bufio.NewWriter(c.nc)
	limit := s.requestsPerConn()
	for served := 1; ; served++ {
		// Wait for the first byte of the next request: a fault is taken
		// only by a request that is arriving, never by an idle connection.
		if _, err := br.Peek(1); err != nil {
			return
		}
		var spec, callID string
		if s.faultHeader.Load() {
			head := peekFullHead(br)
			spec, callID = headField(head, FaultHeader), headField(head, IDHeader)
		}
		f := s.faultFor(spec, callID)
		if f.kind == kindCloseBeforeRead || f.kind == kindResetBeforeRead {
			id, method, path := peekHead(br)
			s.receive(c, 0, id, method, path, f)
			if f.kind == kindResetBeforeRead {
				c.reset()
			} else {
				c.nc.Close()
			}
			return
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			io.WriteString(c.nc, "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			return
		}
		e := s.receive(c, 0, req.Header.Get(IDHeader), req.Method, req.URL.Path, f)
		if served == limit {
			req.Close = true // the last request of the connection: answered with Connection: close
		}
		if !s.serveRequest1(c, br, bw, req, e, f) {
			return
		}
	}
}

// peekHead extracts the id, method and path of a request from the bytes that
// have already arrived, without reading more from the connection. It returns
// empty strings if the whole request head has not arrived yet.
func peekHead(br *bufio.Reader) (id, method, path string) {
	buf, _ := br.Peek(br.Buffered())
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return "", "", ""
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(buf[:end+4])))
	if err != nil {
		return "", "", ""
	}
	return req.Header.Get(IDHeader), req.Method, req.URL.Path
}

// peekFullHead returns the head of the request that has started to
// arrive, waiting for the rest of it without consuming anything; nil if
// the connection ends first or the head does not fit the buffer.
func peekFullHead(br *bufio.Reader) []byte {
	for {
		buf, _ := br.Peek(br.Buffered())
		if end := bytes.Index(buf, []byte("\r\n\r\n")); end >= 0 {
			return buf[:end+4]
		}
		if br.Buffered() >= br.Size() {
			return nil
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return nil
		}
	}
}

// headField returns the value of the header field name in head, "" if
// there is none or head does not parse.
func headField(head []byte, name string) string {
	if head == nil {
		return ""
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		return ""
	}
	return req.Header.Get(name)
}

// serveRequest1 applies f to req and reports whether the connection may
// carry another request.
func (s *Server) serveRequest1(c *conn, br *bufio.Reader, bw *bufio.Writer, req *http.Request, e *entry, f Fault) bool {
	// Every fault from here on reads the whole request first, streaming
	// the body away so that large uploads never sit in memory.
	if req.Header.Get("Expect") == "100-continue" {
		bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
		if bw.Flush() != nil {
			return false
		}
	}
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return false
	}
	req.Body.Close()
	keep := !req.Close
	noBody := req.Method == http.MethodHead

	if f.isHTTP2Only() {
		body := "outboundtest: " + f.String() + " needs HTTP/2\n"
		writeHead1(bw, 501, "Content-Length", fmt.Sprint(len(body)))
		if !noBody {
			bw.WriteString(body)
		}
		if bw.Flush() != nil {
			return false
		}
		s.answer(e, 501)
		return keep
	}

	s.execute(e)
	switch f.kind {
	case kindRespond, kindSlow, kindQueued:
		if f.kind != kindRespond {
			ctx, stop := s.watchHTTP1(c, br)
			err := s.work(f, ctx.Done(), nil)
			stop()
			if err != nil {
				return false
			}
		}
		body := f.responseBody()
		kvs := append([]string{"Content-Length", fmt.Sprint(len(body))}, f.header...)
		if !hasKey(f.header, "Content-Type") {
			kvs = append(kvs, "Content-Type", "text/plain; charset=utf-8")
		}
		if !keep {
			kvs = append(kvs, "Connection", "close")
		}
		writeHead1(bw, f.statusCode(), kvs...)
		if !noBody {
			bw.Write(body)
		}
		if bw.Flush() != nil {
			return false
		}
		s.answer(e, f.statusCode())
		return keep

	case kindHang:
		ctx, stop := s.watchHTTP1(c, br)
		<-ctx.Done()
		stop()
		return false

	case kindResetAfterRead:
		c.reset()
		return false

	case kindPartialHeaders:
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Ty")
		bw.Flush()
		return false

	case kindTruncatedBody:
		writeHead1(bw, 200, "Content-Length", fmt.Sprint(f.n), "Content-Type", "application/octet-stream")
		bw.Write(bytes.Repeat([]byte("x"), f.m))
		if bw.Flush() == nil {
			s.answer(e, 200)
		}
		return false

	case kindTrickle:
		kvs := []string{"Content-Length", fmt.Sprint(f.n), "Content-Type", "application/octet-stream"}
		if !keep {
			kvs = append(kvs, "Connection", "close")
		}
		writeHead1(bw, 200, kvs...)
		if bw.Flush() != nil {
			return false
		}
		s.answer(e, 200)
		ctx, stop := s.watchHTTP1(c, br)
		defer stop()
		for range f.n {
			if sleep(ctx, f.delay) != nil {
				return false
			}
			bw.WriteByte('x')
			if bw.Flush() != nil {
				return false
			}
		}
		return keep

	case kindHugeHeaders:
		bw.WriteString("HTTP/1.1 200 OK\r\n")
		for name, value := range fillerHeaders(f.n) {
			bw.WriteString(name + ": " + value + "\r\n")
		}
		bw.WriteString("Content-Length: 0\r\nConnection: close\r\n\r\n")
		if bw.Flush() == nil {
			s.answer(e, 200)
		}
		return false

	case kindBadStatusLine:
		bw.WriteString("HTTP/1.1 2x0 Nope\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		bw.Flush()
		return false

	case kindEndlessBody:
		writeHead1(bw, 200, "Transfer-Encoding", "chunked", "Content-Type", "application/octet-stream")
		if bw.Flush() != nil {
			return false
		}
		s.answer(e, 200)
		// Chunks until a write fails: the client went away or Close closed
		// the connection.
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 16<<10, bytes.Repeat([]byte("x"), 16<<10))
		for {
			bw.WriteString(chunk)
			if bw.Flush() != nil {
				return false
			}
		}

	case kindCloseMidStream:
		writeHead1(bw, 200, "Transfer-Encoding", "chunked", "Content-Type", "application/octet-stream")
		bw.WriteString("c\r\npartial body\r\n")
		if bw.Flush() == nil {
			s.answer(e, 200)
		}
		return false
	}
	panic("outboundtest: unhandled fault " + f.String())
}

// writeHead1 writes a status line and header fields (alternating keys and
// values) to bw.
func writeHead1(bw *bufio.Writer, status int, kvs ...string) {
	text := http.StatusText(status)
	if text == "" {
		text = "Status"
	}
	fmt.Fprintf(bw, "HTTP/1.1 %03d %s\r\n", status, text)
	for i := 0; i+1 < len(kvs); i += 2 {
		bw.WriteString(kvs[i] + ": " + kvs[i+1] + "\r\n")
	}
	bw.WriteString("\r\n")
}

func hasKey(kvs []string, key string) bool {
	for i := 0; i < len(kvs); i += 2 {
		if strings.EqualFold(kvs[i], key) {
			return true
		}
	}
	return false
}

// fillerHeaders yields header fields whose names and values add up to about
// n bytes.
func fillerHeaders(n int) iter.Seq2[string, string] {
	return func(yield func(name, value string) bool) {
		value := strings.Repeat("a", 1000)
		for i := 0; n > 0; i++ {
			name := fmt.Sprintf("X-Filler-%d", i)
			v := value[:max(min(n-len(name), len(value)), 1)]
			n -= len(name) + len(v)
			if !yield(name, v) {
				return
			}
		}
	}
}

// watchHTTP1 returns a context that is cancelled when the client closes the
// connection or the server is closed, so that a slow or hung answer stops at
// once. It reads ahead on br in the background, as net/http's server does;
// the caller must call stop before using br again.
func (s *Server) watchHTTP1(c *conn, br *bufio.Reader) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	started := s.goTracked(func() {
		defer close(done)
		// A byte (a pipelined request) stays in br; only an error means
		// the client is gone.
		if _, err := br.Peek(1); err != nil {
			cancel()
		}
	})
	if !started {
		cancel()
		return ctx, func() {}
	}
	return ctx, func() {
		// Unblock the read-ahead, wait for it, and make the connection
		// readable again. A read interrupted by the deadline leaves no
		// error behind in br: bufio returns a read error once.
		c.nc.SetReadDeadline(time.Unix(1, 0))
		<-done
		c.nc.SetReadDeadline(time.Time{})
		cancel()
	}
}

// work waits as f says — Slow's delay, or Queued's turn and service — or
// less if gone or dead is closed first (errStreamGone), or the server is
// closed.
func (s *Server) work(f Fault, gone, dead <-chan struct{}) error {
	if f.kind == kindQueued {
		w := s.workerPool(f.n)
		if err := await(s, w, gone, dead); err != nil {
			return err
		}
		defer func() { w <- struct{}{} }()
	}
	t := time.NewTimer(f.delay)
	defer t.Stop()
	return await(s, t.C, gone, dead)
}

// await receives from ready, or returns early if gone or dead is closed
// first (errStreamGone) or the server is closed.
func await[T any](s *Server, ready <-chan T, gone, dead <-chan struct{}) error {
	select {
	case <-ready:
		return nil
	case <-gone:
		return errStreamGone
	case <-dead:
		return errStreamGone
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// workerPool returns the workers of Queued faults of the given capacity: a
// worker is taken by receiving from it, given back by sending.
func (s *Server) workerPool(capacity int) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers == nil {
		s.workers = map[int]chan struct{}{}
	}
	w := s.workers[capacity]
	if w == nil {
		w = make(chan struct{}, capacity)
		for range capacity {
			w <- struct{}{}
		}
		s.workers[capacity] = w
	}
	return w
}

// sleep waits d, or less if ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
