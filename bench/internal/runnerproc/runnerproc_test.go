package runnerproc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/etcd"
)

func TestMain(m *testing.M) {
	runnerproc.Main()
	goleak.VerifyTestMain(m)
}

// gateway runs a client-only runner in the test process.
func gateway(t *testing.T, endpoints []string, ns string) *runner.Runner {
	t.Helper()
	s, err := etcd.New(testenv.NewEtcdClient(t, endpoints...), ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := runner.New(s, runner.Config{ID: "gw", ClientOnly: true, NumShards: 8, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Register(runnerproc.Kind, runnerproc.Register, runnerproc.Keeper); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Run(context.Background()) }()
	t.Cleanup(func() { gw.Close(); <-done })
	return gw
}

// A child registers, owns every shard, serves asks from a gateway in the
// parent and reports its events; SIGSTOP freezes it (its asks wait), SIGCONT
// resumes it, SIGTERM shuts it down gracefully (lease revoked: the second
// child owns everything at once), SIGKILL ends it.
func TestChildLifecycle(t *testing.T) {
	srv := testenv.StartEtcd(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	spec := func(id string) runnerproc.Spec {
		return runnerproc.Spec{
			Endpoints: []string{srv.Endpoint()}, Namespace: "rp", WatchDeletes: true, LogLevel: "info",
			Config: runnerproc.Config{ID: id, NumShards: 8},
		}
	}
	a, err := runnerproc.Start(ctx, spec("a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Kill() })
	if a.Address() == "" {
		t.Fatal("registered without an address")
	}
	owned := func(p *runnerproc.Proc) map[int]bool {
		m := map[int]bool{}
		for _, ev := range p.Events() {
			switch ev.Kind {
			case runnerproc.KindAcquired:
				m[ev.Shard] = true
			case runnerproc.KindReleased, runnerproc.KindLost:
				delete(m, ev.Shard)
			}
		}
		return m
	}
	for len(owned(a)) < 8 {
		if _, err := a.WaitFor(ctx, func(ev runnerproc.Event) bool { return ev.Kind == runnerproc.KindAcquired && len(owned(a)) == 8 }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.WaitFor(ctx, func(ev runnerproc.Event) bool { return ev.Kind == runnerproc.KindDeadline }); err != nil {
		t.Fatal(err)
	}

	gw := gateway(t, []string{srv.Endpoint()}, "rp")
	ask := func(ctx context.Context, id string) (runnerproc.EchoResp, error) {
		return runnerproc.Echo.Ask(ctx, gw, id, runnerproc.EchoReq{})
	}
	for s := range 8 {
		id := entityOf(sharding.ShardID(s), 8)
		resp, err := ask(ctx, id)
		if err != nil || resp.Runner != "a" || resp.Shard != s {
			t.Fatalf("Echo(%s) = %+v, %v; want served by a on shard %d", id, resp, err, s)
		}
	}

	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := ask(pctx, entityOf(0, 8)); err == nil {
		t.Error("a paused child answered")
	}
	pcancel()
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := ask(ctx, entityOf(0, 8)); err != nil {
		t.Fatalf("after Resume: %v", err)
	}

	b, err := runnerproc.Start(ctx, spec("b"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Kill() })
	if err := a.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v\nevents: %+v\nlog:\n%s", err, a.Events(), a.Stderr())
	}
	if _, err := a.WaitFor(ctx, func(ev runnerproc.Event) bool { return ev.Kind == runnerproc.KindShutdownDone && ev.Detail == "" }); err != nil {
		t.Fatalf("no clean shutdown event from a: %v\n%s", err, a.Stderr())
	}
	if ok, err := a.Exited(); !ok || err != nil {
		t.Fatalf("a after Stop: exited %v, %v", ok, err)
	}
	if _, err := b.WaitFor(ctx, func(runnerproc.Event) bool { return len(owned(b)) == 8 }); err != nil {
		t.Fatalf("b owns %v: %v\nevents: %+v\nlog:\n%s", owned(b), err, b.Events(), b.Stderr())
	}
	if _, err := b.WaitFor(ctx, func(ev runnerproc.Event) bool {
		return ev.Kind == runnerproc.KindWatchDelete && ev.Key == "runners/" && ev.Detail == "a"
	}); err != nil {
		t.Fatalf("b's watch did not report a's runner key deleted: %v", err)
	}
	if err := b.Kill(); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Exited(); !ok || err == nil {
		t.Fatalf("b after Kill: exited %v, %v; want a signal", ok, err)
	}
}

// A register checkpoints every change before it answers: what it
// acknowledged survives SIGKILL of its runner, restored by the next owner.
func TestRegisterChangesSurviveACrash(t *testing.T) {
	srv := testenv.StartEtcd(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	spec := func(id string) runnerproc.Spec {
		return runnerproc.Spec{Endpoints: []string{srv.Endpoint()}, Namespace: "reg",
			Config: runnerproc.Config{ID: id, NumShards: 8, LeaseTTL: 2 * time.Second}}
	}
	a, err := runnerproc.Start(ctx, spec("a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Kill() })
	gw := gateway(t, []string{srv.Endpoint()}, "reg")
	if got, err := runnerproc.RegRead.Ask(ctx, gw, "g", runnerproc.RegReadReq{}); err != nil || got.Value != 0 || got.Runner != "a" {
		t.Fatalf("read of a new register = %+v, %v; want 0 from a", got, err)
	}
	if got, err := runnerproc.RegWrite.Ask(ctx, gw, "g", runnerproc.RegWriteReq{Value: 5}); err != nil || got.Value != 5 {
		t.Fatalf("write(5) = %+v, %v", got, err)
	}
	if got, err := runnerproc.RegCAS.Ask(ctx, gw, "g", runnerproc.RegCASReq{Expect: 5, Value: 7}); err != nil || !got.Swapped || got.Value != 7 {
		t.Fatalf("cas(5→7) = %+v, %v; want swapped", got, err)
	}
	if got, err := runnerproc.RegCAS.Ask(ctx, gw, "g", runnerproc.RegCASReq{Expect: 5, Value: 9}); err != nil || got.Swapped || got.Value != 7 {
		t.Fatalf("cas(5→9) = %+v, %v; want not swapped, holding 7", got, err)
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	b, err := runnerproc.Start(ctx, spec("b"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Kill() })
	got, err := runnerproc.RegRead.Ask(ctx, gw, "g", runnerproc.RegReadReq{})
	if err != nil || got.Value != 7 || got.Runner != "b" || got.Epoch == 0 {
		t.Fatalf("read after a's crash = %+v, %v; want 7 from b", got, err)
	}
}

func entityOf(s sharding.ShardID, n int) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("e%d", i); sharding.ShardOf(id, n) == s {
			return id
		}
	}
}

// A child's singletons and shard worker record each run (start and
// return) and its keepers each life in the history file: after a SIGKILL
// of the first child the second one runs every worker and brings the
// touched keepers back without a message; its graceful stop ends them all.
func TestAlwaysOnWorkRecordsItsRunsAndLives(t *testing.T) {
	srv := testenv.StartEtcd(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const shards, singletons, keepers = 8, 2, 3
	dir := t.TempDir()
	spec := func(id string) runnerproc.Spec {
		return runnerproc.Spec{Endpoints: []string{srv.Endpoint()}, Namespace: "always", History: dir + "/" + id + ".jsonl",
			Singletons: singletons, ShardWorker: true, Config: runnerproc.Config{ID: id, NumShards: shards, LeaseTTL: 2 * time.Second}}
	}
	a, err := runnerproc.Start(ctx, spec("a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Kill() })
	gw := gateway(t, []string{srv.Endpoint()}, "always")
	for i := range keepers {
		if got, err := runnerproc.Touch.Ask(ctx, gw, runnerproc.KeeperID(i), runnerproc.TouchReq{}); err != nil || got.Runner != "a" {
			t.Fatalf("Touch(%s) = %+v, %v; want served by a", runnerproc.KeeperID(i), got, err)
		}
	}
	// The keepers' markers are written in the background: wait for them
	// before the crash (an entity crashed before its marker landed is not
	// remembered).
	cli := testenv.NewEtcdClient(t, srv.Endpoint())
	for {
		resp, err := cli.Get(ctx, "/always/remembered/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == keepers {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := a.Kill(); err != nil {
		t.Fatal(err)
	}
	b, err := runnerproc.Start(ctx, spec("b"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Kill() })
	// b lives every keeper again, without a message.
	for {
		recs, err := runnerproc.ReadHistory(dir + "/b.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if r.Kind == runnerproc.HistLife && r.Detail == string(entity.ActivateRemembered) {
				n++
			}
		}
		if n == keepers {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("b lives %d of %d keepers: %v\n%s", n, keepers, ctx.Err(), b.Stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	type key struct {
		kind, name string
		shard      int
	}
	tally := func(id string) (starts map[key]int, ends map[key][]string) {
		recs, err := runnerproc.ReadHistory(dir + "/" + id + ".jsonl")
		if err != nil {
			t.Fatal(err)
		}
		starts, ends = map[key]int{}, map[key][]string{}
		open := map[int64]key{}
		for _, r := range recs {
			switch r.Kind {
			case runnerproc.HistRun, runnerproc.HistLife:
				k := key{r.Kind, r.Entity, r.Shard}
				starts[k]++
				open[r.Inst] = k
				if r.Epoch == 0 || r.Err != "" {
					t.Errorf("%s: %+v: want an epoch and a live context at the start", id, r)
				}
			case runnerproc.HistRunEnd, runnerproc.HistLifeEnd:
				k, ok := open[r.Inst]
				if !ok || k.name != r.Entity {
					t.Errorf("%s: %+v ends no run or life started", id, r)
				}
				delete(open, r.Inst)
				ends[k] = append(ends[k], r.Detail)
			}
		}
		return starts, ends
	}
	want := map[key]int{}
	for s := range shards {
		want[key{runnerproc.HistRun, runnerproc.ShardWorkerName, s}] = 1
	}
	for i := range singletons {
		name := runnerproc.SingletonName(i)
		want[key{runnerproc.HistRun, name, int(runner.SingletonShard(name, shards))}] = 1
	}
	for i := range keepers {
		id := runnerproc.KeeperID(i)
		want[key{runnerproc.HistLife, id, int(sharding.ShardOf(id, shards))}] = 1
	}
	for _, id := range []string{"a", "b"} {
		starts, ends := tally(id)
		if !maps.Equal(starts, want) {
			t.Errorf("%s started %v, want %v", id, starts, want)
		}
		for k := range want {
			switch got := ends[k]; {
			case id == "a" && len(got) != 0:
				t.Errorf("a (killed) recorded the end of %v: %v", k, got)
			case id == "b" && (len(got) != 1 || (got[0] != runnerproc.EndShutdown && got[0] != runnerproc.EndMoved)):
				t.Errorf("b (stopped) recorded the end of %v as %v, want once, shut down", k, got)
			}
		}
	}
}
