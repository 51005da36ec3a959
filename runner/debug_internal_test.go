package runner

import (
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/runner/internal/debugpage"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// TestDebugEvent: each event type is listed on the debug page under its
// type name, with its shard, epoch and detail where it has them.
func TestDebugEvent(t *testing.T) {
	at := time.Unix(1000, 0)
	base := EventBase{Runner: "a", Time: at}
	shard := func(s sharding.ShardID) *sharding.ShardID { return &s }
	for _, c := range []struct {
		ev   Event
		want debugpage.Event
	}{
		{ShardAcquired{base, 3, 7}, debugpage.Event{Type: "ShardAcquired", Shard: shard(3), Epoch: 7}},
		{ShardReleased{EventBase: base, Shard: 4, Epoch: 8, Interrupted: 2}, debugpage.Event{Type: "ShardReleased", Shard: shard(4), Epoch: 8}},
		{ShardLost{base, 5, 9, errors.New("moved")}, debugpage.Event{Type: "ShardLost", Shard: shard(5), Epoch: 9, Detail: "moved"}},
		{ShardLost{base, 0, 1, nil}, debugpage.Event{Type: "ShardLost", Shard: shard(0), Epoch: 1}},
		{Registered{base, storage.LeaseID(0xbeef)}, debugpage.Event{Type: "Registered", Detail: "lease beef"}},
		{Detached{EventBase: base, Reason: detachment.ReasonLeaseDeadline, Detail: "late"},
			debugpage.Event{Type: "Detached", Detail: detachment.ReasonLeaseDeadline.String() + ": late"}},
		{Reattached{base, storage.LeaseID(0xab), true}, debugpage.Event{Type: "Reattached", Detail: "lease ab (new lease)"}},
		{HandoffPhase{base, 6, "warming", "a", "b", ""}, debugpage.Event{Type: "HandoffPhase", Shard: shard(6), Detail: "warming a -> b"}},
		{otherEvent{base}, debugpage.Event{Type: "otherEvent"}},
	} {
		got := debugEvent(c.ev)
		c.want.Time = at
		if !got.Time.Equal(c.want.Time) || got.Type != c.want.Type || got.Epoch != c.want.Epoch || got.Detail != c.want.Detail ||
			(got.Shard == nil) != (c.want.Shard == nil) || (got.Shard != nil && *got.Shard != *c.want.Shard) {
			t.Errorf("debugEvent(%+v) = %+v, want %+v", c.ev, got, c.want)
		}
	}
}

// otherEvent is an event type the debug page has no case for.
type otherEvent struct{ EventBase }
