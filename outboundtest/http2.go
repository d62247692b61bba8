package outboundtest

import (
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The HTTP/2 side is a raw peer written with http2.Framer and hpack rather
// than http2.Server, because faults such as RefusedStream or GoAway need
// control over every frame.

const (
	// h2RecvWindow is the receive window announced for the connection and
	// for each stream. Every DATA byte is handed back at once with
	// WINDOW_UPDATE, so uploads never wait on the server.
	h2RecvWindow = 1 << 20
	// h2MaxStreams is the SETTINGS_MAX_CONCURRENT_STREAMS announced, the
	// value of net/http's server.
	h2MaxStreams = 250
	// h2DefaultWindow and h2DefaultFrame are the protocol's initial values,
	// in force until the client's SETTINGS say otherwise.
	h2DefaultWindow = 65535
	h2DefaultFrame  = 16384
	// goAwayLinger bounds how long a connection that sent GOAWAY waits
	// for the client: to close it, once the processed streams are
	// answered; or to show that it processed the GOAWAY, before the
	// server drops the connection without answering.
	goAwayLinger = time.Second
)

// goAwayPing is the payload of the PING a GoAway fault sends right after its
// GOAWAY. A client handles frames in order, so its acknowledgement proves it
// has processed the GOAWAY.
var goAwayPing = [8]byte{'g', 'o', 'a', 'w', 'a', 'y'}

var (
	errStreamGone = errors.New("outboundtest: stream reset by the client")
	errConnGone   = errors.New("outboundtest: connection closed")
)

// An h2conn is the server side of one HTTP/2 connection. One goroutine reads
// frames (serveHTTP2); each stream is served by its own goroutine, and a
// GoAway fault by one more. Frames are written by all of them, one at a time.
type h2conn struct {
	s  *Server
	c  *conn
	rw net.Conn // carries the frames: the TCP connection, or TLS over it
	fr *http2.Framer

	wmu  sync.Mutex // serialises frame writes; guards enc and ebuf
	enc  *hpack.Encoder
	ebuf bytes.Buffer

	mu       sync.Mutex
	cond     *sync.Cond // broadcast when a send window grows, a stream is reset or the connection dies
	streams  map[uint32]*h2stream
	lastID   uint32 // highest stream id opened by the client
	maxOther uint32 // highest id of a stream the server acted on outside a GoAway group
	connWin  int64  // bytes we may still send on the connection
	initWin  int64  // initial send window of a stream (client's SETTINGS)
	maxFrame int    // largest frame payload the client accepts
	goaway   *goawayGroup
	perConn  int    // SetRequestsPerConn when the connection was accepted
	served   int    // streams taken, to compare with perConn
	limitID  uint32 // the last stream id of the GOAWAY sent at perConn streams, 0 before
	isDead   bool
	dead     chan struct{} // closed when the connection is gone

	// After a GoAway fault fired: the streams above its last id that the
	// client has not reset yet, and whether the client acknowledged the
	// PING sent after the GOAWAY. drained is signalled when either
	// changes, or a request ends.
	above     map[uint32]bool
	pingAcked bool
	drained   chan struct{}
}

// An h2stream is one request stream. Its channels are closed under h2conn.mu.
type h2stream struct {
	id      uint32
	method  string
	expect  bool // the client waits for "100 Continue" before sending the body
	f       Fault
	e       *entry
	win     int64         // bytes we may still send on the stream; guarded by h2conn.mu
	ended   bool          // the client has sent END_STREAM
	reset   bool          // the client has reset the stream
	reqDone chan struct{} // closed when ended becomes true
	gone    chan struct{} // closed when reset becomes true
}

// A goawayGroup collects the streams covered by one GoAway fault.
type goawayGroup struct {
	f       Fault
	streams []*h2stream   // in stream-id order
	full    chan struct{} // closed when f.n streams have been collected
	fired   bool          // GOAWAY decided; later streams are ignored
}

func (s *Server) serveHTTP2(c *conn, rw net.Conn) {
	h := &h2conn{
		s:        s,
		c:        c,
		rw:       rw,
		streams:  make(map[uint32]*h2stream),
		connWin:  h2DefaultWindow,
		initWin:  h2DefaultWindow,
		maxFrame: h2DefaultFrame,
		dead:     make(chan struct{}),
		drained:  make(chan struct{}, 1),
		perConn:  s.requestsPerConn(),
	}
	h.cond = sync.NewCond(&h.mu)
	h.enc = hpack.NewEncoder(&h.ebuf)
	h.fr = http2.NewFramer(rw, rw)
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	defer h.die()

	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(rw, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	err := h.write(func(fr *http2.Framer) error {
		err := fr.WriteSettings(
			http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: h2MaxStreams},
			http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2RecvWindow},
		)
		if err != nil {
			return err
		}
		return fr.WriteWindowUpdate(0, h2RecvWindow-h2DefaultWindow)
	})
	if err != nil {
		return
	}
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				// A malformed request on one stream; the connection
				// goes on.
				if h.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(se.StreamID, se.Code) }) == nil {
					continue
				}
				return
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				h.write(func(fr *http2.Framer) error { return fr.WriteGoAway(h.highestID(), http2.ErrCode(ce), nil) })
			}
			return
		}
		if !h.handle(f) {
			return
		}
	}
}

