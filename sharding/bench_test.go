package sharding

import (
	"fmt"
	"slices"
	"testing"
)

func BenchmarkAssign(b *testing.B) {
	sizes := []struct{ shards, runners int }{{1024, 10}, {4096, 20}, {8192, 50}, {16384, 100}, {MaxShards, 100}, {MaxShards, 1000}}
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

// BenchmarkPlanner measures a membership change as a runner's Planner
// computes it: one runner joins, then leaves, alternately (compare with
// BenchmarkAssign's fresh computation of the same size).
func BenchmarkPlanner(b *testing.B) {
	for _, size := range []struct{ shards, runners int }{{4096, 20}, {8192, 50}, {16384, 100}, {MaxShards, 100}, {MaxShards, 1000}} {
		b.Run(fmt.Sprintf("%dx%d", size.shards, size.runners), func(b *testing.B) {
			p := NewPlanner(Balanced())
			rs := numbered("", size.runners)
			ins := []Input{
				{NumShards: size.shards, Runners: rs},
				{NumShards: size.shards, Runners: append(slices.Clone(rs), Runner{ID: "joiner", Weight: 1})},
			}
			if _, err := p.Assign(ins[0]); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				i++
				if _, err := p.Assign(ins[i%2]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPlannerColdStart measures what a Planner costs a runner at a
// cold start: its first, fresh computation, and Prepare building the
// prefixes afterwards (a runner does it once membership is quiet).
func BenchmarkPlannerColdStart(b *testing.B) {
	for _, size := range []struct{ shards, runners int }{{MaxShards, 100}, {MaxShards, 1000}} {
		in := Input{NumShards: size.shards, Runners: numbered("", size.runners)}
		b.Run(fmt.Sprintf("fresh/%dx%d", size.shards, size.runners), func(b *testing.B) {
			for b.Loop() {
				if _, err := NewPlanner(Balanced()).Assign(in); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("prepare/%dx%d", size.shards, size.runners), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				p := NewPlanner(Balanced())
				if _, err := p.Assign(in); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				p.Prepare()
			}
		})
	}
}
