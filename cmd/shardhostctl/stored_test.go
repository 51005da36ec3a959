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
	code, out, errOut := ctl(t, "-endpoints", ep, "remembered")
	if code != exitOK || !strings.Contains(out, ": 20 in ") || !strings.Contains(errOut, `namespace "fleet"`) {
		t.Errorf("remembered without -namespace (exit %d): %q %q", code, out, errOut)
	}
}
