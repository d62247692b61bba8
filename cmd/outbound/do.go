package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http2"

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

const doUsage = `Usage: outbound do [flags] URL

Sends one request through the full pipeline (circuit breaker, rate limiter,
bulkhead, classification, safe retries) and explains the outcome: the commit
status, and every attempt with its stage, category, duration and why it was
or was not retried. The response body goes to standard output (or -o FILE),
the explanation to standard error. Flags may come before or after the URL,
and mean what curl's of the same name mean; a URL without a scheme is
http://. Ctrl-C ends the call and prints its verdict.

When every attempt over http:// was dropped without a byte of an answer, do
opens one more connection, which sends the HTTP/2 preface and no request, to
tell whether the server speaks HTTP/2 without TLS (then it says: add --h2c).

Exit status, curl's where curl has one:
   0  answered (any status, unless -f)
   1  other errors: the request could not be made
   2  usage: a bad flag, argument or URL
   3  not committed: proven not processed by the upstream, safe to send again
   4  unknown: the upstream may have processed it (also when the deadline
      expired or Ctrl-C ended a request that is not idempotent and has no
      Idempotency-Key: 4, not 28 or 130, says to reconcile before sending
      it again)
  18  the body ended early (an HTTP/1 connection closed before its end)
  22  -f and a status of 400 or more
  23  the body could not be written (-o FILE)
  28  the deadline (-m) expired: before the answer, while the body streamed,
      or while a retry waited (then the answer held is printed)
  47  -L and more than --max-redirs redirects
  92  the HTTP/2 stream was reset while the body streamed
 130  Ctrl-C, likewise

Flags:
`

// doFlags are the flags of do.
type doFlags struct {
	method                    string
	headers                   stringList
	data                      []dataPiece
	include, verbose, follow  bool
	fail, idemKey, h2c, insec bool
	output, cacert            string
	maxRedirs                 int
	timeout, attemptTimeout   *time.Duration
	maxRetryAfter             *time.Duration
	maxAttempts, bulkhead     int
	rate                      float64
	methodSet                 bool
}

func doCmd(args []string, stdout, stderr io.Writer) int {
	var o doFlags
	fs := o.flagSet(stderr)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	fs.Visit(func(f *flag.Flag) { o.methodSet = o.methodSet || f.Name == "X" || f.Name == "request" })
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "outbound do: give exactly one URL (outbound do -h)")
		return exitUsage
	}
	u, err := checkURL(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}
	body, err := newBody(o.data, os.Stdin)
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}
	tr, err := o.transport()
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}
	p := &printer{w: stderr, start: time.Now()}
	cfg := outbound.Config{HTTPTransport: tr, MaxAttempts: o.maxAttempts, AttemptTimeout: *o.attemptTimeout,
		MaxRetryAfter: *o.maxRetryAfter, IdempotencyKeys: o.idemKey,
		Admission: admission.Config{Rate: ratelimit.Config{PerSecond: o.rate}, Bulkhead: bulkhead.Config{MaxConcurrent: o.bulkhead}}}
	if o.verbose {
		cfg.Admission.OnEvent = p.event
		cfg.Hooks = outbound.Hooks{AttemptStart: p.attemptStart, AttemptDone: p.attemptDone, RetryDecided: p.retryDecided}
	}
	t, err := outbound.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}
	defer t.Close()
	method := o.method
	if method == "" {
		method = http.MethodGet
		if body != nil {
			method = http.MethodPost
		}
	}
	req, err := newRequest(method, u, body, o.headers, true)
	if err != nil {
		fmt.Fprintln(stderr, "outbound do:", err)
		return exitUsage
	}

	sigCtx, stop := signal.NotifyContext(context.Background(), interrupt...)
	defer stop()
	ctx, cancel := sigCtx, context.CancelFunc(func() {})
	if *o.timeout > 0 {
		ctx, cancel = context.WithTimeout(sigCtx, *o.timeout)
	}
	defer cancel()
	r := &doRun{o: &o, t: t, tr: tr, p: p, first: u, body: body, stderr: stderr,
		dst: &output{name: o.output, stdout: stdout}, sigCtx: sigCtx, ctx: ctx}
	defer r.dst.close()
	resp, out, req, code, err := r.call(req)
	if code != exitOK {
		return code
	}
	code, received, bodyErr := r.deliver(resp)
	return r.conclude(req, resp, out, err, code, received, bodyErr)
}

