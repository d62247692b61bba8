// Package classify says what a failed attempt proves about the upstream.
//
// Every finished attempt has a Stage (how far it got: admission, DNS, dial,
// TLS, writing headers, writing the body, awaiting the response, reading the
// body) and a Category (what that proves):
//
//   - LocalRejection: it never left the process — a local guard refused it,
//     or the request is invalid and the HTTP client would refuse to send it.
//   - NotSent: proven not processed by the upstream — no connection, not a
//     byte of the request reached the socket, an HTTP/2 RST_STREAM with
//     REFUSED_STREAM, a stream above the last-stream-id of a GOAWAY
//     (RFC 9113 §8.7), or no stream opened because the connection was
//     shutting down.
//   - Ambiguous: request bytes left and no status came back; the upstream may
//     have processed it. A stream at or below a GOAWAY's last id, and any
//     other stream reset, stay here (RFC 9113 §6.8) — and so does a
//     REFUSED_STREAM that the peer contradicted (it came from a connection
//     that was going away, after a GOAWAY that covered the stream) or that
//     the caller does not trust from this peer (Facts.DistrustRefused).
//   - Answered: a status line arrived. A body that fails after it is still
//     Answered, with a truncated body.
//
// The same error value (io.EOF, ECONNRESET) appears for "nothing sent" and
// for "processed, then the connection closed", so the classification rests on
// the stage and on the bytes written, never on the error value alone. Where Go
// offers only error text or an unexported type, the match lives in one file
// per protocol (h1evidence.go, h2evidence.go, tlsevidence.go), with a test
// per case.
package classify

import (
	"errors"
	"fmt"
	"net"
)

// Stage is how far an attempt got.
type Stage uint8

const (
	StageAdmission    Stage = iota + 1 // refused before the wire: by a local guard, or as invalid
	StageDNS                           // resolving the host
	StageDial                          // opening the TCP connection
	StageTLS                           // the TLS handshake (and HTTP/2 preface)
	StageWriteHeaders                  // writing the request line and headers
	StageWriteBody                     // writing the request body
	StageAwait                         // request written, awaiting the response headers
	StageReadBody                      // status received, reading the response body
)

var stageNames = [...]string{StageAdmission: "admission", StageDNS: "dns", StageDial: "dial", StageTLS: "tls",
	StageWriteHeaders: "write-headers", StageWriteBody: "write-body", StageAwait: "await-response", StageReadBody: "read-body"}

func (s Stage) String() string {
	if int(s) < len(stageNames) && stageNames[s] != "" {
		return stageNames[s]
	}
	return fmt.Sprintf("Stage(%d)", uint8(s))
}

// Connecting reports whether s is one of the connection stages (DNS, dial,
// TLS): no connection existed for the request.
func (s Stage) Connecting() bool { return s == StageDNS || s == StageDial || s == StageTLS }

// Category is what a finished attempt proves about the upstream.
type Category uint8

const (
	LocalRejection Category = iota + 1 // never left the process
	NotSent                            // proven not processed by the upstream
	Ambiguous                          // may have been processed
	Answered                           // the upstream replied with a status
)

var categoryNames = [...]string{LocalRejection: "LocalRejection", NotSent: "NotSent", Ambiguous: "Ambiguous", Answered: "Answered"}

func (c Category) String() string {
	if int(c) < len(categoryNames) && categoryNames[c] != "" {
		return categoryNames[c]
	}
	return fmt.Sprintf("Category(%d)", uint8(c))
}

// Evidence names the fact a category rests on.
type Evidence uint8

const (
	EvidenceLocalGuard           Evidence = iota + 1 // a local guard refused the attempt
	EvidenceNoConnection                             // no connection was established
	EvidenceNothingWritten                           // no byte of the request reached the socket
	EvidenceRefusedStream                            // HTTP/2 RST_STREAM REFUSED_STREAM
	EvidenceGoAwayAbove                              // HTTP/2 stream above the GOAWAY's last-stream-id
	EvidenceGoAwayAtOrBelow                          // HTTP/2 stream at or below the GOAWAY's last-stream-id
	EvidenceStreamReset                              // HTTP/2 RST_STREAM with another code
	EvidenceBytesWritten                             // request bytes left; no status came back
	EvidenceStatus                                   // a status line arrived
	EvidenceCancelledInFlight                        // the context ended while the request may still have been going out
	EvidenceInvalidRequest                           // the request is invalid: the HTTP client refuses to send it
	EvidenceConnShuttingDown                         // HTTP/2: no stream was opened, the connection had received a GOAWAY
	EvidenceGoAwayAboveWithError                     // HTTP/2 stream above the last-stream-id of a GOAWAY that carried an error code
	EvidenceIdleConnClosed                           // HTTP/1: the server closed a reused connection before any byte of the response
	EvidenceTLSRefused                               // the TLS handshake failed for good: certificate or protocol refused
	EvidenceConnLimit                                // no connection: the attempt gave up waiting for one (Transport.MaxConnsPerHost)
	EvidenceConnNotEstablished                       // HTTP/2: no stream was opened: the new connection closed before its first request
	EvidenceRequestBodyFailed                        // the request's body returned an error while it was being sent: a fault of the caller
	EvidenceClientClosed                             // the client was closed before or during the attempt
	EvidenceResetWhileDraining                       // HTTP/2: a stream reset (REFUSED_STREAM included) on a connection that was going away
	EvidenceRefusedUntrusted                         // HTTP/2 RST_STREAM REFUSED_STREAM from a peer the caller does not trust to give it
)

