package outboundtest

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/net/http2"
)

// A Fault says how the server treats one request (request-level faults, given
// to [Server.SetDefault] and [Server.Enqueue]) or one accepted connection
// (connection-level faults, given to [Server.EnqueueConn]). Build Faults with
// the constructors of this package; the zero Fault behaves like Respond(200).
//
// "Executed" in the documentation of each constructor says whether the server
// counts the request as processed ([Server.Executions]): that is the ground
// truth a client library is tested against. A request is executed at the
// moment the server has read all of it and starts working on it.
type Fault struct {
	kind    faultKind
	status  int
	header  []string // key, value, key, value…
	body    []byte
	bodySet bool
	delay   time.Duration
	n, m    int
	answer  bool
	abrupt  bool
	refuse  bool
	code    http2.ErrCode
	debug   int
}

type faultKind int

const (
	kindRespond faultKind = iota
	kindSlow
	kindHang
	kindCloseBeforeRead
	kindResetBeforeRead
	kindResetAfterRead
	kindPartialHeaders
	kindTruncatedBody
	kindTrickle
	kindHugeHeaders
	kindBadStatusLine
	kindEndlessBody
	kindCloseMidStream
	kindRefusedStream
	kindResetStream
	kindGoAway
	kindResetOnAccept
	kindCloseOnAccept
	kindStallOnAccept
	kindQueued
)

// defaultBody is the body of answers that do not set one with WithBody.
var defaultBody = []byte("ok\n")

// Respond reads the request, counts it executed and answers with status, the
// given header fields (alternating keys and values, e.g.
// Respond(503, "Retry-After", "30")) and the body "ok\n" unless
// [Fault.WithBody] sets another. The server adds Content-Length, and
// Content-Type text/plain unless the fields set one. It behaves the same on
// every protocol; an HTTP/1 connection stays open for the next request unless
// the client asked to close it. Respond panics if headerKVs has an odd length.
func Respond(status int, headerKVs ...string) Fault {
	if len(headerKVs)%2 != 0 {
		panic("outboundtest: Respond needs header keys and values in pairs")
	}
	return Fault{kind: kindRespond, status: status, header: append([]string(nil), headerKVs...)}
}

// Slow reads the request, counts it executed, waits d and then answers like
// Respond(status). The wait is a server-side timer that ends early, without an
// answer, when the client goes away (closes the connection; on HTTP/2, resets
// the stream) or when the server is closed.
func Slow(d time.Duration, status int) Fault {
	return Fault{kind: kindSlow, delay: d, status: status}
}

// Queued models an upstream of a fixed capacity: it reads the request,
// counts it executed, waits for one of capacity workers (shared by every
// request a Queued fault of that capacity serves, taken in arrival order),
// keeps it for service and answers 200. Beyond the capacity, requests wait in
// the queue, so latency grows with it: service up to capacity requests in
// flight, about service·n/capacity at n. The wait ends early, without an
// answer, when the client goes away or the server is closed.
func Queued(capacity int, service time.Duration) Fault {
	return Fault{kind: kindQueued, n: max(capacity, 1), delay: service, status: 200}
}

// Hang reads the request, counts it executed (a real server may be working on
// it) and never answers. The connection is held until the client gives up
// (closes the connection or resets the stream) or the server is closed.
func Hang() Fault { return Fault{kind: kindHang} }

// CloseBeforeRead closes the connection with a FIN before the request is
// processed. The request is received but not executed.
//
// On HTTP/1 the connection is closed as soon as the first bytes of the request
// arrive, without parsing them. The request is still logged: its id and method
// are taken from the bytes that had arrived, when they held the whole head
// (they usually do), else it is logged under the id "". If more of the request
// is still unread in the socket, Linux sends an RST instead of the FIN.
//
// On HTTP/2 the TCP connection (under TLS, without a close_notify) is closed
// as soon as the HEADERS of the stream arrive; every other stream on that
// connection is lost with it.
func CloseBeforeRead() Fault { return Fault{kind: kindCloseBeforeRead} }

// ResetBeforeRead is CloseBeforeRead with an RST instead of a FIN (SO_LINGER
// set to 0, then close). The request is received but not executed.
func ResetBeforeRead() Fault { return Fault{kind: kindResetBeforeRead} }

// ResetAfterRead reads the whole request, body included, counts it executed
// and then resets the TCP connection (RST) without answering. On HTTP/2 every
// other stream on that connection is lost with it.
func ResetAfterRead() Fault { return Fault{kind: kindResetAfterRead} }

