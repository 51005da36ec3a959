package sharding

import (
	"fmt"
	"testing"
)

func BenchmarkAssign(b *testing.B) {
	sizes := []struct{ shards, runners int }{{1024, 10}, {16384, 100}}
	for _, s := range allStrategies() {
		for _, size := range sizes {
			b.Run(fmt.Sprintf("%s/%dx%d", s.Name(), size.shards, size.runners), func(b *testing.B) {
				in := Input{NumShards: size.shards, Runners: numbered("", size.runners)}
				if s.Name() == nameStickyBalanced {
					// A runner joined since the current assignment.
					in.Current = mustAssign(b, Balanced(), Input{NumShards: size.shards, Runners: in.Runners[1:]})
				}
				for b.Loop() {
					if _, err := s.Assign(in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	// Unequal weights take the floating-point path of weighted rendezvous.
	for _, s := range []Strategy{Rendezvous(), Balanced()} {
		b.Run(fmt.Sprintf("%s/16384x100-weighted", s.Name()), func(b *testing.B) {
			in := Input{NumShards: 16384, Runners: numbered("", 100)}
			for i := range in.Runners {
				in.Runners[i].Weight = 1 + i%3
			}
			for b.Loop() {
				if _, err := s.Assign(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