var evidenceNames = [...]string{EvidenceLocalGuard: "local guard", EvidenceNoConnection: "no connection",
	EvidenceNothingWritten: "nothing written", EvidenceRefusedStream: "REFUSED_STREAM",
	EvidenceGoAwayAbove: "stream above GOAWAY last-stream-id", EvidenceGoAwayAtOrBelow: "stream at or below GOAWAY last-stream-id",
	EvidenceStreamReset: "stream reset", EvidenceBytesWritten: "request bytes written, no status", EvidenceStatus: "status received",
	EvidenceCancelledInFlight: "cancelled while the request may still have been going out",
	EvidenceInvalidRequest:    "invalid request", EvidenceConnShuttingDown: "no stream opened: connection shutting down (GOAWAY)",
	EvidenceGoAwayAboveWithError: "stream above the last-stream-id of a GOAWAY with an error code",
	EvidenceIdleConnClosed:       "reused connection closed before any response byte",
	EvidenceTLSRefused:           "TLS handshake refused (certificate or protocol)",
	EvidenceConnLimit:            "no connection free (MaxConnsPerHost)",
	EvidenceConnNotEstablished:   "no stream opened: the new connection closed before its first request",
	EvidenceRequestBodyFailed:    "the request's body failed while it was being sent",
	EvidenceClientClosed:         "the client was closed",
	EvidenceResetWhileDraining:   "stream reset by a connection going away (after its GOAWAY)",
	EvidenceRefusedUntrusted:     "REFUSED_STREAM, not trusted from this upstream"}

// ClientFault reports whether a failure classified as ev was the client's own
// doing rather than the upstream's: the request's body failed to read, or the
// client was closed. Such a failure is never an upstream failure for the
// breaker or the retry budget, and it is not retried.
func ClientFault(ev Evidence) bool {
	return ev == EvidenceRequestBodyFailed || ev == EvidenceClientClosed
}

func (e Evidence) String() string {
	if int(e) < len(evidenceNames) && evidenceNames[e] != "" {
		return evidenceNames[e]
	}
	return fmt.Sprintf("Evidence(%d)", uint8(e))
}

// Sentinels, one per category, matched by *Error with errors.Is.
var (
	ErrLocalRejection = errors.New("attempt rejected locally: never sent")
	ErrNotSent        = errors.New("attempt proven not processed by the upstream")
	ErrAmbiguous      = errors.New("attempt may have been processed by the upstream")
	ErrAnswered       = errors.New("attempt answered; the response body failed")
)

// Error is a classified failed attempt. errors.Is(err, ErrNotSent) (and the
// other category sentinels) matches its category; Unwrap gives the cause.
type Error struct {
	Upstream string
	Stage    Stage
	Category Category
	Evidence Evidence
	// Lifecycle reports that the failure came from the life of the
	// connection, not from the upstream's health: see Lifecycle.
	Lifecycle bool
	Err       error
}

func (e *Error) Error() string {
	return fmt.Sprintf("outbound: %s: %s at %s (%s): %v", e.Upstream, e.Category, e.Stage, e.Evidence, e.Err)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of e's category.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrLocalRejection:
		return e.Category == LocalRejection
	case ErrNotSent:
		return e.Category == NotSent
	case ErrAmbiguous:
		return e.Category == Ambiguous
	case ErrAnswered:
		return e.Category == Answered
	}
	return false
}

// Facts are what an attempt observed about itself when it failed without a
// response.
type Facts struct {
	// Reused reports that the connection had carried a request before
	// this attempt; HTTP1, that it is known to speak HTTP/1.
	Reused, HTTP1 bool
	// Stage is how far the attempt got.
	Stage Stage
	// Written is the number of bytes that reached the connection's socket
	// since the attempt started (successful writes only, below TLS).
	Written int64
	// Err is the error the attempt ended with.
	Err error
	// Cancelled reports that the attempt's context had ended when it
	// failed. A transport may still be writing the request then (HTTP/2
	// writes a stream's frames from its own goroutine), so zero bytes
	// written so far proves nothing.
	Cancelled bool
	// Draining reports that, when the attempt failed, its HTTP/2
	// connection was going away: it could take no new stream though it
	// was below its concurrency limit (it had received a GOAWAY, or was
	// closing), or it was closed. A stream reset from such a connection
	// proves nothing: the peer's GOAWAY said the stream might have been
	// processed, and a proxy shutting down resets streams it has already
	// forwarded with REFUSED_STREAM (HAProxy's hard-stop-after).
	Draining bool
	// DistrustRefused reports that the caller does not trust this
	// upstream to send REFUSED_STREAM only for requests it did not
	// process: HAProxy also sends it for a request its backend executed
	// and then failed to answer.
	DistrustRefused bool
}

