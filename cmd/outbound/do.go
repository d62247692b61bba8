package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/admission/bulkhead"
	"github.com/outboundhq/outbound/admission/ratelimit"
	"github.com/outboundhq/outbound/classify"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

// interrupt is the signal that ends a call early; a test replaces it.
var interrupt = []os.Signal{os.Interrupt}

func doCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("do", flag.ContinueOnError)
	fs.SetOutput(stderr)
	method := fs.String("X", "", "request `METHOD` (default GET, or POST with -d)")
	var headers stringList
	fs.Var(&headers, "H", "request `HEADER` 'Name: value' (repeatable; 'Host: name' sets the host)")
	data := fs.String("d", "", "request body `DATA`: literal, @FILE (re-readable) or @- (standard input: a one-shot body); sent as application/x-www-form-urlencoded unless -H sets a Content-Type")
	include := fs.Bool("i", false, "print the response status line and headers before the body")
	verbose := fs.Bool("v", false, "also print, per attempt, the request and response headers and every guard event")
	timeout := fs.Duration("timeout", 30*time.Second, "deadline of the whole call (`DURATION`)")
	attemptTimeout := fs.Duration("attempt-timeout", 0, "deadline of each attempt (`DURATION`; 0: none)")
	maxAttempts := fs.Int("max-attempts", 3, "most attempts, the first included (`N`; 1: no retry)")
	maxRetryAfter := fs.Duration("max-retry-after", 30*time.Second, "longest Retry-After honoured (`DURATION`)")
	rate := fs.Float64("rate", 0, "rate limit of the upstream, attempts per second (`N`; 0: none)")
	bulkheadN := fs.Int("bulkhead", 0, "most attempts in flight to the upstream (`N`; 0: no bulkhead)")
	idemKey := fs.Bool("idempotency-key", false, "attach a generated Idempotency-Key to a non-idempotent request")
	h2c := fs.Bool("h2c", false, "speak HTTP/2 without TLS (prior knowledge) to http:// URLs")
	cacert := fs.String("cacert", "", "PEM `FILE` of the CA certificates to trust for https://")
	insecure := fs.Bool("k", false, "do not verify the server's certificate")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: outbound do [flags] URL

Sends one request through the full pipeline (circuit breaker, rate limiter,
bulkhead, classification, safe retries) and explains the outcome: the commit
status, and every attempt with its stage, category, duration and why it was
or was not retried. The response body goes to standard output, the
explanation to standard error. Flags may come before or after the URL.
Ctrl-C ends the call and prints its verdict.

Exit status: 0 answered (any status), 3 not committed (proven not processed),
4 unknown (may have been processed), 1 other errors, 2 usage (a bad URL).

