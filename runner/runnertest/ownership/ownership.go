package ownership

import (
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// Overlap is one ShardAcquired of Shard by Runner, at Time, while Owner still
// owned the shard by its own events (no ShardReleased or ShardLost yet).
type Overlap struct {
	Shard  sharding.ShardID
	Runner string
	Owner  string
	Time   time.Time
}

// Overlaps returns the overlaps in evs, in the order of evs. The events must
// be merged from every runner and sorted by time, as a recorder subscribed to
// all of them delivers them; a runner that acquires a shard it already owns
// is not an overlap.
func Overlaps(evs []runner.Event) []Overlap {
	owner := map[sharding.ShardID]string{}
	var out []Overlap
	for _, ev := range evs {
		switch e := ev.(type) {
		case runner.ShardAcquired:
			if o := owner[e.Shard]; o != "" && o != e.Runner {
				out = append(out, Overlap{Shard: e.Shard, Runner: e.Runner, Owner: o, Time: e.Time})
			}
			owner[e.Shard] = e.Runner
		case runner.ShardReleased:
			if owner[e.Shard] == e.Runner {
				owner[e.Shard] = ""
			}
		case runner.ShardLost:
			if owner[e.Shard] == e.Runner {
				owner[e.Shard] = ""
			}
		}
	}
	return out
}
