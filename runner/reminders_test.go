package runner_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/shardhost/shardhost/internal/testenv"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// checkFiresByOwners fails t for a fire that did not happen on the owner
// of its shard at the epoch it ran under (by the runners' own events), or
// after that ownership ended.
func checkFiresByOwners(t *testing.T, evs []runner.Event, fires []alarmFire) {
	t.Helper()
	type key struct {
		runner string
		shard  sharding.ShardID
		epoch  storage.Epoch
	}
	from, until := map[key]time.Time{}, map[key]time.Time{}
	for _, ev := range evs {
		switch e := ev.(type) {
		case runner.ShardAcquired:
			k := key{e.Runner, e.Shard, e.Epoch}
			if _, ok := from[k]; !ok {
				from[k] = e.Time
			}
			delete(until, k) // a reopened cutover serves again
		case runner.ShardReleased:
			until[key{e.Runner, e.Shard, e.Epoch}] = e.Time
		case runner.ShardLost:
			until[key{e.Runner, e.Shard, e.Epoch}] = e.Time
		}
	}
	for _, f := range fires {
		k := key{f.Runner, f.Shard, f.Epoch}
		start, owned := from[k]
		end, ended := until[k]
		if !owned || f.At.Before(start) || (ended && f.At.After(end)) {
			t.Errorf("fire %+v: not by the owner of shard %d at epoch %d (acquired %v at %v, ended %v at %v)", f, f.Shard, f.Epoch, owned, start, ended, end)
		}
	}
}

// reminderCluster is a cluster on the in-memory store and transport.
type reminderCluster struct {
	t   *testing.T
	c   *memory.Cluster
	net *transport.InmemNetwork
	env *alarmEnv
	rec *recorder
	cfg runner.Config
}

func newReminderCluster(t *testing.T, env *alarmEnv, shards int) *reminderCluster {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	return &reminderCluster{t: t, c: c, net: transport.NewInmemNetwork(), env: env, rec: newRecorder(t),
		cfg: runner.Config{NumShards: shards, WarmTimeout: time.Second, HandoffWait: 3 * time.Second}}
}

func (rc *reminderCluster) start(id string) *started {
	cfg := rc.cfg
	cfg.ID, cfg.Transport = id, rc.net.Transport(id+":7100")
	r := start(rc.t, rc.c, rc.rec, cfg)
	if err := r.Register(rc.env.kind); err != nil {
		rc.t.Fatal(err)
	}
	return r
}

func (rc *reminderCluster) converge(rs ...*started) {
	rc.t.Helper()
	waitFor(rc.t, 30*time.Second, fmt.Sprintf("%d runners own a partition", len(rs)), func() bool {
		ok, _ := partitionOK(rs, rc.cfg.NumShards)
		return ok
	})
}

// TestReminderFiresOnTheOwnerWhetherResidentOrNot: a periodic reminder
// fires every period on its shard's owner, activating its entity when it
// was passivated (ticks are not activity), numbered from 1; a one-shot
// reminder fires once and its record is deleted; a cancelled reminder
// fires no more; a reminder replaced by a new registration restarts.
func TestReminderFiresOnTheOwnerWhetherResidentOrNot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv(entity.IdleAfter(2 * time.Second))
		c, r, rec := startOwningAll(t, runner.Config{ID: "a", NumShards: 4, PassivationInterval: 200 * time.Millisecond}, env.kind)
		ctx := t.Context()
		start := time.Now()
		if _, err := env.arm.Ask(ctx, r, "x", armReq{Name: "every", Period: time.Second, Payload: "tick"}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.arm.Ask(ctx, r, "x", armReq{Name: "once", First: start.Add(3500 * time.Millisecond), Payload: "boom"}); err != nil {
			t.Fatal(err)
		}
		infos, err := env.list.Ask(ctx, r, "x", struct{}{})
		if err != nil || len(infos) != 2 || infos[0].Name != "every" || infos[0].Schedule.Period != time.Second || !infos[1].Next.Equal(start.Add(3500*time.Millisecond)) {
			t.Fatalf("reminders listed = %+v, %v", infos, err)
		}
		time.Sleep(10500 * time.Millisecond)
		every, once := env.firesOf("x", "every"), env.firesOf("x", "once")
		if len(every) != 10 || checkExact(every) != "" || every[0].Payload != "tick" {
			t.Fatalf("periodic reminder over 10.5 s: %d fires %v (%s)", len(every), ticks(every), checkExact(every))
		}
		for i, f := range every {
			if lag := f.At.Sub(f.Due); f.Due.Sub(start) != time.Duration(i+1)*time.Second || lag < 0 || lag > 100*time.Millisecond {
				t.Errorf("tick %d due %v after the registration, fired %v late", f.Tick, f.Due.Sub(start), lag)
			}
		}
		if len(once) != 1 || once[0].Payload != "boom" || once[0].Tick != 1 {
			t.Fatalf("one-shot reminder fires = %+v, want one", once)
		}
		if n := env.activationsOf("x"); n < 3 {
			t.Errorf("x activated %d times: ticks should not keep it resident (IdleAfter 2 s), so they reactivate it", n)
		}
		if _, ok := c.Get(storage.ReminderKey(sharding.ShardOf("x", 4), storage.EntityRef{Kind: "alarm", ID: "x"}, "once")); ok {
			t.Error("the one-shot reminder's record is still stored after it fired")
		}
		if _, ok := c.Get(storage.ReminderKey(sharding.ShardOf("x", 4), storage.EntityRef{Kind: "alarm", ID: "x"}, "every")); !ok {
			t.Error("the periodic reminder's record is gone")
		}
		if _, err := env.disarm.Ask(ctx, r, "x", "every"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		if n := len(env.firesOf("x", "every")); n != 10 {
			t.Fatalf("a cancelled reminder fired again: %d fires", n)
		}
		if r.Status().Reminders != 0 {
			t.Fatalf("ReminderCount = %d after cancelling everything", r.Status().Reminders)
		}
		checkFiresByOwners(t, rec.all(), env.firesOf("x", "every"))
	})
}

