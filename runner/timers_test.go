package runner_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// TestTimerTicksRunThroughTheMailboxUntilStopped: a one-shot timer fires
// once, a periodic one every period, numbered from 1, one at a time with
// the entity's other messages; StopTimer ends it; re-arming a name
// replaces the timer.
func TestTimerTicksRunThroughTheMailboxUntilStopped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4}, env.kind)
		ctx := t.Context()
		if _, err := env.arm.Ask(ctx, r, "x", armReq{Name: "once", Timer: true, Delay: 300 * time.Millisecond, Payload: "p1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := env.arm.Ask(ctx, r, "x", armReq{Name: "tick", Timer: true, Period: time.Second, Payload: "p2"}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// Asks interleave with the ticks: one handler of x at a time.
		for time.Since(start) < 5500*time.Millisecond {
			if _, err := env.list.Ask(ctx, r, "x", struct{}{}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(7 * time.Millisecond)
		}
		once, tick := env.firesOf("x", "once"), env.firesOf("x", "tick")
		if len(once) != 1 || once[0].Payload != "p1" || once[0].Tick != 1 || once[0].At.Sub(start) < 300*time.Millisecond-time.Millisecond {
			t.Fatalf("one-shot timer fires = %+v, want one tick with p1 after 300ms", once)
		}
		if len(tick) != 5 || checkExact(tick) != "" || tick[0].Payload != "p2" || r.Config().ID != tick[0].Runner {
			t.Fatalf("periodic timer fired %d times in 5.5 s at 1 s: %s (%+v)", len(tick), checkExact(tick), tick)
		}
		if stopped, err := env.disarm.Ask(ctx, r, "x", "tick"); err != nil || !stopped {
			t.Fatalf("disarm = %v, %v", stopped, err)
		}
		time.Sleep(3 * time.Second)
		if n := len(env.firesOf("x", "tick")); n != 5 {
			t.Fatalf("a stopped timer fired again: %d fires", n)
		}
		// Re-arming replaces: one timer of that name, counting from 1.
		for _, p := range []time.Duration{time.Hour, 500 * time.Millisecond} {
			if _, err := env.arm.Ask(ctx, r, "x", armReq{Name: "again", Timer: true, Period: p}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(1200 * time.Millisecond)
		if got := ticks(env.firesOf("x", "again")); !slices.Equal(got, []uint64{1, 2}) {
			t.Fatalf("re-armed timer fired ticks %v, want [1 2]", got)
		}
		if env.overlaps != 0 {
			t.Fatalf("%d times two handlers of one entity ran at once", env.overlaps)
		}
	})
}

// TestTimerTicksDoNotKeepAnIdleEntityResident: ticks are not activity, so
// an entity with a periodic timer and no messages passivates after
// IdleAfter, and its timer ends with it; with TicksAreActivity it stays.
func TestTimerTicksDoNotKeepAnIdleEntityResident(t *testing.T) {
	for _, activity := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "TicksAreActivity"}[activity], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				opts := []entity.Option{entity.IdleAfter(3 * time.Second)}
				if activity {
					opts = append(opts, entity.TicksAreActivity())
				}
				env := newAlarmEnv(opts...)
				_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4, PassivationInterval: 100 * time.Millisecond}, env.kind)
				if _, err := env.arm.Ask(t.Context(), r, "x", armReq{Name: "tick", Timer: true, Period: 500 * time.Millisecond}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(8 * time.Second)
				fires := env.firesOf("x", "tick")
				if activity {
					if len(fires) < 15 || len(env.releasesOf("x")) != 0 {
						t.Fatalf("TicksAreActivity: %d fires in 8 s, releases %v; want the entity resident, ~16 fires", len(fires), env.releasesOf("x"))
					}
					return
				}
				rel := env.releasesOf("x")
				if len(rel) != 1 || !errors.Is(rel[0], runner.ErrPassivated) {
					t.Fatalf("releases = %v, want one passivation", rel)
				}
				// Passivated about IdleAfter after the arming ask: ~6 ticks, then none.
				if len(fires) < 5 || len(fires) > 7 || checkExact(fires) != "" {
					t.Fatalf("fires before passivation = %v (%s), want ticks 1..~6", ticks(fires), checkExact(fires))
				}
				if r.Status().Entities != 0 || r.Status().Timers != 0 {
					t.Fatalf("after passivation: %d entities, %d timers resident; want none", r.Status().Entities, r.Status().Timers)
				}
			})
		})
	}
}

