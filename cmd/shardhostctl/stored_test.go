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
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// device is a remembered kind with a reminder, for the tests of what is
// stored.
type device struct {
	kind  *entity.Kind[struct{}]
	ping  *entity.MethodRef[struct{}, int, int]
	setup func(singleton bool) func(*runner.Runner) error
}

func newDevice() *device {
	d := &device{kind: entity.NewKind("device", func(string) *struct{} { return &struct{}{} }, entity.Remembered())}
	check := entity.Reminder(d.kind, "check", func(*struct{}, context.Context, entity.ReminderTick[int]) error { return nil })
	d.ping = entity.Method(d.kind, "ping", func(_ *struct{}, ctx context.Context, _ int) (int, error) {
		// A reminder far in the future: stored, never fired in the test.
		return 1, check.Register(ctx, "check", entity.Schedule{First: time.Now().Add(time.Hour)}, 0)
	})
	wait := func(ctx context.Context, _ runner.Work) error { <-ctx.Done(); return nil }
	d.setup = func(singleton bool) func(*runner.Runner) error {
		return func(r *runner.Runner) error {
			if err := r.Register(d.kind); err != nil {
				return err
			}
			if singleton {
				return r.RunSingleton("alerter", wait)
			}
			return nil
		}
	}
	return d
}

// waitEmpty waits until no runner record and no lock is left in the
// namespace (every runner stopped, a crashed one's lease expired).
func waitEmpty(t *testing.T, ep, ns string) {
	t.Helper()
	store, err := etcd.New(testenv.NewEtcdClient(t, ep), ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "no runner and no lock left", func() bool {
		for _, ks := range []storage.Keyspace{storage.KeyspaceRunners, storage.KeyspaceShards} {
			snap, err := store.List(t.Context(), ks)
			if err != nil || len(snap.KVs) > 0 {
				return false
			}
		}
		return true
	})
}

