// Command churn measures shard acquisition and request delivery under
// membership churn on a real etcd: hosting runners join, leave gracefully
// and crash while callers send asks through a client-only gateway.
//
//	go run ./bench/churn                 # starts ./bin/etcd (make setup)
//	go run ./bench/churn -etcd host:port # an existing etcd, fresh namespace
//	go run ./bench/churn -html report.html # also the report as HTML with SVG charts
//	go run ./bench/churn -churnprofile c.prof # CPU profile of the churn phase alone
//	go run ./bench/churn -coldprofile c.prof  # CPU profile of the cold start alone
//
// Every -every a step happens: add a runner or, with even odds, stop a
// random one, alternately by graceful Shutdown and by crash (Close; only
// with -crash), never leaving fewer than 2 or more than -runners+2 runners,
// so the count does a random walk (-seed replays it). With -burst N every
// step is a burst instead: N runners join within one second, then N
// random ones leave (graceful Shutdown) within one second, alternately. A
// step waits for the previous one to settle: every shard owned exactly
// once, as the runners' common assignment says. The report gives the
// settle time per step kind, the cutover window per moved shard (planned
// moves: old owner's ShardReleased -> new owner's ShardAcquired; crashes:
// crash instant -> new owner's ShardAcquired), after a crash the first ask
// of each lost shard answered by its new owner (one prober per shard,
// asking through the gateway from the crash on: the new owner's
// ShardAcquired -> the answer, split at the gateway's view naming the new
// owner), handoff phase counts, asks by outcome and latency, and a
// double-ownership check over the merged events. It exits 1 if a shard
// was owned twice, an ask failed during a planned move, a step did not
// settle, the cold start did not finish within -coldtimeout, or a
// crash's prober got no answer.
//
// # What a step costs
//
// Each step's cost, from its start to its settle, is on its progress line,
// in a table per step and as medians per step kind (text, JSON, HTML):
//   - moved: the ownership changes completed in the step, from the
//     runners' events (planned cutovers and crash re-owns);
//   - watch evs: the events etcd delivered to watchers, read from its
//     /metrics counter etcd_debugging_mvcc_events_total, which etcd adds
//     to for every watch response it sends: one per event per watch that
//     matches it (after the watch's filters), so a runner with two
//     matching watches counts twice; and per moved shard;
//   - etcd reqs: the unary gRPC calls etcd handled (Range, Txn, Put,
//     DeleteRange, lease grants and revokes; not the keep-alive and watch
//     streams), of them txns; and per moved shard;
//   - CPU, as the kernel counts it per process: the change's own, the
//     hosting runners' (this process, or with -procs the runner
//     processes) plus etcd's; and apart, the callers' and the gateway's,
//     which run in a child process of their own (-loadproc, default on:
//     otherwise the callers take whatever CPU the runners leave and
//     inflate the step's figure), and the harness's own settle polls
//     (timed on the OS thread each poll runs on). The runners' CPU
//     includes serving the asks routed to them; "between steps" gives the
//     same figures for the load alone, from each settle to the next step.
//
// # Many runners
//
// The first -runners start all at once, or -startrate a second. While
// they cold-start a progress line comes every -progress (runners
// registered and locks held in etcd, detaches and aborted handoffs from the
// runners' events, CPU, etcd's deliveries and requests, memory,
// goroutines and open files of the harness and etcd); a cold start not
// finished within -coldtimeout ends the run with the report of how far it
// got. -starttimeout sets the runners' StartTimeout. The harness raises
// its open-files limit (and its children's) as far as it may.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
)

func main() {
	runnerproc.Main() // in a child started by -procs: run its runner and exit
	loadChildMain()   // in the load child: run the gateway and the callers and exit
	os.Exit(churn())
}