// die marks the connection dead, wakes every goroutine waiting on it and
// closes it.
func (h *h2conn) die() {
	h.mu.Lock()
	h.isDead = true
	close(h.dead)
	h.cond.Broadcast()
	h.mu.Unlock()
	h.c.nc.Close()
}

func (h *h2conn) highestID() uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastID
}

// write runs fn with the framer, alone.
func (h *h2conn) write(fn func(fr *http2.Framer) error) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	return fn(h.fr)
}

// handle processes one frame from the client and reports whether to go on
// reading.
func (h *h2conn) handle(f http2.Frame) bool {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return true
		}
		f.ForeachSetting(h.applySetting)
		return h.write(func(fr *http2.Framer) error { return fr.WriteSettingsAck() }) == nil
	case *http2.PingFrame:
		if f.IsAck() {
			if f.Data == goAwayPing {
				h.mu.Lock()
				h.pingAcked = true
				h.mu.Unlock()
				h.signalDrained()
			}
			return true
		}
		data := f.Data
		return h.write(func(fr *http2.Framer) error { return fr.WritePing(true, data) }) == nil
	case *http2.WindowUpdateFrame:
		h.mu.Lock()
		if f.StreamID == 0 {
			h.connWin += int64(f.Increment)
		} else if st := h.streams[f.StreamID]; st != nil {
			st.win += int64(f.Increment)
		}
		h.cond.Broadcast()
		h.mu.Unlock()
	case *http2.MetaHeadersFrame:
		return h.onHeaders(f)
	case *http2.DataFrame:
		return h.onData(f)
	case *http2.RSTStreamFrame:
		h.mu.Lock()
		if st := h.streams[f.StreamID]; st != nil && !st.reset {
			st.reset = true
			close(st.gone)
			h.cond.Broadcast()
		}
		delete(h.above, f.StreamID)
		h.mu.Unlock()
		h.signalDrained()
	}
	// PRIORITY, the client's GOAWAY and unknown frames need nothing: a
	// client that sent GOAWAY closes the connection when it is done.
	return true
}

func (h *h2conn) applySetting(set http2.Setting) error {
	switch set.ID {
	case http2.SettingInitialWindowSize:
		// The change applies to the windows of open streams too
		// (RFC 9113, section 6.9.2).
		h.mu.Lock()
		delta := int64(set.Val) - h.initWin
		h.initWin = int64(set.Val)
		for _, st := range h.streams {
			st.win += delta
		}
		h.cond.Broadcast()
		h.mu.Unlock()
	case http2.SettingMaxFrameSize:
		h.mu.Lock()
		h.maxFrame = int(set.Val)
		h.mu.Unlock()
	case http2.SettingHeaderTableSize:
		h.wmu.Lock()
		h.enc.SetMaxDynamicTableSizeLimit(set.Val)
		h.wmu.Unlock()
	}
	return nil
}

