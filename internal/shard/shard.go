// Package shard spreads a shared counter over per-processor cells, so that
// callers running on different processors (Ps) stop writing the same cache
// line on every call.
//
// A guard keeps its exact count in one shared atomic (its pool) and, once it
// sees contention there, moves items (bulkhead slots, rate tokens) into
// Stripes in small batches. Most takes and puts then touch only the cell of
// the processor they run on. Items are never created or lost on the way:
// pool + cells + items handed out is constant, so a bulkhead never admits
// more than its limit. What striping costs is precision at the edge: items
// in another processor's cell are found by stealing, and a caller that finds
// every cell and the pool empty while a batch is being moved retries.
//
// Which processor a goroutine runs on is not public in Go; Hint reads it
// through a sync.Pool, whose Get and Put use a per-processor slot without
// locking. The hint is right nearly always and is only ever used to choose a
// cell: a wrong hint costs speed, never correctness.
package shard

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// cacheLine is the size a cell is padded to: two 64-byte lines, because
// common x86 processors fetch lines in adjacent pairs.
const cacheLine = 128

// maxCells bounds the cells of one Stripes (and so its memory).
const maxCells = 64

var (
	handles atomic.Uint32
	hints   = sync.Pool{New: func() any {
		h := new(uint32)
		*h = handles.Add(1) - 1
		return h
	}}
)

// hint returns a number that is, nearly always, the same for calls made on
// the same processor and different for calls made on different ones.
func hint() uint32 {
	h := hints.Get().(*uint32)
	v := *h
	hints.Put(h)
	return v
}

// Worthwhile reports whether striping can help at all: with one processor
// there is no contention to remove.
func Worthwhile() bool { return runtime.GOMAXPROCS(0) > 1 }

type cell struct {
	n atomic.Int64
	_ [cacheLine - 8]byte
}

// Stripes is a set of per-processor counters of items taken out of a
// guard's pool. It is safe for concurrent use.
type Stripes struct {
	// Batch is how many items the owner moves between its pool and a cell
	// at once, chosen for this number of cells. Set before the Stripes are
	// shared; read-only after.
	Batch int64

	cells []cell
	mask  uint32

	// moving counts transfers between the pool and a cell in progress and
	// moved counts those completed, so that a caller about to reject can
	// tell whether an item was in transit while it looked (see Mark).
	moving atomic.Int64
	_      [cacheLine - 8]byte
	moved  atomic.Uint64
}

// Count is the number of cells New gives: GOMAXPROCS rounded up to a power
// of two, at most 64.
func Count() int {
	n := 1
	for n < runtime.GOMAXPROCS(0) && n < maxCells {
		n *= 2
	}
	return n
}

// After is how many failed compare-and-swaps on a guard's shared word make
// the guard stripe.
const After = 64

// MaxBatch bounds the items a guard moves between its pool and a cell at
// once.
const MaxBatch = 64

// Plan returns Stripes (Count cells) for a guard whose pool holds total
// items, each cell moving batches of total/(share × cells), at most
// MaxBatch; or nil when batches would be smaller than two, where striping
// would cost more than it saves. With force (tests), batches are at least
// one.
func Plan(total, share int64, force bool) *Stripes {
	n := Count()
	batch := min(MaxBatch, total/(share*int64(n)))
	if batch < 2 && !force {
		return nil
	}
	s := New(n)
	s.Batch = max(1, batch)
	return s
}

// New returns Stripes with n cells; n must be a power of two (Count gives
// one).
func New(n int) *Stripes {
	if n < 1 || n&(n-1) != 0 {
		panic("shard: the number of cells must be a power of two")
	}
	return &Stripes{cells: make([]cell, n), mask: uint32(n - 1)}
}

// Cells returns the number of cells.
func (s *Stripes) Cells() int { return len(s.cells) }

// Cell returns the index of the calling processor's cell.
func (s *Stripes) Cell() uint32 { return hint() & s.mask }

// Choose returns the cell to use: the one hint names (any value but 0 is
// correct), or for 0, "no hint", the calling processor's cell.
func (s *Stripes) Choose(hint uint32) uint32 {
	if hint != 0 {
		return hint & s.mask
	}
	return s.Cell()
}

// Take takes one item from cell c, if it has one.
func (s *Stripes) Take(c uint32) bool {
	x := &s.cells[c&s.mask].n
	for n := x.Load(); n > 0; n = x.Load() {
		if x.CompareAndSwap(n, n-1) {
			return true
		}
	}
	return false
}

// Steal takes one item from any cell, starting after cell c.
func (s *Stripes) Steal(c uint32) bool {
	for i := range uint32(len(s.cells)) {
		if s.Take(c + 1 + i) {
			return true
		}
	}
	return false
}

// Put adds n items to cell c and returns how many it holds now.
func (s *Stripes) Put(c uint32, n int64) int64 { return s.cells[c&s.mask].n.Add(n) }

// PutUpTo adds n items to cell c, but no more than it takes to hold limit,
// and returns how many it could not add.
func (s *Stripes) PutUpTo(c uint32, n, limit int64) (rest int64) {
	x := &s.cells[c&s.mask].n
	for {
		have := x.Load()
		add := max(0, min(n, limit-have))
		if add == 0 || x.CompareAndSwap(have, have+add) {
			return n - add
		}
	}
}

// TakeN takes exactly n items from cell c, if it holds that many.
func (s *Stripes) TakeN(c uint32, n int64) bool {
	x := &s.cells[c&s.mask].n
	for have := x.Load(); have >= n; have = x.Load() {
		if x.CompareAndSwap(have, have-n) {
			return true
		}
	}
	return false
}

// Sum returns the items held by every cell. It is exact only when nothing
// moves concurrently.
func (s *Stripes) Sum() int64 {
	var t int64
	for i := range s.cells {
		t += s.cells[i].n.Load()
	}
	return t
}

// StartMove announces a transfer between the pool and a cell; EndMove ends
// it. Between the two, the items moved are in neither place.
func (s *Stripes) StartMove() { s.moving.Add(1) }

// EndMove ends a transfer started with StartMove.
func (s *Stripes) EndMove() {
	s.moved.Add(1)
	s.moving.Add(-1)
}

// Mark returns a token for Settled, and false if a transfer is in progress
// (the caller should look again).
func (s *Stripes) Mark() (uint64, bool) {
	m := s.moved.Load()
	return m, s.moving.Load() == 0
}

// Settled reports whether no transfer started or ended since Mark returned
// m: then a caller that found the pool and every cell empty in between saw
// every item there was.
func (s *Stripes) Settled(m uint64) bool {
	return s.moving.Load() == 0 && s.moved.Load() == m
}

var forced atomic.Bool

// Force makes every guard built from now on striped from the start, so that
// tests can run the striped paths without having to produce contention. It
// returns a function that restores the previous setting. Tests that use it
// must not run in parallel with tests that build guards.
func Force(on bool) (restore func()) {
	old := forced.Swap(on)
	return func() { forced.Store(old) }
}

// Forced reports whether Force is on.
func Forced() bool { return forced.Load() }
