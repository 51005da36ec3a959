package runner_test

import (
	"context"
	"fmt"
	"github.com/shardhost/shardhost/internal/testenv"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

// remindersLivenessBound is the bound of the reminders' liveness rule
// (runner/internal/reminders, package documentation) on the in-memory
// store, whose calls answer at once once healed: a set's pending store
// call is made again at most a second after it failed.
const remindersLivenessBound = time.Second

// stuckReminders is a runner a whose shard-state writes fail and land
// late (etcd requests left in flight by a timeout) while it hands a shard
// off: it gives the cutover up — its final progress record may be in the
// store, or land later — and keeps the shard (the new owner left). The
// shard's reminders cannot fire until that record is rewritten as not
// final, which fails until heal.
type stuckReminders struct {
	env    *alarmEnv
	rc     *reminderCluster
	a      *started
	moving sharding.ShardID // the shard whose cutover was given up
	ids    []string         // its entities, each with a reminder every second
	stuck  time.Time        // when its cutover was given up
}

const stuckPeriod = time.Second

func newStuckReminders(t *testing.T, cfg runner.Config) *stuckReminders {
	sr := &stuckReminders{env: newAlarmEnv()}
	sr.rc = newReminderCluster(t, sr.env, 2)
	acfg := sr.rc.cfg
	sr.rc.cfg.MeterProvider, sr.rc.cfg.Logger = cfg.MeterProvider, cfg.Logger
	sr.a = sr.rc.start("a")
	sr.rc.cfg = acfg
	sr.rc.converge(sr.a)
	ctx := t.Context()
	var all []string
	for i := range 8 {
		id := fmt.Sprint("e", i)
		all = append(all, id)
		if _, err := sr.env.arm.Ask(ctx, sr.a, id, armReq{Name: "every", Period: stuckPeriod}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	sr.fail(700 * time.Millisecond)
	b := sr.rc.start("b") // assigned one shard: a's cutover cannot record its progress
	waitFor(t, 10*time.Second, "a cutover of a given up for its reminder progress", func() bool {
		for _, ev := range sr.rc.rec.all() {
			if h, ok := ev.(runner.HandoffPhase); ok && h.From == "a" && h.Phase == runner.PhaseAborted && strings.Contains(h.Detail, "progress") {
				sr.moving = h.Shard
				return true
			}
		}
		return false
	})
	sr.stuck = time.Now()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := b.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	sr.rc.converge(sr.a)
	for _, id := range all {
		if sharding.ShardOf(id, 2) == sr.moving {
			sr.ids = append(sr.ids, id)
		}
	}
	if len(sr.ids) == 0 {
		t.Fatalf("no reminder on shard %d", sr.moving)
	}
	return sr
}

// fail makes a's shard-state and checkpoint writes fail and land late by
// d (0: heals).
func (sr *stuckReminders) fail(d time.Duration) {
	for _, op := range []memory.Op{memory.OpShardState, memory.OpCheckpoint} {
		sr.a.store.LateWrites(op, d)
	}
}

// checkFiredSoonAfter fails t unless every reminder of the shard fired
// within one period plus the liveness bound after healed, and every tick
// is accounted for exactly once (the ticks due while it could not fire
// are one fire with their count in Missed; none is redelivered: no
// unplanned loss came).
func (sr *stuckReminders) checkFiredSoonAfter(t *testing.T, healed time.Time) {
	t.Helper()
	for _, id := range sr.ids {
		every := sr.env.firesOf(id, "every")
		if msg := checkAccounted(every); msg != "" {
			t.Errorf("%s: %s", id, msg)
		}
		var first time.Time
		for _, f := range every {
			if f.At.After(healed) {
				first = f.At
				break
			}
		}
		switch {
		case first.IsZero():
			t.Errorf("%s did not fire after the store took writes again", id)
		case first.Sub(healed) > stuckPeriod+remindersLivenessBound:
			t.Errorf("%s fired again %v after the store took writes again, want within one period plus %v", id, first.Sub(healed), remindersLivenessBound)
		}
	}
	checkFiresByOwners(t, sr.rc.rec.all(), sr.env.allFires())
}

// TestRemindersFireWithinTheirBoundAfterLateStateWritesStop: however long
// the writes of a runner kept failing and landing late after it gave up a
// cutover (stuckReminders), once the store takes them again every
// reminder of the shard it kept fires within one period plus the liveness
// bound, and every tick is accounted for exactly once. The heal instants
// are spread over five seconds: the back-off the rewrite once waited
// after a few failures reached five seconds, so some heal instant fell
// just after one of its attempts.
func TestRemindersFireWithinTheirBoundAfterLateStateWritesStop(t *testing.T) {
	for _, failing := range []time.Duration{3 * time.Second, 4 * time.Second, 5 * time.Second, 6 * time.Second, 7 * time.Second} {
		t.Run(fmt.Sprint(failing), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sr := newStuckReminders(t, runner.Config{})
				time.Sleep(failing)
				healed := time.Now()
				sr.fail(0)
				time.Sleep(stuckPeriod + remindersLivenessBound + time.Second)
				sr.checkFiredSoonAfter(t, healed)
			})
		})
	}
}