// onHeaders opens a stream, gives it its fault and applies the faults that
// act as soon as the HEADERS arrive.
func (h *h2conn) onHeaders(f *http2.MetaHeadersFrame) bool {
	h.mu.Lock()
	if st := h.streams[f.StreamID]; st != nil {
		// Trailers of a request.
		h.mu.Unlock()
		if f.StreamEnded() {
			h.endRequest(st)
		}
		return true
	}
	if f.StreamID <= h.lastID {
		// Trailers of a stream that is already finished.
		h.mu.Unlock()
		return true
	}
	h.lastID = f.StreamID

	id := headerValue(f, IDHeader)
	method := f.PseudoValue("method")
	st := &h2stream{
		id:      f.StreamID,
		method:  method,
		expect:  strings.EqualFold(headerValue(f, "expect"), "100-continue"),
		win:     h.initWin,
		reqDone: make(chan struct{}),
		gone:    make(chan struct{}),
	}
	if f.StreamEnded() {
		st.ended = true
		close(st.reqDone)
	}
	if h.limitID != 0 {
		// Above the last id of the GOAWAY sent at SetRequestsPerConn's
		// limit: never processed.
		h.above[st.id] = true
		h.mu.Unlock()
		h.s.receive(h.c, st.id, id, method, f.PseudoValue("path"), Fault{})
		return true
	}
	h.served++
	limitReached := h.perConn > 0 && h.served == h.perConn
	if limitReached {
		h.limitID, h.above = st.id, make(map[uint32]bool)
	}
	// Streams that arrive while a GoAway fault is collecting are its own;
	// they take nothing from the queue.
	g := h.goaway
	if g != nil {
		st.f = g.f
	} else {
		st.f = h.s.faultFor(headerValue(f, FaultHeader), id)
	}
	st.e = h.s.receive(h.c, st.id, id, method, f.PseudoValue("path"), st.f)

	newGroup := false
	switch {
	case g != nil && g.fired:
		// Above the GOAWAY's last stream id: never processed. The
		// client aborts it when it reads the GOAWAY.
		h.above[st.id] = true
		h.mu.Unlock()
		return true
	case g == nil && st.f.kind == kindGoAway:
		g = &goawayGroup{f: st.f, full: make(chan struct{})}
		h.goaway = g
		newGroup = true
		fallthrough
	case g != nil:
		h.streams[st.id] = st
		g.streams = append(g.streams, st)
		if len(g.streams) == g.f.n {
			close(g.full)
		}
	case st.f.kind == kindCloseBeforeRead, st.f.kind == kindResetBeforeRead, st.f.kind == kindRefusedStream:
		// Never registered: later DATA of the stream is only counted
		// against the connection window.
	default:
		h.streams[st.id] = st
		h.maxOther = max(h.maxOther, st.id)
	}
	h.mu.Unlock()
	if limitReached {
		last := st.id
		if h.write(func(fr *http2.Framer) error { return fr.WriteGoAway(last, http2.ErrCodeNo, nil) }) != nil {
			return false
		}
	}

	switch {
	case newGroup:
		return h.s.goTracked(func() { h.runGoAway(g) })
	case g != nil:
		return true
	case st.f.kind == kindCloseBeforeRead:
		h.c.nc.Close()
		return false
	case st.f.kind == kindResetBeforeRead:
		h.c.reset()
		return false
	case st.f.kind == kindRefusedStream:
		return h.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(st.id, http2.ErrCodeRefusedStream) }) == nil
	}
	return h.s.goTracked(func() { h.serveStream(st) })
}

// onData drops the request body and hands the flow-control credit back.
func (h *h2conn) onData(f *http2.DataFrame) bool {
	h.mu.Lock()
	st := h.streams[f.StreamID]
	h.mu.Unlock()
	// Flow control counts the whole payload, padding included.
	if n := f.Length; n > 0 {
		err := h.write(func(fr *http2.Framer) error {
			if err := fr.WriteWindowUpdate(0, n); err != nil {
				return err
			}
			if st != nil && !f.StreamEnded() {
				return fr.WriteWindowUpdate(st.id, n)
			}
			return nil
		})
		if err != nil {
			return false
		}
	}
	if st != nil && f.StreamEnded() {
		h.endRequest(st)
	}
	return true
}