// TestTimersEndWhenTheirShardMoves: a timer lives in its runner's memory:
// when the shard is handed to a new owner, the old owner's timer stops
// before the new owner runs anything of the shard, and nothing of it
// fires on the new owner.
func TestTimersEndWhenTheirShardMoves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		net := transport.NewInmemNetwork()
		env := newAlarmEnv()
		rec := newRecorder(t)
		cfg := func(id string) runner.Config {
			return runner.Config{ID: id, NumShards: 2, Transport: net.Transport(id + ":7100"), WarmTimeout: time.Second}
		}
		a := start(t, c, rec, cfg("a"))
		if err := a.Register(env.kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 2 })
		// An entity of the shard that b will take.
		b := start(t, c, rec, cfg("b"))
		if err := b.Register(env.kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a and b own one each", func() bool { ok, _ := partitionOK([]*started{a, b}, 2); return ok })
		bShard := sharding.ShardID(0)
		for id := range b.Owned() {
			bShard = id
		}
		b.Close() // back to a, then b2 takes it by handoff
		waitFor(t, 20*time.Second, "a owns all again", func() bool { return len(a.Owned()) == 2 })
		x := idFor(bShard, 2, "x")
		if _, err := env.arm.Ask(t.Context(), a, x, armReq{Name: "tick", Timer: true, Period: 200 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		b2 := start(t, c, rec, cfg("b"))
		if err := b2.Register(env.kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "b takes its shard", func() bool { ok, _ := partitionOK([]*started{a, b2}, 2); return ok })
		moved := time.Now()
		time.Sleep(2 * time.Second)
		fires := env.firesOf(x, "tick")
		if len(fires) < 3 || checkExact(fires) != "" {
			t.Fatalf("fires before the move: %v (%s)", ticks(fires), checkExact(fires))
		}
		for _, f := range fires {
			if f.Runner != "a" || !f.At.Before(moved) {
				t.Fatalf("timer fire %+v after its shard moved to b at %v", f, moved)
			}
		}
		if a.Status().Timers != 0 || b2.Status().Timers != 0 {
			t.Fatalf("timers left: a %d, b %d; want none", a.Status().Timers, b2.Status().Timers)
		}
	})
}

// TestTimerAndReminderCallsNeedTheEntitysContext: outside a handler (or
// with another kind's context) timers and reminders are ErrNoEntity; tick
// handlers cannot be asked or told by senders; bad names, periods and
// payloads are ErrInvalidTimer.
func TestTimerAndReminderCallsNeedTheEntitysContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4}, env.kind)
		ctx := context.Background()
		if err := env.ring.After(ctx, "t", time.Second, ""); !errors.Is(err, entity.ErrNoEntity) {
			t.Errorf("After(background) = %v, want ErrNoEntity", err)
		}
		if err := env.remind.Register(ctx, "r", entity.Schedule{Period: time.Minute}, ""); !errors.Is(err, entity.ErrNoEntity) {
			t.Errorf("Register(background) = %v, want ErrNoEntity", err)
		}
		if _, err := entity.StopTimer(ctx, "t"); !errors.Is(err, entity.ErrNoEntity) {
			t.Errorf("StopTimer(background) = %v, want ErrNoEntity", err)
		}
		h, _ := env.kind.Handler("ring")
		if _, err := r.Send(t.Context(), entity.Call{Kind: env.kind, Handler: h, Entity: "x", Req: entity.TimerTick[string]{}}); !errors.Is(err, entity.ErrUnknownMethod) {
			t.Errorf("Send(a timer handler) = %v, want ErrUnknownMethod", err)
		}
		for _, bad := range []armReq{
			{Name: "", Timer: true, Delay: time.Second},
			{Name: string(make([]byte, entity.MaxTimerName+1)), Timer: true, Delay: time.Second},
			{Name: "ctl\x01", Timer: true, Delay: time.Second},
			{Name: "neg", Timer: true, Period: -time.Second},
			{Name: "fast", Period: 500 * time.Millisecond},
			{Name: "oneshot-no-first"},
			{Name: "far", First: time.Now().Add(200 * 365 * 24 * time.Hour), Period: time.Hour},
			{Name: "big", Period: time.Minute, Payload: string(make([]byte, entity.MaxReminderPayload))},
		} {
			_, err := env.arm.Ask(t.Context(), r, "x", bad)
			var re *runner.RemoteError
			if !errors.Is(err, entity.ErrInvalidTimer) && !(errors.As(err, &re) && errors.Is(err, entity.ErrInvalidTimer)) {
				t.Errorf("arm(%q) = %v, want ErrInvalidTimer", bad.Name, err)
			}
		}
		if _, err := env.disarm.Ask(t.Context(), r, "x", "never"); !errors.Is(err, entity.ErrNoReminder) {
			t.Errorf("disarm(unknown) = %v, want ErrNoReminder", err)
		}
	})
}