// TestPeriodicReminderWritesNothingPerTick: in steady state the store
// sees no write at all while reminders fire (the next due time follows
// from the first and the period).
func TestPeriodicReminderWritesNothingPerTick(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		c, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4}, env.kind)
		for i := range 20 {
			if _, err := env.arm.Ask(t.Context(), r, fmt.Sprint("e", i), armReq{Name: "every", Period: time.Second}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2 * time.Second)
		hist, _ := c.History()
		before := countStateWrites(hist)
		time.Sleep(20 * time.Second)
		hist, _ = c.History()
		if got := countStateWrites(hist) - before; got != 0 {
			t.Fatalf("%d store writes in 20 s of 20 reminders firing every second, want 0", got)
		}
		if n := len(env.firesOf("e0", "every")); n < 21 {
			t.Fatalf("e0 fired %d times in 22 s", n)
		}
	})
}

// countStateWrites counts the writes and deletes in a store's history,
// of any key: in steady state a cluster writes nothing.
func countStateWrites(evs []storage.Event) int { return len(evs) }

// TestReminderMovesWithItsShardExactlyOnce: across planned moves — a
// runner joining (handoff), the original owner shutting down gracefully
// (handoff), and coming back (handoff) — every tick of every reminder
// fires once, on its shard's owner, numbered without a gap and never
// marked redelivered; one-shot reminders due around the moves fire once.
func TestReminderMovesWithItsShardExactlyOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		rc := newReminderCluster(t, env, 8)
		a := rc.start("a")
		rc.converge(a)
		ctx := t.Context()
		start := time.Now()
		const n = 24
		for i := range n {
			id := fmt.Sprint("e", i)
			if _, err := env.arm.Ask(ctx, a, id, armReq{Name: "every", Period: time.Second}); err != nil {
				t.Fatal(err)
			}
			first := start.Add(time.Duration(3000+i*250) * time.Millisecond)
			if _, err := env.arm.Ask(ctx, a, id, armReq{Name: "once", First: first}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2500 * time.Millisecond)
		b := rc.start("b")
		rc.converge(a, b)
		time.Sleep(2 * time.Second)
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		if err := a.Shutdown(sctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		rc.converge(b)
		time.Sleep(2 * time.Second)
		a2 := rc.start("a")
		rc.converge(a2, b)
		time.Sleep(3 * time.Second)
		end := time.Now()
		var all []alarmFire
		moved := 0
		for i := range n {
			id := fmt.Sprint("e", i)
			every := env.firesOf(id, "every")
			if msg := checkExact(every); msg != "" {
				t.Errorf("%s: %s", id, msg)
			}
			if want := uint64(end.Sub(start) / time.Second); uint64(len(every)) < want-1 {
				t.Errorf("%s fired %d ticks in %v", id, len(every), end.Sub(start))
			}
			if len(runnersOf(every)) > 1 {
				moved++
			}
			once := env.firesOf(id, "once")
			if len(once) != 1 || once[0].Redelivered {
				t.Errorf("%s: one-shot fires %+v, want exactly one", id, once)
			}
			all = append(all, every...)
			all = append(all, once...)
		}
		if moved < n/2 {
			t.Errorf("only %d of %d reminders moved between runners", moved, n)
		}
		checkFiresByOwners(t, rc.rec.all(), all)
		if env.overlaps != 0 {
			t.Errorf("%d overlapping handlers of one entity", env.overlaps)
		}
	})
}

