package runner

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// TestSenderWithholdsResultOlderThanSeenEpoch: the owner's own check passed
// (its handler finished while it owned the shard), but its reply is held
// in the transport — the gap between that check and the socket write —
// while its lease expires and another runner takes the shard. The sender,
// which has seen the newer epoch in its lock watch and the owner's lease
// end, must turn the late reply into a *StaleResultError instead of
// acknowledging it; the next ask is served by the new owner.
func TestSenderWithholdsResultOlderThanSeenEpoch(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start(Config{ID: "a"})
	tc.start(Config{ID: "b"})
	c := tc.start(Config{ID: "c", ClientOnly: true})
	tc.waitSettled()
	var (
		shard sharding.ShardID
		epoch storage.Epoch
	)
	for id, e := range a.Owned() {
		shard, epoch = id, e
		break
	}
	id := ""
	for i := 0; sharding.ShardOf(id, 16) != shard || id == ""; i++ {
		id = "late-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
	}
	served, release := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	late := askHeld(ctx, a, c, id, served, release)
	select {
	case <-served:
	case <-ctx.Done():
		t.Fatal("a never served the ask")
	}
	// a's lease expires on the server (as after a pause): its locks go, b
	// acquires, and c's watch shows b's epoch.
	a.mu.Lock()
	aLease := a.lease
	a.mu.Unlock()
	if !tc.c.ExpireLease(aLease) {
		t.Fatal("a's lease was not found")
	}
	var newEpoch storage.Epoch
	for newEpoch <= epoch {
		select {
		case <-ctx.Done():
			t.Fatal("c never saw b own the shard")
		case <-time.After(5 * time.Millisecond):
		}
		if o, e := c.OwnerOf(shard); o == "b" {
			newEpoch = e
		}
	}
	close(release)
	o := <-late
	var stale *StaleResultError
	if !errors.As(o.err, &stale) || !errors.Is(o.err, ErrMaybeDelivered) {
		t.Fatalf("late reply reached the caller as %+v, %v; want a *StaleResultError (ErrMaybeDelivered)", o.resp, o.err)
	}
	if stale.Runner != "a" || stale.Epoch != epoch || stale.Newer < newEpoch || !errors.Is(o.err, ErrShardMoved) {
		t.Fatalf("StaleResultError = %+v; want a's epoch %d refused after epoch %d was seen", stale, epoch, newEpoch)
	}
	got, err := echoMethod.Ask(ctx, c, id, echoReq{Text: "second"})
	if err != nil || got.Runner != "b" {
		t.Fatalf("next ask = %+v, %v; want served by b", got, err)
	}
}

// TestSenderAcceptsOlderEpochResultOfPlannedMove: the same late reply, but
// the shard moved by a planned handoff from a live owner (which drained
// its handlers first): the result ran before the new owner started, so the
// sender acknowledges it even after it saw the newer epoch. (No request is
// lost on a planned move.)
func TestSenderAcceptsOlderEpochResultOfPlannedMove(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start(Config{ID: "a", DrainTimeout: 300 * time.Millisecond})
	c := tc.start(Config{ID: "c", ClientOnly: true})
	tc.waitSettled()
	future, err := sharding.Balanced().Assign(sharding.Input{NumShards: 16, Runners: []sharding.Runner{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	id := ""
	for i := 0; id == "" || future[sharding.ShardOf(id, 16)] != "b"; i++ {
		id = "moving-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
	}
	shard := sharding.ShardOf(id, 16)
	_, epoch := c.OwnerOf(shard)
	served, release := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	late := askHeld(ctx, a, c, id, served, release)
	<-served
	tc.start(Config{ID: "b"}) // a hands the shard to b (its drain gives up on the held reply after DrainTimeout)
	for {
		if o, e := c.OwnerOf(shard); o == "b" && e > epoch {
			break
		}
		select {
		case <-ctx.Done():
			close(release)
			t.Fatal("c never saw b own the shard")
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(release)
	if o := <-late; o.err != nil || o.resp.Runner != "a" || o.resp.Text != "first" {
		t.Fatalf("reply of the live former owner = %+v, %v; want a's result acknowledged", o.resp, o.err)
	}
}

type askOutcome struct {
	resp echoResp
	err  error
}

// askHeld asks entity id through c; owner's transport holds the answer
// (computed, not written) until release is closed, after closing served.
func askHeld(ctx context.Context, owner, c *Runner, id string, served, release chan struct{}) <-chan askOutcome {
	hold := func(req *transport.DeliverRequest, resp *transport.DeliverResponse) {
		if req.Entity == id && resp.Code == transport.CodeOK {
			close(served)
			<-release
		}
	}
	owner.onServe.Store(&hold)
	late := make(chan askOutcome, 1)
	go func() {
		resp, err := echoMethod.Ask(ctx, c, id, echoReq{Text: "first"})
		late <- askOutcome{resp, err}
	}()
	return late
}
