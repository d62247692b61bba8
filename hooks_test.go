package outbound_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/outboundhq/outbound"
	"github.com/outboundhq/outbound/admission"
	"github.com/outboundhq/outbound/outboundtest"
	"github.com/outboundhq/outbound/outcome"
	"github.com/outboundhq/outbound/retry"
)

type ctxKey string

// trail records hook calls in order.
type trail struct {
	mu    sync.Mutex
	steps []string
}

func (tr *trail) add(format string, args ...any) {
	tr.mu.Lock()
	tr.steps = append(tr.steps, fmt.Sprintf(format, args...))
	tr.mu.Unlock()
}

func TestHooksSeeTheCallItsAttemptsAndTheDecisions(t *testing.T) {
	s := newServer(t, outboundtest.H2C)
	s.Enqueue(outboundtest.RefusedStream())
	tr := &trail{}
	var guards sync.Map
	hooks := outbound.Hooks{
		CallStart: func(ctx context.Context, c outbound.CallInfo) context.Context {
			tr.add("call-start %s %s:%d", c.Method, c.Host, c.Port)
			return context.WithValue(ctx, ctxKey("call"), "c1")
		},
		AttemptStart: func(ctx context.Context, a outbound.AttemptInfo) context.Context {
			tr.add("attempt-start %d in %v", a.Attempt, ctx.Value(ctxKey("call")))
			return context.WithValue(ctx, ctxKey("attempt"), a.Attempt)
		},
		AttemptDone: func(ctx context.Context, a outbound.AttemptInfo, r outcome.Attempt) {
			tr.add("attempt-done %d %v (ctx attempt %v)", a.Attempt, r.Category, ctx.Value(ctxKey("attempt")))
		},
		RetryDecided: func(ctx context.Context, a outbound.AttemptInfo, d retry.Decision) {
			tr.add("retry-decided %d retry=%v %v", a.Attempt, d.Retry, d.Reason)
		},
		CallDone: func(ctx context.Context, o *outcome.Outcome) {
			tr.add("call-done %v in %v", o.Commit, ctx.Value(ctxKey("call")))
		},
		Guard: func(e admission.Event) { guards.Store(e.String(), true) },
	}
	c := newClient(t, s, outbound.Config{Hooks: hooks})
	if _, status, err := do(t, c, newRequest(t, context.Background(), s, replayable, "x")); err != nil || status != 200 {
		t.Fatalf("status %d err %v", status, err)
	}
	host := strings.TrimPrefix(s.URL, "http://")
	want := []string{
		"call-start POST " + strings.Split(host, ":")[0] + ":" + strings.Split(host, ":")[1],
		"attempt-start 1 in c1",
		"attempt-done 1 NotSent (ctx attempt 1)",
		"retry-decided 1 retry=true retryable",
		"attempt-start 2 in c1",
		"attempt-done 2 Answered (ctx attempt 2)",
		"call-done committed in c1",
	}
	if got := strings.Join(tr.steps, "\n"); got != strings.Join(want, "\n") {
		t.Fatalf("hooks:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	// REFUSED_STREAM is recorded as a failure: the upstream sheds load.
	for _, e := range []string{"circuit-enter", "circuit-exit(failure)", "circuit-exit(success)"} {
		if _, ok := guards.Load(e); !ok {
			t.Errorf("guard event %s not seen", e)
		}
	}
}

func TestAPanickingHookDoesNotBreakTheCall(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	boom := func() { panic("observer bug") }
	c := newClient(t, s, outbound.Config{Hooks: outbound.Hooks{
		CallStart:         func(context.Context, outbound.CallInfo) context.Context { boom(); return nil },
		AttemptStart:      func(context.Context, outbound.AttemptInfo) context.Context { boom(); return nil },
		AttemptDone:       func(context.Context, outbound.AttemptInfo, outcome.Attempt) { boom() },
		CallDone:          func(context.Context, *outcome.Outcome) { boom() },
		Guard:             func(admission.Event) { boom() },
		UpstreamForgotten: func(string) { boom() },
	}})
	if _, status, err := do(t, c, newRequest(t, context.Background(), s, noBody, "x")); err != nil || status != 200 {
		t.Fatalf("status %d err %v", status, err)
	}
	// A clean upstream is forgotten with its last connection: the hook
	// panics, and the Transport goes on.
	c.CloseIdleConnections()
	if n := len(c.Upstreams()); n != 0 {
		t.Fatalf("%d upstreams kept after their last connection closed", n)
	}
}

func TestComposeHooksCallsEachInOrder(t *testing.T) {
	tr := &trail{}
	mk := func(name string) outbound.Hooks {
		return outbound.Hooks{
			CallStart: func(ctx context.Context, _ outbound.CallInfo) context.Context {
				tr.add("%s start sees %v", name, ctx.Value(ctxKey("by")))
				return context.WithValue(ctx, ctxKey("by"), name)
			},
			CallDone: func(context.Context, *outcome.Outcome) { tr.add("%s done", name) },
		}
	}
	h := outbound.ComposeHooks(mk("a"), outbound.Hooks{}, mk("b"))
	ctx := h.CallStart(context.Background(), outbound.CallInfo{})
	h.CallDone(ctx, nil)
	if got := strings.Join(tr.steps, ", "); got != "a start sees <nil>, b start sees a, a done, b done" {
		t.Fatal(got)
	}
}

// The slog hooks log decisions at their levels, and nothing secret: no
// header values, no URL path or query, no body.
func TestSlogHooksLogDecisionsWithoutSecrets(t *testing.T) {
	s := newServer(t, outboundtest.HTTP1)
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := newClient(t, s, outbound.Config{Hooks: outbound.SlogHooks(logger)})

	s.Enqueue(outboundtest.ResetAfterRead())
	get, _ := http.NewRequest(http.MethodGet, s.URL+"/accounts/secret-path?token=secret-query", nil)
	get.Header.Set("Authorization", "Bearer secret-token")
	get.Header.Set("Cookie", "session=secret-cookie")
	do(t, c, get)
	s.Enqueue(outboundtest.ResetAfterRead())
	post, _ := http.NewRequest(http.MethodPost, s.URL+"/pay", strings.NewReader("secret-body"))
	do(t, c, post)

	log := buf.String()
	for _, want := range []string{
		`level=INFO msg="outbound attempt"`, "category=Ambiguous",
		`level=INFO msg="outbound retry scheduled"`,
		`level=DEBUG msg="outbound call"`, "commit=committed",
		`level=INFO msg="outbound retry declined"`, `reason="not idempotent and may have been processed"`,
		`level=WARN msg="outbound call"`, "commit=unknown",
		`msg="outbound guard"`, "event=circuit-enter",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if strings.Contains(log, "secret") {
		t.Fatalf("the log leaks a secret:\n%s", log)
	}
}
