package runner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

// remindersLivenessBound is the bound of the reminders' liveness rule
// (runner/internal/reminders, package documentation) on the in-memory
// store, whose calls answer at once once healed: a set's pending store
// call is made again at most a second after it failed.
const remindersLivenessBound = time.Second

// TestRemindersFireWithinTheirBoundAfterLateStateWritesStop: a runner
// whose shard-state writes fail and land late (etcd requests left in
// flight by a timeout) while it hands a shard off gives the cutover up —
// its final progress record may be in the store, or land later — and
// keeps the shard (the new owner left). The shard's reminders cannot fire
// until that record is rewritten as not final. However long the writes
// kept failing, once the store takes them again every reminder of the
// shard fires within one period plus the liveness bound, and every tick is
// accounted for exactly once (the ticks due while it could not fire are
// one fire with their count in Missed; none is redelivered: no unplanned
// loss came). The
// heal instants are spread over five seconds: the back-off the rewrite
// once waited after a few failures reached five seconds, so some heal
// instant fell just after one of its attempts.
func TestRemindersFireWithinTheirBoundAfterLateStateWritesStop(t *testing.T) {
	for _, failing := range []time.Duration{3 * time.Second, 4 * time.Second, 5 * time.Second, 6 * time.Second, 7 * time.Second} {
		t.Run(fmt.Sprint(failing), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { checkRemindersAfterLateWrites(t, failing) })
		})
	}
}

func checkRemindersAfterLateWrites(t *testing.T, failing time.Duration) {
	const period = time.Second
	env := newAlarmEnv()
	rc := newReminderCluster(t, env, 2)
	a := rc.start("a")
	rc.converge(a)
	ctx := t.Context()
	const n = 8
	for i := range n {
		if _, err := env.arm.Ask(ctx, a, fmt.Sprint("e", i), armReq{Name: "every", Period: period}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	for _, op := range []memory.Op{memory.OpShardState, memory.OpCheckpoint} {
		a.store.LateWrites(op, 700*time.Millisecond)
	}
	b := rc.start("b") // assigned one shard: a's cutover cannot record its progress
	var moving sharding.ShardID
	waitFor(t, 10*time.Second, "a cutover of a given up for its reminder progress", func() bool {
		for _, ev := range rc.rec.all() {
			if h, ok := ev.(runner.HandoffPhase); ok && h.From == "a" && h.Phase == runner.PhaseAborted && strings.Contains(h.Detail, "progress") {
				moving = h.Shard
				return true
			}
		}
		return false
	})
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if err := b.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	rc.converge(a)
	time.Sleep(failing)
	healed := time.Now()
	for _, op := range []memory.Op{memory.OpShardState, memory.OpCheckpoint} {
		a.store.LateWrites(op, 0)
	}
	time.Sleep(period + remindersLivenessBound + time.Second)
	checked := 0
	for i := range n {
		id := fmt.Sprint("e", i)
		if sharding.ShardOf(id, 2) != moving {
			continue
		}
		checked++
		every := env.firesOf(id, "every")
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
		case first.Sub(healed) > period+remindersLivenessBound:
			t.Errorf("%s fired again %v after the store took writes again, want within one period plus %v", id, first.Sub(healed), remindersLivenessBound)
		}
	}
	if checked == 0 {
		t.Fatalf("no reminder on shard %d", moving)
	}
	checkFiresByOwners(t, rc.rec.all(), env.allFires())
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
