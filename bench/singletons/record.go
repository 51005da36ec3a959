package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
)

// What the bench runs: singletons (singleName(i), every runner registers
// the same body) and entities of a remembered kind (twin). Both record
// their own lives — a singleton's start and return, an entity's Activate —
// with the wall clock, in the process they run in: comparable between the
// harness and its child processes (one machine, one clock).

// sink receives the records (the harness's lifeLog; in a child process,
// lines on standard output).
type sink interface {
	singletonStarted(name, runner string, epoch storage.Epoch, at time.Time) int
	singletonReturned(run int, at time.Time)
	activated(a activation)
	released(a activation)
}

// active is where this process's singletons and entities record (one
// scenario runs at a time).
var active struct {
	mu sync.Mutex
	s  sink
}

func setSink(s sink) {
	active.mu.Lock()
	active.s = s
	active.mu.Unlock()
}

func currentSink() sink {
	active.mu.Lock()
	defer active.mu.Unlock()
	return active.s
}

func singleName(i int) string { return fmt.Sprintf("single-%02d", i) }

// singletonBody is every singleton's body: it records its start, runs
// until its context ends, records its return.
func singletonBody(ctx context.Context, w runner.Work) error {
	s := currentSink()
	run := s.singletonStarted(w.Name, w.Runner, w.Epoch, time.Now())
	<-ctx.Done()
	s.singletonReturned(run, time.Now())
	return nil
}

// twin is an always-on entity (a device twin, a stream consumer): a
// remembered kind.
type twin struct{ id string }

type none struct{}

var (
	twinKind = entity.NewKind("twin", func(id string) *twin { return &twin{id: id} }, entity.Remembered())
	ping     = entity.Method(twinKind, "ping", func(*twin, context.Context, none) (none, error) { return none{}, nil })
)

// Activate records the activation.
func (t *twin) Activate(ctx context.Context, info entity.ActivateInfo) error {
	si, _ := runner.ShardInfoFrom(ctx)
	currentSink().activated(activation{ID: t.id, Runner: si.Runner, Epoch: info.Epoch, Reason: info.Reason, At: time.Now()})
	return nil
}

// Release records the end of the instance (a planned move, a shutdown).
func (t *twin) Release(ctx context.Context, info entity.ReleaseInfo) error {
	si, _ := runner.ShardInfoFrom(ctx)
	currentSink().released(activation{ID: t.id, Runner: si.Runner, Epoch: info.Epoch, At: time.Now()})
	return nil
}

// busy is an ordinary kind whose work handler runs for a while: the load
// of the handover scenario's -busy callers (a drain lets running handlers
// finish).
type busy struct{}

var (
	busyKind = entity.NewKind("busy", func(string) *busy { return &busy{} })
	work     = entity.Method(busyKind, "work", func(_ *busy, ctx context.Context, d time.Duration) (none, error) {
		si, _ := runner.ShardInfoFrom(ctx)
		h := handlerRun{runner: si.Runner, shard: int(si.Shard), start: time.Now()}
		defer func() {
			h.end = time.Now()
			if l, ok := currentSink().(*lifeLog); ok {
				l.handled(h)
			}
		}()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return none{}, nil
		case <-ctx.Done(): // the detach instant, a crash
			return none{}, context.Cause(ctx)
		}
	})
)

// handlerRun is one run of a busy handler.
type handlerRun struct {
	runner     string
	shard      int
	start, end time.Time
}

// activation is one Activate of a twin.
type activation struct {
	ID     string                `json:"id"`
	Runner string                `json:"runner"`
	Epoch  int64                 `json:"epoch"`
	Reason entity.ActivateReason `json:"reason"`
	At     time.Time             `json:"at"`
}

// singletonRun is one run of a singleton's body.
type singletonRun struct {
	name, runner string
	epoch        storage.Epoch
	start, end   time.Time // end zero while it runs
}

// lifeLog is the harness's record of every singleton run and every
// activation, in this process and (fed from their output) in children.
type lifeLog struct {
	mu   sync.Mutex
	runs []singletonRun
	acts []activation
	rels []activation // Release calls
	work []handlerRun // busy handlers
	// last activation of each entity
	last map[string]activation
}

func newLifeLog() *lifeLog { return &lifeLog{last: map[string]activation{}} }

func (l *lifeLog) singletonStarted(name, runner string, epoch storage.Epoch, at time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = append(l.runs, singletonRun{name: name, runner: runner, epoch: epoch, start: at})
	return len(l.runs) - 1
}

func (l *lifeLog) singletonReturned(run int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs[run].end = at
}

// returnedOn records the return of the run of name on runner at epoch
// (a child's report).
func (l *lifeLog) returnedOn(name, runner string, epoch storage.Epoch, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.runs) - 1; i >= 0; i-- {
		r := &l.runs[i]
		if r.name == name && r.runner == runner && r.epoch == epoch && r.end.IsZero() {
			r.end = at
			return
		}
	}
}

// endRunsOf marks the runs still open on runner as ended at (a killed
// child's singletons stop with the process).
func (l *lifeLog) endRunsOf(runner string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.runs {
		if l.runs[i].runner == runner && l.runs[i].end.IsZero() {
			l.runs[i].end = at
		}
	}
}

func (l *lifeLog) activated(a activation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acts = append(l.acts, a)
	l.last[a.ID] = a
}

func (l *lifeLog) handled(h handlerRun) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.work = append(l.work, h)
}

// handlers returns a copy of the busy handlers' runs.
func (l *lifeLog) handlers() []handlerRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.work)
}

func (l *lifeLog) released(a activation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rels = append(l.rels, a)
}

func (l *lifeLog) activations() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acts)
}

