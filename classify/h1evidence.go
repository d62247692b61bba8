package classify

import (
	"errors"
	"reflect"
)

// NoResponseByte reports whether err is how net/http's HTTP/1 client says
// that the connection ended before the first byte of the response: the read
// that waits for the response failed (net/http wraps that error in its
// unexported transportReadFromServerError, recognised by type name), or the
// server closed the connection while it was idle ("http: server closed idle
// connection"). On a reused connection that is the keep-alive race: the
// server closed an idle connection as the request arrived.
// TestNoResponseByteErrorsOfThisGoVersion fails loudly when a Go release
// changes either.
func NoResponseByte(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == serverClosedIdleText {
			return true
		}
		t := reflect.TypeOf(e)
		if t.Kind() == reflect.Struct && t.Name() == "transportReadFromServerError" && t.PkgPath() == "net/http" {
			return true
		}
	}
	return false
}

const serverClosedIdleText = "http: server closed idle connection"
