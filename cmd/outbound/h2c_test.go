package main

import (
	"bufio"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/outboundhq/outbound/outboundtest"
)

// Calling a server that speaks only h2c without --h2c: every attempt is
// dropped without an answer; do finds out why with a connection opened
// with the HTTP/2 preface, and says so, keeping the commit status the
// attempts proved (unknown).
func TestDoSaysAnH2CServerNeedsH2C(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.H2C)
	defer s.Close()
	_, errOut := doExit(t, exitUnknown, []string{
		"protocol: the server speaks HTTP/2 without TLS (h2c), not HTTP/1.1 (it answered a connection opened with the HTTP/2 preface with SETTINGS): add --h2c",
		"verdict: unknown",
	}, "--max-attempts", "1", s.URL+"/x")
	if strings.Index(errOut, "protocol:") > strings.Index(errOut, "verdict:") {
		t.Errorf("the protocol comes after the verdict:\n%s", errOut)
	}
	if _, errOut := doExit(t, exitOK, nil, "--h2c", s.URL+"/x"); strings.Contains(errOut, "protocol:") {
		t.Errorf("with --h2c:\n%s", errOut)
	}
}

// The probe is not made, or finds nothing, against an HTTP/1 server that
// drops requests.
func TestDoDoesNotBlameTheProtocolOfAnHTTP1Server(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	s.SetDefault(outboundtest.ResetBeforeRead())
	_, errOut := doExit(t, exitUnknown, []string{"verdict: unknown"}, "-v", "--max-attempts", "1", s.URL+"/x")
	if strings.Contains(errOut, "protocol:") || !strings.Contains(errOut, "probing") {
		t.Errorf("stderr:\n%s", errOut)
	}
}

// A server that answers an HTTP/1.1 request with an HTTP/2 SETTINGS frame
// (what an h2c server writes first) is recognised from the answer itself.
func TestDoRecognisesASettingsFrameAnsweringHTTP1(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Read the request head, then answer as an h2c server does
			// to a connection that did not begin with the preface:
			// SETTINGS, then GOAWAY(PROTOCOL_ERROR).
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil || line == "\r\n" {
					break
				}
			}
			c.Write([]byte("\x00\x00\x06\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\xfa" +
				"\x00\x00\x08\x07\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"))
			c.Close()
		}
	}()
	doExit(t, exitUnknown, []string{
		"protocol: the server answered with an HTTP/2 SETTINGS frame: it speaks HTTP/2 without TLS (h2c), not HTTP/1.1; add --h2c",
		"malformed HTTP response",
	}, "--max-attempts", "1", "http://"+ln.Addr().String()+"/x")
	ln.Close()
	<-done
}

// --h2c to an HTTP/1.1 server: the answer is HTTP/1.1, and do says so.
// (Whether the request's headers were written before the answer arrived,
// which decides between not committed and unknown, is a race.)
func TestDoSaysAnHTTP1ServerNeedsNoH2C(t *testing.T) {
	s := outboundtest.NewServer(outboundtest.HTTP1)
	defer s.Close()
	code, _, errOut := runCLI("do", "--h2c", "--max-attempts", "1", s.URL+"/x")
	if code != exitNotCommitted && code != exitUnknown || !regexp.MustCompile(`protocol: the server (answered in|speaks) HTTP/1.1, not HTTP/2.*: drop --h2c`).MatchString(errOut) {
		t.Fatalf("exit %d:\n%s", code, errOut)
	}
}
