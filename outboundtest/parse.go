package outboundtest

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
)

// FaultHeader is the request header field that chooses the fault of its
// own request, once Server.EnableFaultHeader is called, by a spec that
// ParseFault reads: a request carrying "Outbound-Test-Fault:
// ResetAfterRead()" gets that fault instead of the queued or default one
// (with an IDHeader, only the first request of that call id does: its
// retries carry the same header). It lets a client that cannot reach the
// Server's methods (another process, another language) ask for faults. A
// spec that does not parse, or names a connection-level fault, is answered
// 400 with the reason.
const FaultHeader = "Outbound-Test-Fault"

// ParseFault returns the fault spec names, written as the constructor call
// that Fault.String writes: `Respond(503, "Retry-After", "30")`,
// "Slow(200ms, 200)", "TruncatedBody(100, 10)", "GoAway(3, 1, false)",
// "ResetStream(REFUSED_STREAM)" or "ResetStream(7)". The name is matched
// without regard to case or dashes, "()" may be left out
// ("reset-after-read"), and so may the quotes of header fields
// ("Respond(503, Retry-After, 30)").
func ParseFault(spec string) (Fault, error) {
	name, args, err := splitCall(spec)
	if err != nil {
		return Fault{}, err
	}
	c, ok := constructors[strings.ToLower(strings.ReplaceAll(name, "-", ""))]
	if !ok {
		return Fault{}, fmt.Errorf("outboundtest: no fault named %q", name)
	}
	if len(args) < c.min || c.max >= 0 && len(args) > c.max {
		return Fault{}, fmt.Errorf("outboundtest: %s takes %s, got %d argument(s)", name, c.args, len(args))
	}
	f, err := c.build(args)
	if err != nil {
		return Fault{}, fmt.Errorf("outboundtest: %s: %w", spec, err)
	}
	return f, nil
}

// splitCall splits `Name(a, "b", c)` into its name and arguments.
func splitCall(spec string) (string, []string, error) {
	spec = strings.TrimSpace(spec)
	open := strings.IndexByte(spec, '(')
	if open < 0 {
		return spec, nil, nil
	}
	if !strings.HasSuffix(spec, ")") {
		return "", nil, fmt.Errorf("outboundtest: fault %q: no closing parenthesis", spec)
	}
	name, inner := strings.TrimSpace(spec[:open]), strings.TrimSpace(spec[open+1:len(spec)-1])
	var args []string
	for inner != "" {
		var arg string
		if inner[0] == '"' {
			q, err := strconv.QuotedPrefix(inner)
			if err != nil {
				return "", nil, fmt.Errorf("outboundtest: fault %q: %v", spec, err)
			}
			arg, _ = strconv.Unquote(q)
			inner = strings.TrimSpace(inner[len(q):])
		} else {
			end := strings.IndexByte(inner, ',')
			if end < 0 {
				end = len(inner)
			}
			arg, inner = strings.TrimSpace(inner[:end]), inner[end:]
		}
		args = append(args, arg)
		if inner != "" {
			if inner[0] != ',' {
				return "", nil, fmt.Errorf("outboundtest: fault %q: want a comma between arguments", spec)
			}
			inner = strings.TrimSpace(inner[1:])
		}
	}
	return name, args, nil
}

type constructor struct {
	args     string // for the error message
	min, max int    // max -1: any
	build    func(args []string) (Fault, error)
}

func none(f func() Fault) constructor {
	return constructor{args: "no arguments", build: func([]string) (Fault, error) { return f(), nil }}
}

func ints(args []string) ([]int, error) {
	out := make([]int, len(args))
	for i, a := range args {
		n, err := strconv.Atoi(a)
		if err != nil {
			return nil, fmt.Errorf("argument %d: %q is not an integer", i+1, a)
		}
		out[i] = n
	}
	return out, nil
}

