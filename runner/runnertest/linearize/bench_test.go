package linearize

import (
	"fmt"
	"testing"
)

// BenchmarkCheck checks generated histories of 100 entities of 60
// operations each, about 1 in 8 unknown, like a fault-suite run's.
func BenchmarkCheck(b *testing.B) {
	var h []Op
	for e := range uint64(100) {
		for _, op := range generate(e, 60, false) {
			op.Entity = fmt.Sprint(e)
			h = append(h, op)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		rep, err := Check(h, Config{})
		if err != nil || !rep.OK() {
			b.Fatal(rep, err)
		}
	}
}