func (h *h2conn) endRequest(st *h2stream) {
	h.mu.Lock()
	if !st.ended {
		st.ended = true
		close(st.reqDone)
	}
	h.mu.Unlock()
	h.signalDrained()
}

// signalDrained wakes drainGoAway, if it waits.
func (h *h2conn) signalDrained() {
	select {
	case h.drained <- struct{}{}:
	default:
	}
}

func (h *h2conn) forget(st *h2stream) {
	h.mu.Lock()
	if h.streams[st.id] == st {
		delete(h.streams, st.id)
	}
	h.mu.Unlock()
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if strings.EqualFold(hf.Name, name) {
			return hf.Value
		}
	}
	return ""
}

// awaitRequest waits until the whole request of st has arrived. A client
// that sent "Expect: 100-continue" is told to go on first, as net/http's
// server does when a handler reads the body.
func (h *h2conn) awaitRequest(st *h2stream) error {
	if st.expect {
		st.expect = false
		h.mu.Lock()
		ended := st.ended
		h.mu.Unlock()
		if !ended {
			if err := h.writeHeaders(st.id, []hpack.HeaderField{{Name: ":status", Value: "100"}}, false, false); err != nil {
				return err
			}
		}
	}
	select {
	case <-st.reqDone:
		return nil
	case <-st.gone:
		return errStreamGone
	case <-h.dead:
		return errConnGone
	}
}

// sleep waits d, or less if the stream or the connection goes away.
func (h *h2conn) sleep(st *h2stream, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-st.gone:
		return errStreamGone
	case <-h.dead:
		return errConnGone
	}
}

// serveStream applies the faults that first read the whole request; all of
// them count it executed.
func (h *h2conn) serveStream(st *h2stream) {
	defer h.forget(st)
	if h.awaitRequest(st) != nil {
		return
	}
	h.s.execute(st.e)
	f := st.f
	switch f.kind {
	case kindRespond, kindSlow, kindQueued:
		if f.kind != kindRespond && h.s.work(f, st.gone, h.dead) != nil {
			return
		}
		h.respond(st, f.statusCode(), f.header, f.responseBody())

	case kindHang:
		select {
		case <-st.gone:
		case <-h.dead:
		}

	case kindResetAfterRead:
		h.c.reset()

	case kindPartialHeaders:
		h.writeHeaders(st.id, responseFields(200, -1), false, true)
		h.c.nc.Close()

	case kindTruncatedBody:
		if h.writeHeaders(st.id, responseFields(200, f.n), false, false) != nil {
			return
		}
		h.s.answer(st.e, 200)
		if h.writeData(st, bytes.Repeat([]byte("x"), f.m), false) != nil {
			return
		}
		h.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(st.id, http2.ErrCodeInternal) })

	case kindTrickle:
		if h.writeHeaders(st.id, responseFields(200, f.n), f.n == 0, false) != nil {
			return
		}
		h.s.answer(st.e, 200)
		for i := range f.n {
			if h.sleep(st, f.delay) != nil || h.writeData(st, []byte("x"), i == f.n-1) != nil {
				return
			}
		}

	case kindHugeHeaders:
		fields := responseFields(200, 0)
		for name, value := range fillerHeaders(f.n) {
			fields = append(fields, hpack.HeaderField{Name: strings.ToLower(name), Value: value})
		}
		if h.writeHeaders(st.id, fields, true, false) == nil {
			h.s.answer(st.e, 200)
		}

	case kindBadStatusLine:
		h.writeHeaders(st.id, []hpack.HeaderField{{Name: ":status", Value: "2x0"}}, true, false)

	case kindEndlessBody:
		if h.writeHeaders(st.id, responseFields(200, -1), false, false) != nil {
			return
		}
		h.s.answer(st.e, 200)
		chunk := bytes.Repeat([]byte("x"), 16<<10)
		for h.writeData(st, chunk, false) == nil {
		}

	case kindCloseMidStream:
		if h.writeHeaders(st.id, responseFields(200, -1), false, false) != nil {
			return
		}
		h.s.answer(st.e, 200)
		h.writeData(st, []byte("partial body"), false)
		h.c.nc.Close()

	case kindResetStream:
		h.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(st.id, f.code) })

	default:
		panic("outboundtest: unhandled fault " + f.String())
	}
}

