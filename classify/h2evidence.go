package classify

import (
	"errors"
	"reflect"
	"strings"

	"golang.org/x/net/http2"
)

// HTTP2Evidence extracts the HTTP/2 protocol evidence carried by err, or 0.
//
// It recognises:
//   - a stream reset: http2.StreamError, which net/http's bundled copy also
//     converts to through errors.As. REFUSED_STREAM proves the stream was not
//     processed (RFC 9113 §8.7); any other code proves nothing.
//   - a stream at or below a GOAWAY's last-stream-id: x/net's
//     http2.GoAwayError, or net/http's unexported copy of it, recognised by
//     its type name and its LastStreamID field, since it has no errors.As
//     hook (golang/go#74578). The transport returns it only to streams it
//     had already accepted as "at or below"; they may have been processed.
//   - a stream above the last-stream-id: net/http and x/net abort such
//     streams with an error that exists only as text: the graceful one, or,
//     for the first stream of a connection, one that names the GOAWAY's
//     error code (net/http names the code to no other stream).
//   - no stream opened: a request that was to open a stream on a
//     connection that had received a GOAWAY meanwhile (between
//     http.ClientConn.Reserve and the stream's slot) fails, before any frame
//     of it is written, with net/http's unexported "client conn not usable"
//     error, recognised by its text.
//
// TestGoAwayTextsOfThisGoVersion and TestConnNotUsableTextOfThisGoVersion
// fail loudly when a Go release changes the texts.
func HTTP2Evidence(err error) Evidence {
	if err == nil {
		return 0
	}
	var se http2.StreamError
	if errors.As(err, &se) {
		if se.Code == http2.ErrCodeRefusedStream {
			return EvidenceRefusedStream
		}
		return EvidenceStreamReset
	}
	var ga http2.GoAwayError
	if errors.As(err, &ga) || bundledGoAway(err) {
		return EvidenceGoAwayAtOrBelow
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch msg := e.Error(); {
		case msg == goAwayGracefulText:
			return EvidenceGoAwayAbove
		case strings.HasPrefix(msg, goAwayErrCodeText):
			return EvidenceGoAwayAboveWithError
		case msg == connNotUsableText:
			return EvidenceConnShuttingDown
		case msg == connNotEstablishedText:
			return EvidenceConnNotEstablished
		}
	}
	return 0
}

// protocolError reports whether err carries a stream reset with
// PROTOCOL_ERROR.
func protocolError(err error) bool {
	var se http2.StreamError
	return errors.As(err, &se) && se.Code == http2.ErrCodeProtocol
}

// gracefulGoAway reports whether err is the error of a stream at or below
// the last-stream-id of a GOAWAY without an error code (NO_ERROR), left
// unanswered when the connection closed: a server shutting the connection
// down, not one in trouble. x/net's http2.GoAwayError and net/http's
// unexported copy of it carry the code.
func gracefulGoAway(err error) bool {
	var ga http2.GoAwayError
	if errors.As(err, &ga) {
		return ga.ErrCode == http2.ErrCodeNo
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if v, ok := bundledGoAwayValue(e); ok {
			code := v.FieldByName("ErrCode")
			return code.IsValid() && code.CanUint() && code.Uint() == uint64(http2.ErrCodeNo)
		}
	}
	return false
}

// The texts with which Go's HTTP/2 transports abort a stream whose id is
// above the last-stream-id of a GOAWAY they received: the graceful one (or
// any GOAWAY for a stream other than the connection's first), and the one
// for the first stream of a connection when the GOAWAY carries an error code.
//
// connNotUsableText is the error of a request that found its connection
// shutting down before it could open a stream.
const (
	goAwayGracefulText = "http2: Transport received Server's graceful shutdown GOAWAY"
	goAwayErrCodeText  = "http2: Transport received GOAWAY from server ErrCode:"
	connNotUsableText  = "http2: client conn not usable"

	// connNotEstablishedText is the error of the first request of a new
	// connection that closed before the request could open a stream (the
	// TLS and HTTP/2 handshakes count as bytes written: without this text
	// the attempt would look Ambiguous).
	connNotEstablishedText = "http2: client conn could not be established"
)

// bundledGoAway recognises net/http's unexported http2GoAwayError anywhere
// in err's chain.
func bundledGoAway(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if _, ok := bundledGoAwayValue(e); ok {
			return true
		}
	}
	return false
}

// bundledGoAwayValue returns e as a struct value if it is net/http's
// unexported http2GoAwayError.
func bundledGoAwayValue(e error) (reflect.Value, bool) {
	t := reflect.TypeOf(e)
	if t.Kind() == reflect.Struct && t.Name() == "http2GoAwayError" && t.PkgPath() == "net/http" {
		if _, ok := t.FieldByName("LastStreamID"); ok {
			return reflect.ValueOf(e), true
		}
	}
	return reflect.Value{}, false
}
