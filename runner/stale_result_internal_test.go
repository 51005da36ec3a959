package runner

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
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
	c := tc.start(Config{ID: "c", ClientOnly: true, FullLockView: true})
	tc.waitSettled()
	shard, epoch, id := entityOwnedBy(a, "late-")
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
	aLease := a.att.lease
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
	c := tc.start(Config{ID: "c", ClientOnly: true, FullLockView: true})
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

// TestSenderAcceptsOlderEpochResultOfShutdownMove: the same late reply,
// but its owner hands the shard off by Shutdown and then revokes its
// lease: the sender sees the newer epoch and the lease gone before the
// reply. The owner drained its handlers before giving the shard up and
// marked its record Stopped before the revocation, so the result ran
// before the new owner started and is acknowledged. (No request is lost on
// a planned move, including the moves of a Shutdown.)
func TestSenderAcceptsOlderEpochResultOfShutdownMove(t *testing.T) {
	if o := <-shutdownWithHeldReply(t); o.err != nil || o.resp.Runner != "a" || o.resp.Text != "first" {
		t.Fatalf("reply of the cleanly stopped former owner = %+v, %v; want a's result acknowledged", o.resp, o.err)
	}
}

// TestShutdownMarksStoppedOnlyWithoutDetach: a runner that stayed attached
// under its lease marks its record Stopped before the revocation, and the
// other runners remember that lease as ended by drains; one that detached
// under the same lease (its entities dropped without a drain) does not,
// even after it re-attached under it and drained on Shutdown — its late
// replies stay withheld.
func TestShutdownMarksStoppedOnlyWithoutDetach(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start(Config{ID: "a", RecoverWindow: 100 * time.Millisecond})
	b := tc.start(Config{ID: "b"})
	c := tc.start(Config{ID: "c", ClientOnly: true, FullLockView: true})
	tc.waitSettled()
	leaseOf := func(r *Runner) storage.LeaseID {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.att.lease
	}
	aLease, bLease := leaseOf(a), leaseOf(b)
	a.Detach()
	for p := testenv.NewPatience(10 * time.Second); a.Status().Phase != "attached" || len(a.Owned()) == 0; p.Sleep(5 * time.Millisecond) {
		if p.Over() {
			t.Fatalf("a did not re-attach and own shards again after %v: %s", p, a.Status().Phase)
		}
	}
	if leaseOf(a) != aLease {
		t.Fatal("a re-attached under a new lease; this test needs the same one")
	}
	tc.waitSettled()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	dir := routingDir{c}
	for !dir.LeaseEndsByDrain(bLease) {
		if ctx.Err() != nil {
			t.Fatal("c never saw b's lease end by a clean stop")
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.mu.Lock()
	_, aLive := c.view.byLease[aLease]
	c.mu.Unlock()
	if aLive || dir.LeaseEndsByDrain(aLease) {
		t.Fatalf("a's lease (detached under it): live %v, ends by drain %v; want ended, not by drain", aLive, dir.LeaseEndsByDrain(aLease))
	}
}

// shutdownWithHeldReply makes a (of a, b and client c) serve an ask whose
// reply its transport holds, shuts a down (b takes every shard), and lets
// the reply go once c has seen b own the shard at a newer epoch and a's
// lease end. It returns the ask's outcome.
func shutdownWithHeldReply(t *testing.T) <-chan askOutcome {
	t.Helper()
	tc := newTestCluster(t)
	a := tc.start(Config{ID: "a", DrainTimeout: 300 * time.Millisecond})
	tc.start(Config{ID: "b"})
	c := tc.start(Config{ID: "c", ClientOnly: true, FullLockView: true})
	tc.waitSettled()
	shard, epoch, id := entityOwnedBy(a, "stopping-")
	a.mu.Lock()
	aLease := a.att.lease
	a.mu.Unlock()
	served, release := make(chan struct{}), make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	late := askHeld(ctx, a, c, id, served, release)
	<-served
	stopped := make(chan error, 1)
	go func() { stopped <- a.Shutdown(ctx) }() // its drain gives up on the held reply after DrainTimeout
	for {
		o, e := c.OwnerOf(shard)
		c.mu.Lock()
		_, live := c.view.byLease[aLease]
		c.mu.Unlock()
		if o == "b" && e > epoch && !live {
			break
		}
		select {
		case <-ctx.Done():
			close(release)
			t.Fatal("c never saw b own the shard and a's lease end")
		case <-time.After(2 * time.Millisecond):
		}
	}
	close(release)
	t.Cleanup(func() {
		if err := <-stopped; err != nil {
			t.Errorf("a.Shutdown = %v", err)
		}
	})
	return late
}

// entityOwnedBy returns a shard r owns (of 16), its epoch, and an entity
// ID with prefix on that shard.
func entityOwnedBy(r *Runner, prefix string) (sharding.ShardID, storage.Epoch, string) {
	var (
		shard sharding.ShardID
		epoch storage.Epoch
	)
	for id, e := range r.Owned() {
		shard, epoch = id, e
		break
	}
	id := ""
	for i := 0; id == "" || sharding.ShardOf(id, 16) != shard; i++ {
		id = prefix + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
	}
	return shard, epoch, id
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
	observe(owner, hold)
	late := make(chan askOutcome, 1)
	go func() {
		resp, err := echoMethod.Ask(ctx, c, id, echoReq{Text: "first"})
		late <- askOutcome{resp, err}
	}()
	return late
}