// flagSet defines do's flags into o.
func (o *doFlags) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("do", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.method, "X", "", "request `METHOD` (default GET, or POST with -d); with -L, the method of every request, as in curl")
	alias(fs, "request", "X")
	fs.Var(&o.headers, "H", "request `HEADER` 'Name: value' (repeatable; 'Host: name' sets the host)")
	alias(fs, "header", "H")
	fs.Var(&dataFlag{pieces: &o.data}, "d", "request body `DATA`, as curl's -d: literal, @FILE or @- (standard input: a one-shot body), carriage returns and newlines stripped from FILE and standard input; pieces of repeated -d joined with &; sent as application/x-www-form-urlencoded unless -H sets a Content-Type")
	alias(fs, "data", "d")
	fs.Var(&dataFlag{pieces: &o.data, binary: true}, "data-binary", "request body `DATA` sent as is: literal, @FILE (its exact bytes, read again for each attempt) or @- (standard input, a one-shot body)")
	fs.BoolVar(&o.include, "i", false, "print the response status line and headers before the body")
	alias(fs, "include", "i")
	fs.StringVar(&o.output, "o", "", "write the body (and -i's headers) to `FILE` instead of standard output (- is standard output); not created without an answer, nor with -f's failure")
	alias(fs, "output", "o")
	fs.BoolVar(&o.follow, "L", false, "follow redirects (301, 302, 303, 307, 308) as curl does: 301 and 302 turn a POST into a GET, 303 anything but HEAD; 307 and 308 send the method and body again; Authorization and Cookie headers are not sent to another host")
	alias(fs, "location", "L")
	fs.IntVar(&o.maxRedirs, "max-redirs", 50, "with -L: most redirects followed (`N`)")
	fs.BoolVar(&o.fail, "f", false, "fail on an HTTP status of 400 or more: print no body, exit 22")
	alias(fs, "fail", "f")
	fs.BoolVar(&o.verbose, "v", false, "also print, per attempt, the request line and headers as sent, every guard event and the attempt's result; then the response headers")
	alias(fs, "verbose", "v")
	o.timeout = durationFlag(fs, "timeout", 30*time.Second, "deadline of the whole call, the body included (`SECONDS`, or a duration: 500ms; 0: none)")
	alias(fs, "m", "timeout")
	alias(fs, "max-time", "timeout")
	o.attemptTimeout = durationFlag(fs, "attempt-timeout", 0, "deadline of each attempt (`SECONDS`, or a duration; 0: none)")
	fs.IntVar(&o.maxAttempts, "max-attempts", 3, "most attempts, the first included (`N`; 1: no retry)")
	o.maxRetryAfter = durationFlag(fs, "max-retry-after", 30*time.Second, "longest Retry-After honoured (`SECONDS`, or a duration)")
	fs.Float64Var(&o.rate, "rate", 0, "rate limit of the upstream, attempts per second (`N`; 0: none)")
	fs.IntVar(&o.bulkhead, "bulkhead", 0, "most attempts in flight to the upstream (`N`; 0: no bulkhead)")
	fs.BoolVar(&o.idemKey, "idempotency-key", false, "attach a generated Idempotency-Key to a non-idempotent request")
	fs.BoolVar(&o.h2c, "h2c", false, "speak HTTP/2 without TLS (prior knowledge) to http:// URLs")
	fs.StringVar(&o.cacert, "cacert", "", "PEM `FILE` of the CA certificates to trust for https://")
	fs.BoolVar(&o.insec, "k", false, "do not verify the server's certificate")
	alias(fs, "insecure", "k")
	fs.Usage = func() {
		fmt.Fprint(stderr, doUsage)
		printFlags(stderr, fs)
	}
	return fs
}

// doRun is one run of do, once its flags are read.
type doRun struct {
	o      *doFlags
	t      *outbound.Transport
	tr     *http.Transport
	p      *printer
	first  *url.URL    // the URL given
	body   *bodySource // nil: none
	stderr io.Writer
	dst    *output
	sigCtx context.Context // ended by Ctrl-C
	ctx    context.Context // ended by Ctrl-C or the deadline
}

// ended says why the call's context ended: "" (it did not), "interrupted"
// (Ctrl-C) or "timed out" (the deadline).
func (r *doRun) ended() string {
	switch {
	case r.sigCtx.Err() != nil:
		return "interrupted"
	case r.ctx.Err() != nil:
		return "timed out"
	}
	return ""
}

