package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestCommandsAtMaxShards: on a real etcd holding a namespace of
// sharding.MaxShards shards locked by 100 registered runners as the
// balanced assignment says (written through the store, not by running
// runners: only the keys matter here), but for one unowned shard, status
// counts every runner's shards, shards lists one row per shard and its
// filters select exactly the owner's or the unowned ones, and plan join
// lists one move per shard whose owner changes. The -shards bound is MaxShards. Times
// and output sizes are logged. make test runs it without -race (the
// commands are sequential code: nothing for the race detector to find,
// and it makes the test four times slower).
func TestCommandsAtMaxShards(t *testing.T) {
	if raceEnabled {
		t.Skip("runs without -race (make test runs it so): the commands are sequential")
	}
	const m, unowned = 100, 12345
	n := sharding.MaxShards
	srv := testenv.StartEtcd(t)
	ep := srv.Endpoint()
	store, err := etcd.New(testenv.NewEtcdClient(t, ep), "big", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := store.WriteCluster(ctx, storage.ClusterRecord{NumShards: n, Strategy: sharding.Balanced().Name(), WrittenBy: "runner-000"}, 0); err != nil {
		t.Fatal(err)
	}
	in := sharding.Input{NumShards: n}
	for i := range m {
		in.Runners = append(in.Runners, sharding.Runner{ID: fmt.Sprintf("runner-%03d", i), Weight: 1})
	}
	a, err := sharding.Balanced().Assign(in)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, r := range in.Runners {
		l, err := store.Grant(ctx, outliveTest(t)) // the writes alone took 35 s under -race on a loaded machine
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.PutRunner(ctx, l.ID, storage.RunnerRecord{ID: r.ID, Weight: 1, Incarnation: r.ID + "-1", Started: time.Now()}); err != nil {
			t.Fatal(err)
		}
		var mine []sharding.ShardID
		for _, s := range a.ShardsOf(r.ID) {
			if s != unowned {
				mine = append(mine, s)
			}
		}
		res, err := store.Acquire(ctx, l.ID, storage.Owner{RunnerID: r.ID, Incarnation: r.ID + "-1"}, mine)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range res {
			if x.Status != storage.Acquired {
				t.Fatalf("acquire shard %d for %s: %+v", x.Shard, r.ID, x)
			}
		}
	}
	t.Logf("%d locks of %d runners written in %v", n-1, m, time.Since(start).Round(time.Millisecond))
	base := []string{"-endpoints", ep, "-namespace", "big"}

	timed := func(args ...string) (string, time.Duration) {
		t.Helper()
		start := time.Now()
		code, out, errOut := ctl(t, append(base, args...)...)
		took := time.Since(start)
		if code != exitOK {
			t.Fatalf("shardhostctl %v: exit %d\n%s", args, code, errOut)
		}
		t.Logf("shardhostctl %s: %v, %d KB of output", strings.Join(args, " "), took.Round(time.Millisecond), len(out)>>10)
		return out, took
	}

	var st Status
	ctlJSON(t, &st, append(base, "status")...)
	if st.NumShards != n || st.Owned != n-1 || st.Unowned != 1 || st.Unknown != 0 || len(st.Runners) != m {
		t.Fatalf("status: %d shards, %d owned, %d unowned, %d unknown, %d runners; want %d, %d, 1, 0, %d",
			st.NumShards, st.Owned, st.Unowned, st.Unknown, len(st.Runners), n, n-1, m)
	}
	for _, r := range st.Runners {
		want := len(a.ShardsOf(r.ID))
		if a[unowned] == r.ID {
			want--
		}
		if r.Shards != want || r.State != "active" {
			t.Errorf("status: %s %s with %d shards, want active with %d", r.ID, r.State, r.Shards, want)
		}
	}
	if out, _ := timed("status"); !strings.Contains(out, fmt.Sprintf("shards: %d of %d owned, 1 unowned", n-1, n)) {
		t.Errorf("status text:\n%s", out)
	}

	out, _ := timed("shards")
	if lines := strings.Count(out, "\n"); lines != n+2 || !strings.HasSuffix(out, fmt.Sprintf("%d shards\n", n)) {
		t.Errorf("shards: %d lines ending %q, want a header, %d rows and a count", lines, out[max(0, len(out)-40):], n)
	}
	owner := a[0]
	var rows []ShardRow
	ctlJSON(t, &rows, append(base, "shards", "-owner", owner)...)
	if want := len(a.ShardsOf(owner)); len(rows) != want {
		t.Errorf("shards -owner %s: %d rows, want %d", owner, len(rows), want)
	}
	for _, r := range rows {
		if a[r.Shard] != owner || r.Owner != owner || !r.Registered {
			t.Errorf("shards -owner %s: row %+v, assigned to %s", owner, r, a[r.Shard])
		}
	}
	rows = nil
	ctlJSON(t, &rows, append(base, "shards", "-unowned")...)
	if len(rows) != 1 || rows[0].Shard != unowned || rows[0].Owner != "" {
		t.Errorf("shards -unowned = %+v, want shard %d alone", rows, unowned)
	}

	var p Plan
	ctlJSON(t, &p, append(base, "plan", "join", "runner-new")...)
	joiner, changed := 0, 0
	for s, r := range p.Assignment {
		if r == "runner-new" {
			joiner++
		}
		if r != a[s] || s == unowned {
			changed++
		}
	}
	if len(p.Assignment) != n || len(p.Moves) != changed || joiner < n/(m+1)*3/4 {
		t.Errorf("plan join: %d shards assigned, %d moves, %d to the joiner; want %d, one move per shard whose owner changes (%d), about %d to the joiner",
			len(p.Assignment), len(p.Moves), joiner, n, changed, n/(m+1))
	}
	timed("plan", "join", "runner-new")

	// The -shards bound.
	if code, _, errOut := ctl(t, append(base, "-shards", fmt.Sprint(n+1), "status")...); code != exitUsage ||
		!strings.Contains(errOut, fmt.Sprintf("-shards %d: want 1..%d", n+1, n)) {
		t.Errorf("-shards %d: exit %d, stderr %q; want a usage error naming 1..%d", n+1, code, errOut, n)
	}
	if code, _, errOut := ctl(t, append(base, "-shards", fmt.Sprint(n), "status")...); code != exitOK || errOut != "" {
		t.Errorf("-shards %d (the record's): exit %d, stderr %q; want success, silent", n, code, errOut)
	}
}
