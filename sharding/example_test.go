package sharding_test

import (
	"fmt"

	"github.com/shardhost/shardhost/sharding"
)

func ExampleBalanced() {
	in := sharding.Input{
		NumShards: 12,
		Runners: []sharding.Runner{
			{ID: "runner-a", Weight: 1},
			{ID: "runner-b", Weight: 1},
			{ID: "runner-c", Weight: 1},
		},
	}
	a, err := sharding.Balanced().Assign(in)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(a.Counts())
	for _, r := range in.Runners {
		fmt.Println(r.ID, a.ShardsOf(r.ID))
	}

	// runner-d joins: Balanced moves the 3 shards it gets, and a few more
	// to keep the loads exact.
	in.Runners = append(in.Runners, sharding.Runner{ID: "runner-d", Weight: 1})
	b, err := sharding.Balanced().Assign(in)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(b.Counts())
	fmt.Println("moved", sharding.Diff(a, b))
	// Output:
	// map[runner-a:4 runner-b:4 runner-c:4]
	// runner-a [3 5 6 11]
	// runner-b [4 7 8 9]
	// runner-c [0 1 2 10]
	// map[runner-a:3 runner-b:3 runner-c:3 runner-d:3]
	// moved [0 2 4 5 6]
}

func ExampleStickyBalanced() {
	runners := []sharding.Runner{{ID: "runner-0", Weight: 1}, {ID: "runner-1", Weight: 1}}
	current, err := sharding.Balanced().Assign(sharding.Input{NumShards: 8, Runners: runners})
	if err != nil {
		fmt.Println(err)
		return
	}
	// runner-1 drains: its shards move, nothing else does.
	runners[1].Weight = 0
	runners = append(runners, sharding.Runner{ID: "runner-2", Weight: 1})
	next, err := sharding.StickyBalanced().Assign(sharding.Input{NumShards: 8, Runners: runners, Current: current})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(next.Counts())
	fmt.Println("moved", len(sharding.Diff(current, next)), "of", len(current.ShardsOf("runner-1")))
	// Output:
	// map[runner-0:4 runner-2:4]
	// moved 4 of 4
}

func ExampleStrategyByName() {
	s, err := sharding.StrategyByName("jump-hash")
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = s.Assign(sharding.Input{NumShards: 16, Runners: []sharding.Runner{{ID: "runner-0", Weight: 1}, {ID: "runner-2", Weight: 1}}})
	fmt.Println(err)
	// Output:
	// assign 16 shards (jump-hash): sharding: bad runner ordinal: runner "runner-2": ordinal 2 out of range 0..1
}
