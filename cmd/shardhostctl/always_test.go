package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// TestSingletonsAndRememberedShowWhereTheyRun: singletons lists each
// singleton with the runner running it (the owner of its shard), at the
// shard's epoch, and marks a record stale once another runner owns the
// shard and has not started it; remembered counts each shard's remembered
// entities.
func TestSingletonsAndRememberedShowWhereTheyRun(t *testing.T) {
	const shards = 8
	srv := testenv.StartEtcd(t)
	ep := srv.Endpoint()
	kind := entity.NewKind("twin", func(string) *struct{} { return &struct{}{} }, entity.Remembered())
	ping := entity.Method(kind, "ping", func(*struct{}, context.Context, int) (int, error) { return 1, nil })
	wait := func(ctx context.Context, _ runner.Work) error { <-ctx.Done(); return nil }
	setup := func(singletons bool) func(*runner.Runner) error {
		return func(r *runner.Runner) error {
			if err := r.Register(kind); err != nil {
				return err
			}
			if !singletons {
				return nil
			}
			for _, name := range []string{"billing", "leader"} {
				if err := r.RunSingleton(name, wait); err != nil {
					return err
				}
			}
			return nil
		}
	}
	r1 := startRunnerWith(t, ep, "always", runner.Config{ID: "r1", NumShards: shards}, setup(true))
	waitFor(t, 15*time.Second, "r1 owning all shards", func() bool { return settled([]*node{r1}, shards) })
	counts := map[sharding.ShardID]int{}
	for i := range 20 {
		id := fmt.Sprint("d", i)
		if _, err := ping.Ask(t.Context(), r1, id, 0); err != nil {
			t.Fatal(err)
		}
		counts[sharding.ShardOf(id, shards)]++
	}
	base := []string{"-endpoints", ep, "-namespace", "always"}
	var rows []Singleton
	waitFor(t, 10*time.Second, "two singleton records", func() bool {
		rows = nil
		ctlJSON(t, &rows, append(base, "singletons")...)
		return len(rows) == 2
	})
	for _, row := range rows {
		if row.Runner != "r1" || row.State != "running" || row.Owner != "r1" || row.Shard != runner.SingletonShard(row.Name, shards) ||
			row.Epoch != int64(r1.Owned()[row.Shard]) || row.Since.IsZero() {
			t.Errorf("singleton row %+v; r1 owns shard %d at %d", row, row.Shard, r1.Owned()[row.Shard])
		}
	}
	var rem []RememberedShard
	waitFor(t, 10*time.Second, "20 remembered entities", func() bool {
		rem = nil
		ctlJSON(t, &rem, append(base, "remembered")...)
		n := 0
		for _, r := range rem {
			n += r.Count
		}
		return n == 20
	})
	for _, r := range rem {
		if r.Count != counts[r.Shard] || r.Owner != "r1" {
			t.Errorf("remembered row %+v, want %d owned by r1", r, counts[r.Shard])
		}
	}
	if code, out, _ := ctl(t, append(base, "remembered")...); code != exitOK || !strings.Contains(out, "remembered entities: 20 in") {
		t.Errorf("remembered text (exit %d): %q", code, out)
	}
	// r2 registers no singleton: the shards it takes over leave stale
	// records naming r1 (no instance runs: r2 does not have them).
	r2 := startRunnerWith(t, ep, "always", runner.Config{ID: "r2", NumShards: shards}, setup(false))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := r1.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "r2 owning all shards", func() bool { return settled([]*node{r2}, shards) })
	rows = nil
	ctlJSON(t, &rows, append(base, "singletons")...)
	for _, row := range rows {
		if row.State != "stale" || row.Owner != "r2" || row.Runner != "r1" {
			t.Errorf("after r1 left: %+v, want stale, owned by r2", row)
		}
	}
	if code, out, _ := ctl(t, append(base, "singletons")...); code != exitOK || !strings.Contains(out, "stale (shard owned by r2)") {
		t.Errorf("singletons text (exit %d): %q", code, out)
	}
}
