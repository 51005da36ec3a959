package ownership_test

import (
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/runner/runnertest/ownership"
)

// TestOverlaps: clean handovers are no overlap; an acquisition while another
// runner owns the shard is one, reported with both runners.
func TestOverlaps(t *testing.T) {
	at := time.Now()
	base := func(id string, ms int) runner.EventBase {
		return runner.EventBase{Runner: id, Time: at.Add(time.Duration(ms) * time.Millisecond)}
	}
	ok := []runner.Event{
		runner.ShardAcquired{EventBase: base("a", 0), Shard: 1},
		runner.ShardReleased{EventBase: base("a", 1), Shard: 1},
		runner.ShardAcquired{EventBase: base("b", 2), Shard: 1},
		runner.ShardLost{EventBase: base("b", 3), Shard: 1, Cause: runner.ErrShutdown},
		runner.ShardAcquired{EventBase: base("c", 4), Shard: 1},
		runner.ShardAcquired{EventBase: base("c", 5), Shard: 1}, // again by its owner
		runner.ShardAcquired{EventBase: base("a", 6), Shard: 2}, // another shard
		runner.ShardReleased{EventBase: base("b", 7), Shard: 2}, // not b's: a still owns it
	}
	if got := ownership.Overlaps(ok); len(got) != 0 {
		t.Errorf("Overlaps(clean handovers) = %+v, want none", got)
	}
	bad := append(slices.Clone(ok),
		runner.ShardAcquired{EventBase: base("a", 8), Shard: 1},
		runner.ShardAcquired{EventBase: base("b", 9), Shard: 2},
	)
	want := []ownership.Overlap{
		{Shard: 1, Runner: "a", Owner: "c", Time: at.Add(8 * time.Millisecond)},
		{Shard: 2, Runner: "b", Owner: "a", Time: at.Add(9 * time.Millisecond)},
	}
	if got := ownership.Overlaps(bad); !slices.Equal(got, want) {
		t.Errorf("Overlaps(acquired while owned) = %+v, want %+v", got, want)
	}
}