// TestStoredStateIsListedWithNoRunnerUp: singletons says when the owner's
// lease is ending after its runner was killed (no renewal), and once every
// runner is gone — no runner record, no lock — remembered, reminders and
// singletons still list what the cluster stored: the markers, the
// reminders and the singleton record, with no owner.
func TestStoredStateIsListedWithNoRunnerUp(t *testing.T) {
	const shards = 8
	srv := testenv.StartEtcd(t)
	ep := srv.Endpoint()
	d := newDevice()
	r1 := startRunnerWith(t, ep, "fleet", runner.Config{ID: "r1", NumShards: shards}, d.setup(true))
	r2 := startRunnerWith(t, ep, "fleet", runner.Config{ID: "r2", NumShards: shards}, d.setup(true))
	waitFor(t, 20*time.Second, "two runners owning the shards", func() bool { return settled([]*node{r1, r2}, shards) })
	perShard := map[sharding.ShardID]int{}
	for i := range 20 {
		id := fmt.Sprint("d", i)
		if _, err := d.ping.Ask(t.Context(), r1, id, 0); err != nil {
			t.Fatal(err)
		}
		perShard[sharding.ShardOf(id, shards)]++
	}
	base := []string{"-endpoints", ep, "-namespace", "fleet"}
	count := func(cmd string) (n int, rows []RememberedShard) {
		ctlJSON(t, &rows, append(base, cmd)...)
		for _, r := range rows {
			n += r.Count
		}
		return n, rows
	}
	waitFor(t, 10*time.Second, "20 markers and 20 reminders", func() bool {
		m, _ := count("remembered")
		r, _ := count("reminders")
		return m == 20 && r == 20
	})
	// An owned shard's remembered entity is not forgotten behind its
	// owner's back: the command refuses, naming the owner, and the marker
	// stays.
	code, out, errOut := ctl(t, append(base, "remembered", "-forget", "device/d0")...)
	if code != exitFail || !strings.Contains(errOut, "is owned by runner") || !strings.Contains(errOut, "entity.Forget") {
		t.Errorf("remembered -forget of an owned shard's entity: exit %d, %q %q", code, out, errOut)
	}
	if n, _ := count("remembered"); n != 20 {
		t.Errorf("after a refused -forget: %d markers, want 20", n)
	}
	var rows []Singleton
	waitFor(t, 10*time.Second, "the singleton running", func() bool {
		rows = nil
		ctlJSON(t, &rows, append(base, "singletons")...)
		return len(rows) == 1 && rows[0].State == "running"
	})
	if rows[0].LeaseEnds != nil {
		t.Errorf("a renewed lease is reported ending: %+v", rows[0])
	}

	// Kill the singleton's runner: its lease is no longer renewed, and
	// singletons says when it ends while it still shows it running.
	killed, other := r1, r2
	if rows[0].Runner == "r2" {
		killed, other = r2, r1
	}
	killed.Close()
	var ending Singleton
	waitFor(t, 10*time.Second, "the singleton's lease reported ending", func() bool {
		rows = nil
		ctlJSON(t, &rows, append(base, "singletons")...)
		if len(rows) == 1 && rows[0].Runner == killed.ID() && rows[0].LeaseEnds != nil {
			ending = rows[0]
			return true
		}
		return false
	})
	if ending.State != "running" || *ending.LeaseEnds > 3 {
		t.Errorf("after the kill: %+v, lease ends in %v s; want running with at most the TTL (3 s) left", ending, *ending.LeaseEnds)
	}

	// Stop the other runner too: nothing is registered or locked any more.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := other.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	waitEmpty(t, ep, "fleet")
	for _, cmd := range []string{"remembered", "reminders"} {
		n, got := count(cmd)
		if n != 20 {
			t.Errorf("%s with no runner up: %d in %v, want 20", cmd, n, got)
		}
		for _, r := range got {
			if r.Count != perShard[r.Shard] || r.Owner != "" {
				t.Errorf("%s row %+v, want %d with no owner", cmd, r, perShard[r.Shard])
			}
		}
		code, out, errOut := ctl(t, append(base, cmd)...)
		if code != exitOK || !strings.Contains(out, ": 20 in ") || !strings.Contains(out, "(unowned)") || !strings.Contains(out, "no runner registered") {
			t.Errorf("%s text with no runner up (exit %d): %q %q", cmd, code, out, errOut)
		}
	}
	rows = nil
	ctlJSON(t, &rows, append(base, "singletons")...)
	if len(rows) != 1 || rows[0].Name != "alerter" || rows[0].State != "unowned" || rows[0].Owner != "" {
		t.Errorf("singletons with no runner up: %+v, want alerter unowned", rows)
	}
	// Without -namespace, the stopped cluster's namespace is still found.
	code, out, errOut = ctl(t, "-endpoints", ep, "remembered")
	if code != exitOK || !strings.Contains(out, ": 20 in ") || !strings.Contains(errOut, `namespace "fleet"`) {
		t.Errorf("remembered without -namespace (exit %d): %q %q", code, out, errOut)
	}
	// With no owner, -forget deletes the marker; a second time there is
	// nothing to forget.
	if code, out, errOut := ctl(t, append(base, "remembered", "-forget", "device/d0")...); code != exitOK || !strings.Contains(out, "forgot device/d0") {
		t.Errorf("remembered -forget with no owner: exit %d, %q %q", code, out, errOut)
	}
	if n, _ := count("remembered"); n != 19 {
		t.Errorf("after -forget: %d markers, want 19", n)
	}
	if code, out, errOut := ctl(t, append(base, "remembered", "-forget", "device/d0")...); code != exitOK || !strings.Contains(out, "was not remembered") {
		t.Errorf("remembered -forget again: exit %d, %q %q", code, out, errOut)
	}
	if code, _, errOut := ctl(t, append(base, "remembered", "-forget", "d0")...); code != exitUsage || !strings.Contains(errOut, "want KIND/ID") {
		t.Errorf("remembered -forget d0: exit %d, %q", code, errOut)
	}
}

