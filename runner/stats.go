package runner

import (
	"sync/atomic"

	"github.com/shardhost/shardhost/sharding"
)

// counterStripes is the number of cache lines a counter is spread over.
const counterStripes = 8

// counter counts events cheaply on hot paths: increments for different
// shards mostly land on different cache lines, so entities running on
// different cores do not contend. Read it with load (a sum, not a
// snapshot: increments racing with it may or may not be included).
type counter [counterStripes]struct {
	n atomic.Uint64
	_ [56]byte // one stripe per 64-byte cache line
}

func (c *counter) add(shard sharding.ShardID) { c[uint32(shard)%counterStripes].n.Add(1) }

func (c *counter) load() uint64 {
	var sum uint64
	for i := range c {
		sum += c[i].n.Load()
	}
	return sum
}

// kindStats are the message counters of one registered kind on this
// runner, since it was registered. The debug handler reads them; the
// OpenTelemetry instruments (metrics.go) stay the source for monitoring.
type kindStats struct {
	handled  counter // messages whose handler ran (whatever it returned)
	rejected counter // messages refused by a full mailbox
}
