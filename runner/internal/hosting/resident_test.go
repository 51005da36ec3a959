package hosting

import (
	"testing"
	"unsafe"
)

func TestResidentMailboxSitsOnItsOwnCacheLines(t *testing.T) {
	var e resident
	// At 256 bytes a resident is allocated 256-aligned (its size class),
	// so offsets 0, 64, 128 and 192 start cache lines.
	if size := unsafe.Sizeof(e); size != 256 {
		t.Fatalf("resident is %d bytes, want 256: re-check the grouping of its fields by writer", size)
	}
	if end := unsafe.Offsetof(e.ctx) + unsafe.Sizeof(e.ctx); end > 64 {
		t.Errorf("the fields read per message end at %d, want within the first cache line", end)
	}
	if end, mu := unsafe.Offsetof(e.processed)+unsafe.Sizeof(e.processed), unsafe.Offsetof(e.mu); end > 128 || mu < 128 {
		t.Errorf("the goroutine's fields end at %d and the mailbox starts at %d, want them on different cache lines", end, mu)
	}
}
