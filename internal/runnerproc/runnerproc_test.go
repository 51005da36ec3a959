package runnerproc_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/internal/runnerproc"
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
	if err := gw.Register(runnerproc.Kind, runnerproc.Register); err != nil {
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
