package classify

import (
	"errors"
	"reflect"
)

// noResponseByte reports whether err is how net/http's HTTP/1 client says
// that the connection ended before the first byte of the response: the read
// that waits for the response failed (net/http wraps that error in its
// unexported transportReadFromServerError, recognised by type name), or the
// server closed the connection while it was idle ("http: server closed idle
// connection"). On a reused connection that is the keep-alive race: the
// server closed an idle connection as the request arrived.
// TestNoResponseByteErrorsOfThisGoVersion fails loudly when a Go release
// changes either.
func noResponseByte(err error) bool {
	return netHTTPError(err, serverClosedIdleText, "transportReadFromServerError")
}

// nothingWritten reports whether err is how net/http's HTTP/1 client says
// that it wrote no byte of the request: its unexported nothingWrittenError
// (the connection broke, and the bytes it had written to the connection —
// counted above TLS — had not grown since the request began), recognised by
// type name, or "http: server closed idle connection", which it gives a
// request only when the connection closed while it carried no request, so
// before this one was on it. Under TLS it is the better evidence: the
// connection's byte count includes the close_notify alert that TLS writes
// when net/http closes the connection, which can happen after an attempt
// began and before it wrote anything.
// TestServerClosedIdleTextOfThisGoVersion and
// TestAnHTTP1RequestNetHTTPNeverWroteIsNotSentThoughTLSWroteItsCloseNotify
// fail loudly when a Go release changes either.
func nothingWritten(err error) bool {
	return netHTTPError(err, serverClosedIdleText, "nothingWrittenError")
}

const serverClosedIdleText = "http: server closed idle connection"

// netHTTPError reports whether err's chain holds an error whose text is
// text, or one of net/http's unexported struct types named typeName.
func netHTTPError(err error, text, typeName string) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == text {
			return true
		}
		t := reflect.TypeOf(e)
		if t.Kind() == reflect.Struct && t.Name() == typeName && t.PkgPath() == "net/http" {
			return true
		}
	}
	return false
}
