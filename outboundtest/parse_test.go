package outboundtest_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/outboundhq/outbound/outboundtest"
)

// ParseFault reads what Fault.String writes, for every constructor, and
// the shorter spellings a shell or a header makes easier.
func TestParseFaultReadsWhatStringWrites(t *testing.T) {
	for _, f := range []outboundtest.Fault{
		outboundtest.Respond(503, "Retry-After", "30"), outboundtest.Respond(200),
		outboundtest.Slow(250*time.Millisecond, 504), outboundtest.Hang(),
		outboundtest.CloseBeforeRead(), outboundtest.ResetBeforeRead(), outboundtest.ResetAfterRead(),
		outboundtest.PartialHeaders(), outboundtest.TruncatedBody(100, 10),
		outboundtest.Trickle(time.Millisecond, 64), outboundtest.HugeHeaders(1 << 20),
		outboundtest.BadStatusLine(), outboundtest.EndlessBody(), outboundtest.CloseMidStream(),
		outboundtest.RefusedStream(), outboundtest.ResetStream(http2.ErrCodeCancel),
		outboundtest.GoAway(3, 1, true), outboundtest.ResetOnAccept(), outboundtest.CloseOnAccept(),
		outboundtest.StallOnAccept(), outboundtest.HardStop(2),
	} {
		got, err := outboundtest.ParseFault(f.String())
		if err != nil || got.String() != f.String() {
			t.Errorf("ParseFault(%q) = %v, %v", f.String(), got, err)
		}
	}
	for spec, want := range map[string]string{
		"reset-after-read":              "ResetAfterRead()",
		"refusedstream":                 "RefusedStream()",
		"Respond(503, Retry-After, 30)": `Respond(503, "Retry-After", "30")`,
		"slow(1s)":                      "Slow(1s, 200)",
		"ResetStream(7)":                "ResetStream(REFUSED_STREAM)",
		"GoAway(2, 0)":                  "GoAway(2, 0, false)",
		"hardstop(3)":                   "HardStop(3)",
	} {
		got, err := outboundtest.ParseFault(spec)
		if err != nil || got.String() != want {
			t.Errorf("ParseFault(%q) = %v, %v; want %s", spec, got, err, want)
		}
	}
}

func TestParseFaultRejectsWhatItCannotRead(t *testing.T) {
	for spec, want := range map[string]string{
		"Explode()":              `no fault named "Explode"`,
		"Respond(abc)":           "not an integer",
		"Respond(503, Retry)":    "pairs",
		"Slow(fast)":             "invalid duration",
		"TruncatedBody(1)":       "takes the total and the bytes sent",
		"ResetStream(SOMETHING)": "not an HTTP/2 error code",
		"Respond(503":            "no closing parenthesis",
		"GoAway(1, 0, maybe)":    "not true or false",
	} {
		if _, err := outboundtest.ParseFault(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseFault(%q): %v, want an error with %q", spec, err, want)
		}
	}
}

// With EnableFaultHeader, a request chooses its own fault by FaultHeader;
// a spec that does not parse, or that names a connection-level fault, is
// answered 400 with the reason. Without it, the header is an ordinary one.
func TestARequestChoosesItsFaultByHeaderOnceEnabled(t *testing.T) {
	forEachProto(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		client := &http.Client{Transport: s.Transport()}
		get := func(spec string) (int, string, error) {
			req, _ := http.NewRequest(http.MethodGet, s.URL+"/x", nil)
			req.Header.Set(outboundtest.FaultHeader, spec)
			resp, err := client.Do(req)
			if err != nil {
				return 0, "", err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), nil
		}
		if st, _, err := get("Respond(418)"); err != nil || st != 200 {
			t.Fatalf("before EnableFaultHeader: %d %v, want the default 200", st, err)
		}
		s.EnableFaultHeader()
		if st, _, err := get("Respond(418)"); err != nil || st != 418 {
			t.Fatalf("Respond(418) by header: %d %v", st, err)
		}
		if _, _, err := get("ResetAfterRead()"); err == nil {
			t.Fatal("ResetAfterRead() by header: the request succeeded")
		}
		if st, body, err := get("Explode()"); err != nil || st != 400 || !strings.Contains(body, "no fault named") {
			t.Fatalf("a bad spec: %d %q %v", st, body, err)
		}
		if st, body, err := get("ResetOnAccept()"); err != nil || st != 400 || !strings.Contains(body, "connection-level") {
			t.Fatalf("a connection-level fault by header: %d %q %v", st, body, err)
		}
		if st, _, err := get(""); err != nil || st != 200 {
			t.Fatalf("without the header: %d %v", st, err)
		}
	})
}

// With an IDHeader, the fault a header names is the first request's of the
// call: its retry, carrying the same header, gets the default.
func TestAFaultChosenByHeaderIsTheFirstRequestsOfItsCall(t *testing.T) {
	forEachProto(t, func(t *testing.T, p outboundtest.Proto) {
		s := newServer(t, p)
		s.EnableFaultHeader()
		client := &http.Client{Transport: s.Transport()}
		for i, want := range []int{503, 200, 200} {
			req, _ := http.NewRequest(http.MethodGet, s.URL+"/x", nil)
			req.Header.Set(outboundtest.FaultHeader, "Respond(503)")
			req.Header.Set(outboundtest.IDHeader, "call-1")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Fatalf("request %d of the call: %d, want %d", i+1, resp.StatusCode, want)
			}
		}
	})
}
