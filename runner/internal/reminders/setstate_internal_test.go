package reminders

import (
	"strings"
	"testing"

	"github.com/shardhost/shardhost/internal/machinetest"
)

func init() { CheckInvariants = true }

// name is a state in the notation of setTable: N not loaded (its read
// pending), F loaded with no final progress to rewrite, T with the
// predecessor's, O with ours, X stopped (.l: it was loaded); then .p
// paused by a cutover, .w the rewrite in flight, .f the rewrite fenced,
// .r a reload pending.
func (s setState) name() string {
	var b strings.Builder
	switch {
	case s.stopped:
		b.WriteString("X")
		if s.loaded {
			b.WriteString(".l")
		}
	case !s.loaded:
		b.WriteString("N")
	default:
		b.WriteByte("FTO"[s.final])
	}
	for _, f := range []struct {
		on bool
		s  string
	}{{s.paused, ".p"}, {s.rewriting, ".w"}, {s.fenced, ".f"}, {s.reread, ".r"}} {
		if f.on {
			b.WriteString(f.s)
		}
	}
	return b.String()
}

// setTable is every legal transition from every reachable state of a
// shard's reminder set: from, then event to; ... Any other event is
// refused. A failed read changes nothing (the read stays pending).
const setTable = `
N      load F; load-final T; pause N.p; stop X
N.p    load F.p; load-final T.p; resume N; stop X
F      pause F.p; reload F.r; stop X.l
F.p    resume F; progress O.p; reload F.p.r; stop X.l
F.r    pause F.p.r; reread F; reread-final T; stop X.l
F.p.r  resume F.r; progress O.p.r; stop X.l
T      pause T.p; rewrite T.w; reload T.r; stop X.l
T.p    resume T; progress O.p; reload T.p.r; stop X.l
T.w    pause T.p.w; rewritten F; rewrite-failed T; rewrite-fenced T.f; stop X.l.w
T.p.w  resume T.w; rewritten F.p; rewrite-failed T.p; rewrite-fenced T.p.f; stop X.l.w
T.f    pause T.p.f; reload T.r; stop X.l
T.p.f  resume T.f; progress O.p.f; reload T.p.r; stop X.l
T.r    pause T.p.r; reread T; reread-final T; stop X.l
T.p.r  resume T.r; progress O.p.r; stop X.l
O      pause O.p; rewrite O.w; reload O.r; stop X.l
O.p    resume O; progress O.p; reload O.p.r; stop X.l
O.w    pause O.p.w; rewritten F; rewrite-failed O; rewrite-fenced O.f; stop X.l.w
O.p.w  resume O.w; rewritten F.p; rewrite-failed O.p; rewrite-fenced O.p.f; stop X.l.w
O.f    pause O.p.f; reload O.r; stop X.l
O.p.f  resume O.f; progress O.p.f; reload O.p.r; stop X.l
O.r    pause O.p.r; reread O; reread-final O; stop X.l
O.p.r  resume O.r; progress O.p.r; stop X.l
X
X.l    progress X.l
X.l.w  rewritten X.l; rewrite-failed X.l; rewrite-fenced X.l
`

// setMachine is the set's state machine, for machinetest.
var setMachine = machinetest.Machine[setState, setEvent]{
	Events: numSetEvents, Next: setState.next, Check: setState.check,
	Name: setState.name, Event: setEvent.String,
}

// TestReminderSetAcceptsOnlyItsTransitions: every state a set can reach
// — through any order of loads, cutovers (pause, progress, resume),
// rewrites that succeed, fail (or whose outcome is unknown) or are
// refused by the lock, reloads and stops — keeps the invariants, and
// accepts exactly the transitions of setTable.
func TestReminderSetAcceptsOnlyItsTransitions(t *testing.T) {
	machinetest.Table(t, setMachine, setTable)
}