// TestReminderAfterACrashFiresAgainAtLeastOnce: a crashed owner's shards
// are taken over after its lease expires; their reminders fire again
// within LeaseTTL + 1 s of the crash, the first fire of each marked
// Redelivered (the new owner cannot know what the dead one fired — also
// when the shards had come to it by a planned move, whose exact progress
// it consumed before firing), no tick is skipped (the ticks missed during
// the takeover are one fire with their count), and the sequence goes on
// exactly afterwards.
func TestReminderAfterACrashFiresAgainAtLeastOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		rc := newReminderCluster(t, env, 8)
		a := rc.start("a")
		rc.converge(a)
		ctx := t.Context()
		const n = 24
		for i := range n {
			if _, err := env.arm.Ask(ctx, a, fmt.Sprint("e", i), armReq{Name: "every", Period: time.Second}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(1500 * time.Millisecond)
		b := rc.start("b") // takes half of the shards, and their reminders, by handoff
		rc.converge(a, b)
		time.Sleep(4500 * time.Millisecond)
		crashed := time.Now()
		b.Close()
		time.Sleep(15 * time.Second)
		checked := 0
		for i := range n {
			id := fmt.Sprint("e", i)
			every := env.firesOf(id, "every")
			var before, after []alarmFire
			onB := false
			for _, f := range every {
				switch {
				case f.At.After(crashed):
					after = append(after, f)
				default:
					before = append(before, f)
					onB = onB || f.Runner == "b"
				}
			}
			if !onB {
				continue // on a all along
			}
			checked++
			if msg := checkExact(before); msg != "" {
				t.Errorf("%s before the crash: %s", id, msg)
			}
			if len(after) == 0 {
				t.Errorf("%s never fired again after b crashed", id)
				continue
			}
			first := after[0]
			if d := first.At.Sub(crashed); d > runner.DefaultLeaseTTL+time.Second {
				t.Errorf("%s fired again %v after the crash, want within TTL + 1 s", id, d)
			}
			// At least once: the fire stands for ticks Tick-Missed..Tick,
			// which cover every tick after the last one b fired.
			last := before[len(before)-1].Tick
			if !first.Redelivered || first.Tick <= last || first.Tick-first.Missed > last+1 {
				t.Errorf("%s first fire after the crash: tick %d missed %d redelivered %v, after tick %d", id, first.Tick, first.Missed, first.Redelivered, last)
			}
			for j := 1; j < len(after); j++ {
				if after[j].Tick != after[j-1].Tick+1 || after[j].Redelivered || after[j].Missed != 0 {
					t.Errorf("%s after the takeover: ticks %v", id, ticks(after))
					break
				}
			}
		}
		if checked == 0 {
			t.Fatal("no reminder lived on the crashed runner")
		}
		checkFiresByOwners(t, rc.rec.all(), env.allFires())
	})
}

// TestSkipReminderSkipsTheTicksOfAnOutage: with the Skip policy, the ticks
// due while the crashed owner's lease ran out are not fired: the next fire
// is the first tick due after the takeover.
func TestSkipReminderSkipsTheTicksOfAnOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		rc := newReminderCluster(t, env, 2)
		a, b := rc.start("a"), rc.start("b")
		rc.converge(a, b)
		var onB string
		for id := range b.Owned() {
			onB = idFor(id, 2, "s")
		}
		if _, err := env.arm.Ask(t.Context(), a, onB, armReq{Name: "skip", Period: time.Second, Skip: true}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3500 * time.Millisecond)
		crashed := time.Now()
		b.Close()
		time.Sleep(12 * time.Second)
		fs := env.firesOf(onB, "skip")
		var after []alarmFire
		for _, f := range fs {
			if f.At.After(crashed) {
				after = append(after, f)
			}
		}
		if len(after) == 0 {
			t.Fatal("never fired after the crash")
		}
		first := after[0]
		if first.Missed != 0 || first.At.Sub(first.Due) > 50*time.Millisecond {
			t.Errorf("first fire after the outage: tick %d due %v fired at %v missed %d: want a tick due after the takeover, on time", first.Tick, first.Due, first.At, first.Missed)
		}
		if first.Due.Before(crashed.Add(runner.DefaultLeaseTTL - time.Second)) {
			t.Errorf("first fire after the outage is tick %d due %v, during the outage", first.Tick, first.Due.Sub(crashed))
		}
	})
}

