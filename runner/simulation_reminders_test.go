package runner_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The simulation's reminders: every entity registers, before the faults
// begin, a periodic reminder (1 s) and a one-shot reminder due at a seeded
// time of the run. Their ticks are handlers like the others (the single
// writer check sees them) and are recorded; after the run the checks
// demand, by the runners' own events:
//
//   - every tick fired on the owner of its shard at the epoch it ran
//     under, inside that ownership (so never after a detach, a loss or a
//     release);
//   - the ticks of a reminder never go backwards; a tick not marked
//     Redelivered follows the previous one exactly (its Missed count
//     explains any gap); a Redelivered tick covers every tick after the
//     previous fire (at least once), and only follows an unplanned loss of
//     the shard (a crash, a detach, a lost lock, an interrupted release,
//     a release that could not record its progress: RemindersUnrecorded)
//     — across planned moves nothing fires twice and nothing is lost;
//   - a one-shot reminder due during the run fires, once unless an
//     unplanned loss came between;
//   - after the cluster converged, every periodic reminder fires again
//     (firing resumes) once its entity is free: a tick is delivered
//     through the mailbox, one message at a time with the entity's other
//     messages, so it waits for the handler running (a stubborn one
//     ignores its context for up to 6 s, and a message forwarded to
//     another runner may start until its ask's deadline).
type simReminders struct {
	mu    sync.Mutex
	fires map[string][]simFire // by entity/name, in fire order
	arm   *entity.MethodRef[simCounter, simArm, bool]
	tick  *entity.ReminderRef[simCounter, string]
	once  map[string]time.Time // one-shot due times, by entity
	start time.Time

	freedAt map[string]time.Time // by entity: when its last handler other than a tick returned
}

type simArm struct {
	Name   string
	First  time.Time
	Period time.Duration
}

type simFire struct {
	runner      string
	shard       sharding.ShardID
	epoch       storage.Epoch
	tick        uint64
	missed      uint64
	redelivered bool
	at          time.Time
}

// simRemindersPeriod is the period of the simulation's periodic reminders.
const simRemindersPeriod = time.Second

func newSimReminders(k *entity.Kind[simCounter]) *simReminders {
	return &simReminders{
		fires: map[string][]simFire{}, once: map[string]time.Time{}, freedAt: map[string]time.Time{},
		arm:  entity.Method(k, "arm", (*simCounter).Arm),
		tick: entity.Reminder(k, "tick", (*simCounter).Tick),
	}
}

func (c *simCounter) Arm(ctx context.Context, a simArm) (bool, error) {
	return true, c.w.rem.tick.Register(ctx, a.Name, entity.Schedule{First: a.First, Period: a.Period}, a.Name)
}

func (c *simCounter) Tick(ctx context.Context, t entity.ReminderTick[string]) error {
	info, _ := runner.ShardInfoFrom(ctx)
	exec := c.w.begin(info, false)
	defer c.w.end(exec)
	rem := c.w.rem
	rem.mu.Lock()
	key := c.id + "/" + t.Name
	rem.fires[key] = append(rem.fires[key], simFire{runner: info.Runner, shard: info.Shard, epoch: info.Epoch,
		tick: t.Tick, missed: t.Missed, redelivered: t.Redelivered, at: time.Now()})
	rem.mu.Unlock()
	return nil
}

// handled records that a handler of entity id other than a tick returned.
func (r *simReminders) handled(id string) {
	r.mu.Lock()
	r.freedAt[id] = time.Now()
	r.mu.Unlock()
}