// resolving returns the events that end a state that cannot fire, once
// the store answers and the runner finishes what it began: the answer to
// the set's pending call (a read: whatever progress it finds; a rewrite:
// taken, or refused by the lock), the start of the rewrite its state
// asks for, the end of a cutover (given up or done), the runner stopping
// a set whose lock moved (fenced).
func (s setState) resolving() []setEvent {
	var evs []setEvent
	switch {
	case s.stopped:
		return nil
	case s.rewriting:
		evs = append(evs, onRewritten, onRewriteFenced)
	case s.fenced:
		evs = append(evs, onStop)
	}
	if s.paused {
		evs = append(evs, onResume, onStop)
	}
	switch s.work() {
	case workRead:
		if s.loaded {
			evs = append(evs, onReread, onRereadFinal)
		} else {
			evs = append(evs, onLoad, onLoadFinal)
		}
	case workRewrite:
		evs = append(evs, onRewrite)
	}
	return evs
}

// storeAnswer reports whether ev is the store's answer to a set's call.
func storeAnswer(ev setEvent) bool {
	switch ev {
	case onLoad, onLoadFinal, onReread, onRereadFinal, onRewritten, onRewriteFenced:
		return true
	}
	return false
}

// TestEveryReminderSetStateLeadsBackToFiring is the liveness rule of the
// package documentation, by construction: from every reachable state,
// the resolving events alone (no new fault, no new cutover) reach a state
// that fires or is stopped, whichever of them comes, without a cycle and
// after at most two store calls (a read, then a rewrite: what the
// package documentation's bound counts); every state that neither fires
// nor is stopped,
// paused or fenced asks for a store call or has one in flight (so the
// set is queued for it: toLocked); and a call that fails leaves the
// state asking for the same call (it is tried again).
func TestEveryReminderSetStateLeadsBackToFiring(t *testing.T) {
	var depth func(s setState, path []string) int
	depth = func(s setState, path []string) int {
		if s.fires() || s.stopped {
			return 0
		}
		evs := s.resolving()
		if len(evs) == 0 {
			t.Errorf("%s: no way out of %s, which cannot fire", strings.Join(path, " "), s.name())
			return 0
		}
		if len(path) > 20 {
			t.Fatalf("%s: a cycle", strings.Join(path, " "))
		}
		most := 0
		for _, ev := range evs {
			to, ok := s.next(ev)
			if !ok {
				t.Errorf("%s: %s refuses its resolving event %s", strings.Join(path, " "), s.name(), ev)
				continue
			}
			calls := depth(to, append(path, s.name(), ev.String()))
			if storeAnswer(ev) {
				calls++
			}
			most = max(most, calls)
		}
		return most
	}
	setMachine.Walk(func(s setState) {
		if calls := depth(s, nil); calls > 2 {
			t.Errorf("%s fires again only after %d store calls, want at most 2", s.name(), calls)
		}
		if !s.fires() && !s.stopped && !s.paused && !s.fenced && s.work() == workNone && !s.rewriting {
			t.Errorf("%s cannot fire and asks for no store call", s.name())
		}
		if s.rewriting {
			if to, _ := s.next(onRewriteFailed); !to.paused && !to.stopped && to.work() != workRewrite {
				t.Errorf("%s: a failed rewrite leads to %s, which does not rewrite again", s.name(), to.name())
			}
		}
	})
}

func TestReminderSetCheckNamesEachBrokenInvariant(t *testing.T) {
	for _, s := range []setState{
		{final: finalOurs},
		{rewriting: true},
		{loaded: true, fenced: true},
		{loaded: true, final: finalTheirs, rewriting: true, fenced: true},
		{loaded: true, final: finalTheirs, reread: true, rewriting: true},
		{stopped: true, paused: true},
		{stopped: true, loaded: true, final: finalOurs},
		{reread: true},
	} {
		if s.check() == nil {
			t.Errorf("state %+v passes check", s)
		}
	}
}

// The set's state is assigned in toLocked only, outside the tests: one
// writer for the state machine (and with it the scheduling, the watchdog's
// clock and the work queue, which toLocked keeps in line).
func TestOnlyToLockedWritesTheSetState(t *testing.T) {
	machinetest.OneWriter(t, ".", "st", "toLocked")
}
