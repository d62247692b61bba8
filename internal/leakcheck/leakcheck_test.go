package leakcheck_test

import (
	"strings"
	"testing"
	"time"

	"github.com/outboundhq/outbound/internal/leakcheck"
)

func TestLeakedFindsAGoroutineThatOutlivesItsTestAndForgetsOneThatEnds(t *testing.T) {
	before := leakcheck.Snapshot()
	stop := make(chan struct{})
	go func() { <-stop }()
	leaked := leakcheck.Leaked(before, 50*time.Millisecond)
	if len(leaked) != 1 || !strings.Contains(leaked[0], "leakcheck_test.TestLeakedFinds") {
		t.Fatalf("leaked: %q", leaked)
	}
	close(stop)
	if leaked := leakcheck.Leaked(before, 2*time.Second); len(leaked) != 0 {
		t.Fatalf("still reported after it ended: %q", leaked)
	}
}