// TestRemindersThatCannotFireFor30sAreReloadedLoggedAndCounted: a shard's
// reminders that cannot fire for 30 s although the shard is owned and not
// moving (here: its writes keep failing, so its final progress cannot be
// rewritten) are reloaded from the store, logged at WARN with the shard and
// the cause, and counted in sharding.reminder_reloads — not before 30 s,
// and again 30 s after each reload while they still cannot fire; once the store takes
// writes again they fire within their bound.
func TestRemindersThatCannotFireFor30sAreReloadedLoggedAndCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &testenv.SyncBuffer{}
		rd := sdkmetric.NewManualReader()
		sr := newStuckReminders(t, runner.Config{
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)),
			Logger:        slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		})
		line := regexp.MustCompile(`level=WARN msg="reminders: a shard's reminders cannot fire; reloading them from the store" runner=a shard=` +
			fmt.Sprint(sr.moving) + ` epoch=\d+ cause=rewrite for=\S+ err=".*unavailable`)
		reloads := func() (float64, int) {
			return readMetrics(t, rd)["sharding.reminder_reloads"], len(line.FindAllString(logs.String(), -1))
		}
		time.Sleep(25 * time.Second)
		if n, logged := reloads(); n != 0 || logged != 0 {
			t.Fatalf("%v reloads counted, %d logged, %v after the reminders stopped firing: want none before 30 s", n, logged, time.Since(sr.stuck))
		}
		// The watchdog looks every 5 s: a reload 30-35 s after they
		// stopped firing, the next 30-35 s after it.
		for _, c := range []struct {
			at   time.Duration
			want int
		}{{40 * time.Second, 1}, {75 * time.Second, 2}} {
			time.Sleep(time.Until(sr.stuck.Add(c.at)))
			if n, logged := reloads(); n != float64(c.want) || logged != c.want {
				t.Fatalf("%v reloads counted, %d logged, %v after the reminders stopped firing: want %d; log:\n%s",
					n, logged, time.Since(sr.stuck), c.want, logs.String())
			}
		}
		healed := time.Now()
		sr.fail(0)
		time.Sleep(stuckPeriod + remindersLivenessBound + time.Second)
		sr.checkFiredSoonAfter(t, healed)
		if n, _ := reloads(); n != 2 {
			t.Errorf("%v reloads after the reminders fired again, want 2", n)
		}
	})
}

// checkAccounted reports a problem with a fire sequence in which every tick
// must be accounted for exactly once: each fire follows the previous one
// by its Missed count plus one, from tick 1, and none is a redelivery.
func checkAccounted(fs []alarmFire) string {
	prev := uint64(0)
	for i, f := range fs {
		if f.Tick != prev+f.Missed+1 || f.Redelivered {
			return fmt.Sprintf("fire %d is tick %d (missed %d, redelivered %v) on %s after tick %d; ticks %v", i, f.Tick, f.Missed, f.Redelivered, f.Runner, prev, ticks(fs))
		}
		prev = f.Tick
	}
	return ""
}
