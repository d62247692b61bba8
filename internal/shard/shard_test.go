package shard

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/outboundhq/outbound/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func addr(c *cell) uintptr { return uintptr(unsafe.Pointer(c)) }

func TestCellsArePaddedToTheirOwnCacheLines(t *testing.T) {
	s := New(Count())
	if n := s.Cells(); n < 1 || n&(n-1) != 0 || n > maxCells {
		t.Fatalf("%d cells: want a power of two in [1, %d]", n, maxCells)
	}
	if len(s.cells) > 1 {
		a, b := &s.cells[0], &s.cells[1]
		if d := addr(b) - addr(a); d < cacheLine {
			t.Fatalf("cells %d bytes apart, want at least %d", d, cacheLine)
		}
	}
	if c := s.Cell(); c >= uint32(s.Cells()) {
		t.Fatalf("Cell() = %d with %d cells", c, s.Cells())
	}
}

func TestStealFindsAnItemInAnotherCell(t *testing.T) {
	s := &Stripes{cells: make([]cell, 4), mask: 3}
	s.Put(2, 1)
	if s.Take(0) {
		t.Fatal("took from an empty cell")
	}
	if !s.Steal(0) {
		t.Fatal("Steal missed the item in cell 2")
	}
	if s.Steal(0) || s.Sum() != 0 {
		t.Fatalf("a second item appeared: sum %d", s.Sum())
	}
}

func TestTakeNTakesAllOrNothing(t *testing.T) {
	s := &Stripes{cells: make([]cell, 2), mask: 1}
	s.Put(1, 3)
	if s.TakeN(1, 4) {
		t.Fatal("took 4 of 3")
	}
	if !s.TakeN(1, 3) || s.Sum() != 0 {
		t.Fatalf("TakeN(3) of 3 failed or left %d", s.Sum())
	}
}

func TestItemsAreNeitherCreatedNorLostUnderConcurrency(t *testing.T) {
	s := New(Count())
	const workers, rounds = 8, 2000
	s.Put(0, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range rounds {
				c := s.Cell()
				if !s.Take(c) && !s.Steal(c) {
					continue // another worker holds them all for now
				}
				s.Put(uint32(w), 1)
			}
		})
	}
	wg.Wait()
	if got := s.Sum(); got != workers {
		t.Fatalf("%d items at the end, want %d", got, workers)
	}
}

func TestMarkSeesAMoveInProgressAndOneCompleted(t *testing.T) {
	s := New(Count())
	m, ok := s.Mark()
	if !ok || !s.Settled(m) {
		t.Fatal("not settled with no move at all")
	}
	s.StartMove()
	if _, ok := s.Mark(); ok {
		t.Fatal("Mark did not see the move in progress")
	}
	if s.Settled(m) {
		t.Fatal("Settled while a move is in progress")
	}
	s.EndMove()
	if s.Settled(m) {
		t.Fatal("Settled after a move completed since the mark")
	}
}

func TestForceRestoresThePreviousSetting(t *testing.T) {
	restore := Force(true)
	if !Forced() {
		t.Fatal("Force(true) not seen")
	}
	restore()
	if Forced() {
		t.Fatal("restore left Force on")
	}
}

func TestPutUpToStopsAtTheLimit(t *testing.T) {
	s := New(2)
	if rest := s.PutUpTo(1, 5, 3); rest != 2 || s.Sum() != 3 {
		t.Fatalf("PutUpTo(5, limit 3) left %d over, cell holds %d; want 2 over, 3 held", rest, s.Sum())
	}
	if rest := s.PutUpTo(1, 1, 3); rest != 1 {
		t.Fatalf("a full cell took %d", 1-rest)
	}
}

func TestNewRefusesACellCountThatIsNotAPowerOfTwo(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	New(3)
}

func TestChooseTakesTheHintsCellOrTheProcessorsForNoHint(t *testing.T) {
	s := New(4)
	for _, h := range []uint32{1, 2, 7, 1<<31 | 5} {
		if c := s.Choose(h); c != h&3 {
			t.Fatalf("Choose(%#x) = %d, want the hint's cell %d", h, c, h&3)
		}
	}
	if c := s.Choose(0); c >= 4 {
		t.Fatalf("Choose(0) = %d with 4 cells", c)
	}
}

func TestPlanStripesOnlyWhenBatchesOfTwoFit(t *testing.T) {
	cells := int64(Count())
	if s := Plan(2*4*cells-1, 4, false); s != nil {
		t.Fatalf("striped with batches of %d", s.Batch)
	}
	s := Plan(2*4*cells, 4, false)
	if s == nil || s.Batch != 2 || s.Cells() != int(cells) {
		t.Fatalf("Plan for batches of two = %+v", s)
	}
	if s := Plan(1<<40, 4, false); s.Batch != MaxBatch {
		t.Fatalf("batch %d, want the cap %d", s.Batch, MaxBatch)
	}
	if s := Plan(1, 4, true); s == nil || s.Batch != 1 {
		t.Fatal("forced striping of a tiny pool must give batches of one")
	}
}
