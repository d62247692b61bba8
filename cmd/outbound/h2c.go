package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
)

// probeTimeout bounds the connection that asks a server whether it speaks
// h2c.
const probeTimeout = time.Second

// protocolHint returns a line saying that the server speaks another
// protocol than the request did, or "" when nothing shows it. It is asked
// after a call that got no answer and was not ended by its deadline or
// Ctrl-C. What it finds does not change the commit status: a server that
// did not understand a request most likely did not process it, but the
// attempts do not prove it.
func protocolHint(ctx context.Context, tr *http.Transport, req *http.Request, h2c bool, out *outcome.Outcome, p *printer, verbose bool) string {
	const (
		needH2C   = "protocol: the server speaks HTTP/2 without TLS (h2c), not HTTP/1.1 (it answered a connection opened with the HTTP/2 preface with SETTINGS): add --h2c"
		needHTTP1 = "protocol: the server speaks HTTP/1.1, not HTTP/2 (it answered the HTTP/2 preface with an HTTP/1.1 status line): drop --h2c"
	)
	if req.URL.Scheme != "http" || len(out.Attempts) == 0 {
		return ""
	}
	for _, a := range out.Attempts {
		switch {
		case a.Err == nil:
		case h2c && strings.Contains(a.Err.Error(), "looked like an HTTP/1.1 header"):
			// net/http's HTTP/2 framer read an HTTP/1.1 answer as a
			// frame header, and says so.
			return "protocol: the server answered in HTTP/1.1, not HTTP/2: drop --h2c"
		case !h2c && settingsAnswer(a.Err):
			return "protocol: the server answered with an HTTP/2 SETTINGS frame: it speaks HTTP/2 without TLS (h2c), not HTTP/1.1; add --h2c"
		}
	}
	// A server that speaks only h2c drops an HTTP/1.1 request, without a
	// byte of an answer, on every attempt; an HTTP/1.1 server's answer to
	// the HTTP/2 preface may break the connection before net/http reports
	// what it read. Other servers fail so for their own reasons: a
	// connection opened with the HTTP/2 preface, and no request, tells
	// them apart.
	for _, a := range out.Attempts {
		if !dropped(a) && !(h2c && lostConnection(a)) {
			return ""
		}
	}
	if tr.Proxy != nil {
		if proxy, err := tr.Proxy(req); err != nil || proxy != nil {
			return ""
		}
	}
	addr := req.URL.Host
	if req.URL.Port() == "" {
		addr = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	if verbose {
		p.printf("* %s every attempt failed without an answer: probing %s with the HTTP/2 preface\n", p.since(), addr)
	}
	first := probe(ctx, addr)
	if verbose {
		p.printf("* %s probe: the server's first bytes: %q\n", p.since(), first)
	}
	switch {
	case !h2c && isSettings(first):
		return needH2C
	case h2c && strings.HasPrefix(string(first), "HTTP/1."):
		return needHTTP1
	}
	return ""
}

// lostConnection reports whether an attempt failed on a connection that
// broke before a stream could be opened on it (HTTP/2).
func lostConnection(a outcome.Attempt) bool {
	return a.Err != nil && a.Status == 0 && a.Evidence == classify.EvidenceNoConnection && a.Stage == classify.StageTLS
}

// dropped reports whether an attempt failed because the connection was
// reset or closed after the request was sent, before any byte of an answer.
func dropped(a outcome.Attempt) bool {
	if a.Err == nil || a.Status != 0 || a.Stage != classify.StageAwait && a.Stage != classify.StageWriteHeaders && a.Stage != classify.StageWriteBody {
		return false
	}
	err := a.Err
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || errors.Is(err, classify.ErrAttemptTimeout) {
		return false
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	msg := err.Error()
	return strings.HasSuffix(msg, "connection reset by peer") || strings.HasSuffix(msg, "broken pipe") || strings.HasSuffix(msg, ": EOF")
}

// settingsAnswer reports whether err is net/http's HTTP/1 transport
// refusing an answer whose first line is an HTTP/2 SETTINGS frame: what a
// server that speaks only h2c sends first.
func settingsAnswer(err error) bool {
	const prefix = "malformed HTTP response "
	msg := err.Error()
	i := strings.Index(msg, prefix)
	if i < 0 {
		return false
	}
	q, qerr := strconv.QuotedPrefix(msg[i+len(prefix):])
	if qerr != nil {
		return false
	}
	line, _ := strconv.Unquote(q)
	return isSettings([]byte(line))
}

// isSettings reports whether b begins with the header of a SETTINGS frame
// (RFC 9113 §4.1, §6.5): a length that is a multiple of 6, type 4, no flag
// but ACK, stream 0.
func isSettings(b []byte) bool {
	if len(b) < 9 {
		return false
	}
	n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
	return b[3] == byte(http2.FrameSettings) && b[4]&^byte(http2.FlagSettingsAck) == 0 &&
		b[5]&0x7f|b[6]|b[7]|b[8] == 0 && n%6 == 0
}

// probe opens a connection to addr that sends the HTTP/2 client preface
// and an empty SETTINGS frame, and no request, and returns the first bytes
// the server answers (at most 9: a frame header).
func probe(ctx context.Context, addr string) []byte {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	hello := append([]byte(http2.ClientPreface), 0, 0, 0, byte(http2.FrameSettings), 0, 0, 0, 0, 0)
	if _, err := c.Write(hello); err != nil {
		return nil
	}
	head := make([]byte, 9)
	n, _ := io.ReadFull(c, head)
	return head[:n]
}