// armAll registers the reminders of every entity through the gateway,
// before the faults (retrying what fails while the cluster starts).
func (s *simRun) armAll(gw *simNode) {
	rem := s.w.rem
	rem.start = time.Now()
	rng := s.rng
	for i := range simEntities {
		id := fmt.Sprintf("e%d", i)
		once := rem.start.Add(time.Second + time.Duration(rng.IntN(int(simDuration/time.Millisecond)))*time.Millisecond)
		rem.once[id] = once
		for _, a := range []simArm{{Name: "p", First: rem.start.Add(simRemindersPeriod), Period: simRemindersPeriod}, {Name: "o", First: once}} {
			for attempt := 0; ; attempt++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := rem.arm.Ask(ctx, gw.r, id, a)
				cancel()
				if err == nil {
					break
				}
				if attempt == 20 {
					s.w.violate("arming reminder %s/%s failed before any fault: %v", id, a.Name, err)
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// unplannedLosses returns, per shard, when the runners' events say it was
// lost unplanned: released with entities interrupted, lost, or released
// without its reminders' progress recorded.
func (s *simRun) unplannedLosses() map[sharding.ShardID][]time.Time {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	unplanned := map[sharding.ShardID][]time.Time{}
	for _, ev := range s.evs {
		switch e := ev.(type) {
		case runner.ShardReleased:
			if e.Interrupted > 0 {
				unplanned[e.Shard] = append(unplanned[e.Shard], e.Time)
			}
		case runner.ShardLost:
			unplanned[e.Shard] = append(unplanned[e.Shard], e.Time)
		case runner.RemindersUnrecorded:
			unplanned[e.Shard] = append(unplanned[e.Shard], e.Time)
		}
	}
	return unplanned
}

// checkReminders applies the reminder rules above to the recorded fires
// and the runners' events, observed until observed.
func (s *simRun) checkReminders(converged, observed time.Time) {
	rem := s.w.rem
	from, until := s.ownerships()
	unplanned := s.unplannedLosses()
	lossBetween := func(shard sharding.ShardID, a, b time.Time) bool {
		return slices.ContainsFunc(unplanned[shard], func(t time.Time) bool { return !t.Before(a) && !t.After(b) })
	}
	rem.mu.Lock()
	defer rem.mu.Unlock()
	keys := make([]string, 0, len(rem.fires))
	for k := range rem.fires {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		fs := rem.fires[key]
		s.stats.reminderFires += len(fs)
		for i, f := range fs {
			k := simOwner{f.runner, f.shard, f.epoch}
			start, owned := from[k]
			end, ended := until[k]
			if !owned || f.at.Before(start) || (ended && f.at.After(end)) {
				s.w.violate("reminder %s tick %d fired on %s under epoch %d of shard %d at %v, outside that ownership", key, f.tick, f.runner, f.epoch, f.shard, f.at.Sub(simStart))
			}
			if f.redelivered {
				s.stats.reminderRedelivered++
			}
			if i == 0 {
				if !strings.HasSuffix(key, "/o") && f.tick != 1 && !f.redelivered && f.tick != f.missed+1 {
					s.w.violate("reminder %s: first fire is tick %d (missed %d), not redelivered", key, f.tick, f.missed)
				}
				continue
			}
			p := fs[i-1]
			switch {
			case f.tick < p.tick:
				s.w.violate("reminder %s went backwards: tick %d on %s after tick %d on %s", key, f.tick, f.runner, p.tick, p.runner)
			case !f.redelivered && f.tick != p.tick+f.missed+1:
				s.w.violate("reminder %s: tick %d (missed %d) on %s at %v after tick %d on %s at %v: a tick lost or fired twice without an unplanned loss",
					key, f.tick, f.missed, f.runner, f.at.Sub(simStart), p.tick, p.runner, p.at.Sub(simStart))
			case f.redelivered && f.tick-f.missed > p.tick+1:
				s.w.violate("reminder %s: redelivered tick %d (missed %d) leaves ticks after %d unfired", key, f.tick, f.missed, p.tick)
			case f.redelivered && !lossBetween(f.shard, p.at, f.at):
				s.w.violate("reminder %s: tick %d redelivered on %s at %v after tick %d on %s at %v with no unplanned loss of shard %d between",
					key, f.tick, f.runner, f.at.Sub(simStart), p.tick, p.runner, p.at.Sub(simStart), f.shard)
			}
		}
	}
	for i := range simEntities {
		id := fmt.Sprintf("e%d", i)
		free := converged
		if t := rem.freedAt[id]; t.After(free) {
			free = t
		}
		// Busy until the end of the observation (a message that started
		// after the stubborn handlers returned): nothing to judge.
		if observed.Sub(free) >= simRemindersPeriod+time.Second &&
			!slices.ContainsFunc(rem.fires[id+"/p"], func(f simFire) bool { return f.at.After(converged) && !f.at.Before(free) }) {
			s.w.violate("reminder %s/p did not fire after the cluster converged at %v and the entity's last handler returned at %v",
				id, converged.Sub(simStart), free.Sub(simStart))
		}
		o := rem.fires[id+"/o"]
		due := rem.once[id]
		switch {
		case len(o) == 0:
			s.w.violate("one-shot reminder %s/o due at %v never fired", id, due.Sub(simStart))
		case len(o) > 1 && !lossBetween(o[0].shard, o[0].at, o[len(o)-1].at):
			s.w.violate("one-shot reminder %s/o fired %d times with no unplanned loss between", id, len(o))
		case o[0].at.Before(due):
			s.w.violate("one-shot reminder %s/o fired at %v, before it was due at %v", id, o[0].at.Sub(simStart), due.Sub(simStart))
		}
	}
}
