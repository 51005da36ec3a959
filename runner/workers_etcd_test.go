package runner_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// TestEtcdSingletonsWorkersAndRememberedEntitiesFollowTheirShards: on a
// real etcd with the gRPC transport, across two joins, a graceful shutdown
// (handoffs) and a crash, every singleton and shard worker runs once, on
// its shard's owner, never two instances at once (by their own start and
// stop records); remembered entities run, without any message, on their
// shard's owner only; each singleton's record in etcd names the runner
// running it.
func TestEtcdSingletonsWorkersAndRememberedEntitiesFollowTheirShards(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	env := newTwinEnv()
	var log workerLog
	const shards, ttl, singletons = 16, 3 * time.Second, 6
	build := func(id string) *etcdRunner {
		r := c.startWith(runner.Config{ID: id, NumShards: shards, LeaseTTL: ttl, ListenAddr: "127.0.0.1:0", WarmTimeout: time.Second, HandoffWait: 3 * time.Second},
			func(r *runner.Runner) error {
				if err := r.Register(env.twin, env.plain); err != nil {
					return err
				}
				if err := r.RunPerShard("follow", log.body(nil)); err != nil {
					return err
				}
				for i := range singletons {
					if err := r.RunSingleton(fmt.Sprint("single-", i), log.body(nil)); err != nil {
						return err
					}
				}
				return nil
			})
		return r
	}
	a := build("a")
	c.waitPartition([]*etcdRunner{a}, shards, 20*time.Second)
	const n = 30
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("t", i)
		if _, err := env.ping.Ask(t.Context(), a, ids[i], ""); err != nil {
			t.Fatal(err)
		}
	}
	check := func(rs ...*etcdRunner) {
		t.Helper()
		owner := func(shard sharding.ShardID) string {
			for _, r := range rs {
				if _, ok := r.Owned()[shard]; ok {
					return r.ID()
				}
			}
			return ""
		}
		waitFor(t, 20*time.Second, "singletons, workers and remembered entities on their owners", func() bool {
			for _, id := range ids {
				if l := env.live("twin", id); len(l) != 1 || l[0] != owner(sharding.ShardOf(id, shards)) {
					return false
				}
			}
			for i := range singletons {
				name := fmt.Sprint("single-", i)
				shard := runner.SingletonShard(name, shards)
				if l := log.live(name); len(l) != 1 || !slices.Equal(l[shard], []string{owner(shard)}) {
					return false
				}
			}
			live := log.live("follow")
			for s := range shards {
				if !slices.Equal(live[sharding.ShardID(s)], []string{owner(sharding.ShardID(s))}) {
					return false
				}
			}
			return true
		})
		// The singletons' records (written in the background once they
		// start) name where they run.
		var why string
		records := func() bool {
			resp, err := c.direct.Get(t.Context(), "/"+c.ns+"/"+string(storage.KeyspaceSingletons)+"/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) != singletons {
				why = fmt.Sprintf("%d singleton records, want %d", len(resp.Kvs), singletons)
				return false
			}
			for _, kv := range resp.Kvs {
				key := strings.TrimPrefix(string(kv.Key), "/"+c.ns+"/"+string(storage.KeyspaceSingletons)+"/")
				rec, err := storage.DecodeSingleton(storage.KeyValue{Key: key, Value: kv.Value, ModRevision: storage.Revision(kv.ModRevision)})
				if err != nil {
					t.Fatalf("singleton record %s: %v", kv.Key, err)
				}
				if rec.Runner != owner(rec.Shard) {
					why = fmt.Sprintf("singleton %s recorded on %s, its shard %d is owned by %s", rec.Name, rec.Runner, rec.Shard, owner(rec.Shard))
					return false
				}
			}
			return true
		}
		for p := testenv.NewPatience(10 * time.Second); !records(); p.Sleep(10 * time.Millisecond) {
			if p.Over() {
				t.Fatalf("after %v: %s", p, why)
			}
		}
	}
	check(a)
	b := build("b")
	c.waitPartition([]*etcdRunner{a, b}, shards, 30*time.Second)
	check(a, b)
	cc := build("c")
	c.waitPartition([]*etcdRunner{a, b, cc}, shards, 30*time.Second)
	check(a, b, cc)
	cc.shutdown(t)
	c.waitPartition([]*etcdRunner{a, b}, shards, 30*time.Second)
	check(a, b)
	b.stop() // abrupt: a takes b's shards after the lease TTL
	c.waitPartition([]*etcdRunner{a}, shards, 30*time.Second)
	check(a)
	if o := log.overlaps(); len(o) > 0 {
		t.Errorf("two instances of a worker at once:\n%s", strings.Join(o, "\n"))
	}
	if o := env.overlaps(); len(o) > 0 {
		t.Errorf("one entity on two runners at once:\n%s", strings.Join(o, "\n"))
	}
}