// call makes the call, and with -L the calls its redirects ask for, and
// returns the last one's request and result. A code other than exitOK
// ends do at once.
func (r *doRun) call(req *http.Request) (*http.Response, *outcome.Outcome, *http.Request, int, error) {
	for hop := 0; ; hop++ {
		r.p.setURL(req.URL)
		resp, out, err := r.t.Do(req.WithContext(r.ctx))
		if resp == nil || !r.o.follow {
			return resp, out, req, exitOK, err
		}
		next, keepBody, isRedirect := redirect(resp.StatusCode, req.Method)
		loc := resp.Header.Get("Location")
		if !isRedirect || loc == "" {
			return resp, out, req, exitOK, err
		}
		target, perr := req.URL.Parse(loc)
		if perr != nil || (target.Scheme != "http" && target.Scheme != "https") {
			fmt.Fprintf(r.stderr, "! not following the redirect to %q: not an http:// or https:// URL\n", loc)
			return resp, out, req, exitOK, err
		}
		if hop == r.o.maxRedirs {
			resp.Body.Close()
			explain(r.stderr, out, resp)
			fmt.Fprintf(r.stderr, "error: more than %d redirects (--max-redirs)\n", r.o.maxRedirs)
			return nil, out, req, exitRedirects, err
		}
		if r.o.verbose {
			r.p.response(resp)
		}
		if r.o.include {
			writeHead(r.dst, resp)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		fmt.Fprintf(r.stderr, "redirect %d: %s after %d attempt(s) -> %s\n", hop+1, resp.Status, len(out.Attempts), target.Redacted())
		if r.o.methodSet {
			next = r.o.method
		}
		var b *bodySource
		if keepBody {
			b = r.body
		}
		if b != nil && b.oneShot() {
			fmt.Fprintf(r.stderr, "outbound do: cannot follow the %d: it asks for the body again, and standard input was already sent\n", resp.StatusCode)
			return nil, out, req, exitFailed, err
		}
		if req, err = newRequest(next, target, b, r.o.headers, sameOrigin(r.first, target)); err != nil {
			fmt.Fprintln(r.stderr, "outbound do:", err)
			return nil, out, req, exitFailed, err
		}
	}
}

// deliver writes the answer's head (-i) and body, unless -f refuses it,
// and says how that ended: exitOK, or the code of what cut it short, the
// bytes of the body received and the error that ended it.
func (r *doRun) deliver(resp *http.Response) (code int, received int64, bodyErr error) {
	if resp == nil {
		return exitOK, 0, nil
	}
	if r.o.verbose {
		r.p.response(resp)
	}
	if r.o.include {
		writeHead(r.dst, resp)
	}
	if r.o.fail && resp.StatusCode >= 400 {
		resp.Body.Close()
		return exitHTTPError, 0, r.dst.close()
	}
	var readErr, writeErr error
	if writeErr = r.dst.open(); writeErr == nil {
		received, readErr, writeErr = copyBody(r.dst, resp.Body)
	}
	resp.Body.Close()
	if err := r.dst.close(); writeErr == nil {
		writeErr = err
	}
	switch {
	case writeErr != nil:
		return exitWrite, received, writeErr
	case readErr == nil:
		return exitOK, received, nil
	case r.ended() == "interrupted":
		return exitInterrupted, received, readErr
	case r.ended() == "timed out":
		return exitTimeout, received, readErr
	case isStreamError(readErr):
		return exitH2Stream, received, readErr
	}
	return exitTruncated, received, readErr
}

// conclude explains the outcome of the call, says what cut it short, and
// returns do's exit status.
func (r *doRun) conclude(req *http.Request, resp *http.Response, out *outcome.Outcome, err error, code int, received int64, bodyErr error) int {
	stderr, timeout := r.stderr, *r.o.timeout
	why := r.ended()
	// An answer held while its retry waited is the call's answer when the
	// deadline or Ctrl-C ends the wait: the call was still ended by them.
	cutShort := resp != nil && code == exitOK && why != "" &&
		(out.End == outcome.ContextDone || out.End == outcome.DeadlineExceeded || out.End == outcome.Cancelled)
	if cutShort && why == "timed out" {
		code = exitTimeout
	} else if cutShort {
		code = exitInterrupted
	}
	explain(stderr, out, resp)
	if resp != nil {
		switch {
		case code == exitHTTPError:
			fmt.Fprintf(stderr, "error: the upstream answered %s; -f prints no body of an answer of 400 or more\n", resp.Status)
		case code == exitWrite:
			fmt.Fprintln(stderr, "error: writing the body:", bodyErr)
		case cutShort:
			fmt.Fprintf(stderr, "%s: the call was ended while it waited to retry; the answer is the last attempt's\n", why)
		case code == exitTimeout:
			fmt.Fprintf(stderr, "timed out: the call's deadline (-m %v) expired while the body streamed, after %d byte(s)%s\n", timeout, received, ofLength(resp))
		case code == exitInterrupted:
			fmt.Fprintf(stderr, "interrupted: the call was ended while the body streamed, after %d byte(s)%s\n", received, ofLength(resp))
		case code != exitOK:
			fmt.Fprintf(stderr, "error: the body ended early, after %d byte(s)%s: %v\n", received, ofLength(resp), cause(bodyErr))
		}
		return code
	}
	var ce *classify.Error
	switch {
	case errors.Is(err, classify.ErrInvalidRequest) || errors.As(err, &ce) && ce.Evidence == classify.EvidenceInvalidRequest:
		fmt.Fprintln(stderr, "outbound do: the request cannot be sent:", cause(err))
		return exitUsage
	case out.Commit != outcome.NotCommitted && out.Commit != outcome.Unknown:
		switch why {
		case "timed out":
			fmt.Fprintf(stderr, "timed out: the call's deadline (-m %v) expired: %v\n", timeout, err)
			return exitTimeout
		case "interrupted":
			fmt.Fprintln(stderr, "interrupted:", err)
			return exitInterrupted
		}
		fmt.Fprintln(stderr, "error:", err)
		return exitFailed
	}
	switch why {
	case "":
		if hint := protocolHint(r.sigCtx, r.tr, req, r.o.h2c, out, r.p, r.o.verbose); hint != "" {
			fmt.Fprintln(stderr, hint)
		}
	case "timed out":
		fmt.Fprintf(stderr, "timed out: the call's deadline (-m %v) expired before an answer\n", timeout)
	default:
		fmt.Fprintln(stderr, "interrupted: the call was ended before it finished")
	}
	fmt.Fprintln(stderr, verdictLine(out, req.Method))
	switch {
	case out.Commit == outcome.Unknown && !resendable(out, req.Method):
		return exitUnknown // not curl's 28 or 130: the request must be reconciled, not sent again
	case why == "timed out":
		return exitTimeout
	case why == "interrupted":
		return exitInterrupted
	case out.Commit == outcome.NotCommitted:
		return exitNotCommitted
	}
	return exitUnknown
}

// transport returns the HTTP transport the flags ask for.
func (o *doFlags) transport() (*http.Transport, error) {
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment}
	if o.h2c {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		tr.Protocols = p
	}
	if o.cacert != "" || o.insec {
		cfg := &tls.Config{InsecureSkipVerify: o.insec} //nolint:gosec // the user asked for -k
		if o.cacert != "" {
			pem, err := os.ReadFile(o.cacert)
			if err != nil {
				return nil, fmt.Errorf("reading --cacert: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("no PEM certificate in %s", o.cacert)
			}
			cfg.RootCAs = pool
		}
		tr.TLSClientConfig = cfg
	}
	return tr, nil
}

// verdictLine says what the commit status of a call without an answer means
// for sending it again: only a request that is not idempotent, and has no
// Idempotency-Key, must be reconciled first.
func verdictLine(out *outcome.Outcome, method string) string {
	if out.Commit == outcome.NotCommitted {
		return "verdict: not committed — proven not processed by the upstream; safe to send again"
	}
	switch {
	case retry.Idempotent(method):
		return "verdict: unknown — the upstream may have processed it; " + method + " is idempotent: sending it again is safe"
	case out.IdempotencyKey != "":
		return "verdict: unknown — the upstream may have processed it; send it again only with the same Idempotency-Key"
	}
	return "verdict: unknown — the upstream may have processed it; reconcile before sending again"
}

// resendable reports whether sending the request again cannot do harm:
// its method is idempotent, or it carries an Idempotency-Key (the rule by
// which the library retries it).
func resendable(out *outcome.Outcome, method string) bool {
	return retry.Idempotent(method) || out.IdempotencyKey != ""
}

// checkURL parses the URL, taking one without a scheme as http://, as
// curl does, and refuses before any attempt what curl would call a bad
// URL.
func checkURL(raw string) (*url.URL, error) {
	full := raw
	if !strings.Contains(raw, "://") {
		full = "http://" + raw
	}
	u, err := url.Parse(full)
	if err != nil {
		return nil, fmt.Errorf("bad URL %q: %v", raw, errors.Unwrap(err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("bad URL %q: want an http:// or https:// URL", raw)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("bad URL %q: no host", raw)
	}
	if !validHost(u.Hostname()) {
		return nil, fmt.Errorf("bad URL %q: %q is not a host name", raw, u.Hostname())
	}
	return u, nil
}

// validHost reports whether h is an IP address or a host name: labels of
// letters, digits, '-' and '_', none beginning or ending with '-'.
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c == '-' || c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c > 0x7f) {
				return false
			}
		}
	}
	return true
}