// TestReminderNeverFiresAfterTheDetachInstant: a runner cut off from the
// store detaches at its lease deadline minus the margin and fires nothing
// from then on; the shard's new owner fires the reminder within the bound.
func TestReminderNeverFiresAfterTheDetachInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		rc := newReminderCluster(t, env, 2)
		a := rc.start("a")
		st := rc.c.NewStore("b")
		cfg := rc.cfg
		cfg.ID, cfg.Transport = "b", rc.net.Transport("b:7100")
		b := startOn(t, st, rc.rec, cfg)
		if err := b.Register(env.kind); err != nil {
			t.Fatal(err)
		}
		rc.converge(a, b)
		var onB string
		for id := range b.Owned() {
			onB = idFor(id, 2, "d")
		}
		if _, err := env.arm.Ask(t.Context(), a, onB, armReq{Name: "every", Period: time.Second}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		st.Partition(true)
		d := waitDetached(t, rc.rec, 10*time.Second)
		if d.Runner != "b" {
			t.Fatalf("detached: %+v", d)
		}
		time.Sleep(10 * time.Second)
		var lateB, onA int
		for _, f := range env.firesOf(onB, "every") {
			if f.Runner == "b" && !f.At.Before(d.Time) {
				lateB++
			}
			if f.Runner == "a" {
				onA++
			}
		}
		if lateB != 0 {
			t.Fatalf("%d ticks fired on b after its detach at %v", lateB, d.Time)
		}
		if onA < 5 {
			t.Fatalf("a fired %d ticks after taking the shard over", onA)
		}
		st.Partition(false)
		checkFiresByOwners(t, rc.rec.all(), env.allFires())
	})
}

// TestCorruptReminderRecordsAreSkippedAndLogged: a stored reminder that
// does not decode, or names a method the kind does not have, is logged
// with its key and skipped; the shard's other reminders fire.
func TestCorruptReminderRecordsAreSkippedAndLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		var logs testenv.SyncBuffer
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		shard := sharding.ShardOf("good", 2)
		ref := func(id string) storage.EntityRef { return storage.EntityRef{Kind: "alarm", ID: id} }
		// Written before any runner: a corrupt value, a bad key, an unknown method.
		c.Put(storage.ReminderKey(shard, ref("bad"), "r"), []byte(`{"method":"remind"`), storage.NoLease)
		c.Put(fmt.Sprintf("reminders/%d/nokind/r", shard), []byte(`{"method":"remind","first":1,"epoch":1}`), storage.NoLease)
		c.Put(storage.ReminderKey(shard, ref("unknown"), "r"), []byte(fmt.Sprintf(`{"method":"nosuch","first":%d,"period":1000000000,"epoch":1}`, time.Now().UnixNano())), storage.NoLease)
		c.Put(storage.ReminderKey(shard, ref("good"), "r"), []byte(fmt.Sprintf(`{"method":"remind","first":%d,"period":1000000000,"epoch":1}`, time.Now().Add(time.Second).UnixNano())), storage.NoLease)
		r := start(t, c, nil, runner.Config{ID: "a", NumShards: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err := r.Register(env.kind); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5500 * time.Millisecond)
		if n := len(env.firesOf("good", "r")); n < 4 {
			t.Fatalf("the good reminder fired %d times beside corrupt ones", n)
		}
		out := logs.String()
		for _, want := range []string{"reminders/" + fmt.Sprint(shard) + "/alarm%2Fbad/r", "nokind", "alarm%2Funknown/r"} {
			if !strings.Contains(out, want) {
				t.Errorf("no log line names %s:\n%s", want, out)
			}
		}
		if len(r.Owned()) != 2 {
			t.Errorf("corrupt reminders cost shards: owned %v", r.Owned())
		}
	})
}

