package attempt

import (
	"fmt"
	"net/http"

	"github.com/outboundhq/outbound/classify"
	"golang.org/x/net/http/httpguts"
)

// invalidRequest is a request that net/http would refuse to send.
type invalidRequest struct{ why string }

func (e *invalidRequest) Error() string { return "outbound: invalid request: " + e.why }

// Is makes errors.Is(err, classify.ErrInvalidRequest) hold.
func (e *invalidRequest) Is(target error) bool { return target == classify.ErrInvalidRequest }

// validate checks req as net/http does before it writes a byte of it, so that
// a request it would refuse is refused here, before admission, with an
// error that names the cause (never a value: a header value may be a
// secret). Found afterwards, such a refusal would look like a request that
// never left — and on HTTP/1 it would also close a healthy connection.
func validate(req *http.Request) error {
	if m := req.Method; m != "" && !httpguts.ValidHeaderFieldName(m) { // a method is a token, like a field name
		return &invalidRequest{fmt.Sprintf("method %q", m)}
	}
	if why := validFields(req.Header); why != "" {
		return &invalidRequest{"header " + why}
	}
	if why := validFields(req.Trailer); why != "" {
		return &invalidRequest{"trailer " + why}
	}
	if req.ContentLength != 0 && req.Body == nil {
		return &invalidRequest{fmt.Sprintf("Request.ContentLength=%d with nil Body", req.ContentLength)}
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if !httpguts.ValidHostHeader(host) {
		// net/http converts an internationalised host to punycode first.
		ascii, err := httpguts.PunycodeHostPort(host)
		if err != nil || !httpguts.ValidHostHeader(ascii) {
			return &invalidRequest{"Host header"}
		}
	}
	// The path is escaped when the request line is written; the query and
	// an opaque URL are sent as they are.
	if hasCTL(req.URL.RawQuery) || hasCTL(req.URL.Opaque) {
		return &invalidRequest{"control character in the URL"}
	}
	return nil
}

func validFields(h http.Header) string {
	for k, vv := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Sprintf("field name %q", k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Sprintf("field value for %q", k)
			}
		}
	}
	return ""
}

func hasCTL(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b < ' ' || b == 0x7f {
			return true
		}
	}
	return false
}