// PartialHeaders reads the request, counts it executed and starts an answer
// whose head never completes.
//
// On HTTP/1 it writes "HTTP/1.1 200 OK\r\nContent-Ty" and closes the
// connection. On HTTP/2 it writes a HEADERS frame carrying the first half of
// a header block, without END_HEADERS, and closes the TCP connection, so the
// CONTINUATION the client waits for never comes.
func PartialHeaders() Fault { return Fault{kind: kindPartialHeaders} }

// TruncatedBody reads the request, counts it executed and answers 200 with a
// Content-Length of total, but sends only the first sent bytes of the body.
//
// On HTTP/1 the connection is then closed (FIN). On HTTP/2 the stream is then
// reset with RST_STREAM(INTERNAL_ERROR), as an HTTP/2 server does when its
// handler fails mid-body; the connection stays usable.
func TruncatedBody(total, sent int) Fault {
	total = max(total, 0)
	return Fault{kind: kindTruncatedBody, n: total, m: min(max(sent, 0), total)}
}

// Trickle reads the request, counts it executed and answers 200 with a
// Content-Length of n, then sends the n body bytes one at a time, waiting
// perByte before each. It stops early when the client goes away or the server
// is closed.
func Trickle(perByte time.Duration, n int) Fault {
	return Fault{kind: kindTrickle, delay: perByte, n: max(n, 0)}
}

// HugeHeaders reads the request, counts it executed and answers 200 with about
// n bytes of filler header fields and an empty body: a hostile answer for
// testing response header limits. On HTTP/1 the connection is closed after
// the answer. On HTTP/2 the header block is split into a HEADERS frame and
// CONTINUATION frames, whatever limit the client announced.
func HugeHeaders(n int) Fault { return Fault{kind: kindHugeHeaders, n: n} }

// BadStatusLine reads the request, counts it executed and answers with a
// status that does not parse. On HTTP/1 it writes the status line
// "HTTP/1.1 2x0 Nope" and closes the connection. On HTTP/2 it sends a
// complete HEADERS frame whose :status is "2x0".
func BadStatusLine() Fault { return Fault{kind: kindBadStatusLine} }

// EndlessBody reads the request, counts it executed and answers 200 with a
// body that never ends, until the client stops reading and goes away or the
// server is closed. On HTTP/1 the body is chunked; on HTTP/2 it has no
// content-length and its DATA frames follow the client's flow control.
func EndlessBody() Fault { return Fault{kind: kindEndlessBody} }

// CloseMidStream reads the request, counts it executed, sends the head of a
// 200 answer without a length and a part of its body, then closes the
// connection (FIN). On HTTP/1 the body is chunked, so the client sees the
// missing final chunk; on HTTP/2 the TCP connection is closed after one DATA
// frame without END_STREAM.
func CloseMidStream() Fault { return Fault{kind: kindCloseMidStream} }

// RefusedStream answers RST_STREAM(REFUSED_STREAM) as soon as the HEADERS of
// the stream arrive: received, not executed. HTTP/2 only: on HTTP/1 the server
// reads the request and answers 501 Not Implemented, not executed.
func RefusedStream() Fault { return Fault{kind: kindRefusedStream} }

// ResetStream reads the whole request, counts it executed, then answers
// RST_STREAM(code). HTTP/2 only: on HTTP/1 the server answers 501 Not
// Implemented, not executed.
func ResetStream(code http2.ErrCode) Fault { return Fault{kind: kindResetStream, code: code} }

// goAwayWait bounds how long a GoAway fault waits for its streams to arrive.
const goAwayWait = 3 * time.Second

