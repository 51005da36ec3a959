package sparse

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestTableAllocatesOnlyTheChunksWritten(t *testing.T) {
	tab := New[int](1000)
	if got := tab.Len(); got < 1000 {
		t.Fatalf("Len() = %d, want >= 1000", got)
	}
	if p := tab.Peek(999); p != nil {
		t.Fatalf("Peek(999) on a new table = %v, want nil", p)
	}
	*tab.At(17) = 5
	*tab.At(999) = 7
	if got := *tab.Peek(17); got != 5 {
		t.Errorf("Peek(17) = %d, want 5", got)
	}
	if p := tab.Peek(16); p == nil || *p != 0 {
		t.Errorf("Peek(16) (same chunk as 17) = %v, want the zero value", p)
	}
	if p := tab.Peek(500); p != nil {
		t.Errorf("Peek(500) (no chunk) = %v, want nil", p)
	}
	var got []int
	n := 0
	for i, p := range tab.Allocated() {
		n++
		if *p != 0 {
			got = append(got, i)
		}
	}
	if n != 2*chunkLen || len(got) != 2 || got[0] != 17 || got[1] != 999 {
		t.Errorf("Allocated() yields %d elements, set ones %v, want %d and [17 999]", n, got, 2*chunkLen)
	}
}

func TestTableConcurrentAtAgreesOnOneChunk(t *testing.T) {
	tab := New[atomic.Int64](64)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 64 {
				tab.At(i).Add(1)
			}
		})
	}
	wg.Wait()
	for i := range 64 {
		if got := tab.Peek(i).Load(); got != 8 {
			t.Fatalf("element %d = %d, want 8 (every writer on one chunk)", i, got)
		}
	}
}