// snapshot returns copies of the runs and activations.
func (l *lifeLog) snapshot() ([]singletonRun, []activation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.runs), slices.Clone(l.acts)
}

// releases returns a copy of the Release records.
func (l *lifeLog) releases() []activation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.rels)
}

// handover is one singleton moving from one instance to the next.
type handover struct {
	name      string
	from, to  singletonRun
	gap       time.Duration // to.start - from.end; negative: they overlapped
	overlap   bool
	stillOpen bool // from had not returned when to started
}

// handovers pairs each run of every singleton with the next one, in start
// order, among the runs that started at or after since.
func handovers(runs []singletonRun, since time.Time) []handover {
	by := map[string][]singletonRun{}
	for _, r := range runs {
		by[r.name] = append(by[r.name], r)
	}
	var out []handover
	for name, rs := range by {
		slices.SortFunc(rs, func(a, b singletonRun) int { return a.start.Compare(b.start) })
		for i := 1; i < len(rs); i++ {
			prev, next := rs[i-1], rs[i]
			if next.start.Before(since) {
				continue
			}
			h := handover{name: name, from: prev, to: next}
			switch {
			case prev.end.IsZero() || prev.end.After(next.start):
				h.overlap, h.stillOpen = true, prev.end.IsZero()
				if !prev.end.IsZero() {
					h.gap = next.start.Sub(prev.end)
				}
			default:
				h.gap = next.start.Sub(prev.end)
			}
			out = append(out, h)
		}
	}
	return out
}

// entityMoves pairs each activation at or after since with the end of
// the entity's previous instance (its Release): the gaps, the activations
// that came while the previous instance had not been released (overlaps:
// on planned moves, without failures, every instance is released before
// the next one starts), and the activations by reason.
func entityMoves(acts, rels []activation, since time.Time) (gaps []time.Duration, overlaps []string, reasons map[entity.ActivateReason]int) {
	type ev struct {
		a   activation
		rel bool
	}
	by := map[string][]ev{}
	for _, a := range acts {
		by[a.ID] = append(by[a.ID], ev{a: a})
	}
	for _, r := range rels {
		by[r.ID] = append(by[r.ID], ev{a: r, rel: true})
	}
	reasons = map[entity.ActivateReason]int{}
	for id, evs := range by {
		slices.SortStableFunc(evs, func(x, y ev) int { return x.a.At.Compare(y.a.At) })
		for i := 1; i < len(evs); i++ {
			cur, prev := evs[i], evs[i-1]
			if cur.rel || cur.a.At.Before(since) {
				continue
			}
			reasons[cur.a.Reason]++
			switch {
			case prev.rel:
				gaps = append(gaps, cur.a.At.Sub(prev.a.At))
			default:
				overlaps = append(overlaps, fmt.Sprintf("%s activated on %s (epoch %d) at %v while its instance on %s (epoch %d, since %v) was not released",
					id, cur.a.Runner, cur.a.Epoch, cur.a.At.Format(time.StampMicro), prev.a.Runner, prev.a.Epoch, prev.a.At.Format(time.StampMicro)))
			}
		}
	}
	return gaps, overlaps, reasons
}

// overlapsAll counts, for every singleton, pairs of runs alive at once
// (open runs last until now).
func overlapsAll(runs []singletonRun) int {
	far := time.Now().Add(time.Hour)
	end := func(r singletonRun) time.Time {
		if r.end.IsZero() {
			return far
		}
		return r.end
	}
	n := 0
	for i, a := range runs {
		for _, b := range runs[i+1:] {
			if a.name == b.name && a.start.Before(end(b)) && b.start.Before(end(a)) {
				n++
			}
		}
	}
	return n
}

// eventLog keeps the runner events the analysis uses, from every
// in-process runner.
type eventLog struct {
	mu  sync.Mutex
	evs []runner.Event
}

func (l *eventLog) add(ev runner.Event) {
	switch ev.(type) {
	case runner.ShardAcquired, runner.ShardReleased, runner.ShardLost, runner.HandoffPhase, runner.WorkerStarted:
	default:
		return
	}
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
}

func (l *eventLog) snapshot() []runner.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.evs)
}

// acquiredAt returns when runner acquired shard at epoch (zero if not
// seen).
func acquiredAt(evs []runner.Event, runnerID string, shard int, epoch storage.Epoch) time.Time {
	for _, ev := range evs {
		if a, ok := ev.(runner.ShardAcquired); ok && a.Runner == runnerID && int(a.Shard) == shard && a.Epoch == epoch {
			return a.Time
		}
	}
	return time.Time{}
}

// releasedAt returns when runner released shard held at epoch (a planned
// release; zero if not seen).
func releasedAt(evs []runner.Event, runnerID string, shard int, epoch storage.Epoch) time.Time {
	for _, ev := range evs {
		if a, ok := ev.(runner.ShardReleased); ok && a.Runner == runnerID && int(a.Shard) == shard && a.Epoch == epoch {
			return a.Time
		}
	}
	return time.Time{}
}

func quantiles(ds []time.Duration) (p50, p99, mx time.Duration) {
	if len(ds) == 0 {
		return unmeasured, unmeasured, unmeasured
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	q := func(f float64) time.Duration { return ds[int(f*float64(len(ds)-1)+0.5)] }
	return q(0.5), q(0.99), ds[len(ds)-1]
}

// unmeasured stands for a duration that could not be measured.
const unmeasured time.Duration = -1

// ms formats d in milliseconds (unmeasured: "n/a").
func ms(d time.Duration) string {
	if d == unmeasured {
		return "n/a"
	}
	return fmt.Sprintf("%.1f ms", float64(d)/1e6)
}
