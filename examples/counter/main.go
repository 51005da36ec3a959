// Command counter is a runnable tour of shardhost: an etcd (embedded by
// default), three runners and a client-only gateway in one process, hosting
// 500 counters on 64 shards. While the gateway sends increments, it stops
// one runner gracefully and crashes another, then checks every counter
// against the increments the client saw acknowledged.
//
//	cd examples && go run ./counter [-etcd host:port] [-duration 3s] [-v]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

const (
	numShards = 64
	leaseTTL  = 5 * time.Second
)

func shardID(i int) sharding.ShardID { return sharding.ShardID(i) }

type options struct {
	etcd     string        // existing etcd endpoint; "" starts an embedded one
	duration time.Duration // traffic of each phase
	counters int
	workers  int
	verbose  bool
	out      io.Writer // the report
	logs     io.Writer // the runners' logs
}

func main() {
	o := options{counters: 500, workers: 8, out: os.Stdout, logs: os.Stderr}
	flag.StringVar(&o.etcd, "etcd", "", "use the etcd at `host:port` instead of starting an embedded one")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "traffic `time` of each phase")
	flag.BoolVar(&o.verbose, "v", false, "show the runners' info logs and the etcd client's warnings")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "counter:", err)
		os.Exit(1)
	}
	if len(s.Problems) > 0 {
		os.Exit(1)
	}
}

// phase is one traffic phase: what happened and what the check found.
type phase struct {
	Name    string
	Elapsed time.Duration
	Traffic tally
	Check   check
}

// summary is the outcome of a run.
type summary struct {
	Phases      []*phase
	Settle      time.Duration // start until the three runners owned all shards
	ShutdownDur time.Duration // runner-2's Shutdown
	Rebalance   time.Duration // Shutdown start until the survivors owned all shards
	Takeover    time.Duration // crash until runner-1 owned all shards
	OnCrashed   int           // counters hosted by runner-3 at the crash
	Problems    []string      // checks that failed; the crash's lost state is not one
}

