package runner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// TestEtcdRemindersMoveExactlyOnceAndSurviveACrash: on a real etcd with
// the gRPC transport, periodic and one-shot reminders fire on their
// shard's owner only; across two joins and a graceful shutdown (handoffs)
// every tick fires once, never redelivered (a tick due during a cutover
// longer than the period fires collapsed into the next, with its count); after a runner is killed its
// reminders fire again within LeaseTTL + 1 s (plus the time this process
// was measured unscheduled meanwhile), at least once; in steady state etcd
// sees no write.
func TestEtcdRemindersMoveExactlyOnceAndSurviveACrash(t *testing.T) {
	t.Parallel()
	stalls := testenv.StartStallProbe(t)
	c := startEtcdCluster(t)
	env := newAlarmEnv()
	const shards, ttl = 32, 3 * time.Second
	cfg := func(id string) runner.Config {
		return runner.Config{ID: id, NumShards: shards, LeaseTTL: ttl, ListenAddr: "127.0.0.1:0", WarmTimeout: time.Second, HandoffWait: 3 * time.Second}
	}
	start := func(id string) *etcdRunner {
		r := c.start(cfg(id))
		if err := r.Register(env.kind); err != nil {
			t.Fatal(err)
		}
		return r
	}
	a := start("a")
	c.waitPartition([]*etcdRunner{a}, shards, 20*time.Second)
	// Every call is bounded: one that cannot complete fails the test,
	// naming itself, instead of hanging it.
	bounded := func(d time.Duration) context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		t.Cleanup(cancel)
		return ctx
	}
	arm := func(id string, r armReq) {
		t.Helper()
		if _, err := env.arm.Ask(bounded(30*time.Second), a, id, r); err != nil {
			t.Fatalf("arm %s/%s: %v", id, r.Name, err)
		}
	}
	const n = 24
	for i := range n {
		arm(fmt.Sprint("e", i), armReq{Name: "every", Period: time.Second})
	}
	// Steady state: no write at all for 2.5 s of 24 reminders a second.
	rev := func() int64 {
		resp, err := c.direct.Get(bounded(10*time.Second), "/"+c.ns+"/cluster", clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	time.Sleep(500 * time.Millisecond)
	r0 := rev()
	time.Sleep(2500 * time.Millisecond)
	if r1 := rev(); r1 != r0 {
		t.Errorf("etcd's revision moved %d -> %d while reminders fired in steady state", r0, r1)
	}
	// One-shot reminders due around the moves below.
	t1 := time.Now()
	for i := range n {
		arm(fmt.Sprint("e", i), armReq{Name: "once", First: t1.Add(time.Duration(500+i*150) * time.Millisecond)})
	}
	b := start("b")
	c.waitPartition([]*etcdRunner{a, b}, shards, 30*time.Second)
	cc := start("c")
	c.waitPartition([]*etcdRunner{a, b, cc}, shards, 30*time.Second)
	time.Sleep(2 * time.Second)
	cc.shutdown(t)
	c.waitPartition([]*etcdRunner{a, b}, shards, 30*time.Second)
	time.Sleep(2 * time.Second)
	planned := time.Now()
	onB := map[string]bool{}
	for id := range b.Owned() {
		for i := range n {
			if eid := fmt.Sprint("e", i); sharding.ShardOf(eid, shards) == id {
				onB[eid] = true
			}
		}
	}
	crashed := time.Now()
	b.stop()
	c.waitPartition([]*etcdRunner{a}, shards, 30*time.Second)
	time.Sleep(2 * time.Second)

	moved := 0
	var collapsed uint64 // ticks due during a cutover, fired as one with their count
	for i := range n {
		id := fmt.Sprint("e", i)
		every := env.firesOf(id, "every")
		var exact, after []alarmFire
		var last uint64 // the last tick fired before the kill
		for _, f := range every {
			switch {
			// b fires until Close takes effect, a moment after crashed.
			case f.At.After(crashed) && f.Runner != b.ID():
				after = append(after, f)
			case f.At.Before(planned):
				exact = append(exact, f)
				last = f.Tick
			default:
				last = f.Tick
			}
		}
		if msg := checkOnceInOrder(exact); msg != "" {
			t.Errorf("%s across planned moves: %s", id, msg)
		}
		for _, f := range exact {
			collapsed += f.Missed
		}
		if len(runnersOf(exact)) > 1 {
			moved++
		}
		if len(after) == 0 {
			t.Errorf("%s did not fire after the crash", id)
			continue
		}
		if onB[id] {
			first := after[0]
			if d, stalled := first.At.Sub(crashed), stalls.Within(crashed, first.At); d > ttl+time.Second+stalled {
				t.Errorf("%s (on the killed runner) fired again %v after the kill, want within TTL + 1 s + %v measured unscheduled", id, d, stalled)
			}
			if !first.Redelivered || first.Tick <= last || first.Tick-first.Missed > last+1 {
				t.Errorf("%s after the kill: tick %d missed %d redelivered %v after tick %d", id, first.Tick, first.Missed, first.Redelivered, last)
			}
		}
		if once := env.firesOf(id, "once"); len(once) != 1 || once[0].Redelivered {
			t.Errorf("%s one-shot: %+v, want one fire", id, once)
		}
	}
	if moved == 0 {
		t.Error("no reminder moved between runners")
	}
	t.Logf("%d reminders moved between runners; %d ticks came due during a cutover and fired collapsed into the next", moved, collapsed)
	checkFiresByOwners(t, c.rec.all(), env.allFires())
	// Nothing but the periodic reminders is left in etcd.
	resp, err := c.direct.Get(bounded(10*time.Second), "/"+c.ns+"/reminders/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, kv := range resp.Kvs {
		if strings.HasSuffix(string(kv.Key), "/every") {
			left++
		} else if strings.HasSuffix(string(kv.Key), "/once") {
			t.Errorf("a fired one-shot reminder is still stored: %s", kv.Key)
		}
	}
	if left != n {
		t.Errorf("%d periodic reminders stored, want %d", left, n)
	}
}
