package registration

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func record(id, incarnation string, started time.Time) storage.RunnerRecord {
	return storage.RunnerRecord{ID: id, Address: "127.0.0.1:7000", Weight: 1, Incarnation: incarnation, Started: started, LeaseTTL: time.Second}
}

// observe reads runners/{ID} from the store as the runners watch shows it.
func observe(t *testing.T, s *memory.Store, c *Record, id string) {
	t.Helper()
	snap, err := s.List(context.Background(), storage.KeyspaceRunners)
	if err != nil {
		t.Fatal(err)
	}
	o := Observation{Rev: snap.Revision}
	for _, kv := range snap.KVs {
		if kv.Key == id {
			o = Observation{Exists: true, KV: kv, Rev: kv.ModRevision}
		}
	}
	c.Observe(o)
}

func grant(t *testing.T, s *memory.Store) storage.LeaseID {
	t.Helper()
	l, err := s.Grant(context.Background(), time.Hour) // outlives every test; records publish 1 s
	if err != nil {
		t.Fatal(err)
	}
	return l.ID
}

// waitingForAnother returns a store holding runner "a"'s record of another
// live process (incarnation "other", started at t0) and a Record of "a"
// (incarnation "me", LeaseTTL 1 s) whose first Register under its lease
// mine waited for it (ErrWaitingForID).
func waitingForAnother(t *testing.T) (s *memory.Store, c *Record, mine storage.LeaseID, t0 time.Time) {
	t.Helper()
	ctx := context.Background()
	s = memory.New()
	t0 = time.Now()
	if _, err := s.PutRunner(ctx, grant(t, s), record("a", "other", t0)); err != nil {
		t.Fatal(err)
	}
	c = New(Config{ID: "a", Incarnation: "me", LeaseTTL: time.Second}, s, quiet)
	mine = grant(t, s)
	if _, err := c.Register(ctx, mine, record("a", "me", t0)); !errors.Is(err, ErrWaitingForID) {
		t.Fatalf("registering over another live process's record = %v, want ErrWaitingForID", err)
	}
	return s, c, mine, t0
}

func TestRegistrationWaitsForAnotherLiveProcessThenGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		_, c, mine, t0 := waitingForAnother(t)
		time.Sleep(time.Second + duplicateIDSlack - time.Millisecond)
		if _, err := c.Register(ctx, mine, record("a", "me", t0)); !errors.Is(err, ErrWaitingForID) {
			t.Fatalf("within the holder's TTL + slack: %v, want still waiting", err)
		}
		time.Sleep(2 * time.Millisecond)
		if _, err := c.Register(ctx, mine, record("a", "me", t0)); !errors.Is(err, ErrDuplicateRunnerID) {
			t.Fatalf("after the holder's TTL + slack: %v, want ErrDuplicateRunnerID", err)
		}
	})
}

// TestRegistrationWaitRestartsAfterTheStoreFailed: a store that did not
// answer may have been electing a leader, and etcd's new leader renews
// every lease for its TTL, a crashed predecessor's too (seen beside two
// CPU hogs: the predecessor's record outlived its TTL + slack by 2.4 s,
// and the restarted runner gave up on its own ID). The wait for the
// holder's lease starts again after such an attempt.
func TestRegistrationWaitRestartsAfterTheStoreFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		s, c, mine, t0 := waitingForAnother(t)
		time.Sleep(time.Second)
		s.Fail(memory.OpPutRunner, storage.ErrUnavailable)
		if _, err := c.Register(ctx, mine, record("a", "me", t0)); !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("with the store failing: %v, want ErrUnavailable", err)
		}
		s.Fail(memory.OpPutRunner, nil)
		time.Sleep(duplicateIDSlack) // past TTL + slack since the record was first seen
		if _, err := c.Register(ctx, mine, record("a", "me", t0)); !errors.Is(err, ErrWaitingForID) {
			t.Fatalf("within TTL + slack of the failed attempt: %v, want still waiting", err)
		}
		time.Sleep(time.Second + time.Millisecond)
		if _, err := c.Register(ctx, mine, record("a", "me", t0)); !errors.Is(err, ErrDuplicateRunnerID) {
			t.Fatalf("TTL + slack after the failed attempt, the holder still there: %v, want ErrDuplicateRunnerID", err)
		}
	})
}

