package runner

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/shardhost/shardhost/sharding"
)

// ownershipLog counts the ownership changes of this runner, as published
// on its event stream, until the control loop's next round logs them in
// one INFO line: takeovers and handoffs are visible at INFO without a line
// per shard.
type ownershipLog struct {
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

// noteEvent counts ev (the hub calls it for every event, under the hub's
// lock; it must not block or take r.mu).
func (r *Runner) noteEvent(ev Event) {
	l := &r.ownLog
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
			if e.To == r.cfg.ID {
				l.handedIn++
			} else if e.From == r.cfg.ID {
				l.handedOff++
			}
		}
	}
}

// logOwnershipChanges logs, at INFO, what changed since the last round, if
// anything: one line per control round. Called by the control loop at the
// end of each round, without r.mu.
func (r *Runner) logOwnershipChanges() {
	l := &r.ownLog
	l.mu.Lock()
	c := l.ownershipCounts
	l.ownershipCounts = ownershipCounts{}
	l.mu.Unlock()
	if c == (ownershipCounts{}) {
		return
	}
	r.log.Info("shard ownership changed", "acquired", c.acquired, "by_handoff", c.handedIn,
		"released", c.released, "handed_off", c.handedOff, "lost", c.lost, "owned", r.ownedCount())
}

// signalLogEvery is how often the failures of one signal are logged at
// WARN; the ones in between are counted in the next line (suppressed).
const signalLogEvery = 10 * time.Second

// signalLog rate-limits the WARN lines of failed signal handlers, per kind
// and signal.
type signalLog struct {
	mu   sync.Mutex
	last map[[2]string]*signalLogEntry
}

type signalLogEntry struct {
	at         time.Time
	suppressed int
}

// signalFailed reports a signal handler's error: counted
// (sharding.signal_failures) and logged at WARN, at most once per
// signalLogEvery per kind and signal with the count of those not logged.
func (r *Runner) signalFailed(kind, method string, shard sharding.ShardID, err error) {
	r.met.signalFailures.Add(context.Background(), 1, r.met.attrs,
		metric.WithAttributes(attribute.String("kind", kind), attribute.String("method", method)))
	now := time.Now()
	l := &r.sigLog
	l.mu.Lock()
	if l.last == nil {
		l.last = make(map[[2]string]*signalLogEntry)
	}
	e := l.last[[2]string{kind, method}]
	if e == nil {
		e = &signalLogEntry{}
		l.last[[2]string{kind, method}] = e
	}
	if !e.at.IsZero() && now.Sub(e.at) < signalLogEvery {
		e.suppressed++
		l.mu.Unlock()
		return
	}
	n := e.suppressed
	e.at, e.suppressed = now, 0
	l.mu.Unlock()
	r.log.Warn("signal handler failed", "kind", kind, "method", method, "shard", shard, "err", err,
		"suppressed", n, "every", signalLogEvery)
}