// TestStatusWaitsUntilBalancedOrOwned: status -wait balanced returns once
// every shard is owned by its assignee (after a runner joined, the shards
// it is assigned are its own when the command returns); with a registered
// runner that never takes its shards it fails at -wait-timeout saying
// what is missing, while -wait owned succeeds; -wait owned with no lock
// fails the same way.
func TestStatusWaitsUntilBalancedOrOwned(t *testing.T) {
	const shards = 16
	srv := testenv.StartEtcd(t)
	ep := srv.Endpoint()
	base := []string{"-endpoints", ep, "-namespace", "waits"}
	r1 := startRunner(t, ep, "waits", "r1", shards)
	if code, out, errOut := ctl(t, append(base, "status", "-wait", "balanced", "-wait-timeout", "30s")...); code != exitOK {
		t.Fatalf("status -wait balanced, one runner: exit %d, %q %q", code, out, errOut)
	}
	if !settled([]*node{r1}, shards) {
		t.Errorf("status -wait balanced returned before r1 owned every shard: %v", r1.Owned())
	}
	r2 := startRunner(t, ep, "waits", "r2", shards)
	waitFor(t, 10*time.Second, "r2 in both runners' membership", func() bool { return len(r1.Members()) == 2 && len(r2.Members()) == 2 })
	var st Status
	ctlJSON(t, &st, append(base, "status", "-wait", "balanced", "-wait-timeout", "30s")...)
	if !settled([]*node{r1, r2}, shards) || len(st.Runners) != 2 || st.Runners[0].Shards+st.Runners[1].Shards != shards || st.Runners[1].Shards == 0 {
		t.Errorf("status -wait balanced after r2 joined: %+v; r1 owns %v, r2 %v", st.Runners, r1.Owned(), r2.Owned())
	}

	// A registered runner that takes no shard: never balanced, but owned.
	store, err := etcd.New(testenv.NewEtcdClient(t, ep), "waits", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := store.Grant(t.Context(), outliveTest(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.PutRunner(t.Context(), l.ID, storage.RunnerRecord{ID: "ghost", Weight: 1, Incarnation: "i", Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ctl(t, append(base, "status", "-wait", "balanced", "-wait-timeout", "2s")...)
	if code != exitFail || !strings.Contains(errOut, "not balanced after 2s") || !strings.Contains(errOut, "owned elsewhere than their assignee") ||
		!strings.Contains(errOut, "assigned to ghost") {
		t.Errorf("status -wait balanced with a runner that takes nothing: exit %d, %q %q", code, out, errOut)
	}
	if code, out, errOut := ctl(t, append(base, "status", "-wait", "owned", "-wait-timeout", "10s")...); code != exitOK || !strings.Contains(out, "ghost") {
		t.Errorf("status -wait owned: exit %d, %q %q", code, out, errOut)
	}
	if code, _, errOut := ctl(t, append(base, "status", "-wait", "settled")...); code != exitUsage || !strings.Contains(errOut, "want balanced or owned") {
		t.Errorf("status -wait settled: exit %d, %q", code, errOut)
	}

	// Only a runner record, no lock: never owned.
	lonely, err := etcd.New(testenv.NewEtcdClient(t, ep), "lonely", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lonely.PutRunner(t.Context(), l.ID, storage.RunnerRecord{ID: "ghost", Weight: 1, Incarnation: "i", Started: time.Now()}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = ctl(t, "-endpoints", ep, "-namespace", "lonely", "-shards", "4", "status", "-wait", "owned", "-wait-timeout", "1s")
	if code != exitFail || !strings.Contains(errOut, "not owned after 1s: 4 of 4 shards not owned by a registered runner") {
		t.Errorf("status -wait owned with no lock: exit %d, %q %q", code, out, errOut)
	}
}
