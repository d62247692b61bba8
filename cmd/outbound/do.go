package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/outcome"
)

func doCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("do", flag.ContinueOnError)
	fs.SetOutput(stderr)
	method := fs.String("X", "", "request method (default GET, or POST with -d)")
	var headers stringList
	fs.Var(&headers, "H", "request header 'Name: value' (repeatable)")
	data := fs.String("d", "", "request body: literal data, @FILE (re-readable), or @- (standard input: a one-shot body)")
	verbose := fs.Bool("v", false, "also print every guard event (admission trace)")
	timeout := fs.Duration("timeout", 30*time.Second, "deadline of the whole call")
	attemptTimeout := fs.Duration("attempt-timeout", 0, "deadline of each attempt (0: none)")
	attempts := fs.Int("attempts", 3, "most attempts, the first included (1: no retry)")
	idemKey := fs.Bool("idempotency-key", false, "attach a generated Idempotency-Key to a non-idempotent request")
	h2c := fs.Bool("h2c", false, "speak HTTP/2 without TLS (prior knowledge) to http:// URLs")
	cacert := fs.String("cacert", "", "PEM file of the CA certificates to trust for https://")
	insecure := fs.Bool("k", false, "do not verify the server's certificate")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: outbound do [flags] URL

Sends one request through the full pipeline (circuit breaker, rate limiter,
bulkhead, classification, safe retries) and explains the outcome: the commit
status, and every attempt with its stage, category, duration and why it was
or was not retried. The response body goes to standard output, the
explanation to standard error.

Exit status: 0 answered (any status), 3 not committed (proven not processed),
4 unknown (may have been processed), 1 other errors, 2 usage.

Flags:
`)
		fs.PrintDefaults()
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "outbound do: give exactly one URL, after the flags (outbound do -h)")
		return exitUsage
	}
	url := fs.Arg(0)

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
	start := time.Now()
	cfg := outbound.Config{Transport: tr, MaxAttempts: *attempts, AttemptTimeout: *attemptTimeout, IdempotencyKeys: *idemKey}
	if *verbose {
		cfg.Admission.OnEvent = func(e admission.Event) {
			fmt.Fprintf(stderr, "* %8.3fms %s\n", float64(time.Since(start).Microseconds())/1000, e)
		}
	}
	c, err := outbound.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}
	defer c.Close()

	req, err := newRequest(*method, url, *data, headers)
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req = req.WithContext(ctx)

	fmt.Fprintf(stderr, "> %s %s\n", req.Method, req.URL)
	resp, out, err := c.Do(req)
	if resp != nil {
		fmt.Fprintf(stderr, "< %s %s\n", resp.Proto, resp.Status)
		_, copyErr := io.Copy(stdout, resp.Body)
		resp.Body.Close()
		if copyErr != nil {
			fmt.Fprintln(stderr, "! reading the body:", copyErr)
		}
	}
	explain(stderr, out)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, outcome.ErrNotCommitted):
		fmt.Fprintln(stderr, "verdict: not committed — proven not processed by the upstream; safe to send again")
		return exitNotCommitted
	case errors.Is(err, outcome.ErrUnknown):
		fmt.Fprintln(stderr, "verdict: unknown — the upstream may have processed it; reconcile before sending again")
		return exitUnknown
	}
	fmt.Fprintln(stderr, "error:", err)
	return exitFailed
}

// newRequest builds the request from the flags: -d sets a body, literal
// (replayable), @FILE (re-opened for each attempt) or @- (standard input,
// one-shot: never re-sent once read).
func newRequest(method, url, data string, headers []string) (*http.Request, error) {
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
	req, err := http.NewRequest(method, url, body)
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
		if !ok || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("-H %q: want 'Name: value'", h)
		}
		req.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return req, nil
}

// explain prints the outcome like curl -v prints an exchange, with verdicts.
func explain(w io.Writer, out *outcome.Outcome) {
	fmt.Fprintf(w, "outcome: %s after %d attempt(s); ended: %s\n", out.Commit, len(out.Attempts), out.Reason)
	if out.IdempotencyKey != "" {
		fmt.Fprintf(w, "idempotency key: %s\n", out.IdempotencyKey)
	}
	for i, a := range out.Attempts {
		line := fmt.Sprintf("  attempt %d: %s at %s (%s)", i+1, a.Category, a.Stage, a.Evidence)
		if a.Status != 0 {
			line += fmt.Sprintf(", status %d", a.Status)
		}
		if a.Guard != 0 {
			line += fmt.Sprintf(", refused by the %s guard", a.Guard)
		}
		line += fmt.Sprintf(", %v -> %s", a.Duration.Round(time.Microsecond), a.Decision)
		if a.Wait > 0 {
			line += fmt.Sprintf(" (waited %v)", a.Wait.Round(time.Millisecond))
		}
		fmt.Fprintln(w, line)
		if a.Err != nil {
			fmt.Fprintf(w, "    error: %v\n", a.Err)
		}
	}
}
