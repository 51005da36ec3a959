package runner_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
)

// TestEtcdLeaderKillAndPause: three runners on a 3-member etcd cluster
// under ask traffic. The raft leader is killed (SIGKILL) and later
// restarted; then the new leader is paused (SIGSTOP) for several election
// timeouts and resumed. Throughout, no shard is owned by two runners (by
// their merged events) and no entity runs two handlers at once (counted by
// the entity across runners); after each fault every shard is owned by its
// assignee again, as etcd's locks confirm, and asks succeed again.
func TestEtcdLeaderKillAndPause(t *testing.T) {
	t.Parallel()
	cl := testenv.StartEtcdCluster(t, 3)
	c := newCluster(t, cl.Endpoints(), cl.Client(t))
	env, kind, do := newWho()
	var rs []*etcdRunner
	for _, id := range []string{"a", "b", "c"} {
		r := c.start(runner.Config{ID: id, NumShards: 64, LeaseTTL: 5 * time.Second, ListenAddr: "127.0.0.1:0"})
		if err := r.Register(kind); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	c.waitPartition(rs, 64, 30*time.Second)

	// Traffic: each caller asks its own entities through one of the
	// runners (local or one hop), 2 s per ask.
	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			via := rs[g%len(rs)]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := do.Ask(ctx, via, fmt.Sprintf("e%d-%d", g, i%32), whoReq{Sleep: time.Millisecond})
				cancel()
				if err != nil {
					failed.Add(1)
					time.Sleep(10 * time.Millisecond)
				} else {
					ok.Add(1)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	asksSucceed := func(what string) {
		t.Helper()
		from := ok.Load()
		waitFor(t, 30*time.Second, "asks succeeding "+what, func() bool { return ok.Load() >= from+100 })
	}
	asksSucceed("before the faults")

	leader := cl.Leader(t)
	t.Logf("killing the leader %s", leader.Name())
	leader.Kill()
	c.waitPartition(rs, 64, 60*time.Second)
	asksSucceed("after the leader was killed")
	leader.Restart(t)
	cl.WaitReady(t)

	leader = cl.Leader(t)
	t.Logf("pausing the leader %s for 3 s", leader.Name())
	leader.Pause()
	time.Sleep(3 * time.Second) // six election timeouts: the others elect a new leader
	leader.Resume()
	c.waitPartition(rs, 64, 60*time.Second)
	asksSucceed("after the paused leader resumed")

	evs := c.rec.all()
	checkSingleOwner(t, evs)
	env.mu.Lock()
	if len(env.overlap) > 0 {
		t.Errorf("%d concurrent handlers of one entity, first: %s", len(env.overlap), env.overlap[0])
	}
	env.mu.Unlock()
	detaches := 0
	for _, ev := range evs {
		if _, ok := ev.(runner.Detached); ok {
			detaches++
		}
	}
	t.Logf("asks: %d ok, %d failed (and retried by the caller); %d detaches", ok.Load(), failed.Load(), detaches)
}