// redirect returns the method of the request that follows an answer of
// status to a request of method, and whether it carries the body again, as
// curl -L does; isRedirect is false for a status -L does not follow.
func redirect(status int, method string) (next string, keepBody, isRedirect bool) {
	switch status {
	case http.StatusMovedPermanently, http.StatusFound:
		if method == http.MethodPost {
			return http.MethodGet, false, true
		}
		return method, true, true
	case http.StatusSeeOther:
		if method == http.MethodHead {
			return method, false, true
		}
		return http.MethodGet, false, true
	case http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return method, true, true
	}
	return "", false, false
}

// sameOrigin reports whether b is on the scheme, host and port of a.
func sameOrigin(a, b *url.URL) bool {
	return a.Scheme == b.Scheme && strings.EqualFold(a.Host, b.Host)
}

// A dataPiece is the value of one -d, --data or --data-binary.
type dataPiece struct {
	value  string
	binary bool
}

// dataFlag is -d (or --data-binary, binary): each use adds a piece.
type dataFlag struct {
	pieces *[]dataPiece
	binary bool
}

func (d *dataFlag) String() string {
	if d == nil || d.pieces == nil {
		return ""
	}
	var vs []string
	for _, p := range *d.pieces {
		vs = append(vs, p.value)
	}
	return strings.Join(vs, "&")
}

