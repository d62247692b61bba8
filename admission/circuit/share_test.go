package circuit

import (
	"testing"
	"time"
)

func TestBreakersWithEqualSettingsShareOneCopy(t *testing.T) {
	cfg := Config{WindowSize: 50, WaitInOpen: 3 * time.Second}
	a, _ := New(cfg)
	cfg.OnStateChange = func(Transition) {} // not part of the shared settings
	b, _ := New(cfg)
	cfg.WaitInOpen = 4 * time.Second
	c, _ := New(cfg)
	if a.set != b.set {
		t.Fatal("equal settings are not shared")
	}
	if a.set == c.set || c.set.Value().waitOpen != 4*time.Second {
		t.Fatal("different settings share one copy")
	}
	if a.onChange != nil || b.onChange == nil {
		t.Fatal("the state-change callback is not per breaker")
	}
}
