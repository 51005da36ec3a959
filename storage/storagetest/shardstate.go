package storagetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Per-shard state: reminders, their progress and remembered entities,
// written fenced by the shard's epoch and read back per shard.

func reminder(shard sharding.ShardID, kind, id, name string, period time.Duration) storage.Reminder {
	return storage.Reminder{
		Shard: shard, Entity: storage.EntityRef{Kind: kind, ID: id}, Name: name, Method: "tick",
		First: time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC), Period: period, Payload: []byte(`{"n":1}`),
	}
}

func testShardStateFenced(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	ea := acquire(t, s, la, owner("a", "1"), 1, 10, 11)
	// Shard 1 and 10/11 share a decimal prefix: reading 1 must not return theirs.
	r1 := reminder(1, "cart", "c/1 x?%", "expire", 0)
	r2 := reminder(1, "cart", "c2", "nightly/summary", 24*time.Hour)
	r2.Skip = true
	r10 := reminder(10, "cart", "c10", "expire", time.Minute)
	res, err := s.WriteShardStates(ctx, []storage.ShardWrite{
		{Shard: 1, Epoch: ea[0].Epoch, PutReminders: []storage.Reminder{r1, r2}, PutRemembered: []storage.EntityRef{{Kind: "feed", ID: "f/1"}}},
		{Shard: 10, Epoch: ea[1].Epoch, PutReminders: []storage.Reminder{r10}},
	})
	if err != nil || len(res) != 2 || res[0].Err != nil || res[1].Err != nil || res[0].Revision <= 0 {
		t.Fatalf("WriteShardStates(current epochs) = %+v, %v", res, err)
	}
	sts, err := s.ReadShardStates(ctx, []sharding.ShardID{1, 10, 11, 2})
	if err != nil || len(sts) != 4 {
		t.Fatalf("ReadShardStates = %v, %v", sts, err)
	}
	if got := names(sts[0].Reminders); !slices.Equal(got, []string{"cart/c/1 x?%/expire", "cart/c2/nightly/summary"}) {
		t.Fatalf("shard 1 reminders = %v", got)
	}
	got := sts[0].Reminders[1]
	if got.Method != "tick" || !got.First.Equal(r2.First) || got.Period != r2.Period || !got.Skip || string(got.Payload) != `{"n":1}` ||
		got.Epoch != ea[0].Epoch || got.Revision != res[0].Revision || got.Shard != 1 {
		t.Fatalf("reminder read back = %+v, want %+v at epoch %d", got, r2, ea[0].Epoch)
	}
	if len(sts[0].Remembered) != 1 || sts[0].Remembered[0].Entity != (storage.EntityRef{Kind: "feed", ID: "f/1"}) || sts[0].Remembered[0].Epoch != ea[0].Epoch {
		t.Fatalf("shard 1 remembered = %+v", sts[0].Remembered)
	}
	if got := names(sts[1].Reminders); !slices.Equal(got, []string{"cart/c10/expire"}) || len(sts[2].Reminders)+len(sts[3].Reminders) != 0 {
		t.Fatalf("shard 10, 11, 2 reminders = %v, %v, %v", got, sts[2].Reminders, sts[3].Reminders)
	}
	if sts[0].Revision < res[0].Revision || sts[0].Progress != nil || len(sts[0].Corrupt) != 0 {
		t.Fatalf("shard 1 state = %+v", sts[0])
	}
	// Progress and a delete, atomically; then the lock moves to B and A's
	// epoch is dead for every kind of write.
	cut := time.Date(2031, 5, 6, 7, 8, 9, 10, time.UTC)
	prog := &storage.ReminderProgress{Final: true, Cut: cut, Fired: []storage.FiredTick{{Entity: r2.Entity, Name: r2.Name, Revision: res[0].Revision, Tick: 7}}}
	if _, err := s.WriteShardStates(ctx, []storage.ShardWrite{{Shard: 1, Epoch: ea[0].Epoch, Progress: prog,
		DeleteReminders: []storage.ReminderRef{{Entity: r1.Entity, Name: r1.Name}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := storage.PutHandoff(ctx, s, lb, 1, storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffReady}); err != nil {
		t.Fatal(err)
	}
	eb, err := storage.TransferOne(ctx, s, storage.TransferRequest{Shard: 1, From: "a", FromLease: la, FromEpoch: ea[0].Epoch, ToLease: lb, ToOwner: owner("b", "1")})
	if err != nil {
		t.Fatal(err)
	}
	zombie := []storage.ShardWrite{
		{Shard: 1, Epoch: ea[0].Epoch, PutReminders: []storage.Reminder{r1}},
		{Shard: 11, Epoch: ea[2].Epoch, PutRemembered: []storage.EntityRef{{Kind: "feed", ID: "x"}}},
	}
	res, err = s.WriteShardStates(ctx, zombie)
	var fe *storage.FencedError
	if err != nil || !errors.As(res[0].Err, &fe) || !errors.Is(res[0].Err, storage.ErrFenced) || fe.Current != eb || res[1].Err != nil {
		t.Fatalf("WriteShardStates(stale epoch, current epoch) = %+v, %v; want a *FencedError (current %d) then success", res, err, eb)
	}
	sts, err = s.ReadShardStates(ctx, []sharding.ShardID{1})
	if err != nil {
		t.Fatal(err)
	}
	st := sts[0]
	if got := names(st.Reminders); !slices.Equal(got, []string{"cart/c2/nightly/summary"}) {
		t.Fatalf("after the fenced write: reminders %v, want only the nightly one", got)
	}
	p := st.Progress
	if p == nil || !p.Final || !p.Cut.Equal(cut) || p.Epoch != ea[0].Epoch || p.Shard != 1 || len(p.Fired) != 1 || p.Fired[0] != prog.Fired[0] {
		t.Fatalf("progress read back = %+v, want %+v at epoch %d", p, prog, ea[0].Epoch)
	}
	// An unlocked shard fences every epoch.
	if _, err := s.Release(ctx, lb, []storage.Held{{Shard: 1, Epoch: eb}}); err != nil {
		t.Fatal(err)
	}
	res, _ = s.WriteShardStates(ctx, []storage.ShardWrite{{Shard: 1, Epoch: eb, DeleteRemembered: []storage.EntityRef{{Kind: "feed", ID: "f/1"}}}})
	if !errors.As(res[0].Err, &fe) || fe.Current != 0 {
		t.Fatalf("WriteShardStates(released shard) = %+v, want *FencedError with Current 0", res)
	}
}

func names(rs []storage.Reminder) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Entity.String() + "/" + r.Name
	}
	slices.Sort(out)
	return out
}

func testShardStateBatches(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	const n = 150 // more than one transaction of writes and of reads
	res := acquire(t, s, l, owner("a", "1"), shardRange(0, n)...)
	writes := make([]storage.ShardWrite, n)
	for i, a := range res {
		var rs []storage.Reminder
		for j := range 3 {
			rs = append(rs, reminder(a.Shard, "k", fmt.Sprint("e", j), "r", time.Second))
		}
		writes[i] = storage.ShardWrite{Shard: a.Shard, Epoch: a.Epoch, PutReminders: rs}
	}
	out, err := s.WriteShardStates(ctx, writes)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range out {
		if r.Err != nil {
			t.Fatalf("shard %d: %v", r.Shard, r.Err)
		}
	}
	sts, err := s.ReadShardStates(ctx, shardRange(0, n))
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range sts {
		if st.Shard != sharding.ShardID(i) || len(st.Reminders) != 3 {
			t.Fatalf("state %d = shard %d with %d reminders, want shard %d with 3", i, st.Shard, len(st.Reminders), i)
		}
	}
	// One write too large for a transaction is refused before anything.
	big := reminder(0, "k", "big", "r", time.Second)
	big.Payload = make([]byte, storage.MaxReminderPayload)
	many := storage.ShardWrite{Shard: 0, Epoch: res[0].Epoch}
	for i := range storage.MaxShardWriteOps + 1 {
		r := big
		r.Name = fmt.Sprint("r", i)
		many.PutReminders = append(many.PutReminders, r)
	}
	if _, err := s.WriteShardStates(ctx, []storage.ShardWrite{many}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("WriteShardStates(%d operations) = %v, want ErrInvalidArgument", many.Ops(), err)
	}
}

func testShardStateCorrupt(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	ep := acquire(t, s, l, owner("a", "1"), 3)[0].Epoch
	good := reminder(3, "k", "ok", "r", time.Minute)
	if _, err := s.WriteShardStates(ctx, []storage.ShardWrite{{Shard: 3, Epoch: ep, PutReminders: []storage.Reminder{good}}}); err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"reminders/3/k%2Fa/r":         `{}`,
		"reminders/3/k%2Fb/r":         `{"method":"tick","first":1,"epoch":-1}`,
		"reminders/3/k%2Fc":           `{"method":"tick","first":1,"epoch":1}`,
		"reminders/3/nokind/r":        `{"method":"tick","first":1,"epoch":1}`,
		"reminders/3/k%2Fd/r":         `not json`,
		"reminders/3/k%2Fe/r":         `{"method":"","first":1893456000000000000,"epoch":1}`,
		"reminders/3/k%2Ff/r%2":       `{"method":"tick","first":1893456000000000000,"epoch":1}`,
		"reminders/3-x":               `{"epoch":1,"final":true,"cut":1893456000000000000}`,
		"remembered/3/k%2Fg":          `{"epoch":0}`,
		"remembered/3/plain":          `{"epoch":1}`,
		"reminders/3/k%2Fh/r/extra/x": `{"method":"tick","first":1893456000000000000,"epoch":1}`,
	}
	for k, v := range bad {
		if err := in.RawPut(ctx, k, []byte(v), storage.NoLease); err != nil {
			t.Fatal(err)
		}
	}
	sts, err := s.ReadShardStates(ctx, []sharding.ShardID{3})
	if err != nil {
		t.Fatal(err)
	}
	st := sts[0]
	if got := names(st.Reminders); !slices.Equal(got, []string{"k/ok/r"}) || len(st.Remembered) != 0 || st.Progress != nil {
		t.Fatalf("state with corrupt records = reminders %v, remembered %v, progress %v; want only k/ok/r", got, st.Remembered, st.Progress)
	}
	if len(st.Corrupt) != len(bad) {
		t.Fatalf("corrupt records reported: %d, want %d: %v", len(st.Corrupt), len(bad), st.Corrupt)
	}
	for _, err := range st.Corrupt {
		var ce *storage.CorruptError
		if !errors.As(err, &ce) || !errors.Is(err, storage.ErrCorrupt) || ce.Key == "" || !strings.HasPrefix(string(ce.Keyspace)+"/"+ce.Key, "re") {
			t.Errorf("corrupt record error %v: want a *CorruptError naming its key", err)
		}
	}
}

