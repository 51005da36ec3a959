package runner

import (
	"context"
	"errors"
	"log/slog"
	"sync"
)

// ownershipLog counts the ownership changes of this runner, as published
// on its event stream, until the control loop's next round logs them in
// one INFO line: takeovers and handoffs are visible at INFO without a line
// per shard.
type ownershipLog struct {
	self string // this runner's ID
	log  *slog.Logger
	met  *metrics

	mu sync.Mutex
	ownershipCounts
}

type ownershipCounts struct {
	acquired  int // ShardAcquired
	handedIn  int // of which by handoff (cutover to this runner)
	released  int // ShardReleased (planned)
	handedOff int // of which by handoff (cutover from this runner)
	lost      int // ShardLost other than by a detach (logged on its own)
}

// note counts ev (the hub calls it for every event, under the hub's lock;
// it must not block or take Runner.mu). It also counts the events that are
// metrics of their own (sharding.reminders_unrecorded).
func (l *ownershipLog) note(ev Event) {
	if _, ok := ev.(RemindersUnrecorded); ok {
		l.met.remindersUnrecorded.Add(context.Background(), 1, l.met.attrs)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch e := ev.(type) {
	case ShardAcquired:
		l.acquired++
	case ShardReleased:
		l.released++
	case ShardLost:
		if !errors.Is(e.Cause, ErrDetached) && !errors.Is(e.Cause, ErrShutdown) {
			l.lost++
		}
	case HandoffPhase:
		if e.Phase == PhaseCutover {
			if e.To == l.self {
				l.handedIn++
			} else if e.From == l.self {
				l.handedOff++
			}
		}
	}
}

// flush logs, at INFO, what changed since the last round, if anything,
// with the count owned reports: one line per control round. Called by the
// control loop at the end of each round, without Runner.mu (owned takes it).
func (l *ownershipLog) flush(owned func() int) {
	l.mu.Lock()
	c := l.ownershipCounts
	l.ownershipCounts = ownershipCounts{}
	l.mu.Unlock()
	if c == (ownershipCounts{}) {
		return
	}
	l.log.Info("shard ownership changed", "acquired", c.acquired, "by_handoff", c.handedIn,
		"released", c.released, "handed_off", c.handedOff, "lost", c.lost, "owned", owned())
}
