package outbound

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outboundhq/outbound/internal/cfgerr"
	"golang.org/x/net/http/httpguts"
)

// Deadline sends each attempt, in a header, how long it has left: the
// upstream can stop working on a call its caller no longer waits for, as
// gRPC's grpc-timeout and Envoy's x-envoy-expected-rq-timeout-ms do. What
// is sent is the time left before the attempt's deadline — the call's, or
// the attempt's own timeout when that ends sooner — when the attempt is
// made, rounded down: never more than is really left. A call without a
// deadline sends nothing. Only the hosts Hosts names get it: a deadline
// sent to a third party tells it about the caller (and helps fingerprint
// it), so it is off for every host unless named.
type Deadline struct {
	// Header is the header's name, such as "Grpc-Timeout",
	// "X-Envoy-Expected-Rq-Timeout-Ms" or "Request-Timeout"; required.
	Header string
	// Format writes the time left, at least 0; nil means Milliseconds. A
	// Format of the user's own must round down.
	Format func(time.Duration) string
	// Hosts are the hosts that get the header: a name ("api.internal"),
	// or "*." and a domain for every name under it ("*.svc.cluster.local");
	// case does not matter. At least one.
	Hosts []string
}

// Milliseconds writes d as whole milliseconds, rounded down ("1499"), as
// Envoy's x-envoy-expected-rq-timeout-ms.
func Milliseconds(d time.Duration) string { return strconv.FormatInt(max(d, 0).Milliseconds(), 10) }

// GRPCTimeout writes d as gRPC's grpc-timeout: at most 8 digits and a unit
// (H, M, S, m, u or n), the finest unit that fits, rounded down
// ("1499000u" for 1.499 s), as gRPC writes it.
func GRPCTimeout(d time.Duration) string {
	d = max(d, 0)
	for _, u := range [...]struct {
		unit time.Duration
		name string
	}{{time.Nanosecond, "n"}, {time.Microsecond, "u"}, {time.Millisecond, "m"}, {time.Second, "S"}, {time.Minute, "M"}} {
		if v := d / u.unit; v < 1e8 {
			return strconv.FormatInt(int64(v), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(min(d/time.Hour, 1e8-1)), 10) + "H"
}

// Seconds writes d in seconds to the millisecond, rounded down ("1.499").
func Seconds(d time.Duration) string {
	ms := max(d, 0).Milliseconds()
	return strconv.FormatInt(ms/1000, 10) + "." + strconv.FormatInt(1000+ms%1000, 10)[1:]
}

func (d *Deadline) validate() error {
	if d == nil {
		return nil
	}
	return validateSent("Deadline", d.Header, d.Hosts)
}

// validateSent checks the header and the hosts of what field sends.
func validateSent(field, header string, hosts []string) error {
	if !httpguts.ValidHeaderFieldName(header) {
		return cfgerr.New("outbound", field+".Header", "must be a header name, got %q", header)
	}
	if len(hosts) == 0 {
		return cfgerr.New("outbound", field+".Hosts", "must name at least one host: the header is sent to those only")
	}
	for _, h := range hosts {
		if name := strings.TrimPrefix(h, "*."); name == "" || strings.ContainsAny(name, "*/ ") {
			return cfgerr.New("outbound", field+".Hosts", "must be host names or *.domain, got %q", h)
		}
	}
	return nil
}

// named reports whether hosts name host: as a name (any case), or under a
// "*."-domain.
func named(hosts []string, host string) bool {
	for _, h := range hosts {
		if dom, ok := strings.CutPrefix(h, "*."); ok {
			if len(host) > len(dom)+1 && host[len(host)-len(dom)-1] == '.' && strings.EqualFold(host[len(host)-len(dom):], dom) {
				return true
			}
		} else if strings.EqualFold(h, host) {
			return true
		}
	}
	return false
}

// forHost returns how the attempts to host send their deadline, or nil
// when they do not: d is nil or does not name host.
func (d *Deadline) forHost(host string) *Deadline {
	if d == nil || !named(d.Hosts, host) {
		return nil
	}
	return d
}

// SendCriticality sends each call's criticality (package criticality) in a
// header — "critical", "default" or "sheddable" — to the hosts it names,
// so that the upstream can shed by it too. Like Deadline, it is off for
// every host not named.
type SendCriticality struct {
	// Header is the header's name, such as "X-Criticality"; required.
	Header string
	// Hosts are the hosts that get it, as in Deadline.Hosts; at least one.
	Hosts []string
}

func (s *SendCriticality) validate() error {
	if s == nil {
		return nil
	}
	return validateSent("SendCriticality", s.Header, s.Hosts)
}

func (s *SendCriticality) clone() *SendCriticality {
	if s == nil {
		return nil
	}
	c := *s
	c.Hosts = append([]string(nil), s.Hosts...)
	return &c
}

func (d *Deadline) clone() *Deadline {
	if d == nil {
		return nil
	}
	c := *d
	c.Hosts = append([]string(nil), d.Hosts...)
	if c.Format == nil {
		c.Format = Milliseconds
	}
	return &c
}

// attemptHeader returns the header of an attempt made with actx: the
// call's, or with the deadline (Config.Deadline) a copy of it saying how
// long actx has left. It reports whether it is the call's own.
func (c *call) attemptHeader(actx context.Context) (http.Header, bool) {
	d := c.deadline
	if d == nil {
		return c.header, true
	}
	end, ok := actx.Deadline()
	if !ok {
		return c.header, true
	}
	h := c.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set(d.Header, d.Format(max(time.Until(end), 0)))
	return h, false
}