func testSingletonRecords(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	ep := acquire(t, s, l, owner("a", "1"), 5)[0].Epoch
	started := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := s.WriteShardStates(ctx, []storage.ShardWrite{{Shard: 5, Epoch: ep,
		PutSingletons: []storage.SingletonRecord{{Shard: 5, Name: "scheduler/main", Runner: "a", Started: started}}}}); err != nil {
		t.Fatal(err)
	}
	snap, err := s.List(ctx, storage.KeyspaceSingletons)
	if err != nil || len(snap.KVs) != 1 {
		t.Fatalf("List(singletons) = %+v, %v", snap, err)
	}
	rec, err := storage.DecodeSingleton(snap.KVs[0])
	if err != nil || rec.Name != "scheduler/main" || rec.Runner != "a" || rec.Epoch != ep || rec.Shard != 5 || !rec.Started.Equal(started) {
		t.Fatalf("DecodeSingleton = %+v, %v", rec, err)
	}
	res, err := s.WriteShardStates(ctx, []storage.ShardWrite{{Shard: 5, Epoch: ep + 1000, DeleteSingletons: []string{"scheduler/main"}}})
	if err != nil || !errors.Is(res[0].Err, storage.ErrFenced) {
		t.Fatalf("a stale delete: %+v, %v; want fenced", res, err)
	}
	if _, err := s.WriteShardStates(ctx, []storage.ShardWrite{{Shard: 5, Epoch: ep, DeleteSingletons: []string{"scheduler/main"}}}); err != nil {
		t.Fatal(err)
	}
	if snap, _ := s.List(ctx, storage.KeyspaceSingletons); len(snap.KVs) != 0 {
		t.Fatalf("record left after the delete: %+v", snap.KVs)
	}
}

