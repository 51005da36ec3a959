package hosting

import (
	"testing"

	"github.com/shardhost/shardhost/sharding"
)

// TestCounter: a striped counter sums its stripes.
func TestCounter(t *testing.T) {
	var c counter
	for s := range 1000 {
		c.add(sharding.ShardID(s))
	}
	if got := c.load(); got != 1000 {
		t.Errorf("load() = %d after 1000 adds", got)
	}
}