func (d *dataFlag) Set(v string) error {
	*d.pieces = append(*d.pieces, dataPiece{value: v, binary: d.binary})
	return nil
}

// bodySource makes the body of each request: from memory (replayable), from
// a file read again for each attempt (--data-binary @FILE alone), or from
// standard input read as it is sent (@- alone: a one-shot body, never sent
// again once read).
type bodySource struct {
	data  []byte
	file  string
	stdin io.Reader
}

// newBody joins the pieces of -d and --data-binary as curl does: with &,
// each @FILE or @- replaced by its content, with carriage returns and
// newlines stripped unless it came from --data-binary. It returns nil for
// no piece.
func newBody(pieces []dataPiece, stdin io.Reader) (*bodySource, error) {
	switch {
	case len(pieces) == 0:
		return nil, nil
	case len(pieces) == 1 && pieces[0].value == "@-":
		if !pieces[0].binary {
			stdin = stripNewlines{stdin}
		}
		return &bodySource{stdin: stdin}, nil
	case len(pieces) == 1 && pieces[0].binary && strings.HasPrefix(pieces[0].value, "@"):
		name := pieces[0].value[1:]
		if _, err := os.Stat(name); err != nil {
			return nil, fmt.Errorf("--data-binary %s: %w", pieces[0].value, err)
		}
		return &bodySource{file: name}, nil
	}
	var all []byte
	for i, p := range pieces {
		if i > 0 {
			all = append(all, '&')
		}
		b := []byte(p.value)
		if name, ok := strings.CutPrefix(p.value, "@"); ok {
			var err error
			if name == "-" {
				b, err = io.ReadAll(stdin)
			} else {
				b, err = os.ReadFile(name)
			}
			if err != nil {
				flag := "-d"
				if p.binary {
					flag = "--data-binary"
				}
				return nil, fmt.Errorf("%s %s: %w", flag, p.value, err)
			}
			if !p.binary {
				b = bytes.ReplaceAll(bytes.ReplaceAll(b, []byte("\r"), nil), []byte("\n"), nil)
			}
		}
		all = append(all, b...)
	}
	return &bodySource{data: all}, nil
}

func (b *bodySource) oneShot() bool { return b.stdin != nil }

// stripNewlines drops carriage returns and newlines from what it reads.
type stripNewlines struct{ r io.Reader }

func (s stripNewlines) Read(p []byte) (int, error) {
	for {
		n, err := s.r.Read(p)
		k := 0
		for _, c := range p[:n] {
			if c != '\r' && c != '\n' {
				p[k] = c
				k++
			}
		}
		if k > 0 || n == 0 || err != nil {
			return k, err
		}
	}
}