// testShardStateWritesAreOrdered: every state write moves its shard's
// order key (storage.StateOrderKey) to the write's revision; a write that
// finds the key moved by another write — as one of the same client that
// landed late would move it — is made again at the key's revision and
// succeeds; the order key never shows up in the shard's state. (That a
// late write is refused is storage/memory's
// TestLateStateWriteNeverUndoesALaterOne.)
func testShardStateWritesAreOrdered(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	ep := acquire(t, s, l, owner("a", "1"), 4)[0].Epoch
	r := reminder(4, "k", "e", "r", time.Second)
	write := func(w storage.ShardWrite) storage.Revision {
		t.Helper()
		w.Shard, w.Epoch = 4, ep
		res, err := s.WriteShardStates(ctx, []storage.ShardWrite{w})
		if err != nil || res[0].Err != nil {
			t.Fatalf("WriteShardStates = %+v, %v", res, err)
		}
		return res[0].Revision
	}
	orderAt := func(want storage.Revision) {
		t.Helper()
		rev, ok, err := in.RawRevision(ctx, storage.StateOrderKey(4))
		if err != nil || !ok || rev != want {
			t.Fatalf("order key at %d (exists %v, %v); want at the write's revision %d", rev, ok, err, want)
		}
	}
	r1 := write(storage.ShardWrite{PutReminders: []storage.Reminder{r}})
	orderAt(r1)
	// Another write moves the order key behind this client's back.
	if err := in.RawPut(ctx, storage.StateOrderKey(4), nil, storage.NoLease); err != nil {
		t.Fatal(err)
	}
	r2 := write(storage.ShardWrite{DeleteReminders: []storage.ReminderRef{{Entity: r.Entity, Name: r.Name}}})
	orderAt(r2)
	sts, err := s.ReadShardStates(ctx, []sharding.ShardID{4})
	if err != nil || len(sts[0].Reminders) != 0 || len(sts[0].Corrupt) != 0 {
		t.Fatalf("ReadShardStates = %+v, %v; want no reminder, nothing corrupt", sts, err)
	}
	// A lock at another epoch still fences first.
	res, err := s.WriteShardStates(ctx, []storage.ShardWrite{{Shard: 4, Epoch: ep - 1, PutReminders: []storage.Reminder{r}}})
	if err != nil || !errors.Is(res[0].Err, storage.ErrFenced) {
		t.Fatalf("WriteShardStates(stale epoch) = %+v, %v; want ErrFenced", res, err)
	}
}
