package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Damage written by hand into a real etcd, as an operator with etcdctl
// would: the cluster repairs what it owns and loses no more than the key
// touched.

// raw writes key (relative to the cluster's namespace) with the direct
// client and returns the revision.
func (c *cluster) raw(key, value string, lease storage.LeaseID) storage.Revision {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var opts []clientv3.OpOption
	if lease != storage.NoLease {
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(lease)))
	}
	resp, err := c.direct.Put(ctx, "/"+c.ns+"/"+key, value, opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	return storage.Revision(resp.Header.Revision)
}

func (c *cluster) rawDelete(key string) storage.Revision {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.direct.Delete(ctx, "/"+c.ns+"/"+key)
	if err != nil {
		c.t.Fatal(err)
	}
	return storage.Revision(resp.Header.Revision)
}

// get returns key (relative to the namespace) as stored.
func (c *cluster) get(key string) (storage.KeyValue, bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.direct.Get(ctx, "/"+c.ns+"/"+key)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return storage.KeyValue{}, false
	}
	kv := resp.Kvs[0]
	_, name, _ := strings.Cut(key, "/")
	return storage.KeyValue{Key: name, Value: kv.Value, Lease: storage.LeaseID(kv.Lease), CreateRevision: storage.Revision(kv.CreateRevision), ModRevision: storage.Revision(kv.ModRevision)}, true
}

// askOwnedBy asks, through client, one entity in each of the first n
// shards owned by r, and checks that r served them.
func askOwnedBy(t *testing.T, client *etcdRunner, r *etcdRunner, shards, n int) {
	t.Helper()
	i := 0
	for id := range r.Owned() {
		if i++; i > n {
			break
		}
		e := idFor(id, shards, "e")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := whereMethod.Ask(ctx, client, e, whereReq{})
		cancel()
		if err != nil || got.Runner != r.ID() {
			t.Errorf("Ask(%s, shard %d) = %+v, %v; want served by %s", e, id, got, err, r.ID())
		}
	}
}

// A runner's own record overwritten under its own lease, with garbage or
// with valid JSON carrying a wrong address, is rewritten by the runner
// (WARN naming the key); the other runners route to the right address
// again and the runner keeps its shards.
func TestOwnRecordOverwrittenIsRepaired(t *testing.T) {
	const shards = 64
	c := startEtcdCluster(t)
	lc := &logCapture{}
	r0 := c.start(runner.Config{ID: "r0", NumShards: shards, ListenAddr: "127.0.0.1:0"})
	r1 := c.start(runner.Config{ID: "r1", NumShards: shards, ListenAddr: "127.0.0.1:0", Logger: lc.logger(t)})
	gw := c.start(runner.Config{ID: "gateway", NumShards: shards, ClientOnly: true})
	for _, r := range []*etcdRunner{r0, r1, gw} {
		if err := r.Register(whereKind); err != nil {
			t.Fatal(err)
		}
	}
	rs := []*etcdRunner{r0, r1}
	c.waitPartition(rs, shards, 30*time.Second)
	owned := r1.Owned()
	askOwnedBy(t, gw, r1, shards, 5)

	for i, damage := range []string{
		"garbage",
		fmt.Sprintf(`{"id":"r1","address":"127.0.0.1:1","weight":1,"incarnation":%q,"started":"2026-01-01T00:00:00Z"}`, r1.Status().Incarnation),
	} {
		lease := r1.Status().Lease
		rev := c.raw("runners/r1", damage, lease)
		waitFor(t, 10*time.Second, "r1's record repaired", func() bool {
			kv, ok := c.get("runners/r1")
			if !ok || kv.ModRevision <= rev {
				return false
			}
			got, err := storage.DecodeRunner(kv)
			return err == nil && got.Address == r1.Address() && got.Incarnation == r1.Status().Incarnation && kv.Lease == lease
		})
		waitFor(t, 10*time.Second, "the gateway sees r1's address", func() bool {
			for _, m := range gw.Members() {
				if m.ID == "r1" && m.Address == r1.Address() && m.ModRevision > rev {
					return true
				}
			}
			return false
		})
		askOwnedBy(t, gw, r1, shards, 5)
		if n := len(lc.find(slog.LevelWarn, "own runner record changed under this runner's lease", "key", "runners/r1")); n != i+1 {
			t.Errorf("after damage %d: %d WARN lines naming runners/r1, want %d", i+1, n, i+1)
		}
	}
	noLossOrDetach(t, c.rec.all(), "r1")
	for id, e := range owned {
		if r1.Owned()[id] != e {
			t.Errorf("shard %d at epoch %d, was %d", id, r1.Owned()[id], e)
		}
	}
	checkSingleOwner(t, c.rec.all())
}

