package runner_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// TestGatewayWithOtherNumShardsFailsFast: a gateway configured with another
// NumShards than the cluster fails at start with a *ClusterMismatchError
// naming both values — Run returns it and asks fail with it — instead of
// asks waiting until their deadline with "no owner known yet".
func TestGatewayWithOtherNumShardsFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 64})
		<-a.Ready()
		gw, err := runner.New(c.NewStore("gw"), runner.Config{ID: "gw", NumShards: 128, ClientOnly: true, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := gw.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		done := runAsync(t, gw)
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		_, askErr := k.inc.Ask(ctx, gw, "x", incReq{})
		runErr := runErr(t, done, time.Minute)
		for what, err := range map[string]error{"Run": runErr, "Ask": askErr} {
			var mm *runner.ClusterMismatchError
			if !errors.As(err, &mm) || !errors.Is(err, runner.ErrClusterMismatch) || mm.Setting != "NumShards" ||
				mm.Cluster != "64" || mm.Runner != "128" || mm.WrittenBy != "a" || !strings.Contains(err.Error(), "NumShards") {
				t.Errorf("%s = %v, want a *ClusterMismatchError: NumShards 64 (by a) vs 128", what, err)
			}
		}
		if ctx.Err() != nil {
			t.Error("the ask waited for its deadline")
		}
	})
}

// TestHostingRunnerWithOtherSettingsRefused: a hosting runner whose
// NumShards or Strategy differs from the cluster record does not register.
func TestHostingRunnerWithOtherSettingsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 64})
		<-a.Ready()
		for _, tc := range []struct {
			cfg     runner.Config
			setting string
		}{
			{runner.Config{ID: "b", NumShards: 32}, "NumShards"},
			{runner.Config{ID: "b", NumShards: 64, Strategy: sharding.Rendezvous()}, "Strategy"},
		} {
			tc.cfg.Logger = logger(t)
			b, err := runner.New(c.NewStore("b"), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = runErr(t, runAsync(t, b), time.Minute)
			var mm *runner.ClusterMismatchError
			if !errors.As(err, &mm) || mm.Setting != tc.setting {
				t.Errorf("Run with another %s = %v, want a *ClusterMismatchError on %s", tc.setting, err, tc.setting)
			}
			synctest.Wait() // a's watch of the runners has applied what the store holds
			if len(a.Members()) != 1 {
				t.Errorf("members = %v, want a alone (b never registered)", a.Members())
			}
		}
	})
}

// TestClusterRecordPublishedOnce: the first runner publishes the record; a
// gateway that came first publishes NumShards only and the first hosting
// runner adds its strategy; a damaged record is replaced.
func TestClusterRecordPublishedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		read := func() storage.ClusterInfo {
			t.Helper()
			info, ok, err := c.NewStore("check").ReadCluster(t.Context())
			if err != nil || !ok {
				t.Fatalf("ReadCluster = %+v, %v, %v", info, ok, err)
			}
			return info
		}
		gw := start(t, c, nil, runner.Config{ID: "gw", NumShards: 16, ClientOnly: true})
		<-gw.Ready()
		if got := read(); got.NumShards != 16 || got.Strategy != "" || got.WrittenBy != "gw" {
			t.Fatalf("record after the gateway = %+v, want 16 shards, no strategy", got)
		}
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 16})
		<-a.Ready()
		if got := read(); got.NumShards != 16 || got.Strategy != sharding.Default().Name() || got.WrittenBy != "a" {
			t.Fatalf("record after the first hosting runner = %+v, want its strategy added", got)
		}
		c.Put(storage.ClusterKey, []byte(`{"numShards":"x"}`), storage.NoLease)
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 16})
		<-b.Ready()
		if got := read(); got.NumShards != 16 || got.WrittenBy != "b" {
			t.Fatalf("record after a damaged one = %+v, want it replaced by b", got)
		}
	})
}

// otherProcess registers a runner record as a runner of another process
// would (an incarnation this process never made), under a lease of ttl.
func otherProcess(t *testing.T, c *memory.Cluster, id string) {
	t.Helper()
	s := c.NewStore(id)
	l, err := s.Grant(t.Context(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRunner(t.Context(), l.ID, storage.RunnerRecord{ID: id, Incarnation: "elsewhere-1", Weight: 1, Address: "10.0.0.9:7100", Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// TestHostingWithoutTransportStopsWhenAnotherProcessJoins: a hosting
// runner without ListenAddr/Address is fine alone (and with runners of its
// own process), but Run fails with ErrNoTransport once a runner of another
// process is in the cluster — which could not reach its shards — and it
// gives its shards up.
func TestHostingWithoutTransportStopsWhenAnotherProcessJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a, err := runner.New(c.NewStore("a"), runner.Config{ID: "a", NumShards: 8, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		done := runAsync(t, a)
		waitFor(t, 10*time.Second, "a owns every shard", func() bool { return len(a.Owned()) == 8 })
		local := start(t, c, nil, runner.Config{ID: "local", NumShards: 8}) // same process: fine
		<-local.Ready()
		time.Sleep(5 * time.Second)
		select {
		case err := <-done:
			t.Fatalf("Run returned %v with a runner of its own process", err)
		default:
		}
		otherProcess(t, c, "elsewhere")
		err = runErr(t, done, time.Minute)
		if !errors.Is(err, runner.ErrNoTransport) || !strings.Contains(err.Error(), `"elsewhere"`) {
			t.Fatalf("Run = %v, want ErrNoTransport naming the other process's runner", err)
		}
		if n := len(a.Owned()); n != 0 {
			t.Fatalf("a still owns %d shards", n)
		}
	})
}

// TestHostingWithoutTransportRefusedAmongOtherProcesses: started into a
// cluster that holds a runner of another process, it fails at once.
func TestHostingWithoutTransportRefusedAmongOtherProcesses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		otherProcess(t, c, "elsewhere")
		a, err := runner.New(c.NewStore("a"), runner.Config{ID: "a", NumShards: 8, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := runErr(t, runAsync(t, a), time.Minute); !errors.Is(err, runner.ErrNoTransport) {
			t.Fatalf("Run = %v, want ErrNoTransport", err)
		}
	})
}

// TestGatewayRoutesByTheClusterStrategy: a gateway configured with another
// strategy than the cluster's (the default, here) computes the assignment
// it routes sends with no live owner by with the strategy the cluster
// record names: its assignees are the hosting runners' own.
func TestGatewayRoutesByTheClusterStrategy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		const shards = 16
		runners := []sharding.Runner{{ID: "a", Weight: 1}, {ID: "b", Weight: 1}}
		theirs, err := sharding.Rendezvous().Assign(sharding.Input{NumShards: shards, Runners: runners})
		if err != nil {
			t.Fatal(err)
		}
		own, err := sharding.Default().Assign(sharding.Input{NumShards: shards, Runners: runners})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(theirs, own) {
			t.Fatal("the two strategies assign alike: the test would prove nothing")
		}
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: shards, Strategy: sharding.Rendezvous()})
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: shards, Strategy: sharding.Rendezvous()})
		<-a.Ready()
		<-b.Ready()
		gw := start(t, c, nil, runner.Config{ID: "gw", NumShards: shards, ClientOnly: true})
		<-gw.Ready()
		for range 100 {
			if slices.Equal(gw.Assignment(), theirs) && slices.Equal(a.Assignment(), theirs) {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("gateway's assignment %v, a's %v; want both the cluster strategy's %v", gw.Assignment(), a.Assignment(), theirs)
	})
}
