package runner_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestRememberWithoutAMessageSurvivesACrash: on a real etcd with two
// runners, 200 entities remembered by a call on one runner (half of them
// owned by the other) — no message of their own — each have a marker in
// the store when the call returns and run on their shard's owner;
// remembering them again writes nothing and starts nothing; after one
// runner is killed (its lease left to expire) and restarted, every one of
// them runs again on its shard's owner, and no entity ever ran on two
// runners at once. A kind without the Remembered option, and a kind not
// registered, are refused with their typed errors.
func TestRememberWithoutAMessageSurvivesACrash(t *testing.T) {
	const (
		shards = 32
		n      = 200
	)
	c := startEtcdCluster(t)
	env := newTwinEnv()
	cfg := func(id string) runner.Config {
		return runner.Config{ID: id, NumShards: shards, ListenAddr: "127.0.0.1:0", LeaseTTL: 3 * time.Second}
	}
	setup := func(r *runner.Runner) error { return r.Register(env.twin, env.plain) }
	r1 := c.startWith(cfg("r1"), setup)
	r2 := c.startWith(cfg("r2"), setup)
	c.waitPartition([]*etcdRunner{r1, r2}, shards, 30*time.Second)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ids := make([]string, n)
	remote := 0
	for i := range ids {
		ids[i] = fmt.Sprint("dev-", i)
		if owner, _ := r1.OwnerOf(sharding.ShardOf(ids[i], shards)); owner == "r2" {
			remote++
		}
		if err := r1.Remember(ctx, env.twin, ids[i]); err != nil {
			t.Fatalf("Remember(%s): %v", ids[i], err)
		}
	}
	if remote == 0 || remote == n {
		t.Fatalf("%d of %d entities on the other runner: the test needs both", remote, n)
	}
	store, err := etcd.New(testenv.NewEtcdClient(t, c.endpoints...), c.ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	marks := markers(t, store, shards)
	if len(marks) != n {
		t.Fatalf("%d markers stored when every Remember returned, want %d", len(marks), n)
	}
	// liveOnOwners reports whether every entity has one life, on its
	// shard's owner.
	rs := func() []*etcdRunner { return []*etcdRunner{r1, r2} }
	liveOnOwners := func() (bool, string) {
		for _, id := range ids {
			owner := ""
			for _, r := range rs() {
				if _, ok := r.Owned()[sharding.ShardOf(id, shards)]; ok {
					owner = r.ID()
				}
			}
			if live := env.live("twin", id); len(live) != 1 || live[0] != owner {
				return false, fmt.Sprintf("%s lives on %v, its shard is owned by %q", id, live, owner)
			}
		}
		return true, ""
	}
	if ok, why := liveOnOwners(); !ok {
		t.Fatalf("after Remember: %s", why)
	}
	lives := env.count()
	for _, id := range ids[:20] {
		if err := r2.Remember(ctx, env.twin, id); err != nil {
			t.Fatalf("Remember(%s) again: %v", id, err)
		}
	}
	if again := markers(t, store, shards); !maps.Equal(again, marks) || env.count() != lives {
		t.Errorf("remembering again wrote markers or started lives: %d markers (%d before), %d new lives", len(again), len(marks), env.count()-lives)
	}
	// From a handler, through its runner.
	if _, err := env.adopt.Ask(ctx, r2, ids[0], "adopted"); err != nil {
		t.Fatalf("Remember from a handler: %v", err)
	}
	ids = append(ids, "adopted")
	if after := markers(t, store, shards); len(after) != n+1 || after["adopted"] == 0 {
		t.Errorf("after Remember from a handler: %d markers, want %d with adopted's", len(after), n+1)
	}
	marks = markers(t, store, shards)
	if err := r1.Remember(ctx, env.plain, "p"); !errors.Is(err, entity.ErrNotRemembered) {
		t.Errorf("Remember of a kind without Remembered: %v, want ErrNotRemembered", err)
	}
	other := entity.NewKind("unregistered", func(string) *twin { return &twin{} }, entity.Remembered())
	if err := r1.Remember(ctx, other, "u"); !errors.Is(err, entity.ErrUnknownKind) {
		t.Errorf("Remember of an unregistered kind: %v, want ErrUnknownKind", err)
	}

	// Kill r2 (its lease is not revoked: r1 takes its shards when it
	// expires) and start it again.
	r2.stop()
	c.waitPartition([]*etcdRunner{r1}, shards, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, "every entity running on r1 after the crash", func() bool { ok, _ := liveOnOwners(); return ok })
	r2 = c.startWith(cfg("r2"), setup)
	c.waitPartition([]*etcdRunner{r1, r2}, shards, 30*time.Second)
	testenv.WaitFor(t, 30*time.Second, "every entity running on its owner after the restart", func() bool { ok, _ := liveOnOwners(); return ok })
	if o := env.overlaps(); len(o) > 0 {
		t.Errorf("lives on two runners at once:\n%v", o)
	}
	checkSingleOwner(t, c.rec.all())
	if final := markers(t, store, shards); !maps.Equal(final, marks) {
		t.Errorf("the crash changed the markers: %d, %d before", len(final), len(marks))
	}
}

// count returns the number of lives recorded.
func (env *twinEnv) count() int {
	env.mu.Lock()
	defer env.mu.Unlock()
	return len(env.lives)
}