// A foreign write to one owned lock — a new value under the owner's own
// lease, a key without a lease put over it, or a delete — costs that shard
// only: the owner drops it (ShardLost, ErrShardMoved; WARN naming the key),
// stays attached, keeps every other shard at its epoch, and owns the shard
// again at a later epoch (a lease-less lock is never an owner: the library
// overwrites it, conditional on it still having no lease). With a full lock
// view the lock watch shows the change at once; without one the next
// verification finds a lock that left the lease (a write under the lease
// itself is found by the next fenced write: TestFencedWriteDropsTheShard).
func TestForeignLockWriteCostsOneShard(t *testing.T) {
	for _, full := range []bool{true, false} {
		t.Run(fmt.Sprintf("FullLockView=%v", full), func(t *testing.T) { testForeignLockWrite(t, full) })
	}
}

func testForeignLockWrite(t *testing.T, full bool) {
	const shards = 16
	c := startEtcdCluster(t)
	lc := &logCapture{}
	r := c.start(runner.Config{ID: "r", NumShards: shards, Logger: lc.logger(t), FullLockView: full})
	c.waitPartition([]*etcdRunner{r}, shards, 30*time.Second)
	for i, tc := range []struct {
		name   string
		shard  sharding.ShardID
		damage func() storage.Revision
		detail string
	}{
		{"garbage under the owner's lease", 3, func() storage.Revision { return c.raw("shards/3", "garbage", r.Status().Lease) }, "under this runner's lease"},
		{"a key without a lease", 5, func() storage.Revision {
			return c.raw("shards/5", `{"runnerID":"squatter","incarnation":"1"}`, storage.NoLease)
		}, "without a lease"},
		{"a delete", 7, func() storage.Revision { return c.rawDelete("shards/7") }, "deleted"},
	} {
		if !full {
			if i == 0 {
				continue // the lease still holds the key: found by a fenced write
			}
			tc.detail = "verification found the lock gone"
		}
		t.Run(tc.name, func(t *testing.T) {
			before := r.Owned()
			start := len(c.rec.all())
			rev := tc.damage()
			waitFor(t, 10*time.Second, "the shard owned again at a later epoch", func() bool {
				e, ok := r.Owned()[tc.shard]
				return ok && storage.Revision(e) > rev
			})
			kv, ok := c.get(storage.LockKey(tc.shard))
			if l, err := storage.DecodeLock(kv); !ok || err != nil || l.Lease != r.Status().Lease || l.Owner.RunnerID != "r" {
				t.Errorf("lock %d = %+v, %v; want the runner's, under its lease", tc.shard, l, err)
			}
			lost := 0
			for _, ev := range c.rec.all()[start:] {
				switch e := ev.(type) {
				case runner.Detached:
					t.Errorf("detached (%v: %s): one foreign write must cost one shard", e.Reason, e.Detail)
				case runner.ShardLost:
					if e.Shard != tc.shard || !errors.Is(e.Cause, runner.ErrShardMoved) {
						t.Errorf("lost shard %d (%v), want only shard %d with ErrShardMoved", e.Shard, e.Cause, tc.shard)
					}
					lost++
				}
			}
			if lost != 1 {
				t.Errorf("shard %d lost %d times, want once", tc.shard, lost)
			}
			for id, e := range before {
				if id != tc.shard && r.Owned()[id] != e {
					t.Errorf("shard %d at epoch %d, was %d: only shard %d may change", id, r.Owned()[id], e, tc.shard)
				}
			}
			lines := lc.find(slog.LevelWarn, "owned lock changed behind this runner's back", "key", storage.LockKey(tc.shard))
			if len(lines) != 1 || !strings.Contains(lines[0].Attrs["detail"], tc.detail) {
				t.Errorf("WARN lines naming %s: %v, want one saying %q", storage.LockKey(tc.shard), lines, tc.detail)
			}
			if i == 1 && len(lc.find(slog.LevelWarn, "took over a lock without a lease", "key", "shards/5")) != 1 {
				t.Errorf("no WARN line about taking over shards/5")
			}
		})
	}
	checkSingleOwner(t, c.rec.all())
}

// A lock without a lease found at start (a squatter key) is never an
// owner: the assignee overwrites it, conditional on it still having no
// lease, and says so.
func TestLeaselessLockIsTakenOver(t *testing.T) {
	t.Parallel()
	const shards = 8
	c := startEtcdCluster(t)
	squat := c.raw("shards/2", "squatter", storage.NoLease)
	lc := &logCapture{}
	r := c.start(runner.Config{ID: "r", NumShards: shards, Logger: lc.logger(t)})
	c.waitPartition([]*etcdRunner{r}, shards, 30*time.Second)
	if e := r.Owned()[2]; storage.Revision(e) <= squat {
		t.Errorf("shard 2 owned at epoch %d, want after the squatter's revision %d", e, squat)
	}
	if len(lc.find(slog.LevelWarn, "took over a lock without a lease", "key", "shards/2")) != 1 {
		t.Errorf("no WARN line naming shards/2: %v", lc.all())
	}
	if acq := lc.find(slog.LevelWarn, "acquire retry window exhausted"); len(acq) != 0 {
		t.Errorf("the runner waited for a person: %v", acq)
	}
}