// churn runs the command and returns its exit code (deferred calls run
// before the process exits).
func churn() int {
	var p Params
	var asJSON bool
	var htmlPath string
	flag.IntVar(&p.Runners, "runners", 4, "hosting runners at the start (the count wanders between 2 and runners+2)")
	flag.IntVar(&p.Shards, "shards", 256, "NumShards")
	flag.DurationVar(&p.TTL, "ttl", 5*time.Second, "runners' LeaseTTL (a crash's shards are re-owned after about this)")
	flag.IntVar(&p.Callers, "callers", 32, "goroutines sending asks through the gateway (0: no load, so that a step's CPU is the change's own; the crash probers still ask)")
	flag.IntVar(&p.Entities, "entities", 2000, "counters the callers address")
	flag.DurationVar(&p.Duration, "duration", 30*time.Second, "how long to churn under load")
	flag.IntVar(&p.Steps, "steps", 0, "stop after this many churn steps, even before -duration (0: no limit)")
	flag.DurationVar(&p.Every, "every", 3*time.Second, "time between churn steps (a step also waits for the previous one to settle)")
	flag.BoolVar(&p.Crash, "crash", true, "include crash (Close) steps")
	flag.Uint64Var(&p.Seed, "seed", 0, "seed choosing the runners to stop (0: from the clock)")
	flag.StringVar(&p.Etcd, "etcd", "", "use the etcd at `host:port` (fresh namespace, deleted at the end) instead of starting ./bin/etcd")
	flag.BoolVar(&p.Verbose, "v", false, "show the runners' info logs and the etcd client's warnings")
	flag.IntVar(&p.Burst, "burst", 0, "make every step a burst: this many runners join within one second, then as many leave (graceful shutdown) within one second, alternately (0: single joins, shutdowns and crashes)")
	flag.BoolVar(&p.Procs, "procs", false, "run every hosting runner as a separate OS process (crashes are SIGKILL, shutdowns SIGTERM)")
	loadProc := flag.Bool("loadproc", true, "run the gateway and the callers in a child process of their own, so that their CPU is measured apart from the runners' (false: in this process, counted with the runners')")
	flag.Float64Var(&p.StartRate, "startrate", 0, "start the first runners at this many a second (0: all at once, as a deployment's pods do)")
	flag.DurationVar(&p.StartTimeout, "starttimeout", 0, "the runners' StartTimeout: a runner not registered after this long stops (0: the runner's default, 1 min; negative: wait forever)")
	flag.DurationVar(&p.ColdTimeout, "coldtimeout", settleTimeout, "give up the cold start (and the run, with a report of how far it got) if not every shard is owned after this long")
	flag.DurationVar(&p.Progress, "progress", 5*time.Second, "during the cold start, sample and print its progress (locks held, runners registered and attached, CPU, memory, etcd's counters) every this long (0: never)")
	flag.DurationVar(&p.StatePoll, "statepoll", 20*time.Millisecond, "after the cold start, poll the runners' Status this often until every owned shard's reminders and remembered entities are read, before the steady window (0: do not wait: the steady window then starts once every shard is owned, and its rates average in the reads still in flight)")
	flag.DurationVar(&p.Steady, "steady", 5*time.Second, "after the cold start, measure the settled cluster (CPU, etcd writes) without load this long (0: skip)")
	flag.BoolVar(&asJSON, "json", false, "print the report as JSON instead of tables")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to `file`")
	coldProfileFile := flag.String("coldprofile", "", "write a CPU profile of the cold start alone (until every shard is owned or the cold start is given up) to `file`")
	churnProfileFile := flag.String("churnprofile", "", "write a CPU profile of the churn phase alone (its steps and the load between them, without the cold start and the steady window) to `file`")
	flag.StringVar(&htmlPath, "html", "", "also write the report as a self-contained HTML `file` with SVG charts")
	flag.Parse()
	p.InProcessLoad = !*loadProc
	profiles := 0
	for _, name := range []string{*cpuProfile, *coldProfileFile, *churnProfileFile} {
		if name != "" {
			profiles++
		}
	}
	if profiles > 1 {
		fmt.Fprintln(os.Stderr, "churn: -cpuprofile, -coldprofile and -churnprofile exclude each other")
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "churn:", err)
			return 2
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	// The phase profiles are started and stopped by the harness.
	for _, phase := range []struct {
		file string
		to   *io.Writer
	}{{*coldProfileFile, &coldProfile}, {*churnProfileFile, &churnProfile}} {
		if phase.file == "" {
			continue
		}
		f, err := os.Create(phase.file)
		if err != nil {
			fmt.Fprintln(os.Stderr, "churn:", err)
			return 2
		}
		defer f.Close()
		*phase.to = f
	}
	if p.Seed == 0 {
		p.Seed = uint64(time.Now().UnixNano())
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second ^C kills at once (the etcd child dies with us on Linux)
	}()
	rep, err := run(ctx, p, os.Stderr) // progress on stderr, the report on stdout
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "churn:", err)
		return 1
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintln(os.Stderr, "churn:", err)
			return 1
		}
	} else {
		rep.print(os.Stdout)
	}
	if htmlPath != "" {
		if err := writeHTMLFile(rep, htmlPath); err != nil {
			fmt.Fprintln(os.Stderr, "churn:", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "churn: HTML report written to %s\n", htmlPath)
	}
	if len(rep.Problems) > 0 {
		return 1
	}
	return 0
}

// writeHTMLFile writes the HTML report to path.
func writeHTMLFile(rep *Report, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.writeHTML(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