// newRequest builds a request with the body (nil: none), as a form unless
// a header says otherwise, as curl does; -H Host: sets the request's host.
// To another origin than the first request's (sameOrigin false), as curl
// does, it sends no Authorization or Cookie header, nor the Host given.
func newRequest(method string, u *url.URL, b *bodySource, headers []string, sameOrigin bool) (*http.Request, error) {
	var body io.Reader
	if b != nil {
		switch {
		case b.stdin != nil:
			body = io.NopCloser(b.stdin)
		case b.file != "":
			f, err := os.Open(b.file)
			if err != nil {
				return nil, fmt.Errorf("--data-binary @%s: %w", b.file, err)
			}
			body = f
		default:
			body = bytes.NewReader(b.data)
		}
	}
	req, err := http.NewRequest(method, u.String(), body)
	if err != nil {
		return nil, err
	}
	if b != nil && b.file != "" {
		name := b.file
		req.GetBody = func() (io.ReadCloser, error) { return os.Open(name) }
		if st, err := os.Stat(name); err == nil {
			req.ContentLength = st.Size()
		}
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" {
			return nil, fmt.Errorf("-H %q: want 'Name: value'", h)
		}
		if !sameOrigin && (strings.EqualFold(name, "Authorization") || strings.EqualFold(name, "Cookie") || strings.EqualFold(name, "Host")) {
			continue
		}
		if strings.EqualFold(name, "Host") {
			req.Host = value
			continue
		}
		req.Header.Add(name, value)
	}
	if b != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return req, nil
}

// output is where the body goes: standard output, or -o's file, created
// when the first byte is to be written (or open is called), as curl does.
type output struct {
	name   string // "" or "-": standard output
	stdout io.Writer
	w      io.Writer
	f      *os.File
	err    error
}

func (o *output) open() error {
	if o.w != nil || o.err != nil {
		return o.err
	}
	if o.name == "" || o.name == "-" {
		o.w = o.stdout
		return nil
	}
	o.f, o.err = os.Create(o.name)
	o.w = o.f
	return o.err
}

func (o *output) Write(p []byte) (int, error) {
	if err := o.open(); err != nil {
		return 0, err
	}
	return o.w.Write(p)
}

func (o *output) close() error {
	if o.f == nil {
		return nil
	}
	f := o.f
	o.f = nil
	return f.Close()
}

// copyBody copies the body to w and says how that ended: the bytes
// copied, the error that ended the reading (nil at the end of the body) or
// the writing.
func copyBody(w io.Writer, body io.Reader) (n int64, readErr, writeErr error) {
	buf := make([]byte, 32<<10)
	for {
		k, err := body.Read(buf)
		if k > 0 {
			m, werr := w.Write(buf[:k])
			n += int64(m)
			if werr == nil && m < k {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				return n, nil, werr
			}
		}
		if err == io.EOF {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}

// isStreamError reports whether err is an HTTP/2 stream reset.
func isStreamError(err error) bool {
	var se http2.StreamError
	return errors.As(err, &se)
}

// ofLength is " of N" when the answer announced its length.
func ofLength(resp *http.Response) string {
	if resp.ContentLength >= 0 {
		return fmt.Sprintf(" of %d", resp.ContentLength)
	}
	return ""
}

// statusLine is the status line of resp as curl prints it: "HTTP/1.1 200
// OK", or "HTTP/2 200 " (HTTP/2 has no reason phrase).
func statusLine(resp *http.Response) string {
	if resp.ProtoMajor == 2 {
		return fmt.Sprintf("HTTP/2 %d ", resp.StatusCode)
	}
	return resp.Proto + " " + resp.Status
}

// headerLines yields resp's header fields, sorted, as "Name: value"; in
// lower case over HTTP/2, as they are on the wire and curl prints them.
func headerLines(resp *http.Response) []string {
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(resp.Header)) {
		name := k
		if resp.ProtoMajor == 2 {
			name = strings.ToLower(k)
		}
		for _, v := range resp.Header[k] {
			lines = append(lines, name+": "+v)
		}
	}
	return lines
}

// writeHead writes the status line and headers as -i shows them.
func writeHead(w io.Writer, resp *http.Response) {
	var b strings.Builder
	b.WriteString(statusLine(resp) + "\r\n")
	for _, l := range headerLines(resp) {
		b.WriteString(l + "\r\n")
	}
	b.WriteString("\r\n")
	_, _ = io.WriteString(w, b.String())
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