Flags:
`)
		printFlags(stderr, fs)
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "outbound do: give exactly one URL (outbound do -h)")
		return exitUsage
	}
	rawURL := fs.Arg(0)
	if err := checkURL(rawURL); err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}

	tr := &http.Transport{Proxy: http.ProxyFromEnvironment}
	if *h2c {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = p
	}
	if *cacert != "" || *insecure {
		cfg := &tls.Config{InsecureSkipVerify: *insecure} //nolint:gosec // the user asked for -k
		if *cacert != "" {
			pem, err := os.ReadFile(*cacert)
			if err != nil {
				fmt.Fprintln(stderr, "outbound do: reading --cacert:", err)
				return exitUsage
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				fmt.Fprintf(stderr, "outbound do: no PEM certificate in %s\n", *cacert)
				return exitUsage
			}
			cfg.RootCAs = pool
		}
		tr.TLSClientConfig = cfg
	}
	p := &printer{w: stderr, start: time.Now()}
	cfg := outbound.Config{HTTPTransport: tr, MaxAttempts: *maxAttempts, AttemptTimeout: *attemptTimeout,
		MaxRetryAfter: *maxRetryAfter, IdempotencyKeys: *idemKey,
		Admission: admission.Config{Rate: ratelimit.Config{PerSecond: *rate}, Bulkhead: bulkhead.Config{MaxConcurrent: *bulkheadN}}}
	if *verbose {
		cfg.Admission.OnEvent = p.event
		cfg.Hooks = outbound.Hooks{AttemptStart: p.attemptStart}
	}
	t, err := outbound.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}
	defer t.Close()

	req, err := newRequest(*method, rawURL, *data, headers)
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), interrupt...)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if *verbose {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaderField: p.wroteHeader})
	}
	req = req.WithContext(ctx)

	resp, out, err := t.Do(req)
	if resp != nil {
		if *verbose {
			p.response(resp)
		}
		if *include {
			writeHead(stdout, resp)
		}
		_, copyErr := io.Copy(stdout, resp.Body)
		resp.Body.Close()
		if copyErr != nil {
			fmt.Fprintln(stderr, "! reading the body:", copyErr)
		}
	}
	if ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled) { // Ctrl-C, during the call or its body
		fmt.Fprintln(stderr, "interrupted: the call was ended before it finished")
	}
	explain(stderr, out, resp)
	var ce *classify.Error
	switch {
	case errors.Is(err, classify.ErrInvalidRequest) || errors.As(err, &ce) && ce.Evidence == classify.EvidenceInvalidRequest:
		fmt.Fprintln(stderr, "outbound do: the request cannot be sent:", cause(err))
		return exitUsage
	case out.Commit == outcome.NotCommitted:
		fmt.Fprintln(stderr, "verdict: not committed — proven not processed by the upstream; safe to send again")
		return exitNotCommitted
	case out.Commit == outcome.Unknown:
		fmt.Fprintln(stderr, "verdict: unknown — the upstream may have processed it; reconcile before sending again")
		return exitUnknown
	case err != nil:
		fmt.Fprintln(stderr, "error:", err)
		return exitFailed
	}
	return exitOK
}

// checkURL refuses, before any attempt, what curl would call a bad URL.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("bad URL %q: %v", raw, errors.Unwrap(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("bad URL %q: want an http:// or https:// URL", raw)
	}
	if u.Host == "" {
		return fmt.Errorf("bad URL %q: no host", raw)
	}
	return nil
}

// newRequest builds the request from the flags: -d sets a body, literal
// (replayable), @FILE (re-opened for each attempt) or @- (standard input,
// one-shot: never re-sent once read), as a form unless a header says
// otherwise, as curl does; -H Host: sets the request's host.
func newRequest(method, rawURL, data string, headers []string) (*http.Request, error) {
	if method == "" {
		method = http.MethodGet
		if data != "" {
			method = http.MethodPost
		}
	}
	var body io.Reader
	var getBody func() (io.ReadCloser, error)
	switch {
	case data == "@-":
		body = io.NopCloser(os.Stdin)
	case strings.HasPrefix(data, "@"):
		name := data[1:]
		getBody = func() (io.ReadCloser, error) { return os.Open(name) }
		f, err := getBody()
		if err != nil {
			return nil, fmt.Errorf("-d %s: %w", data, err)
		}
		body = f
	case data != "":
		body = strings.NewReader(data)
	}
	req, err := http.NewRequest(method, rawURL, body)
	if err != nil {
		return nil, err
	}
	if getBody != nil {
		req.GetBody = getBody
		if st, err := os.Stat(data[1:]); err == nil {
			req.ContentLength = st.Size()
		}
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			return nil, fmt.Errorf("-H %q: want 'Name: value'", h)
		}
		if strings.EqualFold(name, "Host") {
			req.Host = value
			continue
		}
		req.Header.Add(name, value)
	}
	if data != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return req, nil
}

// printer prints what -v shows, as curl -v does: "*" for the library's own
// lines, ">" for what was sent, "<" for what came back.
type printer struct {
	w     io.Writer
	start time.Time
	mu    sync.Mutex
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

func (p *printer) since() string {
	return fmt.Sprintf("%8.3fms", float64(time.Since(p.start).Microseconds())/1000)
}

func (p *printer) attemptStart(ctx context.Context, a outbound.AttemptInfo) context.Context {
	p.printf("* %s attempt %d: %s %s://%s\n", p.since(), a.Attempt, a.Method, a.Scheme, a.Host)
	return ctx
}

func (p *printer) event(e admission.Event) { p.printf("* %s %s\n", p.since(), e) }

func (p *printer) wroteHeader(key string, values []string) {
	for _, v := range values {
		p.printf("> %s: %s\n", key, v)
	}
}

func (p *printer) response(resp *http.Response) {
	p.printf("< %s %s\n", resp.Proto, resp.Status)
	for _, k := range slices.Sorted(maps.Keys(resp.Header)) {
		for _, v := range resp.Header[k] {
			p.printf("< %s: %s\n", k, v)
		}
	}
}

// writeHead writes the status line and headers as -i shows them.
func writeHead(w io.Writer, resp *http.Response) {
	fmt.Fprintf(w, "%s %s\r\n", resp.Proto, resp.Status)
	_ = resp.Header.Write(w)
	fmt.Fprint(w, "\r\n")
}

// explain prints the outcome, one line per fact.
func explain(w io.Writer, out *outcome.Outcome, resp *http.Response) {
	fmt.Fprintf(w, "outcome: %s after %d attempt(s); ended: %s\n", out.Commit, len(out.Attempts), out.Why())
	if out.IdempotencyKey != "" {
		fmt.Fprintf(w, "idempotency key: %s\n", out.IdempotencyKey)
	}
	for i, a := range out.Attempts {
		line := fmt.Sprintf("attempt %d: %s at %s (%s)", i+1, a.Category, a.Stage, a.Evidence)
		if a.Status != 0 {
			line += fmt.Sprintf(", status %d", a.Status)
		}
		if a.Guard != 0 {
			line += fmt.Sprintf(", refused by the %s guard", a.Guard)
		}
		line += fmt.Sprintf(", %v", a.Duration.Round(time.Microsecond))
		if a.Decision != 0 {
			line += fmt.Sprintf(" -> %s", a.Decision)
		} else if a.Lost {
			line += " -> lost to another attempt"
		}
		if a.Wait > 0 {
			line += fmt.Sprintf(" (waited %v)", a.Wait.Round(time.Millisecond))
		}
		fmt.Fprintln(w, line)
		if a.Err != nil {
			fmt.Fprintf(w, "attempt %d cause: %v\n", i+1, cause(a.Err))
		}
	}
	if resp != nil && (out.Reason == retry.RetryAfterTooLong || out.Reason == retry.RetryAfterBeyondDeadline) {
		fmt.Fprintf(w, "Retry-After asked: %s\n", resp.Header.Get("Retry-After"))
	}
}

// cause returns what a classified failure rests on, without the summary its
// message repeats.
func cause(err error) error {
	var ce *classify.Error
	if errors.As(err, &ce) && ce.Err != nil {
		return ce.Err
	}
	var oe *outcome.CallError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err
	}
	return err
}
