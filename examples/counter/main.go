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
	"slices"
	"strings"
	"time"

	"github.com/shardhost/shardhost/examples/internal/demo"
	"github.com/shardhost/shardhost/runner"
)

const (
	numShards = 64
	leaseTTL  = 5 * time.Second
)

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
	demo.RegisterFlags(&o.etcd, &o.verbose)
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "traffic `time` of each phase")
	demo.Main("counter", func(ctx context.Context) (bool, error) {
		s, err := run(ctx, o)
		return err == nil && len(s.Problems) > 0, err
	})
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
	say := demo.Say(o.out)
	d := o.duration

	// 1. etcd.
	e, err := demo.OpenEtcd(o.etcd, o.verbose, say, "demo")
	if err != nil {
		return nil, err
	}
	defer e.Close()
	endpoints, namespace := []string{e.Endpoint}, e.Namespaces[0]

	// 2. Three runners and a gateway, each with its own etcd client.
	var nodes []*demo.Node
	defer func() {
		_, serr := demo.StopAll(nodes)
		err = errors.Join(serr, err)
	}()
	logger := demo.NewLogger(o.logs, o.verbose)
	for _, cfg := range []runner.Config{
		{ID: "runner-1", ListenAddr: "127.0.0.1:0"},
		{ID: "runner-2", ListenAddr: "127.0.0.1:0"},
		{ID: "runner-3", ListenAddr: "127.0.0.1:0"},
		{ID: "gateway", ClientOnly: true},
	} {
		cfg.NumShards, cfg.LeaseTTL, cfg.Logger = numShards, leaseTTL, logger
		n, err := demo.StartNode(endpoints, namespace, cfg, CounterKind, nil, o.verbose)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	r1, r2, r3, gw := nodes[0], nodes[1], nodes[2], nodes[3]
	s := &summary{}

	// 3. Wait for the shards to be spread.
	if s.Settle, err = demo.WaitSettled(ctx, []*demo.Node{r1, r2, r3}, gw, numShards, 30*time.Second); err != nil {
		return nil, err
	}
	say("3 runners + gateway started; ownership settled in %v: %s", demo.Round(s.Settle), demo.Ownership([]*demo.Node{r1, r2, r3}))

	t := newTraffic(gw.Runner(), o.counters, o.workers)
	var stop func() tally // stops the traffic running now, if any
	defer func() {
		if stop != nil {
			stop()
		}
	}()
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
	if err := demo.Sleep(ctx, d); err != nil {
		return nil, err
	}
	finish(p1, began, nil)

	// 5a. Graceful stop of runner-2 under traffic.
	say("phase 2: traffic on; runner-2 shuts down gracefully after %v", demo.Round(d/3))
	p2 := &phase{Name: "2 graceful stop runner-2"}
	began = time.Now()
	stop = t.start(ctx)
	if err := demo.Sleep(ctx, d/3); err != nil {
		return nil, err
	}
	written, restoredBefore := checkpointsWritten.Load(), restored.Load()
	shutdownStart := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = r2.Stop(sctx)
	cancel()
	s.ShutdownDur = time.Since(shutdownStart)
	if err != nil {
		return nil, fmt.Errorf("shut down runner-2: %w", err)
	}
	say("runner-2 Shutdown returned after %v (drained, %d counters checkpointed, locks released, lease revoked)",
		demo.Round(s.ShutdownDur), checkpointsWritten.Load()-written)
	if _, err := demo.WaitSettled(ctx, []*demo.Node{r1, r3}, gw, numShards, 30*time.Second); err != nil {
		return nil, err
	}
	s.Rebalance = time.Since(shutdownStart)
	say("runner-1 and runner-3 own all %d shards %v after the shutdown began: %s",
		numShards, demo.Round(s.Rebalance), demo.Ownership([]*demo.Node{r1, r3}))
	if err := demo.Sleep(ctx, d); err != nil {
		return nil, err
	}
	finish(p2, began, nil)
	say("  %d counters restored from runner-2's checkpoints on their new owner", restored.Load()-restoredBefore)

	// 5b. Crash of runner-3 under traffic.
	say("phase 3: traffic on; runner-3 crashes after %v (Close: nothing released, its lease expires after the %v TTL)", demo.Round(d/3), leaseTTL)
	p3 := &phase{Name: "3 crash runner-3"}
	began = time.Now()
	stop = t.start(ctx)
	if err := demo.Sleep(ctx, d/3); err != nil {
		return nil, err
	}
	ownersBefore := t.owners(numShards)
	for _, owner := range ownersBefore {
		if owner == r3.Runner().ID() {
			s.OnCrashed++
		}
	}
	crashAt := time.Now()
	if err := r3.Crash(); err != nil {
		return nil, fmt.Errorf("crash runner-3: %w", err)
	}
	for len(r1.Runner().Owned()) < numShards {
		if time.Since(crashAt) > 30*time.Second {
			return nil, fmt.Errorf("runner-1 owns %d shards 30s after the crash", len(r1.Runner().Owned()))
		}
		if err := demo.Sleep(ctx, 5*time.Millisecond); err != nil {
			return nil, err
		}
	}
	s.Takeover = time.Since(crashAt)
	say("runner-1 owns all %d shards %v after runner-3 crashed (%d counters were on runner-3)", numShards, demo.Round(s.Takeover), s.OnCrashed)
	if _, err := demo.WaitSettled(ctx, []*demo.Node{r1}, gw, numShards, 30*time.Second); err != nil {
		return nil, err
	}
	if err := demo.Sleep(ctx, d); err != nil {
		return nil, err
	}
	finish(p3, began, ownersBefore)
	if p3.Traffic.Failed() == 0 {
		say("  no ask failed during the crash: none in flight on runner-3 was cut off when it closed, and asks for its\n"+
			"         shards were retried until runner-1 owned them (slowest %v)", demo.Round(p3.Traffic.MaxLatency))
	} else {
		say("  %d ask(s) failed during the crash (listed above): Close cuts runner-3's connections as a killed process would;\n"+
			"         ErrMaybeDelivered ones were in flight on runner-3 and may or may not have run", p3.Traffic.Failed())
	}

	// 6. Checks and summary.
	s.Problems = problems(s, r3.Runner().ID())
	summarize(o.out, s)
	return s, nil
}

// report prints one phase's traffic and check.
func report(w io.Writer, p *phase) {
	tr := p.Traffic
	fmt.Fprintf(w, "         asks: %d ok (%.0f/s), %d failed, slowest %v; served by %s\n",
		tr.OK, float64(tr.OK)/p.Elapsed.Seconds(), tr.Failed(), demo.Round(tr.MaxLatency), served(tr))
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
			demo.Round(tr.MaxLatency).String(),
			fmt.Sprintf("%d/%d/%d", tr.Served["runner-1"], tr.Served["runner-2"], tr.Served["runner-3"]),
			fmt.Sprintf("%d/%d", c.Exact, c.Counters),
			lost(c))
	}
	fmt.Fprintln(w, "(maybe: failed with ErrMaybeDelivered; exact: counters equal to their acknowledged increments)")
	fmt.Fprintf(w, "\nsettle %v · graceful stop: Shutdown %v, all shards owned again after %v · crash: runner-1 owned all shards after %v (lease TTL %v)\n",
		demo.Round(s.Settle), demo.Round(s.ShutdownDur), demo.Round(s.Rebalance), demo.Round(s.Takeover), leaseTTL)
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