// GoAway makes the connection that takes it send a GOAWAY. HTTP/2 only: on
// HTTP/1 the server answers 501 Not Implemented, not executed.
//
// The stream that takes the fault and the streams opened after it on the same
// connection (which take nothing from the queue) are collected until inFlight
// of them are open, or for at most 3 seconds. Then the first processed of them,
// in stream-id order, are counted executed, and the server sends
// GOAWAY(NO_ERROR) whose last stream id is the id of the last processed stream
// (0 when processed is 0), or the highest id of a stream the server acted on
// under another fault on the same connection, if that is higher: the last
// stream id must cover every stream that might have been processed (RFC 9113
// §6.8). Streams above that id are never executed, neither
// those collected nor any that arrive later on the connection.
//
// The GOAWAY is followed by a PING, whose acknowledgement tells the server
// that the client has processed the GOAWAY (a client handles frames in
// order). If answer is true, the processed streams are then answered 200
// (each after its request has fully arrived) and the connection is closed
// gracefully: the server shuts down its sending side and waits for the
// client to close. If answer is false, the processed streams get no answer:
// the TCP connection is closed as soon as the client has acknowledged the
// PING, reset every stream above the last id and sent the whole request of
// every processed stream, or when it closes the connection itself, and at
// the latest a second after the GOAWAY. So the client always reads the
// GOAWAY before it sees the connection close, as with a real server that
// drains its connections; [Fault.WithAbruptClose] closes at once instead.
func GoAway(inFlight, processed int, answer bool) Fault {
	inFlight = max(inFlight, 1)
	return Fault{kind: kindGoAway, n: inFlight, m: min(max(processed, 0), inFlight), answer: answer}
}

// ResetOnAccept resets the accepted connection that takes it (SO_LINGER 0,
// then close) before reading anything. Connection-level: use it with
// [Server.EnqueueConn].
func ResetOnAccept() Fault { return Fault{kind: kindResetOnAccept} }

// CloseOnAccept closes (FIN) the accepted connection that takes it before
// reading anything. Connection-level: use it with [Server.EnqueueConn].
func CloseOnAccept() Fault { return Fault{kind: kindCloseOnAccept} }

// StallOnAccept accepts the connection and then neither answers nor closes it:
// bytes from the client are read and dropped until the client closes the
// connection or the server is closed. On H2TLS this is a TLS handshake that
// never completes; on HTTP1 and H2C, a server that never answers. It is
// connection-level: use it with [Server.EnqueueConn].
func StallOnAccept() Fault { return Fault{kind: kindStallOnAccept} }

// WithBody returns a copy of f that answers with body instead of "ok\n".
// It applies to Respond and Slow; other faults ignore it.
func (f Fault) WithBody(body []byte) Fault {
	f.body = append([]byte{}, body...)
	f.bodySet = true
	return f
}

// WithPause makes a GoAway fault wait d after sending the GOAWAY before it
// answers the processed streams or closes the connection: a window in which
// the client knows of the GOAWAY but has no answer yet. Other faults ignore it.
func (f Fault) WithPause(d time.Duration) Fault {
	if f.kind == kindGoAway {
		f.delay = d
	}
	return f
}

// WithAbruptClose makes a GoAway fault whose streams get no answer close the
// TCP connection right after the GOAWAY (and the pause of WithPause), without
// waiting for the client to process it: a server that does not drain. A
// client still writing a request then may find the connection broken before
// it has read the GOAWAY, and can only report the stream as possibly
// processed. Other faults ignore it.
func (f Fault) WithAbruptClose() Fault {
	if f.kind == kindGoAway {
		f.abrupt = true
	}
	return f
}

// WithRefusedStream makes a GoAway fault reset each stream it processed
// (counted executed) with RST_STREAM(REFUSED_STREAM) once its request has
// arrived, instead of answering it or dropping the connection, and then
// close the connection gracefully: what HAProxy does at hard-stop-after to
// the streams it has already forwarded to its backend, after the GOAWAY it
// sent when the reload began. The REFUSED_STREAM is then false — the
// requests were executed — and the GOAWAY before it, which covered them,
// says so. The answer argument of GoAway is ignored. Other faults ignore
// it.
func (f Fault) WithRefusedStream() Fault {
	if f.kind == kindGoAway {
		f.refuse = true
	}
	return f
}

// HardStop is GoAway(inFlight, inFlight, false).WithRefusedStream(): a proxy
// shutting down hard, which resets every stream it holds with
// REFUSED_STREAM though it has executed them all, after a GOAWAY that covers
// them. HTTP/2 only.
func HardStop(inFlight int) Fault { return GoAway(inFlight, inFlight, false).WithRefusedStream() }

// WithErrCode makes a GoAway fault's GOAWAY carry code instead of NO_ERROR:
// a server shutting a connection down because of a problem (INTERNAL_ERROR,
// ENHANCE_YOUR_CALM). Other faults ignore it.
func (f Fault) WithErrCode(code http2.ErrCode) Fault {
	if f.kind == kindGoAway {
		f.code = code
	}
	return f
}

