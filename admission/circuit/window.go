package circuit

import "github.com/outboundhq/outbound/internal/clock"

// countWindow holds the outcomes of the last size calls as two bitsets
// (failed, then slow) of words(size) words each: in inline for a window of
// up to 128 calls, in a slice of the breaker's windowExt for a longer one.
type countWindow struct {
	inline             [4]uint64
	head, n, fail, slo int32
}

func words(size int32) int32 { return (size + 63) / 64 }

func (w *countWindow) add(bits []uint64, size int32, failed, slow bool) {
	i, mask := w.head/64, uint64(1)<<(w.head%64)
	slowI := i + words(size)
	if w.n == size {
		if bits[i]&mask != 0 {
			w.fail--
		}
		if bits[slowI]&mask != 0 {
			w.slo--
		}
	} else {
		w.n++
	}
	bits[i] &^= mask
	bits[slowI] &^= mask
	if failed {
		bits[i] |= mask
		w.fail++
	}
	if slow {
		bits[slowI] |= mask
		w.slo++
	}
	if w.head++; w.head == size {
		w.head = 0
	}
}

// reset empties the window; bits are its bitsets (nil when the counters
// serve only as trial counters).
func (w *countWindow) reset(bits []uint64) {
	clear(bits)
	clear(w.inline[:])
	w.head, w.n, w.fail, w.slo = 0, 0, 0, 0
}

// timeWindow holds the outcomes of the calls of the last size seconds in
// one-second buckets, as Resilience4j's SlidingTimeWindowMetrics does.
type timeWindow struct {
	buckets      []bucket
	last         int64 // the second of the newest bucket
	n, fail, slo int32
	size         int32
}

type bucket struct{ n, fail, slo int32 }

func newTimeWindow(size int32) timeWindow {
	return timeWindow{buckets: make([]bucket, size), size: size, last: clock.Never / 1e9}
}

func (w *timeWindow) add(now int64, failed, slow bool) {
	sec := floorDiv(now, 1e9)
	w.advance(sec)
	b := &w.buckets[floorMod(sec, int64(w.size))]
	b.n++
	w.n++
	if failed {
		b.fail++
		w.fail++
	}
	if slow {
		b.slo++
		w.slo++
	}
}

// advance drops the buckets that have left the window by second sec.
func (w *timeWindow) advance(sec int64) {
	if sec <= w.last {
		return
	}
	steps := min(sec-w.last, int64(w.size))
	for s := sec - steps + 1; s <= sec; s++ {
		b := &w.buckets[floorMod(s, int64(w.size))]
		w.n -= b.n
		w.fail -= b.fail
		w.slo -= b.slo
		*b = bucket{}
	}
	w.last = sec
}

func (w *timeWindow) reset() {
	clear(w.buckets)
	w.n, w.fail, w.slo = 0, 0, 0
	w.last = clock.Never / 1e9
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }
