package runner

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// TestSenderWithholdsResultOlderThanSeenEpoch: the owner's own check passed
// (its handler finished while it owned the shard), but its reply is held
// in the transport — the gap between that check and the socket write —
// while its lease expires and another runner takes the shard. The sender,
// which has seen the newer epoch in its lock watch, must turn the late
// reply into a *StaleResultError instead of acknowledging it; the next ask
// is served by the new owner.
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
	served := make(chan struct{})
	release := make(chan struct{})
	hold := func(req *deliverRequest, resp *deliverResponse) {
		if req.Entity == id && resp.Code == codeOK {
			close(served)
			<-release // the reply waits here, computed but not written
		}
	}
	a.transport.onServe.Store(&hold)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type outcome struct {
		resp echoResp
		err  error
	}
	late := make(chan outcome, 1)
	go func() {
		resp, err := echoMethod.Ask(ctx, c, id, echoReq{Text: "first"})
		late <- outcome{resp, err}
	}()
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