// TestOverdueRemindersCatchUpAtABoundedRate: a runner that loads many
// reminders already due (a cold start after an outage) fires them at
// ReminderCatchUpRate, not all at once, while a reminder due later fires
// on time.
func TestOverdueRemindersCatchUpAtABoundedRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		past := time.Now().Add(-time.Hour).UnixNano()
		for i := range 500 {
			id := fmt.Sprint("o", i)
			c.Put(storage.ReminderKey(sharding.ShardOf(id, 4), storage.EntityRef{Kind: "alarm", ID: id}, "r"),
				[]byte(fmt.Sprintf(`{"method":"remind","first":%d,"epoch":1}`, past)), storage.NoLease)
		}
		on := time.Now().Add(2 * time.Second)
		c.Put(storage.ReminderKey(sharding.ShardOf("late", 4), storage.EntityRef{Kind: "alarm", ID: "late"}, "r"),
			[]byte(fmt.Sprintf(`{"method":"remind","first":%d,"epoch":1}`, on.UnixNano())), storage.NoLease)
		r := start(t, c, nil, runner.Config{ID: "a", NumShards: 4, ReminderCatchUpRate: 100})
		if err := r.Register(env.kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "owning all", func() bool { return len(r.Owned()) == 4 })
		time.Sleep(3 * time.Second)
		env.mu.Lock()
		overdue := 0
		for _, f := range env.fires {
			if strings.HasPrefix(f.Entity, "o") {
				overdue++
				if !f.Redelivered {
					t.Errorf("overdue one-shot %s not marked redelivered after a load without progress", f.Entity)
				}
			}
		}
		env.mu.Unlock()
		// 10 at once, then 100/s: about 310 in 3 s.
		if overdue < 250 || overdue > 350 {
			t.Errorf("%d overdue reminders fired in 3 s at a catch-up rate of 100/s", overdue)
		}
		late := env.firesOf("late", "r")
		if len(late) != 1 || late[0].At.Sub(on) > 50*time.Millisecond {
			t.Errorf("the reminder due after the load fired %+v, want once on time (due %v)", late, on)
		}
		time.Sleep(3 * time.Second)
		env.mu.Lock()
		total := len(env.fires)
		env.mu.Unlock()
		if total != 501 {
			t.Errorf("%d fires in all, want 501 (each one-shot once)", total)
		}
	})
}

// TestReminderRegistrationLimitsAndStaleOwners: a shard holds at most
// MaxRemindersPerShard reminders (ErrTooManyReminders, nothing written);
// a handler that outlives its shard's move cannot register a reminder
// (its shard left: the error says so, nothing is written).
func TestReminderRegistrationLimitsAndStaleOwners(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		rc := newReminderCluster(t, env, 1)
		rc.cfg.MaxRemindersPerShard = 5
		rc.cfg.DrainTimeout = time.Second
		a := rc.start("a")
		rc.converge(a)
		ctx := t.Context()
		for i := range 5 {
			if _, err := env.arm.Ask(ctx, a, fmt.Sprint("e", i), armReq{Name: "r", Period: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := env.arm.Ask(ctx, a, "e0", armReq{Name: "r", Period: 2 * time.Minute}); err != nil {
			t.Fatalf("replacing a reminder at the limit: %v", err)
		}
		if _, err := env.arm.Ask(ctx, a, "e9", armReq{Name: "r", Period: time.Minute}); !errors.Is(err, entity.ErrTooManyReminders) {
			t.Fatalf("a 6th reminder with MaxRemindersPerShard 5: %v, want ErrTooManyReminders", err)
		}
		// A stubborn handler holds the shard's only entity while a
		// shutdown releases the shard; when it resumes, its shard is gone.
		res := make(chan error, 1)
		go func() {
			_, err := env.stall.Ask(context.Background(), a, "late", armReq{Name: "zombie", Period: time.Minute})
			res <- err
		}()
		time.Sleep(100 * time.Millisecond)
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_ = a.Shutdown(sctx)
		cancel()
		close(env.stubborn)
		err := <-res
		if err == nil {
			t.Fatal("a handler whose shard left registered a reminder")
		}
		if !errors.Is(err, runner.ErrShardMoved) && !errors.Is(err, runner.ErrShutdown) && !errors.Is(err, storage.ErrFenced) && !errors.Is(err, runner.ErrMaybeDelivered) {
			t.Fatalf("late registration: %v, want its shard's departure", err)
		}
		if _, ok := rc.c.Get(storage.ReminderKey(0, storage.EntityRef{Kind: "alarm", ID: "late"}, "zombie")); ok {
			t.Fatal("a zombie registration was stored")
		}
	})
}

// TestConcurrentRegistrationsOnOneShardAllLand: many entities of one
// shard register and cancel reminders at once while one-shot reminders of
// the shard fire and are deleted: every registration lands, nothing
// deadlocks, and the shard's other work goes on.
func TestConcurrentRegistrationsOnOneShardAllLand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		c, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 1}, env.kind)
		ctx := t.Context()
		var wg sync.WaitGroup
		errs := make(chan error, 400)
		for i := range 100 {
			id := fmt.Sprint("e", i)
			wg.Go(func() {
				for j := range 3 {
					first := time.Now().Add(time.Duration(j*10) * time.Millisecond)
					if _, err := env.arm.Ask(ctx, r, id, armReq{Name: fmt.Sprint("once", j), First: first}); err != nil {
						errs <- err
					}
				}
				if _, err := env.arm.Ask(ctx, r, id, armReq{Name: "every", Period: time.Second}); err != nil {
					errs <- err
				}
				if _, err := env.disarm.Ask(ctx, r, id, "every"); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("registration: %v", err)
		}
		time.Sleep(2 * time.Second)
		for i := range 100 {
			for j := range 3 {
				if n := len(env.firesOf(fmt.Sprint("e", i), fmt.Sprint("once", j))); n != 1 {
					t.Fatalf("e%d/once%d fired %d times", i, j, n)
				}
			}
		}
		if r.Status().Reminders != 0 {
			t.Errorf("%d reminders left loaded, want 0 (one-shots deleted, periodic ones cancelled)", r.Status().Reminders)
		}
		left := 0
		for _, ev := range mustHistoryKeys(t, c, "reminders/0/") {
			_ = ev
			left++
		}
		if left != 0 {
			t.Errorf("%d reminder records left in the store", left)
		}
	})
}