// runGoAway waits for the streams of a GoAway fault, then sends the GOAWAY
// and answers the processed streams, or drops the connection.
func (h *h2conn) runGoAway(g *goawayGroup) {
	t := time.NewTimer(goAwayWait)
	defer t.Stop()
	select {
	case <-g.full:
	case <-t.C:
	case <-h.dead:
		return
	}
	h.mu.Lock()
	g.fired = true
	streams := slices.Clone(g.streams)
	processed := streams[:min(g.f.m, len(streams))]
	h.above = make(map[uint32]bool)
	for _, st := range streams[len(processed):] {
		h.above[st.id] = true
	}
	// RFC 9113 §6.8: the last stream id covers every stream the server
	// might have acted on — on this connection that includes the streams
	// served under other faults, which may be executing or done. Leaving
	// them out would tell the client they were not processed.
	last := h.maxOther
	h.mu.Unlock()

	for _, st := range processed {
		h.s.execute(st.e)
		last = max(last, st.id)
	}
	debug := bytes.Repeat([]byte("d"), g.f.debug)
	err := h.write(func(fr *http2.Framer) error {
		if err := fr.WriteGoAway(last, g.f.code, debug); err != nil {
			return err
		}
		return fr.WritePing(false, goAwayPing)
	})
	if err != nil {
		return
	}
	if g.f.delay > 0 { // WithPause: a window in which the client holds only the GOAWAY
		pause := time.NewTimer(g.f.delay)
		select {
		case <-pause.C:
		case <-h.dead:
			pause.Stop()
			return
		}
	}
	switch {
	case g.f.refuse:
		for _, st := range processed {
			if h.awaitRequest(st) == nil {
				h.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(st.id, http2.ErrCodeRefusedStream) })
			}
		}
	case !g.f.answer:
		if !g.f.abrupt {
			h.drainGoAway(processed)
		}
		h.c.nc.Close()
		return
	default:
		for _, st := range processed {
			if h.awaitRequest(st) == nil {
				h.respond(st, 200, nil, defaultBody)
			}
		}
	}
	// Graceful close: stop sending and let the client, which now has
	// every frame it will get, close the connection. Closing at once
	// could turn into an RST that destroys frames still unread.
	h.write(func(*http2.Framer) error {
		if cw, ok := h.rw.(interface{ CloseWrite() error }); ok {
			return cw.CloseWrite()
		}
		return nil
	})
	linger := time.NewTimer(goAwayLinger)
	defer linger.Stop()
	select {
	case <-h.dead:
	case <-linger.C:
		h.c.nc.Close()
	}
}

// drainGoAway waits, before a GoAway fault drops its connection without
// answering, until the client has certainly processed the GOAWAY: it
// acknowledged the PING sent after it, reset every stream above the last id,
// and finished sending the requests of the processed streams. It waits at
// most goAwayLinger, and not at all once the client closed the connection
// (which it does by itself when only streams above the last id were open).
//
// Closing earlier races the client's writes, as a real server draining its
// connections does not: a client whose write of a request body fails before
// it has read the GOAWAY gets only a broken pipe, and cannot know that the
// stream was not processed (WithAbruptClose keeps that race, on purpose).
func (h *h2conn) drainGoAway(processed []*h2stream) {
	t := time.NewTimer(goAwayLinger)
	defer t.Stop()
	for {
		h.mu.Lock()
		done := h.pingAcked && len(h.above) == 0
		for _, st := range processed {
			done = done && (st.ended || st.reset)
		}
		h.mu.Unlock()
		if done {
			return
		}
		select {
		case <-h.drained:
		case <-h.dead:
			return
		case <-t.C:
			return
		}
	}
}

