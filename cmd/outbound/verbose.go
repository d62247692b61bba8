package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// printer prints what -v shows, as curl -v does: "*" for the library's own
// lines, ">" for what was sent, "<" for what came back.
type printer struct {
	w     io.Writer
	start time.Time
	mu    sync.Mutex
	u     *url.URL // of the request being sent (each redirect has its own)
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

func (p *printer) since() string {
	return fmt.Sprintf("%8.3fms", float64(time.Since(p.start).Microseconds())/1000)
}

func (p *printer) setURL(u *url.URL) {
	p.mu.Lock()
	p.u = u
	p.mu.Unlock()
}

// attemptStart prints the attempt's URL, and gives the attempt a trace that
// prints its request line and header fields once they are written.
func (p *printer) attemptStart(ctx context.Context, a outbound.AttemptInfo) context.Context {
	p.mu.Lock()
	u := p.u
	p.mu.Unlock()
	if u == nil {
		return ctx
	}
	p.printf("* %s attempt %d: %s %s\n", p.since(), a.Attempt, a.Method, u.Redacted())
	var mu sync.Mutex
	var fields [][2]string
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteHeaderField: func(key string, values []string) {
			mu.Lock()
			defer mu.Unlock()
			for _, v := range values {
				fields = append(fields, [2]string{key, v})
			}
		},
		WroteHeaders: func() {
			mu.Lock()
			written := fields
			fields = nil
			mu.Unlock()
			p.request(a.Method, u, written)
		},
	})
}

// request prints a request head as it was written: "> GET /path
// HTTP/1.1", then its fields. Over HTTP/2 the fields begin with the
// pseudo-header fields, from which the request line and Host are made.
func (p *printer) request(method string, u *url.URL, fields [][2]string) {
	proto, path, host := "HTTP/1.1", u.RequestURI(), ""
	var rest []string
	for _, f := range fields {
		switch f[0] {
		case ":method":
			method, proto = f[1], "HTTP/2"
		case ":path":
			path, proto = f[1], "HTTP/2"
		case ":authority":
			host, proto = f[1], "HTTP/2"
		case ":scheme", ":protocol":
		default:
			rest = append(rest, "> "+f[0]+": "+f[1]+"\n")
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "> %s %s %s\n", method, path, proto)
	if host != "" {
		b.WriteString("> Host: " + host + "\n")
	}
	b.WriteString(strings.Join(rest, ""))
	b.WriteString(">\n")
	p.printf("%s", b.String())
}

// attemptDone prints the result of an attempt: its status, or its failure.
func (p *printer) attemptDone(_ context.Context, a outbound.AttemptInfo, r outcome.Attempt) {
	if r.Status != 0 {
		p.printf("* %s attempt %d: answered %d %s\n", p.since(), a.Attempt, r.Status, http.StatusText(r.Status))
		return
	}
	line := fmt.Sprintf("* %s attempt %d: %s at %s (%s)", p.since(), a.Attempt, r.Category, r.Stage, r.Evidence)
	if r.Err != nil {
		line += ": " + cause(r.Err).Error()
	}
	p.printf("%s\n", line)
}

// retryDecided prints what follows an attempt that did not end the call.
func (p *printer) retryDecided(_ context.Context, a outbound.AttemptInfo, d retry.Decision) {
	if d.Retry {
		p.printf("* %s attempt %d: %s: another attempt in %v\n", p.since(), a.Attempt, d.Reason, d.Wait.Round(time.Millisecond))
		return
	}
	p.printf("* %s attempt %d: %s: no other attempt\n", p.since(), a.Attempt, d.Reason)
}

func (p *printer) event(e admission.Event) { p.printf("* %s %s\n", p.since(), e) }

// response prints the answer's head: "< HTTP/1.1 200 OK", its fields.
func (p *printer) response(resp *http.Response) {
	var b strings.Builder
	b.WriteString("< " + strings.TrimRight(statusLine(resp), " ") + "\n")
	for _, l := range headerLines(resp) {
		b.WriteString("< " + l + "\n")
	}
	b.WriteString("<\n")
	p.printf("%s", b.String())
}
