package runnerproc

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/etcd"
)

// envSpec carries the JSON-encoded Spec to a child.
const envSpec = "SHARDHOST_RUNNERPROC_SPEC"

// Bounds of the child.
const (
	shutdownTimeout = 30 * time.Second
	deadlinePoll    = 5 * time.Millisecond
)

// Main runs the child and exits when this process was started by [Start];
// otherwise it returns at once. Call it first in TestMain or main.
func Main() {
	s, ok := os.LookupEnv(envSpec)
	if !ok {
		return
	}
	var spec Spec
	if err := json.Unmarshal([]byte(s), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "runnerproc: bad %s: %v\n", envSpec, err)
		os.Exit(2)
	}
	if err := runChild(spec); err != nil {
		fmt.Fprintf(os.Stderr, "runnerproc: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// emitter writes events as JSON lines, one write per line, so a line is
// never split when the process is killed.
type emitter struct {
	mu sync.Mutex
	id string
}

func (e *emitter) emit(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	ev.Runner = e.id
	b, err := json.Marshal(ev)
	if err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n'))
}

func logLevel(s string) slog.Level {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "error":
		return slog.LevelError
	default:
		return slog.LevelWarn
	}
}

// runChild runs the runner of spec until SIGTERM (graceful Shutdown) or
// SIGINT (Close).
func runChild(spec Spec) error {
	ccfg := etcd.ClientConfig(spec.Endpoints)
	ccfg.Logger = zap.NewNop()
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	store, err := etcd.New(cli, spec.Namespace, etcd.Config{})
	if err != nil {
		return err
	}
	cfg := spec.Config.runnerConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel(spec.LogLevel)}))
	r, err := runner.New(store, cfg)
	if err != nil {
		return err
	}
	if err := r.Register(Kind, Counter, Register, Keeper); err != nil {
		return err
	}
	if err := installAlways(r, spec); err != nil {
		return err
	}
	var hist *historyFile
	if spec.History != "" {
		if hist, err = openHistory(spec.History, r.ID()); err != nil {
			return err
		}
		defer hist.close()
	}
	counterChild.r, counterChild.hist, counterChild.every = r, hist, spec.CheckpointEvery
	alwaysChild.hist = hist
	out := &emitter{id: r.ID()}
	sub := r.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { // the event forwarder ends when the subscription closes
		cancel()
		sub.Close()
		wg.Wait()
	}()
	wg.Go(func() { forwardEvents(r, sub, out, hist) })
	poll := spec.StatusPoll
	if poll <= 0 {
		poll = deadlinePoll
	}
	wg.Go(func() { reportStatus(ctx, r, out, poll) })
	if hist != nil {
		wg.Go(func() {
			testenv.ProbeStalls(ctx, func(end time.Time, late time.Duration) {
				hist.append(Record{Kind: HistStall, Mono: MonoOf(end), Value: int64(late)})
			})
		})
	}
	if spec.WatchDeletes {
		wg.Go(func() { watchDeletes(ctx, cli, "/"+spec.Namespace+"/", out) })
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(ctx) }()
	select {
	case err := <-runDone:
		return fmt.Errorf("runner stopped: %w", err)
	case sig := <-sigs:
		if sig == syscall.SIGTERM {
			sctx, scancel := context.WithTimeout(context.Background(), shutdownTimeout)
			err := r.Shutdown(sctx)
			scancel()
			detail := ""
			if err != nil {
				detail = err.Error()
			}
			out.emit(Event{Kind: KindShutdownDone, Detail: detail})
		}
		r.Close()
		cancel()
		<-runDone
		return nil
	}
}

// forwardEvents prints the runner's events until the subscription closes.
func forwardEvents(r *runner.Runner, sub *runner.Subscription, out *emitter, hist *historyFile) {
	for ev := range sub.Events() {
		recordEvent(hist, ev)
		e := Event{Time: ev.Base().Time}
		switch v := ev.(type) {
		case runner.Registered:
			e.Kind, e.Lease, e.Address = KindRegistered, int64(v.Lease), r.Address()
		case runner.ShardAcquired:
			e.Kind, e.Shard, e.Epoch = KindAcquired, int(v.Shard), int64(v.Epoch)
		case runner.ShardReleased:
			e.Kind, e.Shard, e.Epoch = KindReleased, int(v.Shard), int64(v.Epoch)
		case runner.ShardLost:
			e.Kind, e.Shard, e.Epoch = KindLost, int(v.Shard), int64(v.Epoch)
			if v.Cause != nil {
				e.Detail = v.Cause.Error()
			}
		case runner.Detached:
			e.Kind, e.Detail, e.Deadline = KindDetached, v.Reason.String()+": "+v.Detail, v.Deadline
		case runner.Reattached:
			e.Kind, e.Lease = KindReattached, int64(v.Lease)
			if v.NewLease {
				e.Detail = "new lease"
			}
		case runner.HandoffPhase:
			e.Kind, e.Shard, e.Detail = KindHandoff, int(v.Shard), fmt.Sprintf("%s %s -> %s %s", v.Phase, v.From, v.To, v.Detail)
		default:
			continue
		}
		out.emit(e)
	}
}