// responseFields returns the pseudo-header and length of a response head;
// contentLength < 0 leaves the length out.
func responseFields(status, contentLength int) []hpack.HeaderField {
	fields := []hpack.HeaderField{{Name: ":status", Value: strconv.Itoa(status)}}
	if contentLength >= 0 {
		fields = append(fields, hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(contentLength)})
	}
	return append(fields, hpack.HeaderField{Name: "content-type", Value: "application/octet-stream"})
}

// respond sends a complete answer on st.
func (h *h2conn) respond(st *h2stream, status int, kvs []string, body []byte) error {
	fields := []hpack.HeaderField{
		{Name: ":status", Value: strconv.Itoa(status)},
		{Name: "content-length", Value: strconv.Itoa(len(body))},
	}
	if !hasKey(kvs, "Content-Type") {
		fields = append(fields, hpack.HeaderField{Name: "content-type", Value: "text/plain; charset=utf-8"})
	}
	for i := 0; i+1 < len(kvs); i += 2 {
		fields = append(fields, hpack.HeaderField{Name: strings.ToLower(kvs[i]), Value: kvs[i+1]})
	}
	noBody := len(body) == 0 || st.method == "HEAD"
	if err := h.writeHeaders(st.id, fields, noBody, false); err != nil {
		return err
	}
	h.s.answer(st.e, status)
	if noBody {
		return nil
	}
	return h.writeData(st, body, true)
}

// writeHeaders encodes fields and sends them as a HEADERS frame followed by
// as many CONTINUATION frames as the client's frame size requires. With
// partial, it sends only the first half of the block, without END_HEADERS.
func (h *h2conn) writeHeaders(id uint32, fields []hpack.HeaderField, endStream, partial bool) error {
	h.mu.Lock()
	maxFrame := h.maxFrame
	h.mu.Unlock()
	return h.write(func(fr *http2.Framer) error {
		// Encoding and writing happen under the same lock, so the
		// client's HPACK decoder sees blocks in the order they were
		// encoded.
		h.ebuf.Reset()
		for _, hf := range fields {
			h.enc.WriteField(hf)
		}
		block := h.ebuf.Bytes()
		if partial {
			return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:len(block)/2]})
		}
		first := block[:min(len(block), maxFrame)]
		rest := block[len(first):]
		err := fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID:      id,
			BlockFragment: first,
			EndStream:     endStream,
			EndHeaders:    len(rest) == 0,
		})
		for err == nil && len(rest) > 0 {
			n := min(len(rest), maxFrame)
			err = fr.WriteContinuation(id, n == len(rest), rest[:n])
			rest = rest[n:]
		}
		return err
	})
}

// writeData sends p on st as DATA frames within the client's flow-control
// windows, waiting for WINDOW_UPDATEs as needed. With end, the last frame
// carries END_STREAM (an empty one if p is empty).
func (h *h2conn) writeData(st *h2stream, p []byte, end bool) error {
	if len(p) == 0 && !end {
		return nil
	}
	for {
		n, err := h.reserve(st, len(p))
		if err != nil {
			return err
		}
		chunk := p[:n]
		p = p[n:]
		last := end && len(p) == 0
		if err := h.write(func(fr *http2.Framer) error { return fr.WriteData(st.id, last, chunk) }); err != nil {
			return err
		}
		if len(p) == 0 {
			return nil
		}
	}
}

// reserve takes up to want bytes of send window for st, waiting until both
// the stream and the connection windows are open.
func (h *h2conn) reserve(st *h2stream, want int) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		switch {
		case h.isDead:
			return 0, errConnGone
		case st.reset:
			return 0, errStreamGone
		case want == 0:
			return 0, nil
		case h.connWin > 0 && st.win > 0:
			n := int(min(int64(want), int64(h.maxFrame), h.connWin, st.win))
			h.connWin -= int64(n)
			st.win -= int64(n)
			return n, nil
		}
		h.cond.Wait()
	}
}