var constructors = map[string]constructor{
	"respond": {args: "a status and header fields in pairs", min: 1, max: -1, build: func(a []string) (Fault, error) {
		st, err := ints(a[:1])
		if err != nil {
			return Fault{}, err
		}
		if len(a[1:])%2 != 0 {
			return Fault{}, fmt.Errorf("header fields come in pairs of name and value")
		}
		return Respond(st[0], a[1:]...), nil
	}},
	"slow": {args: "a duration and an optional status", min: 1, max: 2, build: func(a []string) (Fault, error) {
		d, err := time.ParseDuration(a[0])
		if err != nil {
			return Fault{}, err
		}
		status := 200
		if len(a) == 2 {
			st, err := ints(a[1:])
			if err != nil {
				return Fault{}, err
			}
			status = st[0]
		}
		return Slow(d, status), nil
	}},
	"queued": {args: "a capacity and a service time", min: 2, max: 2, build: func(a []string) (Fault, error) {
		c, err := ints(a[:1])
		if err != nil {
			return Fault{}, err
		}
		d, err := time.ParseDuration(a[1])
		if err != nil {
			return Fault{}, err
		}
		return Queued(c[0], d), nil
	}},
	"hang":            none(Hang),
	"closebeforeread": none(CloseBeforeRead),
	"resetbeforeread": none(ResetBeforeRead),
	"resetafterread":  none(ResetAfterRead),
	"partialheaders":  none(PartialHeaders),
	"truncatedbody": {args: "the total and the bytes sent", min: 2, max: 2, build: func(a []string) (Fault, error) {
		n, err := ints(a)
		if err != nil {
			return Fault{}, err
		}
		return TruncatedBody(n[0], n[1]), nil
	}},
	"trickle": {args: "a duration per byte and a byte count", min: 2, max: 2, build: func(a []string) (Fault, error) {
		d, err := time.ParseDuration(a[0])
		if err != nil {
			return Fault{}, err
		}
		n, err := ints(a[1:])
		if err != nil {
			return Fault{}, err
		}
		return Trickle(d, n[0]), nil
	}},
	"hugeheaders": {args: "a size", min: 1, max: 1, build: func(a []string) (Fault, error) {
		n, err := ints(a)
		if err != nil {
			return Fault{}, err
		}
		return HugeHeaders(n[0]), nil
	}},
	"badstatusline":  none(BadStatusLine),
	"endlessbody":    none(EndlessBody),
	"closemidstream": none(CloseMidStream),
	"refusedstream":  none(RefusedStream),
	"resetstream": {args: "an HTTP/2 error code", min: 1, max: 1, build: func(a []string) (Fault, error) {
		code, err := errCode(a[0])
		if err != nil {
			return Fault{}, err
		}
		return ResetStream(code), nil
	}},
	"goaway": {args: "the streams in flight, those processed, and whether to answer them", min: 2, max: 3, build: func(a []string) (Fault, error) {
		n, err := ints(a[:2])
		if err != nil {
			return Fault{}, err
		}
		answer := false
		if len(a) == 3 {
			if answer, err = strconv.ParseBool(a[2]); err != nil {
				return Fault{}, fmt.Errorf("argument 3: %q is not true or false", a[2])
			}
		}
		return GoAway(n[0], n[1], answer), nil
	}},
	"hardstop": {args: "the streams in flight", min: 1, max: 1, build: func(a []string) (Fault, error) {
		n, err := ints(a)
		if err != nil {
			return Fault{}, err
		}
		return HardStop(n[0]), nil
	}},
	"resetonaccept": none(ResetOnAccept),
	"closeonaccept": none(CloseOnAccept),
	"stallonaccept": none(StallOnAccept),
}

// errCode reads an HTTP/2 error code by name (REFUSED_STREAM) or number.
func errCode(s string) (http2.ErrCode, error) {
	if n, err := strconv.ParseUint(s, 0, 32); err == nil {
		return http2.ErrCode(n), nil
	}
	for c := http2.ErrCode(0); c <= http2.ErrCodeHTTP11Required; c++ {
		if strings.EqualFold(c.String(), s) {
			return c, nil
		}
	}
	return 0, fmt.Errorf("%q is not an HTTP/2 error code", s)
}