// reportStatus prints each change of the lease deadline (an acknowledged
// renewal or grant: the renewal was sent at Deadline - TTL) and of the
// assignment, reading the status every poll.
func reportStatus(ctx context.Context, r *runner.Runner, out *emitter, poll time.Duration) {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var last time.Time
	var digest uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st := r.Status()
		if !st.Deadline.IsZero() && !st.Deadline.Equal(last) {
			last = st.Deadline
			out.emit(Event{Kind: KindDeadline, Lease: int64(st.Lease), Deadline: st.Deadline})
		}
		if st.AssignmentDigest != digest {
			digest = st.AssignmentDigest
			out.emit(Event{Kind: KindAssignment, Detail: fmt.Sprintf("%x", digest), Count: st.Owned})
		}
	}
}

// watchDeletes prints the DELETE events of runners/ and shards/ under
// prefix, one event per key prefix and revision. A failed watch resumes
// after the last revision it delivered.
func watchDeletes(ctx context.Context, cli *clientv3.Client, prefix string, out *emitter) {
	type group struct {
		key   string // "runners/" or "shards/"
		rev   int64
		count int
		names []string // deleted runner IDs
	}
	var last int64
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterPut()}
		if last > 0 {
			opts = append(opts, clientv3.WithRev(last+1))
		}
		for wr := range cli.Watch(clientv3.WithRequireLeader(ctx), prefix, opts...) {
			now := time.Now()
			var groups []*group
			for _, ev := range wr.Events {
				last = max(last, ev.Kv.ModRevision)
				kind, name, ok := strings.Cut(strings.TrimPrefix(string(ev.Kv.Key), prefix), "/")
				if !ok || (kind != "runners" && kind != "shards") {
					continue
				}
				i := slices.IndexFunc(groups, func(g *group) bool { return g.key == kind+"/" && g.rev == ev.Kv.ModRevision })
				if i < 0 {
					groups = append(groups, &group{key: kind + "/", rev: ev.Kv.ModRevision})
					i = len(groups) - 1
				}
				groups[i].count++
				if kind == "runners" {
					groups[i].names = append(groups[i].names, name)
				}
			}
			for _, g := range groups {
				out.emit(Event{Kind: KindWatchDelete, Time: now, Key: g.key, Revision: g.rev, Count: g.count, Detail: strings.Join(g.names, ",")})
			}
		}
		if ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond) // the watch failed: watch again
		}
	}
}

// recordEvent appends the runner events the history keeps.
func recordEvent(hist *historyFile, ev runner.Event) {
	if hist == nil {
		return
	}
	rec := Record{Mono: MonoOf(ev.Base().Time)}
	switch v := ev.(type) {
	case runner.Registered:
		rec.Kind, rec.Lease = HistRegistered, int64(v.Lease)
	case runner.Reattached:
		rec.Kind, rec.Lease = HistReattached, int64(v.Lease)
	case runner.Detached:
		rec.Kind, rec.Detail = HistDetached, v.Reason.String()+": "+v.Detail
		if !v.Deadline.IsZero() {
			rec.Deadline = MonoOf(v.Deadline)
		}
	case runner.ShardAcquired:
		rec.Kind, rec.Shard, rec.Epoch = HistAcquired, int(v.Shard), int64(v.Epoch)
	case runner.ShardReleased:
		rec.Kind, rec.Shard, rec.Epoch = HistReleased, int(v.Shard), int64(v.Epoch)
	case runner.ShardLost:
		rec.Kind, rec.Shard, rec.Epoch = HistLost, int(v.Shard), int64(v.Epoch)
		if v.Cause != nil {
			rec.Detail = v.Cause.Error()
		}
	case runner.RemindersUnrecorded:
		rec.Kind, rec.Shard, rec.Epoch = HistUnrecorded, int(v.Shard), int64(v.Epoch)
		if v.Err != nil {
			rec.Err = v.Err.Error()
		}
	default:
		return
	}
	hist.append(rec)
}