// mustHistoryKeys returns the keys under prefix stored in c now.
func mustHistoryKeys(t *testing.T, c *memory.Cluster, prefix string) []string {
	t.Helper()
	hist, _ := c.History()
	live := map[string]bool{}
	for _, ev := range hist {
		if !strings.HasPrefix(ev.KV.Key, prefix) {
			continue
		}
		live[ev.KV.Key] = ev.Type == storage.EventPut
	}
	var out []string
	for k, ok := range live {
		if ok {
			out = append(out, k)
		}
	}
	return out
}

// TestReminderTickWaitsForItsEntitysRunningHandler: a tick is delivered
// through the mailbox, one message at a time with the entity's other
// messages: due while a handler of the entity runs (one that ignores its
// context here), it waits for that handler and fires as soon as it
// returns; the ticks due meanwhile then fire once with their count, none
// lost and none twice. (The simulation's "firing resumes" rule counts
// from the instant the entity is free for this reason.)
func TestReminderTickWaitsForItsEntitysRunningHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		_, r, rec := startOwningAll(t, runner.Config{ID: "a", NumShards: 4}, env.kind)
		if _, err := env.arm.Ask(t.Context(), r, "x", armReq{Name: "every", Period: time.Second}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond) // ticks 1 and 2
		stalled := make(chan error, 1)
		go func() {
			_, err := env.stall.Ask(context.Background(), r, "x", armReq{Name: "later", Timer: true, Delay: time.Hour})
			stalled <- err
		}()
		time.Sleep(5 * time.Second) // ticks 3 to 7 due while the handler runs
		if fs := env.firesOf("x", "every"); len(fs) != 2 {
			t.Fatalf("ticks %v fired by 7.5 s, want 1 and 2 only: a handler of x ran from 2.5 s on", ticks(fs))
		}
		freed := time.Now()
		close(env.stubborn)
		if err := <-stalled; err != nil {
			t.Fatal(err)
		}
		time.Sleep(1200 * time.Millisecond)
		fs := env.firesOf("x", "every")
		if len(fs) < 3 || fs[2].At.Sub(freed) > 10*time.Millisecond {
			t.Fatalf("ticks %v: want a fire as soon as the handler returned at %v", ticks(fs), freed.Format(time.StampMilli))
		}
		for i := 1; i < len(fs); i++ {
			if f, p := fs[i], fs[i-1]; f.Tick != p.Tick+f.Missed+1 || f.Redelivered {
				t.Errorf("tick %d (missed %d, redelivered %v) after tick %d: a tick lost or fired twice", f.Tick, f.Missed, f.Redelivered, p.Tick)
			}
		}
		if last := fs[len(fs)-1].Tick; last != 8 {
			t.Errorf("ticks %v by 8.7 s, want up to 8", ticks(fs))
		}
		checkFiresByOwners(t, rec.all(), env.allFires())
	})
}
