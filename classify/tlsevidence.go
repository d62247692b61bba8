package classify

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"reflect"
	"strings"
)

// TLSRefused reports whether err is a TLS handshake failure that would recur
// on every attempt: the server's certificate is not trusted (unknown
// authority), does not name the host, has expired or is not yet valid, or
// is otherwise invalid; or the two sides share no protocol version, cipher
// suite or application protocol, whichever side said so. Retrying such a
// failure only repeats the handshake.
//
// The certificate errors are typed. A refusal by the server arrives as a TLS
// alert, whose type crypto/tls does not export: it is recognised by type
// name and code. A local version mismatch exists only as text.
// TestTLSRefusalsOfThisGoVersion pins each case with a real handshake.
func TLSRefused(err error) bool {
	var (
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		hn x509.HostnameError
		ci x509.CertificateInvalidError
	)
	if errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) {
		return true
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if op, ok := e.(*net.OpError); ok && op.Op == "remote error" && refusingAlert(op.Err) {
			return true
		}
		msg := e.Error()
		for _, text := range tlsVersionTexts {
			if strings.HasPrefix(msg, text) {
				return true
			}
		}
	}
	return false
}

// The alerts a server sends when the handshake cannot succeed with these
// settings: handshake_failure (40, no common cipher suite or parameters),
// protocol_version (70), insufficient_security (71), no_application_protocol
// (120).
var refusingAlerts = [...]uint8{40, 70, 71, 120}

func refusingAlert(err error) bool {
	v := reflect.ValueOf(err)
	if !v.IsValid() || v.Type().Name() != "alert" || v.Type().PkgPath() != "crypto/tls" || v.Kind() != reflect.Uint8 {
		return false
	}
	code := uint8(v.Uint())
	for _, a := range refusingAlerts {
		if code == a {
			return true
		}
	}
	return false
}

// tlsVersionTexts are the client's own errors for a version mismatch.
var tlsVersionTexts = [...]string{
	"tls: server selected unsupported protocol version",
	"tls: no supported versions satisfy MinVersion and MaxVersion",
}
