package attempt_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/outboundhq/outbound/attempt"
	"github.com/outboundhq/outbound/outboundtest"
)

// settles waits, boundedly, for the number of goroutines to come back to at
// most want, and reports whether it did.
func settles(want int) bool {
	for range 400 {
		if runtime.NumGoroutine() <= want {
			return true
		}
		runtime.Gosched()
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func TestCloseLeavesNoGoroutineBehind(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, p := range protos {
		s := outboundtest.NewServer(p)
		tr, err := attempt.New(attempt.Config{HTTPTransport: s.Transport()})
		if err != nil {
			t.Fatal(err)
		}
		s.Enqueue(outboundtest.Respond(200), outboundtest.ResetAfterRead(), outboundtest.TruncatedBody(100, 5))
		for range 5 {
			roundTrip(tr, newRequest(t, context.Background(), s, replayable, "g"))
		}
		tr.Close()
		s.Close()
	}
	if !settles(before) {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
}