// run is the whole demo. It returns an error only when it could not run.
func run(ctx context.Context, o options) (_ *summary, err error) {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(o.out, "[%5.1fs] "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
	d := o.duration

	// 1. etcd.
	endpoint, namespace := o.etcd, "demo"
	if endpoint == "" {
		var stopEtcd func()
		if endpoint, stopEtcd, err = startEmbeddedEtcd(o.verbose); err != nil {
			return nil, err
		}
		defer stopEtcd()
		say("embedded etcd %s ready at %s", version.Version, endpoint)
	} else {
		// Keys of other runs (checkpoints never expire) must not leak in.
		namespace = fmt.Sprintf("demo-%d", time.Now().UnixNano())
		defer deleteNamespace(endpoint, namespace)
		say("using etcd at %s, namespace %q", endpoint, namespace)
	}
	endpoints := []string{endpoint}

	// 2. Three runners and a gateway, each with its own etcd client.
	var nodes []*node
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		errs := make([]error, len(nodes))
		var wg sync.WaitGroup
		for i, n := range nodes {
			wg.Go(func() { errs[i] = n.stop(ctx) })
		}
		wg.Wait()
		err = errors.Join(append(errs, err)...)
	}()
	logger := newLogger(o.logs, o.verbose)
	for _, cfg := range []runner.Config{
		{ID: "runner-1", ListenAddr: "127.0.0.1:0"},
		{ID: "runner-2", ListenAddr: "127.0.0.1:0"},
		{ID: "runner-3", ListenAddr: "127.0.0.1:0"},
		{ID: "gateway", ClientOnly: true},
	} {
		cfg.NumShards, cfg.LeaseTTL, cfg.Logger = numShards, leaseTTL, logger
		n, err := startNode(endpoints, namespace, cfg, o.verbose)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	r1, r2, r3, gw := nodes[0], nodes[1], nodes[2], nodes[3]
	s := &summary{}

	// 3. Wait for the shards to be spread.
	if s.Settle, err = waitSettled(ctx, []*node{r1, r2, r3}, gw, 30*time.Second); err != nil {
		return nil, err
	}
	say("3 runners + gateway started; ownership settled in %v: %s", round(s.Settle), ownership([]*node{r1, r2, r3}))

	t := newTraffic(gw.r, o.counters, o.workers)
	var stop func() tally // stops the traffic running now, if any
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(d):
			return nil
		}
	}
	finish := func(p *phase, began time.Time, ownersBefore []string) {
		p.Traffic = stop()
		stop = nil
		p.Elapsed = time.Since(began)
		p.Check = t.verify(ctx, ownersBefore)
		s.Phases = append(s.Phases, p)
		report(o.out, p)
	}

	// 4. Steady state.
	say("phase 1: %d senders ask inc on %d counters through the gateway for %v", o.workers, o.counters, d)
	p1 := &phase{Name: "1 steady, 3 runners"}
	began := time.Now()
	stop = t.start(ctx)
	if err := sleep(d); err != nil {
		return nil, err
	}
	finish(p1, began, nil)

	// 5a. Graceful stop of runner-2 under traffic.
	say("phase 2: traffic on; runner-2 shuts down gracefully after %v", round(d/3))
	p2 := &phase{Name: "2 graceful stop runner-2"}
	began = time.Now()
	stop = t.start(ctx)
	if err := sleep(d / 3); err != nil {
		return nil, err
	}
	written, restoredBefore := checkpointsWritten.Load(), restored.Load()
	shutdownStart := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = r2.stop(sctx)
	cancel()
	s.ShutdownDur = time.Since(shutdownStart)
	if err != nil {
		return nil, fmt.Errorf("shut down runner-2: %w", err)
	}
	say("runner-2 Shutdown returned after %v (drained, %d counters checkpointed, locks released, lease revoked)",
		round(s.ShutdownDur), checkpointsWritten.Load()-written)
	if _, err := waitSettled(ctx, []*node{r1, r3}, gw, 30*time.Second); err != nil {
		return nil, err
	}
	s.Rebalance = time.Since(shutdownStart)
	say("runner-1 and runner-3 own all %d shards %v after the shutdown began: %s",
		numShards, round(s.Rebalance), ownership([]*node{r1, r3}))
	if err := sleep(d); err != nil {
		return nil, err
	}
	finish(p2, began, nil)
	say("  %d counters restored from runner-2's checkpoints on their new owner", restored.Load()-restoredBefore)

	// 5b. Crash of runner-3 under traffic.
	say("phase 3: traffic on; runner-3 crashes after %v (Close: nothing released, its lease expires after the %v TTL)", round(d/3), leaseTTL)
	p3 := &phase{Name: "3 crash runner-3"}
	began = time.Now()
	stop = t.start(ctx)
	if err := sleep(d / 3); err != nil {
		return nil, err
	}
	ownersBefore := t.owners(numShards)
	for _, owner := range ownersBefore {
		if owner == r3.r.ID() {
			s.OnCrashed++
		}
	}
	crashAt := time.Now()
	if err := r3.crash(); err != nil {
		return nil, fmt.Errorf("crash runner-3: %w", err)
	}
	for len(r1.r.Owned()) < numShards {
		if time.Since(crashAt) > 30*time.Second {
			return nil, fmt.Errorf("runner-1 owns %d shards 30s after the crash", len(r1.r.Owned()))
		}
		if err := sleep(5 * time.Millisecond); err != nil {
			return nil, err
		}
	}
	s.Takeover = time.Since(crashAt)
	say("runner-1 owns all %d shards %v after runner-3 crashed (%d counters were on runner-3)", numShards, round(s.Takeover), s.OnCrashed)
	if _, err := waitSettled(ctx, []*node{r1}, gw, 30*time.Second); err != nil {
		return nil, err
	}
	if err := sleep(d); err != nil {
		return nil, err
	}
	finish(p3, began, ownersBefore)
	if p3.Traffic.Failed() == 0 {
		say("  no ask failed during the crash: asks for runner-3's shards were retried until runner-1 owned them (slowest %v).\n"+
			"         Close lets runner-3 finish, or refuse as undelivered, the asks it had accepted; a killed process would\n"+
			"         cut them off and they would fail with ErrMaybeDelivered.",
			round(p3.Traffic.MaxLatency))
	} else {
		say("  %d ask(s) failed during the crash (listed above); ErrMaybeDelivered ones may or may not have run", p3.Traffic.Failed())
	}

	// 6. Checks and summary.
	s.Problems = problems(s, r3.r.ID())
	summarize(o.out, s)
	return s, nil
}

// report prints one phase's traffic and check.
func report(w io.Writer, p *phase) {
	tr := p.Traffic
	fmt.Fprintf(w, "         asks: %d ok (%.0f/s), %d failed, slowest %v; served by %s\n",
		tr.OK, float64(tr.OK)/p.Elapsed.Seconds(), tr.Failed(), round(tr.MaxLatency), served(tr))
	for _, class := range slices.Sorted(maps.Keys(tr.Errors)) {
		fmt.Fprintf(w, "         failed with %s: %d (e.g. %q)\n", class, tr.Errors[class], tr.Samples[class])
	}
	c := p.Check
	fmt.Fprintf(w, "         check: %d/%d counters equal their acknowledged increments", c.Exact, c.Counters)
	if c.Ambiguous > 0 {
		fmt.Fprintf(w, "; %d above it by no more than their maybe-delivered asks", c.Ambiguous)
	}
	if c.Lost > 0 {
		fmt.Fprintf(w, "; %d lost %d acknowledged increments (by owner before the crash: %s)", c.Lost, c.LostIncs, byOwner(c.LostOn))
	}
	if c.Extra > 0 {
		fmt.Fprintf(w, "; %d ABOVE acknowledged + maybe-delivered", c.Extra)
	}
	if c.Unreadable > 0 {
		fmt.Fprintf(w, "; %d could not be read", c.Unreadable)
	}
	fmt.Fprintln(w)
}