func TestRegistrationClaimsTheIDOnceThePredecessorsLeaseEnds(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	other := grant(t, s)
	if _, err := s.PutRunner(ctx, other, record("a", "crashed", time.Now())); err != nil {
		t.Fatal(err)
	}
	c := New(Config{ID: "a", Incarnation: "me", LeaseTTL: time.Second}, s, quiet)
	mine := grant(t, s)
	if _, err := c.Register(ctx, mine, record("a", "me", time.Now())); !errors.Is(err, ErrWaitingForID) {
		t.Fatalf("first attempt = %v, want ErrWaitingForID", err)
	}
	s.Cluster().ExpireLease(other)
	if rev, err := c.Register(ctx, mine, record("a", "me", time.Now())); err != nil || rev == 0 {
		t.Fatalf("after the predecessor's lease expired = %d, %v; want the ID claimed", rev, err)
	}
}

func TestRegistrationReplacesADamagedRecordAtOnce(t *testing.T) {
	for name, put := range map[string]func(c *memory.Cluster) error{
		"corrupt": func(c *memory.Cluster) error {
			_, err := c.Put("runners/a", []byte("{garbage"), storage.NoLease)
			return err
		},
		"without lease": func(c *memory.Cluster) error {
			_, err := c.Put("runners/a", []byte(`{"id":"a","weight":1,"incarnation":"x","started":"2026-01-01T00:00:00Z"}`), storage.NoLease)
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := memory.New()
			if err := put(s.Cluster()); err != nil {
				t.Fatal(err)
			}
			c := New(Config{ID: "a", Incarnation: "me", LeaseTTL: time.Second}, s, quiet)
			if _, err := c.Register(context.Background(), grant(t, s), record("a", "me", time.Now())); err != nil {
				t.Fatalf("registering over a damaged record = %v, want it replaced", err)
			}
		})
	}
}

func TestRepairRestoresTheRecordChangedBehindTheRunnersBack(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	c := New(Config{ID: "a", Incarnation: "me", LeaseTTL: time.Second}, s, quiet)
	lease := grant(t, s)
	want := record("a", "me", time.Now())
	if _, err := c.Register(ctx, lease, want); err != nil {
		t.Fatal(err)
	}
	observe(t, s, c, "a")
	if again, err := c.Repair(ctx, ctx, lease); again || err != nil {
		t.Fatalf("repair of our own write = %v, %v; want nothing to do", again, err)
	}
	wrong := want
	wrong.Address = "10.0.0.1:1"
	if _, err := s.PutRunner(ctx, lease, wrong); err != nil { // a write under our lease
		t.Fatal(err)
	}
	observe(t, s, c, "a")
	if again, err := c.Repair(ctx, ctx, lease); again || err != nil {
		t.Fatal(again, err)
	}
	kv, _ := s.Cluster().Get("runners/a")
	if got, err := storage.DecodeRunner(storage.KeyValue{Key: "a", Value: kv.Value}); err != nil || got.Address != want.Address {
		t.Fatalf("record after repair: %+v, %v; want the address restored", got, err)
	}
	s.Cluster().Delete("runners/a")
	observe(t, s, c, "a")
	if again, err := c.Repair(ctx, ctx, lease); again || err != nil {
		t.Fatal(again, err)
	}
	if _, ok := s.Cluster().Get("runners/a"); !ok {
		t.Fatal("a deleted record was not rewritten")
	}
}

func TestRepairKeepsTheIDForTheProcessThatStartedFirst(t *testing.T) {
	ctx := context.Background()
	t0 := time.Now()
	for _, c := range []struct {
		name         string
		otherStarted time.Time
		dup          bool
	}{
		{"the other started first", t0.Add(-time.Second), true},
		{"this runner started first", t0.Add(time.Second), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := memory.New()
			rec := New(Config{ID: "a", Incarnation: "me", LeaseTTL: time.Second}, s, quiet)
			rec.Start(t0)
			lease := grant(t, s)
			if _, err := rec.Register(ctx, lease, record("a", "me", t0)); err != nil {
				t.Fatal(err)
			}
			other := grant(t, s)
			if _, err := s.ReplaceRunner(ctx, other, record("a", "other", c.otherStarted), rec.rev); err != nil {
				t.Fatal(err)
			}
			observe(t, s, rec, "a")
			_, err := rec.Repair(ctx, ctx, lease)
			if got := errors.Is(err, ErrDuplicateRunnerID); got != c.dup {
				t.Fatalf("repair = %v; duplicate %v, want %v", err, got, c.dup)
			}
			kv, _ := s.Cluster().Get("runners/a")
			if keeps := kv.Lease == lease; keeps == c.dup {
				t.Errorf("record's lease after repair %x (ours %x): the process that started first must keep the ID", kv.Lease, lease)
			}
		})
	}
}
