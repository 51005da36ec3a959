package reminders

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// TestFailedMarkerPutWaitsItsBackOff: a remembered entity's marker whose
// put fails is put again after the side loop's back-off, not at once —
// the failed put queued again must not wake the loop that just failed,
// or a store that refuses writes is called in a busy loop (a store whose
// writes land late got one more late write per turn, without bound). Once
// the store answers again, the marker is written.
func TestFailedMarkerPutWaitsItsBackOff(t *testing.T) {
	c := memory.NewCluster()
	defer c.Close()
	const id = sharding.ShardID(2)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	s, st, epoch := ownedShard(ctx, t, c, id, true)
	wg.Go(func() { s.Run(ctx) })

	st.Fail(memory.OpShardState, storage.ErrUnavailable)
	before := st.Calls(memory.OpShardState)
	s.Remember(id, epoch, hosting.EntityKey{Kind: "twin", ID: "pump-7"})
	// The back-off allows a put at once, then after 250 ms and 750 ms: a
	// loaded machine can only make fewer.
	const window, most = time.Second, 6
	time.Sleep(window)
	if calls := st.Calls(memory.OpShardState) - before; calls > most {
		t.Fatalf("%d store calls within %v of a failing marker put; its back-off allows at most %d", calls, window, most)
	}

	st.Fail(memory.OpShardState, nil)
	other := c.NewStore("reader")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got, err := other.ReadShardStates(t.Context(), []sharding.ShardID{id})
		if err == nil && len(got) == 1 && len(got[0].Remembered) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the store answers again, and 30 s later the marker is still not written: %+v, %v", got, err)
		}
	}
}