func served(tr tally) string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(tr.Served)) {
		parts = append(parts, fmt.Sprintf("%s %d", id, tr.Served[id]))
	}
	if len(parts) == 0 {
		return "nobody"
	}
	return strings.Join(parts, ", ")
}

func byOwner(m map[string]int) string {
	var parts []string
	for _, id := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", id, m[id]))
	}
	return strings.Join(parts, ", ")
}

// problems lists what contradicts the guarantees: failed asks or lost
// increments across a graceful stop, values above what was sent, lost
// increments on a counter the crashed runner did not host.
func problems(s *summary, crashed string) []string {
	var out []string
	for i, p := range s.Phases {
		c := p.Check
		if c.Extra > 0 {
			out = append(out, fmt.Sprintf("phase %s: %d counters above their acknowledged + maybe-delivered increments", p.Name, c.Extra))
		}
		if c.Unreadable > 0 {
			out = append(out, fmt.Sprintf("phase %s: %d counters could not be read", p.Name, c.Unreadable))
		}
		if i < 2 && p.Traffic.Failed() > 0 {
			out = append(out, fmt.Sprintf("phase %s: %d failed asks", p.Name, p.Traffic.Failed()))
		}
		if i < 2 && c.Lost > 0 {
			out = append(out, fmt.Sprintf("phase %s: %d counters lost increments", p.Name, c.Lost))
		}
		if i == 2 && c.Lost > c.LostOn[crashed] {
			out = append(out, fmt.Sprintf("phase %s: %d counters not hosted by %s lost increments", p.Name, c.Lost-c.LostOn[crashed], crashed))
		}
	}
	return out
}

// summarize prints the table and the verdict.
func summarize(w io.Writer, s *summary) {
	const row = "%-26s %5s %8s %7s %6s %6s %8s  %-20s %7s  %s\n"
	fmt.Fprintln(w)
	fmt.Fprintf(w, row, "phase", "time", "asks ok", "asks/s", "failed", "maybe", "slowest", "served by r-1/r-2/r-3", "exact", "lost")
	for _, p := range s.Phases {
		tr, c := p.Traffic, p.Check
		fmt.Fprintf(w, row, p.Name,
			fmt.Sprintf("%.1fs", p.Elapsed.Seconds()),
			fmt.Sprint(tr.OK),
			fmt.Sprintf("%.0f", float64(tr.OK)/p.Elapsed.Seconds()),
			fmt.Sprint(tr.Failed()),
			fmt.Sprint(tr.Errors[errMaybeDelivered]),
			round(tr.MaxLatency).String(),
			fmt.Sprintf("%d/%d/%d", tr.Served["runner-1"], tr.Served["runner-2"], tr.Served["runner-3"]),
			fmt.Sprintf("%d/%d", c.Exact, c.Counters),
			lost(c))
	}
	fmt.Fprintln(w, "(maybe: failed with ErrMaybeDelivered; exact: counters equal to their acknowledged increments)")
	fmt.Fprintf(w, "\nsettle %v · graceful stop: Shutdown %v, all shards owned again after %v · crash: runner-1 owned all shards after %v (lease TTL %v)\n",
		round(s.Settle), round(s.ShutdownDur), round(s.Rebalance), round(s.Takeover), leaseTTL)
	if n := checkpointsFailed.Load(); n > 0 {
		fmt.Fprintf(w, "%d checkpoints failed (see the runners' logs)\n", n)
	}
	if len(s.Phases) == 3 {
		c := s.Phases[2].Check
		fmt.Fprintf(w, "crash: %d of the %d counters on runner-3 lost %d acknowledged increments. No Release runs on a crash: a counter\n"+
			"       restarts from its last checkpoint (written only when it last moved gracefully) or from zero.\n",
			c.Lost, s.OnCrashed, c.LostIncs)
	}
	if len(s.Problems) == 0 {
		fmt.Fprintln(w, "OK: no failed asks and no lost increments across the graceful stop; state lost only on the crashed runner.")
		return
	}
	for _, p := range s.Problems {
		fmt.Fprintln(w, "PROBLEM:", p)
	}
}

func lost(c check) string {
	if c.Lost == 0 {
		return "0"
	}
	return fmt.Sprintf("%d counters (%d incs)", c.Lost, c.LostIncs)
}

// deleteNamespace removes the run's keys from an external etcd.
func deleteNamespace(endpoint, namespace string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = cli.Delete(ctx, "/"+namespace+"/", clientv3.WithPrefix())
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}