// Failure classifies an attempt that ended without a response.
//
// The order of the rules: a local rejection or a missing connection proves
// non-processing. A stream reset from a connection that was going away
// (Facts.Draining) proves nothing, REFUSED_STREAM included, and neither
// does a REFUSED_STREAM the caller does not trust from this upstream
// (Facts.DistrustRefused); other HTTP/2 evidence proves non-processing
// (REFUSED_STREAM, a stream above the GOAWAY's last id, no stream opened on
// a connection shutting down), and so does nothing written — zero bytes on
// the socket, or net/http's own word that it wrote no byte of the request
// (see nothingWritten) — unless the attempt's context had ended, since the
// request may still have been going out. On HTTP/2 the byte count of the
// socket includes other streams, so a non-zero count proves nothing and the
// stream evidence decides; with no such evidence the attempt is Ambiguous,
// and so is a reused HTTP/1 connection that the server closed before any
// byte of the response came back, whether the client noticed it reading or
// still writing (the request may have arrived).
func Failure(f Facts) (Category, Evidence) {
	switch {
	case f.Stage == StageAdmission:
		return LocalRejection, EvidenceLocalGuard
	case f.Stage.Connecting():
		return NotSent, EvidenceNoConnection
	}
	h2 := HTTP2Evidence(f.Err)
	switch {
	case f.Draining && (h2 == EvidenceRefusedStream || h2 == EvidenceStreamReset && !protocolError(f.Err)):
		// A PROTOCOL_ERROR reset makes net/http stop using the connection
		// itself: it is not a sign that the peer was going away.
		return Ambiguous, EvidenceResetWhileDraining
	case h2 == EvidenceRefusedStream && f.DistrustRefused:
		return Ambiguous, EvidenceRefusedUntrusted
	case h2 == EvidenceRefusedStream || h2 == EvidenceGoAwayAbove || h2 == EvidenceGoAwayAboveWithError ||
		h2 == EvidenceConnShuttingDown || h2 == EvidenceConnNotEstablished:
		return NotSent, h2
	case f.Written == 0 && f.Cancelled:
		return Ambiguous, EvidenceCancelledInFlight
	case (f.Written == 0 || nothingWritten(f.Err)) && !f.Cancelled:
		return NotSent, EvidenceNothingWritten
	case h2 != 0:
		return Ambiguous, h2
	case f.Reused && f.HTTP1 && !f.Cancelled && (noResponseByte(f.Err) || f.Stage == StageWriteBody):
		// The connection died before the answer began: the read that
		// waited for it failed, or the request could not be written to
		// the end (HTTP/1 answers after the request).
		return Ambiguous, EvidenceIdleConnClosed
	}
	return Ambiguous, EvidenceBytesWritten
}

// Lifecycle reports whether a failure classified as ev came from the life of
// the connection rather than from the upstream's health: a stream above the
// last-stream-id of a graceful GOAWAY, or at or below it and never answered
// before the connection closed, a stream reset by a connection that was
// going away, no stream opened on a connection that was shutting down, a new
// HTTP/2 connection that closed before its first request, or a reused
// connection that the server closed before any byte of the response (the
// keep-alive race: it closed an idle connection as the request arrived) —
// with nothing written, or with a request that may have arrived. Such a
// failure is not an upstream failure, and a retry of it may be transparent
// (it costs no retry budget and no attempt), as long as the retry rules
// allow it at all.
func Lifecycle(f Facts, ev Evidence) bool {
	switch ev {
	case EvidenceGoAwayAbove, EvidenceConnShuttingDown, EvidenceConnNotEstablished, EvidenceIdleConnClosed,
		EvidenceResetWhileDraining:
		return true
	case EvidenceGoAwayAtOrBelow:
		return gracefulGoAway(f.Err)
	case EvidenceNothingWritten:
		return f.Reused
	}
	return false
}

// InferStage locates a failure that came with no response from what is
// known of it: nothing written means the request line and headers never
// left; a failed write (a *net.OpError whose Op is "write" or "readfrom")
// means the request was being written; anything else means the request was
// out and the response awaited.
func InferStage(written int64, err error) Stage {
	if written == 0 {
		return StageWriteHeaders
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if op, ok := e.(*net.OpError); ok && (op.Op == "write" || op.Op == "readfrom") {
			return StageWriteBody
		}
	}
	return StageAwait
}