// WithDebugData returns a copy of f whose GOAWAY frame carries n bytes of
// debug data. It applies to GoAway only. n may exceed the largest frame the
// client accepts: that is a hostile peer, on purpose.
func (f Fault) WithDebugData(n int) Fault {
	f.debug = max(n, 0)
	return f
}

// statusCode is the status a Respond or Slow fault answers; the zero Fault
// answers 200.
func (f Fault) statusCode() int {
	if f.status == 0 {
		return 200
	}
	return f.status
}

func (f Fault) responseBody() []byte {
	if f.bodySet {
		return f.body
	}
	return defaultBody
}

// ConnLevel reports whether f is a connection-level fault (ResetOnAccept,
// CloseOnAccept, StallOnAccept), which Server.EnqueueConn takes, rather than
// a request-level one.
func (f Fault) ConnLevel() bool { return f.isConnLevel() }

// isConnLevel reports whether f applies to accepted connections rather than
// to requests.
func (f Fault) isConnLevel() bool {
	switch f.kind {
	case kindResetOnAccept, kindCloseOnAccept, kindStallOnAccept:
		return true
	}
	return false
}

// isHTTP2Only reports whether f has no meaning on HTTP/1.
func (f Fault) isHTTP2Only() bool {
	switch f.kind {
	case kindRefusedStream, kindResetStream, kindGoAway:
		return true
	}
	return false
}

// String returns the fault as the Go expression that builds it, e.g.
// `Respond(503, "Retry-After", "30")` or `GoAway(3, 1, true)`.
func (f Fault) String() string {
	var s string
	switch f.kind {
	case kindRespond:
		var b strings.Builder
		fmt.Fprintf(&b, "Respond(%d", f.statusCode())
		for _, kv := range f.header {
			fmt.Fprintf(&b, ", %q", kv)
		}
		b.WriteString(")")
		s = b.String()
	case kindSlow:
		s = fmt.Sprintf("Slow(%v, %d)", f.delay, f.statusCode())
	case kindQueued:
		s = fmt.Sprintf("Queued(%d, %v)", f.n, f.delay)
	case kindHang:
		s = "Hang()"
	case kindCloseBeforeRead:
		s = "CloseBeforeRead()"
	case kindResetBeforeRead:
		s = "ResetBeforeRead()"
	case kindResetAfterRead:
		s = "ResetAfterRead()"
	case kindPartialHeaders:
		s = "PartialHeaders()"
	case kindTruncatedBody:
		s = fmt.Sprintf("TruncatedBody(%d, %d)", f.n, f.m)
	case kindTrickle:
		s = fmt.Sprintf("Trickle(%v, %d)", f.delay, f.n)
	case kindHugeHeaders:
		s = fmt.Sprintf("HugeHeaders(%d)", f.n)
	case kindBadStatusLine:
		s = "BadStatusLine()"
	case kindEndlessBody:
		s = "EndlessBody()"
	case kindCloseMidStream:
		s = "CloseMidStream()"
	case kindRefusedStream:
		s = "RefusedStream()"
	case kindResetStream:
		s = fmt.Sprintf("ResetStream(%v)", f.code)
	case kindGoAway:
		if f.refuse && f.m == f.n && f.delay == 0 && !f.abrupt && f.code == http2.ErrCodeNo && f.debug == 0 {
			s = fmt.Sprintf("HardStop(%d)", f.n)
			break
		}
		s = fmt.Sprintf("GoAway(%d, %d, %t)", f.n, f.m, f.answer)
		if f.delay > 0 {
			s += fmt.Sprintf(".WithPause(%v)", f.delay)
		}
		if f.abrupt {
			s += ".WithAbruptClose()"
		}
		if f.refuse {
			s += ".WithRefusedStream()"
		}
		if f.code != http2.ErrCodeNo {
			s += fmt.Sprintf(".WithErrCode(%v)", f.code)
		}
		if f.debug > 0 {
			s += fmt.Sprintf(".WithDebugData(%d)", f.debug)
		}
	case kindResetOnAccept:
		s = "ResetOnAccept()"
	case kindCloseOnAccept:
		s = "CloseOnAccept()"
	case kindStallOnAccept:
		s = "StallOnAccept()"
	default:
		s = fmt.Sprintf("Fault(%d)", f.kind)
	}
	if f.bodySet && (f.kind == kindRespond || f.kind == kindSlow) {
		s += fmt.Sprintf(".WithBody(%d bytes)", len(f.body))
	}
	return s
}
